//! Exact speculative decoding.
//!
//! A [`Drafter`] proposes the tokens it guesses come next; the target model
//! evaluates the pending token and the drafts in one forward; [`accept`]
//! keeps drafts while each equals the token the target's own sampler picks
//! at that position, and the first mismatch (or the row after the last
//! draft) yields the bonus token. Equality is the only rule, so the reply
//! is the serial reply, token for token, whatever was drafted.

mod auto;
mod context;

pub use auto::{Arm, AutoDrafter};
pub use context::{ContextConfig, ContextDrafter};

/// Proposes continuations of a token sequence.
pub trait Drafter: Send {
    /// Up to `max` tokens guessed to follow `context` (prompt and reply so far).
    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32>;
    /// How the last proposal fared: `accepted` of `proposed` drafts kept,
    /// in a round that took `elapsed` from proposing to verifying.
    fn observe(&mut self, proposed: usize, accepted: usize, elapsed: std::time::Duration) {
        let _ = (proposed, accepted, elapsed);
    }
    fn name(&self) -> &str;
}

/// Counts of one request's drafting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Draft tokens proposed and verified.
    pub drafted: usize,
    /// Draft tokens kept.
    pub accepted: usize,
    /// Target forwards after the prompt (one per round).
    pub rounds: usize,
}

impl DraftStats {
    /// Tokens produced per round (1.0 without drafting).
    pub fn tokens_per_round(&self) -> f64 {
        if self.rounds == 0 {
            return 0.0;
        }
        (self.accepted + self.rounds) as f64 / self.rounds as f64
    }
}

/// Verification of one round: `pick(i)` is the target's token for row `i`
/// (row 0 follows the pending token, row `i` follows draft `i - 1`).
/// Returns the accepted drafts' count and the bonus token.
pub fn accept(drafts: &[u32], mut pick: impl FnMut(usize) -> u32) -> (usize, u32) {
    for (i, &d) in drafts.iter().enumerate() {
        let t = pick(i);
        if t != d {
            return (i, t);
        }
    }
    (drafts.len(), pick(drafts.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The accepted drafts plus the bonus are exactly the picks up to the
        /// first disagreement: what serial decode would have produced.
        #[test]
        fn accept_keeps_the_agreeing_prefix(
            truth in proptest::collection::vec(0u32..4, 1..12),
            drafts in proptest::collection::vec(0u32..4, 0..11),
        ) {
            let drafts: Vec<u32> = drafts.into_iter().take(truth.len() - 1).collect();
            let (n, bonus) = accept(&drafts, |i| truth[i]);
            let agree = drafts.iter().zip(&truth).take_while(|(d, t)| d == t).count();
            prop_assert_eq!(n, agree);
            prop_assert_eq!(bonus, truth[n]);
        }
    }
}
