// Row-invariant matrix product on tensor cores, for the GGUF quantized
// formats: y[i, off + j] (+)= sum_k x[i, k] * W[j, k], with W decoded and x
// rounded to f16 and products accumulated in f32 by mma.m16n8k16.
//
// The order of every output element's reduction is fixed by K alone:
// K is cut into segments of TF_SEG units (256 inputs, the last may be
// shorter); a segment's sum is one chain of mma instructions over its
// units in order, two per unit (inputs 8t + {0..3} of each quad thread t,
// then 8t + {4..7}), starting from zero; segment sums are then added in
// segment order, starting from zero. An mma computes each output element
// from that element's weight row, input row and accumulator alone, so
// neither the tile a row lands in nor its place there changes its bits.
// The kernel for few rows and the kernel for many only spread this same
// order differently over warps.
#include "common.cuh"

#define TF_SEG 8
#define TF_MANY_WARPS 4

__device__ __forceinline__ uint32_t tf_pack_h2(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// d += A * B for one 16 x 8 tile (A: 16 weight rows x 16 inputs, B: 16
// inputs x 8 input rows).
__device__ __forceinline__ void tf_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The A fragments of unit u for weight rows g (lo) and g + 8 (hi) of a
// tile, both halves. Thread t of a quad feeds mma slots 2t, 2t+1, 2t+8,
// 2t+9 with its elements 8t + 4h + {0, 1, 2, 3} in half h.
template <int FMT>
__device__ __forceinline__ void tf_a_frags(const uint8_t* lo, const uint8_t* hi, int u, int t, uint32_t a[2][4]) {
    float wl[8], wh[8];
    tf_get8<FMT>(tf_prep<FMT>(lo, u), t, wl);
    tf_get8<FMT>(tf_prep<FMT>(hi, u), t, wh);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        a[h][0] = tf_pack_h2(wl[4 * h], wl[4 * h + 1]);
        a[h][1] = tf_pack_h2(wh[4 * h], wh[4 * h + 1]);
        a[h][2] = tf_pack_h2(wl[4 * h + 2], wl[4 * h + 3]);
        a[h][3] = tf_pack_h2(wh[4 * h + 2], wh[4 * h + 3]);
    }
}

// The B fragments of unit u for one input row, both halves, in the same
// slot order as the A fragments.
__device__ __forceinline__ void tf_b_frags(const float* xr, int u, int t, uint32_t b[2][2]) {
    const float4* p = reinterpret_cast<const float4*>(xr + 32 * u + 8 * t);
    const float4 v0 = p[0], v1 = p[1];
    b[0][0] = tf_pack_h2(v0.x, v0.y);
    b[0][1] = tf_pack_h2(v0.z, v0.w);
    b[1][0] = tf_pack_h2(v1.x, v1.y);
    b[1][1] = tf_pack_h2(v1.z, v1.w);
}

// One unit's two steps of the chain for one 16 x 8 tile.
// `u` indexes the inputs, `wu` the same unit in the weight rows given.
template <int FMT>
__device__ __forceinline__ void tf_mma_unit(const uint8_t* lo, const uint8_t* hi, const float* xr, int u, int wu,
                                            int t, float d[4]) {
    uint32_t a[2][4], b[2][2];
    tf_a_frags<FMT>(lo, hi, wu, t, a);
    tf_b_frags(xr, u, t, b);
    tf_mma(d, a[0], b[0]);
    tf_mma(d, a[1], b[1]);
}

__device__ __forceinline__ void tf_store(float* y, int M, int N, int ldy, int accumulate, int i, int j, float v) {
    if (i < M && j < N) {
        float* o = y + (size_t)i * ldy + j;
        *o = accumulate ? __fadd_rn(*o, v) : v;
    }
}

// 16-byte words that hold any segment of a row wherever it starts: the
// segment's bytes rounded up, plus one for a start inside a word.
template <int FMT>
__host__ __device__ constexpr int tf_seg_words() {
    return (int)((tf_row_bytes(FMT, 32 * TF_SEG) + 15) / 16) + 1;
}

