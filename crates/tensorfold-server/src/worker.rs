//! The generation worker: one thread owns the engine's batch. Requests wait
//! in a bounded queue, join the batch (in arrival order) as soon as a
//! stream slot and their cache memory are free, and share one round per
//! step with every other live stream. Each job streams its text back over a
//! channel; when the client goes away the channel closes and the stream is
//! cancelled at the next round, freeing its memory.
//!
//! A fault inside a round (a panic, a device error) ends only that round's
//! streams, each with an error; the worker drops the batch, starts a new
//! one and goes on serving the queue. After a device error it asks the
//! device whether it still answers and reports the answer to `/health`.

use crate::health::Health;
use crate::metrics::Metrics;
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use tensorfold_engine::{
    Batch, Completion, Engine, EngineError, GenerateRequest, Prepared, StreamId,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// What a job sends back.
pub enum Event {
    Delta(String),
    Done(Result<Completion, EngineError>),
}

struct Job {
    request: GenerateRequest,
    events: UnboundedSender<Event>,
}

#[derive(Clone)]
pub struct Worker {
    queue: SyncSender<Job>,
    /// Requests that may wait; more are refused.
    capacity: usize,
    alive: Arc<AtomicBool>,
}

impl Worker {
    /// `capacity` requests may wait; more get `None` from [`Worker::submit`].
    pub fn start(
        engine: Arc<Engine>,
        capacity: usize,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Worker {
        let (queue, jobs) = sync_channel::<Job>(capacity);
        let alive = Arc::new(AtomicBool::new(true));
        let flag = alive.clone();
        std::thread::Builder::new()
            .name("tensorfold-worker".into())
            .spawn(move || {
                let _alive = AliveGuard(flag);
                serve(&engine, &jobs, capacity, &metrics, &health)
            })
            .expect("spawn worker thread");
        Worker {
            queue,
            capacity,
            alive,
        }
    }

    /// Whether the worker thread is still running.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// Queues a request; `None` when `capacity` requests wait already.
    pub fn submit(
        &self,
        request: GenerateRequest,
        metrics: &Metrics,
    ) -> Option<UnboundedReceiver<Event>> {
        if metrics.queued.fetch_add(1, Ordering::Relaxed) >= self.capacity as u64 {
            metrics.queued.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let (events, rx) = unbounded_channel();
        match self.queue.try_send(Job { request, events }) {
            Ok(()) => Some(rx),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                metrics.queued.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// Marks the worker stopped when its thread ends, however it ends.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// A request that was checked and waits for room.
struct Waiting {
    prepared: Prepared,
    events: UnboundedSender<Event>,
}

/// What outlives a batch: the queue and the live streams' channels.
#[derive(Default)]
struct Streams {
    waiting: VecDeque<Waiting>,
    live: HashMap<StreamId, UnboundedSender<Event>>,
    /// Text pieces each live stream has sent (the live token count's
    /// estimate, settled to the exact count when the stream ends).
    streamed: HashMap<StreamId, Arc<AtomicU64>>,
}

/// Serves until every sender is gone. A panic ends the live streams with
/// an error and serving resumes with a fresh batch.
fn serve(
    engine: &Engine,
    jobs: &Receiver<Job>,
    capacity: usize,
    metrics: &Arc<Metrics>,
    health: &Health,
) {
    let mut streams = Streams::default();
    loop {
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            run(engine, jobs, capacity, metrics, health, &mut streams)
        }));
        let Err(panic) = outcome else { return };
        let message = panic_message(&*panic);
        tracing::error!("a round failed: {message}; its streams were ended");
        metrics.faults.fetch_add(1, Ordering::Relaxed);
        metrics.reserved_bytes.store(0, Ordering::Relaxed);
        streams.streamed.clear();
        for (_, events) in streams.live.drain() {
            let error = EngineError::Backend(format!("internal error in this round: {message}"));
            let _ = events.send(Event::Done(Err(error)));
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

fn run(
    engine: &Engine,
    jobs: &Receiver<Job>,
    capacity: usize,
    metrics: &Arc<Metrics>,
    health: &Health,
    streams: &mut Streams,
) {
    let mut batch = engine.batch();
    loop {
        let Streams {
            waiting,
            live,
            streamed,
        } = &mut *streams;
        // Block only when there is nothing to run.
        if batch.is_empty() && waiting.is_empty() {
            match jobs.recv() {
                Ok(job) => prepare(engine, job, waiting, metrics),
                Err(_) => return,
            }
        }
        while waiting.len() < capacity {
            match jobs.try_recv() {
                Ok(job) => prepare(engine, job, waiting, metrics),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if batch.is_empty() && waiting.is_empty() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        waiting.retain(|w| {
            let gone = w.events.is_closed();
            if gone {
                metrics.queued.fetch_sub(1, Ordering::Relaxed);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });
        admit(&mut batch, waiting, live, streamed, metrics);
        for (&id, events) in live.iter() {
            if events.is_closed() {
                batch.cancel(id);
            }
        }
        metrics.running.store(batch.len() as u64, Ordering::Relaxed);
        let mut device_failed = false;
        let started = std::time::Instant::now();
        let finished = batch.step();
        let micros = started.elapsed().as_micros() as u64;
        let streams = batch.len() + finished.len();
        metrics.steps.fetch_add(1, Ordering::Relaxed);
        metrics
            .step_streams
            .fetch_add(streams as u64, Ordering::Relaxed);
        metrics.step_micros.fetch_add(micros, Ordering::Relaxed);
        tracing::trace!(
            streams,
            prefilling = batch.prefilling(),
            finished = finished.len(),
            micros,
            "round"
        );
        // The gauges first: a client told its request is done must not
        // still find it running.
        metrics.running.store(batch.len() as u64, Ordering::Relaxed);
        metrics
            .reserved_bytes
            .store(batch.reserved_bytes() as u64, Ordering::Relaxed);
        metrics
            .retained_bytes
            .store(engine.prompt_cache_bytes() as u64, Ordering::Relaxed);
        for (id, completion) in finished {
            let pieces = streamed.remove(&id);
            match &completion {
                Ok(c) => {
                    metrics.record(c);
                    metrics.settle_live(pieces.as_deref(), c.completion_tokens);
                }
                Err(EngineError::Backend(_)) => device_failed = true,
                Err(_) => {}
            }
            if let Some(events) = live.remove(&id) {
                let _ = events.send(Event::Done(completion));
            }
        }
        if device_failed {
            metrics.faults.fetch_add(1, Ordering::Relaxed);
            match engine.check_device() {
                Ok(()) => health.clear(),
                Err(e) => health.set_problem(format!("the device does not answer: {e}")),
            }
        }
    }
}

/// Starts waiting requests in arrival order: one that does not fit holds
/// the ones behind it, so a long prompt is never starved by short ones.
fn admit<'e>(
    batch: &mut Batch<'e>,
    waiting: &mut VecDeque<Waiting>,
    live: &mut HashMap<StreamId, UnboundedSender<Event>>,
    streamed: &mut HashMap<StreamId, Arc<AtomicU64>>,
    metrics: &Arc<Metrics>,
) {
    while waiting.front().is_some_and(|w| batch.fits(&w.prepared)) {
        let w = waiting.pop_front().expect("checked above");
        metrics.queued.fetch_sub(1, Ordering::Relaxed);
        let events = w.events.clone();
        let counters = metrics.clone();
        let pieces = Arc::new(AtomicU64::new(0));
        let seen = pieces.clone();
        let on_text = move |delta: &str| {
            #[cfg(feature = "fault-injection")]
            crate::fault::maybe_panic();
            seen.fetch_add(1, Ordering::Relaxed);
            counters
                .completion_tokens_live
                .fetch_add(1, Ordering::Relaxed);
            events.send(Event::Delta(delta.to_string())).is_ok()
        };
        match batch.admit(w.prepared, on_text) {
            Ok(id) => {
                live.insert(id, w.events);
                streamed.insert(id, pieces);
            }
            Err(e) => {
                let _ = w.events.send(Event::Done(Err(e)));
            }
        }
    }
}

/// Checks a job; a bad one is answered at once, a good one waits its turn.
fn prepare(engine: &Engine, job: Job, waiting: &mut VecDeque<Waiting>, metrics: &Metrics) {
    if job.events.is_closed() {
        metrics.queued.fetch_sub(1, Ordering::Relaxed);
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    match engine.prepare(job.request) {
        Ok(prepared) => waiting.push_back(Waiting {
            prepared,
            events: job.events,
        }),
        Err(e) => {
            metrics.queued.fetch_sub(1, Ordering::Relaxed);
            let _ = job.events.send(Event::Done(Err(e)));
        }
    }
}
