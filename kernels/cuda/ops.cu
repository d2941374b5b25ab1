// The row-local steps of the decoder forward. Each kernel computes a row
// (or a (row, head)) from that row's data alone, with reductions in an
// order fixed by the model's shape, so nothing depends on the batch.
#include "common.cuh"

#define TF_NORM_THREADS 256

// Fixed-order sum over a block of TF_NORM_THREADS threads: each warp's
// xor tree, then the warps' sums in warp order.
__device__ __forceinline__ float tf_block_sum(float v, float* sh) {
    v = tf_warp_sum(v);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < TF_NORM_THREADS / 32; w++) s = __fadd_rn(s, sh[w]);
    __syncthreads();
    return s;
}

__device__ __forceinline__ float tf_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// An embedding times `scale` (Gemma's sqrt(hidden)); 1 leaves it as it is.
__device__ __forceinline__ float tf_scaled(float v, float scale) { return scale == 1.f ? v : __fmul_rn(v, scale); }

// One row of the embedding table per block: out[r] = decode(W[tokens[r]]) * scale.
template <int FMT>
__device__ void tf_embed(const uint8_t* W, const long long* tokens, float* out, int K, float scale) {
    const int r = blockIdx.x;
    const uint8_t* row = W + (size_t)tokens[r] * tf_row_bytes(FMT, K);
    float* o = out + (size_t)r * K;
    for (int u = threadIdx.x; u < (K >> 5); u += blockDim.x) {
        TfUnit t = tf_prep<FMT>(row, u);
#pragma unroll
        for (int s = 0; s < 4; s++) {
            float w[8];
            tf_get8<FMT>(t, s, w);
#pragma unroll
            for (int e = 0; e < 8; e++) o[32 * u + 8 * s + e] = tf_scaled(w[e], scale);
        }
    }
}

extern "C" __global__ void embed(int fmt, const uint8_t* W, const long long* tokens, float* out, int K,
                                 float scale) {
    tf_after_prior();
    if (K & 31) {
        // Rows narrower than whole units come as f32 (the host widens them).
        const float* row = reinterpret_cast<const float*>(W) + (size_t)tokens[blockIdx.x] * K;
        for (int i = threadIdx.x; i < K; i += blockDim.x) out[(size_t)blockIdx.x * K + i] = tf_scaled(row[i], scale);
        return;
    }
    switch (fmt) {
        case TF_F32: tf_embed<TF_F32>(W, tokens, out, K, scale); break;
        case TF_F16: tf_embed<TF_F16>(W, tokens, out, K, scale); break;
        case TF_BF16: tf_embed<TF_BF16>(W, tokens, out, K, scale); break;
        case TF_Q4_0: tf_embed<TF_Q4_0>(W, tokens, out, K, scale); break;
        case TF_Q4_1: tf_embed<TF_Q4_1>(W, tokens, out, K, scale); break;
        case TF_Q5_0: tf_embed<TF_Q5_0>(W, tokens, out, K, scale); break;
        case TF_Q8_0: tf_embed<TF_Q8_0>(W, tokens, out, K, scale); break;
        case TF_Q4K: tf_embed<TF_Q4K>(W, tokens, out, K, scale); break;
        case TF_Q6K: tf_embed<TF_Q6K>(W, tokens, out, K, scale); break;
    }
}

