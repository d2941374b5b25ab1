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

use crate::backend::DeviceCache;
use tensorfold_kv::Cache;

/// Shortest match worth reusing.
pub const MIN_REUSE: usize = 16;

struct Entry {
    tokens: Vec<u32>,
    cache: DeviceCache,
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
    pub(crate) fn lookup(&mut self, prompt: &[u32], capacity: usize) -> Option<DeviceCache> {
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
        e.cache.clone_prefix(len, capacity)
    }

    /// The longest run of retained ids that goes beyond its common prefix
    /// with `tokens` and whose text `spells` accepts (returning the text's
    /// byte length): the ids and that length. `spells` must accept every
    /// prefix of an accepted run, as a text prefix does.
    pub(crate) fn longest_spelled(
        &self,
        tokens: &[u32],
        spells: impl Fn(&[u32]) -> Option<usize>,
    ) -> Option<(Vec<u32>, usize)> {
        let mut best: Option<(Vec<u32>, usize)> = None;
        for e in &self.entries {
            let common = common_prefix(&e.tokens, tokens);
            // Only a continuation of a retained state (a cold prompt shares
            // little) whose ids and text part ways before its end.
            if common < MIN_REUSE
                || common == e.tokens.len()
                || spells(&e.tokens[..common]).is_none()
            {
                continue;
            }
            // Binary search for the longest accepted run past `common`.
            let (mut lo, mut hi) = (common, e.tokens.len());
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if spells(&e.tokens[..mid]).is_some() {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            // Ids that spell nothing more are not part of the text.
            let len = spells(&e.tokens[..lo]).unwrap_or(0);
            while lo > common && spells(&e.tokens[..lo - 1]) == Some(len) {
                lo -= 1;
            }
            if lo > common && best.as_ref().is_none_or(|(b, _)| lo > b.len()) {
                best = Some((e.tokens[..lo].to_vec(), len));
            }
        }
        best
    }

    /// Retains `cache` (holding `tokens`) within `room` bytes (and the
    /// limit), evicting the least recently used. A retained state that is a
    /// prefix of the new one is replaced by it.
    pub(crate) fn insert(&mut self, tokens: Vec<u32>, mut cache: DeviceCache, room: usize) {
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
