//! One block of [`BLOCK`] positions of one layer, in the integer layouts the
//! attention kernels multiply directly.
//!
//! A key is stored per position and key/value head as 16-bit integers times
//! one f32 scale (`max |k| / KEY_LEVELS`), each integer split in a high and
//! a low signed byte (`k = 256·high + low`), so 8-bit products summed
//! exactly give a 16-bit key's dot product. A value is 8-bit integers times
//! one f32 scale (`max |v| / VALUE_LEVELS`). Both are rounded to nearest
//! once, when the forward appends them, from that position's own numbers:
//! what a slot stores never depends on the other slots.
//!
//! The byte layouts are those of a tile multiply (`B` operand, four bytes a
//! column group): keys `[16 slots][key_dim / 4][16 slots' 4 dims]` so that
//! sixteen keys' 64 dimensions are one 16×64-byte tile, values
//! `[value_stride / 16][16 slot quads][16 dims' 4 slots]` so that sixteen
//! dimensions of all 64 slots are one tile.

use crate::{KvShape, BLOCK};

/// A key's integers lie in `-KEY_LEVELS..=KEY_LEVELS`: 127·256, so that the
/// high byte (rounded, `(k + 128) >> 8`) stays within `-127..=127` and the low
/// byte within `-128..=127`.
pub const KEY_LEVELS: f32 = 32512.0;

/// A value's integers lie in `-VALUE_LEVELS..=VALUE_LEVELS`.
pub const VALUE_LEVELS: f32 = 127.0;

/// Slots of one key tile (its columns).
pub const KEY_GROUP: usize = 16;

/// Dimensions of one value tile (its columns).
pub const VALUE_GROUP: usize = 16;

/// Key dimensions one tile row group spans: a key's stored dimensions are
/// a multiple of this (zeros after the head dimension).
pub const KEY_TILE_DIMS: usize = 64;

/// `x`'s largest magnitude as a scale for `levels` integer steps, and the
/// factor that takes `x` to those steps. Non-finite numbers count as the
/// largest finite one (a stored number is always finite).
pub fn scale_for(x: &[f32], levels: f32) -> (f32, f32) {
    let max = x.iter().fold(0f32, |m, v| m.max(finite(*v).abs()));
    if max == 0.0 {
        (0.0, 0.0)
    } else {
        (max / levels, levels / max)
    }
}

/// `x` with infinities at the largest finite magnitudes and NaN at 0.
fn finite(x: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(f32::MIN, f32::MAX)
    }
}

/// `x · to_steps` rounded to nearest (ties to even), within `±levels`.
pub fn steps(x: f32, to_steps: f32, levels: f32) -> i32 {
    (finite(x) * to_steps)
        .round_ties_even()
        .clamp(-levels, levels) as i32
}

/// A 16-bit key integer's high and low bytes: `k = 256·high + low`.
pub fn split(k: i32) -> (i8, i8) {
    let high = (k + 128) >> 8;
    (high as i8, (k - 256 * high) as i8)
}

/// One key/value head's part of a block, read by attention.
#[derive(Clone, Copy)]
pub struct HeadBlock<'a> {
    /// Keys' high bytes, in the tile layout (see the module).
    pub key_high: &'a [i8],
    /// Keys' low bytes, same layout.
    pub key_low: &'a [i8],
    /// Each slot's key scale.
    pub key_scales: &'a [f32; BLOCK],
    /// Values' bytes, in the tile layout (see the module).
    pub values: &'a [i8],
    /// Each slot's value scale.
    pub value_scales: &'a [f32; BLOCK],
    /// Stored dimensions of a key: the head dimension rounded up to
    /// [`KEY_TILE_DIMS`].
    pub key_dim: usize,
    /// Stored dimensions of a value: the head dimension rounded up to
    /// [`VALUE_GROUP`].
    pub value_dim: usize,
}

impl HeadBlock<'_> {
    /// Byte of dimension `d` of slot `s` in a key layout.
    pub fn key_at(key_dim: usize, s: usize, d: usize) -> usize {
        ((s / KEY_GROUP * (key_dim / 4) + d / 4) * KEY_GROUP + s % KEY_GROUP) * 4 + d % 4
    }

    /// Byte of dimension `d` of slot `s` in the value layout.
    pub fn value_at(s: usize, d: usize) -> usize {
        ((d / VALUE_GROUP * (BLOCK / 4) + s / 4) * VALUE_GROUP + d % VALUE_GROUP) * 4 + s % 4
    }

    /// Slot `s`'s key as stored, in f32 (`(256·high + low) · scale`).
    pub fn key(&self, s: usize, head_dim: usize) -> Vec<f32> {
        (0..head_dim)
            .map(|d| {
                let at = Self::key_at(self.key_dim, s, d);
                (256 * self.key_high[at] as i32 + self.key_low[at] as i32) as f32
                    * self.key_scales[s]
            })
            .collect()
    }

    /// Slot `s`'s value as stored, in f32.
    pub fn value(&self, s: usize, head_dim: usize) -> Vec<f32> {
        (0..head_dim)
            .map(|d| self.values[Self::value_at(s, d)] as f32 * self.value_scales[s])
            .collect()
    }
}

