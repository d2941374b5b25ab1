//! Keyed sampling: the token drawn at a position is a pure function of
//! (seed, absolute position, candidate token ids, that row's logits).
//!
//! Filtering (temperature, top-k, top-p, min-p) orders candidates by logit
//! with ties broken by token id; the draw is a Gumbel-max over the kept
//! candidates whose noise is hashed from (seed, position, token id). No
//! state advances between draws, so a drafted run, which evaluates a
//! position's logits in a different call, draws exactly what serial decode
//! draws there.

use serde::{Deserialize, Serialize};

/// How to pick tokens. `temperature <= 0` is greedy (argmax).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: f32,
    pub min_p: f32,
    /// `None`: derived from the prompt tokens.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == Some(1)
    }

    /// Checks ranges; the message names the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.top_k == Some(0) {
            return Err("top_k must be positive".into());
        }
        Ok(())
    }
}

/// splitmix64's finaliser: a well-mixed 64-bit hash step.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed used when a request gives none: a hash of its prompt tokens.
pub fn prompt_seed(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0x5446_466F_6C64_u64, |h, &t| {
        mix(h ^ (t as u64).wrapping_add(0x9E37_79B9_7F4A_7C15))
    })
}

/// Uniform in (0, 1) keyed by (seed, position, token).
fn uniform(seed: u64, position: usize, token: u32) -> f64 {
    let h = mix(mix(mix(seed) ^ position as u64) ^ token as u64);
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// A request's sampler: its parameters and resolved seed.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
}

/// The picked token and its log-probability under the filtered distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    pub token: u32,
    pub logprob: f32,
}

impl Sampler {
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Sampler {
        let seed = params.seed.unwrap_or_else(|| prompt_seed(prompt));
        Sampler { params, seed }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The token at absolute `position` given that row's `logits`.
    pub fn pick(&self, position: usize, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let cands = self.candidates(logits);
        let mut best = (f64::NEG_INFINITY, u32::MAX);
        for &(id, logp) in &cands {
            let g = -(-uniform(self.seed, position, id).ln()).ln();
            let score = logp + g;
            if score > best.0 || (score == best.0 && id < best.1) {
                best = (score, id);
            }
        }
        best.1
    }

    /// The kept candidates with their log-probabilities, best first.
    fn candidates(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let t = self.params.temperature as f64;
        let mut c: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l as f64 / t))
            .collect();
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if let Some(k) = self.params.top_k {
            c.truncate(k.max(1));
        }
        let max = c[0].1;
        let z: f64 = c.iter().map(|(_, l)| (l - max).exp()).sum();
        let mut kept = Vec::with_capacity(c.len());
        let mut cum = 0.0;
        for &(id, l) in &c {
            let p = (l - max).exp() / z;
            if p < self.params.min_p as f64 * (1.0 / z) && !kept.is_empty() {
                break;
            }
            kept.push((id, l));
            cum += p;
            if cum >= self.params.top_p as f64 {
                break;
            }
        }
        let z: f64 = kept.iter().map(|(_, l)| (l - max).exp()).sum();
        kept.iter().map(|&(id, l)| (id, l - max - z.ln())).collect()
    }
}

/// Index of the largest logit, the lowest id among equals.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sampled(temperature: f32, top_k: Option<usize>, top_p: f32, min_p: f32) -> Sampler {
        Sampler::new(
            SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                seed: Some(7),
            },
            &[],
        )
    }

    #[test]
    fn greedy_is_argmax_with_lowest_id_on_ties() {
        let s = Sampler::new(SamplingParams::greedy(), &[]);
        assert_eq!(s.pick(0, &[0.5, 2.0, 2.0, -1.0]), 1);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = [0.1, 0.3, 3.0, 0.2];
        for pos in 0..50 {
            assert_eq!(sampled(1.0, Some(1), 1.0, 0.0).pick(pos, &logits), 2);
            assert_eq!(sampled(1.0, None, 1e-6, 0.0).pick(pos, &logits), 2);
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let logits = [5.0, 4.9, -10.0, -10.0];
        let s = sampled(1.0, None, 1.0, 0.5);
        for pos in 0..200 {
            assert!(s.pick(pos, &logits) < 2);
        }
    }

    #[test]
    fn draws_follow_the_distribution() {
        // p = softmax([0, ln 3]) = (0.25, 0.75)
        let logits = [0.0, 3f32.ln()];
        let s = sampled(1.0, None, 1.0, 0.0);
        let ones = (0..4000).filter(|&p| s.pick(p, &logits) == 1).count();
        assert!((2800..3200).contains(&ones), "{ones}");
    }

    proptest! {
        #[test]
        fn a_draw_depends_only_on_its_key_and_row(
            logits in proptest::collection::vec(-5f32..5.0, 2..40),
            pos in 0usize..10_000,
            t in 0.1f32..2.0,
        ) {
            let a = sampled(t, Some(20), 0.9, 0.05);
            let b = sampled(t, Some(20), 0.9, 0.05);
            prop_assert_eq!(a.pick(pos, &logits), b.pick(pos, &logits));
        }
    }
}
