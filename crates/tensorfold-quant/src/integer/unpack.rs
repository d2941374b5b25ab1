//! Weight rows of a GGUF block format unpacked into the kernel's form:
//! 8-bit integers per element, a float scale per half block of 16 and,
//! where the format has them, a float minimum per block of 32. Unpacking
//! is exact (it moves bits; a k-quant's `d * sub-block scale` has at most
//! 19 significant bits, exact in f32), so every kernel that reads the
//! unpacked rows sees the same numbers.

use super::BLOCK;
#[cfg(test)]
use super::HALF;
use crate::Format;
use half::f16;

/// A tile of weight rows in the kernel's form.
#[derive(Default)]
pub(crate) struct UnpackedRows {
    /// `|v| <= 127` per element, row after row.
    pub values: Vec<i8>,
    /// The float scale of each half block of 16: the block's scale, times
    /// the sub-block's integer scale for k-quants.
    pub half_scales: Vec<f32>,
    /// The minimum of each block of 32 (what it adds per unit of the
    /// input's block sum); empty when the format has none.
    pub block_mins: Vec<f32>,
}

/// What a format's unpacked rows carry besides values and scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub block_mins: bool,
    /// The values are already 8-bit integers in the GGUF bytes (Q8_0): the
    /// kernels read them in place, at this offset in each block.
    pub in_place: Option<usize>,
    /// How a kernel that decodes values in registers reads them from the
    /// GGUF bytes; `None` where only the unpacked copy serves.
    pub packed: Option<Packing>,
}

/// Where a block's values lie in the GGUF bytes, for the kernels that
/// read them there (the values are the unpacked ones plus `offset`, all in
/// `0..=255`; the integer sums are exact either way, so the bits agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Packing {
    /// 8-bit values, 32 a block: the unpacked copy, or Q8_0 in place.
    Bytes,
    /// 4-bit values of a 32-block, 16 bytes from `qs`, low nibbles first;
    /// a fifth bit per value in the `u32` at `fifth` where there is one.
    Nibbles {
        qs: usize,
        fifth: Option<usize>,
        offset: u8,
    },
    /// Q4_K: the sub-blocks `2i` and `2i + 1` of a 256-block are the low
    /// and high nibbles of the 32 bytes at `16 + 32 i`.
    KNibbles,
    /// Q6_K: sub-block `t` of a 256-block (`n = t / 4`, `part = t % 4`)
    /// takes four low bits from the 32 bytes at `64 n + 32 (part % 2)`
    /// (shifted by `4 (part / 2)`) and two high bits from the 32 at
    /// `128 + 32 n` (shifted by `2 part`).
    SixBits,
}

impl Packing {
    /// What the kernel adds to a signed value to read it as unsigned.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn offset(self) -> u8 {
        match self {
            Packing::Bytes => 128,
            Packing::Nibbles { offset, .. } => offset,
            Packing::KNibbles => 0,
            Packing::SixBits => 32,
        }
    }
}

/// The integer kernels' layout for `format`, `None` for formats they do
/// not take (floats, Q2_K, Q3_K).
pub(crate) fn layout(format: Format) -> Option<Layout> {
    let block_mins = match format {
        Format::Q4_0 | Format::Q5_0 | Format::Q8_0 | Format::Q6K => false,
        Format::Q4_1 | Format::Q5_1 | Format::Q4K | Format::Q5K => true,
        _ => return None,
    };
    let nibbles = |qs, fifth, offset| Packing::Nibbles { qs, fifth, offset };
    let packed = match format {
        Format::Q4_0 => Some(nibbles(2, None, 8)),
        Format::Q4_1 => Some(nibbles(4, None, 0)),
        Format::Q5_0 => Some(nibbles(6, Some(2), 16)),
        Format::Q5_1 => Some(nibbles(8, Some(4), 0)),
        Format::Q4K => Some(Packing::KNibbles),
        Format::Q6K => Some(Packing::SixBits),
        _ => None,
    };
    Some(Layout {
        block_mins,
        in_place: (format == Format::Q8_0).then_some(2),
        packed,
    })
}