// out[r] = rmsnorm(x[src]) * w, src = idx ? idx[r] : r, and the same in
// f16 to `out16` (tf_store_h16) unless it is null. One block per row.
// Rows of whole float4s, up to TF_NORM_VEC per thread, stay in registers:
// thread i takes float4s i, i + TF_NORM_THREADS, ... and sums their
// squares in that order, then a fixed tree. Other rows take elements one
// at a time at the same stride, read twice. Either way the order depends
// on the width alone.
#define TF_NORM_VEC 8
extern "C" __global__ void __launch_bounds__(TF_NORM_THREADS)
    rmsnorm(const float* __restrict__ x, const long long* __restrict__ idx, const float* __restrict__ w,
            float* __restrict__ out, uint32_t* __restrict__ out16, int H, float eps) {
    __shared__ float sh[TF_NORM_THREADS / 32];
    tf_after_prior();
    const int r = blockIdx.x;
    const float* xr = x + (size_t)(idx ? idx[r] : r) * H;
    float* o = out + (size_t)r * H;
    // The path depends on the width alone; x, w and out are allocations of
    // whole rows, so 16-byte aligned whenever H is a multiple of 4.
    if ((H & 3) == 0 && H <= 4 * TF_NORM_THREADS * TF_NORM_VEC) {
        const int n4 = H / 4;
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        float4 v[TF_NORM_VEC];
        float ss = 0.f;
#pragma unroll
        for (int b = 0; b < TF_NORM_VEC; b++) {
            const int q = threadIdx.x + b * TF_NORM_THREADS;
            v[b] = q < n4 ? reinterpret_cast<const float4*>(xr)[q] : zero;
        }
#pragma unroll
        for (int b = 0; b < TF_NORM_VEC; b++) {
            if (threadIdx.x + b * TF_NORM_THREADS < n4) {
                ss = __fmaf_rn(v[b].x, v[b].x, ss);
                ss = __fmaf_rn(v[b].y, v[b].y, ss);
                ss = __fmaf_rn(v[b].z, v[b].z, ss);
                ss = __fmaf_rn(v[b].w, v[b].w, ss);
            }
        }
        ss = tf_block_sum(ss, sh);
        const float scale = 1.0f / sqrtf(__fadd_rn(ss / (float)H, eps));
#pragma unroll
        for (int b = 0; b < TF_NORM_VEC; b++) {
            const int q = threadIdx.x + b * TF_NORM_THREADS;
            if (q < n4) {
                const float4 g = reinterpret_cast<const float4*>(w)[q];
                const float4 y = make_float4(__fmul_rn(__fmul_rn(v[b].x, scale), g.x),
                                             __fmul_rn(__fmul_rn(v[b].y, scale), g.y),
                                             __fmul_rn(__fmul_rn(v[b].z, scale), g.z),
                                             __fmul_rn(__fmul_rn(v[b].w, scale), g.w));
                reinterpret_cast<float4*>(o)[q] = y;
                if (out16) tf_store_h16(out16 + (size_t)r * (H / 2), q, y);
            }
        }
        return;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += TF_NORM_THREADS) ss = __fmaf_rn(xr[i], xr[i], ss);
    ss = tf_block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(__fadd_rn(ss / (float)H, eps));
    for (int i = threadIdx.x; i < H; i += TF_NORM_THREADS) o[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
    if (out16) {
        __syncthreads();  // the row is written before it is read back in fours
        for (int q = threadIdx.x; q < H / 4; q += blockDim.x)
            tf_store_h16(out16 + (size_t)r * (H / 2), q, reinterpret_cast<const float4*>(o)[q]);
    }
}

// After the fused q|k|v product: bias, per-head norm (qwen3), rotary
// embedding from the row's absolute position, then q to `q_out` and k, v
// into the row's sequence cache, rounded to f16 (to nearest: the rounding
// the tensor-core attention applies to its inputs, so it reads the cache
// as it is). Grid (rows, heads + 2 * kv_heads), one warp per head vector.
extern "C" __global__ void qkv_post(const float* qkv, int heads, int kv_heads, int hd,
                                    const float* q_bias, const float* k_bias, const float* v_bias,
                                    const float* q_norm, const float* k_norm, float eps,
                                    const float* cos_t, const float* sin_t, int interleaved,
                                    const long long* row_pos, const long long* row_seq,
                                    const unsigned long long* k_base, const unsigned long long* v_base,
                                    const long long* cap, int layer, float* q_out) {
    __shared__ float v[512];
    tf_after_prior();
    const int r = blockIdx.x, hv = blockIdx.y, lane = threadIdx.x;
    const int qw = heads * hd, kvw = kv_heads * hd, width = qw + 2 * kvw;
    const float* src = qkv + (size_t)r * width + (size_t)hv * hd;
    const int kind = hv < heads ? 0 : (hv < heads + kv_heads ? 1 : 2);
    const float* bias = kind == 0 ? q_bias : (kind == 1 ? k_bias : v_bias);
    const int boff = (kind == 0 ? hv : (kind == 1 ? hv - heads : hv - heads - kv_heads)) * hd;
    for (int i = lane; i < hd; i += 32) v[i] = bias ? __fadd_rn(src[i], bias[boff + i]) : src[i];
    __syncwarp();
    const float* nw = kind == 0 ? q_norm : (kind == 1 ? k_norm : nullptr);
    if (nw) {
        float ss = 0.f;
        for (int i = lane; i < hd; i += 32) ss = __fmaf_rn(v[i], v[i], ss);
        ss = tf_warp_sum(ss);
        const float scale = 1.0f / sqrtf(__fadd_rn(ss / (float)hd, eps));
        __syncwarp();
        for (int i = lane; i < hd; i += 32) v[i] = __fmul_rn(__fmul_rn(v[i], scale), nw[i]);
        __syncwarp();
    }
    const long long pos = row_pos[r];
    if (kind < 2) {
        const int half = hd / 2;
        const float* ct = cos_t + (size_t)pos * half;
        const float* st = sin_t + (size_t)pos * half;
        for (int i = lane; i < half; i += 32) {
            int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
            float x0 = v[a], x1 = v[b], c = ct[i], s = st[i];
            v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
            v[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        }
        __syncwarp();
    }
    if (kind == 0) {
        float* dst = q_out + (size_t)r * qw + (size_t)hv * hd;
        for (int i = lane; i < hd; i += 32) dst[i] = v[i];
    } else {
        const long long sq = row_seq[r];
        __half* base = reinterpret_cast<__half*>(kind == 1 ? k_base[sq] : v_base[sq]);
        const int kvh = kind == 1 ? hv - heads : hv - heads - kv_heads;
        __half* dst = base + ((size_t)layer * cap[sq] + pos) * kvw + (size_t)kvh * hd;
        for (int i = lane; i < hd; i += 32) dst[i] = __float2half_rn(v[i]);
    }
}

#define TF_KEY_BLOCK 64
#define TF_MAX_HD 256
// Halves between staged keys: 4 of padding so the 8-byte reads of a half
// warp's lanes (one key each) fall in distinct banks (for head dimensions
// that are a multiple of 8).
#define TF_KEY_PAD 4

// Causal attention of (row, head) pairs over keys 0..=pos of their
// sequences. Keys are taken in blocks of 64 counted from position 0. Each
// block gives a partial softmax of its own: lane l scores keys 64b + l and
// 64b + 32 + l with a sequential dot, p = exp(score - the block's max), the
// block's max and sum use fixed trees, and its value sum adds keys one by
// one in position order, from zero. The partials are then folded in block
// order (`tf_fold`). A block's partial depends on that block alone, so
// blocks may be computed by any warp in any order; only the fold is a
// chain. Nothing depends on other rows or on chunking.
//
// The cache holds keys and values in f16 (`qkv_post`); these kernels widen
// each to f32 as they load it (exactly) and do all arithmetic in f32. So
// they see the same numbers whichever row, chunk or batch reads them.
struct TfKeyBlock {
    float p[2];  // this lane's keys' weights (0 for keys past the end)
    float max, sum;
};

// Four consecutive cached halves (8-byte aligned) widened to floats.
__device__ __forceinline__ float4 tf_h4_f(const __half* p) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    return make_float4(tf_h2f(w.x & 0xFFFF), tf_h2f(w.x >> 16), tf_h2f(w.y & 0xFFFF), tf_h2f(w.y >> 16));
}

// The head dimension a lane keeps in slot t of its value sums: four
// consecutive ones per 128, so values load four at a time (a dimension's
// sum does not depend on which lane keeps it).
__device__ __forceinline__ int tf_dim(int lane, int t) { return 128 * (t >> 2) + 4 * lane + (t & 3); }

// A score as the plan shapes it: scaled, then soft-capped to
// `cap * tanh(score / cap)` where `cap` is not 0 (Gemma 2).
__device__ __forceinline__ float tf_score(float dot, float scale, float cap) {
    const float s = __fmul_rn(dot, scale);
    return cap == 0.f ? s : __fmul_rn(cap, tanhf(__fdiv_rn(s, cap)));
}

// The first key a query at `pos` sees: 0, or with a sliding window of
// `window` keys (0: none), its own and the window - 1 before it.
__device__ __forceinline__ long long tf_first_key(long long pos, int window) {
    return window > 0 ? max(0LL, pos + 1 - window) : 0LL;
}

// One key block scored for R query rows of one sequence (queries hd
// apart at `qs`; row r sees keys `from[r]..valid[r]` of the block, at
// least one): each lane takes keys lane and 32 + lane, each row's score of
// a key one sequential chain over the dimensions. The rows share every
// key load; a row's arithmetic is the same for any R.
template <int R>
__device__ __forceinline__ void tf_key_blocks(const float* qs, const __half* kb, size_t stride, const int from[R],
                                              const int valid[R], int lane, int hd, float scale, float softcap,
                                              TfKeyBlock b[R]) {
    int most = 0;
#pragma unroll
    for (int r = 0; r < R; r++) most = max(most, valid[r]);
    const __half* k0 = kb + (lane < most ? lane : 0) * stride;
    const __half* k1 = kb + (32 + lane < most ? 32 + lane : 0) * stride;
    float a[R][2] = {};
#pragma unroll(R == 1 ? 8 : 2)
    for (int d = 0; d < hd; d += 4) {
        const float4 x0 = tf_h4_f(k0 + d);
        const float4 x1 = tf_h4_f(k1 + d);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float4 qd = *reinterpret_cast<const float4*>(qs + r * hd + d);
            a[r][0] = __fmaf_rn(qd.x, x0.x, a[r][0]);
            a[r][1] = __fmaf_rn(qd.x, x1.x, a[r][1]);
            a[r][0] = __fmaf_rn(qd.y, x0.y, a[r][0]);
            a[r][1] = __fmaf_rn(qd.y, x1.y, a[r][1]);
            a[r][0] = __fmaf_rn(qd.z, x0.z, a[r][0]);
            a[r][1] = __fmaf_rn(qd.z, x1.z, a[r][1]);
            a[r][0] = __fmaf_rn(qd.w, x0.w, a[r][0]);
            a[r][1] = __fmaf_rn(qd.w, x1.w, a[r][1]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const bool ok[2] = {from[r] <= lane && lane < valid[r], from[r] <= 32 + lane && 32 + lane < valid[r]};
        const float s[2] = {ok[0] ? tf_score(a[r][0], scale, softcap) : -INFINITY,
                            ok[1] ? tf_score(a[r][1], scale, softcap) : -INFINITY};
        b[r].max = tf_warp_max(fmaxf(s[0], s[1]));
#pragma unroll
        for (int half = 0; half < 2; half++) b[r].p[half] = ok[half] ? expf(__fsub_rn(s[half], b[r].max)) : 0.f;
        b[r].sum = tf_warp_sum(__fadd_rn(b[r].p[0], b[r].p[1]));
    }
}

// Each row's value sum of the block for the dimensions tf_dim gives this
// lane, keys in position order from zero; the rows share every value
// load, and the loads of KEYS keys are issued before their multiply-adds
// so they overlap (as many as registers allow).
template <int R, int NT, int KEYS = R == 1 ? 8 : 2>
__device__ __forceinline__ void tf_key_block_values(const TfKeyBlock b[R], const __half* vb, size_t stride,
                                                    const int valid[R], int lane, int hd, float o[R][NT]) {
    int most = 0;
#pragma unroll
    for (int r = 0; r < R; r++) {
        most = max(most, valid[r]);
#pragma unroll
        for (int t = 0; t < NT; t++) o[r][t] = 0.f;
    }
    for (int j0 = 0; j0 < most; j0 += KEYS) {
        float vv[KEYS][NT];
#pragma unroll
        for (int k = 0; k < KEYS; k++) {
            const __half* vr = vb + (size_t)min(j0 + k, most - 1) * stride;
#pragma unroll
            for (int c = 0; c < NT / 4; c++) {
                const bool in = tf_dim(lane, 4 * c) < hd;
                const float4 v = in ? tf_h4_f(vr + tf_dim(lane, 4 * c)) : make_float4(0.f, 0.f, 0.f, 0.f);
                vv[k][4 * c] = v.x;
                vv[k][4 * c + 1] = v.y;
                vv[k][4 * c + 2] = v.z;
                vv[k][4 * c + 3] = v.w;
            }
        }
#pragma unroll
        for (int k = 0; k < KEYS; k++) {
            const int jj = j0 + k;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float pj = __shfl_sync(0xffffffffu, jj < 32 ? b[r].p[0] : b[r].p[1], jj & 31);
                if (jj < valid[r]) {
#pragma unroll
                    for (int t = 0; t < NT; t++)
                        if (tf_dim(lane, t) < hd) o[r][t] = __fmaf_rn(pj, vv[k][t], o[r][t]);
                }
            }
        }
    }
}

// What the fold has gathered so far: the running max, sum and value sum.
// NT value slots per lane (tf_dim) cover head dimensions up to 32 NT.
template <int NT>
struct TfSoftmax {
    float max, sum;
    float o[NT];
};

template <int NT>
__device__ __forceinline__ void tf_softmax_start(TfSoftmax<NT>& f) {
    f.max = -INFINITY;
    f.sum = 0.f;
#pragma unroll
    for (int t = 0; t < NT; t++) f.o[t] = 0.f;
}

// Folds the next block's partial (max, sum, value sum) into f.
template <int NT>
__device__ __forceinline__ void tf_fold(TfSoftmax<NT>& f, float max, float sum, const float o[NT]) {
    const float mn = fmaxf(f.max, max);
    const float a = f.max == -INFINITY ? 0.f : expf(__fsub_rn(f.max, mn));
    const float c = expf(__fsub_rn(max, mn));
    f.sum = __fmaf_rn(sum, c, __fmul_rn(f.sum, a));
#pragma unroll
    for (int t = 0; t < NT; t++) f.o[t] = __fmaf_rn(o[t], c, __fmul_rn(f.o[t], a));
    f.max = mn;
}

// Row r, head h of the output, and in f16 to `out16` unless it is null.
template <int NT>
__device__ __forceinline__ void tf_softmax_store(const TfSoftmax<NT>& f, float* out, uint32_t* out16, int r, int h,
                                                 int heads, int lane, int hd) {
    const float inv = 1.0f / f.sum;
    float v[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        v[t] = __fmul_rn(f.o[t], inv);
        if (tf_dim(lane, t) < hd) out[(size_t)r * heads * hd + (size_t)h * hd + tf_dim(lane, t)] = v[t];
    }
    if (out16) {
#pragma unroll
        for (int c = 0; c < NT / 4; c++)
            if (tf_dim(lane, 4 * c) < hd)
                tf_store_h16(out16 + (size_t)r * (heads * hd / 2), (h * hd + tf_dim(lane, 4 * c)) / 4,
                             make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]));
    }
}

