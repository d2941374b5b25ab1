//! The key/value cache of one sequence, with exact rollback and shared
//! prefixes.
//!
//! Keys and values are stored per layer in fixed blocks of [`BLOCK`]
//! positions counted from position 0, as integers with one scale per
//! position and key/value head: keys 16-bit (split in two bytes), values
//! 8-bit, rounded once, when the forward appends them (see [`block`]).
//! Inside a block each key/value head's data lies together, in the layouts
//! attention's tile multiplies read.
//!
//! Blocks are reference counted: a cache made from another's prefix
//! ([`KvCache::clone_prefix`]) shares its blocks, and a block is copied only
//! when a holder writes into a shared one (copy on write). Rolling back
//! (after rejected drafts) only shortens the sequence: what stays is
//! untouched, so a rolled-back cache is bitwise the cache that never saw the
//! rejected positions.

pub mod block;

pub use block::{HeadBlock, KvBlock};
use std::sync::Arc;

/// Positions one block holds.
pub const BLOCK: usize = 64;

/// Positions a cache grows by when it is full: one block.
pub const GROWTH: usize = BLOCK;

/// A value row's stored width is a multiple of this many dimensions (zeros
/// after the head dimension), so attention reads whole tiles.
pub const VALUE_LANES: usize = block::VALUE_GROUP;

// The trait lives with the forward interface (`tensorfold-forward`); it is
// named here too, beside the cache that implements it.
pub use tensorfold_forward::Cache;

impl Cache for KvCache {
    fn len(&self) -> usize {
        KvCache::len(self)
    }
    fn truncate(&mut self, len: usize) {
        KvCache::truncate(self, len)
    }
    fn allocated_bytes(&self) -> usize {
        KvCache::allocated_bytes(self)
    }
}

/// Shape of what each position stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// `kv_heads * head_dim`: one position's keys (or values) in one layer.
    pub fn width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Bytes one position takes across all layers, keys and values, in
    /// f32: the most any device stores (the CUDA cache stores f16, the CPU
    /// cache 16-bit keys and 8-bit values).
    pub fn bytes_per_position(&self) -> usize {
        self.layers * self.width() * 2 * std::mem::size_of::<f32>()
    }

    /// Dimensions one stored value takes: the head dimension rounded up to
    /// [`VALUE_LANES`].
    pub fn value_stride(&self) -> usize {
        self.head_dim.next_multiple_of(VALUE_LANES)
    }

    /// Dimensions one stored key takes: the head dimension rounded up to
    /// [`block::KEY_TILE_DIMS`].
    pub fn key_dim(&self) -> usize {
        self.head_dim.next_multiple_of(block::KEY_TILE_DIMS)
    }

    /// Bytes one position takes in one layer's block: two bytes a key
    /// dimension, one a value dimension, a scale each, per key/value head.
    fn slot_bytes(&self) -> usize {
        let scales = 2 * std::mem::size_of::<f32>();
        self.kv_heads * (2 * self.key_dim() + self.value_stride() + scales)
    }

    /// Bytes one block of one layer takes.
    fn block_bytes(&self) -> usize {
        BLOCK * self.slot_bytes()
    }
}

/// The cache of one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    shape: KvShape,
    /// Each layer's blocks, position `p` in block `p / BLOCK`.
    layers: Vec<Vec<Arc<KvBlock>>>,
    len: usize,
}

impl KvCache {
    pub fn new(shape: KvShape) -> KvCache {
        KvCache::with_capacity(shape, 0)
    }

    /// A cache expecting `positions` (blocks are allocated as they fill).
    pub fn with_capacity(shape: KvShape, positions: usize) -> KvCache {
        let blocks = positions.div_ceil(BLOCK);
        KvCache {
            shape,
            layers: (0..shape.layers)
                .map(|_| Vec::with_capacity(blocks))
                .collect(),
            len: 0,
        }
    }

    pub fn shape(&self) -> KvShape {
        self.shape
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `k` and `v` (each `n * width`) for `layer` at positions
    /// `len..len + n`. Layers are appended in order; the last layer's
    /// append advances the length.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let w = self.shape.width();
        debug_assert_eq!(k.len() % w, 0);
        debug_assert_eq!(k.len(), v.len());
        let blocks = &mut self.layers[layer];
        debug_assert!(
            blocks.len() * BLOCK >= self.len && blocks.len() <= self.len.div_ceil(BLOCK),
            "layers append in order"
        );
        for (i, (k, v)) in k.chunks_exact(w).zip(v.chunks_exact(w)).enumerate() {
            let pos = self.len + i;
            if pos / BLOCK == blocks.len() {
                blocks.push(Arc::new(KvBlock::new(self.shape)));
            }
            // A block still shared with another cache is copied first.
            Arc::make_mut(&mut blocks[pos / BLOCK]).write(pos % BLOCK, k, v);
        }
        if layer + 1 == self.shape.layers {
            self.len += k.len() / w;
        }
    }

