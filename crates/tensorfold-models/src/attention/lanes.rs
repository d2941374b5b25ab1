//! Sixteen f32 lanes and the few operations attention needs, in every
//! instruction set this crate runs: AVX-512, AVX2 (two registers a vector)
//! and a portable array. Every operation is lane-wise and rounds once (the
//! multiply-add is fused everywhere), so a kernel written over [`Lanes`]
//! gives the same bits whichever set runs it.

use half::f16;

/// Lanes of one vector.
pub(crate) const LANES: usize = 16;

/// The instruction sets the kernels come in, picked once from the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// Every set this CPU runs, the portable one first.
    #[cfg(test)]
    pub fn available() -> Vec<Isa> {
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if super::x86::avx2_detected() {
                all.push(Isa::Avx2);
            }
            if super::x86::avx512_detected() {
                all.push(Isa::Avx512);
            }
        }
        all
    }

    /// The fastest this CPU runs (`TENSORFOLD_CPU_KERNELS=portable` forces
    /// the portable one, `avx2` stops at AVX2).
    pub fn detect() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            let wanted = std::env::var("TENSORFOLD_CPU_KERNELS").unwrap_or_default();
            if wanted == "portable" {
                return Isa::Portable;
            }
            #[cfg(target_arch = "x86_64")]
            {
                if wanted != "avx2" && super::x86::avx512_detected() {
                    return Isa::Avx512;
                }
                if super::x86::avx2_detected() {
                    return Isa::Avx2;
                }
            }
            Isa::Portable
        })
    }
}

/// One instruction set's vector of [`LANES`] f32 and its operations.
/// Implementations exist only where the CPU runs their instructions.
pub(crate) trait Lanes: Copy {
    type V: Copy;

    fn zero(self) -> Self::V;
    fn splat(self, x: f32) -> Self::V;
    /// # Safety
    /// `p` is valid for reads of [`LANES`] f32.
    unsafe fn load(self, p: *const f32) -> Self::V;
    /// [`LANES`] halves widened to f32 (exact).
    ///
    /// # Safety
    /// `p` is valid for reads of [`LANES`] halves.
    unsafe fn load_half(self, p: *const f16) -> Self::V;
    /// # Safety
    /// `p` is valid for writes of [`LANES`] f32.
    unsafe fn store(self, p: *mut f32, v: Self::V);
    /// `a * b + c`, rounded once.
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a > b ? a : b`, lane by lane (as the instructions compute it).
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// [`exp`] in every lane.
    fn exp(self, x: Self::V) -> Self::V;
}

/// The reference every instruction set matches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Portable;

impl Lanes for Portable {
    type V = [f32; LANES];

    fn zero(self) -> Self::V {
        [0.0; LANES]
    }
    fn splat(self, x: f32) -> Self::V {
        [x; LANES]
    }
    unsafe fn load(self, p: *const f32) -> Self::V {
        // SAFETY: the caller guarantees LANES readable floats.
        unsafe { p.cast::<[f32; LANES]>().read_unaligned() }
    }
    unsafe fn load_half(self, p: *const f16) -> Self::V {
        // SAFETY: the caller guarantees LANES readable halves.
        let halves = unsafe { p.cast::<[f16; LANES]>().read_unaligned() };
        halves.map(f16::to_f32)
    }
    unsafe fn store(self, p: *mut f32, v: Self::V) {
        // SAFETY: the caller guarantees LANES writable floats.
        unsafe { p.cast::<[f32; LANES]>().write_unaligned(v) }
    }
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l].mul_add(b[l], c[l]))
    }
    fn add(self, a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] + b[l])
    }
    fn sub(self, a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] - b[l])
    }
    fn mul(self, a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] * b[l])
    }
    fn max(self, a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| if a[l] > b[l] { a[l] } else { b[l] })
    }
    fn exp(self, x: Self::V) -> Self::V {
        x.map(exp)
    }
}

/// The sum of a vector's lanes, in one fixed tree: halves added lane to
/// lane until one lane is left.
pub(crate) fn lane_sum(v: [f32; LANES]) -> f32 {
    fold_halves(v, |a, b| a + b)
}

/// The largest of a vector's lanes (the same tree; without NaN the order
/// cannot matter).
pub(crate) fn lane_max(v: [f32; LANES]) -> f32 {
    fold_halves(v, |a, b| if a > b { a } else { b })
}

/// Lane `l` takes `op(lane l, lane l + width)` for width = LANES / 2, ...,
/// 1; lane 0 is the result.
fn fold_halves(mut v: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            v[l] = op(v[l], v[l + width]);
        }
        width /= 2;
    }
    v[0]
}

pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
pub(crate) const LN2_HIGH: f32 = 0.693_359_4;
pub(crate) const LN2_LOW: f32 = -2.121_944_4e-4;
pub(crate) const EXP_LOW: f32 = -87.0;
pub(crate) const EXP_HIGH: f32 = 88.0;
/// exp(r) ≈ 1 + r + r² · P(r) on |r| ≤ ln 2 / 2 (Cephes' expf).
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// `e^x` by range reduction and a polynomial: the same bits in every lane of
/// every instruction set (within about 2 ulp of the true value; 0 for
/// `-inf`).
#[inline]
pub(crate) fn exp(x: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        return 0.0;
    }
    // `max` then `min`, as the vector paths do (`clamp` differs for NaN).
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

    #[test]
    fn lane_sum_adds_halves_in_a_tree() {
        let v: [f32; LANES] = std::array::from_fn(|l| l as f32);
        assert_eq!(lane_sum(v), 120.0);
        // 1e8 + 1 rounds the 1 away when the large lanes meet first.
        let mut v = [0.0; LANES];
        v[0] = 1e8;
        v[8] = -1e8;
        v[1] = 1.0;
        assert_eq!(lane_sum(v), 1.0);
    }
}
