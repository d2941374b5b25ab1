//! Context copies: the longest recent n-gram match over prompt and reply
//! proposes what followed it last time. Costs no model call, and wins big
//! when a reply repeats or edits text it has seen (code, quotes, lists).

use crate::Drafter;

#[derive(Debug, Clone)]
pub struct ContextConfig {
    /// Shortest suffix that counts as a match.
    pub min_match: usize,
    /// Longest suffix tried first.
    pub max_match: usize,
    /// Rounds of silence after `misses_before_silence` empty acceptances;
    /// each further silence without an accepted draft doubles, up to
    /// `max_silence_rounds`.
    pub silence_rounds: usize,
    pub misses_before_silence: usize,
    pub max_silence_rounds: usize,
    /// Drafts proposed at first. The depth doubles after a round that
    /// accepts every draft and halves after a miss: a round's cost grows
    /// with its rows, so depth is earned by acceptance.
    pub start_depth: usize,
}

impl Default for ContextConfig {
    fn default() -> Self {
        ContextConfig {
            min_match: 2,
            max_match: 6,
            silence_rounds: 4,
            misses_before_silence: 3,
            max_silence_rounds: 32,
            start_depth: 2,
        }
    }
}

pub struct ContextDrafter {
    config: ContextConfig,
    misses: usize,
    silent: usize,
    /// Length of the next silence.
    silence: usize,
    /// Most drafts proposed now.
    depth: usize,
}

/// Deepest proposal, whatever the acceptance.
const MAX_DEPTH: usize = 16;

impl ContextDrafter {
    pub fn new(config: ContextConfig) -> ContextDrafter {
        ContextDrafter {
            misses: 0,
            silent: 0,
            silence: config.silence_rounds,
            depth: config.start_depth.clamp(1, MAX_DEPTH),
            config,
        }
    }

    /// Most drafts the next proposal may hold.
    pub fn depth(&self) -> usize {
        self.depth
    }
}

/// Where the latest earlier occurrence of the last `n` tokens ends.
fn find_suffix(tokens: &[u32], n: usize) -> Option<usize> {
    if tokens.len() <= n {
        return None;
    }
    let suffix = &tokens[tokens.len() - n..];
    (n..tokens.len())
        .rev()
        .find(|&end| &tokens[end - n..end] == suffix)
}

impl Drafter for ContextDrafter {
    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32> {
        if self.silent > 0 {
            self.silent -= 1;
            return Vec::new();
        }
        for n in (self.config.min_match..=self.config.max_match).rev() {
            if let Some(end) = find_suffix(context, n) {
                return context[end..]
                    .iter()
                    .take(max.min(self.depth))
                    .copied()
                    .collect();
            }
        }
        Vec::new()
    }

    fn observe(&mut self, proposed: usize, accepted: usize, _elapsed: std::time::Duration) {
        if proposed == 0 {
            return;
        }
        if accepted == proposed {
            self.depth = (self.depth * 2).min(MAX_DEPTH);
        } else {
            self.depth = (self.depth / 2).max(1);
        }
        if accepted == 0 {
            self.misses += 1;
            if self.misses >= self.config.misses_before_silence {
                self.silent = self.silence;
                self.silence = (self.silence * 2).min(self.config.max_silence_rounds);
                self.misses = 0;
            }
        } else {
            self.misses = 0;
            self.silence = self.config.silence_rounds;
        }
    }

    fn name(&self) -> &str {
        "context"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_what_followed_the_latest_match() {
        let mut d = ContextDrafter::new(ContextConfig::default());
        let ctx = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3];
        assert_eq!(d.propose(&ctx, 3), vec![4, 5]);
        d.observe(2, 2, std::time::Duration::ZERO);
        assert_eq!(d.propose(&ctx, 3), vec![4, 5, 9]);
        assert_eq!(d.propose(&[1, 2, 3], 3), Vec::<u32>::new());
    }

    #[test]
    fn falls_silent_after_repeated_misses() {
        let mut d = ContextDrafter::new(ContextConfig {
            silence_rounds: 2,
            misses_before_silence: 2,
            ..Default::default()
        });
        let ctx = [7, 8, 1, 7, 8];
        for _ in 0..2 {
            assert!(!d.propose(&ctx, 4).is_empty());
            d.observe(3, 0, std::time::Duration::ZERO);
        }
        assert!(d.propose(&ctx, 4).is_empty());
        assert!(d.propose(&ctx, 4).is_empty());
        assert!(!d.propose(&ctx, 4).is_empty());
    }

    #[test]
    fn depth_is_earned_by_acceptance() {
        let mut d = ContextDrafter::new(ContextConfig::default());
        assert_eq!(d.depth(), 2);
        d.observe(2, 2, std::time::Duration::ZERO);
        d.observe(4, 4, std::time::Duration::ZERO);
        assert_eq!(d.depth(), 8);
        d.observe(8, 3, std::time::Duration::ZERO);
        assert_eq!(d.depth(), 4);
    }

    #[test]
    fn silences_grow_until_a_draft_is_accepted() {
        let mut d = ContextDrafter::new(ContextConfig {
            silence_rounds: 1,
            misses_before_silence: 1,
            ..Default::default()
        });
        let ctx = [7, 8, 1, 7, 8];
        let mut silent = Vec::new();
        for _ in 0..3 {
            assert!(!d.propose(&ctx, 4).is_empty());
            d.observe(1, 0, std::time::Duration::ZERO);
            silent.push((0..).take_while(|_| d.propose(&ctx, 4).is_empty()).count());
            d.observe(1, 1, std::time::Duration::ZERO);
        }
        assert_eq!(silent, [1, 1, 1]);
        for _ in 0..3 {
            d.observe(1, 0, std::time::Duration::ZERO);
            let n = (0..).take_while(|_| d.propose(&ctx, 4).is_empty()).count();
            silent.push(n);
        }
        assert_eq!(silent[3..], [1, 2, 4]);
    }
}
