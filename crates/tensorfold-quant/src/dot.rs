//! The fixed-order reduction every row-invariant kernel is built from.
//!
//! The order, a function of the length `n` alone:
//! - eight lane sums: lane `l` accumulates `a[8c + l] * b[8c + l]` for
//!   `c = 0, 1, ..` with a fused multiply-add, chunk after chunk;
//! - a tail sum over the last `n % 8` elements, fused multiply-adds in
//!   index order;
//! - the fixed combine `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`,
//!   then `+ tail`.
//!
//! Every path computes exactly these roundings: the portable one with
//! `f32::mul_add`, the AVX2 one with one eight-lane FMA register per dot.
//! Speed comes from computing several dots at once (independent chains for
//! the FMA pipes, each loaded vector reused across dots), never from
//! reassociating one dot, so a dot's bits do not depend on its neighbours.

/// Lanes of the running sums.
pub(crate) const LANES: usize = 8;

/// The fixed combine of the lane sums and the tail.
#[inline(always)]
pub(crate) fn combine(acc: &[f32; LANES], tail: f32) -> f32 {
    let s0 = (acc[0] + acc[4]) + (acc[2] + acc[6]);
    let s1 = (acc[1] + acc[5]) + (acc[3] + acc[7]);
    (s0 + s1) + tail
}

/// The order, written for clarity: the definition the fast paths match.
pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    let mut tail = 0f32;
    for (x, y) in at.iter().zip(bt) {
        tail = x.mul_add(*y, tail);
    }
    combine(&acc, tail)
}

/// Dot product over the common length of `a` and `b`, in the fixed order.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(tensorfold_simd)]
    {
        let n = a.len().min(b.len());
        let mut out = [[0f32; 1]; 1];
        // SAFETY: one row of `a` and one of `b`, each `n` long, are in bounds.
        unsafe { simd::block::<1, 1>(a.as_ptr(), n, b.as_ptr(), n, n, &mut out) };
        out[0][0]
    }
    #[cfg(not(tensorfold_simd))]
    dot_portable(a, b)
}

/// Sum of squares in the same fixed order as [`dot`].
#[inline]
pub fn sum_squares(a: &[f32]) -> f32 {
    dot(a, a)
}

/// `out[r][j] = dot(x row r, w row j)` for `R` rows of `x` (stride `xs`) and
/// `W` rows of `w` (stride `ws`), each `k` long: `R * W` dots at once.
///
/// # Safety
/// `x` must be valid for reads of `(R - 1) * xs + k` floats and `w` for
/// `(W - 1) * ws + k`.
#[inline]
pub(crate) unsafe fn dot_block<const R: usize, const W: usize>(
    x: *const f32,
    xs: usize,
    w: *const f32,
    ws: usize,
    k: usize,
    out: &mut [[f32; W]; R],
) {
    #[cfg(tensorfold_simd)]
    // SAFETY: the caller's bounds are the kernel's.
    unsafe {
        simd::block::<R, W>(x, xs, w, ws, k, out)
    }
    #[cfg(not(tensorfold_simd))]
    for (r, row) in out.iter_mut().enumerate() {
        for (j, o) in row.iter_mut().enumerate() {
            // SAFETY: in bounds by the caller's contract.
            let (a, b) = unsafe {
                (
                    std::slice::from_raw_parts(x.add(r * xs), k),
                    std::slice::from_raw_parts(w.add(j * ws), k),
                )
            };
            *o = dot_portable(a, b);
        }
    }
}

#[cfg(tensorfold_simd)]
mod simd {
    use super::{combine, LANES};
    use std::arch::x86_64::*;

    /// The AVX2 kernel: one `__m256` per dot holds its eight lane sums; the
    /// `R` input vectors and each weight vector are loaded once per chunk
    /// and feed `R * W` independent FMA chains.
    ///
    /// # Safety
    /// As [`super::dot_block`]; AVX2 and FMA are enabled at compile time.
    #[inline(always)]
    pub(super) unsafe fn block<const R: usize, const W: usize>(
        x: *const f32,
        xs: usize,
        w: *const f32,
        ws: usize,
        k: usize,
        out: &mut [[f32; W]; R],
    ) {
        let full = k / LANES * LANES;
        // SAFETY (whole body): every load reads `LANES` floats at an offset
        // `c < full <= k` of a row the caller guarantees, or one float below `k`.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); W]; R];
            let mut c = 0;
            while c < full {
                let mut xv = [_mm256_setzero_ps(); R];
                for (r, v) in xv.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(x.add(r * xs + c));
                }
                // Index loops: the shapes are constants and unroll fully.
                #[allow(clippy::needless_range_loop)]
                for j in 0..W {
                    let wv = _mm256_loadu_ps(w.add(j * ws + c));
                    for r in 0..R {
                        acc[r][j] = _mm256_fmadd_ps(xv[r], wv, acc[r][j]);
                    }
                }
                c += LANES;
            }
            for r in 0..R {
                for j in 0..W {
                    let mut tail = 0f32;
                    for t in full..k {
                        tail = (*x.add(r * xs + t)).mul_add(*w.add(j * ws + t), tail);
                    }
                    let mut lanes = [0f32; LANES];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][j]);
                    out[r][j] = combine(&lanes, tail);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 20011) as f32
                    / 7000.0
                    - 1.4
            })
            .collect()
    }

    #[test]
    fn dot_matches_f64_reference() {
        let a: Vec<f32> = (0..77).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..77).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - exact).abs() < 1e-4);
    }

    #[test]
    fn the_order_is_fixed_by_length() {
        // Eight lanes, then the tail: a value placed in lane 0 and one in
        // the tail are added last, so 1e8 + 1 - 1e8 differs from the naive sum.
        let mut a = vec![0f32; 9];
        a[0] = 1e8;
        a[1] = -1e8;
        a[8] = 1.0;
        let ones = vec![1f32; 9];
        assert_eq!(dot(&a, &ones), 1.0);
        assert_eq!(dot_portable(&a, &ones), 1.0);
    }

    /// Every kernel shape gives the portable order's bits, for every length.
    #[test]
    fn fast_paths_equal_the_portable_order_bitwise() {
        fn check<const R: usize, const W: usize>(k: usize) {
            let (x, w) = (values(R * k + 3, 1), values(W * k + 5, 2));
            let mut out = [[0f32; W]; R];
            // SAFETY: `x` holds `R` rows and `w` holds `W` rows of `k`.
            unsafe { dot_block::<R, W>(x.as_ptr(), k, w.as_ptr(), k, k, &mut out) };
            for r in 0..R {
                for j in 0..W {
                    let want = dot_portable(&x[r * k..(r + 1) * k], &w[j * k..(j + 1) * k]);
                    assert_eq!(out[r][j].to_bits(), want.to_bits(), "R={R} W={W} k={k}");
                }
            }
        }
        for k in (0..300).chain([511, 576, 1536, 4099]) {
            let (a, b) = (values(k, 3), values(k, 4));
            assert_eq!(dot(&a, &b).to_bits(), dot_portable(&a, &b).to_bits(), "{k}");
            check::<1, 1>(k);
            check::<1, 8>(k);
            check::<2, 4>(k);
            check::<3, 2>(k);
            check::<4, 2>(k);
        }
    }
}
