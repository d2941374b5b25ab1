//! Launch geometry of the tensor-core attention (`attention_tc_<hd>` in
//! `kernels/cuda/attention.cu`). None of it changes a row's bits: a slot's
//! partials depend on its query and key block alone, whatever tile or
//! warp computes them, and are folded in block order.

/// Head dimensions with a tensor-core kernel; other widths take the f32
/// kernels of `ops.cu`.
pub(crate) const HEAD_DIMS: [usize; 5] = [16, 32, 64, 96, 128];
/// Keys per block (`TF_TC_KEYS`) and floats of padding after each staged
/// row (`TF_TC_PAD`).
const KEYS: usize = 64;
const PAD: usize = 8;
/// Warps of a block: at least `TF_TC_MIN_WARPS` (each warp keeps at most
/// a quarter of the output's column tiles), at most the launch bound.
const MIN_WARPS: usize = 4;
const MAX_WARPS: usize = 8;
/// Shared memory a block may take.
const SHARED_MAX: usize = 200 << 10;
/// Slots of a warp's tile: (row, query head) pairs, the rows of one mma.
const SLOTS: usize = 16;

/// The kernel's name for head dimension `hd`, if there is one.
pub(crate) fn kernel(hd: usize) -> Option<String> {
    HEAD_DIMS
        .contains(&hd)
        .then(|| format!("attention_tc_{hd}"))
}

/// Shared memory of one warp: a staged key block and a partial (16 rows,
/// then 16 maxima and 16 sums).
fn warp_bytes(hd: usize) -> usize {
    4 * (KEYS * (hd + PAD) + SLOTS * (hd + PAD) + 2 * SLOTS)
}

/// Warps of a block for head dimension `hd`: as many as shared memory
/// holds, up to the launch bound.
pub(crate) fn warps(hd: usize) -> usize {
    (SHARED_MAX / warp_bytes(hd)).clamp(MIN_WARPS, MAX_WARPS)
}

/// Dynamic shared memory of a block.
pub(crate) fn shared(hd: usize) -> usize {
    warps(hd) * warp_bytes(hd)
}

/// `(rows, heads)` of a tile: the query heads a divisor of the heads per
/// kv head (`group`), at most 16, and as many rows as fill the tile's 16
/// slots; one row a tile when rows are few or of many sequences (decode
/// of several streams), so that there are blocks enough and no tile mixes
/// sequences.
pub(crate) fn tile(m: usize, sequences: usize, group: usize) -> (usize, usize) {
    let heads = (1..=group.min(SLOTS))
        .rev()
        .find(|h| group.is_multiple_of(*h))
        .unwrap_or(1);
    let rows = if m < SLOTS || 4 * sequences > m {
        1
    } else {
        SLOTS / heads
    };
    (rows.min(m).max(1), heads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_fit_the_kernel() {
        for hd in HEAD_DIMS {
            let w = warps(hd);
            assert!((MIN_WARPS..=MAX_WARPS).contains(&w), "hd {hd}: {w} warps");
            assert!(shared(hd) <= SHARED_MAX);
        }
        assert!(kernel(80).is_none() && kernel(4).is_none());
    }

    #[test]
    fn tiles_hold_whole_groups_in_16_slots() {
        for group in 1..=20 {
            for (m, seqs) in [(1, 1), (5, 1), (16, 16), (100, 1), (256, 2), (1000, 3)] {
                let (rows, heads) = tile(m, seqs, group);
                assert!(group.is_multiple_of(heads) && heads <= SLOTS);
                assert!(
                    rows >= 1 && rows <= m && rows * heads <= SLOTS,
                    "{m} {group}"
                );
            }
        }
        assert_eq!(tile(256, 1, 4), (4, 4));
        assert_eq!(tile(16, 16, 4), (1, 4));
    }
}
