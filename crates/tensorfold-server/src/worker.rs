//! The generation worker: one thread owns the engine's batch. Requests wait
//! in a bounded queue, join the batch (in arrival order) as soon as a
//! stream slot and their cache memory are free, and share one round per
//! step with every other live stream. Each job streams its text back over a
//! channel; when the client goes away the channel closes and the stream is
//! cancelled at the next round, freeing its memory.

use crate::metrics::Metrics;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use tensorfold_engine::{Completion, Engine, EngineError, GenerateRequest, Prepared, StreamId};
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
}

impl Worker {
    /// `capacity` requests may wait; more get `None` from [`Worker::submit`].
    pub fn start(engine: Arc<Engine>, capacity: usize, metrics: Arc<Metrics>) -> Worker {
        let (queue, jobs) = sync_channel::<Job>(capacity);
        std::thread::Builder::new()
            .name("tensorfold-worker".into())
            .spawn(move || run(&engine, jobs, capacity, metrics))
            .expect("spawn worker thread");
        Worker { queue }
    }

    /// Queues a request; `None` when the queue is full.
    pub fn submit(
        &self,
        request: GenerateRequest,
        metrics: &Metrics,
    ) -> Option<UnboundedReceiver<Event>> {
        let (events, rx) = unbounded_channel();
        metrics.queued.fetch_add(1, Ordering::Relaxed);
        match self.queue.try_send(Job { request, events }) {
            Ok(()) => Some(rx),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                metrics.queued.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// A request that was checked and waits for room.
struct Waiting {
    prepared: Prepared,
    events: UnboundedSender<Event>,
}

fn run(engine: &Engine, jobs: Receiver<Job>, capacity: usize, metrics: Arc<Metrics>) {
    let metrics_for_text = metrics.clone();
    let metrics = &*metrics;
    let mut batch = engine.batch();
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut live: HashMap<StreamId, UnboundedSender<Event>> = HashMap::new();
    // Text pieces each live stream has sent (the live token count's estimate).
    let mut streamed: HashMap<StreamId, Arc<AtomicU64>> = HashMap::new();
    loop {
        // Block only when there is nothing to run.
        if batch.is_empty() && waiting.is_empty() {
            match jobs.recv() {
                Ok(job) => prepare(engine, job, &mut waiting, metrics),
                Err(_) => return,
            }
        }
        while waiting.len() < capacity {
            match jobs.try_recv() {
                Ok(job) => prepare(engine, job, &mut waiting, metrics),
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
        // Arrival order: a request that does not fit holds the ones behind it,
        // so a long prompt is never starved by short ones.
        while waiting.front().is_some_and(|w| batch.fits(&w.prepared)) {
            let w = waiting.pop_front().expect("checked above");
            metrics.queued.fetch_sub(1, Ordering::Relaxed);
            let events = w.events.clone();
            let counters = metrics_for_text.clone();
            let pieces = Arc::new(AtomicU64::new(0));
            let seen = pieces.clone();
            let on_text = move |delta: &str| {
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
        for (&id, events) in &live {
            if events.is_closed() {
                batch.cancel(id);
            }
        }
        metrics.running.store(batch.len() as u64, Ordering::Relaxed);
        for (id, completion) in batch.step() {
            let pieces = streamed.remove(&id);
            if let Ok(c) = &completion {
                metrics.record(c);
                metrics.settle_live(pieces.as_deref(), c.completion_tokens);
            }
            if let Some(events) = live.remove(&id) {
                let _ = events.send(Event::Done(completion));
            }
        }
        // Current while the worker waits idle for the next job too.
        metrics.running.store(batch.len() as u64, Ordering::Relaxed);
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
