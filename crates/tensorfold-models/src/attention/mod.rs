//! Causal attention on the CPU over the block cache of `tensorfold_kv`.
//!
//! Invariant: the query of a position `p` folds the keys `0..=p` block by
//! block ([`BLOCK`] positions counted from position 0, the last block cut
//! at `p`), in position order, into a running softmax of its own (maximum,
//! sum, weighted values). Its bits are a function of its query and those
//! keys alone: not of the chunk it came in, the other rows of the call, the
//! tile or thread that ran it, nor the instruction set.
//!
//! Work is split into tasks of one key/value head and [`TILE`] query rows:
//! every head of the group and every row of the tile reads a key block
//! while it is in cache, and tasks run on every core. When that makes too
//! few tasks for the cores (decoding one row), a group's heads are split
//! between tasks.

mod kernels;

use crate::config::ModelConfig;
use kernels::{exp, Isa, Kernels, Portable};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;
use tensorfold_kv::{KvBlock, KvCache, BLOCK};

/// Query rows one task takes.
const TILE: usize = 16;

/// Heads of a group whose scores one kernel call computes together.
const HEADS_AT_ONCE: usize = 4;

/// Causal attention of `q` (rows at positions `start..`, `q_width` each)
/// over `layer` of `cache`, which already holds their keys and values;
/// writes `out` (shaped as `q`).
pub(crate) fn attention(
    config: &ModelConfig,
    cache: &KvCache,
    layer: usize,
    start: usize,
    q: &[f32],
    out: &mut [f32],
) {
    attention_with(Isa::detect(), config, cache, layer, start, q, out)
}

fn attention_with(
    isa: Isa,
    config: &ModelConfig,
    cache: &KvCache,
    layer: usize,
    start: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let shape = Shape::of(config, layer);
    let rows = q.len() / shape.q_width;
    if rows == 0 {
        return;
    }
    let blocks = cache.blocks(layer);
    assert!(
        blocks.len() * BLOCK >= start + rows,
        "the cache holds the rows' keys"
    );
    let tiles = rows.div_ceil(TILE);
    let wanted = 2 * rayon::current_num_threads();
    let parts = wanted
        .div_ceil(config.kv_heads * tiles)
        .clamp(1, shape.group);
    let per_part = shape.group.div_ceil(parts);
    let mut tasks = Vec::new();
    for kv_head in 0..config.kv_heads {
        for t in 0..tiles {
            for first in (0..shape.group).step_by(per_part) {
                tasks.push(Task {
                    kv_head,
                    heads: first..(first + per_part).min(shape.group),
                    rows: t * TILE..((t + 1) * TILE).min(rows),
                });
            }
        }
    }
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|task| run_task(isa, &shape, blocks, start, q, task))
        .collect();
    let hd = shape.head_dim;
    for (task, result) in tasks.iter().zip(&results) {
        let width = task.heads.len() * hd;
        for (r, heads) in task.rows.clone().zip(result.chunks_exact(width)) {
            let at = r * shape.q_width + (task.kv_head * shape.group + task.heads.start) * hd;
            out[at..at + width].copy_from_slice(heads);
        }
    }
}

/// Query `heads` (within the group) of `kv_head`, for query `rows`.
struct Task {
    kv_head: usize,
    heads: Range<usize>,
    rows: Range<usize>,
}

/// What the fold needs of the model's shape.
struct Shape {
    head_dim: usize,
    /// Query heads per key/value head.
    group: usize,
    q_width: usize,
    scale: f32,
    /// Keys a query sees when the layer slides: its own and the ones
    /// before it, this many in all.
    window: Option<usize>,
    /// Scores become `cap * tanh(score / cap)`.
    softcap: Option<f32>,
}

impl Shape {
    fn of(c: &ModelConfig, layer: usize) -> Shape {
        let p = &c.plan;
        Shape {
            head_dim: c.head_dim,
            group: c.heads / c.kv_heads,
            q_width: c.q_width(),
            scale: 1.0 / (p.query_scale_dim.unwrap_or(c.head_dim) as f32).sqrt(),
            window: p
                .sliding_window
                .filter(|w| w.applies_to(layer))
                .map(|w| w.size),
            softcap: p.attn_softcap,
        }
    }
}

fn run_task(
    isa: Isa,
    shape: &Shape,
    blocks: &[Arc<KvBlock>],
    start: usize,
    q: &[f32],
    task: &Task,
) -> Vec<f32> {
    match isa {
        Isa::Portable => fold_task(Portable, shape, blocks, start, q, task),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only detected (or listed) where the CPU
        // runs AVX2, FMA and F16C.
        Isa::Avx2 => unsafe { fold_task_avx2(shape, blocks, start, q, task) },
    }
}

/// [`fold_task`] compiled for AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn fold_task_avx2(
    shape: &Shape,
    blocks: &[Arc<KvBlock>],
    start: usize,
    q: &[f32],
    task: &Task,
) -> Vec<f32> {
    // SAFETY: this function runs only where the CPU has these features.
    let kernels = unsafe { kernels::Avx2::new() };
    fold_task(kernels, shape, blocks, start, q, task)
}

