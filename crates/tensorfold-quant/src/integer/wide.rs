//! Operands laid out for the wide kernel: many input rows (a prefill
//! chunk, a long verify window) against a tile of weight rows, on AVX-512
//! VNNI.
//!
//! The kernel computes the same sums in the same order as every other path
//! ([`super::kernel::reference`]), so it gives the same bits. What differs
//! is where its terms come from: both sides are laid out in lanes
//! ([`super::lanes`]), so four `dpbusd` give all sixteen half blocks' sums
//! at once, with no shuffles. The inputs are read as unsigned (`value + 128`), so each
//! weight lane carries the start that undoes the offset (`-128 *` the sum
//! of its half block's weights); that start and the scales are worked out
//! once a call and stored beside the values, in the order the kernel reads
//! them. The kernel then reads one stream of inputs and one of weights,
//! with the signed weights straight from memory.

use super::activations::QuantizedRows;
use super::kernel::Values;
use super::lanes::{lay_out, LANES, SPAN};
use super::unpack::Packing;
use super::{BLOCK, HALF, TILE};

/// Input rows one kernel call takes: a group of records.
pub(crate) const ROWS: usize = 2;

/// One input row's span of blocks; lanes past a row's end are zero.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct InputSpan {
    /// The values plus 128: in part `c`, lane `l` holds values
    /// `16 l + 4 c..16 l + 4 c + 4` of the span.
    pub values: [[u8; 4 * LANES]; 4],
    /// Each lane's block scale.
    pub scales: [f32; LANES],
}

/// One weight row's span of blocks, laid out as [`InputSpan`].
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct WeightSpan {
    /// The signed values' bytes.
    pub values: [[u8; 4 * LANES]; 4],
    /// Where each lane of a product with unsigned inputs starts: `-128 *`
    /// the sum of its half block's values.
    pub starts: [i32; LANES],
    /// Each lane's half-block scale.
    pub scales: [f32; LANES],
}

const EMPTY_INPUT: InputSpan = InputSpan {
    values: [[0; 4 * LANES]; 4],
    scales: [0.0; LANES],
};

const EMPTY_WEIGHT: WeightSpan = WeightSpan {
    values: [[0; 4 * LANES]; 4],
    starts: [0; LANES],
    scales: [0.0; LANES],
};

/// The input rows of a call as records: group `g` (rows `ROWS g..`), span
/// `s`, row `r` of the group at `(g * spans + s) * ROWS + r`.
pub(crate) struct Inputs {
    pub blocks: usize,
    records: Vec<InputSpan>,
}

impl Inputs {
    pub fn new(rows: &QuantizedRows, m: usize) -> Inputs {
        let blocks = rows.blocks_per_row();
        let spans = blocks.div_ceil(SPAN);
        let mut records = vec![EMPTY_INPUT; m.div_ceil(ROWS) * spans * ROWS];
        for row in 0..m {
            let group = (row / ROWS) * spans * ROWS;
            let values = &rows.values[row * blocks * BLOCK..][..blocks * BLOCK];
            let scales = &rows.scales[row * blocks..][..blocks];
            for (span, (values, scales)) in values
                .chunks(SPAN * BLOCK)
                .zip(scales.chunks(SPAN))
                .enumerate()
            {
                let record = &mut records[group + span * ROWS + row % ROWS];
                // `v + 128` is `v ^ 0x80` for a byte.
                lay_out(values, 0x80, &mut record.values);
                for (lane, scale) in record
                    .scales
                    .iter_mut()
                    .zip(scales.iter().flat_map(|s| [s, s]))
                {
                    *lane = *scale;
                }
            }
        }
        Inputs { blocks, records }
    }

    /// The records of the group that starts at input row `r0` (a multiple
    /// of [`ROWS`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn group(&self, r0: usize) -> &[InputSpan] {
        assert!(r0.is_multiple_of(ROWS));
        let size = self.blocks.div_ceil(SPAN) * ROWS;
        &self.records[(r0 / ROWS) * size..][..size]
    }
}

/// A tile's weight rows as records: span `s`, row `j` at `s * TILE + j`.
#[derive(Default)]
pub(crate) struct Weights {
    blocks: usize,
    records: Vec<WeightSpan>,
    /// The block minimums, block after block, the tile's rows side by side
    /// (empty for formats without them).
    mins: Vec<[f32; TILE]>,
    /// Per input row, the float part of each tile row's minimums (see
    /// [`super::kernel::reference`]), for all the tile's rows at once.
    pub row_mins: Vec<[f32; TILE]>,
}

