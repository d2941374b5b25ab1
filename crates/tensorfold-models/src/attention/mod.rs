//! Causal attention on the CPU over the block cache of `tensorfold_kv`.
//!
//! Invariant: the query of a position `p` folds the keys `0..=p` block by
//! block ([`BLOCK`] positions counted from position 0, the last block cut
//! at `p`), in position order, into a running softmax of its own (maximum,
//! sum, weighted values). Its bits are a function of its query and those
//! keys alone: not of the chunk it came in, the other rows of the call, the
//! tile or thread that ran it, nor the instruction set.
//!
//! Within a block, scores are computed for many keys at once (keys are
//! stored dimension after dimension) and for several queries at once (the
//! heads of a group and neighbouring rows), so each loaded key and value
//! serves them all; see [`kernels`] for why that changes no query's bits.
//!
//! Work is split into tasks of one key/value head and [`TILE`] query rows:
//! every head of the group and every row of the tile reads a key block
//! while it is in cache, and tasks run on every core. When that makes too
//! few tasks for the cores (decoding one row), a group's heads are split
//! between tasks.

mod kernels;
mod lanes;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::config::ModelConfig;
use kernels::{accumulate, scores, soften, Running};
pub(crate) use lanes::exp;
use lanes::{Isa, Lanes, Portable};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;
use tensorfold_kv::{KvBlock, KvCache, BLOCK};

/// Query rows one task takes.
const TILE: usize = 16;

/// The most queries one pass over a key block serves (the kernels'
/// registers hold this many queries' sums on AVX-512).
const MOST_QUERIES: usize = 6;
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
        Isa::Portable => fold_task::<_, 4, 4, 4>(Portable, shape, blocks, start, q, task),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only detected (or listed) where the CPU
        // runs AVX2, FMA and F16C.
        Isa::Avx2 => unsafe { fold_task_avx2(shape, blocks, start, q, task) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only detected (or listed) where the CPU
        // runs AVX-512F.
        Isa::Avx512 => unsafe { fold_task_avx512(shape, blocks, start, q, task) },
    }
}

/// [`fold_task`] compiled for AVX2, FMA and F16C: sixteen registers hold
/// three queries' sums over half a block (or two value vectors).
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
    let lanes = unsafe { x86::Avx2::new() };
    fold_task::<_, 3, 2, 2>(lanes, shape, blocks, start, q, task)
}

/// [`fold_task`] compiled for AVX-512: thirty-two registers hold six
/// queries' sums over a whole block (or four value vectors).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn fold_task_avx512(
    shape: &Shape,
    blocks: &[Arc<KvBlock>],
    start: usize,
    q: &[f32],
    task: &Task,
) -> Vec<f32> {
    // SAFETY: this function runs only where the CPU has these features.
    let lanes = unsafe { x86::Avx512::new() };
    fold_task::<_, MOST_QUERIES, 4, 4>(lanes, shape, blocks, start, q, task)
}

/// A query that sees some of a block's keys.
struct Alive {
    /// Index into the task's states.
    state: usize,
    /// Where its query vector starts in `q`.
    query: usize,
    /// Its keys among the block's slots.
    valid: Range<usize>,
}

