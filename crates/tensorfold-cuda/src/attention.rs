//! Launch geometry of the tensor-core attention (`attention_tc_<hd>` in
//! `kernels/cuda/attention.cu`). None of it changes a row's bits: a slot's
//! partials depend on its query and key block alone, whatever tile or
//! warp computes them, and are folded in block order, by the block that
//! computed them (fused) or by `attention_fold_<hd>` (split).

/// Head dimensions with a tensor-core kernel; other widths take the f32
/// kernels of `ops.cu`.
pub(crate) const HEAD_DIMS: [usize; 5] = [16, 32, 64, 96, 128];
/// Keys per block (`TF_TC_KEYS`) and elements of padding after each row
/// (`TF_TC_PAD`): halves after a staged key or value row, floats after a
/// partial's row.
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

/// Rows of a call at most for the split form: bounds the partials it
/// keeps in global memory.
pub(crate) const SPLIT_ROWS: usize = 16;
/// One-warp blocks per multiprocessor the split form aims for: several
/// blocks' copies in flight on each, where one fused block would wait on
/// its own.
const SPLIT_BLOCKS_PER_MULTIPROCESSOR: usize = 8;

/// The kernels' names for head dimension `hd`, if there are some: the
/// attention and the fold of its split form.
pub(crate) fn kernels(hd: usize) -> Option<(String, String)> {
    HEAD_DIMS
        .contains(&hd)
        .then(|| (format!("attention_tc_{hd}"), format!("attention_fold_{hd}")))
}

/// Blocks that share each tile's key blocks: 1 (the fused form) unless
/// the call has at most [`SPLIT_ROWS`] rows and its `tiles` leave
/// multiprocessors idle over `key_blocks` (the most any row reads,
/// rounded up to a power of two so that a captured graph serves a range
/// of depths). Then the split form, with one-warp blocks, at most one per
/// key block.
pub(crate) fn splits(m: usize, tiles: usize, key_blocks: usize, multiprocessors: usize) -> usize {
    if m > SPLIT_ROWS {
        return 1;
    }
    let wanted = (SPLIT_BLOCKS_PER_MULTIPROCESSOR * multiprocessors).div_ceil(tiles.max(1));
    let splits = wanted.min(key_blocks.next_power_of_two());
    // Split into one block's worth of warps or fewer: the fused form does
    // as well.
    if splits <= MIN_WARPS {
        1
    } else {
        splits
    }
}

/// Key blocks (of [`KEYS`] positions) covering `positions`.
pub(crate) fn key_blocks(positions: usize) -> usize {
    positions.div_ceil(KEYS)
}

/// Shared memory of one warp: a staged key block (f16, as cached) and a
/// partial (16 rows, then 16 maxima and 16 sums, f32).
fn warp_bytes(hd: usize) -> usize {
    2 * KEYS * (hd + PAD) + 4 * (SLOTS * (hd + PAD) + 2 * SLOTS)
}

/// Warps of a block for head dimension `hd`: as many as shared memory
/// holds, up to the launch bound.
pub(crate) fn warps(hd: usize) -> usize {
    (SHARED_MAX / warp_bytes(hd)).clamp(MIN_WARPS, MAX_WARPS)
}

/// Dynamic shared memory of a block of the fused form.
pub(crate) fn shared(hd: usize) -> usize {
    warps(hd) * warp_bytes(hd)
}

/// Dynamic shared memory of a one-warp block of the split form.
pub(crate) fn split_shared(hd: usize) -> usize {
    warp_bytes(hd)
}

/// Floats of the split form's partials for `rows` rows of `heads` query
/// heads over `key_blocks` key blocks: each slot's value sums, then its
/// maximum and sum, per key block.
pub(crate) fn partial_floats(rows: usize, heads: usize, key_blocks: usize, hd: usize) -> usize {
    rows * heads * key_blocks * (hd + 2)
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
        assert!(kernels(80).is_none() && kernels(4).is_none());
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

    #[test]
    fn splits_only_few_rows_over_many_key_blocks() {
        // One decode row of an 8B shape (8 tiles) at 8k: 128 key blocks.
        assert_eq!(splits(1, 8, 128, 132), 128);
        assert_eq!(splits(1, 8, 4096, 132), 132);
        // Short contexts and many rows stay fused.
        assert_eq!(splits(1, 8, 2, 132), 1);
        assert_eq!(splits(64, 512, 128, 132), 1);
        for m in 1..=SPLIT_ROWS {
            for blocks in [1, 3, 64, 1000] {
                let s = splits(m, m * 8, blocks, 132);
                assert!(s == 1 || (s > MIN_WARPS && s <= blocks.next_power_of_two()));
            }
        }
    }
}
