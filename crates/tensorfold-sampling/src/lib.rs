//! The sampling rule, one definition for every device: given a row of
//! logits and a key (seed, absolute position), the picked token. The CPU
//! computes it here; `kernels/cuda/sampling.cu` computes the same bits on
//! the GPU, so a row picked on either side gives the same token.
//!
//! The rule, for a row `x` of `V` logits (NaN counts as `-inf`):
//! - Every token has a key: its logit's total order, then the lower id
//!   first. The greedy pick is the token of the largest key.
//! - Greedy (`temperature <= 0` or `top_k == 1`), or a largest logit that
//!   is not finite: the greedy pick.
//! - Otherwise `s_i = x_i / T` and `w_i = exp(s_i - s_top)` in f64 (the
//!   `exp` of [`float`]). Kept: the `top_k` largest keys, and of those the
//!   ones with `w_i >= min_p`.
//! - With `top_p < 1`, the nucleus: kept token `i` stays when the mass of
//!   the kept tokens of larger key, summed in the fixed order of [`lanes`],
//!   is below `top_p * z`, `z` the kept tokens' mass in that order.
//! - The pick: the largest `s_i + g_i` over the nucleus, ties by lower id,
//!   `g_i = -ln(-ln u)` with `u` hashed from (seed, position, token id).
//!
//! Nothing advances between picks, so a drafted run draws what serial
//! decode draws, and no sum's order depends on how many threads ran it.

pub mod float;
pub mod lanes;

/// How one row is picked. `temperature <= 0` or `top_k == Some(1)` is greedy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
}

impl Draw {
    pub fn greedy() -> Draw {
        Draw {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0 || self.top_k == Some(1)
    }
}

/// A sequence's requested logits rows as a forward hands them back: the
/// rows themselves, or, where the device picked them by this rule, only
/// the picked tokens (one per row, in row order).
#[derive(Debug, Clone, PartialEq)]
pub enum SeqRows {
    Logits(Vec<f32>),
    Picks(Vec<u32>),
}

/// splitmix64's finaliser: a well-mixed 64-bit hash step.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in (0, 1) keyed by (seed, position, token): 52 bits, so that
/// `k + 0.5` is exact and the value never rounds to 1.
pub fn uniform(seed: u64, position: u64, token: u32) -> f64 {
    let h = mix(mix(mix(seed) ^ position) ^ token as u64);
    ((h >> 12) as f64 + 0.5) * f64::from_bits(0x3cb0000000000000)
}

/// The Gumbel noise `-ln(-ln u)` of a key.
pub fn gumbel(seed: u64, position: u64, token: u32) -> f64 {
    -float::ln(-float::ln(uniform(seed, position, token)))
}

/// More than any noise [`gumbel`] can give: `u` is at most `1 - 2^-53`,
/// whose noise is about 36.7.
pub const GUMBEL_BOUND: f64 = 38.5;

fn clean(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

/// The token's place in the rule's order: larger logit first, then lower id.
pub fn key(logit: f32, id: u32) -> u64 {
    let b = clean(logit).to_bits();
    let order = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    ((order as u64) << 32) | (u32::MAX - id) as u64
}

/// The greedy pick: the largest logit, the lowest id among equals (NaN
/// counts as `-inf`).
pub fn argmax(row: &[f32]) -> u32 {
    let best = (0..row.len())
        .map(|i| key(row[i], i as u32))
        .max()
        .unwrap_or(u64::MAX);
    u32::MAX - best as u32
}

/// A kept token.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    key: u64,
    id: u32,
    weight: f64,
}

/// The rule's pick for `row` at absolute `position`.
pub fn pick(draw: &Draw, position: u64, row: &[f32]) -> u32 {
    let top = argmax(row);
    if draw.is_greedy() || !clean(row[top as usize]).is_finite() {
        return top;
    }
    let t = draw.temperature as f64;
    let scaled = |i: u32| clean(row[i as usize]) as f64 / t;
    let peak = scaled(top);
    let floor = match draw.top_k {
        Some(k) if k < row.len() => kth_largest_key(row, k),
        _ => 0,
    };
    let min_p = draw.min_p as f64;
    let kept: Vec<Candidate> = (0..row.len() as u32)
        .filter_map(|id| {
            let key = key(row[id as usize], id);
            let weight = float::exp(scaled(id) - peak);
            (key >= floor && weight >= min_p).then_some(Candidate { key, id, weight })
        })
        .collect();
    let nucleus = if draw.top_p < 1.0 {
        nucleus(kept, row.len(), draw.top_p as f64)
    } else {
        kept
    };
    // Gumbel-max, the most likely first: a token whose logit plus the
    // largest noise stays below the best score can neither win nor tie
    // (rounding is monotone), so its noise is never drawn.
    let first = nucleus.iter().position(|c| c.id == top).unwrap_or(0);
    let order = std::iter::once(first).chain((0..nucleus.len()).filter(|&i| i != first));
    let mut best = (f64::NEG_INFINITY, u32::MAX);
    for i in order {
        let id = nucleus[i].id;
        let s = scaled(id);
        if s + GUMBEL_BOUND < best.0 {
            continue;
        }
        let score = s + gumbel(draw.seed, position, id);
        if score > best.0 || (score == best.0 && id < best.1) {
            best = (score, id);
        }
    }
    best.1
}

/// The k-th largest key of the row (`1 <= k < len`).
fn kth_largest_key(row: &[f32], k: usize) -> u64 {
    let mut keys: Vec<u64> = (0..row.len()).map(|i| key(row[i], i as u32)).collect();
    let (_, kth, _) = keys.select_nth_unstable_by(k.max(1) - 1, |a, b| b.cmp(a));
    *kth
}

/// The kept tokens (largest key first) whose larger-keyed mass is below
/// `top_p * z`. The mass grows down the key order, so the nucleus is a
/// prefix of it: only a head of the largest keys is sorted, grown until
/// the walk ends inside it.
fn nucleus(mut kept: Vec<Candidate>, vocab: usize, top_p: f64) -> Vec<Candidate> {
    let z = lanes::sum(kept.iter().map(|c| (c.id, c.weight)));
    let target = top_p * z;
    let mut head = 256;
    loop {
        let n = head.min(kept.len());
        if n < kept.len() {
            kept.select_nth_unstable_by(n - 1, |a, b| b.key.cmp(&a.key));
        }
        let mut sorted = kept[..n].to_vec();
        sorted.sort_unstable_by_key(|c| std::cmp::Reverse(c.key));
        let mut mass = lanes::GrowingSum::new(vocab);
        for (i, c) in sorted.iter().enumerate() {
            if mass.total() >= target {
                sorted.truncate(i);
                return sorted;
            }
            mass.add(c.id, c.weight);
        }
        if n == kept.len() {
            return sorted;
        }
        head *= 16;
    }
}

#[cfg(test)]
mod tests;
