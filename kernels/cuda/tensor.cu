// Row-invariant matrix product on tensor cores, for the GGUF quantized
// formats: y[i, off + j] (+)= sum_k x[i, k] * W[j, k], or, for gate and up
// rows interleaved, y = silu(gate) * up (TF_OUT_GATED).
//
// A weight unit (32 inputs) is a scale times small integers, plus an
// offset for Q4_1 and Q4_K: w = a q + m. The integers are exact in f16, so
// mma.m16n8k16 takes them as they are, with x rounded to f16 (by its
// producer, laid out as tf_store_h16 in common.cuh writes it), and no
// weight is rounded; decoding is a few integer operations per input.
// - Q4_K: a unit's 6-bit scale times its 4-bit integers is still exact in
//   f16, so a super-block (one segment, below) is two mma chains over its
//   eight units, (sc q . x) and (min . x), and its value is
//   d (sc q . x) - dmin (min . x).
// - The others: a unit contributes a (q . x) (+ m (1 . x) for Q4_1), each
//   dot one mma chain from zero; Q6_K's halves of 16 have their own
//   scales: a0 (q . x)_0 + a1 (q . x)_1.
//
// The order of every output element's reduction is fixed by K alone:
// K is cut into segments of TF_SEG units (256 inputs, the last may be
// shorter); a segment's sum takes its units in order, starting from zero;
// segment sums are then added in segment order, starting from zero. An mma
// computes each output element from that element's weight row, input row
// and accumulator alone, so neither the tile a row lands in nor its place
// there changes its bits. The kernel for few rows and the kernel for many
// only spread this same order differently over warps.
#include "common.cuh"

#define TF_SEG 8
static_assert(TF_SEG * 32 == 256, "a Q4_K segment is one super-block");
#define TF_MANY_WARPS 4
// Weight buffers per warp of the few-row kernel (FEW_STAGES in device.rs).
#define TF_FEW_STAGES 2

// Input slots. Thread t of a quad feeds mma slots 2t, 2t + 1, 2t + 8,
// 2t + 9; in mma h of a unit they hold its elements 16h + 4t + 0, 2, 1, 3.
// So a thread reads four consecutive elements per half, and the weight
// bytes of elements 0 and 2 (1 and 3) of a 32-bit word sit where the
// halves of an f16 pair go.

// Two f16 integers minus a bias, from the 16-bit halves of v, each < 1024:
// 0x6400 is 1024 in f16, so (0x6400 | n) is 1024 + n exactly, and the
// subtraction is exact.
__device__ __forceinline__ uint32_t tf_ints_h2(uint32_t v, uint32_t bias2) {
    return tf_h2_bits(__hsub2(tf_as_h2(v), tf_as_h2(bias2)));
}
// f16 1024 + bias in both halves.
#define TF_H2_BIAS(b) (0x64006400u | ((uint32_t)(b) << 16) | (uint32_t)(b))
// (v & mask) | bits in one instruction (the compiler splits it in two when
// both are constants).
__device__ __forceinline__ uint32_t tf_and_or(uint32_t v, uint32_t mask, uint32_t bits) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(v), "r"(mask), "r"(bits));
    return d;
}
// The four nibbles at shift 0 of bytes 0..3 of v: (0, 2) and (1, 3).
__device__ __forceinline__ void tf_nibbles(uint32_t v, uint32_t bias2, uint32_t q[2]) {
    q[0] = tf_ints_h2(tf_and_or(v, 0x000F000Fu, 0x64006400u), bias2);
    q[1] = tf_ints_h2(tf_and_or(v >> 8, 0x000F000Fu, 0x64006400u), bias2);
}
// The four bytes of v: (0, 2) and (1, 3).
__device__ __forceinline__ void tf_bytes(uint32_t v, uint32_t bias2, uint32_t q[2]) {
    q[0] = tf_ints_h2(__byte_perm(v, 0x64646464u, 0x4240), bias2);
    q[1] = tf_ints_h2(__byte_perm(v, 0x64646464u, 0x4341), bias2);
}
// Four bytes from a 2-byte aligned address.
__device__ __forceinline__ uint32_t tf_ld32_a2(const uint8_t* p) {
    return (uint32_t)tf_ld16(p) | ((uint32_t)tf_ld16(p + 2) << 16);
}

