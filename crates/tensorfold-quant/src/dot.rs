//! The fixed-order reductions every row-invariant kernel is built from.
//!
//! Eight running sums over consecutive lanes, a scalar tail, then a fixed
//! pairwise combine. Rust never reassociates floating point, so the result
//! is a function of the inputs alone; the AVX build of the same body runs
//! the same additions in wider registers and gives the same bits.

#[inline(always)]
fn dot_body(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for i in chunks * 8..n {
        tail += a[i] * b[i];
    }
    let s0 = (acc[0] + acc[4]) + (acc[2] + acc[6]);
    let s1 = (acc[1] + acc[5]) + (acc[3] + acc[7]);
    (s0 + s1) + tail
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn dot_avx(a: &[f32], b: &[f32]) -> f32 {
    dot_body(a, b)
}

/// Dot product over the common length of `a` and `b`, in the fixed order.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU supports AVX, checked just above.
            return unsafe { dot_avx(a, b) };
        }
    }
    dot_body(a, b)
}

/// Sum of squares in the same fixed order as [`dot`].
#[inline]
pub fn sum_squares(a: &[f32]) -> f32 {
    dot(a, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_reference() {
        let a: Vec<f32> = (0..77).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..77).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - exact).abs() < 1e-4);
    }

    #[test]
    fn avx_and_portable_bodies_agree_bitwise() {
        let a: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5)
            .collect();
        let b: Vec<f32> = (0..1000)
            .map(|i| ((i * 104729) % 1000) as f32 / 991.0 - 0.5)
            .collect();
        for n in [1, 7, 8, 9, 63, 64, 65, 999, 1000] {
            assert_eq!(
                dot(&a[..n], &b[..n]).to_bits(),
                dot_body(&a[..n], &b[..n]).to_bits()
            );
        }
    }
}
