//! The fold against a straightforward softmax, and its bits against every
//! way the same rows can be split.

use super::lanes::Isa;
use super::*;
use crate::config::{Arch, RopeStyle};
use tensorfold_kv::KvShape;

fn config(heads: usize, kv_heads: usize, head_dim: usize) -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        vocab_size: 1,
        hidden_size: heads * head_dim,
        intermediate_size: 1,
        layers: 1,
        heads,
        kv_heads,
        head_dim,
        rms_eps: 1e-6,
        rope_theta: 10000.0,
        rope_style: RopeStyle::Half,
        max_positions: 1 << 16,
        tied_embeddings: true,
        qkv_bias: false,
        qk_norm: false,
        plan: Default::default(),
    }
}

/// Deterministic values in about [-2, 2), scaled.
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0) * scale
        })
        .collect()
}

/// Queries, keys and values of `positions` positions.
struct Case {
    config: ModelConfig,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Case {
    fn new(config: ModelConfig, positions: usize, seed: u64) -> Case {
        let (qw, kvw) = (config.q_width(), config.kv_width());
        Case {
            q: values(positions * qw, seed, 1.5),
            k: values(positions * kvw, seed + 1, 1.5),
            v: values(positions * kvw, seed + 2, 1.0),
            config,
        }
    }

    fn positions(&self) -> usize {
        self.q.len() / self.config.q_width()
    }

    /// Runs the positions in chunks of `sizes` (cycled), appending each
    /// chunk's keys before its attention, as the forward does.
    fn run(&self, isa: Isa, sizes: &[usize]) -> Vec<f32> {
        let (qw, kvw) = (self.config.q_width(), self.config.kv_width());
        let mut cache = KvCache::new(KvShape {
            layers: 1,
            kv_heads: self.config.kv_heads,
            head_dim: self.config.head_dim,
        });
        let mut out = vec![f32::NAN; self.q.len()];
        let (mut start, mut i) = (0, 0);
        while start < self.positions() {
            let n = sizes[i % sizes.len()].min(self.positions() - start);
            let rows = start..start + n;
            cache.append(
                0,
                &self.k[rows.start * kvw..rows.end * kvw],
                &self.v[rows.start * kvw..rows.end * kvw],
            );
            attention_with(
                isa,
                &self.config,
                &cache,
                0,
                start,
                &self.q[rows.start * qw..rows.end * qw],
                &mut out[rows.start * qw..rows.end * qw],
            );
            start += n;
            i += 1;
        }
        out
    }

    /// Softmax attention in f64 over the f16-rounded keys and values.
    fn reference(&self) -> Vec<f64> {
        let c = &self.config;
        let (hd, qw, kvw, group) = (c.head_dim, c.q_width(), c.kv_width(), c.heads / c.kv_heads);
        let round = |x: f32| half::f16::from_f32(x).to_f64();
        let scale_dim = c.plan.query_scale_dim.unwrap_or(hd) as f64;
        let window = c.plan.sliding_window.map_or(usize::MAX, |w| w.size);
        let mut out = Vec::new();
        for p in 0..self.positions() {
            let first = (p + 1).saturating_sub(window);
            for head in 0..c.heads {
                let q = &self.q[p * qw + head * hd..][..hd];
                let at = |j: usize| j * kvw + head / group * hd;
                let scores: Vec<f64> = (first..=p)
                    .map(|j| {
                        let k = &self.k[at(j)..][..hd];
                        let s = q
                            .iter()
                            .zip(k)
                            .map(|(a, b)| *a as f64 * round(*b))
                            .sum::<f64>()
                            / scale_dim.sqrt();
                        c.plan
                            .attn_softcap
                            .map_or(s, |cap| cap as f64 * (s / cap as f64).tanh())
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for d in 0..hd {
                    let v: f64 = (first..=p)
                        .map(|j| weights[j - first] * round(self.v[at(j) + d]))
                        .sum();
                    out.push(v / sum);
                }
            }
        }
        out
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Shapes: grouped-query heads of SmolLM2 and Qwen2.5 sizes, plain
/// multi-head, and odd head dimensions below and above one SIMD width.
fn shapes() -> Vec<ModelConfig> {
    vec![
        config(3, 1, 64),
        config(7, 1, 64),
        config(2, 2, 16),
        config(6, 2, 5),
        config(4, 2, 67),
        config(9, 3, 24),
    ]
}

#[test]
fn the_fold_matches_a_plain_softmax() {
    for config in shapes() {
        let case = Case::new(config, 2 * BLOCK + 9, 7);
        let expected = case.reference();
        for isa in Isa::available() {
            let got = case.run(isa, &[case.positions()]);
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert!(
                    (*g as f64 - e).abs() < 2e-5 * (1.0 + e.abs()),
                    "{isa:?} head_dim {}: element {i} is {g}, not {e}",
                    case.config.head_dim
                );
            }
        }
    }
}

#[test]
fn chunked_prefill_one_shot_and_decode_give_the_same_bits() {
    for config in shapes() {
        let case = Case::new(config, 3 * BLOCK + 5, 11);
        for isa in Isa::available() {
            let one_shot = bits(&case.run(isa, &[case.positions()]));
            for sizes in [
                &[1][..],
                &[BLOCK],
                &[BLOCK - 1, 2],
                &[TILE + 1],
                &[5, 60, 1, 17],
                &[BLOCK + 1, 1, 1],
            ] {
                assert_eq!(
                    bits(&case.run(isa, sizes)),
                    one_shot,
                    "{isa:?}, head_dim {}, chunks {sizes:?}",
                    case.config.head_dim
                );
            }
        }
    }
}

#[test]
fn every_instruction_set_gives_the_same_bits() {
    for config in shapes() {
        let case = Case::new(config, 2 * BLOCK + 3, 5);
        let runs: Vec<_> = Isa::available()
            .into_iter()
            .map(|isa| (isa, bits(&case.run(isa, &[37]))))
            .collect();
        for (isa, run) in &runs[1..] {
            assert_eq!(run, &runs[0].1, "{isa:?} against the portable path");
        }
    }
}

#[test]
fn large_scores_fold_without_overflow() {
    // Scores far apart in one block and across blocks: the running maximum
    // rescales what earlier blocks summed.
    let config = config(2, 1, 8);
    let mut case = Case::new(config, BLOCK + 10, 3);
    case.q.iter_mut().for_each(|x| *x *= 40.0);
    let expected = case.reference();
    let got = case.run(Isa::detect(), &[3]);
    for (g, e) in got.iter().zip(&expected) {
        assert!(g.is_finite() && (*g as f64 - e).abs() < 1e-4 * (1.0 + e.abs()));
    }
}

#[test]
fn windows_caps_and_query_scales_match_a_plain_softmax_and_keep_the_bits() {
    for size in [1, 7, BLOCK, BLOCK + 3] {
        let mut config = config(4, 2, 16);
        config.plan.sliding_window = Some(crate::plan::SlidingWindow {
            size,
            global_every: None,
        });
        config.plan.attn_softcap = Some(5.0);
        config.plan.query_scale_dim = Some(24);
        let case = Case::new(config, 2 * BLOCK + 11, 13);
        let expected = case.reference();
        for isa in Isa::available() {
            let one_shot = case.run(isa, &[case.positions()]);
            for (i, (g, e)) in one_shot.iter().zip(&expected).enumerate() {
                assert!(
                    (*g as f64 - e).abs() < 2e-5 * (1.0 + e.abs()),
                    "{isa:?} window {size}: element {i} is {g}, not {e}"
                );
            }
            for sizes in [&[1][..], &[5, 60, 1, 17]] {
                assert_eq!(bits(&case.run(isa, sizes)), bits(&one_shot), "{sizes:?}");
            }
        }
    }
}
