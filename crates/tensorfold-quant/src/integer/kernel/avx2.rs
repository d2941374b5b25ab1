//! The AVX2 kernel: the dot of [`super::reference`] with 256-bit integer sums.

use super::{combine, Operands, Packing, Rows, BLOCK, SUMS};
use std::arch::x86_64::*;

/// Per 128-bit lane `k`, element `i` the sum of the four 32-bit
/// elements of `v[i]`'s lane `k` (exact integer adds).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn sum_fours(v: [__m256i; 4]) -> __m256i {
    let even = _mm256_add_epi32(
        _mm256_unpacklo_epi32(v[0], v[1]),
        _mm256_unpackhi_epi32(v[0], v[1]),
    );
    let odd = _mm256_add_epi32(
        _mm256_unpacklo_epi32(v[2], v[3]),
        _mm256_unpackhi_epi32(v[2], v[3]),
    );
    _mm256_add_epi32(
        _mm256_unpacklo_epi64(even, odd),
        _mm256_unpackhi_epi64(even, odd),
    )
}

/// The integer and float parts of [`super::reference`] for `R x W`
/// dots, four blocks (eight half blocks, eight running sums) at a
/// time: each block's eight lanes of four products (`maddubs`, then
/// `madd`) are summed four by four into its two half blocks, and each
/// loaded input block feeds `W` weight blocks. An 8-bit product pair
/// sums to at most `2 * 127 * 127`, so the 16-bit pair sums of
/// `maddubs` never saturate and the sums are exact.
///
/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn main<const R: usize, const W: usize>(ops: &Operands) -> [[f32; W]; R] {
    let rows = Rows::new(ops, R, W);
    let Rows {
        x,
        cols,
        x_scales,
        w,
        row_stride,
        block_stride,
        half_scales,
        blocks,
        packing,
        ..
    } = rows;
    assert_eq!(packing, Packing::Bytes, "AVX2 reads unpacked values");
    let ones = _mm256_set1_epi16(1);
    // `sum_fours` leaves half block `2 i + k` at `4 k + i`.
    let in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let doubled = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    let lane_index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut acc = [[[_mm256_setzero_ps(); 2]; W]; R];
    // Blocks `b..b + n` (`n <= 4`) into running sums `half` (0: sums
    // 0-7, 1: sums 8-15; a macro so that it is a constant and the sums
    // stay in registers). Missing blocks add nothing: their factors are
    // zero and so are their sums, and `fma(0, 0, s)` is `s` (a running
    // sum is never `-0`).
    macro_rules! quad {
        ($b:expr, $n:expr, $half:expr) => {{
            let (b, n): (usize, usize) = ($b, $n);
            // Lanes below `n` (blocks) and `2 n` (half blocks) set.
            let block_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane_index);
            let half_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n as i32), lane_index);
            let mut xv = [[_mm256_setzero_si256(); 4]; R];
            let mut x_factors = [_mm256_setzero_ps(); R];
            for r in 0..R {
                for k in 0..n {
                    // SAFETY: block `b + k < blocks` of input row
                    // `r < R`, checked in `Rows::new`.
                    xv[r][k] = unsafe {
                        _mm256_loadu_si256(x.add(r * cols + (b + k) * BLOCK) as *const __m256i)
                    };
                }
                // SAFETY: the mask loads only the scales of blocks
                // `b..b + n`, in `x_scales`.
                let four =
                    unsafe { _mm256_maskload_ps(x_scales[r * blocks + b..].as_ptr(), block_mask) };
                x_factors[r] = _mm256_permutevar8x32_ps(four, doubled);
            }
            for j in 0..W {
                // SAFETY: the mask loads only the half scales of blocks
                // `b..b + n` of weight row `j`.
                let w_factors = unsafe {
                    _mm256_maskload_ps(half_scales[j * 2 * blocks + 2 * b..].as_ptr(), half_mask)
                };
                let mut wv = [_mm256_setzero_si256(); 4];
                for k in 0..n {
                    // SAFETY: block `b + k` of weight row `j < W`,
                    // checked in `Rows::new`.
                    wv[k] = unsafe {
                        _mm256_loadu_si256(
                            w.add(j * row_stride + (b + k) * block_stride) as *const __m256i
                        )
                    };
                }
                for r in 0..R {
                    let mut lanes = [_mm256_setzero_si256(); 4];
                    for k in 0..4 {
                        let magnitudes = _mm256_sign_epi8(wv[k], wv[k]);
                        let pairs =
                            _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(xv[r][k], wv[k]));
                        lanes[k] = _mm256_madd_epi16(pairs, ones);
                    }
                    let sums = _mm256_permutevar8x32_epi32(sum_fours(lanes), in_order);
                    let factors = _mm256_mul_ps(w_factors, x_factors[r]);
                    let running = &mut acc[r][j][$half];
                    *running = _mm256_fmadd_ps(factors, _mm256_cvtepi32_ps(sums), *running);
                }
            }
        }};
    }
    let mut b = 0;
    while b + 2 * 4 <= blocks {
        quad!(b, 4, 0);
        quad!(b + 4, 4, 1);
        b += 8;
    }
    if b < blocks {
        quad!(b, (blocks - b).min(4), 0);
    }
    if b + 4 < blocks {
        quad!(b + 4, blocks - b - 4, 1);
    }
    // Loops, not `array::from_fn`: its closure would be compiled without
    // this function's instruction sets and call them out of line.
    let mut out = [[0f32; W]; R];
    for r in 0..R {
        for j in 0..W {
            let mut sums = [0f32; SUMS];
            // SAFETY: `sums` holds sixteen floats.
            unsafe {
                _mm256_storeu_ps(sums.as_mut_ptr(), acc[r][j][0]);
                _mm256_storeu_ps(sums.as_mut_ptr().add(8), acc[r][j][1]);
            }
            out[r][j] = combine(&sums);
        }
    }
    out
}
