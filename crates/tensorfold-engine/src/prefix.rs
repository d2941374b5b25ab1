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
//!
//! A state also records which of its ids are *held*: ids a stream generated
//! or a client gave as ids. Those are the truth for the text they spell, so
//! a prompt that sends a reply's text back keeps them (see
//! [`PrefixCache::longest_spelled`]); ids the engine tokenized from text
//! never are, so another prompt's text can never change how a new prompt is
//! tokenized.

use crate::backend::DeviceCache;
use std::ops::Range;
use tensorfold_kv::Cache;

/// Shortest match worth reusing.
pub const MIN_REUSE: usize = 16;

/// The held spans of a run of ids: sorted, disjoint, adjacent spans merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldSpans(Vec<Range<usize>>);

impl HeldSpans {
    /// Every id of a run of `len` held (ids a client gave).
    pub fn all(len: usize) -> HeldSpans {
        let mut held = HeldSpans::default();
        held.push(0..len);
        held
    }

    pub fn spans(&self) -> &[Range<usize>] {
        &self.0
    }

    /// Adds `span`, which starts at or after every span held so far.
    pub fn push(&mut self, span: Range<usize>) {
        if span.is_empty() {
            return;
        }
        match self.0.last_mut() {
            Some(last) if last.end == span.start => last.end = span.end,
            Some(last) => {
                assert!(last.end < span.start, "held spans come in order");
                self.0.push(span);
            }
            None => self.0.push(span),
        }
    }

    /// The spans within the first `len` ids.
    pub fn truncated(&self, len: usize) -> HeldSpans {
        HeldSpans(
            self.0
                .iter()
                .filter(|s| s.start < len)
                .map(|s| s.start..s.end.min(len))
                .collect(),
        )
    }

    fn contains(&self, i: usize) -> bool {
        self.0.iter().any(|s| s.contains(&i))
    }

    /// The longest run `..end` with `end <= limit` that ends inside or at the
    /// end of a held span (0 when none does).
    fn held_end_at_most(&self, limit: usize) -> usize {
        self.0
            .iter()
            .filter(|s| s.start < limit)
            .map(|s| s.end.min(limit))
            .max()
            .unwrap_or(0)
    }
}

/// A prompt's ids and which of them are held: what [`crate::Engine::prompt_ids`]
/// makes of a prompt, for front-ends that count tokens before queueing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptIds {
    pub ids: Vec<u32>,
    pub held: HeldSpans,
}

struct Entry {
    tokens: Vec<u32>,
    held: HeldSpans,
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
    /// byte length): the ids, that length and the run's held spans.
    /// `spells` must accept every prefix of an accepted run, as a text
    /// prefix does. The run must part from `tokens` at a held id and ends
    /// inside or at the end of a held span: ids tokenized from another
    /// prompt's text are kept only between held ones.
    pub(crate) fn longest_spelled(
        &self,
        tokens: &[u32],
        spells: impl Fn(&[u32]) -> Option<usize>,
    ) -> Option<(PromptIds, usize)> {
        let mut best: Option<(PromptIds, usize)> = None;
        for e in &self.entries {
            let common = common_prefix(&e.tokens, tokens);
            // Only a continuation of a retained state (a cold prompt shares
            // little) whose held ids and the text part ways before its end.
            if common < MIN_REUSE
                || common == e.tokens.len()
                || !e.held.contains(common)
                || spells(&e.tokens[..common]).is_none()
            {
                continue;
            }
            // Binary search for the longest accepted run past `common`, up
            // to the last held id (nothing after it can be kept).
            let (mut lo, mut hi) = (common, e.held.held_end_at_most(e.tokens.len()));
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if spells(&e.tokens[..mid]).is_some() {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            lo = e.held.held_end_at_most(lo).max(common);
            // Ids that spell nothing more are not part of the text.
            let len = spells(&e.tokens[..lo]).unwrap_or(0);
            while lo > common && spells(&e.tokens[..lo - 1]) == Some(len) {
                lo -= 1;
            }
            if lo > common && best.as_ref().is_none_or(|(b, _)| lo > b.ids.len()) {
                let run = PromptIds {
                    ids: e.tokens[..lo].to_vec(),
                    held: e.held.truncated(lo),
                };
                best = Some((run, len));
            }
        }
        best
    }

    /// Retains `cache` (holding `tokens`, `held` of them held) within
    /// `room` bytes (and the limit), evicting the least recently used. A
    /// retained state that is a prefix of the new one is replaced by it.
    pub(crate) fn insert(
        &mut self,
        tokens: Vec<u32>,
        held: HeldSpans,
        mut cache: DeviceCache,
        room: usize,
    ) {
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
            held,
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

#[cfg(test)]
// Spans are written as arrays of ranges: one span is one range, not a range of values.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use tensorfold_kv::{KvCache, KvShape};

    fn cache() -> DeviceCache {
        DeviceCache::Cpu(KvCache::new(KvShape {
            layers: 1,
            kv_heads: 1,
            head_dim: 2,
        }))
    }

    /// Ids 0..=25 spell one letter each; 100 spells "ab" (a longer piece).
    fn spell(ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| match i {
                100 => "ab".to_string(),
                i => char::from(b'a' + (i % 26) as u8).to_string(),
            })
            .collect()
    }

    fn spells(text: &str) -> impl Fn(&[u32]) -> Option<usize> + '_ {
        move |ids| {
            let s = spell(ids);
            text.starts_with(&s).then_some(s.len())
        }
    }