// A weight unit as the tensor-core kernels use it.
struct TfQUnit {
    uint32_t q[2][2];  // [h][pair]: f16 integers in slot order (Q4_K: times the scale)
    uint32_t mq;       // Q4_K: the unit's min, an f16 integer in both halves
    float a[2];        // scale of each half (not Q4_K)
    float m;           // offset (Q4_1)
};

// Q4_1 units need the inputs' own sum.
template <int FMT>
__device__ __forceinline__ constexpr bool tf_has_offset() {
    return FMT == TF_Q4_1;
}

// A Q4_K unit's 6-bit scale and min as f16 halves, each plus 1024:
// 0x6400 | sc and 0x6400 | min (zero for other formats).
struct TfUnitScales {
    uint32_t p;
};
// A Q4_K super-block's scales and mins, decoded once per segment by
// kernels with registers to spare: word i holds bytes (sc, min) of units
// 2i and 2i + 1 (get_scale_min_k4 of GGML on whole words).
struct TfSegHead {
    uint32_t pairs[4];
};
template <int FMT>
__device__ __forceinline__ TfSegHead tf_seg_head(const uint8_t* seg) {
    TfSegHead h = {};
    if (FMT == TF_Q4K) {
        const uint32_t w0 = tf_ld32(seg + 4), w1 = tf_ld32(seg + 8), w2 = tf_ld32(seg + 12);
        const uint32_t sc[2] = {w0 & 0x3F3F3F3Fu, (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u)};
        const uint32_t mn[2] = {w1 & 0x3F3F3F3Fu, ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u)};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            h.pairs[2 * i] = __byte_perm(sc[i], mn[i], 0x5140);
            h.pairs[2 * i + 1] = __byte_perm(sc[i], mn[i], 0x7362);
        }
    }
    return h;
}
// Unit u's scales from the segment's head...
template <int FMT>
__device__ __forceinline__ TfUnitScales tf_unit_scales(const TfSegHead& hd, int u) {
    if (FMT != TF_Q4K) return TfUnitScales{0};
    // Bytes (sc, 0x64, min, 0x64); the constant's bytes 1 and 3 are 0x64.
    return TfUnitScales{__byte_perm(hd.pairs[u >> 1], 0x64006400u, (u & 1) ? 0x7352 : 0x7150)};
}
// ... or from the segment's bytes.
template <int FMT>
__device__ __forceinline__ TfUnitScales tf_unit_scales(const uint8_t* seg, int u) {
    if (FMT != TF_Q4K) return TfUnitScales{0};
    uint32_t sc, mn;
    tf_q4k_scale_min(seg, u, sc, mn);
    return TfUnitScales{0x64006400u | sc | (mn << 16)};
}

