//! Causal attention on the CPU over the block cache of `tensorfold_kv`.
//!
//! Invariant: the query of a position `p` folds the keys `0..=p` block by
//! block ([`BLOCK`] positions counted from position 0, the last block cut
//! at `p`), in position order, into a running softmax of its own (maximum,
//! sum, weighted values). Its bits are a function of its query and those
//! keys alone: not of the chunk it came in, the other rows of the call, the
//! tile or thread that ran it, nor the instruction set.
//!
//! The products are integers summed exactly ([`integer`]): the query as
//! 16-bit integers against the cache's 16-bit keys, then the block's
//! weights as 16-bit integers against its 8-bit values ([`quantize`]), up
//! to sixteen queries a tile multiply, on the tile unit where the CPU has
//! one ([`amx`]). An integer sum has no order, so none of that changes a
//! query's bits; the float steps between ([`kernels`]) are each query's own.
//!
//! Work is split into tasks of one key/value head and [`TILE`] query rows:
//! every head of the group and every row of the tile reads a key block
//! while it is in cache, and tasks run on every core. When that makes too
//! few tasks for the cores (decoding one row), a group's heads are split
//! between tasks.

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod amx;
mod integer;
mod kernels;
mod lanes;
mod quantize;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::config::ModelConfig;
use integer::{ScoreSums, Sums};
use kernels::{add_values, float_scores, soften, Running};
pub(crate) use lanes::exp;
use lanes::{Isa, Lanes, Portable};
use quantize::{QueryTile, WeightTile, ROWS};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;
use tensorfold_kv::{HeadBlock, KvBlock, KvCache, BLOCK};

/// Query rows one task takes.
const TILE: usize = 16;
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
    attention_with(
        Isa::detect(),
        Sums::detect(),
        config,
        cache,
        layer,
        start,
        q,
        out,
    )
}

#[allow(clippy::too_many_arguments)]
fn attention_with(
    isa: Isa,
    sums: Sums,
    config: &ModelConfig,
    cache: &KvCache,
    layer: usize,
    start: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let shape = Shape::of(config, layer);
    assert!(
        cache.shape().key_dim() <= integer::MAX_KEY_DIM,
        "head dimensions above {} are not supported on the CPU",
        integer::MAX_KEY_DIM
    );
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
        .map(|task| run_task(isa, sums, &shape, blocks, start, q, task))
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
    /// The slots of the block starting at `first` that the query at
    /// `position` sees, if any: its own and earlier positions, within a
    /// sliding layer's window (fixed by its position alone).
    fn valid(&self, position: usize, first: usize) -> Option<Range<usize>> {
        if position < first {
            return None;
        }
        let end = (position + 1 - first).min(BLOCK);
        let skip = self.window.map_or(0, |w| {
            (position + 1).saturating_sub(w).saturating_sub(first)
        });
        (skip < end).then_some(skip..end)
    }

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
    sums: Sums,
    shape: &Shape,
    blocks: &[Arc<KvBlock>],
    start: usize,
    q: &[f32],
    task: &Task,
) -> Vec<f32> {
    match isa {
        Isa::Portable => fold_task(Portable, sums, shape, blocks, start, q, task),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only detected (or listed) where the CPU
        // runs AVX2 and FMA.
        Isa::Avx2 => unsafe { fold_task_avx2(sums, shape, blocks, start, q, task) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only detected (or listed) where the CPU
        // runs AVX-512F.
        Isa::Avx512 => unsafe { fold_task_avx512(sums, shape, blocks, start, q, task) },
    }
}

/// [`fold_task`] compiled for AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fold_task_avx2(
    sums: Sums,
    shape: &Shape,
    blocks: &[Arc<KvBlock>],
    start: usize,
    q: &[f32],
    task: &Task,
) -> Vec<f32> {
    // SAFETY: this function runs only where the CPU has these features.
    let lanes = unsafe { x86::Avx2::new() };
    fold_task(lanes, sums, shape, blocks, start, q, task)
}

/// [`fold_task`] compiled for AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn fold_task_avx512(
    sums: Sums,
    shape: &Shape,
    blocks: &[Arc<KvBlock>],
    start: usize,
    q: &[f32],
    task: &Task,
) -> Vec<f32> {
    // SAFETY: this function runs only where the CPU has these features.
    let lanes = unsafe { x86::Avx512::new() };
    fold_task(lanes, sums, shape, blocks, start, q, task)
}

/// Where a tile's integer sums are computed, with room for them.
enum Multiplier {
    Portable,
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    Tiles(amx::Tiles, Box<ScoreSums>, Vec<i32>),
}

