//! MLX affine quantization: `w = scale * q + bias` per group of 32, 64 or
//! 128 consecutive weights of a row, `q` an unsigned integer of 2, 3, 4, 5,
//! 6 or 8 bits.
//!
//! Layout, as MLX writes it: a row's `q` values form one little-endian bit
//! stream, value `j` at bits `j*bits .. (j+1)*bits`, stored as consecutive
//! little-endian `u32` words. For 2, 4 and 8 bits a word holds whole values
//! (value `k` of a word at shift `k*bits`); 3-, 5- and 6-bit values straddle
//! word boundaries (MLX packs 8, 8 and 4 of them into 3, 5 and 3 bytes,
//! which is the same stream). A group covers `group*bits/32` whole words, so
//! rows and groups start on word boundaries. Scales and biases are one per
//! group, row-major, in f32, f16 or bf16.
//!
//! Quantization follows MLX's `affine_quantize` so that a checkpoint written
//! here is the one MLX would write from the same f32 values:
//!
//! - `n = 2^bits - 1`; over the group, `lo = min`, `hi = max` (NaN ignored);
//! - `scale = max((hi - lo) / n, 1e-7)`, negated unless `|lo| > |hi|`;
//!   `edge` is `lo` when `|lo| > |hi|`, else `hi`;
//! - `q0 = rint(edge / scale)`; if `q0 != 0` then `scale = edge / q0` and
//!   `bias = edge`, else `bias = 0` — the extreme of larger magnitude is
//!   reproduced exactly;
//! - `q = clamp(rint((w - bias) / scale), 0, n)`, `rint` rounding half to
//!   even; all arithmetic in f32;
//! - the stored scale and bias are then rounded to their dtype (the `q`
//!   values were chosen with the unrounded f32 pair, as MLX does).
//!
//! Decoding computes `scale * q + bias` in f32, element by element.
//!
//! [`QuantRule::Search`] is an alternative that keeps the layout: per group
//! it takes, of MLX's pair and the pairs `scale = (hi - lo) / m`,
//! `bias = lo` for every `m` from `n` down to `3n/4`, the one whose decoded
//! group (with the dtype-rounded pair) has the least squared error, the
//! earliest candidate on ties. A source already on a coarser grid (a GGUF
//! 4-bit block of 32 is `lo + d * k`, `k < 16`) is then reproduced exactly
//! whenever a multiple of its step fits, as at 5 and 6 bits.

use crate::QuantError;
use half::{bf16, f16};

/// How quantization picks each group's scale and bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuantRule {
    /// MLX's `affine_quantize`: the checkpoint MLX would write.
    #[default]
    Mlx,
    /// The least squared error over a fixed set of candidates (module docs).
    Search,
}

/// Bit widths MLX affine quantization defines.
pub const AFFINE_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes MLX affine quantization defines.
pub const AFFINE_GROUPS: [usize; 3] = [32, 64, 128];

/// Bits per value and values per group; construct with [`Affine::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Affine {
    bits: u32,
    group: usize,
}

impl Affine {
    pub fn new(bits: u32, group: usize) -> Result<Affine, QuantError> {
        if !AFFINE_BITS.contains(&bits) || !AFFINE_GROUPS.contains(&group) {
            return Err(QuantError::Affine(format!(
                "bits {bits}, group size {group} is not an affine layout \
                 (bits 2, 3, 4, 5, 6 or 8; group size 32, 64 or 128)"
            )));
        }
        Ok(Affine { bits, group })
    }

    pub fn bits(self) -> u32 {
        self.bits
    }

    pub fn group(self) -> usize {
        self.group
    }

    /// `u32` words of one packed row of `cols` values.
    pub fn row_words(self, cols: usize) -> usize {
        cols * self.bits as usize / 32
    }
}

impl std::fmt::Display for Affine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AFFINE{}_G{}", self.bits, self.group)
    }
}

