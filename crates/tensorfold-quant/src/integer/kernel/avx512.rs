//! The AVX-512 kernels: few rows from the packed weights, rows in lanes for
//! a verify window, and the wide kernel for many rows; all in the order of
//! [`super::reference`].

use super::{Operands, Packing, Rows, BLOCK, SPAN};
use crate::integer::lanes::{in_lanes, RowSpan};
use crate::integer::scales::avx512::k4_head;
use crate::integer::wide::{InputSpan, WeightSpan, ROWS};
use crate::integer::TILE;
use std::arch::x86_64::*;
use std::ptr::addr_of;

/// How `main` reads weight values (a constant, so each way compiles to
/// its own loop): see [`Packing`].
pub const BYTES: u8 = 0;
pub const NIBBLES: u8 = 1;
pub const FIFTH_BITS: u8 = 2;
pub const K_NIBBLES: u8 = 3;
pub const SIX_BITS: u8 = 4;

/// Where a kernel reading the GGUF bytes asks the memory for the next
/// tile's, a line at a time as it goes (see [`super::Values::ahead`]).
#[derive(Clone, Copy)]
struct NextTile {
    w: *const i8,
    row_stride: usize,
    /// Where block `b` of a row starts in its bytes, in 16.16 fixed
    /// point.
    block_bytes: usize,
    ahead: usize,
}

impl NextTile {
    fn new(w: *const i8, row_stride: usize, blocks: usize, ahead: usize) -> NextTile {
        NextTile {
            w,
            row_stride,
            block_bytes: (row_stride << 16) / blocks,
            ahead,
        }
    }

    /// Asks for weight row `j`'s bytes at block `b`, one tile on.
    #[inline(always)]
    fn ask(self, j: usize, b: usize) {
        if self.ahead != 0 {
            let at = j * self.row_stride + ((b * self.block_bytes) >> 16) + self.ahead;
            // SAFETY: a prefetch reads nothing, so any address will do:
            // this one is the next tile's, or past the matrix's end where
            // that tile is narrower; SSE is part of every x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.w.wrapping_add(at)) };
        }
    }
}

/// `packing`'s mode and, for nibbles, where a block's values and its
/// fifth bits start.
fn mode(packing: Packing) -> (u8, usize, usize) {
    match packing {
        Packing::Bytes => (BYTES, 0, 0),
        Packing::Nibbles {
            qs, fifth: None, ..
        } => (NIBBLES, qs, 0),
        Packing::Nibbles {
            qs,
            fifth: Some(fifth),
            ..
        } => (FIFTH_BITS, qs, fifth),
        Packing::KNibbles => (K_NIBBLES, 0, 0),
        Packing::SixBits => (SIX_BITS, 0, 0),
    }
}

/// Spans of a chunk in [`few_rows`]: the inputs' records of up to
/// [`super::LANE_ROWS`] rows (384 bytes a span and row) in the L1 cache.
const CHUNK_SPANS: usize = 8;