// Many rows: a warp per (TF_ATT_ROWS consecutive rows, head) walks its key
// blocks and folds them as it goes, one fold per row. A block takes `rows`
// consecutive rows and `hb` query heads of one kv head (hb divides
// heads / kv_heads), at most 16 warps. A warp's rows of one sequence share
// every key and value load; rows of two sequences take theirs one after
// the other. With `stage`, each 64-key block of the first row's sequence
// is copied to shared memory once (keys and values, asynchronously, each
// landing while the other is used) for every warp whose rows belong to
// that sequence; rows of other sequences read theirs from global memory.
// All run the very same arithmetic per row, only from another address.
// Dynamic shared memory: 2 * 64 * (hd + 4) halves (keys and values), then
// TF_ATT_ROWS * warps * hd floats (queries).
#define TF_ATT_ROWS 2
template <int NT>
__device__ __forceinline__ void tf_attention(const float* __restrict__ q, int heads, int kv_heads, int hd,
                                             float scale, const long long* row_pos, const long long* row_seq,
                                             const unsigned long long* k_base, const unsigned long long* v_base,
                                             const long long* cap, int layer, float* out, uint32_t* out16, int M,
                                             int rows, int hb, int stage, int window, float softcap) {
    constexpr int R = TF_ATT_ROWS;
    extern __shared__ float4 staged4[];
    __half* staged_kv = reinterpret_cast<__half*>(staged4);
    const int ks = hd + TF_KEY_PAD;
    const int group = heads / kv_heads, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y * hb + warp % hb, kvh = h / group, kvw = kv_heads * hd;
    const int r0 = blockIdx.x * rows, first = R * (warp / hb);
    __half* staged_v = staged_kv + TF_KEY_BLOCK * ks;
    // 2 * 64 * ks halves: a multiple of 16 bytes, as ks is of 4.
    float* qs = reinterpret_cast<float*>(staged_v + TF_KEY_BLOCK * ks) + warp * R * hd;

    // Key ranges: of all the block's rows, and of those staged.
    const long long sq0 = row_seq[r0];
    long long n_all = 0, n_staged = 0, first_all = 0x7fffffffffffffffLL;
    for (int i = 0; i < rows && r0 + i < M; i++) {
        const long long ni = row_pos[r0 + i] + 1;
        n_all = max(n_all, ni);
        first_all = min(first_all, tf_first_key(row_pos[r0 + i], window));
        if (stage && row_seq[r0 + i] == sq0) n_staged = max(n_staged, ni);
    }
    // The first block any row sees (blocks keep their places from 0).
    const long long b_start = first_all / TF_KEY_BLOCK * TF_KEY_BLOCK;
    // This warp's rows: their sequence, keys, cache and query.
    bool live[R], staged[R];
    long long seq[R], n[R], lo[R];
    const __half *K[R], *V[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int r = r0 + first + i;
        live[i] = first + i < rows && r < M;
        seq[i] = live[i] ? row_seq[r] : sq0;
        n[i] = live[i] ? row_pos[r] + 1 : 0;
        lo[i] = live[i] ? tf_first_key(row_pos[r], window) : 0;
        staged[i] = stage && seq[i] == sq0;
        const size_t off = (size_t)layer * cap[seq[i]] * kvw + (size_t)kvh * hd;
        K[i] = reinterpret_cast<const __half*>(k_base[seq[i]]) + off;
        V[i] = reinterpret_cast<const __half*>(v_base[seq[i]]) + off;
        if (live[i]) {
            const float* qr = q + (size_t)r * heads * hd + (size_t)h * hd;
            for (int d = lane; d < hd; d += 32) qs[i * hd + d] = qr[d];
        }
    }
    // Rows past the end take no keys, so they share with any sequence.
    bool together = true;
#pragma unroll
    for (int i = 1; i < R; i++) together = together && (!live[i] || seq[i] == seq[0]);
    const size_t off0 = (size_t)layer * cap[sq0] * kvw + (size_t)kvh * hd;
    const __half* K0 = reinterpret_cast<const __half*>(k_base[sq0]) + off0;
    const __half* V0 = reinterpret_cast<const __half*>(v_base[sq0]) + off0;
    __syncwarp();

    TfSoftmax<NT> f[R];
#pragma unroll
    for (int i = 0; i < R; i++) tf_softmax_start(f[i]);
    const int quads = hd / 4;
    // Keys (or values) of block b0 that are staged, copied into `to`
    // asynchronously as one group of copies (empty past the staged range),
    // four halves a copy (head dimensions are a multiple of 4 only).
    auto stage_block = [&](const __half* from, __half* to, long long b0) {
        const int held = (int)max(0LL, min((long long)TF_KEY_BLOCK, n_staged - b0));
        for (int e = threadIdx.x; e < held * quads; e += blockDim.x) {
            const int j = e / quads, d = 4 * (e % quads);
            tf_cp8(to + j * ks + d, from + (size_t)(b0 + j) * kvw + d);
        }
        tf_cp_commit();
    };
    // The keys of block b + 1 land while block b's values are summed, and
    // its values while its keys are scored.
    stage_block(K0, staged_kv, b_start);
    stage_block(V0, staged_v, b_start);
    for (long long b0 = b_start; b0 < n_all; b0 += TF_KEY_BLOCK) {
        int valid[R], from[R];
        bool any = false;
        const __half *kb[R], *vb[R];
        size_t stride[R];
#pragma unroll
        for (int i = 0; i < R; i++) {
            // A block wholly before a row's window is not that row's.
            const bool seen = live[i] && b0 < n[i] && b0 + TF_KEY_BLOCK > lo[i];
            valid[i] = seen ? (int)min((long long)TF_KEY_BLOCK, n[i] - b0) : 0;
            from[i] = (int)max(0LL, lo[i] - b0);
            any = any || valid[i] > 0;
            // This block's keys: staged (stride hd + 4) or in the cache.
            kb[i] = staged[i] ? staged_kv : K[i] + (size_t)b0 * kvw;
            vb[i] = staged[i] ? staged_v : V[i] + (size_t)b0 * kvw;
            stride[i] = staged[i] ? (size_t)ks : (size_t)kvw;
        }
        tf_cp_wait_all_but_one();
        __syncthreads();
        TfKeyBlock b[R];
        if (together) {
            if (any) tf_key_blocks<R>(qs, kb[0], stride[0], from, valid, lane, hd, scale, softcap, b);
        } else {
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int one[1] = {valid[i]}, one_from[1] = {from[i]};
                TfKeyBlock bi[1];
                if (one[0] > 0)
                    tf_key_blocks<1>(qs + i * hd, kb[i], stride[i], one_from, one, lane, hd, scale, softcap, bi);
                b[i] = bi[0];
            }
        }
        __syncthreads();
        stage_block(K0, staged_kv, b0 + TF_KEY_BLOCK);
        tf_cp_wait_all_but_one();
        __syncthreads();
        float o[R][NT];
        if (together) {
            if (any) tf_key_block_values<R, NT>(b, vb[0], stride[0], valid, lane, hd, o);
        } else {
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int one[1] = {valid[i]};
                const TfKeyBlock bi[1] = {b[i]};
                float oi[1][NT];
                if (one[0] > 0) tf_key_block_values<1, NT>(bi, vb[i], stride[i], one, lane, hd, oi);
#pragma unroll
                for (int t = 0; t < NT; t++) o[i][t] = oi[0][t];
            }
        }