impl UnpackedRows {
    /// Unpacks `rows` consecutive rows of `cols` from their GGUF bytes;
    /// without `values`, only the scales and minimums (for a kernel that
    /// reads the values where they are).
    pub fn fill(&mut self, format: Format, bytes: &[u8], rows: usize, cols: usize, values: bool) {
        let layout = layout(format).expect("format has an integer kernel");
        let blocks = rows * cols / BLOCK;
        let value_count = if layout.in_place.is_some() || !values {
            0
        } else {
            rows * cols
        };
        self.values.resize(value_count, 0);
        self.half_scales.resize(2 * blocks, 0.0);
        self.block_mins
            .resize(if layout.block_mins { blocks } else { 0 }, 0.0);
        let source = &bytes[..format.matrix_bytes(rows, cols)];
        if value_count == 0 {
            let (half_scales, block_mins) = (&mut self.half_scales, &mut self.block_mins);
            return super::scales::fill(format, source, half_scales, block_mins);
        }
        match format {
            Format::Q4_0 => each_block::<18, 1>(source, self, q4_0),
            Format::Q4_1 => each_block::<20, 1>(source, self, q4_1),
            Format::Q5_0 => each_block::<22, 1>(source, self, q5_0),
            Format::Q5_1 => each_block::<24, 1>(source, self, q5_1),
            Format::Q8_0 => each_block::<34, 1>(source, self, q8_0),
            Format::Q4K => each_block::<144, 8>(source, self, q4_k),
            Format::Q5K => each_block::<176, 8>(source, self, q5_k),
            Format::Q6K => each_block::<210, 8>(source, self, q6_k),
            _ => unreachable!("layout() admitted only these"),
        }
    }
}

/// Runs `unpack` on each GGUF block (`BYTES` long, `SUBS` blocks of 32)
/// with its share of the rows: one loop per format, so the per-block work
/// inlines and vectorizes.
#[inline(always)]
fn each_block<const BYTES: usize, const SUBS: usize>(
    source: &[u8],
    rows: &mut UnpackedRows,
    unpack: impl Fn(&[u8; BYTES], Out),
) {
    let mut block_mins = rows.block_mins.chunks_exact_mut(SUBS);
    let mut values = rows.values.chunks_exact_mut(SUBS * BLOCK);
    let blocks = source
        .chunks_exact(BYTES)
        .zip(rows.half_scales.chunks_exact_mut(2 * SUBS));
    for (block, half_scales) in blocks {
        let out = Out {
            values: values.next().unwrap_or_default(),
            half_scales,
            block_mins: block_mins.next().unwrap_or_default(),
        };
        unpack(block.try_into().expect("chunks are BYTES long"), out);
    }
}

/// A Q6_K block's sixteen scales, `d *` the signed 8-bit scale.
#[inline(always)]
pub(super) fn q6k_scales(b: &[u8; 210], half_scales: &mut [f32; 16]) {
    let d = f16_at(b, 208);
    let scales: &[u8; 16] = b[192..208].try_into().expect("16 scales");
    *half_scales = scales.map(|s| d * s as i8 as f32);
}

/// One GGUF block's share of the unpacked rows.
pub(super) struct Out<'a> {
    pub values: &'a mut [i8],
    pub half_scales: &'a mut [f32],
    pub block_mins: &'a mut [f32],
}

pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// A 32-block's 4-bit values packed as 16 bytes, low nibbles first.
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u8; 32] {
    let qs: &[u8; 16] = qs.try_into().expect("16 bytes");
    let mut out = [0u8; 32];
    for i in 0..16 {
        out[i] = qs[i] & 0x0F;
        out[i + 16] = qs[i] >> 4;
    }
    out
}

