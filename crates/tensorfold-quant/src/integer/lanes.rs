//! The lane layout of a span of eight blocks: lane `l` of each of four
//! registers holds four values of half block `l`, so that four `dpbusd`
//! give the span's sixteen half-block sums at once, with no shuffles. The
//! wide kernel's records and the few-row AVX-512 kernel both read their
//! operands so; the latter's input rows are laid out here, once a call.

use super::activations::QuantizedRows;
use super::{BLOCK, HALF};

/// Lanes of a span: one a half block.
pub(crate) const LANES: usize = 16;
/// Blocks of a span.
pub(crate) const SPAN: usize = LANES / 2;
/// Values of one lane in one register (`dpbusd` sums four products).
const FOUR: usize = 4;

/// One input row's span of blocks, signed; lanes past a row's end are zero.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct RowSpan {
    /// The values' bytes: in part `c`, lane `l` holds values
    /// `16 l + 4 c..16 l + 4 c + 4` of the span.
    pub values: [[u8; 4 * LANES]; 4],
    /// Each lane's sum of its half block's values, negated: what a weight
    /// packing's offset multiplies.
    pub negative_sums: [i32; LANES],
    /// Each lane's block scale.
    pub scales: [f32; LANES],
}

const EMPTY: RowSpan = RowSpan {
    values: [[0; 4 * LANES]; 4],
    negative_sums: [0; LANES],
    scales: [0.0; LANES],
};

/// The input rows of a call in lanes: row `r`, span `s` at
/// `r * spans + s`.
pub(crate) struct RowSpans {
    spans: usize,
    records: Vec<RowSpan>,
}

impl RowSpans {
    pub fn new(rows: &QuantizedRows, m: usize) -> RowSpans {
        let blocks = rows.blocks_per_row();
        let spans = blocks.div_ceil(SPAN);
        let mut records = vec![EMPTY; m * spans];
        for (row, records) in records.chunks_exact_mut(spans).enumerate() {
            let values = &rows.values[row * blocks * BLOCK..][..blocks * BLOCK];
            let scales = &rows.scales[row * blocks..][..blocks];
            let spans = values.chunks(SPAN * BLOCK).zip(scales.chunks(SPAN));
            for (record, (values, scales)) in records.iter_mut().zip(spans) {
                lay_out(values, 0, &mut record.values);
                let halves = values.chunks_exact(HALF);
                for (sum, half) in record.negative_sums.iter_mut().zip(halves) {
                    *sum = -half.iter().map(|&v| v as i32).sum::<i32>();
                }
                let each_twice = scales.iter().flat_map(|s| [s, s]);
                for (lane, scale) in record.scales.iter_mut().zip(each_twice) {
                    *lane = *scale;
                }
            }
        }
        RowSpans { spans, records }
    }

    /// Row `r`'s spans.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn row(&self, r: usize) -> &[RowSpan] {
        &self.records[r * self.spans..][..self.spans]
    }
}

/// Lays out up to a span of values (`values[16 l + 4 c + e]` of half
/// block `l`) as a record's four parts (`parts[c][4 l + e]`), each byte
/// xor `flip`; lanes past the values are left as they are.
pub(crate) fn lay_out(values: &[i8], flip: u8, parts: &mut [[u8; 4 * LANES]; 4]) {
    #[cfg(target_arch = "x86_64")]
    if values.len() == SPAN * BLOCK && is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F runs here, checked just above.
        return unsafe { lay_out_avx512(values.try_into().expect("a span"), flip, parts) };
    }
    for (lane, half) in values.chunks_exact(HALF).enumerate() {
        for (part, four) in half.chunks_exact(FOUR).enumerate() {
            for (out, v) in parts[part][FOUR * lane..][..FOUR].iter_mut().zip(four) {
                *out = *v as u8 ^ flip;
            }
        }
    }
}

/// [`lay_out`] of a whole span with AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn lay_out_avx512(values: &[i8; SPAN * BLOCK], flip: u8, parts: &mut [[u8; 4 * LANES]; 4]) {
    use std::arch::x86_64::*;
    let flip = _mm512_set1_epi8(flip as i8);
    let mut z = [_mm512_setzero_si512(); 4];
    for (k, z) in z.iter_mut().enumerate() {
        // SAFETY: the four 64-byte loads read the span's 256 bytes.
        let words = unsafe { _mm512_loadu_si512(values.as_ptr().add(64 * k) as *const _) };
        *z = _mm512_xor_si512(words, flip);
    }
    for (part, words) in parts.iter_mut().zip(in_lanes(z)) {
        // SAFETY: a part holds 64 bytes.
        unsafe { _mm512_storeu_si512(part.as_mut_ptr() as *mut _, words) };
    }
}

/// A span's 256 bytes in order (register `k` holding half blocks
/// `4 k..4 k + 4`, one a 128-bit quarter) as the four parts of the lane
/// layout: the registers' words transposed four by four within their
/// quarters, then put in lane order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn in_lanes(z: [std::arch::x86_64::__m512i; 4]) -> [std::arch::x86_64::__m512i; 4] {
    use std::arch::x86_64::*;
    let (a, b) = (
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpackhi_epi32(z[0], z[1]),
    );
    let (c, d) = (
        _mm512_unpacklo_epi32(z[2], z[3]),
        _mm512_unpackhi_epi32(z[2], z[3]),
    );
    // Part `p`, quarter `t`, word `i`: lane `4 i + t`, at `4 t + i`.
    let transposed = [
        _mm512_unpacklo_epi64(a, c),
        _mm512_unpackhi_epi64(a, c),
        _mm512_unpacklo_epi64(b, d),
        _mm512_unpackhi_epi64(b, d),
    ];
    let in_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    // A loop, not `map`: its closure would be compiled without AVX-512.
    let mut parts = transposed;
    for part in &mut parts {
        *part = _mm512_permutexvar_epi32(in_order, *part);
    }
    parts
}