#pragma unroll
        for (int i = 0; i < R; i++)
            if (valid[i] > 0) tf_fold(f[i], b[i].max, b[i].sum, o[i]);
        __syncthreads();
        stage_block(V0, staged_v, b0 + TF_KEY_BLOCK);
    }
#pragma unroll
    for (int i = 0; i < R; i++)
        if (live[i]) tf_softmax_store(f[i], out, out16, r0 + first + i, h, heads, lane, hd);
}

// `attention` for head dimensions up to 256, `attention_128` up to 128
// (half the registers for value sums).
#define TF_ATTENTION(NAME, NT)                                                                           \
    extern "C" __global__ void __launch_bounds__(512)                                                    \
        NAME(const float* __restrict__ q, int heads, int kv_heads, int hd, float scale,                  \
             const long long* row_pos, const long long* row_seq, const unsigned long long* k_base,       \
             const unsigned long long* v_base, const long long* cap, int layer, float* out,              \
             uint32_t* out16, int M, int rows, int hb, int stage, int window, float softcap) {           \
        tf_after_prior();                                                                                \
        tf_attention<NT>(q, heads, kv_heads, hd, scale, row_pos, row_seq, k_base, v_base, cap, layer, out, \
                         out16, M, rows, hb, stage, window, softcap);                                    \
    }
