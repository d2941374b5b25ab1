// The sampling rule of `crates/tensorfold-sampling` on the device: one block
// of TF_LANES threads per row picks that row's token with the same bits as
// the CPU. `tf_exp` and `tf_ln` mirror `float.rs` operation for operation
// (explicit `fma`, no contraction: the file is built with --fmad=false);
// thread `c` is lane `c` of `lanes.rs`, adding its values in increasing id,
// and the lanes fold by halves as there. Keys, maxima and the Gumbel-max
// are exact comparisons, so their reduction order does not matter.
//
// The nucleus is found without sorting: the rule's pick is the best score
// over the nucleus, which is a prefix of the key order. The best score over
// a set S holding the nucleus is the pick when it lies in the nucleus (one
// fixed-order mass over the keys above it); otherwise every nucleus token
// has a larger key, so S shrinks to the keys above it and the search goes
// on. The top token is always in the nucleus, so the search ends.
#include <math.h>
#include <stdint.h>

#define TF_LANES 1024

// 1/k! for k = 0..=13 and 1/(2i+1) for i = 0..=11, as in float.rs.
__constant__ uint64_t TF_EXP_TAYLOR[14] = {
    0x3ff0000000000000ull, 0x3ff0000000000000ull, 0x3fe0000000000000ull, 0x3fc5555555555555ull,
    0x3fa5555555555555ull, 0x3f81111111111111ull, 0x3f56c16c16c16c17ull, 0x3f2a01a01a01a01aull,
    0x3efa01a01a01a01aull, 0x3ec71de3a556c734ull, 0x3e927e4fb7789f5cull, 0x3e5ae64567f544e4ull,
    0x3e21eed8eff8d898ull, 0x3de6124613a86d09ull,
};
__constant__ uint64_t TF_ATANH_SERIES[12] = {
    0x3ff0000000000000ull, 0x3fd5555555555555ull, 0x3fc999999999999aull, 0x3fc2492492492492ull,
    0x3fbc71c71c71c71cull, 0x3fb745d1745d1746ull, 0x3fb3b13b13b13b14ull, 0x3fb1111111111111ull,
    0x3fae1e1e1e1e1e1eull, 0x3faaf286bca1af28ull, 0x3fa8618618618618ull, 0x3fa642c8590b2164ull,
};

__device__ __forceinline__ double tf_bits(uint64_t b) { return __longlong_as_double((long long)b); }

// float.rs `exp`.
__device__ double tf_exp(double x) {
    if (isnan(x) || x <= -708.0) return 0.0;
    if (x > 709.0) return INFINITY;
    const double log2_e = tf_bits(0x3ff71547652b82feull);
    const double ln2_hi = tf_bits(0x3fe62e42fee00000ull);
    const double ln2_lo = tf_bits(0x3dea39ef35793c76ull);
    const double n = rint(x * log2_e);
    double r = fma(-n, ln2_hi, x);
    r = fma(-n, ln2_lo, r);
    double p = tf_bits(TF_EXP_TAYLOR[13]);
    for (int k = 12; k >= 0; k--) p = fma(p, r, tf_bits(TF_EXP_TAYLOR[k]));
    return p * tf_bits((uint64_t)((long long)n + 1023) << 52);
}