// Few rows (one tile of 8 input rows per block row): a block owns 16
// weight rows, its warps take segments w, w + warps, ... and leave their
// sums in shared memory; warp 0 adds them in segment order. A warp first
// copies its segment's bytes of all 16 rows into shared memory with
// aligned 16-byte loads (every load in flight at once, whole sectors),
// then decodes from there. Dynamic shared memory: 512 bytes per segment,
// then 256 * tf_seg_words bytes per warp (weight buffers are padded so the
// last word read stays inside them).
template <int FMT>
__device__ __forceinline__ void tf_mma_few(const uint8_t* __restrict__ W, const float* __restrict__ x,
                                           float* __restrict__ y, int M, int N, int K, int ldy,
                                           int accumulate) {
    extern __shared__ float4 part[];
    constexpr int QW = tf_seg_words<FMT>();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int j0 = blockIdx.x * 16, i0 = blockIdx.y * 8;
    const size_t rb = tf_row_bytes(FMT, K);
    const int units = K >> 5, segs = (units + TF_SEG - 1) / TF_SEG;
    uint4* words = reinterpret_cast<uint4*>(part + segs * 32) + warp * 16 * QW;
    const float* xr = x + (size_t)min(i0 + g, M - 1) * K;
    for (int s = warp; s < segs; s += warps) {
        const int u0 = s * TF_SEG;
        const size_t seg = tf_row_bytes(FMT, 32 * u0);
        __syncwarp();
        for (int f = lane; f < 16 * QW; f += 32) {
            const int i = f / QW, q = f % QW;
            const uintptr_t at = reinterpret_cast<uintptr_t>(W + (size_t)min(j0 + i, N - 1) * rb + seg);
            words[f] = __ldg(reinterpret_cast<const uint4*>((at & ~(uintptr_t)15) + 16 * q));
        }
        __syncwarp();
        // This segment of rows g and g + 8, as decoded from the copy.
        const uint8_t* rows[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int i = g + 8 * k;
            const uintptr_t at = reinterpret_cast<uintptr_t>(W + (size_t)min(j0 + i, N - 1) * rb + seg);
            rows[k] = reinterpret_cast<const uint8_t*>(words + i * QW) + (at & 15);
        }
        float d[4] = {};
        if (u0 + TF_SEG <= units) {
#pragma unroll
            for (int u = 0; u < TF_SEG; u++) tf_mma_unit<FMT>(rows[0], rows[1], xr, u0 + u, u, t, d);
        } else {
            for (int u = 0; u < units - u0; u++) tf_mma_unit<FMT>(rows[0], rows[1], xr, u0 + u, u, t, d);
        }
        part[s * 32 + lane] = make_float4(d[0], d[1], d[2], d[3]);
    }
    __syncthreads();
    if (warp != 0) return;
    float v[4] = {};
    for (int s = 0; s < segs; s++) {
        const float4 p = part[s * 32 + lane];
        v[0] = __fadd_rn(v[0], p.x);
        v[1] = __fadd_rn(v[1], p.y);
        v[2] = __fadd_rn(v[2], p.z);
        v[3] = __fadd_rn(v[3], p.w);
    }
    // Accumulator slots: (row g, input rows 2t, 2t + 1), then row g + 8.
    tf_store(y, M, N, ldy, accumulate, i0 + 2 * t, j0 + g, v[0]);
    tf_store(y, M, N, ldy, accumulate, i0 + 2 * t + 1, j0 + g, v[1]);
    tf_store(y, M, N, ldy, accumulate, i0 + 2 * t, j0 + g + 8, v[2]);
    tf_store(y, M, N, ldy, accumulate, i0 + 2 * t + 1, j0 + g + 8, v[3]);
}

// Many rows: a warp owns 16 * TC weight rows by 8 * TN input rows and walks
// the segments in order itself, keeping the running total beside the
// segment's sum; a block is TF_MANY_WARPS warps side by side over weight
// rows, sharing their input rows through L1.
template <int FMT, int TC, int TN>
__device__ __forceinline__ void tf_mma_many(const uint8_t* __restrict__ W, const float* __restrict__ x,
                                            float* __restrict__ y, int M, int N, int K, int ldy,
                                            int accumulate) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int j0 = (blockIdx.x * TF_MANY_WARPS + warp) * 16 * TC, i0 = blockIdx.y * 8 * TN;
    if (j0 >= N) return;
    const size_t rb = tf_row_bytes(FMT, K);
    const uint8_t *lo[TC], *hi[TC];
