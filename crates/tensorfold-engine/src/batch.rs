//! Many requests served together: each [`Batch::step`] is one shared
//! verification round for every live stream. A stream is admitted only
//! when its whole cache fits the memory budget next to the others'.

use crate::backend::DeviceCache;
use crate::engine::{Completion, Engine, EngineError, Prepared};
use crate::prefix::HeldSpans;
use crate::reply::{OnText, Outcome, Reply};
use std::collections::HashMap;
use tensorfold_kv::Cache;
use tensorfold_scheduler::{Finished, Scheduler, StreamId};

/// Streams in flight on one engine.
pub struct Batch<'e> {
    engine: &'e Engine,
    scheduler: Scheduler<Reply<'e>, DeviceCache>,
    /// Cache bytes each live stream reserved at admission.
    reserved: HashMap<StreamId, usize>,
    /// Prompt tokens each live stream took from a retained state.
    cached_tokens: HashMap<StreamId, usize>,
    /// Each live stream's held spans: its prompt's, then every position its
    /// reply may fill (generated ids are held).
    held: HashMap<StreamId, HeldSpans>,
}

impl<'e> Batch<'e> {
    pub(crate) fn new(engine: &'e Engine) -> Batch<'e> {
        Batch {
            engine,
            scheduler: Scheduler::new(engine.decode_share())
                .with_min_prefill(engine.min_prefill())
                .with_decode_rows(engine.decode_rows()),
            reserved: HashMap::new(),
            cached_tokens: HashMap::new(),
            held: HashMap::new(),
        }
    }

    /// Live streams.
    pub fn len(&self) -> usize {
        self.scheduler.len()
    }

    /// Live streams still prefilling their prompts (no token yet).
    pub fn prefilling(&self) -> usize {
        self.scheduler.prefilling()
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
    /// cache fits the budget next to the live streams' (retained prompt
    /// states give way to it).
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
            mut held,
            budget,
            cache_bytes,
        } = prepared;
        held.push(tokens.len()..tokens.len() + budget);
        let drafter = if request.draft {
            engine.make_drafter()
        } else {
            None
        };
        let caches = engine.memory().for_caches();
        let reused = {
            let mut retained = engine.prefix_cache();
            retained.shrink_to(caches - self.reserved_bytes() - cache_bytes);
            if request.cache_prompt {
                retained.lookup(&tokens, tokens.len() + budget)
            } else {
                None
            }
        };
        let cache = match reused {
            Some(c) => c,
            None => engine.new_cache(tokens.len() + budget)?,
        };
        let cached_tokens = cache.len().min(tokens.len() - 1);
        let on_text: OnText<'e> = Box::new(on_text);
        let reply = Reply::new(engine, request, &tokens, budget, on_text);
        let id = self.scheduler.admit(reply, tokens, budget, drafter, cache);
        self.reserved.insert(id, cache_bytes);
        self.cached_tokens.insert(id, cached_tokens);
        self.held.insert(id, held);
        Ok(id)
    }

    /// Ends a stream at the next step, which reports it as cancelled.
    pub fn cancel(&mut self, id: StreamId) {
        self.scheduler.cancel(id);
    }

    /// One round for every live stream; returns the streams that finished,
    /// whose memory is free again (their states retained for reuse, within
    /// the budget, unless the request said `cache_prompt: false`). When the
    /// device fails, every live stream ends with its error.
    pub fn step(&mut self) -> Vec<(StreamId, Result<Completion, EngineError>)> {
        let done = self.scheduler.round(&self.engine.target());
        done.into_iter().map(|f| self.finish(f)).collect()
    }

    fn finish(
        &mut self,
        f: Finished<Reply<'e>, DeviceCache>,
    ) -> (StreamId, Result<Completion, EngineError>) {
        let Finished {
            id,
            client,
            cancelled,
            error,
            draft,
            prefill_time,
            decode_time,
            cache,
            tokens,
        } = f;
        self.reserved.remove(&id);
        let held = self.held.remove(&id).unwrap_or_default();
        if let Some(e) = error {
            self.cached_tokens.remove(&id);
            return (id, Err(EngineError::Backend(e.to_string())));
        }
        let outcome = Outcome {
            cancelled,
            draft,
            prefill_time,
            decode_time,
            cached_tokens: self.cached_tokens.remove(&id).unwrap_or(0),
        };
        if client.caches_prompt() {
            let room = self.engine.memory().for_caches() - self.reserved_bytes();
            let held = held.truncated(tokens.len());
            self.engine.prefix_cache().insert(tokens, held, cache, room);
        }
        (id, Ok(client.complete(&outcome)))
    }
}
