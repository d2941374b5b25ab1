//! The float steps of attention over one key block, each a function of one
//! query's own numbers: its scores from their integer sums, the block's
//! softmax step (written once over [`Lanes`]), and its weighted values
//! folded into its running sums.

use super::lanes::{exp, lane_max, lane_sum, Lanes, LANES};
use std::ops::Range;
use tensorfold_kv::BLOCK;

/// Vectors of keys one block holds.
const KEY_VECTORS: usize = BLOCK / LANES;

/// One query's running softmax.
pub(crate) struct Running {
    pub max: f32,
    pub sum: f32,
    /// Weighted values, a whole stored value row wide.
    pub acc: Vec<f32>,
}

impl Running {
    pub fn new(value_stride: usize) -> Running {
        Running {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            acc: vec![0.0; value_stride],
        }
    }
}

/// One block's softmax step for one query whose keys in the block are
/// `valid`: `scores` become weights (`exp(score - max)`, 0 outside
/// `valid`), and the running maximum, sum and values follow.
#[inline(always)]
pub(crate) fn soften<L: Lanes>(
    lanes: L,
    scores: &mut [f32; BLOCK],
    valid: Range<usize>,
    softcap: Option<f32>,
    state: &mut Running,
) {
    scores[..valid.start].fill(f32::NEG_INFINITY);
    scores[valid.end..].fill(f32::NEG_INFINITY);
    if let Some(cap) = softcap {
        for s in &mut scores[valid.clone()] {
            *s = cap * (*s / cap).tanh();
        }
    }
    let mut maxima = load_vector(lanes, scores, 0);
    for v in 1..KEY_VECTORS {
        maxima = lanes.max(maxima, load_vector(lanes, scores, v));
    }
    let mut lane_values = [0f32; LANES];
    // SAFETY: `lane_values` holds LANES floats.
    unsafe { lanes.store(lane_values.as_mut_ptr(), maxima) };
    let block_max = lane_max(lane_values);
    let max = state.max.max(block_max);
    // Rescale what earlier blocks summed to the new maximum (an unchanged
    // maximum would multiply by exactly 1, which changes nothing).
    if max != state.max {
        let rescale = exp(state.max - max);
        if rescale != 1.0 {
            state.sum *= rescale;
            state.acc.iter_mut().for_each(|a| *a *= rescale);
        }
    }
    let shift = lanes.splat(max);
    let mut sums = lanes.zero();
    for v in 0..KEY_VECTORS {
        let weights = lanes.exp(lanes.sub(load_vector(lanes, scores, v), shift));
        // SAFETY: `v < KEY_VECTORS`, so the vector lies within `scores`.
        unsafe { lanes.store(scores[v * LANES..].as_mut_ptr(), weights) };
        sums = lanes.add(sums, weights);
    }
    // SAFETY: `lane_values` holds LANES floats.
    unsafe { lanes.store(lane_values.as_mut_ptr(), sums) };
    state.sum += lane_sum(lane_values);
    state.max = max;
}

/// Vector `v` of a block's scores. (A function, not a closure: a closure
/// is compiled without the caller's instruction set, so the vector
/// operations inside it would not inline.)
#[inline(always)]
fn load_vector<L: Lanes>(lanes: L, scores: &[f32; BLOCK], v: usize) -> L::V {
    assert!(v < KEY_VECTORS);
    // SAFETY: `(v + 1) · LANES <= BLOCK`, the length of `scores`.
    unsafe { lanes.load(scores[v * LANES..].as_ptr()) }
}

/// A query's scores from their integer sums: `(sum · key scale) · factor`.
#[inline(always)]
pub(crate) fn float_scores(
    sums: &[i32; BLOCK],
    key_scales: &[f32; BLOCK],
    factor: f32,
    out: &mut [f32; BLOCK],
) {
    for s in 0..BLOCK {
        out[s] = (sums[s] as f32 * key_scales[s]) * factor;
    }
}

/// `acc[d] = sums[d] · scale + acc[d]`, rounded once.
#[inline(always)]
pub(crate) fn add_values(sums: &[i32], scale: f32, acc: &mut [f32]) {
    for (a, s) in acc.iter_mut().zip(sums) {
        *a = (*s as f32).mul_add(scale, *a);
    }
}
