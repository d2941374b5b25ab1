//! The arithmetic of attention over one key block, written once over
//! [`Lanes`]: scores with many keys per vector (keys are stored dimension
//! after dimension), the block's softmax step, and the weighted values with
//! many dimensions per vector.
//!
//! Every query keeps its own sums in its own order: a score is
//! `Σ_d q[d]·k[d]` folded over `d` in order, a value sum `Σ_j w_j·v_j` over
//! the block's slots in order. Several queries go together only so that one
//! loaded key or value serves them all; how many go together, and how many
//! vectors one pass holds, changes no query's bits.

use super::lanes::{exp, lane_max, lane_sum, Lanes, LANES};
use half::f16;
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

/// `out[n][s] = scale · Σ_d queries[n][d] · keys[d·BLOCK + s]` for every
/// slot `s` of the block, `KV` key vectors a pass.
#[inline(always)]
pub(crate) fn scores<L: Lanes, const N: usize, const KV: usize>(
    lanes: L,
    queries: [&[f32]; N],
    keys: &[f16],
    scale: f32,
    out: &mut [[f32; BLOCK]; N],
) {
    let hd = queries[0].len();
    assert!(keys.len() >= hd * BLOCK && queries.iter().all(|q| q.len() == hd));
    const { assert!(KEY_VECTORS.is_multiple_of(KV)) };
    for first in (0..KEY_VECTORS).step_by(KV) {
        let mut acc = [[lanes.zero(); KV]; N];
        for d in 0..hd {
            let row = keys[d * BLOCK + first * LANES..].as_ptr();
            // SAFETY: `d < hd` and `first + v < KEY_VECTORS`, so each load
            // of LANES halves lies within `keys` (asserted above).
            let mut k = [lanes.zero(); KV];
            for (v, k) in k.iter_mut().enumerate() {
                *k = unsafe { lanes.load_half(row.add(v * LANES)) };
            }
            for n in 0..N {
                let q = lanes.splat(queries[n][d]);
                for v in 0..KV {
                    acc[n][v] = lanes.mul_add(q, k[v], acc[n][v]);
                }
            }
        }
        let scale = lanes.splat(scale);
        for n in 0..N {
            for v in 0..KV {
                // SAFETY: `(first + v + 1) * LANES <= BLOCK`, the row's length.
                unsafe {
                    lanes.store(
                        out[n][(first + v) * LANES..].as_mut_ptr(),
                        lanes.mul(acc[n][v], scale),
                    )
                }
            }
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

/// `acc[n] += Σ_{j in slots} weights[n][j] · value j`, `j` in order, `DV`
/// vectors of the value row a pass. `values` holds the block's rows
/// `stride` apart; each `acc[n]` is `stride` long.
#[inline(always)]
pub(crate) fn accumulate<L: Lanes, const N: usize, const DV: usize>(
    lanes: L,
    weights: [&[f32; BLOCK]; N],
    values: &[f16],
    stride: usize,
    slots: Range<usize>,
    acc: [&mut [f32]; N],
) {
    assert!(stride.is_multiple_of(LANES) && values.len() >= BLOCK * stride && slots.end <= BLOCK);
    assert!(acc.iter().all(|a| a.len() == stride));
    const { assert!(DV >= 1 && DV <= 4) };
    let vectors = stride / LANES;
    let mut acc = acc;
    let mut first = 0;
    while first < vectors {
        let take = (vectors - first).min(DV);
        match take {
            1 => {
                accumulate_pass::<L, N, 1>(lanes, weights, values, stride, &slots, &mut acc, first)
            }
            2 => {
                accumulate_pass::<L, N, 2>(lanes, weights, values, stride, &slots, &mut acc, first)
            }
            3 => {
                accumulate_pass::<L, N, 3>(lanes, weights, values, stride, &slots, &mut acc, first)
            }
            _ => {
                accumulate_pass::<L, N, 4>(lanes, weights, values, stride, &slots, &mut acc, first)
            }
        }
        first += take;
    }
}

/// [`accumulate`] for the `D` vectors of the value row from vector `first`.
#[inline(always)]
fn accumulate_pass<L: Lanes, const N: usize, const D: usize>(
    lanes: L,
    weights: [&[f32; BLOCK]; N],
    values: &[f16],
    stride: usize,
    slots: &Range<usize>,
    acc: &mut [&mut [f32]; N],
    first: usize,
) {
    // SAFETY (loads and stores below): `(first + D) · LANES <= stride`, the
    // length of every `acc[n]` and of every value row; the rows read are
    // slots below BLOCK (asserted by the caller).
    let mut sums = [[lanes.zero(); D]; N];
    for n in 0..N {
        for v in 0..D {
            sums[n][v] = unsafe { lanes.load(acc[n][(first + v) * LANES..].as_ptr()) };
        }
    }
    for j in slots.clone() {
        let row = values[j * stride + first * LANES..].as_ptr();
        // SAFETY: see above.
        let mut value = [lanes.zero(); D];
        for (v, value) in value.iter_mut().enumerate() {
            *value = unsafe { lanes.load_half(row.add(v * LANES)) };
        }
        for n in 0..N {
            let w = lanes.splat(weights[n][j]);
            for v in 0..D {
                sums[n][v] = lanes.mul_add(w, value[v], sums[n][v]);
            }
        }
    }
    for n in 0..N {
        for v in 0..D {
            // SAFETY: see above.
            unsafe { lanes.store(acc[n][(first + v) * LANES..].as_mut_ptr(), sums[n][v]) };
        }
    }
}