#pragma unroll
    for (int c = 0; c < TC; c++) {
        lo[c] = W + (size_t)min(j0 + 16 * c + g, N - 1) * rb;
        hi[c] = W + (size_t)min(j0 + 16 * c + g + 8, N - 1) * rb;
    }
    const float* xr[TN];
#pragma unroll
    for (int n = 0; n < TN; n++) xr[n] = x + (size_t)min(i0 + 8 * n + g, M - 1) * K;
    const int units = K >> 5, segs = (units + TF_SEG - 1) / TF_SEG;
    float total[TC][TN][4] = {};
    for (int s = 0; s < segs; s++) {
        float d[TC][TN][4] = {};
#pragma unroll 2
        for (int k = 0; k < TF_SEG; k++) {
            const int u = s * TF_SEG + k;
            if (u >= units) break;
            uint32_t b[TN][2][2];
#pragma unroll
            for (int n = 0; n < TN; n++) tf_b_frags(xr[n], u, t, b[n]);
#pragma unroll
            for (int c = 0; c < TC; c++) {
                uint32_t a[2][4];
                tf_a_frags<FMT>(lo[c], hi[c], u, t, a);
#pragma unroll
                for (int n = 0; n < TN; n++) {
                    tf_mma(d[c][n], a[0], b[n][0]);
                    tf_mma(d[c][n], a[1], b[n][1]);
                }
            }
        }
#pragma unroll
        for (int c = 0; c < TC; c++)
#pragma unroll
            for (int n = 0; n < TN; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) total[c][n][e] = __fadd_rn(total[c][n][e], d[c][n][e]);
    }
#pragma unroll
    for (int c = 0; c < TC; c++)
#pragma unroll
        for (int n = 0; n < TN; n++) {
            const int i = i0 + 8 * n + 2 * t, j = j0 + 16 * c + g;
            tf_store(y, M, N, ldy, accumulate, i, j, total[c][n][0]);
            tf_store(y, M, N, ldy, accumulate, i + 1, j, total[c][n][1]);
            tf_store(y, M, N, ldy, accumulate, i, j + 8, total[c][n][2]);
            tf_store(y, M, N, ldy, accumulate, i + 1, j + 8, total[c][n][3]);
        }
}

#define TF_TC_FEW(NAME, FMT)                                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        NAME##_few(const uint8_t* W, const float* x, float* y, int M, int N, int K, int ldy,    \
                   int accumulate) {                                                           \
        tf_mma_few<FMT>(W, x, y, M, N, K, ldy, accumulate);                                    \
    }

#define TF_TC_MANY(NAME, FMT, TC, TN)                                                          \
    extern "C" __global__ void __launch_bounds__(TF_MANY_WARPS * 32)                           \
        NAME##_m##TC##x##TN(const uint8_t* W, const float* x, float* y, int M, int N, int K,    \
                            int ldy, int accumulate) {                                         \
        tf_mma_many<FMT, TC, TN>(W, x, y, M, N, K, ldy, accumulate);                           \
    }

#define TF_TC_ALL(NAME, FMT)       \
    TF_TC_FEW(NAME, FMT)           \
    TF_TC_MANY(NAME, FMT, 2, 4)    \
    TF_TC_MANY(NAME, FMT, 1, 4)    \
    TF_TC_MANY(NAME, FMT, 2, 2)

TF_TC_ALL(tc_q4_0, TF_Q4_0)
TF_TC_ALL(tc_q4_1, TF_Q4_1)
TF_TC_ALL(tc_q5_0, TF_Q5_0)
TF_TC_ALL(tc_q8_0, TF_Q8_0)
TF_TC_ALL(tc_q4k, TF_Q4K)
TF_TC_ALL(tc_q6k, TF_Q6K)
