//! GGUF block-quantized storage, decoded with candle's block definitions.

use crate::{Format, QuantError};
use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, GgmlType,
};

/// A matrix's quantized blocks, row after row, typed by format.
#[derive(Clone)]
pub enum GgmlBlocks {
    Q4_0(Vec<BlockQ4_0>),
    Q4_1(Vec<BlockQ4_1>),
    Q5_0(Vec<BlockQ5_0>),
    Q5_1(Vec<BlockQ5_1>),
    Q8_0(Vec<BlockQ8_0>),
    Q2K(Vec<BlockQ2K>),
    Q3K(Vec<BlockQ3K>),
    Q4K(Vec<BlockQ4K>),
    Q5K(Vec<BlockQ5K>),
    Q6K(Vec<BlockQ6K>),
}

/// Copies raw little-endian GGUF bytes into typed blocks.
fn blocks_from_bytes<T: GgmlType>(bytes: &[u8]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    assert_eq!(bytes.len() % size, 0, "block bytes must be whole blocks");
    let n = bytes.len() / size;
    let mut out: Vec<T> = Vec::with_capacity(n);
    huge_pages(out.as_mut_ptr() as *mut u8, bytes.len());
    // SAFETY: candle's block types are `repr(C)` plain data (f16 and byte
    // arrays) whose size equals the GGUF block size (checked by the caller
    // against `Format::block_bytes`), so any byte pattern is a valid value;
    // `out` has room for exactly `bytes.len()` bytes, all written here
    // before the length is set, and the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr() as *mut u8, bytes.len());
        out.set_len(n);
    }
    out
}

/// Asks Linux to back a large, not yet touched buffer with huge pages:
/// decoding streams every weight once per token, and huge pages spare the
/// TLB misses of a 4 KiB page every 4 KiB.
fn huge_pages(start: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        if len < 2 * HUGE {
            return;
        }
        let page = 4096;
        let aligned = (start as usize).next_multiple_of(page);
        let end = (start as usize + len) / page * page;
        // SAFETY: advice only, on whole pages inside this allocation; a
        // refusal (no transparent huge pages) leaves it as it was.
        unsafe {
            libc::madvise(
                aligned as *mut libc::c_void,
                end - aligned,
                libc::MADV_HUGEPAGE,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len);
}

fn blocks_to_bytes<T>(blocks: &[T]) -> &[u8] {
    // SAFETY: plain-data blocks (see above) viewed as their bytes.
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr() as *const u8, std::mem::size_of_val(blocks))
    }
}

macro_rules! each_format {
    ($self:expr, $v:ident => $body:expr) => {
        match $self {
            GgmlBlocks::Q4_0($v) => $body,
            GgmlBlocks::Q4_1($v) => $body,
            GgmlBlocks::Q5_0($v) => $body,
            GgmlBlocks::Q5_1($v) => $body,
            GgmlBlocks::Q8_0($v) => $body,
            GgmlBlocks::Q2K($v) => $body,
            GgmlBlocks::Q3K($v) => $body,
            GgmlBlocks::Q4K($v) => $body,
            GgmlBlocks::Q5K($v) => $body,
            GgmlBlocks::Q6K($v) => $body,
        }
    };
}

impl GgmlBlocks {
    /// Builds from raw bytes; `format` must be a block-quantized format.
    pub fn from_bytes(format: Format, bytes: &[u8]) -> Result<GgmlBlocks, QuantError> {
        fn check<T>(format: Format) {
            assert_eq!(
                std::mem::size_of::<T>(),
                format.block_bytes(),
                "{format} block layout"
            );
        }
        macro_rules! make {
            ($variant:ident, $ty:ty) => {{
                check::<$ty>(format);
                GgmlBlocks::$variant(blocks_from_bytes::<$ty>(bytes))
            }};
        }
        Ok(match format {
            Format::Q4_0 => make!(Q4_0, BlockQ4_0),
            Format::Q4_1 => make!(Q4_1, BlockQ4_1),
            Format::Q5_0 => make!(Q5_0, BlockQ5_0),
            Format::Q5_1 => make!(Q5_1, BlockQ5_1),
            Format::Q8_0 => make!(Q8_0, BlockQ8_0),
            Format::Q2K => make!(Q2K, BlockQ2K),
            Format::Q3K => make!(Q3K, BlockQ3K),
            Format::Q4K => make!(Q4K, BlockQ4K),
            Format::Q5K => make!(Q5K, BlockQ5K),
            Format::Q6K => make!(Q6K, BlockQ6K),
            Format::F32 | Format::F16 | Format::Bf16 => {
                unreachable!("float formats are not block-quantized")
            }
        })
    }