// Thread t's part of unit u of a segment (its bytes at `seg`): integers
// and scales.
template <int FMT>
__device__ __forceinline__ TfQUnit tf_qunit(const uint8_t* seg, const TfUnitScales& us, int u, int t) {
    TfQUnit w;
    w.m = 0.f;
    if (FMT == TF_Q4K) {
        // Units 2i and 2i + 1 share 32 bytes: low nibbles and high. A
        // nibble is masked where it lies, 1024 + q (low) or 1024 + 16 q
        // (high) as f16, and one fused multiply-add by sc (low) or sc / 16
        // (high) less 1024 times that gives sc q < 2^10, exactly.
        const bool high = u & 1;
        const __half2 p = tf_as_h2(us.p), bias = tf_as_h2(TF_H2_BIAS(0));
        w.mq = tf_h2_bits(__hsub2(__high2half2(p), bias));
        const __half2 s2 = high ? __hfma2(__low2half2(p), __float2half2_rn(0.0625f), __float2half2_rn(-64.f))
                                : __hsub2(__low2half2(p), bias);
        const __half2 off = __hmul2(s2, __float2half2_rn(-1024.f));
        const uint32_t mask = high ? 0x00F000F0u : 0x000F000Fu;
        const uint8_t* qs = seg + 16 + 32 * (u >> 1);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t v = tf_ld32(qs + 16 * h + 4 * t);
            w.q[h][0] = tf_h2_bits(__hfma2(tf_as_h2(tf_and_or(v, mask, 0x64006400u)), s2, off));
            w.q[h][1] = tf_h2_bits(__hfma2(tf_as_h2(tf_and_or(v >> 8, mask, 0x64006400u)), s2, off));
        }
        return w;
    }
    const TfUnit p = tf_prep<FMT>(seg, u);
    w.a[0] = w.a[1] = p.a;
    if (FMT == TF_Q4_0 || FMT == TF_Q4_1) {
        // Byte i holds element i (low nibble) and 16 + i (high).
        const uint32_t v = FMT == TF_Q4_0 ? tf_ld32_a2(p.p + 4 * t) : tf_ld32(p.p + 4 * t);
        const uint32_t bias = TF_H2_BIAS(FMT == TF_Q4_0 ? 8 : 0);
        tf_nibbles(v, bias, w.q[0]);
        tf_nibbles(v >> 4, bias, w.q[1]);
        if (FMT == TF_Q4_1) w.m = p.b;
    } else if (FMT == TF_Q5_0) {
        const uint32_t v = tf_ld32_a2(p.p + 4 * t);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            // Bit e of qh is bit 4 of element e; the product spreads four
            // bits to the low bit of each byte without carries.
            const uint32_t hb = (p.h >> (16 * h + 4 * t)) & 0xF;
            const uint32_t five = ((v >> (4 * h)) & 0x0F0F0F0Fu) | (((hb * 0x00204081u) & 0x01010101u) << 4);
            tf_bytes(five, TF_H2_BIAS(16), w.q[h]);
        }
    } else if (FMT == TF_Q8_0) {
#pragma unroll
        for (int h = 0; h < 2; h++)
            tf_bytes(tf_ld32_a2(p.p + 16 * h + 4 * t) ^ 0x80808080u, TF_H2_BIAS(128), w.q[h]);
    } else if (FMT == TF_Q6K) {
        const int shl = p.h & 0xFF, shh = p.h >> 8;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t l = tf_ld32_a2(p.p + 16 * h + 4 * t);
            const uint32_t hi = tf_ld32_a2(p.p + __float_as_int(p.c) + 16 * h + 4 * t);
            const uint32_t six = ((l >> shl) & 0x0F0F0F0Fu) | (((hi >> shh) & 0x03030303u) << 4);
            tf_bytes(six, TF_H2_BIAS(32), w.q[h]);
        }
        w.a[1] = p.b;
    }
    return w;
}

// The B fragments of unit u for one input row (f16, laid out as
// tf_store_h16 writes them), both halves, in slot order.
__device__ __forceinline__ void tf_b_frags(const uint4* xr, int u, int t, uint32_t b[2][2]) {
    const uint4 v = xr[4 * u + t];
    b[0][0] = v.x;
    b[0][1] = v.y;
    b[1][0] = v.z;
    b[1][1] = v.w;
}

// (1 . x) of a unit for an 8-row input tile: d[0], d[1] (= d[2], d[3]) for
// input rows 2t, 2t + 1. Zero where formats have no offset.
template <int FMT>
__device__ __forceinline__ void tf_unit_sums(const uint32_t b[2][2], float s[4]) {
    s[0] = s[1] = s[2] = s[3] = 0.f;
    if (tf_has_offset<FMT>()) {
        const uint32_t ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
        tf_mma(s, ones, b[0]);
        tf_mma(s, ones, b[1]);
    }
}

