//! The integers attention multiplies. A query becomes 16-bit integers times
//! one scale (its largest magnitude over [`KEY_LEVELS`]), each split in a
//! high and a low byte as keys are; a block's weights (each times its
//! value's scale) become 16-bit integers times one scale, split the same
//! way. Both are rounded to nearest from that query's own numbers, so a
//! query's integers never depend on the other rows of the tile.

use tensorfold_kv::block::{scale_for, split, steps, KEY_LEVELS};
use tensorfold_kv::BLOCK;

/// Queries one tile holds (the rows of a tile multiply).
pub(crate) const ROWS: usize = 16;

/// Up to [`ROWS`] queries as the left operand of the score multiply:
/// `[ROWS][key_dim]` bytes each of high and low parts (zeros past a
/// query's head dimension and past the last query).
pub(crate) struct QueryTile {
    pub high: Vec<i8>,
    pub low: Vec<i8>,
    /// Each row's score factor: its scale times 256 (the high parts' weight
    /// in the sum the tile unit leaves) times the softmax scale.
    pub factor: [f32; ROWS],
    pub key_dim: usize,
}

impl QueryTile {
    pub fn new(queries: &[&[f32]], key_dim: usize, softmax_scale: f32) -> QueryTile {
        assert!(queries.len() <= ROWS);
        let mut tile = QueryTile {
            high: vec![0; ROWS * key_dim],
            low: vec![0; ROWS * key_dim],
            factor: [0.0; ROWS],
            key_dim,
        };
        for (r, q) in queries.iter().enumerate() {
            let (scale, to_steps) = scale_for(q, KEY_LEVELS);
            tile.factor[r] = scale * 256.0 * softmax_scale;
            for (d, x) in q.iter().enumerate() {
                let (high, low) = split(steps(*x, to_steps, KEY_LEVELS));
                tile.high[r * key_dim + d] = high;
                tile.low[r * key_dim + d] = low;
            }
        }
        tile
    }
}

/// One block's weights of up to [`ROWS`] queries as the left operand of the
/// value multiply: `[ROWS][BLOCK]` bytes each of high and low parts.
pub(crate) struct WeightTile {
    pub high: [[i8; BLOCK]; ROWS],
    pub low: [[i8; BLOCK]; ROWS],
    /// Each row's scale: what one integer step of its weights is worth.
    pub scale: [f32; ROWS],
}

impl WeightTile {
    pub fn new() -> WeightTile {
        WeightTile {
            high: [[0; BLOCK]; ROWS],
            low: [[0; BLOCK]; ROWS],
            scale: [0.0; ROWS],
        }
    }

    /// Row `r` takes `weights[s] · value_scales[s]` as integers. Weights are
    /// finite and at least 0 (0 for slots a query does not see).
    #[inline(always)]
    pub fn set_row(&mut self, r: usize, weights: &[f32; BLOCK], value_scales: &[f32; BLOCK]) {
        let scaled: [f32; BLOCK] = std::array::from_fn(|s| weights[s] * value_scales[s]);
        // The numbers are at least 0, so their bits order as they do.
        let max_bits = scaled.iter().fold(0u32, |m, x| m.max(x.to_bits()));
        let max = f32::from_bits(max_bits);
        if max == 0.0 {
            self.clear_row(r);
            return;
        }
        self.scale[r] = max / KEY_LEVELS;
        let to_steps = KEY_LEVELS / max;
        for (s, x) in scaled.iter().enumerate() {
            let (high, low) = split(nearest(x * to_steps).min(KEY_LEVELS as i32));
            self.high[r][s] = high;
            self.low[r][s] = low;
        }
    }

    /// Row `r` weighs nothing.
    pub fn clear_row(&mut self, r: usize) {
        self.high[r] = [0; BLOCK];
        self.low[r] = [0; BLOCK];
        self.scale[r] = 0.0;
    }
}

/// `y` rounded to the nearest integer, ties to even, for `0 <= y < 2²²`:
/// adding 1.5·2²³ leaves the integer in the low bits of the sum (rounded by
/// the addition itself). Integer operations only, so it vectorizes.
#[inline(always)]
fn nearest(y: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    ((y + MAGIC).to_bits() - MAGIC.to_bits()) as i32
}

#[cfg(test)]
mod tests {
    #[test]
    fn nearest_rounds_half_to_even() {
        for (y, n) in [
            (0.0, 0),
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (3.49, 3),
            (32512.4, 32512),
            (32511.5, 32512),
        ] {
            assert_eq!(super::nearest(y), n, "{y}");
        }
        for i in 0..100_000 {
            let y = i as f32 * 0.3257;
            assert_eq!(super::nearest(y), y.round_ties_even() as i32, "{y}");
        }
    }

    use super::*;

    #[test]
    fn weights_round_within_half_a_step() {
        let weights: [f32; BLOCK] = std::array::from_fn(|s| (s as f32 * 0.37).sin().abs());
        let scales: [f32; BLOCK] = std::array::from_fn(|s| 0.01 + s as f32 * 1e-3);
        let mut tile = WeightTile::new();
        tile.set_row(3, &weights, &scales);
        for s in 0..BLOCK {
            let back =
                (256 * tile.high[3][s] as i32 + tile.low[3][s] as i32) as f32 * tile.scale[3];
            let exact = weights[s] * scales[s];
            assert!((back - exact).abs() <= tile.scale[3] * 0.5001, "{s}");
        }
        tile.set_row(3, &[0.0; BLOCK], &scales);
        assert_eq!(
            (tile.high[3], tile.low[3], tile.scale[3]),
            ([0; BLOCK], [0; BLOCK], 0.0)
        );
    }
}