    /// Quantizes `rows x cols` f32 values (row-major) with candle's reference
    /// quantizers.
    pub fn quantize(format: Format, values: &[f32]) -> GgmlBlocks {
        macro_rules! make {
            ($variant:ident, $ty:ty) => {{
                let n = values.len() / <$ty>::BLCK_SIZE;
                let mut blocks: Vec<$ty> = (0..n).map(|_| <$ty>::zeros()).collect();
                <$ty>::from_float(values, &mut blocks);
                GgmlBlocks::$variant(blocks)
            }};
        }
        match format {
            Format::Q4_0 => make!(Q4_0, BlockQ4_0),
            Format::Q4_1 => make!(Q4_1, BlockQ4_1),
            Format::Q5_0 => make!(Q5_0, BlockQ5_0),
            Format::Q5_1 => make!(Q5_1, BlockQ5_1),
            Format::Q8_0 => make!(Q8_0, BlockQ8_0),
            Format::Q2K => make!(Q2K, BlockQ2K),
            Format::Q3K => make!(Q3K, BlockQ3K),
            Format::Q4K => make!(Q4K, BlockQ4K),
            Format::Q5K => make!(Q5K, BlockQ5K),
            Format::Q6K => make!(Q6K, BlockQ6K),
            Format::F32 | Format::F16 | Format::Bf16 => {
                unreachable!("float formats are not block-quantized")
            }
        }
    }

    pub fn format(&self) -> Format {
        match self {
            GgmlBlocks::Q4_0(_) => Format::Q4_0,
            GgmlBlocks::Q4_1(_) => Format::Q4_1,
            GgmlBlocks::Q5_0(_) => Format::Q5_0,
            GgmlBlocks::Q5_1(_) => Format::Q5_1,
            GgmlBlocks::Q8_0(_) => Format::Q8_0,
            GgmlBlocks::Q2K(_) => Format::Q2K,
            GgmlBlocks::Q3K(_) => Format::Q3K,
            GgmlBlocks::Q4K(_) => Format::Q4K,
            GgmlBlocks::Q5K(_) => Format::Q5K,
            GgmlBlocks::Q6K(_) => Format::Q6K,
        }
    }

    /// The blocks as GGUF stores them.
    pub fn as_bytes(&self) -> &[u8] {
        each_format!(self, v => blocks_to_bytes(v))
    }