/// The integer and float parts of [`super::reference`] for `R x W`
/// dots, a span of eight blocks at a time: one register holds the
/// running sums of a dot. VNNI's `dpbusd` sums four unsigned-by-signed
/// 8-bit products per lane exactly, so the weights enter as unsigned
/// values (the signed ones plus the packing's offset) and each half
/// block starts from `-offset *` its inputs' sum; a block pair's
/// sixteen lanes of four are summed four by four into its four half
/// blocks, four pairs' worth at once, and put in order. Packed values
/// are decoded in registers, straight from the GGUF bytes; the integer
/// sums, and so the bits, are those of the unpacked values. Where
/// `ops.own_scales`, so are the weights' scales and minimums, and the
/// minimums' term (otherwise added by [`super::dots`]) is added here.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI must be available, and `MODE` must match the
/// values' packing.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn main<const R: usize, const W: usize, const MODE: u8>(
    ops: &Operands,
) -> [[f32; W]; R] {
    let rows = Rows::new(ops, R, W);
    let Rows {
        x,
        cols,
        x_scales,
        w,
        row_stride,
        block_stride,
        half_scales,
        blocks,
        packing,
        ahead,
    } = rows;
    let (mode, qs, fifth) = mode(packing);
    assert_eq!(mode, MODE, "the kernel's mode is the values' packing");
    let zero = _mm512_setzero_si512();
    let offset = _mm512_set1_epi8(packing.offset() as i8);
    let low_nibbles = _mm512_set1_epi8(0x0F);
    let fifth_bit = _mm512_set1_epi8(0x10);
    let two_bits = _mm512_set1_epi8(3);
    // Q6_K's high-bit shifts for the sub-block pairs of parts (0, 1)
    // and (2, 3): each 16-bit lane of the low 256 bits by the first.
    let split = |low: i16, high: i16| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi16(low)),
            _mm256_set1_epi16(high),
        )
    };
    let (high_shifts_01, high_shifts_23) = (split(0, 2), split(4, 6));
    // 128-bit lanes `[a, a, b, b]` from `[a, b, .., ..]`.
    let doubled = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
    // The unsigned values of blocks `b` and, where `pair`, `b + 1` of
    // weight row `j`: 32 bytes each (zeros for a missing odd block).
    macro_rules! unsigned_values {
        ($j:expr, $b:expr, $pair:expr) => {{
            let (j, b): (usize, usize) = ($j, $b);
            // SAFETY (every read below): blocks `b..b + 1 + pair` of
            // weight row `j < W`, checked in `Rows::new` for this
            // packing.
            match MODE {
                BYTES => {
                    let at = w.wrapping_add(j * row_stride + b * block_stride);
                    let wv = unsafe {
                        let even = _mm256_loadu_si256(at as *const __m256i);
                        if $pair {
                            let odd = _mm256_loadu_si256(at.add(block_stride) as *const __m256i);
                            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(even), odd)
                        } else {
                            _mm512_zextsi256_si512(even)
                        }
                    };
                    _mm512_xor_si512(wv, offset)
                }
                NIBBLES | FIFTH_BITS => {
                    let at = w.wrapping_add(j * row_stride + b * block_stride);
                    let (even, odd) = unsafe {
                        let even = _mm_loadu_si128(at.add(qs) as *const __m128i);
                        let odd = if $pair {
                            _mm_loadu_si128(at.add(block_stride + qs) as *const __m128i)
                        } else {
                            _mm_setzero_si128()
                        };
                        (even, odd)
                    };
                    // Low nibbles are a block's first 16 values, high
                    // nibbles its last 16.
                    let both = _mm512_castsi256_si512(_mm256_set_m128i(odd, even));
                    let twice = _mm512_permutexvar_epi64(doubled, both);
                    let high = _mm512_srli_epi16::<4>(twice);
                    let nibbles = _mm512_mask_blend_epi64(0b1100_1100, twice, high);
                    let values = _mm512_and_si512(nibbles, low_nibbles);
                    if MODE == FIFTH_BITS {
                        // Bit `e` of a block's `u32` is value `e`'s
                        // fifth bit: byte `e` (or `32 + e`) here.
                        let bits = unsafe {
                            let even = (at.add(fifth) as *const u32).read_unaligned();
                            let odd = if $pair {
                                (at.add(block_stride + fifth) as *const u32).read_unaligned()
                            } else {
                                0
                            };
                            even as u64 | (odd as u64) << 32
                        };
                        _mm512_or_si512(values, _mm512_maskz_mov_epi8(bits, fifth_bit))
                    } else {
                        values
                    }
                }
                SIX_BITS => {
                    // `b` is even: parts (0, 1) or (2, 3) of one `n`,
                    // whose low bits are 64 consecutive bytes.
                    let (n, part) = ((b % 8) / 4, b % 4);
                    let block = w.wrapping_add(j * row_stride + (b / 8) * block_stride);
                    let (low, high) = unsafe {
                        let low = _mm512_loadu_si512(block.add(64 * n) as *const __m512i);
                        let high = _mm256_loadu_si256(block.add(128 + 32 * n) as *const __m256i);
                        (low, high)
                    };
                    let low = if part == 0 {
                        low
                    } else {
                        _mm512_srli_epi16::<4>(low)
                    };
                    let high = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(high), high);
                    let shifts = if part == 0 {
                        high_shifts_01
                    } else {
                        high_shifts_23
                    };
                    let high = _mm512_and_si512(_mm512_srlv_epi16(high, shifts), two_bits);
                    let low = _mm512_and_si512(low, low_nibbles);
                    _mm512_or_si512(low, _mm512_slli_epi16::<4>(high))
                }
                _ => {
                    // K_NIBBLES: `b` is even, so `b` and `b + 1` are the
                    // low and high nibbles of one 32-byte run.
                    let run = 16 + 32 * ((b % 8) / 2);
                    let at = w.wrapping_add(j * row_stride + (b / 8) * block_stride + run);
                    let bytes = unsafe { _mm256_loadu_si256(at as *const __m256i) };
                    let both = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(bytes),
                        _mm256_srli_epi16::<4>(bytes),
                    );
                    _mm512_and_si512(both, low_nibbles)
                }
            }
        }};
    }
    let next_tile = NextTile::new(w, row_stride, blocks, ahead);
    // `sum_fours` leaves half block `4 c + k` of a span at `4 k + c`.
    let in_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    // Each block's scale for both its half blocks.
    let each_twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    // Whether the kernel decodes the weights' scales itself (see
    // `Isa::decodes_scales`), and so also adds their minimums' term.
    let own_scales = ops.own_scales;
    // A 32-block's scale (and minimum) lead its bytes, `scale_back` before
    // its values where those are read in place (Q8_0).
    let scale_back = ops.values.start;
    // Then the minimums' running sums: the eight lanes of
    // [`crate::dot`]'s order, a span's eight blocks a step ...
    let block_sums = if own_scales && ops.layout.block_mins {
        let sums = &ops.inputs.block_sums[ops.r0 * blocks..];
        assert!(sums.len() >= R * blocks);
        sums
    } else {
        &[]
    };
    let mut min_acc = [[_mm256_setzero_ps(); W]; R];
    // ... and the sum of a row's last blocks past its last eight, in
    // order (`crate::dot`'s tail).
    let mut min_tail = [[0f32; W]; R];
    // The scales of the span of `n` blocks from `b` of weight row `j` as
    // `scales::fill` computes them, from the same operands with the same
    // operations (so the same bits): sixteen half-block factors and,
    // where the format has them, the eight blocks' minimums (for Q4_K
    // `-dmin *` each).
    macro_rules! own_scales {
        ($j:expr, $b:expr, $n:expr) => {{
            let (j, b, n): (usize, usize, usize) = ($j, $b, $n);
            let block = w.wrapping_add(j * row_stride + (b / 8) * block_stride);
            if MODE != K_NIBBLES && MODE != SIX_BITS {
                // 32-blocks: the leading word of each holds its `f16`
                // scale and, where it has one, its minimum.
                let first = w
                    .wrapping_add(j * row_stride + b * block_stride)
                    .wrapping_sub(scale_back);
                let word = |k: usize| {
                    if k < n {
                        // SAFETY: the first bytes of block `b + k` of
                        // row `j`, checked in `Rows::new` (each block is
                        // longer than four bytes).
                        unsafe { (first.add(k * block_stride) as *const i32).read_unaligned() }
                    } else {
                        0
                    }
                };
                let words = _mm256_setr_epi32(
                    word(0),
                    word(1),
                    word(2),
                    word(3),
                    word(4),
                    word(5),
                    word(6),
                    word(7),
                );
                let scales = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(words));
                let mins = if block_sums.is_empty() {
                    _mm256_setzero_ps()
                } else {
                    _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(words)))
                };
                (
                    _mm512_permutexvar_ps(each_twice, _mm512_castps256_ps512(scales)),
                    mins,
                )
            } else if MODE == K_NIBBLES {
                // SAFETY: the block's 16-byte head, checked in
                // `Rows::new` with the block.
                k4_head(unsafe { _mm_loadu_si128(block as *const __m128i) })
            } else {
                // SIX_BITS: sixteen signed scales at byte 192, `d` at 208.
                // SAFETY: inside the 210-byte block, as above.
                let (scales, d) = unsafe {
                    (
                        _mm_loadu_si128(block.add(192) as *const __m128i),
                        (block.add(208) as *const u16).read_unaligned(),
                    )
                };
                let d = _mm_cvtph_ps(_mm_cvtsi32_si128(d as i32));
                let d = _mm512_broadcastss_ps(d);
                let values = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scales)));
                (values, _mm256_setzero_ps())
            }
        }};
    }
    // The span of blocks from `b`: `n` blocks (eight, but for a row's
    // last span), as `pairs` pairs and, where `lone`, a last lone block.
    macro_rules! span {
        ($b:expr, $n:expr, $pairs:expr, $lone:expr) => {{
            let (b, n, pairs): (usize, usize, usize) = ($b, $n, $pairs);
            let half_lanes: u16 = if n == SPAN { !0 } else { (1u16 << (2 * n)) - 1 };
            let block_lanes: u8 = if n == SPAN { !0 } else { (1u8 << n) - 1 };
            let mut xv = [[zero; 4]; R];
            let mut starts = [zero; R];
            let mut x_factors = [_mm512_setzero_ps(); R];
            for r in 0..R {
                let mut start_lanes = [zero; 4];
                for c in 0..pairs + $lone as usize {
                    let bytes: u64 = if $lone && c == pairs { !0 >> 32 } else { !0 };
                    // SAFETY: the masked bytes lie in blocks `b..b + n`
                    // of input row `r`, checked in `Rows::new`.
                    xv[r][c] = unsafe {
                        _mm512_maskz_loadu_epi8(bytes, x.add(r * cols + (b + 2 * c) * BLOCK))
                    };
                    start_lanes[c] = _mm512_dpbusd_epi32(zero, offset, xv[r][c]);
                }
                starts[r] = _mm512_sub_epi32(zero, sum_fours(start_lanes));
                // SAFETY: the mask loads only the scales of blocks
                // `b..b + n`, in `x_scales`.
                let scales = unsafe {
                    _mm512_maskz_loadu_ps(block_lanes as u16, x_scales[r * blocks + b..].as_ptr())
                };
                x_factors[r] = _mm512_permutexvar_ps(each_twice, scales);
            }
            // The inputs' block sums that the minimums multiply.
            let mut x_sums = [_mm256_setzero_ps(); R];
            if !block_sums.is_empty() {
                for (r, sums) in x_sums.iter_mut().enumerate() {
                    // SAFETY: the mask loads only blocks `b..b + n` of row
                    // `r`, in `block_sums` (asserted above).
                    *sums = unsafe {
                        _mm256_maskz_loadu_ps(block_lanes, block_sums[r * blocks + b..].as_ptr())
                    };
                }
            }
            for j in 0..W {
                let (w_factors, w_mins) = if own_scales {
                    own_scales!(j, b, n)
                } else {
                    // SAFETY: the mask loads only the half scales of
                    // blocks `b..b + n` of weight row `j`.
                    let loaded = unsafe {
                        _mm512_maskz_loadu_ps(
                            half_lanes,
                            half_scales[j * 2 * blocks + 2 * b..].as_ptr(),
                        )
                    };
                    (loaded, _mm256_setzero_ps())
                };
                if !block_sums.is_empty() {
                    if n == SPAN {
                        for r in 0..R {
                            min_acc[r][j] = _mm256_fmadd_ps(x_sums[r], w_mins, min_acc[r][j]);
                        }
                    } else {
                        let mut mins = [0f32; SPAN];
                        // SAFETY: eight floats into eight.
                        unsafe { _mm256_storeu_ps(mins.as_mut_ptr(), w_mins) };
                        for r in 0..R {
                            let mut sums = [0f32; SPAN];
                            // SAFETY: as above.
                            unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), x_sums[r]) };
                            for k in 0..n {
                                min_tail[r][j] = sums[k].mul_add(mins[k], min_tail[r][j]);
                            }
                        }
                    }
                }
                let mut lanes = [[zero; 4]; R];
                for c in 0..pairs + $lone as usize {
                    next_tile.ask(j, b + 2 * c);
                    let unsigned = unsigned_values!(j, b + 2 * c, !($lone && c == pairs));
                    for r in 0..R {
                        lanes[r][c] = _mm512_dpbusd_epi32(zero, unsigned, xv[r][c]);
                    }
                }
                for r in 0..R {
                    let sums = _mm512_add_epi32(sum_fours(lanes[r]), starts[r]);
                    let sums = _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(in_order, sums));
                    let factors = _mm512_mul_ps(w_factors, x_factors[r]);
                    acc[r][j] = _mm512_mask3_fmadd_ps(factors, sums, acc[r][j], half_lanes);
                }
            }
        }};
    }
    let mut b = 0;
    while b + SPAN <= blocks {
        span!(b, SPAN, 4, false);
        b += SPAN;
    }
    if b < blocks {
        let n = blocks - b;
        if n % 2 == 1 {
            span!(b, n, n / 2, true);
        } else {
            span!(b, n, n / 2, false);
        }
    }
    let mut out = finish(&acc);
    if !block_sums.is_empty() {
        // The minimums added last, as `dots` adds [`crate::dot`]'s sum.
        for r in 0..R {
            for j in 0..W {
                out[r][j] += combined_eight(min_acc[r][j]) + min_tail[r][j];
            }
        }
    }
    out
}

