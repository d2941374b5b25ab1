// Row-invariant matrix product: y[i, off + j] (+)= sum_k x[i, k] * W[j, k].
//
// The order of every output element's reduction is fixed by K alone:
// lane l of a warp takes units u = l, l + 32, l + 64, ... (32 inputs each),
// accumulates their products with one fused multiply-add per input in
// element order, and the 32 lane sums are combined by a fixed xor tree.
// R (rows per warp) and C (columns per warp) only decide which
// accumulators share a warp: they change speed, never bits. So a row's
// outputs are the same whether it is decoded alone or inside a 256-row
// prefill chunk, and the host may choose R and C from the call's shape.
#include "common.cuh"

#define TF_WARPS 4

// The C weight rows j0.. a warp reads (clamped at the last row).
template <int FMT, int C>
__device__ __forceinline__ void tf_weight_rows(const uint8_t* W, int j0, int N, int K, const uint8_t* wr[C]) {
    const size_t rb = tf_row_bytes(FMT, K);
#pragma unroll
    for (int c = 0; c < C; c++) wr[c] = W + (size_t)min(j0 + c, N - 1) * rb;
}

template <int FMT, int R, int C>
__device__ __forceinline__ void tf_matmul(const uint8_t* __restrict__ W, const float* __restrict__ x,
                                          float* __restrict__ y, int M, int N, int K, int ldy,
                                          int accumulate) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = (blockIdx.x * TF_WARPS + warp) * C;
    if (j0 >= N) return;
    const int i0 = blockIdx.y * R;
    const float* xr[R];
#pragma unroll
    for (int r = 0; r < R; r++) xr[r] = x + (size_t)min(i0 + r, M - 1) * K;
    const uint8_t* wr[C];
    tf_weight_rows<FMT, C>(W, j0, N, K, wr);

    float acc[R][C] = {};

    const int units = K >> 5;
    // Unrolled so several units' loads are in flight; each accumulator still
    // takes its units in increasing order.
#pragma unroll 4
    for (int u = lane; u < units; u += 32) {
        TfUnit t[C];
#pragma unroll
        for (int c = 0; c < C; c++) t[c] = tf_prep<FMT>(wr[c], u);
#pragma unroll
        for (int s = 0; s < 4; s++) {
            float xv[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float4* p = reinterpret_cast<const float4*>(xr[r] + 32 * u + 8 * s);
                float4 a = p[0], b = p[1];
                xv[r][0] = a.x; xv[r][1] = a.y; xv[r][2] = a.z; xv[r][3] = a.w;
                xv[r][4] = b.x; xv[r][5] = b.y; xv[r][6] = b.z; xv[r][7] = b.w;
            }
#pragma unroll
            for (int c = 0; c < C; c++) {
                float w[8];
                tf_get8<FMT>(t[c], s, w);
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[r][c] = __fmaf_rn(w[e], xv[r][e], acc[r][c]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < C; c++) acc[r][c] = tf_warp_sum(acc[r][c]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = i0 + r;
            if (i >= M) break;
#pragma unroll
            for (int c = 0; c < C; c++) {
                int j = j0 + c;
                if (j < N) {
                    float* o = y + (size_t)i * ldy + j;
                    *o = accumulate ? __fadd_rn(*o, acc[r][c]) : acc[r][c];
                }
            }
        }
    }
}

// Many rows: exactly tf_matmul's per-element order (lane l owns units l,
// l + 32, ...), with each 32-unit stretch of the block's R input rows
// staged once in shared memory and read there by all its warps, instead of
// every warp fetching its own lane-strided copy from global memory.
// A staged unit takes 36 floats (32 + 4 padding) so the eight lanes of a
// quarter warp read their float4s from distinct banks.
#define TF_STAGE_STRIDE 36

template <int FMT, int R, int C>
__device__ __forceinline__ void tf_matmul_staged(const uint8_t* __restrict__ W, const float* __restrict__ x,
                                                 float* __restrict__ y, int M, int N, int K, int ldy,
                                                 int accumulate) {
    extern __shared__ float4 staged4[];
    float* xs = reinterpret_cast<float*>(staged4);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = (blockIdx.x * TF_WARPS + warp) * C;
    const bool live = j0 < N;  // no early return: the block stages together
    const int i0 = blockIdx.y * R;
    const uint8_t* wr[C];
    tf_weight_rows<FMT, C>(W, j0, N, K, wr);

    float acc[R][C] = {};

    const int units = K >> 5;
    for (int u0 = 0; u0 < units; u0 += 32) {
        const int held = min(32, units - u0);
        __syncthreads();
        for (int f = threadIdx.x; f < R * 32 * 8; f += TF_WARPS * 32) {
            const int r = f >> 8, uu = (f >> 3) & 31, q = f & 7;
            if (uu < held) {
                const float* src = x + (size_t)min(i0 + r, M - 1) * K + 32 * (u0 + uu) + 4 * q;
                *reinterpret_cast<float4*>(xs + (r * 32 + uu) * TF_STAGE_STRIDE + 4 * q) =
                    *reinterpret_cast<const float4*>(src);
            }
        }
        __syncthreads();
        if (!live || lane >= held) continue;
        const int u = u0 + lane;
        TfUnit t[C];
#pragma unroll
        for (int c = 0; c < C; c++) t[c] = tf_prep<FMT>(wr[c], u);
#pragma unroll
        for (int s = 0; s < 4; s++) {
            float w[C][8];
#pragma unroll
            for (int c = 0; c < C; c++) tf_get8<FMT>(t[c], s, w[c]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float4* p = reinterpret_cast<const float4*>(xs + (r * 32 + lane) * TF_STAGE_STRIDE + 8 * s);
                const float4 a = p[0], b = p[1];
                const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int c = 0; c < C; c++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[r][c] = __fmaf_rn(w[c][e], xv[e], acc[r][c]);
            }
        }
    }
    if (!live) return;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < C; c++) acc[r][c] = tf_warp_sum(acc[r][c]);
    // Every lane holds every sum now; lanes share the stores.
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int i = i0 + r;
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int j = j0 + c;
            if (lane == ((r * C + c) & 31) && i < M && j < N) {
                float* o = y + (size_t)i * ldy + j;
                *o = accumulate ? __fadd_rn(*o, acc[r][c]) : acc[r][c];
            }
        }
    }
}

