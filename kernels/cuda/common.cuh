// Shared pieces of the row-invariant CUDA kernels: weight formats and their
// decoders.
//
// Every weight row is read in "units" of 32 consecutive input elements (one
// GGUF block for the 32-element formats, one 32-element sub-block of a
// k-quant super-block, 32 values for float formats). A unit is decoded in
// four pieces of 8 with `get8`. Decoding is a function of the weight bytes
// only and uses explicitly rounded operations (`__fmul_rn`, ...) so that no
// instantiation can contract it differently.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// Format codes, mirrored in src/device.rs (`fmt_code`).
#define TF_F32 0
#define TF_F16 1
#define TF_BF16 2
#define TF_Q4_0 3
#define TF_Q4_1 4
#define TF_Q5_0 5
#define TF_Q8_0 6
#define TF_Q4K 7
#define TF_Q6K 8

__device__ __forceinline__ float tf_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Exact conversions on the multiply-add pipe instead of the (narrower)
// conversion pipe; each gives the same bits as the plain cast.
// q - BIAS for 0 <= q < 2^23: q sits in the mantissa of 2^23 + q.
template <int BIAS>
__device__ __forceinline__ float tf_int_f(uint32_t q) {
    return __fsub_rn(__uint_as_float(0x4B000000u | q), 8388608.f + (float)BIAS);
}
// A signed byte (its bits in the low 8 of b) as a float.
__device__ __forceinline__ float tf_i8_f(uint32_t b) { return tf_int_f<128>((b & 0xFF) ^ 0x80); }
// A finite f16 scale as a float: its exponent and mantissa shifted into
// f32 place are the value times 2^-112 (subnormals included), exactly.
__device__ __forceinline__ float tf_scale_f(uint16_t h) {
    const float mag = __fmul_rn(__uint_as_float((uint32_t)(h & 0x7FFF) << 13), 0x1p112f);
    return __uint_as_float(__float_as_uint(mag) | ((uint32_t)(h & 0x8000) << 16));
}
// Quantized blocks are read with plain loads: the tensor-core kernels
// decode them from shared memory, the others from global memory.
__device__ __forceinline__ uint16_t tf_ld16(const uint8_t* p) {
    return *reinterpret_cast<const unsigned short*>(p);
}
__device__ __forceinline__ uint32_t tf_ld32(const uint8_t* p) {
    return *reinterpret_cast<const unsigned int*>(p);
}
// Eight bytes from a 2-byte aligned address.
__device__ __forceinline__ void tf_ld8_a2(const uint8_t* p, uint8_t b[8]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint16_t v = tf_ld16(p + 2 * i);
        b[2 * i] = v & 0xFF;
        b[2 * i + 1] = v >> 8;
    }
}
// Eight bytes from a 4-byte aligned address.
__device__ __forceinline__ void tf_ld8_a4(const uint8_t* p, uint8_t b[8]) {
    uint32_t lo = tf_ld32(p), hi = tf_ld32(p + 4);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        b[i] = (lo >> (8 * i)) & 0xFF;
        b[4 + i] = (hi >> (8 * i)) & 0xFF;
    }
}
// Eight bytes from an 8-byte aligned address.
__device__ __forceinline__ void tf_ld8_a8(const uint8_t* p, uint8_t b[8]) {
    uint2 v = *reinterpret_cast<const uint2*>(p);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        b[i] = (v.x >> (8 * i)) & 0xFF;
        b[4 + i] = (v.y >> (8 * i)) & 0xFF;
    }
}

// An f16 pair as its 32 bits, and back.
__device__ __forceinline__ uint32_t tf_h2_bits(__half2 v) { return *reinterpret_cast<const uint32_t*>(&v); }
__device__ __forceinline__ __half2 tf_as_h2(uint32_t v) { return *reinterpret_cast<const __half2*>(&v); }

