//! A thinking budget: a reply that is still inside its `<think>` block
//! after `tokens` reply tokens has the block closed for it (`</think>` and
//! the blank line, forced), so the answer starts within the budget.
//!
//! Exactness: whether a row is forced, and to what, is a function of the
//! reply tokens before it alone, so drafted rows are forced as serial
//! decode forces them.

use crate::engine::{Engine, EngineError};

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

#[derive(Debug, Clone)]
pub struct ThinkingBudget {
    /// Reply tokens the reasoning may take.
    pub tokens: usize,
    /// The prompt opened the block (the reply starts inside it).
    pub opened: bool,
    /// What closes the block: `</think>` and a blank line, as ids.
    close: Vec<u32>,
}

impl ThinkingBudget {
    pub fn new(
        engine: &Engine,
        tokens: usize,
        opened: bool,
    ) -> Result<ThinkingBudget, EngineError> {
        let close = engine
            .bundle()
            .tokenizer
            .encode(format!("{CLOSE}\n\n"), false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?
            .get_ids()
            .to_vec();
        Ok(ThinkingBudget {
            tokens,
            opened,
            close,
        })
    }

    /// Whether the token at reply index `k` may be forced.
    pub(crate) fn covers(&self, k: usize) -> bool {
        (self.tokens..self.tokens + self.close.len()).contains(&k)
    }

    /// The token forced at reply index `reply.len()`, if any: past the
    /// budget, while the reply opened a block and has not closed it.
    pub(crate) fn forced(&self, engine: &Engine, reply: &[u32]) -> Option<u32> {
        let k = reply.len();
        if !self.covers(k) {
            return None;
        }
        let thought = engine
            .bundle()
            .tokenizer
            .decode(&reply[..self.tokens], false)
            .unwrap_or_default();
        let opened = self.opened || thought.contains(OPEN);
        if !opened || thought.contains(CLOSE) {
            return None;
        }
        Some(self.close[k - self.tokens])
    }
}