    /// Decodes row `row` of a matrix with `cols` columns into `out`.
    ///
    /// The 32-element formats decode from their bytes with straight-line
    /// loops the compiler vectorizes; k-quants use candle's decoders. Both
    /// compute `d * q (+ m)` per element as GGML defines it.
    pub fn dequantize_row(&self, row: usize, cols: usize, out: &mut [f32]) {
        let format = self.format();
        let per_row = cols / format.block_elems();
        let bb = format.block_bytes();
        let bytes = &self.as_bytes()[row * per_row * bb..(row + 1) * per_row * bb];
        let out = &mut out[..cols];
        match format {
            Format::Q4_0 => decode_q4_0(bytes, out),
            Format::Q4_1 => decode_q4_1(bytes, out),
            Format::Q5_0 => decode32(bytes, bb, out, |b, o| {
                let d = f16_at(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                for j in 0..16 {
                    let h0 = ((qh >> j) << 4) & 0x10;
                    let h1 = (qh >> (j + 12)) & 0x10;
                    o[j] = (((b[6 + j] & 0x0F) as u32 | h0) as i32 - 16) as f32 * d;
                    o[j + 16] = (((b[6 + j] >> 4) as u32 | h1) as i32 - 16) as f32 * d;
                }
            }),
            Format::Q5_1 => decode32(bytes, bb, out, |b, o| {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                for j in 0..16 {
                    let h0 = ((qh >> j) << 4) & 0x10;
                    let h1 = (qh >> (j + 12)) & 0x10;
                    o[j] = ((b[8 + j] & 0x0F) as u32 | h0) as f32 * d + m;
                    o[j + 16] = ((b[8 + j] >> 4) as u32 | h1) as f32 * d + m;
                }
            }),
            Format::Q8_0 => decode_q8_0(bytes, out),
            _ => each_format!(self, v => {
                GgmlType::to_float(&v[row * per_row..(row + 1) * per_row], out);
            }),
        }
    }
}

/// Q4_0 blocks: `(q - 8) * d`, low nibbles first.
fn decode_q4_0(bytes: &[u8], out: &mut [f32]) {
    #[cfg(tensorfold_simd)]
    simd::q4_0(bytes, out);
    #[cfg(not(tensorfold_simd))]
    portable_q4_0(bytes, out);
}

/// Q4_1 blocks: `q * d + m`, low nibbles first.
fn decode_q4_1(bytes: &[u8], out: &mut [f32]) {
    #[cfg(tensorfold_simd)]
    simd::q4_1(bytes, out);
    #[cfg(not(tensorfold_simd))]
    portable_q4_1(bytes, out);
}

/// Q8_0 blocks: `q * d`.
fn decode_q8_0(bytes: &[u8], out: &mut [f32]) {
    #[cfg(tensorfold_simd)]
    simd::q8_0(bytes, out);
    #[cfg(not(tensorfold_simd))]
    portable_q8_0(bytes, out);
}

#[cfg_attr(tensorfold_simd, allow(dead_code))]
fn portable_q4_0(bytes: &[u8], out: &mut [f32]) {
    decode32(bytes, 18, out, |b, o| {
        let d = f16_at(b, 0);
        for j in 0..16 {
            o[j] = ((b[2 + j] & 0x0F) as i32 - 8) as f32 * d;
            o[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
        }
    })
}

#[cfg_attr(tensorfold_simd, allow(dead_code))]
fn portable_q4_1(bytes: &[u8], out: &mut [f32]) {
    decode32(bytes, 20, out, |b, o| {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for j in 0..16 {
            o[j] = (b[4 + j] & 0x0F) as f32 * d + m;
            o[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
        }
    })
}

#[cfg_attr(tensorfold_simd, allow(dead_code))]
fn portable_q8_0(bytes: &[u8], out: &mut [f32]) {
    decode32(bytes, 34, out, |b, o| {
        let d = f16_at(b, 0);
        for j in 0..32 {
            o[j] = (b[2 + j] as i8) as f32 * d;
        }
    })
}

/// AVX2 decoders: the same products and sums as the portable ones
/// (`mul` then `add`, never fused, as GGML defines them), eight at a time.
#[cfg(tensorfold_simd)]
mod simd {
    use super::f16_at;
    use std::arch::x86_64::*;

    /// Eight small integers, scaled: `i * d (+ m)`, stored to `o`.
    ///
    /// # Safety
    /// `o` must be valid for writes of eight floats.
    #[inline(always)]
    unsafe fn put(o: *mut f32, i: __m256i, d: __m256, m: Option<__m256>) {
        // SAFETY: the caller's bound; AVX2 is enabled at compile time.
        unsafe {
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(i), d);
            let v = match m {
                Some(m) => _mm256_add_ps(v, m),
                None => v,
            };
            _mm256_storeu_ps(o, v);
        }
    }

    /// Sixteen packed bytes of nibbles as 32 values: low nibbles to
    /// `o[0..16]`, high nibbles to `o[16..32]`, each minus `bias`.
    ///
    /// # Safety
    /// `q` readable for 16 bytes, `o` writable for 32 floats.
    #[inline(always)]
    unsafe fn nibbles(q: *const u8, o: *mut f32, bias: i32, d: __m256, m: Option<__m256>) {
        // SAFETY: the caller's bounds; AVX2 is enabled at compile time.
        unsafe {
            let q = _mm_loadu_si128(q as *const __m128i);
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(q, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
            let b = _mm256_set1_epi32(bias);
            for (half, at) in [(lo, 0), (hi, 16)] {
                let a = _mm256_sub_epi32(_mm256_cvtepu8_epi32(half), b);
                let c = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(half, 8)), b);
                put(o.add(at), a, d, m);
                put(o.add(at + 8), c, d, m);
            }
        }
    }

    pub(super) fn q4_0(bytes: &[u8], out: &mut [f32]) {
        for (b, o) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
            let d = f16_at(b, 0);
            // SAFETY: `b` holds 18 bytes (16 after offset 2), `o` 32 floats.
            unsafe { nibbles(b[2..].as_ptr(), o.as_mut_ptr(), 8, _mm256_set1_ps(d), None) }
        }
    }

