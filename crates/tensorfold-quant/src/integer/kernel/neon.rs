//! The NEON kernel (aarch64, with the dot-product instructions): the dot of
//! [`super::reference`].

use super::{combine, Operands, Packing, Rows, BLOCK, SPAN, SUMS};
use std::arch::aarch64::*;

/// `acc` plus, per lane, the exact sum of the four products of that
/// lane's bytes of `a` and `b` (SDOT; the intrinsic is not stable, the
/// instruction is).
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: SDOT reads and writes only these registers, and this
    // function runs only where the dot-product extension is.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

/// The integer and float parts of [`super::reference`] for `R x W`
/// dots, two blocks (four half blocks, four running sums) at a time:
/// one SDOT a half block gives four lanes, which two pairwise adds
/// (exact) fold into the four half blocks' sums, in order.
///
/// # Safety
/// NEON and the dot-product extension must be available.
#[target_feature(enable = "neon,dotprod")]
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
    assert_eq!(packing, Packing::Bytes, "NEON reads unpacked values");
    let zero = vdupq_n_s32(0);
    // Running sums `4 q..4 q + 4` of each (input row, weight row).
    let mut acc = [[[vdupq_n_f32(0.0); 4]; W]; R];
    // Blocks `b` and, where `pair`, `b + 1` into sums `quarter` (a
    // macro: a constant quarter keeps the sums in registers). A missing
    // odd block adds nothing: its factors and sums are zero, and
    // `fma(0, 0, s)` is `s` (a running sum is never `-0`).
    macro_rules! step {
        ($b:expr, $pair:expr, $quarter:expr) => {{
            let b = $b;
            let n = 1 + $pair as usize;
            let mut xv = [[vdupq_n_s8(0); 4]; R];
            let mut x_factors = [vdupq_n_f32(0.0); R];
            for r in 0..R {
                for h in 0..2 * n {
                    // SAFETY: half `h` of blocks `b..b + n` of input
                    // row `r < R`, checked in `Rows::new`.
                    xv[r][h] = unsafe { vld1q_s8(x.add(r * cols + b * BLOCK + h * 16)) };
                }
                let even = x_scales[r * blocks + b];
                let odd = if $pair {
                    x_scales[r * blocks + b + 1]
                } else {
                    0.0
                };
                x_factors[r] = vcombine_f32(vdup_n_f32(even), vdup_n_f32(odd));
            }
            for j in 0..W {
                let mut wv = [vdupq_n_s8(0); 4];
                for h in 0..2 * n {
                    let (block, half) = (b + h / 2, h % 2);
                    // SAFETY: half `half` of block `block` of weight row
                    // `j < W`, checked in `Rows::new`.
                    wv[h] = unsafe {
                        vld1q_s8(w.add(j * row_stride + block * block_stride + half * 16))
                    };
                }
                let h = &half_scales[j * 2 * blocks + 2 * b..][..2 * n];
                let mut w_scales = [0f32; 4];
                w_scales[..2 * n].copy_from_slice(h);
                // SAFETY: `w_scales` holds four floats.
                let w_factors = unsafe { vld1q_f32(w_scales.as_ptr()) };
                for r in 0..R {
                    let lanes: [int32x4_t; 4] = std::array::from_fn(|h| dot(zero, wv[h], xv[r][h]));
                    let sums = vpaddq_s32(
                        vpaddq_s32(lanes[0], lanes[1]),
                        vpaddq_s32(lanes[2], lanes[3]),
                    );
                    let factors = vmulq_f32(w_factors, x_factors[r]);
                    let running = &mut acc[r][j][$quarter];
                    *running = vfmaq_f32(*running, factors, vcvtq_f32_s32(sums));
                }
            }
        }};
    }
    let mut b = 0;
    while b + SPAN <= blocks {
        step!(b, true, 0);
        step!(b + 2, true, 1);
        step!(b + 4, true, 2);
        step!(b + 6, true, 3);
        b += SPAN;
    }
    // The last span's blocks, their quarter read at run time.
    while b < blocks {
        let pair = b + 1 < blocks;
        match ((b % SPAN) / 2, pair) {
            (0, true) => step!(b, true, 0),
            (1, true) => step!(b, true, 1),
            (2, true) => step!(b, true, 2),
            (3, true) => step!(b, true, 3),
            (0, false) => step!(b, false, 0),
            (1, false) => step!(b, false, 1),
            (2, false) => step!(b, false, 2),
            _ => step!(b, false, 3),
        }
        b += 2;
    }
    let mut out = [[0f32; W]; R];
    for r in 0..R {
        for j in 0..W {
            let mut sums = [0f32; SUMS];
            for (q, quarter) in acc[r][j].iter().enumerate() {
                // SAFETY: `sums` holds sixteen floats.
                unsafe { vst1q_f32(sums.as_mut_ptr().add(4 * q), *quarter) };
            }
            out[r][j] = combine(&sums);
        }
    }
    out
}