/// Sets the fifth bit of value `e` where bit `e` of `qh` is set. Written
/// as whole-array steps with constant indices so it vectorizes (a byte
/// shuffle, a mask and a compare).
#[inline(always)]
fn fifth_bits(qh: u32, values: &mut [u8; 32]) {
    let bytes = qh.to_le_bytes();
    let spread: [u8; 32] = std::array::from_fn(|e| bytes[e / 8]);
    for (e, (v, s)) in values.iter_mut().zip(spread).enumerate() {
        let bit = 1u8 << (e % 8);
        *v |= if s & bit != 0 { 0x10 } else { 0 };
    }
}

/// Stores unsigned values minus `offset` as the kernel's signed ones.
#[inline(always)]
fn store(values: [u8; 32], offset: u8, out: &mut [i8]) {
    let out: &mut [i8; 32] = out.try_into().expect("32 values");
    for (o, v) in out.iter_mut().zip(values) {
        *o = v.wrapping_sub(offset) as i8;
    }
}

fn q4_0(b: &[u8; 18], out: Out) {
    out.half_scales.fill(f16_at(b, 0));
    if !out.values.is_empty() {
        store(nibbles(&b[2..18]), 8, out.values);
    }
}

fn q4_1(b: &[u8; 20], out: Out) {
    out.half_scales.fill(f16_at(b, 0));
    out.block_mins[0] = f16_at(b, 2);
    if !out.values.is_empty() {
        store(nibbles(&b[4..20]), 0, out.values);
    }
}

fn q5_0(b: &[u8; 22], out: Out) {
    out.half_scales.fill(f16_at(b, 0));
    if out.values.is_empty() {
        return;
    }
    let mut values = nibbles(&b[6..22]);
    fifth_bits(u32::from_le_bytes([b[2], b[3], b[4], b[5]]), &mut values);
    store(values, 16, out.values);
}

fn q5_1(b: &[u8; 24], out: Out) {
    out.half_scales.fill(f16_at(b, 0));
    out.block_mins[0] = f16_at(b, 2);
    if out.values.is_empty() {
        return;
    }
    let mut values = nibbles(&b[8..24]);
    fifth_bits(u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &mut values);
    store(values, 0, out.values);
}

/// Only the scale: the kernels read Q8_0's values in place.
fn q8_0(b: &[u8; 34], out: Out) {
    out.half_scales.fill(f16_at(b, 0));
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K/Q5_K block.
/// The eight 6-bit sub-block scales and minimums of a Q4_K/Q5_K block from
/// its 12 packed bytes (GGML's layout: scales 0-3 and minimums 0-3 in the
/// low six bits of bytes 0-3 and 4-7; scales and minimums 4-7 in the
/// nibbles of bytes 8-11 with their top two bits in the top bits of bytes
/// 0-3 and 4-7), four bytes at a time without branches.
#[inline(always)]
pub(super) fn scales_mins_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let word = |at: usize| u32::from_le_bytes([q[at], q[at + 1], q[at + 2], q[at + 3]]);
    let (low, middle, high) = (word(0), word(4), word(8));
    let six = 0x3F3F_3F3F;
    let (nibble, top) = (0x0F0F_0F0F, 0x0303_0303);
    let scales_high = (high & nibble) | ((low >> 6) & top) << 4;
    let mins_high = ((high >> 4) & nibble) | ((middle >> 6) & top) << 4;
    let join = |a: u32, b: u32| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&a.to_le_bytes());
        out[4..].copy_from_slice(&b.to_le_bytes());
        out
    };
    (join(low & six, scales_high), join(middle & six, mins_high))
}

/// Scales and minimums shared by Q4_K and Q5_K: `d * scale` per sub-block
/// of 32, minus `dmin * min`.
#[inline(always)]
pub(super) fn k4_scales(b: &[u8], out: &mut Out) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, mins) = scales_mins_k4(b[4..16].try_into().expect("12 bytes"));
    // Fixed-size arrays without branches, so the conversions vectorize.
    let scales = scales.map(|s| d * s as f32);
    let half_scales: &mut [f32; 16] = (&mut *out.half_scales).try_into().expect("16 halves");
    for (t, scale) in scales.into_iter().enumerate() {
        half_scales[2 * t] = scale;
        half_scales[2 * t + 1] = scale;
    }
    let block_mins: &mut [f32; 8] = (&mut *out.block_mins).try_into().expect("8 blocks");
    *block_mins = mins.map(|m| -(dmin * m as f32));
}