/// One query's running softmax.
struct Running {
    max: f32,
    sum: f32,
    acc: Vec<f32>,
}

/// Attention of one task's heads: their outputs, row after row, head
/// after head.
#[inline(always)]
fn fold_task<K: Kernels>(
    kernels: K,
    shape: &Shape,
    blocks: &[Arc<KvBlock>],
    start: usize,
    q: &[f32],
    task: &Task,
) -> Vec<f32> {
    let (hd, task_heads, rows, kv_head) = (
        shape.head_dim,
        task.heads.len(),
        task.rows.clone(),
        task.kv_head,
    );
    let first_head = kv_head * shape.group + task.heads.start;
    let mut states: Vec<Running> = (0..rows.len() * task_heads)
        .map(|_| Running {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            acc: vec![0.0; hd],
        })
        .collect();
    let mut scratch = vec![0f32; HEADS_AT_ONCE * BLOCK];
    let last = start + rows.end - 1;
    for (b, block) in blocks[..=last / BLOCK].iter().enumerate() {
        let first = b * BLOCK;
        let (keys, values) = (block.keys(kv_head), block.values(kv_head));
        for r in rows.clone() {
            let pos = start + r;
            if pos < first {
                continue;
            }
            let end = (pos + 1 - first).min(BLOCK);
            // A sliding layer's query skips the keys before its window
            // (fixed by its position alone).
            let skip = shape
                .window
                .map_or(0, |w| (pos + 1).saturating_sub(w).saturating_sub(first));
            if skip >= end {
                continue;
            }
            let count = end - skip;
            let (keys, values) = (&keys[skip * hd..end * hd], &values[skip * hd..end * hd]);
            let row_states = &mut states[(r - rows.start) * task_heads..][..task_heads];
            let query = |g: usize| &q[r * shape.q_width + (first_head + g) * hd..][..hd];
            let mut g = 0;
            for heads in row_states.chunks_mut(HEADS_AT_ONCE) {
                let step = Step {
                    kernels,
                    keys,
                    values,
                    count,
                    scale: shape.scale,
                    softcap: shape.softcap,
                };
                match heads {
                    [a, b, c, d] => step.fold(
                        [query(g), query(g + 1), query(g + 2), query(g + 3)],
                        [a, b, c, d],
                        &mut scratch,
                    ),
                    [a, b, c] => step.fold(
                        [query(g), query(g + 1), query(g + 2)],
                        [a, b, c],
                        &mut scratch,
                    ),
                    [a, b] => step.fold([query(g), query(g + 1)], [a, b], &mut scratch),
                    [a] => step.fold([query(g)], [a], &mut scratch),
                    _ => unreachable!("chunks of one to four"),
                }
                g += heads.len();
            }
        }
    }
    let mut out = Vec::with_capacity(states.len() * hd);
    for s in states {
        let inverse = 1.0 / s.sum;
        out.extend(s.acc.iter().map(|a| a * inverse));
    }
    out
}

/// One key block (cut at `count` keys) folded into some queries' states.
struct Step<'a, K> {
    kernels: K,
    keys: &'a [half::f16],
    values: &'a [half::f16],
    count: usize,
    scale: f32,
    softcap: Option<f32>,
}

impl<K: Kernels> Step<'_, K> {
    #[inline(always)]
    fn fold<const N: usize>(
        &self,
        queries: [&[f32]; N],
        states: [&mut Running; N],
        scratch: &mut [f32],
    ) {
        let mut chunks = scratch.chunks_exact_mut(BLOCK);
        let mut weights: [&mut [f32]; N] = std::array::from_fn(|_| {
            &mut chunks.next().expect("scratch for four heads")[..self.count]
        });
        self.kernels.scores(
            queries,
            self.keys,
            self.scale,
            weights.each_mut().map(|w| &mut **w),
        );
        if let Some(cap) = self.softcap {
            for w in weights.iter_mut().flat_map(|w| w.iter_mut()) {
                *w = cap * (*w / cap).tanh();
            }
        }
        let mut states = states;
        for (state, weights) in states.iter_mut().zip(weights.iter_mut()) {
            let block_max = weights.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let max = state.max.max(block_max);
            // Rescale what earlier blocks summed to the new maximum
            // (multiplying by exactly 1 would change nothing).
            let rescale = exp(state.max - max);
            if rescale != 1.0 {
                state.sum *= rescale;
                state.acc.iter_mut().for_each(|a| *a *= rescale);
            }
            self.kernels.exp_shifted(weights, max);
            for w in weights.iter() {
                state.sum += *w;
            }
            state.max = max;
        }
        self.kernels.accumulate(
            weights.each_ref().map(|w| &**w),
            self.values,
            states.each_mut().map(|s| s.acc.as_mut_slice()),
        );
    }
}

#[cfg(test)]
mod tests;
