//! Retained prompt states: the caches of finished streams, found again by
//! the longest common token prefix with a new prompt.
//!
//! A follow-up turn of a conversation starts with the previous turn's
//! prompt and reply, so it prefills only its new messages; a system prompt
//! shared by many conversations is found the same way. Because a position's
//! keys and values do not depend on how the sequence was chunked or batched,
//! any common prefix of a retained cache is exactly what a fresh prefill
//! would compute: reuse never changes a reply. Where a template re-renders
//! history differently from the tokens that were generated, the match
//! simply ends at the first differing token.

use tensorfold_kv::KvCache;

/// Shortest match worth reusing.
pub const MIN_REUSE: usize = 16;

struct Entry {
    tokens: Vec<u32>,
    cache: KvCache,
    last_used: u64,
}

/// Retained caches, least recently used evicted first.
pub(crate) struct PrefixCache {
    entries: Vec<Entry>,
    /// Most bytes retained.
    limit: usize,
    /// Most entries retained.
    slots: usize,
    clock: u64,
}

impl PrefixCache {
    pub(crate) fn new(limit: usize, slots: usize) -> PrefixCache {
        PrefixCache {
            entries: Vec::new(),
            limit,
            slots,
            clock: 0,
        }
    }

    pub(crate) fn set_limits(&mut self, limit: usize, slots: usize) {
        self.limit = limit;
        self.slots = slots;
        self.shrink_to(limit);
        while self.entries.len() > slots {
            self.evict_oldest();
        }
    }

    /// Bytes retained.
    pub(crate) fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.cache.allocated_bytes()).sum()
    }

    /// A cache holding the longest retained prefix of `prompt`, with room
    /// for `capacity` positions, or `None` when no retained state shares at
    /// least [`MIN_REUSE`] tokens with it.
    pub(crate) fn lookup(&mut self, prompt: &[u32], capacity: usize) -> Option<KvCache> {
        let (best, len) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt)))
            .max_by_key(|&(i, len)| (len, self.entries[i].last_used))?;
        if len < MIN_REUSE {
            return None;
        }
        self.clock += 1;
        let e = &mut self.entries[best];
        e.last_used = self.clock;
        Some(e.cache.clone_prefix(len, capacity))
    }

    /// Retains `cache` (holding `tokens`) within `room` bytes (and the
    /// limit), evicting the least recently used. A retained state that is a
    /// prefix of the new one is replaced by it.
    pub(crate) fn insert(&mut self, tokens: Vec<u32>, mut cache: KvCache, room: usize) {
        if tokens.len() < MIN_REUSE || self.slots == 0 {
            return;
        }
        self.entries
            .retain(|e| common_prefix(&e.tokens, &tokens) < e.tokens.len());
        cache.shrink_to_fit();
        let bytes = cache.allocated_bytes();
        let room = room.min(self.limit);
        if bytes > room {
            return;
        }
        self.shrink_to(room - bytes);
        while self.entries.len() >= self.slots {
            self.evict_oldest();
        }
        self.clock += 1;
        self.entries.push(Entry {
            tokens,
            cache,
            last_used: self.clock,
        });
    }

    /// Evicts least recently used entries until at most `bytes` remain.
    pub(crate) fn shrink_to(&mut self, bytes: usize) {
        while self.bytes() > bytes && !self.entries.is_empty() {
            self.evict_oldest();
        }
    }

    fn evict_oldest(&mut self) {
        if let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used) {
            self.entries.swap_remove(i);
        }
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
