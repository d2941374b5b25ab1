//! [`Lanes`] in AVX-512 (one register a vector) and in AVX2 with FMA and
//! F16C (two). Each operation is the portable one's, lane for lane.

use super::lanes::{Lanes, EXP_HIGH, EXP_LOW, EXP_POLY, LN2_HIGH, LN2_LOW, LOG2E};
use half::f16;
use std::arch::x86_64::*;

pub(crate) fn avx2_detected() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

pub(crate) fn avx512_detected() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// AVX2 with FMA and F16C. Made only where [`avx2_detected`] holds, and
/// used only inside functions compiled for those features.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// # Safety
    /// The CPU must run AVX2, FMA and F16C.
    pub(crate) unsafe fn new() -> Avx2 {
        Avx2(())
    }
}

/// AVX-512 (foundation). Made only where [`avx512_detected`] holds, and
/// used only inside functions compiled for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512(());

impl Avx512 {
    /// # Safety
    /// The CPU must run AVX-512F.
    pub(crate) unsafe fn new() -> Avx512 {
        Avx512(())
    }
}

// SAFETY (every `unsafe` block below): an `Avx2` exists only where the CPU
// runs AVX2, FMA and F16C, so their register operations are available;
// loads and stores touch only what the callers guarantee.
impl Lanes for Avx2 {
    type V = [__m256; 2];

    #[inline(always)]
    fn zero(self) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { [_mm256_setzero_ps(); 2] }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { [_mm256_set1_ps(x); 2] }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> Self::V {
        // SAFETY: see the impl's note; the caller guarantees 16 floats.
        unsafe { [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))] }
    }
    #[inline(always)]
    unsafe fn load_half(self, p: *const f16) -> Self::V {
        // SAFETY: see the impl's note; the caller guarantees 16 halves.
        unsafe {
            [
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast())),
            ]
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: Self::V) {
        // SAFETY: see the impl's note; the caller guarantees 16 floats.
        unsafe {
            _mm256_storeu_ps(p, v[0]);
            _mm256_storeu_ps(p.add(8), v[1]);
        }
    }
    #[inline(always)]
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe {
            [
                _mm256_fmadd_ps(a[0], b[0], c[0]),
                _mm256_fmadd_ps(a[1], b[1], c[1]),
            ]
        }
    }
    #[inline(always)]
    fn add(self, a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: see the impl's note. (No closure: one would be compiled
        // without AVX and call these instructions out of line.)
        unsafe { [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])] }
    }
    #[inline(always)]
    fn sub(self, a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { [_mm256_sub_ps(a[0], b[0]), _mm256_sub_ps(a[1], b[1])] }
    }
    #[inline(always)]
    fn mul(self, a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { [_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])] }
    }
    #[inline(always)]
    fn max(self, a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { [_mm256_max_ps(a[0], b[0]), _mm256_max_ps(a[1], b[1])] }
    }
    #[inline(always)]
    fn exp(self, x: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { [exp8(x[0]), exp8(x[1])] }
    }
}

/// [`super::lanes::exp`] in eight lanes, step for step.
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

// SAFETY (every `unsafe` block below): an `Avx512` exists only where the CPU
// runs AVX-512F, so its register operations are available; loads and stores
// touch only what the callers guarantee.
impl Lanes for Avx512 {
    type V = __m512;

    #[inline(always)]
    fn zero(self) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> Self::V {
        // SAFETY: see the impl's note; the caller guarantees 16 floats.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_half(self, p: *const f16) -> Self::V {
        // SAFETY: see the impl's note; the caller guarantees 16 halves.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: Self::V) {
        // SAFETY: see the impl's note; the caller guarantees 16 floats.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn add(self, a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn max(self, a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn exp(self, x: Self::V) -> Self::V {
        // SAFETY: see the impl's note.
        unsafe {
            let minus_infinity =
                _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_set1_ps(f32::NEG_INFINITY));
            // `max(x, low)` then `min(.., high)` as the portable `f32::max`
            // and `f32::min` do: a NaN becomes `low`.
            let x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LOW));
            let x = _mm512_min_ps(x, _mm512_set1_ps(EXP_HIGH));
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
            );
            let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HIGH), x);
            let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LOW), r);
            let mut p = _mm512_set1_ps(EXP_POLY[0]);
            for c in &EXP_POLY[1..] {
                p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
            }
            let y = _mm512_add_ps(
                _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
                _mm512_set1_ps(1.0),
            );
            let exponent = _mm512_slli_epi32::<23>(_mm512_add_epi32(
                _mm512_cvtps_epi32(n),
                _mm512_set1_epi32(127),
            ));
            let e = _mm512_mul_ps(y, _mm512_castsi512_ps(exponent));
            _mm512_maskz_mov_ps(!minus_infinity, e)
        }
    }
}
