// Causal attention on the tensor cores, for head dimensions that are a
// multiple of 16 up to 128 (`attention_tc_<HD>`; other widths take the f32
// kernels of ops.cu).
//
// Keys come in blocks of 64 counted from position 0, as in ops.cu. A warp
// takes a tile of 16 slots, each a (row, query head) pair of one kv head,
// and for one key block computes every slot's partial softmax:
//   S = Q K^T      q rounded to f16, k as the cache holds it (f16, rounded
//                  to nearest by qkv_post), f32 sums, one mma chain over
//                  the head dimensions in order, from zero;
//   s = S * scale, or -inf for keys past the slot's position;
//   m = max of s, p = exp(s - m), l = sum of p (fixed order: a thread's
//   keys in order, then the quad's xor tree);
//   O = P V        p rounded to f16, v as cached (f16), one mma chain over
//                  the block's keys in order, from zero.
// An mma computes each element from its own row of A, column of B and
// accumulator alone, so a slot's partial depends on its query and that key
// block only: not on the tile's other slots, nor on which warp computes it.
// Partials are folded in block order as tf_fold does (ops.cu), so nothing
// depends on how rows are grouped, chunked or batched.
//
// A block is W warps (blockDim) on one tile: rows r0 .. r0 + rw - 1 by
// query heads h0 .. h0 + hb - 1 (hb divides the heads per kv head, rw * hb
// <= 16; slot i is row r0 + i / hb, head h0 + i % hb). Its warps take key
// blocks w, w + W, ...: each stages its block's keys, then its values, in
// shared memory with asynchronous copies, and leaves its partial there;
// then every warp folds the round's partials in block order for the
// output columns it keeps (8-wide column tiles w, w + W, ...), each warp
// folding the maxima and sums alike. Rows of one tile that belong to
// several sequences take one pass per sequence.
//
// Split form (few rows over long contexts, where one block per tile would
// leave most multiprocessors idle): `gridDim.z` one-warp blocks share a tile's key
// blocks (block z takes rounds z, z + gridDim.z, ...), each warp writes its
// partial to `part` in global memory, and `attention_fold_<HD>` then folds
// every slot's partials in block order with the same step. The partials
// and the order are those of the fused form, so the output has the same
// bits whichever form ran.
//
// Dynamic shared memory: per warp, one staged key block (64 rows of HD + 8
// halves) and one partial (16 rows of HD + 8 floats, then 16 maxima and
// 16 sums).
#include "common.cuh"

#define TF_TC_KEYS 64
// Elements after each staged row (halves) and each partial row (floats).
// Staged rows are then HD / 2 + 4 words apart, 4 mod 8 for HD a multiple
// of 16: the key fragment loads (lanes g * row + t, 32-bit) and the value
// gathers (rows 2t, columns g, 16-bit) of a warp fall in distinct banks,
// and rows stay 16-byte aligned for the copies. For the partials' 8-byte
// loads (half warp) HD + 8 floats keep them apart too.
#define TF_TC_PAD 8
// Warps of a block at least: bounds the output column tiles a warp keeps.
#define TF_TC_MIN_WARPS 4

template <int HD>
__host__ __device__ constexpr int tf_tc_part_floats() {
    return 16 * (HD + TF_TC_PAD) + 32;
}

// One step of the fold in block order: the running maximum `m` and sum
// `l` take a block's maximum `mb` and sum `lb`; returns the factors that
// scale the running value sums (`a`) and the block's (`c`).
__device__ __forceinline__ float2 tf_tc_fold_step(float& m, float& l, float mb, float lb) {
    const float mn = fmaxf(m, mb);
    const float a = m == -INFINITY ? 0.f : expf(__fsub_rn(m, mn));
    const float c = expf(__fsub_rn(mb, mn));
    l = __fmaf_rn(lb, c, __fmul_rn(l, a));
    m = mn;
    return make_float2(a, c);
}
__device__ __forceinline__ float tf_tc_fold_value(float o, float v, float2 ac) {
    return __fmaf_rn(v, ac.y, __fmul_rn(o, ac.x));
}

