//! Input rows quantized to 8 bits in fixed blocks of 32, each row on its
//! own: the quantization of a row never looks at another row.

use super::BLOCK;

/// `m` rows of `cols` values as `q * scale` per block of 32.
pub(crate) struct QuantizedRows {
    pub cols: usize,
    /// The 8-bit values, row after row: `|q| <= 127`.
    pub values: Vec<i8>,
    /// One scale per block: the block's largest magnitude over 127.
    pub scales: Vec<f32>,
    /// Per block: `scale * (sum of its values)`, what a weight block's
    /// minimum multiplies.
    pub block_sums: Vec<f32>,
}

impl QuantizedRows {
    /// Quantizes the first `m` rows of `x` (`cols` long, a multiple of 32).
    pub fn new(x: &[f32], m: usize, cols: usize) -> QuantizedRows {
        debug_assert!(cols.is_multiple_of(BLOCK));
        let blocks = m * cols / BLOCK;
        let mut rows = QuantizedRows {
            cols,
            values: vec![0; m * cols],
            scales: vec![0.0; blocks],
            block_sums: vec![0.0; blocks],
        };
        let blocks = x[..m * cols]
            .chunks_exact(BLOCK)
            .zip(rows.values.chunks_exact_mut(BLOCK))
            .zip(rows.scales.iter_mut())
            .zip(rows.block_sums.iter_mut());
        for (((x, q), scale), sum) in blocks {
            let x: &[f32; BLOCK] = x.try_into().expect("a block");
            let q: &mut [i8; BLOCK] = q.try_into().expect("a block");
            let total;
            (*scale, total) = quantize(x, q);
            *sum = *scale * total as f32;
        }
        rows
    }

    pub fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }
}

/// One block: `q = round(x * 127 / max |x|)`, ties to even (a NaN product
/// to 0), its scale `max / 127` and the sum of `q`.
#[cfg(not(tensorfold_simd))]
fn quantize(x: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> (f32, i32) {
    let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let inverse = if max > 0.0 { 127.0 / max } else { 0.0 };
    for (q, v) in q.iter_mut().zip(x) {
        // `|v * inverse| <= 127` up to one rounding, which rounds back to
        // 127 at most; `as` takes NaN to 0.
        *q = (v * inverse).round_ties_even() as i8;
    }
    (max / 127.0, q.iter().map(|&v| v as i32).sum())
}

/// [`quantize`] eight values a register, step for step: `max` keeps its
/// second operand when the first is NaN, as `f32::max` ignores a NaN, and
/// the largest magnitude is the same whatever the order.
#[cfg(tensorfold_simd)]
fn quantize(x: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> (f32, i32) {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 is enabled at build time (`tensorfold_simd`); the loads
    // read `x`'s 32 floats, the stores write eight floats of `lanes`, eight
    // integers of `sums` and `q`'s 32 bytes.
    unsafe {
        let v: [__m256; 4] = std::array::from_fn(|k| _mm256_loadu_ps(x.as_ptr().add(8 * k)));
        let sign = _mm256_set1_ps(-0.0);
        let mut most = _mm256_setzero_ps();
        for v in v {
            most = _mm256_max_ps(_mm256_andnot_ps(sign, v), most);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), most);
        let max = lanes.iter().fold(0f32, |m, &v| m.max(v));
        let inverse = _mm256_set1_ps(if max > 0.0 { 127.0 / max } else { 0.0 });
        let ints = v.map(|v| {
            let p = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(v, inverse),
            );
            // NaN to 0, as `as i8` does; the rest are whole numbers.
            _mm256_cvtps_epi32(_mm256_and_ps(p, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p)))
        });
        let total = _mm256_add_epi32(
            _mm256_add_epi32(ints[0], ints[1]),
            _mm256_add_epi32(ints[2], ints[3]),
        );
        let mut sums = [0i32; 8];
        _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, total);
        // Packing interleaves the 128-bit halves: dwords come out as
        // v0[0..4], v1[0..4], v2[0..4], v3[0..4], v0[4..8], ...
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(ints[0], ints[1]),
            _mm256_packs_epi32(ints[2], ints[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, bytes);
        (max / 127.0, sums.iter().sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::values;

    #[test]
    fn values_stay_within_127_and_reconstruct_closely() {
        let x = values(3 * 64, 9);
        let q = QuantizedRows::new(&x, 3, 64);
        for (b, block) in x.chunks_exact(BLOCK).enumerate() {
            let scale = q.scales[b];
            for (e, v) in block.iter().enumerate() {
                let got = q.values[b * BLOCK + e];
                assert!(got.unsigned_abs() <= 127);
                assert!((got as f32 * scale - v).abs() <= scale * 0.5 + 1e-7);
            }
        }
    }

    #[test]
    fn a_row_quantizes_the_same_alone_and_among_others() {
        let x = values(5 * 96, 4);
        let all = QuantizedRows::new(&x, 5, 96);
        let one = QuantizedRows::new(&x[2 * 96..], 1, 96);
        assert_eq!(all.values[2 * 96..3 * 96], one.values[..]);
        assert_eq!(all.scales[6..9], one.scales[..]);
        assert_eq!(all.block_sums[6..9], one.block_sums[..]);
    }

    /// The vector path and the scalar definition agree on every block,
    /// edge values included.
    #[test]
    fn blocks_quantize_as_defined() {
        let mut x = values(40 * BLOCK, 7);
        x[3] = f32::NAN;
        x[BLOCK + 5] = f32::INFINITY;
        x[2 * BLOCK..3 * BLOCK].fill(0.0);
        x[3 * BLOCK + 1] = -0.0;
        for (b, block) in x.iter_mut().skip(4 * BLOCK).step_by(BLOCK).enumerate() {
            *block *= 10f32.powi(b as i32 % 9 - 4);
        }
        let rows = QuantizedRows::new(&x, 40, BLOCK);
        for (b, block) in x.chunks_exact(BLOCK).enumerate() {
            let max = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let inverse = if max > 0.0 { 127.0 / max } else { 0.0 };
            let q: Vec<i8> = block
                .iter()
                .map(|v| (v * inverse).round_ties_even() as i8)
                .collect();
            assert_eq!(rows.values[b * BLOCK..][..BLOCK], q[..], "block {b}");
            assert_eq!(rows.scales[b].to_bits(), (max / 127.0).to_bits());
            let total: i32 = q.iter().map(|&v| v as i32).sum();
            assert_eq!(
                rows.block_sums[b].to_bits(),
                (max / 127.0 * total as f32).to_bits()
            );
        }
    }

    #[test]
    fn zero_blocks_have_zero_scale() {
        let q = QuantizedRows::new(&[0.0; 32], 1, 32);
        assert_eq!(q.scales[0], 0.0);
        assert!(q.values.iter().all(|&v| v == 0));
    }
}