// Adds one unit to a 16 x 8 tile's segment chains (weight rows g, g + 8:
// `lo`, `hi`; `s` from tf_unit_sums). Q4_K extends its two mma chains;
// the others add the unit's scaled value to `d1`.
template <int FMT>
__device__ __forceinline__ void tf_unit_add(const TfQUnit& lo, const TfQUnit& hi, const uint32_t b[2][2],
                                            const float s[4], float d1[4], float d2[4]) {
    if (FMT == TF_Q4K) {
        const uint32_t mins[4] = {lo.mq, hi.mq, lo.mq, hi.mq};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t a[4] = {lo.q[h][0], hi.q[h][0], lo.q[h][1], hi.q[h][1]};
            tf_mma(d1, a, b[h]);
            tf_mma(d2, mins, b[h]);
        }
        return;
    }
    float d[2][4] = {};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t a[4] = {lo.q[h][0], hi.q[h][0], lo.q[h][1], hi.q[h][1]};
        // One chain over both halves, unless their scales differ.
        tf_mma(d[FMT == TF_Q6K ? h : 0], a, b[h]);
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const TfQUnit& w = e < 2 ? lo : hi;
        if (FMT == TF_Q6K) {
            d1[e] = __fadd_rn(d1[e], __fmaf_rn(w.a[0], d[0][e], __fmul_rn(w.a[1], d[1][e])));
        } else if (tf_has_offset<FMT>()) {
            d1[e] = __fadd_rn(d1[e], __fmaf_rn(w.a[0], d[0][e], __fmul_rn(w.m, s[e])));
        } else {
            d1[e] = __fmaf_rn(w.a[0], d[0][e], d1[e]);
        }
    }
}

// A segment's sum from its chains; `lo` and `hi` point at the segment's
// bytes in weight rows g and g + 8 (for Q4_K, its super-block).
template <int FMT>
__device__ __forceinline__ void tf_seg_sum(const uint8_t* lo, const uint8_t* hi, const float d1[4],
                                           const float d2[4], float out[4]) {
#pragma unroll
    for (int e = 0; e < 4; e++) out[e] = d1[e];
    if (FMT == TF_Q4K) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint32_t dm = tf_ld32(r ? hi : lo);
            const float d = tf_scale_f(dm & 0xFFFF), dmin = tf_scale_f(dm >> 16);
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; e++) out[e] = __fmaf_rn(d, d1[e], __fmul_rn(-dmin, d2[e]));
        }
    }
}

// How a product lands in y (`mode`, TF_OUT_* of device.rs's `Out`):
// stored, added to what is there, or gated: the weight rows are gate and up
// rows interleaved by 8 (rows 16b + g and 16b + 8 + g of each 16-row block
// are gate and up row 8b + g), and y gets silu(gate) * up, N / 2 columns,
// with its f16 copy in y16 (tf_store_h16's layout) unless that is null.
#define TF_OUT_SET 0
#define TF_OUT_ADD 1
#define TF_OUT_GATED 2

__device__ __forceinline__ void tf_store(float* y, int M, int N, int ldy, int mode, int i, int j, float v) {
    if (i < M && j < N) {
        float* o = y + (size_t)i * ldy + j;
        *o = mode == TF_OUT_ADD ? __fadd_rn(*o, v) : v;
    }
}
// A 16 x 8 tile's sums, weight rows j, j + 8 by input rows i, i + 1 (the
// accumulator slots of thread (g, t), with j = j0 + g, j0 a multiple of 16,
// and i = i0 + 2t).
__device__ __forceinline__ void tf_store_tile(float* y, uint32_t* y16, int M, int N, int ldy, int mode, int i,
                                              int j, const float v[4]) {
    if (mode == TF_OUT_GATED) {
        // Weight rows j and j + 8 are gate and up of column e.
        const int e = (j >> 4) * 8 + (j & 7);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (i + r < M && e < N / 2) {
                const float a = tf_silu_mul(v[r], v[2 + r]);
                y[(size_t)(i + r) * ldy + e] = a;
                if (y16) tf_store_h16_one(y16 + (size_t)(i + r) * (ldy / 2), e, a);
            }
        }
        return;
    }
    tf_store(y, M, N, ldy, mode, i, j, v[0]);
    tf_store(y, M, N, ldy, mode, i + 1, j, v[1]);
    tf_store(y, M, N, ldy, mode, i, j + 8, v[2]);
    tf_store(y, M, N, ldy, mode, i + 1, j + 8, v[3]);
}