fn q4_k(b: &[u8; 144], mut out: Out) {
    k4_scales(b, &mut out);
    let qs = &b[16..144];
    for (t, block) in out.values.chunks_exact_mut(BLOCK).enumerate() {
        let (bytes, shift) = (&qs[32 * (t / 2)..][..32], 4 * (t % 2));
        let (bytes, block): (&[u8; 32], &mut [i8; 32]) =
            (bytes.try_into().expect("32"), block.try_into().expect("32"));
        for (v, q) in block.iter_mut().zip(bytes) {
            *v = ((q >> shift) & 0x0F) as i8;
        }
    }
}

fn q5_k(b: &[u8; 176], mut out: Out) {
    k4_scales(b, &mut out);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for (t, block) in out.values.chunks_exact_mut(BLOCK).enumerate() {
        let (bytes, shift) = (&qs[32 * (t / 2)..][..32], 4 * (t % 2));
        let (bytes, qh, block): (&[u8; 32], &[u8; 32], &mut [i8; 32]) = (
            bytes.try_into().expect("32"),
            qh.try_into().expect("32"),
            block.try_into().expect("32"),
        );
        for ((v, q), h) in block.iter_mut().zip(bytes).zip(qh) {
            *v = (((q >> shift) & 0x0F) | (((h >> t) & 1) << 4)) as i8;
        }
    }
}

fn q6_k(b: &[u8; 210], out: Out) {
    let (ql, qh) = (&b[0..128], &b[128..192]);
    q6k_scales(b, out.half_scales.try_into().expect("16 halves"));
    // Element `128 n + 32 part + l` takes its low four bits from `ql` and
    // its high two from `qh`, as GGML lays a Q6_K block out.
    for (t, block) in out.values.chunks_exact_mut(BLOCK).enumerate() {
        let (n, part) = (t / 4, t % 4);
        let (low, high, block): (&[u8; 32], &[u8; 32], &mut [i8; 32]) = (
            ql[64 * n + 32 * (part % 2)..][..32].try_into().expect("32"),
            qh[32 * n..][..32].try_into().expect("32"),
            block.try_into().expect("32"),
        );
        let (low_shift, high_shift) = (4 * (part / 2), 2 * part);
        for ((v, l), h) in block.iter_mut().zip(low).zip(high) {
            *v = (((l >> low_shift) & 0x0F) | (((h >> high_shift) & 3) << 4)) as i8 - 32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::values;
    use crate::Matrix;

    /// Unpacked values times their scales give candle's decoded weights.
    #[test]
    fn unpacked_rows_decode_to_candles_values() {
        for format in Format::ALL.into_iter().filter(|f| layout(*f).is_some()) {
            let (rows, cols) = (3, 512);
            let w = Matrix::from_f32(format, rows, cols, &values(rows * cols, 7)).unwrap();
            let bytes = match w.storage() {
                crate::Storage::Ggml(b) => b.as_bytes(),
                _ => unreachable!(),
            };
            let mut unpacked = UnpackedRows::default();
            unpacked.fill(format, bytes, rows, cols, true);
            let layout = layout(format).unwrap();
            let mut want = vec![0f32; cols];
            for r in 0..rows {
                w.row_f32(r, &mut want);
                for (c, want) in want.iter().enumerate() {
                    let (e, b, h) = (r * cols + c, (r * cols + c) / BLOCK, (r * cols + c) / HALF);
                    let min = if layout.block_mins {
                        unpacked.block_mins[b]
                    } else {
                        0.0
                    };
                    let value = match layout.in_place {
                        Some(offset) => bytes[b * format.block_bytes() + offset + c % BLOCK] as i8,
                        None => unpacked.values[e],
                    };
                    let got = unpacked.half_scales[h] * value as f32 + min;
                    assert!(
                        (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                        "{format} row {r} col {c}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
