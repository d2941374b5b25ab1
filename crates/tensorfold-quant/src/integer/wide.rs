//! Operands laid out for the wide kernel: many input rows (a prefill
//! chunk, a long verify window) against a tile of weight rows, on AVX-512
//! VNNI.
//!
//! The kernel computes the same lanes in the same order as every other
//! path ([`super::kernel::reference`]), so it gives the same bits. What
//! differs is where its terms come from: the inputs are read as unsigned
//! (`value + 128`), so each weight lane carries the start that undoes the
//! offset (`-128 *` the sum of its four weights); that start and the
//! half-block scales spread over the lanes are worked out once a call and
//! stored beside the values, two blocks to a record, in the order the
//! kernel reads them. The kernel then reads one stream of inputs and one of
//! weights, with the signed weights straight from memory, and keeps the
//! running sums and the group's inputs in registers.

use super::activations::QuantizedRows;
use super::kernel::Values;
use super::unpack::Packing;
use super::{BLOCK, TILE};

/// Input rows one kernel call takes: a group of records.
pub(crate) const ROWS: usize = 4;
/// Lanes of a block pair: eight a block, four values a lane.
pub(crate) const LANES: usize = 16;

/// One input row's pair of blocks; after a row's lone last block the odd
/// half is zero.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct InputPair {
    /// The values plus 128.
    pub values: [u8; 2 * BLOCK],
    /// Each lane's block scale.
    pub scales: [f32; LANES],
}

/// One weight row's pair of blocks.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct WeightPair {
    pub values: [i8; 2 * BLOCK],
    /// Where each lane of a product with unsigned inputs starts: `-128 *`
    /// the sum of its four values.
    pub starts: [i32; LANES],
    /// Each lane's half-block scale.
    pub scales: [f32; LANES],
}

const EMPTY_INPUT: InputPair = InputPair {
    values: [0; 2 * BLOCK],
    scales: [0.0; LANES],
};

const EMPTY_WEIGHT: WeightPair = WeightPair {
    values: [0; 2 * BLOCK],
    starts: [0; LANES],
    scales: [0.0; LANES],
};

/// The input rows of a call as records: group `g` (rows `ROWS g..`), pair
/// `p`, row `r` of the group at `(g * pairs + p) * ROWS + r`.
pub(crate) struct Inputs {
    pub blocks: usize,
    records: Vec<InputPair>,
}

impl Inputs {
    pub fn new(rows: &QuantizedRows, m: usize) -> Inputs {
        let blocks = rows.blocks_per_row();
        let pairs = blocks.div_ceil(2);
        let mut records = vec![EMPTY_INPUT; m.div_ceil(ROWS) * pairs * ROWS];
        for row in 0..m {
            let group = (row / ROWS) * pairs * ROWS;
            for b in 0..blocks {
                let record = &mut records[group + (b / 2) * ROWS + row % ROWS];
                let half = b % 2;
                let values = &rows.values[(row * blocks + b) * BLOCK..][..BLOCK];
                offset_bytes(values, &mut record.values[half * BLOCK..][..BLOCK]);
                record.scales[half * 8..][..8].fill(rows.scales[row * blocks + b]);
            }
        }
        Inputs { blocks, records }
    }

    /// The records of the group that starts at input row `r0` (a multiple
    /// of [`ROWS`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn group(&self, r0: usize) -> &[InputPair] {
        assert!(r0.is_multiple_of(ROWS));
        let size = self.blocks.div_ceil(2) * ROWS;
        &self.records[(r0 / ROWS) * size..][..size]
    }
}

/// A tile's weight rows as records: pair `p`, row `j` at `p * TILE + j`.
#[derive(Default)]
pub(crate) struct Weights {
    blocks: usize,
    records: Vec<WeightPair>,
    /// The block minimums, block after block, the tile's rows side by side
    /// (empty for formats without them).
    mins: Vec<[f32; TILE]>,
    /// Per input row, the float part of each tile row's minimums (see
    /// [`super::kernel::reference`]), for all the tile's rows at once.
    pub row_mins: Vec<[f32; TILE]>,
}

impl Weights {
    /// Lays out `width` rows of `values` (bytes) with their half-block
    /// scales (`2 * blocks` a row). Records past `width`, and the odd half
    /// after a lone last block, keep what they held: the kernel never reads
    /// those rows, and masks those lanes.
    pub fn fill(&mut self, values: &Values, half_scales: &[f32], width: usize, blocks: usize) {
        assert_eq!(values.packing, Packing::Bytes);
        assert!(width <= TILE);
        self.blocks = blocks;
        self.records.resize(blocks.div_ceil(2) * TILE, EMPTY_WEIGHT);
        for j in 0..width {
            let scales = &half_scales[j * 2 * blocks..][..2 * blocks];
            for b in 0..blocks {
                let record = &mut self.records[(b / 2) * TILE + j];
                let half = b % 2;
                let block: &[i8; BLOCK] = values.block(j, b).try_into().expect("a block");
                record.values[half * BLOCK..][..BLOCK].copy_from_slice(block);
                record.starts[half * 8..][..8].copy_from_slice(&starts(block));
                // Lanes of four values: four lanes a half block.
                let lanes = &mut record.scales[half * 8..][..8];
                lanes[..4].fill(scales[2 * b]);
                lanes[4..].fill(scales[2 * b + 1]);
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
    pub fn rows_from(&self, j0: usize) -> &[WeightPair] {
        &self.records[j0..]
    }
}

/// `-128 *` the sum of each four values of a block.
fn starts(block: &[i8; BLOCK]) -> [i32; 8] {
    #[cfg(tensorfold_simd)]
    // SAFETY: AVX2 is enabled at build time (`tensorfold_simd`); the load
    // reads the block's 32 bytes, the store writes the eight lanes of `out`.
    unsafe {
        use std::arch::x86_64::*;
        let values = _mm256_loadu_si256(block.as_ptr() as *const __m256i);
        // Pairs of values (at most 2 * 127 in magnitude), then pairs of
        // pairs times -128.
        let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), values);
        let fours = _mm256_madd_epi16(pairs, _mm256_set1_epi16(-128));
        let mut out = [0i32; 8];
        _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, fours);
        out
    }
    #[cfg(not(tensorfold_simd))]
    std::array::from_fn(|l| -128 * block[4 * l..][..4].iter().map(|&v| v as i32).sum::<i32>())
}

/// `out = values + 128`, eight at a time (a byte loop stays scalar):
/// `v + 128` is `v ^ 0x80` for a byte.
fn offset_bytes(values: &[i8], out: &mut [u8]) {
    for (out, eight) in out.chunks_exact_mut(8).zip(values.chunks_exact(8)) {
        let word = u64::from_ne_bytes(std::array::from_fn(|e| eight[e] as u8));
        out.copy_from_slice(&(word ^ 0x8080_8080_8080_8080).to_ne_bytes());
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
