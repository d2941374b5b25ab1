//! The arithmetic of attention over f16 keys and values, in one order every
//! instruction set computes: the AVX2 path (F16C conversion, FMA) and the
//! portable path give the same bits, lane for lane.
//!
//! Each query keeps its own accumulators; several queries (the heads of a
//! key/value group) are taken together only so that a loaded key serves
//! them all, never to mix their sums.

use half::f16;

/// Lanes of the running sums.
const LANES: usize = 8;

/// The instruction sets the kernels come in, picked once from the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Isa {
    /// Every set this CPU runs, the portable one first.
    #[cfg(test)]
    pub fn available() -> Vec<Isa> {
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        if avx2_detected() {
            all.push(Isa::Avx2);
        }
        all
    }

    /// The fastest this CPU runs (`TENSORFOLD_CPU_KERNELS=portable` forces
    /// the portable one).
    pub fn detect() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            if std::env::var("TENSORFOLD_CPU_KERNELS").as_deref() == Ok("portable") {
                return Isa::Portable;
            }
            #[cfg(target_arch = "x86_64")]
            if avx2_detected() {
                return Isa::Avx2;
            }
            Isa::Portable
        })
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// The primitives one instruction set provides. Every method computes
/// exactly what the portable one does.
pub(crate) trait Kernels: Copy {
    /// `scores[n][j] = dot(queries[n], key j) * scale` for the first
    /// `scores[n].len()` keys of `keys` (`head_dim` apart).
    fn scores<const N: usize>(
        self,
        queries: [&[f32]; N],
        keys: &[f16],
        scale: f32,
        scores: [&mut [f32]; N],
    );

    /// `weights[j] = exp(weights[j] - max)`.
    fn exp_shifted(self, weights: &mut [f32], max: f32);

    /// `acc[n] += weights[n][j] * value j` for `j` in order, over the first
    /// `weights[n].len()` values (`head_dim` apart).
    fn accumulate<const N: usize>(self, weights: [&[f32]; N], values: &[f16], acc: [&mut [f32]; N]);
}

/// The reference every path matches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Portable;

impl Kernels for Portable {
    fn scores<const N: usize>(
        self,
        queries: [&[f32]; N],
        keys: &[f16],
        scale: f32,
        scores: [&mut [f32]; N],
    ) {
        let hd = queries[0].len();
        for (n, out) in scores.into_iter().enumerate() {
            for (j, s) in out.iter_mut().enumerate() {
                let key = &keys[j * hd..][..hd];
                let mut acc = [0f32; LANES];
                let chunks = hd / LANES * LANES;
                for c in (0..chunks).step_by(LANES) {
                    for l in 0..LANES {
                        acc[l] = queries[n][c + l].mul_add(key[c + l].to_f32(), acc[l]);
                    }
                }
                let mut tail = 0f32;
                for i in chunks..hd {
                    tail = queries[n][i].mul_add(key[i].to_f32(), tail);
                }
                *s = (horizontal_sum(acc) + tail) * scale;
            }
        }
    }

    fn exp_shifted(self, weights: &mut [f32], max: f32) {
        for w in weights {
            *w = exp(*w - max);
        }
    }

    fn accumulate<const N: usize>(
        self,
        weights: [&[f32]; N],
        values: &[f16],
        acc: [&mut [f32]; N],
    ) {
        let hd = acc[0].len();
        for (n, acc) in acc.into_iter().enumerate() {
            for (j, &w) in weights[n].iter().enumerate() {
                let value = &values[j * hd..][..hd];
                for (a, v) in acc.iter_mut().zip(value) {
                    *a = w.mul_add(v.to_f32(), *a);
                }
            }
        }
    }
}