/// Per 128-bit lane `k`, element `i` the sum of the four 32-bit
/// elements of `v[i]`'s lane `k` (exact integer adds).
#[target_feature(enable = "avx512f")]
#[inline]
fn sum_fours(v: [__m512i; 4]) -> __m512i {
    let even = _mm512_add_epi32(
        _mm512_unpacklo_epi32(v[0], v[1]),
        _mm512_unpackhi_epi32(v[0], v[1]),
    );
    let odd = _mm512_add_epi32(
        _mm512_unpacklo_epi32(v[2], v[3]),
        _mm512_unpackhi_epi32(v[2], v[3]),
    );
    _mm512_add_epi32(
        _mm512_unpacklo_epi64(even, odd),
        _mm512_unpackhi_epi64(even, odd),
    )
}

/// The integer and float parts of [`super::reference`] for `R x W`
/// dots, a span of eight blocks at a time, in the lane layout (see
/// [`lanes`](super::super::lanes)): the input rows come laid out once
/// a call, and a weight row's span is put in lanes in registers,
/// straight from the GGUF bytes, once for all `R` input rows. Then four
/// `dpbusd` give a dot's sixteen half-block sums, and one multiply and
/// one fused multiply-add put them in its running sums: no shuffles
/// per dot. VNNI's `dpbusd` multiplies unsigned by signed bytes, so the
/// weights enter as unsigned values (the signed ones plus the packing's
/// offset) and each half block starts from `-offset *` its inputs' sum.
/// The integer sums, and so the bits, are those of the unpacked values.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI must be available, and `MODE` must match the
/// values' packing.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn few_rows<const R: usize, const W: usize, const MODE: u8>(
    ops: &Operands,
) -> [[f32; W]; R] {
    let rows = Rows::new(ops, R, W);
    let Rows {
        w,
        row_stride,
        block_stride,
        half_scales,
        blocks,
        packing,
        ahead,
        ..
    } = rows;
    let spans = blocks.div_ceil(SPAN);
    let in_lanes_inputs = ops
        .lanes
        .expect("laid out for every call of two rows and more");
    let mut inputs: [&[RowSpan]; R] = [&[]; R];
    for (r, input) in inputs.iter_mut().enumerate() {
        *input = in_lanes_inputs.row(ops.r0 + r);
        assert_eq!(input.len(), spans);
    }
    let (mode, qs, fifth) = mode(packing);
    assert_eq!(mode, MODE, "the kernel's mode is the values' packing");
    let zero = _mm512_setzero_si512();
    let low_nibbles = _mm512_set1_epi8(0x0F);
    let offset = packing.offset();
    assert!(offset == 0 || offset.is_power_of_two());
    let offset_shift = _mm_cvtsi32_si128(offset.trailing_zeros() as i32);
    // Per mode, the words each lane takes for part 0 (part `c` takes
    // the word `c` after), and the shifts that bring its values down.
    #[rustfmt::skip]
    let (first_words, high_first_words, low_shifts, high_shifts) = match MODE {
        // Lane `l`: the quarter of block `l / 2` (blocks 0-3 in the
        // first table, 4-7 in the second), high nibbles for odd `l`.
        NIBBLES | FIFTH_BITS => (
            _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28),
            zero, zero, zero,
        ),
        // The 128 bytes of a 256-block's nibbles: run `l / 4`, its
        // second half for odd `l`, high nibbles where `l / 2` is odd.
        K_NIBBLES => (
            _mm512_setr_epi32(0, 4, 0, 4, 8, 12, 8, 12, 16, 20, 16, 20, 24, 28, 24, 28),
            zero, zero, zero,
        ),
        // Block `l / 2` is part `p = (l / 2) % 4` of half `n = l / 8`:
        // low bits in the 64 bytes of `n`, from byte `32 (p % 2)`,
        // shifted by `4 (p / 2)`; high bits in the 32 bytes of `n`
        // after the low bits, shifted by `2 p`.
        SIX_BITS => (
            _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 16, 20, 24, 28, 16, 20, 24, 28),
            _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 8, 12, 8, 12, 8, 12, 8, 12),
            _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4),
            _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 0, 0, 2, 2, 4, 4, 6, 6),
        ),
        _ => (zero, zero, zero, zero),
    };
    let mut words = [zero; 4];
    let mut high_words = [zero; 4];
    for c in 0..4 {
        let step = _mm512_set1_epi32(c as i32);
        words[c] = _mm512_add_epi32(first_words, step);
        high_words[c] = _mm512_add_epi32(high_first_words, step);
    }
    // Q5's fifth bits: for part `c`, byte `e` of lane `l` takes bit
    // `16 (l % 2) + 4 c + e` of the block's word, which lane `l` holds:
    // its byte `2 (l % 2) + c / 2`, picked into place, then tested.
    let mut fifth_bytes = [zero; 2];
    for (half, bytes) in fifth_bytes.iter_mut().enumerate() {
        let h = half as i8;
        #[rustfmt::skip]
        let quarter = _mm_setr_epi8(
            h, h, h, h, 6 + h, 6 + h, 6 + h, 6 + h,
            8 + h, 8 + h, 8 + h, 8 + h, 14 + h, 14 + h, 14 + h, 14 + h,
        );
        *bytes = _mm512_broadcast_i32x4(quarter);
    }
    let fifth_tests = [
        _mm512_set1_epi32(0x0804_0201),
        _mm512_set1_epi32(0x8040_2010u32 as i32),
    ];
    let fifth_bit = _mm512_set1_epi8(0x10);
    // Where each block of a span keeps its fifth bits, and each lane's
    // block.
    let stride = block_stride as i32;
    let fifth_offsets = _mm256_setr_epi32(
        0,
        stride,
        2 * stride,
        3 * stride,
        4 * stride,
        5 * stride,
        6 * stride,
        7 * stride,
    );
    let each_twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let next_tile = NextTile::new(w, row_stride, blocks, ahead);
    // Span from block `b`, `n` blocks long, of weight row `j`: its
    // four parts of unsigned values.
    macro_rules! unsigned_lanes {
        ($j:expr, $b:expr, $n:expr) => {{
            let (j, b, n): (usize, usize, usize) = ($j, $b, $n);
            let row = w.wrapping_add(j * row_stride);
            let mut parts = [zero; 4];
            // SAFETY (every read below): blocks `b..b + n` of weight
            // row `j < W`, checked in `Rows::new` for this packing.
            match MODE {
                BYTES => {
                    let at = row.wrapping_add(b * block_stride);
                    let block = |k: usize| {
                        if k < n {
                            unsafe {
                                _mm256_loadu_si256(at.add(k * block_stride) as *const __m256i)
                            }
                        } else {
                            _mm256_setzero_si256()
                        }
                    };
                    let mut pairs = [zero; 4];
                    for (p, pair) in pairs.iter_mut().enumerate() {
                        *pair = _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(block(2 * p)),
                            block(2 * p + 1),
                        );
                    }
                    let flip = _mm512_set1_epi8(i8::MIN);
                    for (part, words) in parts.iter_mut().zip(in_lanes(pairs)) {
                        *part = _mm512_xor_si512(words, flip);
                    }
                }
                NIBBLES => {
                    let at = row.wrapping_add(b * block_stride + qs);
                    let mut quarters = [_mm_setzero_si128(); SPAN];
                    for (k, quarter) in quarters.iter_mut().enumerate().take(n) {
                        *quarter =
                            unsafe { _mm_loadu_si128(at.add(k * block_stride) as *const __m128i) };
                    }
                    let four = |q: &[__m128i]| {
                        let two = _mm256_set_m128i(q[1], q[0]);
                        let other = _mm256_set_m128i(q[3], q[2]);
                        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(two), other)
                    };
                    let (first, second) = (four(&quarters[..4]), four(&quarters[4..]));
                    for c in 0..4 {
                        let v = _mm512_permutex2var_epi32(first, words[c], second);
                        let v = _mm512_mask_srli_epi32(v, 0xAAAA, v, 4);
                        parts[c] = _mm512_and_si512(v, low_nibbles);
                    }
                }
                FIFTH_BITS => {
                    // The quarters as for nibbles, and each block's
                    // fifth bits gathered, twice.
                    let at = row.wrapping_add(b * block_stride);
                    let mut quarters = [_mm_setzero_si128(); SPAN];
                    for (k, quarter) in quarters.iter_mut().enumerate().take(n) {
                        *quarter = unsafe {
                            _mm_loadu_si128(at.add(k * block_stride + qs) as *const __m128i)
                        };
                    }
                    let four = |q: &[__m128i]| {
                        let two = _mm256_set_m128i(q[1], q[0]);
                        let other = _mm256_set_m128i(q[3], q[2]);
                        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(two), other)
                    };
                    let (first, second) = (four(&quarters[..4]), four(&quarters[4..]));
                    let present = ((1u16 << n) - 1) as u8;
                    let bits = unsafe {
                        _mm256_mmask_i32gather_epi32::<1>(
                            _mm256_setzero_si256(),
                            present,
                            fifth_offsets,
                            at.add(fifth) as *const i32,
                        )
                    };
                    let bits = _mm512_permutexvar_epi32(each_twice, _mm512_castsi256_si512(bits));
                    for c in 0..4 {
                        let v = _mm512_permutex2var_epi32(first, words[c], second);
                        let v = _mm512_mask_srli_epi32(v, 0xAAAA, v, 4);
                        let v = _mm512_and_si512(v, low_nibbles);
                        let mine = _mm512_shuffle_epi8(bits, fifth_bytes[c / 2]);
                        let set = _mm512_test_epi8_mask(mine, fifth_tests[c % 2]);
                        parts[c] = _mm512_mask_add_epi8(v, set, v, fifth_bit);
                    }
                }
                K_NIBBLES => {
                    let at = row.wrapping_add((b / 8) * block_stride + 16);
                    let (first, second) = unsafe {
                        (
                            _mm512_loadu_si512(at as *const _),
                            _mm512_loadu_si512(at.add(64) as *const _),
                        )
                    };
                    for c in 0..4 {
                        let v = _mm512_permutex2var_epi32(first, words[c], second);
                        let v = _mm512_mask_srli_epi32(v, 0xCCCC, v, 4);
                        parts[c] = _mm512_and_si512(v, low_nibbles);
                    }
                }
                _ => {
                    // SIX_BITS.
                    let at = row.wrapping_add((b / 8) * block_stride);
                    let (first, second, high) = unsafe {
                        (
                            _mm512_loadu_si512(at as *const _),
                            _mm512_loadu_si512(at.add(64) as *const _),
                            _mm512_loadu_si512(at.add(128) as *const _),
                        )
                    };
                    let two_bits = _mm512_set1_epi8(3);
                    for c in 0..4 {
                        let low = _mm512_permutex2var_epi32(first, words[c], second);
                        let low = _mm512_srlv_epi32(low, low_shifts);
                        let top = _mm512_permutexvar_epi32(high_words[c], high);
                        let top = _mm512_and_si512(_mm512_srlv_epi32(top, high_shifts), two_bits);
                        let top = _mm512_slli_epi32::<4>(top);
                        // `(low & 0x0F) | top`.
                        parts[c] = _mm512_ternarylogic_epi32::<0xEC>(low, top, low_nibbles);
                    }
                }
            }
            parts
        }};
    }
    // A weight row at a time, so that its running sums stay in
    // registers, over a chunk of spans whose inputs stay in the
    // nearest cache while every weight row reads them.
    let mut acc = [[_mm512_setzero_ps(); R]; W];
    // One input row reads little: the weight rows then take turns a
    // span at a time, several streams of memory at once.
    let chunk_spans = if R == 1 { 1 } else { CHUNK_SPANS };
    for first in (0..spans).step_by(chunk_spans) {
        for (j, chunk_acc) in acc.iter_mut().enumerate() {
            // A copy, which the compiler keeps in registers.
            let mut acc = *chunk_acc;
            for s in first..spans.min(first + chunk_spans) {
                let b = s * SPAN;
                let n = SPAN.min(blocks - b);
                let used: u16 = if n == SPAN { !0 } else { (1u16 << (2 * n)) - 1 };
                for c in 0..4 {
                    next_tile.ask(j, b + 2 * c);
                }
                let weights = unsigned_lanes!(j, b, n);
                // SAFETY: the mask loads only the half scales of
                // blocks `b..b + n` of weight row `j`.
                let w_scales = unsafe {
                    _mm512_maskz_loadu_ps(used, half_scales[j * 2 * blocks + 2 * b..].as_ptr())
                };
                for (acc, input) in acc.iter_mut().zip(&inputs) {
                    let record = &input[s];
                    // SAFETY: a record's parts, sums and scales are 64
                    // aligned bytes each.
                    let (x, negative_sums, x_scales) = unsafe {
                        let part =
                            |c: usize| _mm512_load_si512(record.values[c].as_ptr() as *const _);
                        (
                            [part(0), part(1), part(2), part(3)],
                            _mm512_load_si512(record.negative_sums.as_ptr() as *const _),
                            _mm512_load_ps(record.scales.as_ptr()),
                        )
                    };
                    // The offsets are powers of two: `-offset * sum` is
                    // a shift of the negative sum.
                    let starts = if offset != 0 {
                        _mm512_sll_epi32(negative_sums, offset_shift)
                    } else {
                        zero
                    };
                    // Two chains of exact sums, added: half the latency.
                    let even = _mm512_dpbusd_epi32(starts, weights[0], x[0]);
                    let odd = _mm512_dpbusd_epi32(zero, weights[1], x[1]);
                    let even = _mm512_dpbusd_epi32(even, weights[2], x[2]);
                    let odd = _mm512_dpbusd_epi32(odd, weights[3], x[3]);
                    let sums = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
                    let factors = _mm512_mul_ps(w_scales, x_scales);
                    *acc = _mm512_mask3_fmadd_ps(factors, sums, *acc, used);
                }
            }
            *chunk_acc = acc;
        }
    }
    let mut out = [[0f32; W]; R];
    for (j, acc) in acc.iter().enumerate() {
        for r in 0..R {
            out[r][j] = combined(acc[r]);
        }
    }
    out
}