impl Multiplier {
    fn new(sums: Sums, value_dim: usize) -> Multiplier {
        match sums {
            Sums::Portable => Multiplier::Portable,
            #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
            // SAFETY: `Sums::Tiles` is only detected (or listed) where
            // `amx::available` holds.
            Sums::Tiles => Multiplier::Tiles(
                unsafe { amx::Tiles::configure() },
                Box::new([[0; BLOCK]; ROWS]),
                vec![0; ROWS * value_dim],
            ),
        }
    }

    #[inline(always)]
    fn scores(&mut self, queries: &QueryTile, head: &HeadBlock, out: &mut ScoreSums) {
        match self {
            Multiplier::Portable => integer::scores_portable(queries, head, out),
            #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
            Multiplier::Tiles(tiles, cross, _) => amx::scores(tiles, queries, head, out, cross),
        }
    }

    #[inline(always)]
    fn values(&mut self, weights: &WeightTile, head: &HeadBlock, out: &mut [i32]) {
        match self {
            Multiplier::Portable => integer::values_portable(weights, head, out),
            #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
            Multiplier::Tiles(tiles, _, low) => amx::values(tiles, weights, head, out, low),
        }
    }
}

/// A query's place in its task.
struct Query {
    /// Its row (within the call) and position.
    row: usize,
    position: usize,
    /// Where its query vector starts in `q`.
    at: usize,
}

/// Attention of one task's heads: their outputs, row after row, head
/// after head. The task's queries go [`ROWS`] to a tile multiply.
#[inline(always)]
fn fold_task<L: Lanes>(
    lanes: L,
    sums: Sums,
    shape: &Shape,
    blocks: &[Arc<KvBlock>],
    start: usize,
    q: &[f32],
    task: &Task,
) -> Vec<f32> {
    let (hd, kv_head) = (shape.head_dim, task.kv_head);
    let first_head = kv_head * shape.group + task.heads.start;
    // `attention_with` checked that the blocks hold at least one row.
    let first_block = blocks[0].head(kv_head);
    let (key_dim, value_dim) = (first_block.key_dim, first_block.value_dim);
    let queries: Vec<Query> = task
        .rows
        .clone()
        .flat_map(|r| {
            (0..task.heads.len()).map(move |h| Query {
                row: r,
                position: start + r,
                at: r * shape.q_width + (first_head + h) * hd,
            })
        })
        .collect();
    let tiles: Vec<QueryTile> = queries
        .chunks(ROWS)
        .map(|chunk| {
            let vectors: Vec<&[f32]> = chunk.iter().map(|x| &q[x.at..][..hd]).collect();
            QueryTile::new(&vectors, key_dim, shape.scale)
        })
        .collect();
    let mut states: Vec<Running> = (0..queries.len())
        .map(|_| Running::new(value_dim))
        .collect();
    let mut multiplier = Multiplier::new(sums, value_dim);
    let mut score_sums: Box<ScoreSums> = Box::new([[0; BLOCK]; ROWS]);
    let mut value_sums = vec![0i32; ROWS * value_dim];
    let mut weights = Box::new(WeightTile::new());
    let mut scores = [0f32; BLOCK];
    let last = start + task.rows.end - 1;
    for (b, block) in blocks[..=last / BLOCK].iter().enumerate() {
        let first = b * BLOCK;
        let head = block.head(kv_head);
        for (chunk, (tile, states)) in queries
            .chunks(ROWS)
            .zip(tiles.iter().zip(states.chunks_mut(ROWS)))
        {
            let valid: Vec<Option<Range<usize>>> = chunk
                .iter()
                .map(|x| shape.valid(x.position, first))
                .collect();
            if valid.iter().all(Option::is_none) {
                continue;
            }
            multiplier.scores(tile, &head, &mut score_sums);
            for (i, (valid, state)) in valid.iter().zip(states.iter_mut()).enumerate() {
                let Some(valid) = valid else {
                    weights.clear_row(i);
                    continue;
                };
                float_scores(&score_sums[i], head.key_scales, tile.factor[i], &mut scores);
                soften(lanes, &mut scores, valid.clone(), shape.softcap, state);
                weights.set_row(i, &scores, head.value_scales);
            }
            for i in chunk.len()..ROWS {
                weights.clear_row(i);
            }
            multiplier.values(&weights, &head, &mut value_sums);
            for (i, (valid, state)) in valid.iter().zip(states.iter_mut()).enumerate() {
                if valid.is_some() {
                    add_values(
                        &value_sums[i * value_dim..][..value_dim],
                        weights.scale[i],
                        &mut state.acc,
                    );
                }
            }
        }
    }
    debug_assert!(queries.iter().all(|x| x.row < task.rows.end));
    let mut out = Vec::with_capacity(states.len() * hd);
    for s in states {
        let inverse = 1.0 / s.sum;
        out.extend(s.acc[..hd].iter().map(|a| a * inverse));
    }
    out
}

#[cfg(test)]
mod tests;