// d += A * B for one 16 x 8 tile on the tensor cores (A: 16 rows x 16,
// B: 16 x 8 columns; f16 inputs, f32 sums). Thread (g, t) = (lane / 4,
// lane % 4) holds a = A[g][2t, 2t+1], A[g+8][2t, 2t+1], A[g][2t+8, 2t+9],
// A[g+8][2t+8, 2t+9]; b = B[2t, 2t+1][g], B[2t+8, 2t+9][g]; d = D[g][2t,
// 2t+1], D[g+8][2t, 2t+1]. Each element of D comes from its own row of A,
// column of B and accumulator alone.
__device__ __forceinline__ void tf_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// Two floats rounded to an f16 pair (x in the low half).
__device__ __forceinline__ uint32_t tf_h2_of(float x, float y) { return tf_h2_bits(__floats2half2_rn(x, y)); }

// Asynchronous 16-byte copies from global to shared memory.
// `to` is a shared-memory address (tf_shared_addr).
__device__ __forceinline__ uint32_t tf_shared_addr(const void* smem) {
    return (uint32_t)__cvta_generic_to_shared(smem);
}
__device__ __forceinline__ void tf_cp16_to(uint32_t to, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(gmem) : "memory");
}
__device__ __forceinline__ void tf_cp16(void* smem, const void* gmem) { tf_cp16_to(tf_shared_addr(smem), gmem); }
// The same for 8 bytes (both addresses 8-byte aligned).
__device__ __forceinline__ void tf_cp8(void* smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(tf_shared_addr(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void tf_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most one group of this thread's copies is in flight.
__device__ __forceinline__ void tf_cp_wait_all_but_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
// Waits until at most N groups of this thread's copies are in flight.
template <int N>
__device__ __forceinline__ void tf_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Programmatic dependent launch (sm_90; no-ops before it): a kernel lets
// the next one in its stream launch at once, so that the next one's blocks
// take the multiprocessors as this one's leave and may start what does not
// depend on it (the matmuls' weight copies); every kernel then waits for
// the one before it to finish before touching anything that one reads or
// writes. Waiting kernels chain, so each waits for all before it.
__device__ __forceinline__ void tf_launch_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void tf_wait_prior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Both, for kernels with nothing to start before the wait.
__device__ __forceinline__ void tf_after_prior() {
    tf_launch_next();
    tf_wait_prior();
}

// Matmul inputs as the tensor-core kernels take them: rounded to f16
// (to nearest), each 32-input unit's elements in mma slot order, so that
// thread t of a quad loads its B fragments of both halves of unit u in one
// 16-byte word: 32-bit words 16u + 4t + 2h hold elements 32u + 16h + 4t +
// (0, 2), and 16u + 4t + 2h + 1 elements (1, 3). Rows are K / 2 words;
// only widths that are a multiple of 32 have them. `q` is the index of
// the four consecutive inputs 4q..4q + 3 of the row.
__device__ __forceinline__ void tf_store_h16(uint32_t* row16, int q, float4 v) {
    const int u = q >> 3, h = (q >> 2) & 1, t = q & 3;
    *reinterpret_cast<uint2*>(row16 + 16 * u + 4 * t + 2 * h) =
        make_uint2(tf_h2_bits(__floats2half2_rn(v.x, v.z)), tf_h2_bits(__floats2half2_rn(v.y, v.w)));
}

// Element e of a row alone into its f16 slot (tf_store_h16's layout).
__device__ __forceinline__ void tf_store_h16_one(uint32_t* row16, int e, float v) {
    const int u = e >> 5, h = (e >> 4) & 1, t = (e >> 2) & 3, j = e & 3;
    reinterpret_cast<__half*>(row16 + 16 * u + 4 * t + 2 * h + (j & 1))[j >> 1] = __float2half_rn(v);
}

// silu(g) * u, the gated activation of the feed-forward block.
__device__ __forceinline__ float tf_silu_mul(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// gelu(g) * u, GELU in its tanh form: 0.5 g (1 + tanh(sqrt(2/pi) g (1 + 0.044715 g^2))),
// in the order the CPU forward multiplies.
__device__ __forceinline__ float tf_gelu_tanh_mul(float g, float u) {
    const float inner = __fmul_rn(__fmul_rn(0.7978846f, g), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, g), g)));
    return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner))), u);
}

