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
    /// `max_silence_rounds`. A match of `max_match` tokens is never silenced.
    pub silence_rounds: usize,
    pub misses_before_silence: usize,
    pub max_silence_rounds: usize,
    /// What one more verified row costs, as a share of a one-row round. A
    /// proposal grows while the chance that its next draft and every draft
    /// before it are kept is at least this: cheap rows earn deep proposals.
    pub row_cost: f64,
}

impl Default for ContextConfig {
    fn default() -> Self {
        ContextConfig {
            min_match: 2,
            max_match: 6,
            silence_rounds: 4,
            misses_before_silence: 3,
            max_silence_rounds: 32,
            row_cost: 0.15,
        }
    }
}

/// Drafts kept and missed after matches of one length (decayed counts):
/// the chance that a draft is kept once the drafts before it were.
#[derive(Debug, Clone, Copy)]
struct Odds {
    kept: f64,
    missed: f64,
}

impl Odds {
    fn chance(self) -> f64 {
        self.kept / (self.kept + self.missed)
    }
}

/// Weight kept by older rounds at each new one.
const DECAY: f64 = 0.9;

pub struct ContextDrafter {
    config: ContextConfig,
    misses: usize,
    silent: usize,
    /// Length of the next silence.
    silence: usize,
    /// Indexed by match length.
    odds: Vec<Odds>,
    /// Match length of the last proposal.
    last_match: usize,
}

/// Deepest proposal, whatever the acceptance.
const MAX_DEPTH: usize = 16;

impl ContextDrafter {
    pub fn new(config: ContextConfig) -> ContextDrafter {
        // Before any round: a longer match is likelier to go on, n in n + 1.
        let odds = (0..=config.max_match)
            .map(|n| Odds {
                kept: n as f64,
                missed: 1.0,
            })
            .collect();
        ContextDrafter {
            misses: 0,
            silent: 0,
            silence: config.silence_rounds,
            odds,
            last_match: config.max_match,
            config,
        }
    }

    /// Most drafts a proposal after a match of `n` tokens holds now.
    pub fn depth(&self, n: usize) -> usize {
        let p = self.odds[n.min(self.config.max_match)].chance();
        let (mut depth, mut chance) = (1, p);
        while depth < MAX_DEPTH && chance * p >= self.config.row_cost {
            chance *= p;
            depth += 1;
        }
        depth
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
        for n in (self.config.min_match..=self.config.max_match).rev() {
            if let Some(end) = find_suffix(context, n) {
                if self.silent > 0 && n < self.config.max_match {
                    break;
                }
                self.last_match = n;
                return context[end..]
                    .iter()
                    .take(max.min(self.depth(n)))
                    .copied()
                    .collect();
            }
        }
        self.silent = self.silent.saturating_sub(1);
        Vec::new()
    }

    fn observe(&mut self, proposed: usize, accepted: usize, _elapsed: std::time::Duration) {
        if proposed == 0 {
            return;
        }
        let odds = &mut self.odds[self.last_match];
        odds.kept = odds.kept * DECAY + accepted as f64;
        odds.missed = odds.missed * DECAY + f64::from(u8::from(accepted < proposed));
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
        assert_eq!(d.propose(&ctx, 2), vec![4, 5]);
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
        let ctx = [7, 8, 1, 7, 8];
        let start = d.depth(2);
        assert!((2..=8).contains(&start), "{start}");
        for _ in 0..6 {
            d.propose(&ctx, 16);
            d.observe(4, 4, std::time::Duration::ZERO);
        }
        let deep = d.depth(2);
        assert!(deep > start, "kept drafts deepen proposals");
        for _ in 0..12 {
            d.propose(&ctx, 16);
            d.observe(4, 0, std::time::Duration::ZERO);
        }
        assert!(
            d.depth(2) <= 2 && d.depth(2) < deep,
            "missed drafts shorten them"
        );
        assert_eq!(
            d.depth(6),
            ContextDrafter::new(ContextConfig::default()).depth(6),
            "per match length"
        );
        let cheap = ContextDrafter::new(ContextConfig {
            row_cost: 0.01,
            ..Default::default()
        });
        assert!(cheap.depth(2) > start, "cheap rows earn deeper proposals");
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