// float.rs `ln`.
__device__ double tf_ln(double y) {
    if (isnan(y) || y < 0.0) return NAN;
    if (y == 0.0) return -INFINITY;
    if (isinf(y)) return y;
    uint64_t bits = (uint64_t)__double_as_longlong(y);
    long long e = -1023;
    if (y < 2.2250738585072014e-308) {
        bits = (uint64_t)__double_as_longlong(y * tf_bits(0x4350000000000000ull));
        e -= 54;
    }
    e += (long long)(bits >> 52);
    double m = tf_bits((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    if (m > tf_bits(0x3ff6a09e667f3bcdull)) {
        m *= 0.5;
        e += 1;
    }
    const double f = (m - 1.0) / (m + 1.0);
    const double s = f * f;
    double p = tf_bits(TF_ATANH_SERIES[11]);
    for (int k = 10; k >= 0; k--) p = fma(p, s, tf_bits(TF_ATANH_SERIES[k]));
    const double ln_m = (2.0 * f) * p;
    const double ed = (double)e;
    return fma(ed, tf_bits(0x3fe62e42fee00000ull), fma(ed, tf_bits(0x3dea39ef35793c76ull), ln_m));
}

__device__ __forceinline__ uint64_t tf_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// lib.rs `gumbel`: -ln(-ln u), u keyed by (seed, position, token).
__device__ double tf_gumbel(uint64_t seed, uint64_t position, uint32_t token) {
    const uint64_t h = tf_mix(tf_mix(tf_mix(seed) ^ position) ^ (uint64_t)token);
    const double u = ((double)(h >> 12) + 0.5) * tf_bits(0x3cb0000000000000ull);
    return -tf_ln(-tf_ln(u));
}

// NaN counts as -inf.
__device__ __forceinline__ float tf_clean(float x) { return isnan(x) ? -INFINITY : x; }

// lib.rs `key`: the logit's total order, then the lower id.
__device__ __forceinline__ uint64_t tf_key(float logit, uint32_t id) {
    const uint32_t b = __float_as_uint(tf_clean(logit));
    const uint32_t order = (b >> 31) ? ~b : (b | 0x80000000u);
    return ((uint64_t)order << 32) | (uint64_t)(0xFFFFFFFFu - id);
}

__device__ uint64_t tf_block_max(uint64_t v, uint64_t* shared) {
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t w = __shfl_xor_sync(0xFFFFFFFFu, v, o);
        v = w > v ? w : v;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
    __syncthreads();
    v = shared[threadIdx.x & 31];
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t w = __shfl_xor_sync(0xFFFFFFFFu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// lanes.rs: each thread's lane sum, folded by halves. Every thread gets it.
__device__ double tf_fold(double lane, double* lanes) {
    __syncthreads();
    lanes[threadIdx.x] = lane;
    __syncthreads();
    for (int h = TF_LANES / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) lanes[threadIdx.x] = lanes[threadIdx.x] + lanes[threadIdx.x + h];
        __syncthreads();
    }
    return lanes[0];
}

// Whether (score, id) comes before (best, best_id): the larger score, then
// the lower id.
__device__ __forceinline__ bool tf_beats(double score, uint32_t id, double best, uint32_t best_id) {
    return score > best || (score == best && id < best_id);
}

// The k-th largest key of the row (1 <= k < vocab): keys are distinct, so
// an MSB-first radix select over 8-bit digits with exact counts finds it.
__device__ uint64_t tf_kth_key(const float* row, int vocab, uint64_t k, uint32_t* hist,
                               uint64_t* shared) {
    uint64_t prefix = 0, mask = 0, want = k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        __syncthreads();
        if (threadIdx.x < 256) hist[threadIdx.x] = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < vocab; j += TF_LANES) {
            const uint64_t key = tf_key(row[j], (uint32_t)j);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int d = 255;
            for (; d > 0 && hist[d] < want; d--) want -= hist[d];
            shared[0] = (uint64_t)d;
            shared[1] = want;
        }
        __syncthreads();
        prefix |= shared[0] << shift;
        mask |= 0xFFull << shift;
        want = shared[1];
    }
    return prefix;
}

// One row's draw, as the host lays it out (`sampling.rs`): six words.
struct TfDraw {
    uint64_t row;       // the logits row
    uint64_t position;  // the absolute position the pick is for
    uint64_t seed;
    uint64_t top_k;     // ~0: none
    uint64_t t_top_p;   // temperature bits | top_p bits << 32 (f32)
    uint64_t min_p;     // min_p bits (f32)
};

// Picks `out[b]` for draw `b` from rows of `vocab` logits.
extern "C" __global__ void __launch_bounds__(TF_LANES)
    sample_rows(const float* __restrict__ logits, int vocab, const TfDraw* __restrict__ draws,
                uint32_t* __restrict__ out) {
    __shared__ double lanes[TF_LANES];
    __shared__ uint64_t shared[32];
    __shared__ uint32_t hist[256];
    __shared__ double best_scores[32];
    __shared__ uint32_t best_ids[32];
    const TfDraw d = draws[blockIdx.x];
    const float* row = logits + d.row * (uint64_t)vocab;
    const float temperature = __uint_as_float((uint32_t)d.t_top_p);
    const float top_p = __uint_as_float((uint32_t)(d.t_top_p >> 32));
    const float min_p = __uint_as_float((uint32_t)d.min_p);
    const int c = threadIdx.x;

    uint64_t best_key = 0;
    for (int j = c; j < vocab; j += TF_LANES) {
        const uint64_t key = tf_key(row[j], (uint32_t)j);
        best_key = key > best_key ? key : best_key;
    }
    best_key = tf_block_max(best_key, shared);
    const uint32_t top = 0xFFFFFFFFu - (uint32_t)best_key;
    const float top_logit = tf_clean(row[top]);
    if (isnan(temperature) || temperature <= 0.0f || d.top_k == 1 || !isfinite(top_logit)) {
        if (c == 0) out[blockIdx.x] = top;
        return;
    }
    const double t = (double)temperature;
    const double peak = (double)top_logit / t;
    const uint64_t floor = d.top_k < (uint64_t)vocab
                               ? tf_kth_key(row, vocab, d.top_k > 1 ? d.top_k : 1, hist, shared)
                               : 0;
    const double min_w = (double)min_p;
    const bool nucleus = top_p < 1.0f;
    double target = 0.0;
    if (nucleus) {
        double lane = 0.0;
        for (int j = c; j < vocab; j += TF_LANES) {
            const double w = tf_exp((double)tf_clean(row[j]) / t - peak);
            if (tf_key(row[j], (uint32_t)j) >= floor && w >= min_w) lane = lane + w;
        }
        target = (double)top_p * tf_fold(lane, lanes);
    }

    // The search: S = kept tokens with keys above `above`.
    const double top_score = peak + tf_gumbel(d.seed, d.position, top);
    const double bound = 38.5;  // lib.rs GUMBEL_BOUND
    uint64_t above = 0;
    for (;;) {
        double best = top_score;
        uint32_t best_id = top;
        for (int j = c; j < vocab; j += TF_LANES) {
            const uint64_t key = tf_key(row[j], (uint32_t)j);
            if ((uint32_t)j == top || key <= above || key < floor) continue;
            const double s = (double)tf_clean(row[j]) / t;
            // A score that cannot reach the best so far (rounding is
            // monotone) needs no noise; a token under min-p is not kept
            // (every weight is at least 0, so a min-p of 0 keeps all).
            if (s + bound < best || (min_w > 0.0 && !(tf_exp(s - peak) >= min_w))) continue;
            const double score = s + tf_gumbel(d.seed, d.position, (uint32_t)j);
            if (tf_beats(score, (uint32_t)j, best, best_id)) {
                best = score;
                best_id = (uint32_t)j;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const double ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
            const uint32_t oi = __shfl_xor_sync(0xFFFFFFFFu, best_id, o);
            if (tf_beats(ob, oi, best, best_id)) {
                best = ob;
                best_id = oi;
            }
        }
        __syncthreads();
        if ((c & 31) == 0) {
            best_scores[c >> 5] = best;
            best_ids[c >> 5] = best_id;
        }
        __syncthreads();
        best = best_scores[c & 31];
        best_id = best_ids[c & 31];
        for (int o = 16; o > 0; o >>= 1) {
            const double ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
            const uint32_t oi = __shfl_xor_sync(0xFFFFFFFFu, best_id, o);
            if (tf_beats(ob, oi, best, best_id)) {
                best = ob;
                best_id = oi;
            }
        }
        if (!nucleus || best_id == top) {
            if (c == 0) out[blockIdx.x] = best_id;
            return;
        }
        // In the nucleus when the kept mass of larger keys is below target.
        const uint64_t cut = tf_key(row[best_id], best_id);
        double lane = 0.0;
        for (int j = c; j < vocab; j += TF_LANES) {
            if (tf_key(row[j], (uint32_t)j) <= cut) continue;
            const double w = tf_exp((double)tf_clean(row[j]) / t - peak);
            if (tf_key(row[j], (uint32_t)j) >= floor && w >= min_w) lane = lane + w;
        }
        if (tf_fold(lane, lanes) < target) {
            if (c == 0) out[blockIdx.x] = best_id;
            return;
        }
        above = cut;
    }
}
