//! A draft model: a smaller model with the target's vocabulary, decoding
//! greedily ahead of the target with its own cache. Rolled back by
//! truncating to the prefix it shares with the next context.

use crate::Drafter;
use std::collections::HashMap;
use std::sync::Arc;
use tensorfold_kv::KvCache;
use tensorfold_models::{Logits, Model};

#[derive(Debug, thiserror::Error)]
pub enum DraftPairError {
    #[error("draft model vocabulary ({draft} tokens) differs from the target's ({target} tokens)")]
    VocabSize { draft: usize, target: usize },
    #[error("draft and target tokenizers differ: token {id} is {draft:?} in the draft and {target:?} in the target")]
    Token {
        id: u32,
        draft: String,
        target: String,
    },
}

pub struct DraftModel {
    model: Arc<Model>,
    cache: KvCache,
    /// Tokens whose keys and values `cache` holds.
    cached: Vec<u32>,
}

/// Refuses a pair whose tokenizers would map ids to different text.
pub fn check_pair(
    target: &HashMap<String, u32>,
    draft: &HashMap<String, u32>,
) -> Result<(), DraftPairError> {
    if target.len() != draft.len() {
        return Err(DraftPairError::VocabSize {
            draft: draft.len(),
            target: target.len(),
        });
    }
    let by_id = |m: &HashMap<String, u32>| {
        let mut v: Vec<(u32, String)> = m.iter().map(|(s, &i)| (i, s.clone())).collect();
        v.sort();
        v
    };
    for ((ti, ts), (_, ds)) in by_id(target).into_iter().zip(by_id(draft)) {
        if ts != ds {
            return Err(DraftPairError::Token {
                id: ti,
                draft: ds,
                target: ts,
            });
        }
    }
    Ok(())
}

impl DraftModel {
    pub fn new(model: Arc<Model>) -> DraftModel {
        let cache = KvCache::new(model.config.kv_shape());
        DraftModel {
            model,
            cache,
            cached: Vec::new(),
        }
    }
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b }) as u32
}

impl Drafter for DraftModel {
    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32> {
        let window = self.model.config.max_positions;
        if max == 0 || context.len() + max >= window {
            return Vec::new();
        }
        let common = self
            .cached
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        // Keep at least one token to re-run so there are logits to draft from.
        let keep = common.min(context.len() - 1);
        self.cache.truncate(keep);
        self.cached.truncate(keep);
        let mut logits = self
            .model
            .forward(&context[keep..], &mut self.cache, Logits::Last);
        self.cached.extend_from_slice(&context[keep..]);
        let mut drafts = Vec::with_capacity(max);
        loop {
            let t = argmax(&logits);
            drafts.push(t);
            if drafts.len() == max {
                break;
            }
            logits = self.model.forward(&[t], &mut self.cache, Logits::All);
            self.cached.push(t);
        }
        drafts
    }

    fn name(&self) -> &str {
        "model"
    }
}