// 16-byte words that hold any segment of a row wherever it starts: the
// segment's bytes rounded up, plus one for a start inside a word.
template <int FMT>
__host__ __device__ constexpr int tf_seg_words() {
    return (int)((tf_row_bytes(FMT, 32 * TF_SEG) + 15) / 16) + 1;
}

// A warp's copies of segments of `R` consecutive weight rows (from j0,
// clamped at the last) into shared memory, tf_seg_words 16-byte words a
// row, in buffers k = 0, 1, ...: while the units of one are decoded, the
// next segments land in the others. Aligned 16-byte copies of whole
// sectors; only the words holding the segment's bytes are read.
template <int FMT, int R>
struct TfSegCopy {
    static constexpr int QW = tf_seg_words<FMT>();
    const uint8_t* W;
    size_t rb;
    int j0, N, units;
    uint4* buffers;  // 2 * R * QW words
    uint32_t to;     // their shared-memory address

    // Where segment s of row i starts in global memory.
    __device__ __forceinline__ uintptr_t at(int i, int s) const {
        return reinterpret_cast<uintptr_t>(W + (size_t)min(j0 + i, N - 1) * rb +
                                           tf_row_bytes(FMT, 32 * TF_SEG * s));
    }
    // Starts copying segment s (if there is one) into buffer k.
    __device__ __forceinline__ void fetch(int s, int k, int lane) const {
        if (s * TF_SEG < units) {
            const int seg_bytes = (int)tf_row_bytes(FMT, 32 * min(TF_SEG, units - s * TF_SEG));
            const uint32_t words = to + 16 * k * R * QW;
            for (int f = lane; f < R * QW; f += 32) {
                const int i = f / QW, q = f % QW;
                const uintptr_t from = at(i, s);
                if (16 * q < (int)(from & 15) + seg_bytes)
                    tf_cp16_to(words + 16 * f, reinterpret_cast<const void*>((from & ~(uintptr_t)15) + 16 * q));
            }
        }
        tf_cp_commit();  // an empty group past the end keeps the count
    }
    // Segment s of row i in buffer k, once it has landed.
    __device__ __forceinline__ const uint8_t* row(int i, int s, int k) const {
        return reinterpret_cast<const uint8_t*>(buffers + k * R * QW + i * QW) + (at(i, s) & 15);
    }
};

