// Microbenchmarks for the hardware presets' achievable rates (kernels/microbench.py runs them).
//
// Each kernel runs one wave (every block resident at once), times itself with clock64() so that
// cycles / CUDA-event seconds gives the SM clock the unit really ran at, and writes a result
// nothing else reads, so that the compiler keeps the work.
//
// - mma_sync_loop: the tensor-core instruction FlashAttention-1/2 issue on sm80 and sm90,
//   mma.sync.aligned.m16n8k16 (fp16 inputs, fp32 accumulate): 2 * 16 * 8 * 16 = 4096 FLOPs per
//   warp instruction. CHAINS independent accumulators per warp hide the instruction's latency.
// - ex2_loop: the special-function unit's exp2 (ex2.approx.ftz.f32, what exp2f compiles to
//   with --use_fast_math, as FlashAttention's softmax uses it): one result per thread per call.

#define CHAINS 8

extern "C" __global__ void mma_sync_loop(float* out, long long* cycles, int iters) {
    // fp16 pairs in [0.5, 1): exponent 0x3800 with a mantissa from the thread index, so the
    // tensor cores see varied data (as in attention), and the accumulators stay finite.
    unsigned t = threadIdx.x * 2654435761u + blockIdx.x;
    unsigned h0 = 0x3800u | (t & 0x3ffu), h1 = 0x3800u | ((t >> 10) & 0x3ffu);
    unsigned a0 = h0 | (h1 << 16), a1 = h1 | (h0 << 16), a2 = a0 ^ 0x00010001u, a3 = a1 ^ 0x00020002u;
    unsigned b0 = a2, b1 = a3;
    float acc[CHAINS][4];
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) { acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f; }
    long long t0 = clock64();
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < CHAINS; ++j) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                "{%0,%1,%2,%3};\n"
                : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
    }
    long long t1 = clock64();
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) { s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3]; }
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) { cycles[blockIdx.x] = t1 - t0; }
}

extern "C" __global__ void ex2_loop(float* out, long long* cycles, int iters) {
    float x[CHAINS];
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) { x[j] = -0.001f * (threadIdx.x + 1) - 0.01f * j; }
    long long t0 = clock64();
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < CHAINS; ++j) {
            // x = 2^(-|x|): stays in (0, 1]; ptxas folds the -|.| into the MUFU operand.
            asm volatile("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(x[j]) : "f"(-fabsf(x[j])));
        }
    }
    long long t1 = clock64();
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) { s += x[j]; }
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) { cycles[blockIdx.x] = t1 - t0; }
}

// - l2_read_loop: the L2's rate for whole lines against single-sector requests. A warp reads
//   from an L2-resident buffer (a few MB, warmed by the untimed runs) through ld.global.cg
//   (__ldcg: cached at the L2, not in L1), CHAINS independent loads in flight a trip. With
//   spread = 0 its 32 loads are 32 consecutive 4-byte words: one 128-byte line, 4 sectors (the
//   coalesced case the preset's l2_bytes_per_s was measured with). With spread = 1 each lane
//   reads a word of a line of its own: 32 single-sector requests in 32 lines, what a transposing
//   copy's reads are (simulator/tensor.py: GATHER). Requested sectors / second against the
//   coalesced case's says whether a lone sector costs the L2 32 bytes of its bandwidth or more.
extern "C" __global__ void l2_read_loop(const unsigned* buf, float* out, long long* cycles, int lines, int iters,
                                        int spread) {
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    unsigned acc[CHAINS];
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) { acc[j] = 0u; }
    long long t0 = clock64();
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < CHAINS; ++j) {
            // the (i, j)-th chunk of 32 lines this warp visits, spread over the whole buffer
            const unsigned chunk = (unsigned)((warp + (i * CHAINS + j) * warps) % (lines >> 5));
            const unsigned idx = spread ? ((chunk * 32u + lane) * 32u + ((i * CHAINS + j) & 31))   // lane's own line
                                        : (chunk * 32u * 32u + ((i * CHAINS + j) & 31) * 32u + lane);   // one line
            acc[j] += __ldcg(buf + idx);
        }
    }
    long long t1 = clock64();
    unsigned s = 0u;
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) { s += acc[j]; }
    out[blockIdx.x * blockDim.x + threadIdx.x] = (float)s;
    if (threadIdx.x == 0) { cycles[blockIdx.x] = t1 - t0; }
}

// - pointer_chase: load-to-use latency. One thread follows a random cycle through a buffer, a
//   line (128 bytes) a step, each load's address the value the last load returned
//   (idx = buf[idx] through ld.global.cg: cached at the L2, not in L1), so no two loads are ever in
//   flight together: cycles / steps is one load's latency (plus the loop's one add and compare,
//   which issue under it). A buffer of a few MB, walked once untimed, is served by the L2 (its
//   hit latency, averaged over the L2's partitions as any kernel's lines are); one many times the
//   L2, by DRAM (the latency of a miss): each walk starts where the last one stopped (out[0]), so
//   no line is visited twice until the whole cycle has been.
extern "C" __global__ void pointer_chase(const unsigned* buf, unsigned* out, long long* cycles, int steps) {
    unsigned idx = out[0];
    long long t0 = clock64();
    for (int i = 0; i < steps; ++i) { idx = __ldcg(buf + idx); }
    long long t1 = clock64();
    out[0] = idx;
    cycles[0] = t1 - t0;
}