/// The dtype of scales and biases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScaleDtype {
    F32,
    F16,
    Bf16,
}

impl ScaleDtype {
    pub fn bytes(self) -> usize {
        match self {
            ScaleDtype::F32 => 4,
            ScaleDtype::F16 | ScaleDtype::Bf16 => 2,
        }
    }

    /// `v` rounded to this dtype (round to nearest even), back in f32.
    pub fn round(self, v: f32) -> f32 {
        match self {
            ScaleDtype::F32 => v,
            ScaleDtype::F16 => f16::from_f32(v).to_f32(),
            ScaleDtype::Bf16 => bf16::from_f32(v).to_f32(),
        }
    }

    fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            ScaleDtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            ScaleDtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            ScaleDtype::Bf16 => bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    }

    /// Values already representable in this dtype (see [`ScaleDtype::round`]).
    fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            ScaleDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ScaleDtype::F16 => values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect(),
            ScaleDtype::Bf16 => values
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect(),
        }
    }
}

/// A matrix in MLX affine layout.
#[derive(Clone)]
pub struct AffineBlocks {
    spec: Affine,
    dtype: ScaleDtype,
    rows: usize,
    cols: usize,
    packed: Vec<u32>,
    /// Scales and biases, exactly the stored values widened to f32.
    scales: Vec<f32>,
    biases: Vec<f32>,
}

fn size_error(what: &str, expected: usize, got: usize) -> QuantError {
    QuantError::Affine(format!("{what}: expected {expected} bytes, got {got}"))
}

impl AffineBlocks {
    fn check_shape(spec: Affine, cols: usize) -> Result<(), QuantError> {
        if cols == 0 || !cols.is_multiple_of(spec.group) {
            return Err(QuantError::Affine(format!(
                "{spec} needs rows of a positive multiple of {} values, got {cols}",
                spec.group
            )));
        }
        Ok(())
    }

    /// From the three tensors as stored: packed `u32` words, scales and
    /// biases, all little-endian bytes.
    pub fn from_le_bytes(
        spec: Affine,
        dtype: ScaleDtype,
        rows: usize,
        cols: usize,
        packed: &[u8],
        scales: &[u8],
        biases: &[u8],
    ) -> Result<AffineBlocks, QuantError> {
        Self::check_shape(spec, cols)?;
        let words = rows * spec.row_words(cols);
        if packed.len() != words * 4 {
            return Err(size_error("packed weight", words * 4, packed.len()));
        }
        let groups = rows * (cols / spec.group);
        for (what, b) in [("scales", scales), ("biases", biases)] {
            if b.len() != groups * dtype.bytes() {
                return Err(size_error(what, groups * dtype.bytes(), b.len()));
            }
        }
        Ok(AffineBlocks {
            spec,
            dtype,
            rows,
            cols,
            packed: packed
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            scales: dtype.decode(scales),
            biases: dtype.decode(biases),
        })
    }

    /// Quantizes `rows x cols` f32 values (row-major) by MLX's rule (module
    /// docs).
    pub fn quantize(
        spec: Affine,
        dtype: ScaleDtype,
        rows: usize,
        cols: usize,
        values: &[f32],
    ) -> Result<AffineBlocks, QuantError> {
        Self::quantize_with(QuantRule::Mlx, spec, dtype, rows, cols, values)
    }

    /// Quantizes by `rule`.
    pub fn quantize_with(
        rule: QuantRule,
        spec: Affine,
        dtype: ScaleDtype,
        rows: usize,
        cols: usize,
        values: &[f32],
    ) -> Result<AffineBlocks, QuantError> {
        Self::check_shape(spec, cols)?;
        if values.len() != rows * cols {
            return Err(QuantError::Affine(format!(
                "{rows}x{cols} matrix from {} values",
                values.len()
            )));
        }
        let groups = rows * (cols / spec.group);
        let (mut scales, mut biases) = (Vec::with_capacity(groups), Vec::with_capacity(groups));
        let mut q = Vec::with_capacity(values.len());
        for g in values.chunks_exact(spec.group) {
            let (s, b) = match rule {
                QuantRule::Mlx => quantize_group(g, spec.bits, dtype, &mut q),
                QuantRule::Search => search_group(g, spec.bits, dtype, &mut q),
            };
            scales.push(s);
            biases.push(b);
        }
        Ok(AffineBlocks {
            spec,
            dtype,
            rows,
            cols,
            packed: pack(&q, spec.bits),
            scales,
            biases,
        })
    }

