// The steps of a routed mixture of experts around its experts' matmuls.
// The host routes each row (its router logits, softmax and top-k are the
// row's alone); each expert multiplies the rows routed to it, gathered
// into consecutive rows, through the row-invariant matmuls; each (row,
// slot) output is weighted, and a row's slots are summed in slot order.
// So a row's output does not depend on which rows share the call.
#include "common.cuh"

// dst[i] = src[rows[i]] (H floats a row), and the same in f16 to `dst16`
// (tf_store_h16) unless it is null, which needs H a multiple of 4. One
// block per gathered row.
extern "C" __global__ void gather_rows(const float* __restrict__ src, const long long* __restrict__ rows,
                                       float* __restrict__ dst, uint32_t* __restrict__ dst16, int H) {
    tf_after_prior();
    const int i = blockIdx.x;
    const float* s = src + (size_t)rows[i] * H;
    float* d = dst + (size_t)i * H;
    for (int e = threadIdx.x; e < H; e += blockDim.x) d[e] = s[e];
    if (dst16)
        for (int q = threadIdx.x; q < H / 4; q += blockDim.x)
            tf_store_h16(dst16 + (size_t)i * (H / 2), q, make_float4(s[4 * q], s[4 * q + 1], s[4 * q + 2], s[4 * q + 3]));
}

// out[slots[i]] = y[i] * weights[slots[i]]: an expert's output rows, each
// weighted and put in its (row, slot) place. One block per row of y.
extern "C" __global__ void scatter_weighted(const float* __restrict__ y, const long long* __restrict__ slots,
                                            const float* __restrict__ weights, float* __restrict__ out, int H) {
    tf_after_prior();
    const int i = blockIdx.x;
    const long long slot = slots[i];
    const float weight = weights[slot];
    const float* yr = y + (size_t)i * H;
    float* o = out + (size_t)slot * H;
    for (int e = threadIdx.x; e < H; e += blockDim.x) o[e] = __fmul_rn(yr[e], weight);
}

// x[r] += slot 0 + slot 1 + ... of row r (`used` slots of H, summed in
// slot order). One block per row.
extern "C" __global__ void add_slots(float* __restrict__ x, const float* __restrict__ slots, int used, int H) {
    tf_after_prior();
    const int r = blockIdx.x;
    const float* s = slots + (size_t)r * used * H;
    float* xr = x + (size_t)r * H;
    for (int e = threadIdx.x; e < H; e += blockDim.x) {
        float o = s[e];
        for (int k = 1; k < used; k++) o = __fadd_rn(o, s[(size_t)k * H + e]);
        xr[e] = __fadd_rn(xr[e], o);
    }
}