// Starts copying `keys` rows of HD halves (`stride` halves apart, from
// `src`) into rows of HD + 8 halves at `stage`; rows past `keys` are
// zeroed so that masked keys multiply as zeros. `tf_tc_staged` waits for
// them and for the warp.
template <int HD>
__device__ __forceinline__ void tf_tc_stage_start(__half* stage, const __half* src, size_t stride, int keys,
                                                  int lane) {
    constexpr int Q8 = HD / 8, KS = HD + TF_TC_PAD;
    const uint32_t to = tf_shared_addr(stage);
#pragma unroll 8
    for (int e = lane; e < TF_TC_KEYS * Q8; e += 32) {
        const int j = e / Q8, d = 8 * (e % Q8);
        if (j < keys)
            tf_cp16_to(to + 2 * (j * KS + d), src + (size_t)j * stride + d);
        else
            *reinterpret_cast<uint4*>(stage + j * KS + d) = make_uint4(0, 0, 0, 0);
    }
    tf_cp_commit();
}
__device__ __forceinline__ void tf_tc_staged() {
    tf_cp_wait<0>();
    __syncwarp();
}

template <int HD>
__device__ __forceinline__ void tf_attention_tc(const float* __restrict__ q, int heads, int kv_heads, float scale,
                                                const long long* row_pos, const long long* row_seq,
                                                const unsigned long long* k_base, const unsigned long long* v_base,
                                                const long long* cap, int layer, float* out, uint32_t* out16, int M,
                                                int rw, int hb, float* part, int part_blocks) {
    constexpr int KSTEPS = HD / 16, NT = HD / 8, KS = HD + TF_TC_PAD;
    constexpr int MINE = (NT + TF_TC_MIN_WARPS - 1) / TF_TC_MIN_WARPS;
    extern __shared__ float4 smem4[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, W = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    __half* stage = reinterpret_cast<__half*>(smem4) + warp * TF_TC_KEYS * KS;
    // W * 64 * KS halves: a multiple of 16 bytes.
    float* parts = reinterpret_cast<float*>(reinterpret_cast<__half*>(smem4) + W * TF_TC_KEYS * KS);
    float* mine = parts + warp * tf_tc_part_floats<HD>();
    const int group = heads / kv_heads, kvw = kv_heads * HD;
    const int h0 = blockIdx.y * hb, kvh = h0 / group, r0 = blockIdx.x * rw;

    int done = 0;  // bit i: row r0 + i is handled (or past the end)
    for (int i = 0; i < rw; i++)
        if (r0 + i >= M) done |= 1 << i;
    while (done != (1 << rw) - 1) {
        // This pass: the rows left of the first one's sequence.
        const long long sq = row_seq[r0 + __ffs(~done) - 1];
        int pass = 0;
        long long most = 0;
        for (int i = 0; i < rw; i++)
            if (!((done >> i) & 1) && row_seq[r0 + i] == sq) {
                pass |= 1 << i;
                most = max(most, row_pos[r0 + i] + 1);
            }
        done |= pass;

        // This thread's slots g and g + 8: keys each sees, where its query
        // and output live.
        long long n[2];
        size_t at[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int s = g + 8 * e, ri = s / hb;
            const bool live = s < rw * hb && ((pass >> ri) & 1);
            n[e] = live ? row_pos[r0 + ri] + 1 : 0;
            at[e] = ((size_t)(r0 + ri) * heads + h0 + s % hb) * HD;
        }
        uint32_t qa[KSTEPS][4];
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int e = c & 1, d = 16 * kk + 8 * (c >> 1) + 2 * t;
                const float2 v = n[e] ? *reinterpret_cast<const float2*>(q + at[e] + d) : make_float2(0.f, 0.f);
                qa[kk][c] = tf_h2_of(v.x, v.y);
            }
        const size_t off = (size_t)layer * cap[sq] * kvw + (size_t)kvh * HD;
        const __half* K = reinterpret_cast<const __half*>(k_base[sq]) + off;
        const __half* V = reinterpret_cast<const __half*>(v_base[sq]) + off;

        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
        float o[MINE][4] = {};
        const long long blocks = (most + TF_TC_KEYS - 1) / TF_TC_KEYS;
        // Fused: this block takes every round. Split: rounds blockIdx.z,
        // blockIdx.z + gridDim.z, ...
        const long long stride = (long long)W * gridDim.z;
        for (long long base = (long long)blockIdx.z * W; base < blocks; base += stride) {
            if (base + warp < blocks) {
                const long long b0 = (base + warp) * TF_TC_KEYS;
                const int keys = (int)min((long long)TF_TC_KEYS, most - b0);
                int valid[2];
#pragma unroll
                for (int e = 0; e < 2; e++) valid[e] = (int)max(0LL, min((long long)TF_TC_KEYS, n[e] - b0));

                tf_tc_stage_start<HD>(stage, K + (size_t)b0 * kvw, kvw, keys, lane);
                tf_tc_staged();
                float s[8][4] = {};
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int kk = 0; kk < KSTEPS; kk++) {
                        // Key 8j + g, dimensions 16kk + 2t, +1 and +8, +9:
                        // two cached pairs, already in B's order.
                        const __half* kr = stage + (8 * j + g) * KS + 16 * kk + 2 * t;
                        const uint32_t b[2] = {*reinterpret_cast<const uint32_t*>(kr),
                                               *reinterpret_cast<const uint32_t*>(kr + 8)};
                        tf_mma(s[j], qa[kk], b);
                    }
                // The keys are in registers now: the values' copies start
                // over them and land while the weights are computed.
                __syncwarp();
                tf_tc_stage_start<HD>(stage, V + (size_t)b0 * kvw, kvw, keys, lane);
                // Scores, the block's max and weights, slot by slot.
                float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const int e = c >> 1, key = 8 * j + 2 * t + (c & 1);
                        s[j][c] = key < valid[e] ? __fmul_rn(s[j][c], scale) : -INFINITY;
                        mx[e] = fmaxf(mx[e], s[j][c]);
                    }
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
                    mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
                }
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const int e = c >> 1, key = 8 * j + 2 * t + (c & 1);
                        s[j][c] = key < valid[e] ? expf(__fsub_rn(s[j][c], mx[e])) : 0.f;
                        sum[e] = __fadd_rn(sum[e], s[j][c]);
                    }
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    sum[e] = __fadd_rn(sum[e], __shfl_xor_sync(0xffffffffu, sum[e], 1));
                    sum[e] = __fadd_rn(sum[e], __shfl_xor_sync(0xffffffffu, sum[e], 2));
                }
                // The weights as A fragments: keys 16kk .. 16kk + 15 are
                // score tiles 2kk and 2kk + 1.
                uint32_t pa[4][4];
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    pa[kk][0] = tf_h2_of(s[2 * kk][0], s[2 * kk][1]);
                    pa[kk][1] = tf_h2_of(s[2 * kk][2], s[2 * kk][3]);
                    pa[kk][2] = tf_h2_of(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    pa[kk][3] = tf_h2_of(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                }
                tf_tc_staged();
                // Where slot e's partial goes in the split form: its own
                // row of HD values, then the maximum and the sum (none for
                // a slot with no key in this block).
                float* to[2] = {nullptr, nullptr};
                if (part) {
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        if (n[e] > b0) to[e] = part + ((at[e] / HD) * part_blocks + (size_t)(base + warp)) * (HD + 2);
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    float d[4] = {};
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) {
                        // Dimension 8nt + g of keys 16kk + 2t, +1 and +8, +9:
                        // each pair from two rows, the lower key in the low half.
                        const unsigned short* vc =
                            reinterpret_cast<const unsigned short*>(stage) + (16 * kk + 2 * t) * KS + 8 * nt + g;
                        const uint32_t b[2] = {(uint32_t)vc[0] | ((uint32_t)vc[KS] << 16),
                                               (uint32_t)vc[8 * KS] | ((uint32_t)vc[9 * KS] << 16)};
                        tf_mma(d, pa[kk], b);
                    }
                    if (part) {
                        if (to[0]) *reinterpret_cast<float2*>(to[0] + 8 * nt + 2 * t) = make_float2(d[0], d[1]);
                        if (to[1]) *reinterpret_cast<float2*>(to[1] + 8 * nt + 2 * t) = make_float2(d[2], d[3]);
                    } else {
                        *reinterpret_cast<float2*>(mine + g * KS + 8 * nt + 2 * t) = make_float2(d[0], d[1]);
                        *reinterpret_cast<float2*>(mine + (g + 8) * KS + 8 * nt + 2 * t) = make_float2(d[2], d[3]);
                    }
                }
                if (t == 0) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        if (part) {
                            if (to[e]) {
                                to[e][HD] = mx[e];
                                to[e][HD + 1] = sum[e];
                            }
                        } else {
                            mine[16 * KS + g + 8 * e] = mx[e];
                            mine[16 * KS + 16 + g + 8 * e] = sum[e];
                        }
                    }
                }
                __syncwarp();  // every lane is done with the values
            }
            if (part) continue;  // attention_fold folds the partials
            __syncthreads();  // the round's partials are in
            for (int w = 0; w < W && base + w < blocks; w++) {
                const float* pw = parts + w * tf_tc_part_floats<HD>();
                const long long b0 = (base + w) * TF_TC_KEYS;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (n[e] <= b0) continue;  // no key of this block: nothing to fold
                    const float2 ac =
                        tf_tc_fold_step(m[e], l[e], pw[16 * KS + g + 8 * e], pw[16 * KS + 16 + g + 8 * e]);
#pragma unroll
                    for (int i = 0; i < MINE; i++) {
                        const int nt = warp + i * W;
                        if (nt < NT) {
                            const float2 v = *reinterpret_cast<const float2*>(pw + (g + 8 * e) * KS + 8 * nt + 2 * t);
                            o[i][2 * e] = tf_tc_fold_value(o[i][2 * e], v.x, ac);
                            o[i][2 * e + 1] = tf_tc_fold_value(o[i][2 * e + 1], v.y, ac);
                        }
                    }
                }
            }
            __syncthreads();  // the partials are read before the next round's land
        }
        if (part) continue;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            if (!n[e]) continue;
            const float inv = 1.0f / l[e];
            const size_t row = at[e] / ((size_t)heads * HD);
            const int col = (int)(at[e] % ((size_t)heads * HD));
