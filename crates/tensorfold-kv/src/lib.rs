//! The key/value cache of one sequence, with exact rollback.
//!
//! Keys and values are stored per layer, position after position, exactly as
//! the forward produced them. Rolling back (after rejected drafts) only
//! shortens the sequence: what stays is untouched, so a rolled-back cache is
//! bitwise the cache that never saw the rejected positions.

/// Positions a cache grows by when it is full.
pub const GROWTH: usize = 64;

/// What the scheduler asks of one sequence's cache, on any device: how
/// many positions it holds, exact rollback, and what it occupies.
pub trait Cache {
    /// Positions held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Drops every position from `len` on.
    fn truncate(&mut self, len: usize);
    /// Bytes allocated, stored or not.
    fn allocated_bytes(&self) -> usize;
}

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
    /// `kv_heads * head_dim`.
    pub width: usize,
}

impl KvShape {
    /// Bytes one position takes across all layers (keys and values, f32).
    pub fn bytes_per_position(&self) -> usize {
        self.layers * self.width * 2 * std::mem::size_of::<f32>()
    }
}

/// The cache of one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    shape: KvShape,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
}

impl KvCache {
    pub fn new(shape: KvShape) -> KvCache {
        KvCache::with_capacity(shape, 0)
    }

    /// A cache with room for `positions` before it grows.
    pub fn with_capacity(shape: KvShape, positions: usize) -> KvCache {
        let room = || Vec::with_capacity(positions * shape.width);
        KvCache {
            shape,
            keys: (0..shape.layers).map(|_| room()).collect(),
            values: (0..shape.layers).map(|_| room()).collect(),
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

    /// Appends `k` and `v` (each `n * width`) for `layer`. Layers are
    /// appended in order; the last layer's append advances the length.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let w = self.shape.width;
        debug_assert_eq!(k.len() % w, 0);
        debug_assert_eq!(
            self.keys[layer].len(),
            self.len * w,
            "layers append in order"
        );
        // Grow in steps of `GROWTH` positions, never by doubling, so what a
        // cache holds stays within `GROWTH` positions of what it stores and
        // a memory budget can count it.
        if self.keys[layer].capacity() < self.keys[layer].len() + k.len() {
            let more = k.len().max(GROWTH * w);
            self.keys[layer].reserve_exact(more);
            self.values[layer].reserve_exact(more);
        }
        self.keys[layer].extend_from_slice(k);
        self.values[layer].extend_from_slice(v);
        if layer + 1 == self.shape.layers {
            self.len += k.len() / w;
        }
    }

    /// Keys of `layer` for positions `0..n` where `n` counts what that layer holds.
    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.keys[layer]
    }

    pub fn values(&self, layer: usize) -> &[f32] {
        &self.values[layer]
    }

    /// Drops every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let keep = len * self.shape.width;
        for l in 0..self.shape.layers {
            self.keys[l].truncate(keep);
            self.values[l].truncate(keep);
        }
        self.len = len;
    }

    /// A new cache holding this one's first `len` positions, with room for
    /// `capacity` positions: a retained prefix handed to a new sequence.
    pub fn clone_prefix(&self, len: usize, capacity: usize) -> KvCache {
        let len = len.min(self.len);
        let mut c = KvCache::with_capacity(self.shape, capacity.max(len));
        let n = len * self.shape.width;
        for l in 0..self.shape.layers {
            c.keys[l].extend_from_slice(&self.keys[l][..n]);
            c.values[l].extend_from_slice(&self.values[l][..n]);
        }
        c.len = len;
        c
    }

    /// Releases room beyond the stored positions (a cache kept for reuse).
    pub fn shrink_to_fit(&mut self) {
        for v in self.keys.iter_mut().chain(self.values.iter_mut()) {
            v.shrink_to_fit();
        }
    }

    /// Bytes held by stored positions.
    pub fn bytes(&self) -> usize {
        self.len * self.shape.bytes_per_position()
    }

    /// Bytes allocated, stored or not.
    pub fn allocated_bytes(&self) -> usize {
        let f = std::mem::size_of::<f32>();
        self.keys
            .iter()
            .chain(&self.values)
            .map(|v| v.capacity() * f)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_restores_the_shorter_cache_exactly() {
        let shape = KvShape {
            layers: 2,
            width: 3,
        };
        let mut a = KvCache::new(shape);
        let mut b = KvCache::new(shape);
        for l in 0..2 {
            a.append(l, &[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]);
            b.append(l, &[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]);
        }
        for l in 0..2 {
            a.append(l, &[7.0; 6], &[8.0; 6]);
        }
        assert_eq!(a.len(), 3);
        a.truncate(1);
        assert_eq!(a.len(), 1);
        for l in 0..2 {
            assert_eq!(a.keys(l), b.keys(l));
            assert_eq!(a.values(l), b.values(l));
        }
        assert_eq!(a.bytes(), shape.bytes_per_position());
        let c = a.clone_prefix(1, 8);
        assert_eq!(
            (c.len(), c.keys(1), c.values(0)),
            (1, b.keys(1), b.values(0))
        );
        assert!(c.allocated_bytes() >= 8 * shape.bytes_per_position());
    }
}