TF_ATTENTION(attention, TF_MAX_HD / 32)
TF_ATTENTION(attention_128, 4)

// Few rows: a block per (row, head), its warps take key blocks w, w + W,
// ... a round of W at a time and leave their partials in shared memory;
// warp 0 folds each round's in block order. The same partials and the same
// fold as `attention`, spread over more warps. Dynamic shared memory:
// (hd + W * (hd + 2)) floats. `attention_split` serves head dimensions up
// to 256, `attention_split_128` up to 128.
template <int NT>
__device__ __forceinline__ void tf_attention_split(const float* __restrict__ q, int heads, int kv_heads, int hd,
                                                   float scale, const long long* row_pos, const long long* row_seq,
                                                   const unsigned long long* k_base,
                                                   const unsigned long long* v_base, const long long* cap,
                                                   int layer, float* out, uint32_t* out16, int window,
                                                   float softcap) {
    extern __shared__ float4 shared4[];
    float* qs = reinterpret_cast<float*>(shared4);
    float* parts = qs + hd;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int r = blockIdx.x, h = blockIdx.y, kvh = h / (heads / kv_heads), kvw = kv_heads * hd;
    const long long sq = row_seq[r], n = row_pos[r] + 1;
    const size_t off = (size_t)layer * cap[sq] * kvw + (size_t)kvh * hd;
    const __half* K = reinterpret_cast<const __half*>(k_base[sq]) + off;
    const __half* V = reinterpret_cast<const __half*>(v_base[sq]) + off;
    const float* qr = q + (size_t)r * heads * hd + (size_t)h * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qr[i];
    __syncthreads();

    TfSoftmax<NT> f;
    tf_softmax_start(f);
    // Blocks from the first the window reaches, in place from position 0.
    const long long lo = tf_first_key(n - 1, window), first = lo / TF_KEY_BLOCK;
    const long long blocks = (n + TF_KEY_BLOCK - 1) / TF_KEY_BLOCK;
    for (long long g0 = first; g0 < blocks; g0 += warps) {
        if (g0 + warp < blocks) {
            const long long b0 = (g0 + warp) * TF_KEY_BLOCK;
            const int valid = (int)min((long long)TF_KEY_BLOCK, n - b0);
            const int valids[1] = {valid}, froms[1] = {(int)max(0LL, lo - b0)};
            TfKeyBlock b[1];
            tf_key_blocks<1>(qs, K + (size_t)b0 * kvw, kvw, froms, valids, lane, hd, scale, softcap, b);
            float o[1][NT];
            tf_key_block_values<1, NT, 64 / NT>(b, V + (size_t)b0 * kvw, kvw, valids, lane, hd, o);
            float* part = parts + warp * (hd + 2);
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (tf_dim(lane, t) < hd) part[tf_dim(lane, t)] = o[0][t];
            if (lane == 0) {
                part[hd] = b[0].max;
                part[hd + 1] = b[0].sum;
            }
        }
        __syncthreads();
        if (warp == 0) {
            for (int w = 0; w < warps && g0 + w < blocks; w++) {
                const float* part = parts + w * (hd + 2);
                float o[NT];
#pragma unroll
                for (int t = 0; t < NT; t++) o[t] = tf_dim(lane, t) < hd ? part[tf_dim(lane, t)] : 0.f;
                tf_fold(f, part[hd], part[hd + 1], o);
            }
        }
        __syncthreads();
    }
    if (warp == 0) tf_softmax_store(f, out, out16, r, h, heads, lane, hd);
}

