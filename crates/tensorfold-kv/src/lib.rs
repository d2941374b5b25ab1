//! The key/value cache of one sequence, with exact rollback and shared
//! prefixes.
//!
//! Keys and values are stored per layer in fixed blocks of [`BLOCK`]
//! positions counted from position 0, as f16 (rounded to nearest once, when
//! the forward appends them; beyond f16's range they saturate). Inside a
//! block each key/value head's data lies together. Keys are laid out
//! dimension after dimension (`[kv_head][dim][slot]`), so one load holds one
//! dimension of many keys and attention scores many keys per instruction;
//! values slot after slot (`[kv_head][slot][dim]`, each row padded with zeros
//! to [`VALUE_LANES`]), so one load holds many dimensions of one value.
//!
//! Blocks are reference counted: a cache made from another's prefix
//! ([`KvCache::clone_prefix`]) shares its blocks, and a block is copied only
//! when a holder writes into a shared one (copy on write). Rolling back
//! (after rejected drafts) only shortens the sequence: what stays is
//! untouched, so a rolled-back cache is bitwise the cache that never saw the
//! rejected positions.

use half::f16;
use std::sync::Arc;

/// Positions one block holds.
pub const BLOCK: usize = 64;

/// Positions a cache grows by when it is full: one block.
pub const GROWTH: usize = BLOCK;

/// A value row's stored width is a multiple of this many halves (zeros
/// after the head dimension), so attention reads whole vectors.
pub const VALUE_LANES: usize = 16;

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
    /// f32: the most any device stores (the CPU and CUDA caches store half
    /// of it).
    pub fn bytes_per_position(&self) -> usize {
        self.layers * self.width() * 2 * std::mem::size_of::<f32>()
    }

    /// Halves one stored value row takes: the head dimension rounded up to
    /// [`VALUE_LANES`].
    pub fn value_stride(&self) -> usize {
        self.head_dim.next_multiple_of(VALUE_LANES)
    }

    /// Bytes one block of one layer takes (keys and values, f16).
    fn block_bytes(&self) -> usize {
        BLOCK * self.kv_heads * (self.head_dim + self.value_stride()) * std::mem::size_of::<f16>()
    }
}

/// [`BLOCK`] positions of one layer: per key/value head, its keys
/// `[dim][slot]` and its values `[slot][dim]` (rows of
/// [`KvShape::value_stride`]).
#[derive(Debug, Clone)]
pub struct KvBlock {
    keys: Vec<f16>,
    values: Vec<f16>,
    head_dim: usize,
    value_stride: usize,
}

impl KvBlock {
    fn new(shape: KvShape) -> KvBlock {
        KvBlock {
            keys: vec![f16::ZERO; BLOCK * shape.width()],
            values: vec![f16::ZERO; BLOCK * shape.kv_heads * shape.value_stride()],
            head_dim: shape.head_dim,
            value_stride: shape.value_stride(),
        }
    }

    /// Keys of `kv_head`, `head_dim * BLOCK`: dimension `d` of slot `s` at
    /// `d * BLOCK + s` (slots past the cache's length hold nothing
    /// meaningful).
    pub fn keys(&self, kv_head: usize) -> &[f16] {
        &self.keys[kv_head * BLOCK * self.head_dim..][..BLOCK * self.head_dim]
    }

    /// Values of `kv_head`, `BLOCK * value_stride`: slot `s` at
    /// `s * value_stride`, zeros after its `head_dim` values.
    pub fn values(&self, kv_head: usize) -> &[f16] {
        &self.values[kv_head * BLOCK * self.value_stride..][..BLOCK * self.value_stride]
    }

    /// Halves between two slots' values.
    pub fn value_stride(&self) -> usize {
        self.value_stride
    }

    /// Stores one position's keys and values (`width` each) at `slot`.
    fn write(&mut self, slot: usize, k: &[f32], v: &[f32]) {
        let (hd, stride) = (self.head_dim, self.value_stride);
        for (head, (k, v)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
            let keys = &mut self.keys[head * BLOCK * hd..][..BLOCK * hd];
            for (d, src) in k.iter().enumerate() {
                keys[d * BLOCK + slot] = half(*src);
            }
            let at = (head * BLOCK + slot) * stride;
            for (dst, src) in self.values[at..at + hd].iter_mut().zip(v) {
                *dst = half(*src);
            }
        }
    }
}

/// `x` rounded to the nearest f16, saturating at f16's largest finite
/// values: a stored value is always finite, so a weight of exactly zero
/// leaves a sum unchanged.
fn half(x: f32) -> f16 {
    let h = f16::from_f32(x);
    if h.is_infinite() {
        f16::MAX.copysign(h)
    } else {
        h
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
        self.len * self.shape.layers * self.shape.width() * 2 * std::mem::size_of::<f16>()
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

    /// Position `p`'s keys and values in every layer: distinct, exact in f16.
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
            let keys = b.keys(head);
            k.extend((0..SHAPE.head_dim).map(|d| keys[d * BLOCK + slot].to_f32()));
            let values = &b.values(head)[slot * b.value_stride()..][..b.value_stride()];
            assert!(values[SHAPE.head_dim..].iter().all(|x| *x == f16::ZERO));
            v.extend(values[..SHAPE.head_dim].iter().map(|x| x.to_f32()));
        }
        (k, v)
    }

    fn assert_holds(c: &KvCache, n: usize) {
        assert_eq!(c.len(), n);
        for l in 0..SHAPE.layers {
            assert_eq!(c.blocks(l).len(), n.div_ceil(BLOCK));
            for p in 0..n {
                assert_eq!(read(c, l, p), row(p), "layer {l} position {p}");
            }
        }
    }

    #[test]
    fn positions_read_back_across_block_boundaries() {
        let c = filled(2 * BLOCK + 5);
        assert_holds(&c, 2 * BLOCK + 5);
        assert_eq!(c.bytes(), (2 * BLOCK + 5) * 2 * 6 * 2 * 2);
        assert_eq!(c.allocated_bytes(), 3 * 2 * SHAPE.block_bytes());
    }

    #[test]
    fn values_beyond_f16_saturate_to_its_largest_finite() {
        let mut c = KvCache::new(SHAPE);
        let (k, v) = ([1e6, -1e6, 0.5, 7.0, 1e-9, -70000.0], [-1e9; 6]);
        for l in 0..SHAPE.layers {
            c.append(l, &k, &v);
        }
        let (keys, values) = read(&c, 0, 0);
        assert_eq!(keys, [65504.0, -65504.0, 0.5, 7.0, 0.0, -65504.0]);
        assert_eq!(values, [-65504.0; 6]);
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
        assert_eq!(read(&copy, 1, 2 * BLOCK + 4), (k.clone(), v.clone()));
        // Writes into an unshared block stay in place.
        k.fill(2.0);
        v.fill(4.0);
        for l in 0..SHAPE.layers {
            copy.append(l, &k, &v);
        }
        assert_eq!(read(&copy, 0, 2 * BLOCK + 5), (k, v));
        assert_eq!(copy.shared_blocks(), 2 * SHAPE.layers);
        drop(full);
        assert_eq!(copy.shared_blocks(), 0);
    }
}
