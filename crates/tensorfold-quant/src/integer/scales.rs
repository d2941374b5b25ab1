//! A tile's scales and minimums alone, for the kernels that read values in
//! the GGUF bytes, at two rows and more (one row decodes them in its kernel
//! instead, with these same operations: see `Isa::decodes_scales`). Reading
//! the scales is much work beside the products, so where the CPU has
//! AVX-512 sixteen blocks (or a k-quant's whole 256-block) go through the
//! registers at once. The numbers are those of the scalar loops: every step
//! converts or multiplies exactly as they do.

use super::unpack::{f16_at, k4_scales, q6k_scales, Out};
use crate::Format;

/// Fills `half_scales` (and `block_mins`, where the format has them) from
/// the GGUF bytes of whole rows.
pub(super) fn fill(format: Format, source: &[u8], half_scales: &mut [f32], block_mins: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
    {
        // SAFETY: AVX-512 F/BW/VL run here, checked just above.
        let done = unsafe { avx512::fill(format, source, half_scales, block_mins) };
        // Formats without minimums have none to skip.
        let skipped_mins = done.min(block_mins.len());
        let (half_scales, block_mins) = (
            &mut half_scales[2 * done..],
            &mut block_mins[skipped_mins..],
        );
        let source = &source[format.matrix_bytes(1, done * super::BLOCK)..];
        return scalar(format, source, half_scales, block_mins);
    }
    scalar(format, source, half_scales, block_mins)
}

/// [`fill`], one block at a time.
fn scalar(format: Format, source: &[u8], half_scales: &mut [f32], block_mins: &mut [f32]) {
    match format {
        Format::Q4_0 => block_scales::<18>(source, half_scales),
        Format::Q4_1 => block_scales_mins::<20>(source, half_scales, block_mins),
        Format::Q5_0 => block_scales::<22>(source, half_scales),
        Format::Q5_1 => block_scales_mins::<24>(source, half_scales, block_mins),
        Format::Q8_0 => block_scales::<34>(source, half_scales),
        Format::Q4K => k4_block_scales::<144>(source, half_scales, block_mins),
        Format::Q5K => k4_block_scales::<176>(source, half_scales, block_mins),
        Format::Q6K => q6k_block_scales(source, half_scales),
        _ => unreachable!("layout() admitted only these"),
    }
}

/// The scale of each 32-block (`BYTES` long, its `f16` scale first), for
/// both its halves.
fn block_scales<const BYTES: usize>(source: &[u8], half_scales: &mut [f32]) {
    for (block, halves) in source
        .chunks_exact(BYTES)
        .zip(half_scales.chunks_exact_mut(2))
    {
        halves.fill(f16_at(block, 0));
    }
}

/// [`block_scales`] and the minimum (the `f16` after the scale).
fn block_scales_mins<const BYTES: usize>(
    source: &[u8],
    half_scales: &mut [f32],
    block_mins: &mut [f32],
) {
    for ((block, halves), min) in source
        .chunks_exact(BYTES)
        .zip(half_scales.chunks_exact_mut(2))
        .zip(block_mins.iter_mut())
    {
        halves.fill(f16_at(block, 0));
        *min = f16_at(block, 2);
    }
}

/// The scales and minimums of Q4_K or Q5_K blocks (`BYTES` long).
fn k4_block_scales<const BYTES: usize>(
    source: &[u8],
    half_scales: &mut [f32],
    block_mins: &mut [f32],
) {
    for ((block, half_scales), block_mins) in source
        .chunks_exact(BYTES)
        .zip(half_scales.chunks_exact_mut(16))
        .zip(block_mins.chunks_exact_mut(8))
    {
        let mut out = Out {
            values: &mut [],
            half_scales,
            block_mins,
        };
        k4_scales(block, &mut out);
    }
}