#pragma unroll
            for (int i = 0; i < MINE; i++) {
                const int nt = warp + i * W;
                if (nt < NT) {
#pragma unroll
                    for (int k = 0; k < 2; k++) {
                        const float v = __fmul_rn(o[i][2 * e + k], inv);
                        const int c = col + 8 * nt + 2 * t + k;
                        out[row * heads * HD + c] = v;
                        if (out16) tf_store_h16_one(out16 + row * (heads * HD / 2), c, v);
                    }
                }
            }
        }
    }
}

// One slot's output from its partials in the split form: the fold of
// `attention_tc` in the same block order, then the same division. A block
// is one warp on (row, head, 32 output columns) of the grid; lane i keeps
// column 32 * blockIdx.z + i (none past HD).
//
// The fold's steps take the running maximum, which is a prefix maximum of
// the blocks' maxima: exact, so the warp finds it for 32 blocks at once
// (a shuffle scan, lane i holding block i of the chunk), and each block's
// two factors with it, each from the same operands as in
// `tf_tc_fold_step`. What stays serial per column is one multiply and one
// multiply-add a block, over values loaded all at once. No block-wide
// barrier: a warp folds alone, so there are blocks enough to spread the
// partials' loads over the multiprocessors.
template <int HD>
__device__ __forceinline__ void tf_attention_fold(const float* __restrict__ part, int part_blocks, int heads,
                                                  const long long* row_pos, float* out, uint32_t* out16) {
    const int row = blockIdx.x, head = blockIdx.y, lane = threadIdx.x, d = 32 * blockIdx.z + lane;
    const bool column = d < HD;
    const int blocks = (int)((row_pos[row] + TF_TC_KEYS) / TF_TC_KEYS);
    const float* p = part + ((size_t)row * heads + head) * part_blocks * (HD + 2);
    float m = -INFINITY, l = 0.f, o = 0.f;
    for (int c0 = 0; c0 < blocks; c0 += 32) {
        const int n = min(32, blocks - c0);
        float v[32];
#pragma unroll
        for (int i = 0; i < 32; i++)
            if (i < n && column) v[i] = p[(size_t)(c0 + i) * (HD + 2) + d];
        const float* pb = p + (size_t)(c0 + lane) * (HD + 2);
        const float block_max = lane < n ? pb[HD] : -INFINITY;
        const float block_sum = lane < n ? pb[HD + 1] : 0.f;
        // Inclusive prefix maxima of the chunk (exact in any order).
        float upto = block_max;
#pragma unroll
        for (int step = 1; step < 32; step *= 2) {
            const float other = __shfl_up_sync(0xffffffffu, upto, step);
            if (lane >= step) upto = fmaxf(upto, other);
        }
        const float earlier = __shfl_up_sync(0xffffffffu, upto, 1);
        const float before = lane == 0 ? m : fmaxf(m, earlier);
        const float after = fmaxf(m, upto);
        const float a = before == -INFINITY ? 0.f : expf(__fsub_rn(before, after));
        const float c = expf(__fsub_rn(block_max, after));
#pragma unroll
        for (int i = 0; i < 32; i++) {
            if (i < n) {
                const float2 ac = make_float2(__shfl_sync(0xffffffffu, a, i), __shfl_sync(0xffffffffu, c, i));
                l = __fmaf_rn(__shfl_sync(0xffffffffu, block_sum, i), ac.y, __fmul_rn(l, ac.x));
                if (column) o = tf_tc_fold_value(o, v[i], ac);
            }
        }
        m = fmaxf(m, __shfl_sync(0xffffffffu, upto, n - 1));
    }
    if (!column) return;
    const float inv = 1.0f / l;
    const float val = __fmul_rn(o, inv);
    const int c = head * HD + d;
    out[(size_t)row * heads * HD + c] = val;
    if (out16) tf_store_h16_one(out16 + (size_t)row * (heads * HD / 2), c, val);
}

