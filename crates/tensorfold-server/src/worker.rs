//! The generation worker: one thread runs requests from a bounded queue.
//! Each job streams its text back over a channel; when the client goes
//! away the channel closes, the next delta fails to send, and generation
//! stops within a round, freeing its cache.

use crate::metrics::Metrics;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use tensorfold_engine::{Completion, Engine, EngineError, GenerateRequest};
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
    pub fn start(engine: Arc<Engine>, capacity: usize, metrics: Arc<Metrics>) -> Worker {
        let (queue, jobs) = sync_channel::<Job>(capacity);
        std::thread::Builder::new()
            .name("tensorfold-worker".into())
            .spawn(move || {
                for job in jobs {
                    metrics.queued.fetch_sub(1, Ordering::Relaxed);
                    if job.events.is_closed() {
                        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    metrics.running.store(1, Ordering::Relaxed);
                    let events = job.events.clone();
                    let result = engine.generate(&job.request, &mut |delta| {
                        metrics
                            .completion_tokens_live
                            .fetch_add(1, Ordering::Relaxed);
                        events.send(Event::Delta(delta.to_string())).is_ok()
                    });
                    metrics.running.store(0, Ordering::Relaxed);
                    if let Ok(c) = &result {
                        metrics.record(c);
                    }
                    let _ = job.events.send(Event::Done(result));
                }
            })
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