/// The scales of Q6_K blocks.
fn q6k_block_scales(source: &[u8], half_scales: &mut [f32]) {
    for (block, half_scales) in source
        .chunks_exact(210)
        .zip(half_scales.chunks_exact_mut(16))
    {
        let block: &[u8; 210] = block.try_into().expect("chunks are 210 long");
        let half_scales: &mut [f32; 16] = half_scales.try_into().expect("16 halves");
        q6k_scales(block, half_scales);
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use crate::Format;
    use std::arch::x86_64::*;

    /// Fills the scales (and minimums) of the first blocks of 32, sixteen
    /// or a 256-block at a time, and says how many it filled; the caller
    /// fills the rest.
    ///
    /// # Safety
    /// AVX-512 F/BW must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) fn fill(
        format: Format,
        source: &[u8],
        half_scales: &mut [f32],
        block_mins: &mut [f32],
    ) -> usize {
        match format {
            Format::Q4_0 => one_scale::<18, false>(source, half_scales, block_mins),
            Format::Q4_1 => one_scale::<20, true>(source, half_scales, block_mins),
            Format::Q5_0 => one_scale::<22, false>(source, half_scales, block_mins),
            Format::Q5_1 => one_scale::<24, true>(source, half_scales, block_mins),
            Format::Q8_0 => one_scale::<34, false>(source, half_scales, block_mins),
            Format::Q4K => k4::<144>(source, half_scales, block_mins),
            Format::Q5K => k4::<176>(source, half_scales, block_mins),
            Format::Q6K => q6k(source, half_scales),
            _ => 0,
        }
    }

    /// Lanes `[0, 0, 1, 1, ..]` from `first`: each block's scale for both
    /// its halves.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn doubled(first: i32) -> __m512i {
        let i = first;
        _mm512_setr_epi32(
            i,
            i,
            i + 1,
            i + 1,
            i + 2,
            i + 2,
            i + 3,
            i + 3,
            i + 4,
            i + 4,
            i + 5,
            i + 5,
            i + 6,
            i + 6,
            i + 7,
            i + 7,
        )
    }

    /// Blocks of 32 with one `f16` scale first (and, with `MINS`, the
    /// `f16` minimum after it), sixteen at a time: the sixteen leading
    /// words are read one by one into a register (plain loads pipeline on
    /// every x86; a gather is microcoded and slow on some, AMD's Zen 4).
    #[target_feature(enable = "avx512f,avx512bw")]
    fn one_scale<const BYTES: usize, const MINS: bool>(
        source: &[u8],
        half_scales: &mut [f32],
        block_mins: &mut [f32],
    ) -> usize {
        let groups = (half_scales.len() / 2).min(source.len() / BYTES) / 16;
        assert!(!MINS || block_mins.len() >= 16 * groups);
        let (low, high) = (doubled(0), doubled(8));
        for g in 0..groups {
            let blocks = &source[16 * g * BYTES..][..16 * BYTES];
            let leading: [u32; 16] = std::array::from_fn(|i| {
                let at = i * BYTES;
                u32::from_le_bytes([blocks[at], blocks[at + 1], blocks[at + 2], blocks[at + 3]])
            });
            // SAFETY: `leading` holds sixteen 32-bit words.
            let words = unsafe { _mm512_loadu_si512(leading.as_ptr() as *const _) };
            let scales = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
            let (first, second) = (
                _mm512_permutexvar_ps(low, scales),
                _mm512_permutexvar_ps(high, scales),
            );
            let halves = &mut half_scales[32 * g..][..32];
            // SAFETY: `halves` holds 32 floats.
            unsafe {
                _mm512_storeu_ps(halves.as_mut_ptr(), first);
                _mm512_storeu_ps(halves.as_mut_ptr().add(16), second);
            }
            if MINS {
                let mins = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(words)));
                let mins_out = &mut block_mins[16 * g..][..16];
                // SAFETY: `mins_out` holds 16 floats.
                unsafe { _mm512_storeu_ps(mins_out.as_mut_ptr(), mins) };
            }
        }
        16 * groups
    }

    /// Q4_K or Q5_K blocks (`BYTES` long), a block at a time
    /// ([`k4_head`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn k4<const BYTES: usize>(
        source: &[u8],
        half_scales: &mut [f32],
        block_mins: &mut [f32],
    ) -> usize {
        let mut done = 0;
        for ((block, half_scales), block_mins) in source
            .chunks_exact(BYTES)
            .zip(half_scales.chunks_exact_mut(16))
            .zip(block_mins.chunks_exact_mut(8))
        {
            // SAFETY: a block's first 16 bytes; `half_scales` holds 16
            // floats and `block_mins` 8.
            unsafe {
                let (scales, mins) = k4_head(_mm_loadu_si128(block.as_ptr() as *const __m128i));
                _mm512_storeu_ps(half_scales.as_mut_ptr(), scales);
                _mm256_storeu_ps(block_mins.as_mut_ptr(), mins);
            }
            done += 8;
        }
        done
    }

    /// A Q4_K or Q5_K block's sixteen half-block scales and eight
    /// minimums from its 16-byte head (`d`, `dmin`, then the twelve bytes
    /// of 6-bit scales and minimums, as `unpack::scales_mins_k4` reads
    /// them): the eight scales and eight minimums converted in one
    /// register, times `d` and `-dmin` (negating first rounds the same as
    /// negating after). The fill and the one-row kernel both call it.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    pub(in crate::integer) fn k4_head(head: __m128i) -> (__m512, __m256) {
        let d_dmin = _mm_xor_ps(_mm_cvtph_ps(head), _mm_setr_ps(0.0, -0.0, 0.0, 0.0));
        let factors = _mm512_permutexvar_ps(
            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
            _mm512_castps128_ps512(d_dmin),
        );
        // The head's words are `d_dmin, low, middle, high`; the eight
        // scales are `low & six` and `(high & nibble) | ((low >> 6) & top)
        // << 4`, the minimums the same of `middle` and `high >> 4`: all
        // four words at once from `[low, high, middle, high]` and
        // `[-, low, -, middle]`.
        let x = _mm_shuffle_epi32::<0b11_10_11_01>(head);
        let y = _mm_shuffle_epi32::<0b10_00_01_00>(head);
        let top = _mm_set1_epi32(0x0303_0303);
        let tops = _mm_slli_epi32::<4>(_mm_and_si128(_mm_srli_epi32::<6>(y), top));
        let highs = _mm_or_si128(
            _mm_and_si128(
                _mm_srlv_epi32(x, _mm_setr_epi32(0, 0, 0, 4)),
                _mm_set1_epi32(0x0F0F_0F0F),
            ),
            tops,
        );
        let lows = _mm_and_si128(x, _mm_set1_epi32(0x3F3F_3F3F));
        let bytes = _mm_blend_epi32::<0b1010>(lows, highs);
        let values = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), factors);
        let mins = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(values)));
        (_mm512_permutexvar_ps(doubled(0), values), mins)
    }

    /// Q6_K blocks: sixteen signed 8-bit scales times `d`.
    #[target_feature(enable = "avx512f,avx512bw")]
    fn q6k(source: &[u8], half_scales: &mut [f32]) -> usize {
        let mut done = 0;
        for (block, half_scales) in source
            .chunks_exact(210)
            .zip(half_scales.chunks_exact_mut(16))
        {
            let d = _mm512_set1_ps(super::f16_at(block, 208));
            // SAFETY: bytes 192..208 of the block, in bounds.
            let scales = unsafe { _mm_loadu_si128(block.as_ptr().add(192) as *const __m128i) };
            let scaled = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scales)));
            // SAFETY: `half_scales` holds 16 floats.
            unsafe { _mm512_storeu_ps(half_scales.as_mut_ptr(), scaled) };
            done += 8;
        }
        done
    }
}