// The arguments of ops.cu's `attention` (`hd` is the kernel's own HD),
// then the tile's shape and, for the split form, where the partials go
// (null: fused) and the key blocks a slot's partials have room for.
#define TF_ATTENTION_TC(HD)                                                                                    \
    extern "C" __global__ void __launch_bounds__(256)                                                          \
        attention_tc_##HD(const float* __restrict__ q, int heads, int kv_heads, int hd, float scale,           \
                          const long long* row_pos, const long long* row_seq, const unsigned long long* k_base, \
                          const unsigned long long* v_base, const long long* cap, int layer, float* out,        \
                          uint32_t* out16, int M, int rw, int hb, float* part, int part_blocks) {              \
        tf_after_prior();                                                                                      \
        tf_attention_tc<HD>(q, heads, kv_heads, scale, row_pos, row_seq, k_base, v_base, cap, layer, out,     \
                            out16, M, rw, hb, part, part_blocks);                                              \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(32)                                                           \
        attention_fold_##HD(const float* __restrict__ part, int part_blocks, int heads,                        \
                            const long long* row_pos, float* out, uint32_t* out16) {                           \
        tf_after_prior();                                                                                      \
        tf_attention_fold<HD>(part, part_blocks, heads, row_pos, out, out16);                                 \
    }
TF_ATTENTION_TC(16)
TF_ATTENTION_TC(32)
TF_ATTENTION_TC(64)
TF_ATTENTION_TC(96)
TF_ATTENTION_TC(128)
