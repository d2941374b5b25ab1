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

/// Uniform in (0, 1) keyed by (seed, position, token): 52 bits, so that
/// `k + 0.5` is exact and the value never rounds to 1.
fn uniform(seed: u64, position: usize, token: u32) -> f64 {
    let h = mix(mix(mix(seed) ^ position as u64) ^ token as u64);
    ((h >> 12) as f64 + 0.5) / (1u64 << 52) as f64
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
        let kept = self.candidates(logits);
        let max = kept.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max);
        let log_z = kept.iter().map(|(_, l)| (l - max).exp()).sum::<f64>().ln();
        // Gumbel-max over the kept candidates, the most likely first: one
        // whose log-probability plus the largest noise any key can give
        // stays below the best score so far can neither win nor tie, so
        // its noise is never drawn. The pick is the same as scoring all.
        let top = kept.iter().position(|c| c.1 == max).unwrap_or(0);
        let order = std::iter::once(top).chain((0..kept.len()).filter(|&i| i != top));
        let mut best = (f64::NEG_INFINITY, u32::MAX);
        for i in order {
            let (id, l) = kept[i];
            let logp = l - max - log_z;
            if logp + GUMBEL_BOUND < best.0 {
                continue;
            }
            let score = logp - (-uniform(self.seed, position, id).ln()).ln();
            if score > best.0 || (score == best.0 && id < best.1) {
                best = (score, id);
            }
        }
        best.1
    }

    /// The kept candidates and their temperature-scaled logits. The set is
    /// a function of the row alone; candidates come in token order unless
    /// top-p needs them by logit (ties by token id).
    fn candidates(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let t = self.params.temperature as f64;
        let by_logit = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let mut c: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l as f64 / t))
            .collect();
        if let Some(k) = self.params.top_k.filter(|&k| k < c.len()) {
            c.select_nth_unstable_by(k.max(1) - 1, by_logit);
            c.truncate(k.max(1));
            c.sort_unstable_by_key(|x| x.0);
        }
        let max = c.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        // min-p keeps p >= min_p * p_max, i.e. exp(l - max) >= min_p.
        let min_p = self.params.min_p as f64;
        c.retain(|x| (x.1 - max).exp() >= min_p);
        let top_p = self.params.top_p as f64;
        if top_p >= 1.0 {
            return c;
        }
        // The nucleus: the fewest most likely candidates whose mass reaches
        // top_p. Only candidates above a cutoff are sorted; each cutoff's
        // sorted set is a prefix of the fully sorted one, so the walk is
        // the same as over everything.
        let z: f64 = c.iter().map(|(_, l)| (l - max).exp()).sum();
        let mut cutoff = 1e-4;
        loop {
            let mut head: Vec<(u32, f64)> = c
                .iter()
                .copied()
                .filter(|x| (x.1 - max).exp() >= cutoff)
                .collect();
            head.sort_unstable_by(by_logit);
            let mut cum = 0.0;
            for (n, (_, l)) in head.iter().enumerate() {
                cum += (l - max).exp() / z;
                if cum >= top_p {
                    head.truncate(n + 1);
                    return head;
                }
            }
            if cutoff == 0.0 || head.len() == c.len() {
                return head;
            }
            cutoff = if cutoff > 1e-12 { cutoff * 1e-4 } else { 0.0 };
        }
    }
}

/// More than any Gumbel noise `-ln(-ln u)` a key can give: `uniform` is at
/// most `1 - 2^-53`, whose noise is about 36.7.
const GUMBEL_BOUND: f64 = 38.5;

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
    fn the_largest_noise_stays_under_the_bound() {
        let u_max = (((1u64 << 52) - 1) as f64 + 0.5) / (1u64 << 52) as f64;
        assert!(u_max < 1.0);
        let g = -(-u_max.ln()).ln();
        assert!(g < GUMBEL_BOUND - 1.0, "{g}");
    }

    #[test]
    fn draws_follow_the_distribution() {
        // p = softmax([0, ln 3]) = (0.25, 0.75)
        let logits = [0.0, 3f32.ln()];
        let s = sampled(1.0, None, 1.0, 0.0);
        let ones = (0..4000).filter(|&p| s.pick(p, &logits) == 1).count();
        assert!((2800..3200).contains(&ones), "{ones}");
    }

    /// The candidate set by the book: sort everything, cut top-k, min-p,
    /// then walk the nucleus.
    fn nucleus_by_full_sort(s: &Sampler, logits: &[f32]) -> Vec<u32> {
        let p = s.params();
        let t = p.temperature as f64;
        let mut c: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l as f64 / t))
            .collect();
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        c.truncate(p.top_k.unwrap_or(usize::MAX));
        let max = c[0].1;
        c.retain(|x| (x.1 - max).exp() >= p.min_p as f64);
        let mut by_id = c.clone();
        by_id.sort_by_key(|x| x.0);
        let z: f64 = by_id.iter().map(|(_, l)| (l - max).exp()).sum();
        let mut cum = 0.0;
        let mut kept: Vec<u32> = Vec::new();
        for (id, l) in c {
            kept.push(id);
            cum += (l - max).exp() / z;
            if cum >= p.top_p as f64 {
                break;
            }
        }
        kept.sort_unstable();
        kept
    }

    proptest! {
        #[test]
        fn the_nucleus_is_the_fully_sorted_one(
            logits in proptest::collection::vec(-30f32..30.0, 2..3000),
            t in 0.1f32..2.0,
            top_k in proptest::option::of(1usize..500),
            top_p in 0.01f32..1.0,
            min_p in 0f32..0.2,
        ) {
            let s = sampled(t, top_k, top_p, min_p);
            let mut got: Vec<u32> = s.candidates(&logits).iter().map(|c| c.0).collect();
            got.sort_unstable();
            prop_assert_eq!(got, nucleus_by_full_sort(&s, &logits));
        }

        #[test]
        fn skipping_hopeless_candidates_never_changes_the_pick(
            logits in proptest::collection::vec(-60f32..60.0, 2..2000),
            pos in 0usize..10_000,
            t in 0.1f32..2.0,
        ) {
            let s = sampled(t, None, 1.0, 0.0);
            let kept = s.candidates(&logits);
            let max = kept.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max);
            let log_z = kept.iter().map(|(_, l)| (l - max).exp()).sum::<f64>().ln();
            let mut best = (f64::NEG_INFINITY, u32::MAX);
            for &(id, l) in &kept {
                let score = l - max - log_z - (-uniform(s.seed, pos, id).ln()).ln();
                if score > best.0 || (score == best.0 && id < best.1) {
                    best = (score, id);
                }
            }
            prop_assert_eq!(s.pick(pos, &logits), best.1);
        }

    }

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