// Few rows (TN tiles of 8 input rows per block row): a weight block is 16
// weight rows; a block takes weight blocks blockIdx.x, + gridDim.x, ...
// (one each when the grid covers them all). For each, its warps take
// segments w, w + warps, ... and leave their sums in shared memory; then
// warp n adds tile n's in segment order. A warp's segments, over all its
// weight blocks, are its items: it copies them as TfSegCopy does into
// TF_FEW_STAGES buffers, that many less one ahead of the one it decodes,
// so the next weight block's first segments are in flight while this
// one's sums are added. Dynamic shared memory: TN * 512 bytes per segment,
// then TF_FEW_STAGES * 256 * tf_seg_words bytes per warp (weight buffers
// are padded so the last word read stays inside them).
template <int FMT, int TN>
__device__ __forceinline__ void tf_mma_few(const uint8_t* __restrict__ W, const uint4* __restrict__ x,
                                           float* __restrict__ y, uint32_t* __restrict__ y16, int M,
                                           int N, int K, int ldy, int mode) {
    constexpr int S = TF_FEW_STAGES;
    extern __shared__ float4 part[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int i0 = blockIdx.y * 8 * TN;
    const int units = K >> 5, segs = (units + TF_SEG - 1) / TF_SEG, blocks = (N + 15) / 16;
    uint4* buffers = reinterpret_cast<uint4*>(part + segs * TN * 32) + warp * S * 16 * TfSegCopy<FMT, 16>::QW;
    const uint32_t to = tf_shared_addr(buffers);
    const size_t rb = tf_row_bytes(FMT, K);
    // The copies of weight block wb's segments.
    auto copy_of = [&](int wb) { return TfSegCopy<FMT, 16>{W, rb, 16 * wb, N, units, buffers, to}; };
    // This warp's segments of each weight block, and a start of copying
    // its item n into buffer n % S (an empty group past the last).
    const int per = warp < segs ? (segs - 1 - warp) / warps + 1 : 0;
    auto fetch = [&](int n) {
        const int wb = per ? (int)blockIdx.x + n / per * (int)gridDim.x : blocks;
        if (wb < blocks)
            copy_of(wb).fetch(warp + n % per * warps, n % S, lane);
        else
            tf_cp_commit();
    };
    const uint4* xr[TN];
#pragma unroll
    for (int n = 0; n < TN; n++) xr[n] = x + (size_t)min(i0 + 8 * n + g, M - 1) * (K / 8);
    tf_launch_next();
    // The weights are no kernel's output: their copies start before the
    // wait for the inputs.
#pragma unroll
    for (int n = 0; n < S - 1; n++) fetch(n);
    tf_wait_prior();
    int item = 0;
    for (int wb = blockIdx.x; wb < blocks; wb += gridDim.x) {
        const TfSegCopy<FMT, 16> copy = copy_of(wb);
        for (int s = warp; s < segs; s += warps, item++) {
            fetch(item + S - 1);
            tf_cp_wait<S - 1>();
            __syncwarp();
            const int k = item % S;
            const uint8_t* lo = copy.row(g, s, k);
            const uint8_t* hi = copy.row(g + 8, s, k);
            const TfSegHead head_lo = tf_seg_head<FMT>(lo), head_hi = tf_seg_head<FMT>(hi);
            const int u0 = s * TF_SEG, n_units = min(TF_SEG, units - u0);
            float d1[TN][4] = {}, d2[TN][4] = {};
#pragma unroll
            for (int wu = 0; wu < TF_SEG; wu++) {
                if (wu >= n_units) break;
                const TfQUnit wl = tf_qunit<FMT>(lo, tf_unit_scales<FMT>(head_lo, wu), wu, t),
                              wh = tf_qunit<FMT>(hi, tf_unit_scales<FMT>(head_hi, wu), wu, t);
#pragma unroll
                for (int n = 0; n < TN; n++) {
                    uint32_t b[2][2];
                    float sums[4];
                    tf_b_frags(xr[n], u0 + wu, t, b);
                    tf_unit_sums<FMT>(b, sums);
                    tf_unit_add<FMT>(wl, wh, b, sums, d1[n], d2[n]);
                }
            }
#pragma unroll
            for (int n = 0; n < TN; n++) {
                float d[4];
                tf_seg_sum<FMT>(lo, hi, d1[n], d2[n], d);
                part[(s * TN + n) * 32 + lane] = make_float4(d[0], d[1], d[2], d[3]);
            }
            __syncwarp();  // every lane is done with this buffer before it is refilled
        }
        __syncthreads();  // every segment's sums are in
        for (int n = warp; n < TN; n += warps) {
            float v[4] = {};
            for (int s = 0; s < segs; s++) {
                const float4 p = part[(s * TN + n) * 32 + lane];
                v[0] = __fadd_rn(v[0], p.x);
                v[1] = __fadd_rn(v[1], p.y);
                v[2] = __fadd_rn(v[2], p.z);
                v[3] = __fadd_rn(v[3], p.w);
            }
            tf_store_tile(y, y16, M, N, ldy, mode, i0 + 8 * n + 2 * t, 16 * wb + g, v);
        }
        __syncthreads();  // the sums are read before the next block's land
    }
}

// A block's input rows of one segment in shared memory: 32 16-byte words
// a row (8 units, 4 words a unit, as tf_store_h16 lays them), the word
// index xor 4 in odd rows so that the 16-byte loads of two rows fall in
// distinct banks.
__device__ __forceinline__ int tf_x_word(int row, int w) { return 32 * row + (w ^ ((row & 1) << 2)); }

// Many rows: a warp owns 16 * TC weight rows by 8 * TN input rows and walks
// the segments in order itself (its weight rows copied as TfSegCopy does),
// keeping the running total beside the segment's sum; a block is
// TF_MANY_WARPS warps side by side over weight rows, sharing their input
// rows: the block copies each segment of them to shared memory once, the
// next while one is used. Warps past the last weight row run along (their
// copies clamp to it) and store nothing. Dynamic shared memory: two
// 512-byte segments per input row, then 2 * 256 * TC * tf_seg_words bytes
// per warp.
template <int FMT, int TC, int TN>
__device__ __forceinline__ void tf_mma_many(const uint8_t* __restrict__ W, const uint4* __restrict__ x,
                                            float* __restrict__ y, uint32_t* __restrict__ y16, int M,
                                            int N, int K, int ldy, int mode) {
    extern __shared__ float4 staged[];
    tf_after_prior();
    constexpr int R = 16 * TC, XR = 8 * TN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int j0 = (blockIdx.x * TF_MANY_WARPS + warp) * R, i0 = blockIdx.y * 8 * TN;
    const int units = K >> 5, segs = (units + TF_SEG - 1) / TF_SEG;
    uint4* xs = reinterpret_cast<uint4*>(staged);
    uint4* buffers = xs + 2 * XR * 32 + warp * 2 * R * TfSegCopy<FMT, R>::QW;
    const TfSegCopy<FMT, R> copy{W, tf_row_bytes(FMT, K), j0, N, units, buffers, tf_shared_addr(buffers)};
    const uint32_t xs_to = tf_shared_addr(xs);
    // Starts copying segment s of the block's input rows into buffer k
    // (committed with the weights' copies).
    auto fetch_x = [&](int s, int k) {
        const int words = 4 * min(TF_SEG, units - s * TF_SEG);
        for (int f = threadIdx.x; f < XR * 32; f += TF_MANY_WARPS * 32) {
            const int row = f >> 5, w = f & 31;
            if (s < segs && w < words)
                tf_cp16_to(xs_to + 16 * (k * XR * 32 + tf_x_word(row, w)),
                           x + (size_t)min(i0 + row, M - 1) * (K / 8) + 32 * s + w);
        }
    };
    float total[TC][TN][4] = {};
    fetch_x(0, 0);
    copy.fetch(0, 0, lane);
    for (int s = 0, k = 0; s < segs; s++, k ^= 1) {
        fetch_x(s + 1, k ^ 1);
        copy.fetch(s + 1, k ^ 1, lane);
        tf_cp_wait_all_but_one();
        __syncthreads();  // every thread's copies of segment s have landed
        const uint8_t *lo[TC], *hi[TC];
#pragma unroll
        for (int c = 0; c < TC; c++) {
            lo[c] = copy.row(16 * c + g, s, k);
            hi[c] = copy.row(16 * c + g + 8, s, k);
        }
        const uint4* xk = xs + k * XR * 32;
        float d1[TC][TN][4] = {}, d2[TC][TN][4] = {};
#pragma unroll 2
        for (int wu = 0; wu < TF_SEG; wu++) {
            const int u = s * TF_SEG + wu;
            if (u >= units) break;
            uint32_t b[TN][2][2];
            float sums[TN][4];
#pragma unroll
            for (int n = 0; n < TN; n++) {
                const uint4 v = xk[tf_x_word(8 * n + g, 4 * wu + t)];
                b[n][0][0] = v.x;
                b[n][0][1] = v.y;
                b[n][1][0] = v.z;
                b[n][1][1] = v.w;
                tf_unit_sums<FMT>(b[n], sums[n]);
            }
#pragma unroll
            for (int c = 0; c < TC; c++) {
                // Scales are read per unit: registers are short here.
                const TfQUnit wl = tf_qunit<FMT>(lo[c], tf_unit_scales<FMT>(lo[c], wu), wu, t),
                              wh = tf_qunit<FMT>(hi[c], tf_unit_scales<FMT>(hi[c], wu), wu, t);
#pragma unroll
                for (int n = 0; n < TN; n++) tf_unit_add<FMT>(wl, wh, b[n], sums[n], d1[c][n], d2[c][n]);
            }
        }
#pragma unroll
        for (int c = 0; c < TC; c++)
#pragma unroll
            for (int n = 0; n < TN; n++) {
                float d[4];
                tf_seg_sum<FMT>(lo[c], hi[c], d1[c][n], d2[c][n], d);
#pragma unroll
                for (int e = 0; e < 4; e++) total[c][n][e] = __fadd_rn(total[c][n][e], d[e]);
            }
        __syncthreads();  // every thread is done with buffer k before it is refilled
    }
#pragma unroll
    for (int c = 0; c < TC; c++)
#pragma unroll
        for (int n = 0; n < TN; n++) {
            tf_store_tile(y, y16, M, N, ldy, mode, i0 + 8 * n + 2 * t, j0 + 16 * c + g, total[c][n]);
        }
}

// The launch bounds follow the kernel's arguments: the one-tile few-row
// kernels are held to three blocks of 256 threads per multiprocessor (80
// registers), where ptxas left alone may pick 64 with a spill.
#define TF_TC_FEW(NAME, FMT, TN, SUFFIX, ...)                                         \
    extern "C" __global__ void __launch_bounds__(__VA_ARGS__)                         \
        NAME##_few##SUFFIX(const uint8_t* W, const uint4* x, float* y, uint32_t* y16, \
                           int M, int N, int K, int ldy, int mode) {                  \
        tf_mma_few<FMT, TN>(W, x, y, y16, M, N, K, ldy, mode);                        \
    }