// Rows whose width is not a multiple of 32 (tiny models), f32 weights only:
// lane l takes inputs l, l + 32, ... in order, then the same xor tree. One
// warp per (row, output); the order depends on K alone.
extern "C" __global__ void __launch_bounds__(TF_WARPS * 32)
    mm_f32_any(const float* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int M, int N,
               int K, int ldy, int accumulate) {
    tf_after_prior();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x * TF_WARPS + warp, i = blockIdx.y;
    if (j >= N || i >= M) return;
    const float* wr = W + (size_t)j * K;
    const float* xr = x + (size_t)i * K;
    float v = 0.f;
    for (int k = lane; k < K; k += 32) v = __fmaf_rn(__ldg(wr + k), xr[k], v);
    v = tf_warp_sum(v);
    if (lane == 0) {
        float* o = y + (size_t)i * ldy + j;
        *o = accumulate ? __fadd_rn(*o, v) : v;
    }
}

#define TF_MM(NAME, FMT, R, C)                                                                  \
    extern "C" __global__ void __launch_bounds__(TF_WARPS * 32)                                 \
        NAME##_r##R##_c##C(const uint8_t* W, const float* x, float* y, int M, int N, int K,     \
                           int ldy, int accumulate) {                                           \
        tf_after_prior();                                                                       \
        tf_matmul<FMT, R, C>(W, x, y, M, N, K, ldy, accumulate);                                \
    }

#define TF_MM_STAGED(NAME, FMT, R, C)                                                           \
    extern "C" __global__ void __launch_bounds__(TF_WARPS * 32)                                 \
        NAME##_s##R##_c##C(const uint8_t* W, const float* x, float* y, int M, int N, int K,     \
                           int ldy, int accumulate) {                                           \
        tf_after_prior();                                                                       \
        tf_matmul_staged<FMT, R, C>(W, x, y, M, N, K, ldy, accumulate);                         \
    }

#define TF_MM_ALL(NAME, FMT)      \
    TF_MM(NAME, FMT, 1, 1)        \
    TF_MM(NAME, FMT, 2, 2)        \
    TF_MM(NAME, FMT, 4, 2)        \
    TF_MM(NAME, FMT, 8, 4)        \
    TF_MM(NAME, FMT, 1, 4)        \
    TF_MM(NAME, FMT, 2, 4)        \
    TF_MM_STAGED(NAME, FMT, 16, 4) \
    TF_MM_STAGED(NAME, FMT, 8, 8)  \
    TF_MM_STAGED(NAME, FMT, 16, 8)

TF_MM_ALL(mm_f32, TF_F32)
TF_MM_ALL(mm_f16, TF_F16)
TF_MM_ALL(mm_bf16, TF_BF16)
TF_MM_ALL(mm_q4_0, TF_Q4_0)
TF_MM_ALL(mm_q4_1, TF_Q4_1)
TF_MM_ALL(mm_q5_0, TF_Q5_0)
TF_MM_ALL(mm_q8_0, TF_Q8_0)
TF_MM_ALL(mm_q4k, TF_Q4K)
TF_MM_ALL(mm_q6k, TF_Q6K)