    fn held(spans: &[Range<usize>]) -> HeldSpans {
        let mut h = HeldSpans::default();
        for s in spans {
            h.push(s.clone());
        }
        h
    }

    #[test]
    fn only_held_ids_are_kept_for_their_text() {
        let shared: Vec<u32> = (0..MIN_REUSE as u32).map(|i| i % 10).collect();
        let text = spell(&shared) + "abc";
        // The new prompt tokenizes "ab" as one id.
        let tokens = [shared.clone(), vec![100, 2]].concat();
        let other = [shared.clone(), vec![0, 1, 2]].concat();

        // Another prompt that tokenized "a", "b" as two ids: not kept.
        let mut retained = PrefixCache::new(usize::MAX, 8);
        retained.insert(other.clone(), HeldSpans::default(), cache(), usize::MAX);
        assert_eq!(retained.longest_spelled(&tokens, spells(&text)), None);

        // The same ids generated as a reply to the shared prompt: kept.
        let mut retained = PrefixCache::new(usize::MAX, 8);
        let reply = held(&[shared.len()..other.len()]);
        retained.insert(other.clone(), reply.clone(), cache(), usize::MAX);
        let (run, len) = retained.longest_spelled(&tokens, spells(&text)).unwrap();
        assert_eq!(run.ids, other);
        assert_eq!(run.held, reply);
        assert_eq!(len, text.len());
    }

    #[test]
    fn a_kept_run_ends_with_its_last_held_id() {
        let shared: Vec<u32> = (0..MIN_REUSE as u32).map(|i| i % 10).collect();
        // Retained: the shared prompt, a reply "ab" held as two ids, a
        // tokenized "cd", a reply "e" held, then a tokenized "fg".
        let state = [shared.clone(), vec![0, 1, 2, 3, 4, 5, 6]].concat();
        let n = shared.len();
        let spans = held(&[n..n + 2, n + 4..n + 5]);
        let mut retained = PrefixCache::new(usize::MAX, 8);
        retained.insert(state.clone(), spans.clone(), cache(), usize::MAX);

        // The history comes back re-tokenized ("ab" as one id) and goes on
        // past the retained text: the run ends with the held "e", so "fg"
        // is tokenized with what follows, as a fresh prompt would be.
        let text = spell(&shared) + "abcdefgh";
        let tokens = [shared.clone(), vec![100, 2, 3, 4, 5, 6, 7]].concat();
        let (run, len) = retained.longest_spelled(&tokens, spells(&text)).unwrap();
        assert_eq!(run.ids, state[..n + 5]);
        assert_eq!(run.held, spans);
        assert_eq!(len, n + 5);

        // Held spans merge when adjacent and are cut at a run's end.
        assert_eq!(held(&[0..2, 2..4]).spans(), &[0..4]);
        assert_eq!(spans.truncated(n + 1).spans(), &[n..n + 1]);
    }
}
