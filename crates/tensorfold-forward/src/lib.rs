//! The interface between the scheduler and any backend, and nothing else.
//!
//! A backend (the CPU `Model`, a GPU model) implements [`Forward`]: it
//! runs a batch of sequences, each a [`Seq`] of new tokens extending its
//! own [`Cache`], and hands back the [`Logits`] rows each asked for, or a
//! [`ForwardError`]. A backend that can also pick tokens where its logits
//! are implements [`PickingForward`]. The scheduler drives these traits
//! alone, so it never sees a model file, a weight or a device.
//!
//! Every backend keeps the row invariant: a sequence's rows are bitwise
//! those it would get alone, whatever else shares the call.

#![forbid(unsafe_code)]

use tensorfold_sampling::{Draw, SeqRows};

/// What the scheduler asks of one sequence's cache, on any device: how
/// many positions it holds, exact rollback, and what it occupies.
pub trait Cache {
    /// Positions held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Drops every position from `len` on.
    fn truncate(&mut self, len: usize);
    /// Bytes allocated, stored or not.
    fn allocated_bytes(&self) -> usize;
}

/// Which rows' logits a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last row (prefill).
    Last,
    /// Every row (verification).
    All,
    /// None: the call only fills the cache.
    None,
}

impl Logits {
    /// Which of `n` rows this asks for.
    pub fn rows(self, n: usize) -> std::ops::Range<usize> {
        match self {
            Logits::None => n..n,
            Logits::Last => n.saturating_sub(1)..n,
            Logits::All => 0..n,
        }
    }
}

/// One sequence's part of a batched forward: its new tokens, the cache
/// they extend, and which of their logits to return.
pub struct Seq<'a, C> {
    pub tokens: &'a [u32],
    pub cache: &'a mut C,
    pub logits: Logits,
}

/// A forward that did not run.
#[derive(Debug, Clone, thiserror::Error)]
#[error("forward failed: {0}")]
pub struct ForwardError(pub String);

/// A forward that can run a batch of sequences, on whichever device holds
/// the weights: what the scheduler drives. The CPU forward never fails;
/// a GPU backend may (a lost device, an allocation refused).
pub trait Forward {
    type Cache: Cache;
    fn vocab_size(&self) -> usize;
    /// Each sequence's requested logits rows, bitwise those it would get
    /// alone (the row invariant).
    fn forward_batch(
        &self,
        seqs: &mut [Seq<'_, Self::Cache>],
    ) -> Result<Vec<Vec<f32>>, ForwardError>;
}

/// A forward that may pick tokens where its logits are. Each sequence
/// given a draw gets its requested rows back as the tokens the rule of
/// `tensorfold-sampling` picks from them, each at the position its row
/// predicts (the row's own position plus one), or, from a forward that
/// does not pick, as the rows themselves, which the scheduler then picks
/// on the host by the same rule.
pub trait PickingForward: Forward {
    fn forward_picked(
        &self,
        seqs: &mut [Seq<'_, Self::Cache>],
        draws: &[Option<Draw>],
    ) -> Result<Vec<SeqRows>, ForwardError>;
}

#[cfg(test)]
mod tests {
    use super::Logits;

    #[test]
    fn logits_ask_for_their_rows() {
        assert_eq!(Logits::All.rows(3), 0..3);
        assert_eq!(Logits::Last.rows(3), 2..3);
        assert_eq!(Logits::None.rows(3), 3..3);
        assert_eq!(Logits::Last.rows(0), 0..0);
    }
}