impl Weights {
    /// Lays out `width` rows of `values` (bytes) with their half-block
    /// scales (`2 * blocks` a row). Records past `width`, and the lanes
    /// past a row's last block, keep what they held: the kernel never reads
    /// those rows, and masks those lanes.
    pub fn fill(&mut self, values: &Values, half_scales: &[f32], width: usize, blocks: usize) {
        assert_eq!(values.packing, Packing::Bytes);
        assert!(width <= TILE);
        self.blocks = blocks;
        self.records
            .resize(blocks.div_ceil(SPAN) * TILE, EMPTY_WEIGHT);
        let mut span_values = [0i8; SPAN * BLOCK];
        for j in 0..width {
            let scales = &half_scales[j * 2 * blocks..][..2 * blocks];
            for (span, scales) in scales.chunks(2 * SPAN).enumerate() {
                let record = &mut self.records[span * TILE + j];
                let first = span * SPAN;
                let count = SPAN.min(blocks - first);
                for (b, block) in span_values.chunks_exact_mut(BLOCK).take(count).enumerate() {
                    block.copy_from_slice(values.block(j, first + b));
                }
                let span_values = &span_values[..count * BLOCK];
                lay_out(span_values, 0, &mut record.values);
                for (lane, half) in span_values.chunks_exact(HALF).enumerate() {
                    record.starts[lane] = -128 * half.iter().map(|&v| v as i32).sum::<i32>();
                }
                record.scales[..scales.len()].copy_from_slice(scales);
            }
        }
    }

    /// Lays out the block minimums of `width` rows (`blocks` a row) and
    /// works out, for each of the `m` input rows (their block sums), the
    /// minimums' term of every tile row.
    pub fn fill_mins(&mut self, block_mins: &[f32], width: usize, sums: &[f32], m: usize) {
        let blocks = self.blocks;
        self.mins.resize(blocks, [0.0; TILE]);
        for j in 0..width {
            for (b, mins) in block_mins[j * blocks..][..blocks].iter().enumerate() {
                self.mins[b][j] = *mins;
            }
        }
        self.row_mins.resize(m, [0.0; TILE]);
        columns_dots(&sums[..m * blocks], &self.mins, &mut self.row_mins);
    }

    /// The records from weight row `j0` of the tile on.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn rows_from(&self, j0: usize) -> &[WeightSpan] {
        &self.records[j0..]
    }
}

/// `out[r][j]` = [`crate::dot_portable`]`(row r of sums, column j of
/// mins)`, for the tile's rows at once: the same lanes, tail and combine per
/// column, so the same bits as each dot alone. One row of `sums` is
/// `mins.len()` long.
fn columns_dots(sums: &[f32], mins: &[[f32; TILE]], out: &mut [[f32; TILE]]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F (and so FMA's instructions) runs here.
        return unsafe { columns_dots_avx512(sums, mins, out) };
    }
    for (sums, out) in sums.chunks_exact(mins.len()).zip(out) {
        *out = columns_dot(sums, mins);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn columns_dots_avx512(sums: &[f32], mins: &[[f32; TILE]], out: &mut [[f32; TILE]]) {
    for (sums, out) in sums.chunks_exact(mins.len()).zip(out) {
        *out = columns_dot(sums, mins);
    }
}

/// One row of [`columns_dots`]; loops only (no closures), so that it
/// compiles with its caller's instruction sets.
#[inline(always)]
fn columns_dot(sums: &[f32], mins: &[[f32; TILE]]) -> [f32; TILE] {
    use crate::dot::{combine, LANES};
    let n = sums.len();
    let full = n / LANES * LANES;
    let mut acc = [[0f32; TILE]; LANES];
    for c in (0..full).step_by(LANES) {
        for (l, lane) in acc.iter_mut().enumerate() {
            let (s, w) = (sums[c + l], &mins[c + l]);
            for j in 0..TILE {
                lane[j] = s.mul_add(w[j], lane[j]);
            }
        }
    }
    let mut tail = [0f32; TILE];
    for e in full..n {
        for j in 0..TILE {
            tail[j] = sums[e].mul_add(mins[e][j], tail[j]);
        }
    }
    let mut out = [0f32; TILE];
    for j in 0..TILE {
        let mut lanes = [0f32; LANES];
        for (lane, acc) in lanes.iter_mut().zip(&acc) {
            *lane = acc[j];
        }
        out[j] = combine(&lanes, tail[j]);
    }
    out
}
