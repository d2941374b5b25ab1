//! The exact integer sums of attention over one key block, for up to
//! [`ROWS`] queries at once: scores and weighted values. Integer sums do
//! not depend on their order, so the tile unit and the portable loops give
//! the same numbers, and a row's sums never depend on the other rows.
//!
//! A score is `256·Σ_d qh·kh + Σ_d (qh·kl + ql·kh)` over the high (`h`) and
//! low (`l`) bytes of the 16-bit query and key (the low-by-low products,
//! below a 16-bit step of the result, are left out); a value sum is
//! `Σ_s (256·wh + wl)·v` over the block's slots. Both fit in i32 for head
//! dimensions up to [`MAX_KEY_DIM`].

use super::quantize::{QueryTile, WeightTile, ROWS};
use tensorfold_kv::block::{HeadBlock, KEY_GROUP, VALUE_GROUP};
use tensorfold_kv::BLOCK;

/// Widest stored key whose score sums fit in i32: 256·dims·127² plus the
/// cross terms stays below 2³¹.
pub(crate) const MAX_KEY_DIM: usize = 256;

/// Where the sums are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sums {
    Portable,
    /// The tile unit (AMX), where the CPU has it and the OS grants it.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    Tiles,
}

impl Sums {
    /// Every way this CPU computes them, the portable one first.
    #[cfg(test)]
    pub fn available() -> Vec<Sums> {
        let mut all = vec![Sums::Portable];
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        if super::amx::available() {
            all.push(Sums::Tiles);
        }
        all
    }

    /// The fastest this CPU has (`TENSORFOLD_CPU_KERNELS=portable` or
    /// `avx2` keep the portable loops).
    pub fn detect() -> Sums {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        {
            let wanted = std::env::var("TENSORFOLD_CPU_KERNELS").unwrap_or_default();
            if wanted != "portable" && wanted != "avx2" && super::amx::available() {
                return Sums::Tiles;
            }
        }
        Sums::Portable
    }
}

/// Integer scores of a tile's queries against a block's keys: `[ROWS][BLOCK]`.
pub(crate) type ScoreSums = [[i32; BLOCK]; ROWS];

/// Scores of `queries` against every slot of `head`.
#[inline(always)]
pub(crate) fn scores_portable(queries: &QueryTile, head: &HeadBlock, out: &mut ScoreSums) {
    let kd = queries.key_dim;
    assert_eq!(kd, head.key_dim);
    for (r, row) in out.iter_mut().enumerate() {
        let (qh, ql) = (&queries.high[r * kd..][..kd], &queries.low[r * kd..][..kd]);
        for group in 0..BLOCK / KEY_GROUP {
            let mut high = [0i32; KEY_GROUP];
            let mut cross = [0i32; KEY_GROUP];
            for quad in 0..kd / 4 {
                let at = (group * (kd / 4) + quad) * KEY_GROUP * 4;
                let (kh, kl) = (
                    &head.key_high[at..][..KEY_GROUP * 4],
                    &head.key_low[at..][..KEY_GROUP * 4],
                );
                for n in 0..KEY_GROUP {
                    for c in 0..4 {
                        let d = quad * 4 + c;
                        let (a, b) = (qh[d] as i32, ql[d] as i32);
                        let (x, y) = (kh[n * 4 + c] as i32, kl[n * 4 + c] as i32);
                        high[n] += a * x;
                        cross[n] += a * y + b * x;
                    }
                }
            }
            for n in 0..KEY_GROUP {
                row[group * KEY_GROUP + n] = 256 * high[n] + cross[n];
            }
        }
    }
}

/// Weighted value sums of `weights` over `head`'s slots:
/// `out[r * value_dim + d]`.
#[inline(always)]
pub(crate) fn values_portable(weights: &WeightTile, head: &HeadBlock, out: &mut [i32]) {
    let vd = head.value_dim;
    assert_eq!(out.len(), ROWS * vd);
    for r in 0..ROWS {
        let w: [i32; BLOCK] =
            std::array::from_fn(|s| 256 * weights.high[r][s] as i32 + weights.low[r][s] as i32);
        for group in 0..vd / VALUE_GROUP {
            let mut sums = [0i32; VALUE_GROUP];
            for quad in 0..BLOCK / 4 {
                let at = (group * (BLOCK / 4) + quad) * VALUE_GROUP * 4;
                let v = &head.values[at..][..VALUE_GROUP * 4];
                for (m, sum) in sums.iter_mut().enumerate() {
                    for c in 0..4 {
                        *sum += w[quad * 4 + c] * v[m * 4 + c] as i32;
                    }
                }
            }
            out[r * vd + group * VALUE_GROUP..][..VALUE_GROUP].copy_from_slice(&sums);
        }
    }
}
