//! A draft model: a smaller model with the target's vocabulary, decoding
//! greedily ahead of the target with its own cache. Rolled back by
//! truncating to the prefix it shares with the next context. It lives
//! here, where models meet drafting, so `tensorfold-spec` stays free of
//! model files.

use std::collections::HashMap;
use std::sync::Arc;
use tensorfold_kv::KvCache;
use tensorfold_models::{Logits, Model};
use tensorfold_spec::Drafter;

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
    /// Ids both models embed: the draft reads no context token past its
    /// own embedding and proposes none past the target's.
    vocab: u32,
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
    /// A drafter for a target whose embedding has `target_vocab` rows.
    pub fn new(model: Arc<Model>, target_vocab: usize) -> DraftModel {
        let cache = KvCache::new(model.config.kv_shape());
        let vocab = model.config.vocab_size.min(target_vocab);
        DraftModel {
            vocab: u32::try_from(vocab).unwrap_or(u32::MAX),
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
        if max == 0 || context.len() + max >= window || context.iter().any(|&t| t >= self.vocab) {
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
            if t >= self.vocab {
                break;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tensorfold_models::synth::{write_gguf, SynthSpec};
    use tensorfold_models::{Arch, Format};

    fn tiny_model() -> Arc<Model> {
        let path =
            std::env::temp_dir().join(format!("tensorfold-draft-{}.gguf", std::process::id()));
        write_gguf(&path, &SynthSpec::tiny(Arch::Llama, Format::F32, 11)).unwrap();
        let model = tensorfold_models::load(&path).unwrap().model;
        let _ = std::fs::remove_file(&path);
        Arc::new(model)
    }

    /// A draft whose embedding is larger than the target's proposes only
    /// ids the target embeds, and one whose embedding is smaller reads no
    /// context token it lacks.
    #[test]
    fn proposals_and_context_stay_inside_both_vocabularies() {
        let model = tiny_model();
        let vocab = model.config.vocab_size;
        let mut unbounded = DraftModel::new(model.clone(), usize::MAX);
        let context: Vec<u32> = (0..12).map(|i| (i * 7 % vocab) as u32).collect();
        let free = unbounded.propose(&context, 6);
        assert_eq!(free.len(), 6);
        // The target embeds only the smallest proposed id: drafting stops
        // before any id at or past it.
        let smallest = *free.iter().min().unwrap();
        let mut bounded = DraftModel::new(model.clone(), smallest as usize);
        let kept = bounded.propose(&context, 6);
        assert!(kept.iter().all(|&t| t < smallest), "{kept:?}");
        assert_eq!(kept, free[..kept.len()]);

        let mut draft = DraftModel::new(model, usize::MAX);
        let outside = [1, 2, vocab as u32 + 5];
        assert!(draft.propose(&outside, 4).is_empty());
    }
}
