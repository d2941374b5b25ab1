//! A draft model: a smaller model with the target's vocabulary, decoding
//! greedily ahead of the target with its own cache, on the device the
//! engine placed it on (the target's CUDA GPU, else the CPU). Rolled back
//! by truncating to the prefix it shares with the next context. It lives
//! here, where models meet drafting, so `tensorfold-spec` stays free of
//! model files.

use crate::backend::{Device, DeviceCache, PlacedModel};
use std::collections::HashMap;
use std::sync::Arc;
use tensorfold_kv::Cache;
use tensorfold_models::{ForwardError, Logits, Model, Seq};
use tensorfold_sampling::{argmax, Draw, SeqRows};
use tensorfold_scheduler::{PickingForward, PREFILL_CHUNK};
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

/// A drafter that decodes a draft model greedily, with a cache of its own
/// on the draft's device (one drafter per request).
pub struct DraftModel {
    /// The weights and where they run, shared by every request's drafter.
    placed: Arc<PlacedModel>,
    /// Ids both models embed: the draft reads no context token past its
    /// own embedding and proposes none past the target's.
    vocab: u32,
    cache: DeviceCache,
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
    /// A drafter on the CPU for a target whose embedding has `target_vocab` rows.
    pub fn new(model: Arc<Model>, target_vocab: usize) -> DraftModel {
        let placed = PlacedModel {
            model,
            device: Device::Cpu,
        };
        DraftModel::placed(Arc::new(placed), target_vocab)
    }

    /// A drafter on the device `placed` runs on, with an empty cache there.
    pub(crate) fn placed(placed: Arc<PlacedModel>, target_vocab: usize) -> DraftModel {
        let vocab = placed.model.config.vocab_size.min(target_vocab);
        DraftModel {
            vocab: u32::try_from(vocab).unwrap_or(u32::MAX),
            cache: placed.empty_cache(),
            placed,
            cached: Vec::new(),
        }
    }

    /// Where the draft runs: `cpu` or `cuda:0 (name)`.
    pub fn device(&self) -> String {
        self.placed.device.name()
    }

    /// Runs `tokens` through the draft, extending its cache, and picks the
    /// greedy token after the last of them (`None` if there is none). A
    /// GPU picks on the device, so only the id crosses to the host; the
    /// rule is `tensorfold_sampling`'s on every device (the largest logit,
    /// the lowest id among equals), so a drafter is deterministic.
    fn extend(&mut self, tokens: &[u32]) -> Result<Option<u32>, ForwardError> {
        let forward = self.placed.forward();
        let greedy = [Some(Draw::greedy())];
        // Chunks bound the draft's workspace (the budget counts one chunk);
        // rows do not depend on the chunking.
        let chunks = tokens.chunks(PREFILL_CHUNK);
        let last = chunks.len().saturating_sub(1);
        let mut picked = None;
        for (i, chunk) in chunks.enumerate() {
            let logits = if i == last {
                Logits::Last
            } else {
                Logits::None
            };
            let mut seq = [Seq {
                tokens: chunk,
                cache: &mut self.cache,
                logits,
            }];
            let rows = forward.forward_picked(&mut seq, &greedy)?;
            self.cached.extend_from_slice(chunk);
            picked = match rows.into_iter().next() {
                Some(SeqRows::Picks(ids)) => ids.last().copied(),
                Some(SeqRows::Logits(row)) if !row.is_empty() => Some(argmax(&row)),
                _ => None,
            };
        }
        Ok(picked)
    }
}

impl Drafter for DraftModel {
    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32> {
        let window = self.placed.model.config.max_positions;
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
        let mut drafts = Vec::with_capacity(max);
        let mut next = self.extend(&context[keep..]);
        loop {
            match next {
                Ok(Some(t)) if t < self.vocab => drafts.push(t),
                Ok(_) => break,
                Err(e) => {
                    // Drafts are only proposals: a failed draft forward
                    // proposes what it has and starts the cache afresh
                    // (the target's own forward reports a lost device).
                    tracing::warn!("draft model: {e}");
                    self.cache.truncate(0);
                    self.cached.clear();
                    break;
                }
            }
            if drafts.len() == max {
                break;
            }
            next = self.extend(&drafts[drafts.len() - 1..]);
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
        // A file per call: tests run in parallel in one process.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "tensorfold-draft-{}-{call}.gguf",
            std::process::id()
        ));
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

    /// Greedy decoding of the whole context in one forward, then a token
    /// at a time: what a drafter must propose.
    fn serial_greedy(model: &Model, context: &[u32], n: usize) -> Vec<u32> {
        let mut cache = tensorfold_kv::KvCache::new(model.config.kv_shape());
        let mut logits = model.forward(context, &mut cache, Logits::Last);
        let mut out = Vec::new();
        for _ in 0..n {
            let t = argmax(&logits);
            out.push(t);
            logits = model.forward(&[t], &mut cache, Logits::All);
        }
        out
    }

    /// A context longer than a prefill chunk runs in chunks, rolled back
    /// and extended: each proposal is the serial greedy one.
    #[test]
    fn proposals_are_serial_greedy_across_chunks_and_rollback() {
        let model = tiny_model();
        let vocab = model.config.vocab_size;
        let long: Vec<u32> = (0..PREFILL_CHUNK + 40)
            .map(|i| (i * 13 % vocab) as u32)
            .collect();
        let mut draft = DraftModel::new(model.clone(), vocab);
        assert_eq!(draft.device(), "cpu");
        assert_eq!(draft.propose(&long, 5), serial_greedy(&model, &long, 5));
        // A context that leaves the cached one part way is rolled back to
        // the shared prefix.
        let mut other = long[..PREFILL_CHUNK + 10].to_vec();
        other.extend([3, 1, 4]);
        assert_eq!(draft.propose(&other, 5), serial_greedy(&model, &other, 5));
        let short = &long[..7];
        assert_eq!(draft.propose(short, 3), serial_greedy(&model, short, 3));
    }
}