/// [`main`] for up to [`ROWS`] input rows of one group and `W` weight
/// rows, on records (see [`super::super::wide`]) whose lane `l` holds
/// half block `l` of a span, so that four `dpbusd` give its sixteen
/// sums at once: every term a lane needs is read in order from the two
/// streams of records, and registers hold only the `R x W` running
/// sums, the group's inputs and one weight row's terms. Same sums, same
/// order, same bits as [`main`].
///
/// # Safety
/// AVX-512 F/BW/VNNI must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) unsafe fn wide<const R: usize, const W: usize>(
    inputs: &[InputSpan],
    weights: &[WeightSpan],
    blocks: usize,
) -> [[f32; W]; R] {
    let spans = blocks.div_ceil(SPAN);
    assert!(spans > 0 && R <= ROWS && W <= TILE);
    assert!(inputs.len() >= spans * ROWS && weights.len() >= (spans - 1) * TILE + W);
    let (x, w) = (inputs.as_ptr(), weights.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    // Span `s` into the running sums `used` (those of its half blocks).
    macro_rules! step {
        ($s:expr, $used:expr) => {{
            let s = $s;
            let mut xv = [[_mm512_setzero_si512(); 4]; R];
            let mut x_scales = [_mm512_setzero_ps(); R];
            for r in 0..R {
                // SAFETY: record `(s, r)` of the group, in bounds
                // (asserted above); records are 64-byte aligned.
                unsafe {
                    let at = x.add(s * ROWS + r);
                    for c in 0..4 {
                        xv[r][c] = _mm512_load_si512(addr_of!((*at).values[c]) as *const _);
                    }
                    x_scales[r] = _mm512_load_ps(addr_of!((*at).scales) as *const f32);
                }
            }
            for j in 0..W {
                // SAFETY: record `(s, j)` of the weights, as above.
                let at = unsafe { w.add(s * TILE + j) };
                // SAFETY: as above.
                let (start, w_scales) = unsafe {
                    (
                        _mm512_load_si512(addr_of!((*at).starts) as *const _),
                        _mm512_load_ps(addr_of!((*at).scales) as *const f32),
                    )
                };
                for r in 0..R {
                    let mut sums = start;
                    for c in 0..4 {
                        // SAFETY: as above.
                        let signed =
                            unsafe { _mm512_load_si512(addr_of!((*at).values[c]) as *const _) };
                        sums = _mm512_dpbusd_epi32(sums, xv[r][c], signed);
                    }
                    let factors = _mm512_mul_ps(w_scales, x_scales[r]);
                    let sums = _mm512_cvtepi32_ps(sums);
                    acc[r][j] = _mm512_mask3_fmadd_ps(factors, sums, acc[r][j], $used);
                }
            }
        }};
    }
    for s in 0..blocks / SPAN {
        step!(s, 0xFFFF);
    }
    let rest = blocks % SPAN;
    if rest != 0 {
        step!(blocks / SPAN, (1u16 << (2 * rest)) - 1);
    }
    finish(&acc)
}

/// Each dot's sixteen running sums combined as [`super::combine`]
/// does, in registers.
#[target_feature(enable = "avx512f,avx2")]
fn finish<const R: usize, const W: usize>(acc: &[[__m512; W]; R]) -> [[f32; W]; R] {
    // Loops, not `array::from_fn`: its closure would be compiled without
    // AVX-512 and call these instructions out of line.
    let mut out = [[0f32; W]; R];
    for r in 0..R {
        for j in 0..W {
            out[r][j] = combined(acc[r][j]);
        }
    }
    out
}

/// One dot's sixteen running sums combined as [`super::combine`] does:
/// the halves added (sums `l` and `l + 8`), then quarters
/// (`e[l] + e[l + 4]`), then pairs and the last two.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
fn combined(sums: __m512) -> f32 {
    let low = _mm512_castps512_ps256(sums);
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sums)));
    combined_eight(_mm256_add_ps(low, high))
}

/// Eight running sums combined as [`crate::dot`] combines its lanes.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
fn combined_eight(eight: __m256) -> f32 {
    // `[e0 + e4, e1 + e5, e2 + e6, e3 + e7]`.
    let four = _mm_add_ps(
        _mm256_castps256_ps128(eight),
        _mm256_extractf128_ps::<1>(eight),
    );
    // `[(e0 + e4) + (e2 + e6), (e1 + e5) + (e3 + e7), ..]`.
    let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    let one = _mm_add_ss(two, _mm_movehdup_ps(two));
    _mm_cvtss_f32(one)
}