#define TF_ATTENTION_SPLIT(NAME, NT)                                                                       \
    extern "C" __global__ void __launch_bounds__(512)                                                      \
        NAME(const float* __restrict__ q, int heads, int kv_heads, int hd, float scale,                    \
             const long long* row_pos, const long long* row_seq, const unsigned long long* k_base,         \
             const unsigned long long* v_base, const long long* cap, int layer, float* out,                \
             uint32_t* out16, int window, float softcap) {                                                 \
        tf_after_prior();                                                                                  \
        tf_attention_split<NT>(q, heads, kv_heads, hd, scale, row_pos, row_seq, k_base, v_base, cap, layer, \
                               out, out16, window, softcap);                                               \
    }
TF_ATTENTION_SPLIT(attention_split, TF_MAX_HD / 32)
TF_ATTENTION_SPLIT(attention_split_128, 4)

// act[r, e] = f(gu[r, e]) * gu[r, ff + e], where gu holds gate | up and f
// is SiLU, or GELU (tanh form) where `gelu` is not 0. And the same in f16
// to `act16` (tf_store_h16) unless it is null, which needs ff a multiple
// of 32 (so a row's fours sit in four lanes of a warp).
extern "C" __global__ void gated_mul(const float* gu, float* act, uint32_t* act16, int M, int ff, int gelu) {
    tf_after_prior();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool in = i < (size_t)M * ff;
    const size_t r = i / ff, e = i % ff;
    float a = 0.f;
    if (in) {
        const float g = gu[r * 2 * ff + e], u = gu[r * 2 * ff + ff + e];
        a = gelu ? tf_gelu_tanh_mul(g, u) : tf_silu_mul(g, u);
        act[i] = a;
    }
    if (act16) {
        const int base = threadIdx.x & 28;
        const float4 v = make_float4(__shfl_sync(0xffffffffu, a, base), __shfl_sync(0xffffffffu, a, base + 1),
                                     __shfl_sync(0xffffffffu, a, base + 2), __shfl_sync(0xffffffffu, a, base + 3));
        if (in && (threadIdx.x & 3) == 0) tf_store_h16(act16 + r * (ff / 2), (int)(e / 4), v);
    }
}

// x[r] += rmsnorm(y[r]) * w: the norm after attention or after the MLP
// (Gemma) before the residual add. One block per row; the squares sum
// element by element at a stride of the block, then a fixed tree.
extern "C" __global__ void __launch_bounds__(TF_NORM_THREADS)
    rmsnorm_add(float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ w, int H, float eps) {
    __shared__ float sh[TF_NORM_THREADS / 32];
    tf_after_prior();
    const float* yr = y + (size_t)blockIdx.x * H;
    float* xr = x + (size_t)blockIdx.x * H;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += TF_NORM_THREADS) ss = __fmaf_rn(yr[i], yr[i], ss);
    ss = tf_block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(__fadd_rn(ss / (float)H, eps));
    for (int i = threadIdx.x; i < H; i += TF_NORM_THREADS)
        xr[i] = __fadd_rn(xr[i], __fmul_rn(__fmul_rn(yr[i], scale), w[i]));
}

// v[i] = cap * tanh(v[i] / cap) for the first n values: final logits
// soft-capped (Gemma 2).
extern "C" __global__ void softcap(float* v, long long n, float cap) {
    tf_after_prior();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = __fmul_rn(cap, tanhf(__fdiv_rn(v[i], cap)));
}
