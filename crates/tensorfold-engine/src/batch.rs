//! Many requests served together: each [`Batch::step`] is one shared
//! verification round for every live stream. A stream is admitted only
//! when its whole cache fits the memory budget next to the others'.

use crate::engine::{Completion, Engine, EngineError, Prepared};
use crate::reply::{OnText, Reply};
use std::collections::HashMap;
use tensorfold_kv::KvCache;
use tensorfold_scheduler::{Scheduler, StreamId};

/// Streams in flight on one engine.
pub struct Batch<'e> {
    engine: &'e Engine,
    scheduler: Scheduler<Reply<'e>>,
    /// Cache bytes each live stream reserved at admission.
    reserved: HashMap<StreamId, usize>,
}

impl<'e> Batch<'e> {
    pub(crate) fn new(engine: &'e Engine) -> Batch<'e> {
        Batch {
            engine,
            scheduler: Scheduler::new(engine.decode_share()),
            reserved: HashMap::new(),
        }
    }

    /// Live streams.
    pub fn len(&self) -> usize {
        self.scheduler.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scheduler.is_empty()
    }

    pub fn ids(&self) -> impl Iterator<Item = StreamId> + '_ {
        self.scheduler.ids()
    }

    /// Cache bytes reserved by the live streams.
    pub fn reserved_bytes(&self) -> usize {
        self.reserved.values().sum()
    }

    /// Cache bytes the live streams hold now (at most what they reserved).
    pub fn cache_bytes(&self) -> usize {
        self.scheduler.cache_bytes()
    }

    /// Whether `prepared` can start now: a stream slot is free and its
    /// cache fits the budget next to the live streams'.
    pub fn fits(&self, prepared: &Prepared) -> bool {
        self.len() < self.engine.max_streams()
            && self.reserved_bytes() + prepared.cache_bytes <= self.engine.memory().for_caches()
    }

    /// Starts a stream; `on_text` receives its text deltas (return `false`
    /// to cancel). Refused with [`EngineError::Busy`] when it does not fit now.
    pub fn admit(
        &mut self,
        prepared: Prepared,
        on_text: impl FnMut(&str) -> bool + 'e,
    ) -> Result<StreamId, EngineError> {
        if !self.fits(&prepared) {
            return Err(EngineError::Busy);
        }
        let engine = self.engine;
        let Prepared {
            request,
            tokens,
            budget,
            cache_bytes,
        } = prepared;
        let drafter = if request.draft {
            engine.make_drafter()
        } else {
            None
        };
        let shape = engine.bundle().model.config.kv_shape();
        let cache = KvCache::with_capacity(shape, tokens.len() + budget);
        let on_text: OnText<'e> = Box::new(on_text);
        let reply = Reply::new(engine, request, &tokens, budget, on_text);
        let id = self.scheduler.admit(reply, tokens, budget, drafter, cache);
        self.reserved.insert(id, cache_bytes);
        Ok(id)
    }

    /// Ends a stream at the next step, which reports it as cancelled.
    pub fn cancel(&mut self, id: StreamId) {
        self.scheduler.cancel(id);
    }

    /// One round for every live stream; returns the streams that finished,
    /// whose memory is free again.
    pub fn step(&mut self) -> Vec<(StreamId, Completion)> {
        let done = self.scheduler.round(&self.engine.bundle().model);
        done.into_iter()
            .map(|f| {
                self.reserved.remove(&f.id);
                (f.id, Reply::complete(f))
            })
            .collect()
    }
}