// The fixed xor tree over a warp's 32 lane values: every lane gets the sum.
__device__ __forceinline__ float tf_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// What one lane keeps about one unit of one weight row.
struct TfUnit {
    const uint8_t* p;  // start of the unit's quant bytes (or values)
    float a, b, c;     // scales (meaning per format)
    uint32_t h;        // high bits (Q5_0), shifts (k-quants)
};

// Bytes one row of `k` inputs takes.
__host__ __device__ constexpr size_t tf_row_bytes(int fmt, int k) {
    switch (fmt) {
        case TF_F32: return (size_t)k * 4;
        case TF_F16:
        case TF_BF16: return (size_t)k * 2;
        case TF_Q4_0: return (size_t)(k / 32) * 18;
        case TF_Q4_1: return (size_t)(k / 32) * 20;
        case TF_Q5_0: return (size_t)(k / 32) * 22;
        case TF_Q8_0: return (size_t)(k / 32) * 34;
        case TF_Q4K: return (size_t)(k / 256) * 144;
        case TF_Q6K: return (size_t)(k / 256) * 210;
    }
    return 0;
}

// The 6-bit scale and min of sub-block j of a Q4_K super-block
// (get_scale_min_k4 of GGML).
__device__ __forceinline__ void tf_q4k_scale_min(const uint8_t* sb, int j, uint32_t& sc, uint32_t& m) {
    const uint8_t* s = sb + 4;
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

template <int FMT>
__device__ __forceinline__ TfUnit tf_prep(const uint8_t* row, int u) {
    TfUnit t;
    t.a = t.b = t.c = 0.f;
    t.h = 0;
    if (FMT == TF_F32) {
        t.p = row + (size_t)u * 128;
    } else if (FMT == TF_F16 || FMT == TF_BF16) {
        t.p = row + (size_t)u * 64;
    } else if (FMT == TF_Q4_0) {
        const uint8_t* q = row + (size_t)u * 18;
        t.a = tf_scale_f(tf_ld16(q));
        t.p = q + 2;
    } else if (FMT == TF_Q4_1) {
        const uint8_t* q = row + (size_t)u * 20;
        uint32_t dm = tf_ld32(q);
        t.a = tf_scale_f(dm & 0xFFFF);
        t.b = tf_scale_f(dm >> 16);
        t.p = q + 4;
    } else if (FMT == TF_Q5_0) {
        const uint8_t* q = row + (size_t)u * 22;
        t.a = tf_scale_f(tf_ld16(q));
        t.h = (uint32_t)tf_ld16(q + 2) | ((uint32_t)tf_ld16(q + 4) << 16);
        t.p = q + 6;
    } else if (FMT == TF_Q8_0) {
        const uint8_t* q = row + (size_t)u * 34;
        t.a = tf_scale_f(tf_ld16(q));
        t.p = q + 2;
    } else if (FMT == TF_Q4K) {
        const uint8_t* sb = row + (size_t)(u >> 3) * 144;
        int j = u & 7;
        uint32_t dm = tf_ld32(sb);
        float d = tf_scale_f(dm & 0xFFFF), dmin = tf_scale_f(dm >> 16);
        uint32_t sc, m;
        tf_q4k_scale_min(sb, j, sc, m);
        t.a = __fmul_rn(d, tf_int_f<0>(sc));
        t.b = __fmul_rn(dmin, tf_int_f<0>(m));
        t.p = sb + 16 + 32 * (j >> 1);
        t.h = 4 * (j & 1);
    } else if (FMT == TF_Q6K) {
        const uint8_t* sb = row + (size_t)(u >> 3) * 210;
        int t8 = u & 7, n = t8 >> 2, quad = t8 & 3;
        float d = tf_scale_f(tf_ld16(sb + 208));
        t.a = __fmul_rn(d, tf_i8_f(sb[192 + 8 * n + 2 * quad]));
        t.b = __fmul_rn(d, tf_i8_f(sb[192 + 8 * n + 2 * quad + 1]));
        t.p = sb + 64 * n + 32 * (quad & 1);  // ql
        // qh sits at 128 + 32n; keep its offset from p in c's bits.
        t.c = __int_as_float(128 + 32 * n - (64 * n + 32 * (quad & 1)));
        t.h = (uint32_t)((4 * (quad >> 1)) | ((2 * quad) << 8));
    }
    return t;
}

// Decodes elements 8s..8s+7 of the unit into w.
template <int FMT>
__device__ __forceinline__ void tf_get8(const TfUnit& t, int s, float w[8]) {
    if (FMT == TF_F32) {
        const float4* p = reinterpret_cast<const float4*>(t.p) + 2 * s;
        float4 a = __ldg(p), b = __ldg(p + 1);
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
        w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else if (FMT == TF_F16 || FMT == TF_BF16) {
        uint4 v = __ldg(reinterpret_cast<const uint4*>(t.p) + s);
        uint32_t r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (FMT == TF_F16) {
                w[2 * i] = tf_h2f(r[i] & 0xFFFF);
                w[2 * i + 1] = tf_h2f(r[i] >> 16);
            } else {
                w[2 * i] = __uint_as_float(r[i] << 16);
                w[2 * i + 1] = __uint_as_float(r[i] & 0xFFFF0000u);
            }
        }
    } else if (FMT == TF_Q4_0) {
        uint8_t b[8];
        tf_ld8_a2(t.p + 8 * (s & 1), b);
        int sh = 4 * (s >> 1);
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = __fmul_rn(tf_int_f<8>((b[i] >> sh) & 0xF), t.a);
    } else if (FMT == TF_Q4_1) {
        uint8_t b[8];
        tf_ld8_a4(t.p + 8 * (s & 1), b);
        int sh = 4 * (s >> 1);
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = __fadd_rn(__fmul_rn(tf_int_f<0>((b[i] >> sh) & 0xF), t.a), t.b);
    } else if (FMT == TF_Q5_0) {
        uint8_t b[8];
        tf_ld8_a2(t.p + 8 * (s & 1), b);
        int hi = s >> 1;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int j = 8 * (s & 1) + i;  // index into qs
            uint32_t q = hi ? ((b[i] >> 4) | ((t.h >> (j + 12)) & 0x10))
                            : ((b[i] & 0xF) | (((t.h >> j) << 4) & 0x10));
            w[i] = __fmul_rn(tf_int_f<16>(q), t.a);
        }
    } else if (FMT == TF_Q8_0) {
        uint8_t b[8];
        tf_ld8_a2(t.p + 8 * s, b);
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = __fmul_rn(tf_i8_f(b[i]), t.a);
    } else if (FMT == TF_Q4K) {
        uint8_t b[8];
        tf_ld8_a8(t.p + 8 * s, b);
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = __fsub_rn(__fmul_rn(t.a, tf_int_f<0>((b[i] >> t.h) & 0xF)), t.b);
    } else if (FMT == TF_Q6K) {
        uint8_t l[8], h[8];
        tf_ld8_a2(t.p + 8 * s, l);
        tf_ld8_a2(t.p + __float_as_int(t.c) + 8 * s, h);
        int shl = t.h & 0xFF, shh = t.h >> 8;
        float a = s < 2 ? t.a : t.b;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t q = ((l[i] >> shl) & 0xF) | (((h[i] >> shh) & 3) << 4);
            w[i] = __fmul_rn(a, tf_int_f<32>(q));
        }
    }
}
