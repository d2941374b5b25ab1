//! Launch geometry of the f32 attention kernels of `kernels/cuda/ops.cu`,
//! which head dimensions without a tensor-core kernel take (see
//! `attention.rs` for those).

use crate::kv::KV_BYTES;

/// Warps of one attention block at most: (rows, query head) pairs sharing
/// each staged key block.
pub(crate) const ATTENTION_WARPS: usize = 16;
/// Rows an `attention` warp takes (`TF_ATT_ROWS`).
pub(crate) const ATTENTION_ROWS: usize = 2;
/// Head dimensions the `_128` attention kernels serve (half the value
/// registers); wider heads, up to 256, take the others.
pub(crate) const NARROW_HEADS: usize = 128;
/// Keys per attention block (`TF_KEY_BLOCK`) and the padding between
/// staged keys (`TF_KEY_PAD`, in halves).
pub(crate) const KEY_BLOCK: usize = 64;
pub(crate) const KEY_PAD: usize = 4;
/// Rows from which attention stages key blocks in shared memory.
pub(crate) const STAGE_KEYS_FROM: usize = 16;

/// Dynamic shared memory of an attention block: one staged block of keys
/// and one of values (f16, as cached), and every warp's queries (f32).
pub(crate) fn attention_shared(head_dim: usize, warps: usize) -> usize {
    KV_BYTES * 2 * KEY_BLOCK * (head_dim + KEY_PAD) + 4 * ATTENTION_ROWS * warps * head_dim
}

/// Warps of an `attention_split` block, each taking one key block of a
/// round.
pub(crate) const SPLIT_WARPS: usize = 16;

/// Whether attention spreads each (row, head) over a block of warps
/// (`attention_split`) rather than giving it one warp: for few rows, or
/// rows of many sequences (decode of several streams), where one warp per
/// pair leaves the GPU idle and there are no shared keys to stage. Both
/// kernels compute the same partials and fold them in the same order.
pub(crate) fn split_attention(rows: usize, sequences: usize) -> bool {
    rows < STAGE_KEYS_FROM || 4 * sequences > rows
}

/// Dynamic shared memory of an `attention_split` block: the query and a
/// round of partials.
pub(crate) fn split_shared(head_dim: usize) -> usize {
    4 * (head_dim + SPLIT_WARPS * (head_dim + 2))
}

/// How an attention launch groups (row, query head) pairs into blocks:
/// `(rows, heads)` per block, the heads a divisor of the query heads per kv
/// head so that a block reads one kv head's keys; a block has
/// `rows.div_ceil(ATTENTION_ROWS) * heads` warps, at most
/// ATTENTION_WARPS.
pub(crate) fn attention_tile(m: usize, group: usize) -> (usize, usize) {
    let heads = (1..=group.min(ATTENTION_WARPS))
        .rev()
        .find(|h| group.is_multiple_of(*h))
        .unwrap_or(1);
    (
        (ATTENTION_ROWS * (ATTENTION_WARPS / heads)).min(m).max(1),
        heads,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every attention launch stays within the kernels' 16 warps and the
    /// shared memory allowed at load, and gives each block whole kv-head
    /// groups, for any row count.
    #[test]
    fn attention_blocks_fit_their_kernel() {
        for head_dim in [64, 96, 128, 160, 256] {
            for group in 1..=16 {
                for m in [1, 3, 16, 17, 100, 256, 1000] {
                    let (rows, heads) = attention_tile(m, group);
                    let warps = rows.div_ceil(ATTENTION_ROWS) * heads;
                    assert!(
                        warps <= ATTENTION_WARPS,
                        "hd {head_dim} group {group} m {m}"
                    );
                    assert!(rows >= 1 && rows <= m && group % heads == 0);
                    let widest = if head_dim <= NARROW_HEADS {
                        NARROW_HEADS
                    } else {
                        256
                    };
                    assert!(
                        attention_shared(head_dim, warps)
                            <= attention_shared(widest, ATTENTION_WARPS)
                    );
                }
            }
        }
    }
}
