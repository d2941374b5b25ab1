//! `exp` and `ln` in f64 from additions, multiplications, divisions and
//! fused multiply-adds only: each is correctly rounded on every IEEE
//! device, so these give the same bits on the CPU (`f64::mul_add`) and in
//! CUDA (`fma`, `kernels/cuda/sampling.cu` mirrors this file), which libm's
//! functions do not promise.

/// 1/k! for k = 0..=13, correctly rounded.
const EXP_TAYLOR: [u64; 14] = [
    0x3ff0000000000000,
    0x3ff0000000000000,
    0x3fe0000000000000,
    0x3fc5555555555555,
    0x3fa5555555555555,
    0x3f81111111111111,
    0x3f56c16c16c16c17,
    0x3f2a01a01a01a01a,
    0x3efa01a01a01a01a,
    0x3ec71de3a556c734,
    0x3e927e4fb7789f5c,
    0x3e5ae64567f544e4,
    0x3e21eed8eff8d898,
    0x3de6124613a86d09,
];

/// 1/(2i+1) for i = 0..=11: the series of atanh.
const ATANH_SERIES: [u64; 12] = [
    0x3ff0000000000000,
    0x3fd5555555555555,
    0x3fc999999999999a,
    0x3fc2492492492492,
    0x3fbc71c71c71c71c,
    0x3fb745d1745d1746,
    0x3fb3b13b13b13b14,
    0x3fb1111111111111,
    0x3fae1e1e1e1e1e1e,
    0x3faaf286bca1af28,
    0x3fa8618618618618,
    0x3fa642c8590b2164,
];

const LOG2_E: f64 = f64::from_bits(0x3ff71547652b82fe);
/// ln 2 split so that `n * LN2_HI` is exact for |n| < 2^20.
const LN2_HI: f64 = f64::from_bits(0x3fe62e42fee00000);
const LN2_LO: f64 = f64::from_bits(0x3dea39ef35793c76);
const SQRT_2: f64 = f64::from_bits(0x3ff6a09e667f3bcd);

/// e^x. Below -708 (and for NaN) it is 0, above 709 infinite: the sampler
/// only takes `x <= 0`, where this is within a few ulps of the true value.
pub fn exp(x: f64) -> f64 {
    if x.is_nan() || x <= -708.0 {
        return 0.0;
    }
    if x > 709.0 {
        return f64::INFINITY;
    }
    let n = (x * LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = f64::from_bits(EXP_TAYLOR[13]);
    for &c in EXP_TAYLOR[..13].iter().rev() {
        p = p.mul_add(r, f64::from_bits(c));
    }
    p * f64::from_bits(((n as i64 + 1023) as u64) << 52)
}

/// ln y: -inf at 0, NaN below 0, within a few ulps elsewhere.
pub fn ln(y: f64) -> f64 {
    if y.is_nan() || y < 0.0 {
        return f64::NAN;
    }
    if y == 0.0 {
        return f64::NEG_INFINITY;
    }
    if y == f64::INFINITY {
        return y;
    }
    let (mut bits, mut e) = (y.to_bits(), -1023i64);
    if y < f64::MIN_POSITIVE {
        // Subnormal: scale into the normal range first (exact).
        bits = (y * f64::from_bits(0x4350000000000000)).to_bits();
        e -= 54;
    }
    e += (bits >> 52) as i64;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    // ln m = 2 atanh(f) with f = (m - 1) / (m + 1), |f| < 0.172.
    let f = (m - 1.0) / (m + 1.0);
    let s = f * f;
    let mut p = f64::from_bits(ATANH_SERIES[11]);
    for &c in ATANH_SERIES[..11].iter().rev() {
        p = p.mul_add(s, f64::from_bits(c));
    }
    let ln_m = (2.0 * f) * p;
    let e = e as f64;
    e.mul_add(LN2_HI, e.mul_add(LN2_LO, ln_m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f64, b: f64) -> u64 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn exp_is_close_to_libm_and_exact_at_zero() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp(-800.0), 0.0);
        let mut x = -707.9;
        while x <= 0.0 {
            assert!(ulps(exp(x), x.exp()) <= 4, "exp({x})");
            x += 0.0137;
        }
    }

    #[test]
    fn ln_is_close_to_libm() {
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(ln(0.0), f64::NEG_INFINITY);
        assert!(ln(-1.0).is_nan());
        for y in [
            1e-310,
            5e-324,
            2.2e-16,
            1e-5,
            0.3,
            std::f64::consts::FRAC_1_SQRT_2,
            0.999999,
            1.5,
            36.7,
            1e300,
        ] {
            let diff = (ln(y) - y.ln()).abs();
            assert!(
                diff <= 4.0 * f64::EPSILON * y.ln().abs().max(1e-300),
                "ln({y})"
            );
        }
        let mut y = 1e-6;
        while y < 40.0 {
            let diff = (ln(y) - y.ln()).abs();
            assert!(
                diff <= 4.0 * f64::EPSILON * y.ln().abs().max(1e-3),
                "ln({y})"
            );
            y *= 1.0173;
        }
    }
}
