//! Input rows quantized to 8 bits in fixed blocks of 32, each row on its
//! own: the quantization of a row never looks at another row.

use super::BLOCK;

/// `m` rows of `cols` values as `q * scale` per block of 32.
pub(crate) struct QuantizedRows {
    pub cols: usize,
    /// The 8-bit values, row after row: `|q| <= 127`.
    pub values: Vec<i8>,
    /// One scale per block: the block's largest magnitude over 127.
    pub scales: Vec<f32>,
    /// Per block: `scale * (sum of its values)`, what a weight block's
    /// minimum multiplies.
    pub block_sums: Vec<f32>,
}

impl QuantizedRows {
    /// Quantizes the first `m` rows of `x` (`cols` long, a multiple of 32).
    pub fn new(x: &[f32], m: usize, cols: usize) -> QuantizedRows {
        debug_assert!(cols.is_multiple_of(BLOCK));
        let blocks = m * cols / BLOCK;
        let mut rows = QuantizedRows {
            cols,
            values: vec![0; m * cols],
            scales: vec![0.0; blocks],
            block_sums: vec![0.0; blocks],
        };
        let blocks = x[..m * cols]
            .chunks_exact(BLOCK)
            .zip(rows.values.chunks_exact_mut(BLOCK))
            .zip(rows.scales.iter_mut())
            .zip(rows.block_sums.iter_mut());
        for (((x, q), scale), sum) in blocks {
            let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let inverse = if max > 0.0 { 127.0 / max } else { 0.0 };
            *scale = max / 127.0;
            for (q, v) in q.iter_mut().zip(x) {
                // `|v * inverse| <= 127` up to one rounding, which rounds
                // back to 127 at most.
                *q = (v * inverse).round_ties_even() as i8;
            }
            let total: i32 = q.iter().map(|&v| v as i32).sum();
            *sum = *scale * total as f32;
        }
        rows
    }

    pub fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::values;

    #[test]
    fn values_stay_within_127_and_reconstruct_closely() {
        let x = values(3 * 64, 9);
        let q = QuantizedRows::new(&x, 3, 64);
        for (b, block) in x.chunks_exact(BLOCK).enumerate() {
            let scale = q.scales[b];
            for (e, v) in block.iter().enumerate() {
                let got = q.values[b * BLOCK + e];
                assert!(got.unsigned_abs() <= 127);
                assert!((got as f32 * scale - v).abs() <= scale * 0.5 + 1e-7);
            }
        }
    }

    #[test]
    fn a_row_quantizes_the_same_alone_and_among_others() {
        let x = values(5 * 96, 4);
        let all = QuantizedRows::new(&x, 5, 96);
        let one = QuantizedRows::new(&x[2 * 96..], 1, 96);
        assert_eq!(all.values[2 * 96..3 * 96], one.values[..]);
        assert_eq!(all.scales[6..9], one.scales[..]);
        assert_eq!(all.block_sums[6..9], one.block_sums[..]);
    }

    #[test]
    fn zero_blocks_have_zero_scale() {
        let q = QuantizedRows::new(&[0.0; 32], 1, 32);
        assert_eq!(q.scales[0], 0.0);
        assert!(q.values.iter().all(|&v| v == 0));
    }
}