/// [`BLOCK`] positions of one layer, every key/value head's keys and values
/// in the tile layouts (see the module).
#[derive(Debug, Clone)]
pub struct KvBlock {
    key_high: Vec<i8>,
    key_low: Vec<i8>,
    key_scales: Vec<[f32; BLOCK]>,
    values: Vec<i8>,
    value_scales: Vec<[f32; BLOCK]>,
    head_dim: usize,
    key_dim: usize,
    value_dim: usize,
}

impl KvBlock {
    pub(crate) fn new(shape: KvShape) -> KvBlock {
        let (key_dim, value_dim) = (shape.key_dim(), shape.value_stride());
        KvBlock {
            key_high: vec![0; shape.kv_heads * BLOCK * key_dim],
            key_low: vec![0; shape.kv_heads * BLOCK * key_dim],
            key_scales: vec![[0.0; BLOCK]; shape.kv_heads],
            values: vec![0; shape.kv_heads * BLOCK * value_dim],
            value_scales: vec![[0.0; BLOCK]; shape.kv_heads],
            head_dim: shape.head_dim,
            key_dim,
            value_dim,
        }
    }

    /// `kv_head`'s keys and values.
    pub fn head(&self, kv_head: usize) -> HeadBlock<'_> {
        let (keys, values) = (BLOCK * self.key_dim, BLOCK * self.value_dim);
        HeadBlock {
            key_high: &self.key_high[kv_head * keys..][..keys],
            key_low: &self.key_low[kv_head * keys..][..keys],
            key_scales: &self.key_scales[kv_head],
            values: &self.values[kv_head * values..][..values],
            value_scales: &self.value_scales[kv_head],
            key_dim: self.key_dim,
            value_dim: self.value_dim,
        }
    }

    /// Stores one position's keys and values (`width` each) at `slot`.
    pub(crate) fn write(&mut self, slot: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        let (keys, values) = (BLOCK * self.key_dim, BLOCK * self.value_dim);
        for (head, (k, v)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
            let (scale, to_steps) = scale_for(k, KEY_LEVELS);
            self.key_scales[head][slot] = scale;
            for (d, x) in k.iter().enumerate() {
                let (high, low) = split(steps(*x, to_steps, KEY_LEVELS));
                let at = head * keys + HeadBlock::key_at(self.key_dim, slot, d);
                self.key_high[at] = high;
                self.key_low[at] = low;
            }
            let (scale, to_steps) = scale_for(v, VALUE_LEVELS);
            self.value_scales[head][slot] = scale;
            for (d, x) in v.iter().enumerate() {
                self.values[head * values + HeadBlock::value_at(slot, d)] =
                    steps(*x, to_steps, VALUE_LEVELS) as i8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_integer_splits_into_two_bytes_that_give_it_back() {
        for k in -(KEY_LEVELS as i32)..=KEY_LEVELS as i32 {
            let (high, low) = split(k);
            assert!((-127..=127).contains(&high), "{k}");
            assert_eq!(256 * high as i32 + low as i32, k);
        }
    }

    #[test]
    fn layouts_place_every_slot_and_dimension_once() {
        let key_dim = 128;
        let mut seen = vec![false; BLOCK * key_dim];
        for s in 0..BLOCK {
            for d in 0..key_dim {
                let at = HeadBlock::key_at(key_dim, s, d);
                assert!(!seen[at]);
                seen[at] = true;
            }
        }
        let value_dim = 80;
        let mut seen = vec![false; BLOCK * value_dim];
        for s in 0..BLOCK {
            for d in 0..value_dim {
                let at = HeadBlock::value_at(s, d);
                assert!(!seen[at]);
                seen[at] = true;
            }
        }
    }

    #[test]
    fn rounding_stays_within_half_a_step_and_saturates() {
        let x = [3.0, -1.5, 0.25, f32::INFINITY, f32::NAN, -7.0];
        let (scale, to_steps) = scale_for(&x, VALUE_LEVELS);
        assert_eq!(scale, f32::MAX / VALUE_LEVELS);
        assert_eq!(steps(f32::INFINITY, to_steps, VALUE_LEVELS), 127);
        assert_eq!(steps(f32::NAN, to_steps, VALUE_LEVELS), 0);
        let x = [3.0, -1.5, 0.25, -7.0];
        let (scale, to_steps) = scale_for(&x, KEY_LEVELS);
        for v in x {
            let back = steps(v, to_steps, KEY_LEVELS) as f32 * scale;
            assert!((back - v).abs() <= scale * 0.5 + 1e-6, "{v} {back}");
        }
        assert_eq!(scale_for(&[0.0, -0.0], KEY_LEVELS), (0.0, 0.0));
    }
}