/// Eight lanes summed in the order the AVX2 path sums them.
fn horizontal_sum(a: [f32; LANES]) -> f32 {
    let four = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let two = [four[0] + four[2], four[1] + four[3]];
    two[0] + two[1]
}

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HIGH: f32 = 0.693_359_4;
const LN2_LOW: f32 = -2.121_944_4e-4;
const EXP_LOW: f32 = -87.0;
const EXP_HIGH: f32 = 88.0;
/// exp(r) ≈ 1 + r + r² · P(r) on |r| ≤ ln 2 / 2 (Cephes' expf).
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// `e^x` by range reduction and a polynomial: the same bits in every lane of
/// every path (within about 2 ulp of the true value; 0 for `-inf`).
pub(crate) fn exp(x: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        return 0.0;
    }
    // `max` then `min`, as the AVX2 path does (`clamp` differs for NaN).
    #[allow(clippy::manual_clamp)]
    let x = x.max(EXP_LOW).min(EXP_HIGH);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HIGH, x);
    let r = n.mul_add(-LN2_LOW, r);
    let mut p = EXP_POLY[0];
    for c in &EXP_POLY[1..] {
        p = p.mul_add(r, *c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::Avx2;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{f16, Kernels, EXP_HIGH, EXP_LOW, EXP_POLY, LANES, LN2_HIGH, LN2_LOW, LOG2E};
    use std::arch::x86_64::*;

    /// AVX2 with FMA and F16C. Made only where [`super::Isa::detect`] found
    /// them, and used only inside a function compiled for them.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Avx2(());

    impl Avx2 {
        /// # Safety
        /// The CPU must run AVX2, FMA and F16C.
        pub(crate) unsafe fn new() -> Avx2 {
            Avx2(())
        }
    }

    /// Eight f16 at `p` as f32 (exact).
    ///
    /// # Safety
    /// `p` must be valid for reads of eight f16; the CPU runs F16C.
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller guarantees eight readable halves and F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    /// # Safety
    /// The CPU runs AVX.
    #[inline(always)]
    unsafe fn horizontal_sum(v: __m256) -> f32 {
        // SAFETY: register operations only; AVX is present.
        unsafe {
            let four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
            _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps::<1>(two, two)))
        }
    }

    impl Kernels for Avx2 {
        #[inline(always)]
        fn scores<const N: usize>(
            self,
            queries: [&[f32]; N],
            keys: &[f16],
            scale: f32,
            scores: [&mut [f32]; N],
        ) {
            let hd = queries[0].len();
            let count = scores[0].len();
            assert!(keys.len() >= count * hd && queries.iter().all(|q| q.len() == hd));
            assert!(scores.iter().all(|s| s.len() == count));
            let chunks = hd / LANES * LANES;
            for j in 0..count {
                let key = &keys[j * hd..][..hd];
                // SAFETY: `Avx2` exists only where the CPU runs AVX2, FMA
                // and F16C; every load is within `key` or a query (`hd`
                // long, checked above).
                unsafe {
                    let mut acc = [_mm256_setzero_ps(); N];
                    for c in (0..chunks).step_by(LANES) {
                        let k = load8(key.as_ptr().add(c));
                        for n in 0..N {
                            let q = _mm256_loadu_ps(queries[n].as_ptr().add(c));
                            acc[n] = _mm256_fmadd_ps(q, k, acc[n]);
                        }
                    }
                    for n in 0..N {
                        let mut tail = 0f32;
                        for i in chunks..hd {
                            tail = queries[n][i].mul_add(key[i].to_f32(), tail);
                        }
                        *scores[n].get_unchecked_mut(j) = (horizontal_sum(acc[n]) + tail) * scale;
                    }
                }
            }
        }

        #[inline(always)]
        fn exp_shifted(self, weights: &mut [f32], max: f32) {
            let mut chunks = weights.chunks_exact_mut(LANES);
            for chunk in &mut chunks {
                // SAFETY: `Avx2` exists only where the CPU runs AVX2 and
                // FMA; the chunk holds eight floats.
                unsafe {
                    let x = _mm256_sub_ps(_mm256_loadu_ps(chunk.as_ptr()), _mm256_set1_ps(max));
                    _mm256_storeu_ps(chunk.as_mut_ptr(), exp8(x));
                }
            }
            for w in chunks.into_remainder() {
                *w = super::exp(*w - max);
            }
        }

        #[inline(always)]
        fn accumulate<const N: usize>(
            self,
            weights: [&[f32]; N],
            values: &[f16],
            acc: [&mut [f32]; N],
        ) {
            let hd = acc[0].len();
            let count = weights[0].len();
            assert!(values.len() >= count * hd && acc.iter().all(|a| a.len() == hd));
            assert!(weights.iter().all(|w| w.len() == count));
            let chunks = hd / LANES * LANES;
            for c in (0..chunks).step_by(LANES) {
                // SAFETY: `Avx2` exists only where the CPU runs AVX2, FMA
                // and F16C; loads and stores stay within `values` (`count`
                // rows of `hd`) and the accumulators (`hd` each).
                unsafe {
                    let mut sums = [_mm256_setzero_ps(); N];
                    for n in 0..N {
                        sums[n] = _mm256_loadu_ps(acc[n].as_ptr().add(c));
                    }
                    for j in 0..count {
                        let v = load8(values.as_ptr().add(j * hd + c));
                        for n in 0..N {
                            let w = _mm256_set1_ps(*weights[n].get_unchecked(j));
                            sums[n] = _mm256_fmadd_ps(w, v, sums[n]);
                        }
                    }
                    for n in 0..N {
                        _mm256_storeu_ps(acc[n].as_mut_ptr().add(c), sums[n]);
                    }
                }
            }
            for i in chunks..hd {
                for n in 0..N {
                    let mut a = acc[n][i];
                    for j in 0..count {
                        a = weights[n][j].mul_add(values[j * hd + i].to_f32(), a);
                    }
                    acc[n][i] = a;
                }
            }
        }
    }

    /// [`super::exp`] in eight lanes, step for step.
    ///
    /// # Safety
    /// The CPU runs AVX2 and FMA.
    #[inline(always)]
    unsafe fn exp8(x: __m256) -> __m256 {
        // SAFETY: register operations only; AVX2 and FMA are present.
        unsafe {
            let minus_infinity = _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_set1_ps(f32::NEG_INFINITY));
            let x = _mm256_min_ps(
                _mm256_max_ps(x, _mm256_set1_ps(EXP_LOW)),
                _mm256_set1_ps(EXP_HIGH),
            );
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
            );
            let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HIGH), x);
            let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LOW), r);
            let mut p = _mm256_set1_ps(EXP_POLY[0]);
            for c in &EXP_POLY[1..] {
                p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
            }
            let y = _mm256_add_ps(
                _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
                _mm256_set1_ps(1.0),
            );
            let exponent = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            ));
            let e = _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));
            _mm256_andnot_ps(minus_infinity, e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_close_to_the_true_exponential() {
        for i in -2000..=200 {
            let x = i as f32 * 0.043;
            let (ours, exact) = (exp(x) as f64, (x as f64).exp());
            assert!(
                ((ours - exact) / exact).abs() < 4.0 * f32::EPSILON as f64,
                "exp({x}) = {ours}, not {exact}"
            );
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(0.0), 1.0);
    }
}