/// Attention of one task's heads: their outputs, row after row, head
/// after head. Up to `QUERIES` queries share a pass over a block, `KV` key
/// vectors and `DV` value vectors at a time.
#[inline(always)]
fn fold_task<L: Lanes, const QUERIES: usize, const KV: usize, const DV: usize>(
    lanes: L,
    shape: &Shape,
    blocks: &[Arc<KvBlock>],
    start: usize,
    q: &[f32],
    task: &Task,
) -> Vec<f32> {
    const { assert!(QUERIES >= 1 && QUERIES <= MOST_QUERIES) };
    let (hd, task_heads, rows, kv_head) = (
        shape.head_dim,
        task.heads.len(),
        task.rows.clone(),
        task.kv_head,
    );
    let first_head = kv_head * shape.group + task.heads.start;
    // `attention_with` checked that the blocks hold at least one row.
    let stride = blocks[0].value_stride();
    let mut states: Vec<Running> = (0..rows.len() * task_heads)
        .map(|_| Running::new(stride))
        .collect();
    let mut scratch = [[0f32; BLOCK]; QUERIES];
    let mut alive = Vec::with_capacity(states.len());
    let last = start + rows.end - 1;
    for (b, block) in blocks[..=last / BLOCK].iter().enumerate() {
        let first = b * BLOCK;
        alive.clear();
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
            for h in 0..task_heads {
                alive.push(Alive {
                    state: (r - rows.start) * task_heads + h,
                    query: r * shape.q_width + (first_head + h) * hd,
                    valid: skip..end,
                });
            }
        }
        let pass = Pass {
            lanes,
            keys: block.keys(kv_head),
            values: block.values(kv_head),
            stride,
            shape,
            q,
        };
        pass.run_all::<QUERIES, KV, DV>(&alive, &mut states, &mut scratch);
    }
    let mut out = Vec::with_capacity(states.len() * hd);
    for s in states {
        let inverse = 1.0 / s.sum;
        out.extend(s.acc[..hd].iter().map(|a| a * inverse));
    }
    out
}

/// One key block (one head's keys and values) folded into queries' states.
struct Pass<'a, L> {
    lanes: L,
    keys: &'a [half::f16],
    values: &'a [half::f16],
    stride: usize,
    shape: &'a Shape,
    q: &'a [f32],
}

impl<L: Lanes> Pass<'_, L> {
    /// Every alive query, `QUERIES` a pass.
    #[inline(always)]
    fn run_all<const QUERIES: usize, const KV: usize, const DV: usize>(
        &self,
        alive: &[Alive],
        states: &mut [Running],
        scratch: &mut [[f32; BLOCK]],
    ) {
        for group in alive.chunks(QUERIES) {
            match group.len() {
                1 => self.run::<1, KV, DV>(group, states, scratch),
                2 => self.run::<2, KV, DV>(group, states, scratch),
                3 => self.run::<3, KV, DV>(group, states, scratch),
                4 => self.run::<4, KV, DV>(group, states, scratch),
                5 => self.run::<5, KV, DV>(group, states, scratch),
                _ => self.run::<6, KV, DV>(group, states, scratch),
            }
        }
    }

    #[inline(always)]
    fn run<const N: usize, const KV: usize, const DV: usize>(
        &self,
        group: &[Alive],
        states: &mut [Running],
        scratch: &mut [[f32; BLOCK]],
    ) {
        let hd = self.shape.head_dim;
        let queries: [&[f32]; N] = std::array::from_fn(|n| &self.q[group[n].query..][..hd]);
        let scratch: &mut [[f32; BLOCK]; N] = (&mut scratch[..N])
            .try_into()
            .expect("scratch for every query of a pass");
        scores::<L, N, KV>(self.lanes, queries, self.keys, self.shape.scale, scratch);
        let mut states = states
            .get_disjoint_mut(std::array::from_fn::<usize, N, _>(|n| group[n].state))
            .expect("one state per query");
        for n in 0..N {
            soften(
                self.lanes,
                &mut scratch[n],
                group[n].valid.clone(),
                self.shape.softcap,
                states[n],
            );
        }
        // Slots outside a query's own keys weigh exactly 0 and every stored
        // value is finite, so taking them adds nothing to its sums.
        let slots = group.iter().map(|a| a.valid.start).min().unwrap_or(0)
            ..group.iter().map(|a| a.valid.end).max().unwrap_or(0);
        accumulate::<L, N, DV>(
            self.lanes,
            scratch.each_ref(),
            self.values,
            self.stride,
            slots,
            states.each_mut().map(|s| s.acc.as_mut_slice()),
        );
    }
}

#[cfg(test)]
mod tests;