    pub(super) fn q4_1(bytes: &[u8], out: &mut [f32]) {
        for (b, o) in bytes.chunks_exact(20).zip(out.chunks_exact_mut(32)) {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            // SAFETY: `b` holds 20 bytes (16 after offset 4), `o` 32 floats.
            unsafe {
                nibbles(
                    b[4..].as_ptr(),
                    o.as_mut_ptr(),
                    0,
                    _mm256_set1_ps(d),
                    Some(_mm256_set1_ps(m)),
                )
            }
        }
    }

    pub(super) fn q8_0(bytes: &[u8], out: &mut [f32]) {
        for (b, o) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
            let d = f16_at(b, 0);
            // SAFETY: `b` holds 34 bytes (32 after offset 2), read 8 at a
            // time; `o` holds 32 floats.
            unsafe {
                let dv = _mm256_set1_ps(d);
                for g in 0..4 {
                    let q = _mm_loadl_epi64(b[2 + 8 * g..].as_ptr() as *const __m128i);
                    put(o.as_mut_ptr().add(8 * g), _mm256_cvtepi8_epi32(q), dv, None);
                }
            }
        }
    }
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Decodes consecutive 32-element blocks of `block_bytes` bytes each.
#[inline(always)]
fn decode32(bytes: &[u8], block_bytes: usize, out: &mut [f32], f: impl Fn(&[u8], &mut [f32; 32])) {
    for (b, o) in bytes
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(32))
    {
        f(b, o.try_into().expect("32 values"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte decoders agree with candle's reference decoders bitwise.
    #[test]
    fn fast_decoders_match_candle() {
        let vals: Vec<f32> = (0..4 * 256)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 3.0)
            .collect();
        for f in [
            Format::Q4_0,
            Format::Q4_1,
            Format::Q5_0,
            Format::Q5_1,
            Format::Q8_0,
        ] {
            let b = GgmlBlocks::quantize(f, &vals);
            let mut fast = vec![0f32; 256];
            let mut slow = vec![0f32; 256];
            for r in 0..4 {
                b.dequantize_row(r, 256, &mut fast);
                each_format!(&b, v => GgmlType::to_float(&v[r * 8..(r + 1) * 8], &mut slow));
                assert_eq!(fast, slow, "{f}");
            }
        }
    }

    /// The vector decoders give the portable decoders' bits, on quantized
    /// data and on arbitrary bytes with finite scales.
    #[test]
    fn vector_decoders_equal_portable_ones() {
        type Decode = fn(&[u8], &mut [f32]);
        let pairs: [(usize, usize, Decode, Decode); 3] = [
            (18, 2, decode_q4_0, portable_q4_0),
            (20, 4, decode_q4_1, portable_q4_1),
            (34, 2, decode_q8_0, portable_q8_0),
        ];
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for (bb, scales, fast, portable) in pairs {
            let blocks = 64;
            let mut bytes: Vec<u8> = (0..blocks * bb)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s as u8
                })
                .collect();
            for b in bytes.chunks_exact_mut(bb) {
                for at in (0..scales).step_by(2) {
                    b[at + 1] &= 0x3B; // exponent below all-ones: finite
                }
            }
            let (mut a, mut b) = (vec![0f32; blocks * 32], vec![0f32; blocks * 32]);
            fast(&bytes, &mut a);
            portable(&bytes, &mut b);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "block of {bb} bytes");
        }
    }
}
