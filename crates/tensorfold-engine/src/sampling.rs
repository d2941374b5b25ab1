//! A request's sampler: its parameters and resolved seed, drawing by the
//! rule of `tensorfold-sampling`, which the GPU computes too. The token
//! drawn at a position is a pure function of (seed, absolute position,
//! token ids, that row's logits): no state advances between draws, so a
//! drafted run, which evaluates a position's logits in a different call,
//! draws exactly what serial decode draws there, and a row picked on the
//! device gives what the host would pick from it.

use serde::{Deserialize, Serialize};
pub use tensorfold_sampling::argmax;
use tensorfold_sampling::{mix, Draw};

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
        self.temperature.is_nan() || self.temperature <= 0.0 || self.top_k == Some(1)
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

/// The seed used when a request gives none: a hash of its prompt tokens.
pub fn prompt_seed(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0x5446_466F_6C64_u64, |h, &t| {
        mix(h ^ (t as u64).wrapping_add(0x9E37_79B9_7F4A_7C15))
    })
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

    /// The rule's parameters for this request: what a device sampler takes.
    pub fn draw(&self) -> Draw {
        Draw {
            temperature: self.params.temperature,
            top_k: self.params.top_k,
            top_p: self.params.top_p,
            min_p: self.params.min_p,
            seed: self.seed,
        }
    }

    /// The token at absolute `position` given that row's `logits`.
    pub fn pick(&self, position: usize, logits: &[f32]) -> u32 {
        tensorfold_sampling::pick(&self.draw(), position as u64, logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A draw is a function of (seed, position, row): the same key gives
    /// the same draw whatever was drawn before or in which order, and a
    /// different seed or position draws otherwise.
    #[test]
    fn a_draw_depends_only_on_its_key_and_row() {
        let logits: Vec<f32> = (0..32).map(|i| (i * 37 % 11) as f32 * 0.3).collect();
        let other_row: Vec<f32> = logits.iter().rev().copied().collect();
        let keyed = |seed: u64| {
            let params = SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                ..SamplingParams::default()
            };
            Sampler::new(params, &[])
        };
        let s = keyed(7);
        let forward: Vec<u32> = (0..500).map(|p| s.pick(p, &logits)).collect();
        let again = keyed(7);
        let mut backward = vec![0; 500];
        for p in (0..500).rev() {
            again.pick(p + 1000, &other_row);
            backward[p] = again.pick(p, &logits);
        }
        assert_eq!(forward, backward);
        let distinct: std::collections::HashSet<_> = forward.iter().collect();
        assert!(
            distinct.len() > 5,
            "positions must draw differently: {distinct:?}"
        );
        let reseeded = keyed(8);
        let differ = (0..500)
            .filter(|&p| reseeded.pick(p, &logits) != forward[p])
            .count();
        assert!(
            differ > 100,
            "another seed changed only {differ} of 500 draws"
        );
        // Without a seed the prompt is the key.
        let unseeded = |prompt: &[u32]| {
            let params = SamplingParams {
                temperature: 1.0,
                ..SamplingParams::default()
            };
            Sampler::new(params, prompt)
        };
        let (a, b) = (unseeded(&[1, 2, 3]), unseeded(&[1, 2, 4]));
        let differ = (0..500)
            .filter(|&p| a.pick(p, &logits) != b.pick(p, &logits))
            .count();
        assert!(
            differ > 100,
            "another prompt changed only {differ} of 500 draws"
        );
    }
}