#define TF_TC_MANY(NAME, FMT, TC, TN)                                                  \
    extern "C" __global__ void __launch_bounds__(TF_MANY_WARPS * 32, 3)                \
        NAME##_m##TC##x##TN(const uint8_t* W, const uint4* x, float* y, uint32_t* y16, \
                            int M, int N, int K, int ldy, int mode) {                  \
        tf_mma_many<FMT, TC, TN>(W, x, y, y16, M, N, K, ldy, mode);                    \
    }

#define TF_TC_ALL(NAME, FMT)              \
    TF_TC_FEW(NAME, FMT, 1, , 256, 3)     \
    TF_TC_FEW(NAME, FMT, 2, 2, 256)       \
    TF_TC_FEW(NAME, FMT, 4, 4, 256)       \
    TF_TC_MANY(NAME, FMT, 2, 4)           \
    TF_TC_MANY(NAME, FMT, 1, 4)           \
    TF_TC_MANY(NAME, FMT, 2, 2)

TF_TC_ALL(tc_q4_0, TF_Q4_0)
TF_TC_ALL(tc_q4_1, TF_Q4_1)
TF_TC_ALL(tc_q5_0, TF_Q5_0)
TF_TC_ALL(tc_q8_0, TF_Q8_0)
TF_TC_ALL(tc_q4k, TF_Q4K)
TF_TC_ALL(tc_q6k, TF_Q6K)