    pub fn spec(&self) -> Affine {
        self.spec
    }

    pub fn scale_dtype(&self) -> ScaleDtype {
        self.dtype
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the three stored tensors together.
    pub fn byte_len(&self) -> usize {
        self.packed.len() * 4 + (self.scales.len() + self.biases.len()) * self.dtype.bytes()
    }

    pub fn packed(&self) -> &[u32] {
        &self.packed
    }

    /// The packed weight as stored (`rows x row_words` little-endian u32).
    pub fn packed_le_bytes(&self) -> Vec<u8> {
        self.packed.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// Scales as stored (`rows x cols/group` in the scale dtype).
    pub fn scales_le_bytes(&self) -> Vec<u8> {
        self.dtype.encode(&self.scales)
    }

    pub fn biases_le_bytes(&self) -> Vec<u8> {
        self.dtype.encode(&self.biases)
    }

    /// The integer values of row `r`.
    pub fn row_q(&self, r: usize) -> Vec<u32> {
        let w = self.spec.row_words(self.cols);
        unpack(&self.packed[r * w..(r + 1) * w], self.spec.bits, self.cols)
    }

    /// Decodes row `r` into `out[..cols]`: `scale * q + bias` in f32.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (bits, group) = (self.spec.bits, self.spec.group);
        let per_row = self.cols / group;
        let gw = group * bits as usize / 32;
        let words = &self.packed[r * per_row * gw..(r + 1) * per_row * gw];
        let mask = (1u32 << bits) - 1;
        let out = &mut out[..self.cols];
        for (g, (o, w)) in out
            .chunks_exact_mut(group)
            .zip(words.chunks_exact(gw))
            .enumerate()
        {
            let (s, b) = (self.scales[r * per_row + g], self.biases[r * per_row + g]);
            if 32 % bits == 0 {
                // Whole values per word: a fixed inner loop per word.
                let per = (32 / bits) as usize;
                for (o, &word) in o.chunks_exact_mut(per).zip(w) {
                    for (k, v) in o.iter_mut().enumerate() {
                        *v = s * ((word >> (k as u32 * bits)) & mask) as f32 + b;
                    }
                }
            } else {
                let (mut acc, mut have, mut next) = (0u64, 0u32, w.iter());
                for v in o.iter_mut() {
                    if have < bits {
                        acc |= (next.next().copied().unwrap_or(0) as u64) << have;
                        have += 32;
                    }
                    *v = s * (acc as u32 & mask) as f32 + b;
                    acc >>= bits;
                    have -= bits;
                }
            }
        }
    }
}

/// Quantizes one group by MLX's rule (module docs), appending its `q`
/// values; returns the stored (scale, bias), rounded to `dtype` after `q`
/// was chosen, as MLX does.
fn quantize_group(w: &[f32], bits: u32, dtype: ScaleDtype, q: &mut Vec<u32>) -> (f32, f32) {
    let n_bins = ((1u32 << bits) - 1) as f32;
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in w {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let low_dominates = lo.abs() > hi.abs();
    let mut scale = ((hi - lo) / n_bins).max(1e-7);
    if !low_dominates {
        scale = -scale;
    }
    let edge = if low_dominates { lo } else { hi };
    let q0 = (edge / scale).round_ties_even();
    let mut bias = 0.0;
    if q0 != 0.0 {
        scale = edge / q0;
        bias = edge;
    }
    // `max` before `min` sends NaN to 0; the cast of a value in 0..=n_bins is exact.
    q.extend(
        w.iter()
            .map(|&v| ((v - bias) / scale).round_ties_even().max(0.0).min(n_bins) as u32),
    );
    (dtype.round(scale), dtype.round(bias))
}

/// Of MLX's pair and the min/max pairs over `m` levels (`3n/4 <= m <= n`),
/// the one with the least squared error once decoded (module docs).
fn search_group(w: &[f32], bits: u32, dtype: ScaleDtype, q: &mut Vec<u32>) -> (f32, f32) {
    let n = (1u32 << bits) - 1;
    let mut best_q = Vec::with_capacity(w.len());
    let mut best = quantize_group(w, bits, dtype, &mut best_q);
    let mut best_err = group_error(w, &best_q, best);
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in w {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi > lo {
        let mut cand = Vec::with_capacity(w.len());
        for m in (n - n / 4..=n).rev() {
            let scale = (hi - lo) / m as f32;
            cand.clear();
            cand.extend(
                w.iter()
                    .map(|&v| ((v - lo) / scale).round_ties_even().max(0.0).min(n as f32) as u32),
            );
            let pair = (dtype.round(scale), dtype.round(lo));
            let err = group_error(w, &cand, pair);
            if err < best_err {
                (best, best_err) = (pair, err);
                std::mem::swap(&mut best_q, &mut cand);
            }
        }
    }
    q.extend_from_slice(&best_q);
    best
}

/// Squared error of a group decoded from `q` with `(scale, bias)`; NaN
/// weights count as zero error.
fn group_error(w: &[f32], q: &[u32], (scale, bias): (f32, f32)) -> f64 {
    w.iter()
        .zip(q)
        .map(|(&v, &k)| {
            let d = (scale * k as f32 + bias - v) as f64;
            if d.is_nan() {
                0.0
            } else {
                d * d
            }
        })
        .sum()
}

/// Packs values of `bits` bits into the little-endian bit stream; the
/// stream is padded with zero bits to whole words.
pub fn pack(q: &[u32], bits: u32) -> Vec<u32> {
    let mask = (1u64 << bits) - 1;
    let mut out = Vec::with_capacity((q.len() * bits as usize).div_ceil(32));
    let (mut acc, mut have) = (0u64, 0u32);
    for &v in q {
        acc |= (v as u64 & mask) << have;
        have += bits;
        if have >= 32 {
            out.push(acc as u32);
            acc >>= 32;
            have -= 32;
        }
    }
    if have > 0 {
        out.push(acc as u32);
    }
    out
}

/// The first `n` values of `bits` bits from a packed stream (missing words
/// read as zero).
pub fn unpack(words: &[u32], bits: u32, n: usize) -> Vec<u32> {
    let mask = (1u64 << bits) - 1;
    let (mut acc, mut have, mut next) = (0u64, 0u32, words.iter());
    (0..n)
        .map(|_| {
            if have < bits {
                acc |= (next.next().copied().unwrap_or(0) as u64) << have;
                have += 32;
            }
            let v = (acc & mask) as u32;
            acc >>= bits;
            have -= bits;
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::values;
    use crate::{Encoding, Matrix};
    use proptest::prelude::*;

    fn specs() -> Vec<Affine> {
        AFFINE_BITS
            .iter()
            .flat_map(|&b| {
                AFFINE_GROUPS
                    .iter()
                    .map(move |&g| Affine::new(b, g).unwrap())
            })
            .collect()
    }

    /// MLX's own reader of one pack (`extract_bits` in its CPU backend),
    /// written from its byte formulas: 8 values in 3 bytes (3 bits), 8 in 5
    /// (5 bits), 4 in 3 (6 bits), or whole values per byte.
    fn mlx_extract(bytes: &[u8], bits: u32, n: usize) -> Vec<u32> {
        let b = |i: usize| bytes[i] as u32;
        let mut out = Vec::new();
        let mut p = 0;
        while out.len() < n {
            match bits {
                3 => {
                    out.extend([
                        b(p) & 0x7,
                        (b(p) & 0x38) >> 3,
                        ((b(p) & 0xc0) >> 6) + ((b(p + 1) & 0x1) << 2),
                        (b(p + 1) & 0xe) >> 1,
                        (b(p + 1) & 0x70) >> 4,
                        ((b(p + 1) & 0x80) >> 7) + ((b(p + 2) & 0x3) << 1),
                        (b(p + 2) & 0x1c) >> 2,
                        (b(p + 2) & 0xe0) >> 5,
                    ]);
                    p += 3;
                }
                5 => {
                    out.extend([
                        b(p) & 0x1f,
                        ((b(p) & 0xe0) >> 5) + ((b(p + 1) & 0x3) << 3),
                        (b(p + 1) & 0x7c) >> 2,
                        ((b(p + 1) & 0x80) >> 7) + ((b(p + 2) & 0xf) << 1),
                        ((b(p + 2) & 0xf0) >> 4) + ((b(p + 3) & 0x1) << 4),
                        (b(p + 3) & 0x3e) >> 1,
                        ((b(p + 3) & 0xc0) >> 6) + ((b(p + 4) & 0x7) << 2),
                        (b(p + 4) & 0xf8) >> 3,
                    ]);
                    p += 5;
                }
                6 => {
                    out.extend([
                        b(p) & 0x3f,
                        ((b(p) >> 6) & 0x03) + ((b(p + 1) & 0x0f) << 2),
                        ((b(p + 1) >> 4) & 0x0f) + ((b(p + 2) & 0x03) << 4),
                        (b(p + 2) >> 2) & 0x3f,
                    ]);
                    p += 3;
                }
                _ => {
                    let mut w = b(p);
                    for _ in 0..8 / bits {
                        out.push(w & ((1 << bits) - 1));
                        w >>= bits;
                    }
                    p += 1;
                }
            }
        }
        out
    }

    #[test]
    fn packing_round_trips_at_every_width_and_group_in_mlx_layout() {
        for spec in specs() {
            let (rows, cols) = (3, spec.group() * 2);
            let w =
                AffineBlocks::quantize(spec, ScaleDtype::F16, rows, cols, &values(rows * cols, 7))
                    .unwrap();
            let max = (1u32 << spec.bits()) - 1;
            let bytes = w.packed_le_bytes();
            assert_eq!(bytes.len(), rows * cols * spec.bits() as usize / 8);
            for r in 0..rows {
                let q = w.row_q(r);
                // Every level is used by random data, and re-packing is the identity.
                assert!(q.iter().all(|&v| v <= max), "{spec}");
                assert!(q.contains(&0) && q.contains(&max), "{spec}");
                let words = spec.row_words(cols);
                assert_eq!(
                    pack(&q, spec.bits()),
                    w.packed()[r * words..(r + 1) * words]
                );
                let row_bytes = &bytes[r * words * 4..(r + 1) * words * 4];
                assert_eq!(mlx_extract(row_bytes, spec.bits(), cols), q, "{spec}");
            }
            let back = AffineBlocks::from_le_bytes(
                spec,
                ScaleDtype::F16,
                rows,
                cols,
                &bytes,
                &w.scales_le_bytes(),
                &w.biases_le_bytes(),
            )
            .unwrap();
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                w.dequantize_row(r, &mut a);
                back.dequantize_row(r, &mut b);
                assert_eq!(a, b, "{spec}");
                let q = w.row_q(r);
                for (j, v) in a.iter().enumerate() {
                    let g = r * (cols / spec.group()) + j / spec.group();
                    assert_eq!(*v, w.scales[g] * q[j] as f32 + w.biases[g]);
                }
            }
        }
    }

    #[test]
    fn known_words() {
        // 4 bits: value k of a word at shift 4k, little end first.
        let q: Vec<u32> = (0..8).collect();
        assert_eq!(pack(&q, 4), vec![0x7654_3210]);
        // 3 bits: the 11th value straddles the first two words.
        let q: Vec<u32> = (0..32).map(|i| i % 8).collect();
        let w = pack(&q, 3);
        assert_eq!(w.len(), 3);
        // Value 10 is 2 = 0b010: bits 30-31 of word 0 hold 0b10, bit 0 of
        // word 1 holds 0; value 11 (3 = 0b011) follows at bits 1-3.
        assert_eq!(w[0] >> 30, 0b10);
        assert_eq!(w[1] & 0b1111, 0b0110);
        assert_eq!(unpack(&w, 3, 32), q);
    }

    #[test]
    fn quantization_follows_the_mlx_rule() {
        // hi dominates: scale is negative, the bias is hi, hi is exact.
        let g: Vec<f32> = (0..32).map(|i| i as f32 / 31.0).collect();
        let w = AffineBlocks::quantize(Affine::new(4, 32).unwrap(), ScaleDtype::F32, 1, 32, &g)
            .unwrap();
        assert_eq!(w.biases[0], 1.0);
        assert_eq!(w.scales[0], 1.0 / -15.0);
        let q = w.row_q(0);
        assert_eq!((q[0], q[31]), (15, 0));
        // Ties round to even: with hi = 15, lo = 0 the step is exactly -1,
        // so 8.5 sits at 6.5 steps from the bias and rounds to 6 (not 7).
        let mut t = vec![0.0f32; 32];
        t[0] = 15.0;
        t[1] = 8.5;
        t[2] = 7.5;
        let w = AffineBlocks::quantize(Affine::new(4, 32).unwrap(), ScaleDtype::F32, 1, 32, &t)
            .unwrap();
        assert_eq!((w.scales[0], w.biases[0]), (-1.0, 15.0));
        assert_eq!(&w.row_q(0)[..3], &[0, 6, 8]);
        // lo dominates: positive scale, the bias is lo, lo is exact.
        let n: Vec<f32> = g.iter().map(|v| -2.0 * v).collect();
        let w = AffineBlocks::quantize(Affine::new(8, 32).unwrap(), ScaleDtype::F32, 1, 32, &n)
            .unwrap();
        assert_eq!(w.biases[0], -2.0);
        assert!(w.scales[0] > 0.0);
        let mut out = vec![0.0; 32];
        w.dequantize_row(0, &mut out);
        assert_eq!(out[31], -2.0);
        // A constant zero group decodes to zeros; NaN does not panic.
        let mut z = vec![0.0f32; 32];
        let w = AffineBlocks::quantize(Affine::new(2, 32).unwrap(), ScaleDtype::F16, 1, 32, &z)
            .unwrap();
        w.dequantize_row(0, &mut out);
        assert!(out.iter().all(|v| *v == 0.0));
        z[3] = f32::NAN;
        assert!(
            AffineBlocks::quantize(Affine::new(2, 32).unwrap(), ScaleDtype::F16, 1, 32, &z).is_ok()
        );
    }

    #[test]
    fn search_is_never_worse_than_mlx_and_recovers_a_coarser_grid() {
        let spec = |b| Affine::new(b, 32).unwrap();
        for bits in AFFINE_BITS {
            let w = values(32 * 64, bits as u64);
            let err = |rule| {
                let q = AffineBlocks::quantize_with(rule, spec(bits), ScaleDtype::F32, 64, 32, &w)
                    .unwrap();
                let mut out = vec![0.0; 32 * 64];
                for (r, row) in out.chunks_exact_mut(32).enumerate() {
                    q.dequantize_row(r, row);
                }
                let d: f64 = out
                    .iter()
                    .zip(&w)
                    .map(|(a, b)| ((a - b) as f64).powi(2))
                    .sum();
                d
            };
            assert!(err(QuantRule::Search) <= err(QuantRule::Mlx), "{bits} bits");
        }
        // Values on a 16-level grid (a GGUF 4-bit block) come back exactly at 6 bits.
        let grid: Vec<f32> = (0..32)
            .map(|i| -0.3 + 0.05 * ((i * 7) % 16) as f32)
            .collect();
        let q =
            AffineBlocks::quantize_with(QuantRule::Search, spec(6), ScaleDtype::F32, 1, 32, &grid)
                .unwrap();
        let mut out = vec![0.0; 32];
        q.dequantize_row(0, &mut out);
        for (a, b) in out.iter().zip(&grid) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn error_is_within_one_step_at_every_width_and_group() {
        // Snapping the scale so that the larger extreme (and zero) is exact
        // moves the grid by under half a step per level: the bound is one
        // step of (hi - lo) / n, not half.
        for spec in specs() {
            let (rows, cols) = (4, 256);
            let src = values(rows * cols, 5);
            let m = Matrix::from_f32(Encoding::Affine(spec, ScaleDtype::F32), rows, cols, &src)
                .unwrap();
            let mut row = vec![0.0; cols];
            for r in 0..rows {
                m.row_f32(r, &mut row);
                for (g, (a, b)) in src[r * cols..(r + 1) * cols]
                    .chunks(spec.group())
                    .zip(row.chunks(spec.group()))
                    .enumerate()
                {
                    let lo = a.iter().copied().fold(f32::INFINITY, f32::min);
                    let hi = a.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let step = (hi - lo) / ((1u32 << spec.bits()) - 1) as f32;
                    let err = a
                        .iter()
                        .zip(b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f32::max);
                    assert!(
                        err <= step + 1e-6,
                        "{spec} row {r} group {g}: {err} > {step}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_layouts_are_errors() {
        assert!(Affine::new(7, 64).is_err());
        assert!(Affine::new(4, 16).is_err());
        let s = Affine::new(4, 64).unwrap();
        assert!(AffineBlocks::quantize(s, ScaleDtype::F16, 1, 96, &[0.0; 96]).is_err());
        assert!(
            AffineBlocks::from_le_bytes(s, ScaleDtype::F16, 2, 64, &[0; 63], &[0; 4], &[0; 4])
                .is_err()
        );
        assert!(
            AffineBlocks::from_le_bytes(s, ScaleDtype::F16, 2, 64, &[0; 64], &[0; 2], &[0; 4])
                .is_err()
        );
        assert!(
            AffineBlocks::from_le_bytes(s, ScaleDtype::F16, 2, 64, &[0; 64], &[0; 4], &[0; 4])
                .is_ok()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn pack_unpack_round_trip(
            bits in proptest::sample::select(AFFINE_BITS.to_vec()),
            raw in proptest::collection::vec(any::<u32>(), 0..300),
        ) {
            let q: Vec<u32> = raw.iter().map(|v| v & ((1 << bits) - 1)).collect();
            let w = pack(&q, bits);
            prop_assert_eq!(w.len(), (q.len() * bits as usize).div_ceil(32));
            prop_assert_eq!(unpack(&w, bits, q.len()), q);
        }

        /// The row invariant holds for affine matrices too.
        #[test]
        fn affine_rows_do_not_depend_on_the_call(
            spec in proptest::sample::select(specs()),
            n in 1usize..40,
            m in 1usize..20,
            pick in 0usize..20,
            seed in 0u64..1000,
        ) {
            let k = 256;
            let w = Matrix::from_f32(Encoding::Affine(spec, ScaleDtype::Bf16), n, k, &values(n * k, seed)).unwrap();
            let x = values(m * k, seed + 1);
            let mut all = vec![0.0; m * n];
            w.matmul(&x, m, &mut all);
            let i = pick % m;
            let mut one = vec![0.0; n];
            w.matmul(&x[i * k..(i + 1) * k], 1, &mut one);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&all[i * n..(i + 1) * n]), bits(&one));
        }
    }
}
