// Row softmax for the standard-attention baseline: P = softmax(S) over the last axis.
//
// S and P are (rows, cols) in global memory, rows = batch * heads * seq_len_q, in the storage
// dtype (fp32 or fp16), with fp32 arithmetic. One block of THREADS threads per row: the row is
// read from global memory once into dynamic shared memory (cols fp32 values), reduced to its
// max and sum, and P written once, so S is read and P written exactly once, as hbmsim's
// standard program charges. A row of -inf (every key masked) gives a row of zeros, never NaN.
// Scaling and masking happen before, in their own elementwise kernels, as in eager PyTorch.

#include "portable.h"

// Block-wide reduction of one value per thread through `scratch` (THREADS floats).
template <int THREADS, bool MAX>
__device__ __forceinline__ float block_reduce(float x, float* scratch) {
    const int t = threadIdx.x;
    scratch[t] = x;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (t < stride) scratch[t] = MAX ? fmaxf(scratch[t], scratch[t + stride]) : scratch[t] + scratch[t + stride];
        __syncthreads();
    }
    const float result = scratch[0];
    __syncthreads();         // scratch is reused by the next reduction
    return result;
}

template <typename T, int THREADS>
__global__ void __launch_bounds__(THREADS) softmax_rows(GlobalIn<T> s, GlobalOut<T> p, int cols) {
    static_assert((THREADS & (THREADS - 1)) == 0, "THREADS must be a power of two");
    __shared__ float scratch[THREADS];
    DYNAMIC_SHARED(smem);
    float* row = reinterpret_cast<float*>(smem);   // this block's row, cols values
    const float NEG_INF = -__int_as_float(0x7f800000);
    const long long base = (long long)blockIdx.x * cols;

    float m = NEG_INF;
    for (int c = threadIdx.x; c < cols; c += THREADS) {     // coalesced; each thread keeps
        row[c] = to_float(s[base + c]);                      // to its own columns, so no
        m = fmaxf(m, row[c]);                                // barrier is needed on `row`
    }
    m = block_reduce<THREADS, true>(m, scratch);
    const float m_ref = m == NEG_INF ? 0.0f : m;             // all masked: exp(-inf) = 0

    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) {
        row[c] = expf(row[c] - m_ref);
        sum += row[c];
    }
    sum = block_reduce<THREADS, false>(sum, scratch);
    const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;

    for (int c = threadIdx.x; c < cols; c += THREADS) p[base + c] = convert<T>(row[c] * inv_sum);
}