    /// The blocks of `layer` holding positions `0..n`, where `n` counts
    /// what that layer holds (within a forward, earlier layers are ahead).
    pub fn blocks(&self, layer: usize) -> &[Arc<KvBlock>] {
        &self.layers[layer]
    }

    /// Drops every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for blocks in &mut self.layers {
            blocks.truncate(len.div_ceil(BLOCK));
        }
        self.len = len;
    }

    /// A new cache holding this one's first `len` positions, expecting
    /// `capacity`: a retained prefix handed to a new sequence. The blocks
    /// are shared, not copied; the first write into a shared one copies
    /// that block alone.
    pub fn clone_prefix(&self, len: usize, capacity: usize) -> KvCache {
        let len = len.min(self.len);
        let blocks = capacity.max(len).div_ceil(BLOCK);
        let layers = self
            .layers
            .iter()
            .map(|held| {
                let mut shared = Vec::with_capacity(blocks);
                shared.extend(held[..len.div_ceil(BLOCK)].iter().cloned());
                shared
            })
            .collect();
        KvCache {
            shape: self.shape,
            layers,
            len,
        }
    }

    /// Releases room beyond the stored positions (a cache kept for reuse).
    pub fn shrink_to_fit(&mut self) {
        for blocks in &mut self.layers {
            blocks.shrink_to_fit();
        }
    }

    /// Bytes held by stored positions.
    pub fn bytes(&self) -> usize {
        self.len * self.shape.layers * self.shape.slot_bytes()
    }

    /// Bytes allocated, stored or not. A block shared with other caches is
    /// counted by each of them (an upper bound on what they hold together).
    pub fn allocated_bytes(&self) -> usize {
        let blocks: usize = self.layers.iter().map(Vec::len).sum();
        blocks * self.shape.block_bytes()
    }

    /// Blocks this cache shares with another cache (for accounting and tests).
    pub fn shared_blocks(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .filter(|b| Arc::strong_count(b) > 1)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: KvShape = KvShape {
        layers: 2,
        kv_heads: 2,
        head_dim: 3,
    };

    /// Position `p`'s keys and values in every layer: distinct.
    fn row(p: usize) -> (Vec<f32>, Vec<f32>) {
        let k = (0..6).map(|i| (p * 8 + i) as f32).collect();
        let v = (0..6).map(|i| -((p * 8 + i) as f32)).collect();
        (k, v)
    }

    fn filled(n: usize) -> KvCache {
        let mut c = KvCache::new(SHAPE);
        append(&mut c, 0..n);
        c
    }

    fn append(c: &mut KvCache, positions: std::ops::Range<usize>) {
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for p in positions {
            let (pk, pv) = row(p);
            k.extend(pk);
            v.extend(pv);
        }
        for l in 0..SHAPE.layers {
            c.append(l, &k, &v);
        }
    }

    /// Position `p` of `layer`, read back in f32: (keys, values).
    fn read(c: &KvCache, layer: usize, p: usize) -> (Vec<f32>, Vec<f32>) {
        let b = &c.blocks(layer)[p / BLOCK];
        let (mut k, mut v) = (Vec::new(), Vec::new());
        let slot = p % BLOCK;
        for head in 0..SHAPE.kv_heads {
            let stored = b.head(head);
            k.extend(stored.key(slot, SHAPE.head_dim));
            v.extend(stored.value(slot, SHAPE.head_dim));
            // The padding after the head dimension holds zeros.
            let (kd, vd) = (SHAPE.key_dim(), SHAPE.value_stride());
            assert!((SHAPE.head_dim..kd).all(|d| {
                let at = HeadBlock::key_at(kd, slot, d);
                stored.key_high[at] == 0 && stored.key_low[at] == 0
            }));
            assert!((SHAPE.head_dim..vd).all(|d| stored.values[HeadBlock::value_at(slot, d)] == 0));
        }
        (k, v)
    }

    /// `stored` is `x` rounded to `levels` steps of each head's largest
    /// magnitude: within half a step of it (and the scale's own rounding).
    fn close(stored: &[f32], x: &[f32], levels: f32) -> bool {
        stored
            .chunks(SHAPE.head_dim)
            .zip(x.chunks(SHAPE.head_dim))
            .all(|(s, x)| {
                let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let bound = max / levels * 0.5 + max * 1e-6;
                s.iter().zip(x).all(|(s, x)| (s - x).abs() <= bound)
            })
    }

    fn assert_position(c: &KvCache, layer: usize, p: usize, (k, v): (Vec<f32>, Vec<f32>)) {
        let (keys, values) = read(c, layer, p);
        assert!(
            close(&keys, &k, block::KEY_LEVELS),
            "layer {layer} position {p}: {keys:?}"
        );
        assert!(
            close(&values, &v, block::VALUE_LEVELS),
            "layer {layer} position {p}: {values:?}"
        );
    }

    fn assert_holds(c: &KvCache, n: usize) {
        assert_eq!(c.len(), n);
        for l in 0..SHAPE.layers {
            assert_eq!(c.blocks(l).len(), n.div_ceil(BLOCK));
            for p in 0..n {
                assert_position(c, l, p, row(p));
            }
        }
    }

    #[test]
    fn positions_read_back_across_block_boundaries() {
        let c = filled(2 * BLOCK + 5);
        assert_holds(&c, 2 * BLOCK + 5);
        // Per position, layer and head: 64 key dimensions of two bytes, 16
        // value bytes, two scales.
        assert_eq!(c.bytes(), (2 * BLOCK + 5) * 2 * 2 * (2 * 64 + 16 + 8));
        assert_eq!(c.allocated_bytes(), 3 * 2 * SHAPE.block_bytes());
    }

    #[test]
    fn a_stored_position_depends_on_its_own_numbers_alone() {
        // The same position written beside different neighbours stores
        // the same bytes and scales.
        let mut a = filled(3);
        let mut b = KvCache::new(SHAPE);
        append(&mut b, 0..1);
        let (k, v) = (vec![1e4; 6], vec![-3.0; 6]);
        for l in 0..SHAPE.layers {
            b.append(l, &k, &v);
        }
        append(&mut b, 2..3);
        a.truncate(3);
        for p in [0, 2] {
            assert_eq!(read(&a, 0, p), read(&b, 0, p));
        }
    }

    #[test]
    fn appending_in_pieces_stores_what_one_append_stores() {
        let mut c = KvCache::new(SHAPE);
        for range in [0..1, 1..BLOCK - 1, BLOCK - 1..BLOCK + 2, BLOCK + 2..150] {
            append(&mut c, range);
        }
        assert_holds(&c, 150);
    }

    #[test]
    fn truncate_restores_the_shorter_cache_exactly() {
        let mut a = filled(BLOCK + 3);
        a.truncate(BLOCK - 2);
        assert_holds(&a, BLOCK - 2);
        append(&mut a, BLOCK - 2..BLOCK + 10);
        assert_holds(&a, BLOCK + 10);
        a.truncate(200);
        assert_eq!(a.len(), BLOCK + 10);
    }

    #[test]
    fn a_cloned_prefix_shares_blocks_and_copies_only_on_write() {
        let full = filled(3 * BLOCK + 7);
        let mut copy = full.clone_prefix(2 * BLOCK + 4, 400);
        assert_holds(&copy, 2 * BLOCK + 4);
        assert_eq!(copy.shared_blocks(), 3 * SHAPE.layers);
        // Extending the copy writes into its last, shared block: that block
        // alone is copied, and the original is untouched.
        let (mut k, mut v) = (vec![0.5; 6], vec![0.25; 6]);
        for l in 0..SHAPE.layers {
            copy.append(l, &k, &v);
        }
        assert_eq!(copy.shared_blocks(), 2 * SHAPE.layers);
        assert_holds(&full, 3 * BLOCK + 7);
        assert_position(&copy, 1, 2 * BLOCK + 4, (k.clone(), v.clone()));
        // Writes into an unshared block stay in place.
        k.fill(2.0);
        v.fill(4.0);
        for l in 0..SHAPE.layers {
            copy.append(l, &k, &v);
        }
        assert_position(&copy, 0, 2 * BLOCK + 5, (k, v));
        assert_eq!(copy.shared_blocks(), 2 * SHAPE.layers);
        drop(full);
        assert_eq!(copy.shared_blocks(), 0);
    }
}
