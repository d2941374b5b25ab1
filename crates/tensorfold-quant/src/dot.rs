//! The fixed-order reductions every row-invariant kernel is built from.
//!
//! Eight running sums over consecutive lanes, a scalar tail, then a fixed
//! pairwise combine. Rust never reassociates floating point, so the result
//! is a function of the inputs alone: on x86-64 the loop compiles to one
//! eight-lane AVX register whose lanes are exactly the eight sums.

#[inline(always)]
fn dot_body(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in at.iter().zip(bt) {
        tail += x * y;
    }
    let s0 = (acc[0] + acc[4]) + (acc[2] + acc[6]);
    let s1 = (acc[1] + acc[5]) + (acc[3] + acc[7]);
    (s0 + s1) + tail
}

/// Dot product over the common length of `a` and `b`, in the fixed order.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
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
    fn the_order_is_fixed_by_length() {
        // Eight lanes, then the tail: a value placed in lane 0 and one in
        // the tail are added last, so 1e8 + 1 - 1e8 differs from the naive sum.
        let mut a = vec![0f32; 9];
        a[0] = 1e8;
        a[1] = -1e8;
        a[8] = 1.0;
        let ones = vec![1f32; 9];
        assert_eq!(dot(&a, &ones), 1.0);
    }
}
