// Forward flash attention on tensor cores, FlashAttention-2 organisation (Dao 2023, Algorithm 1):
// mma.sync.aligned.m16n8k16 with fp32 accumulation (fp16 or bf16 inputs), ldmatrix, cp.async
// double buffering of the K/V tiles, the online softmax in registers, causal masking, any
// sequence lengths. Written for this project (organisation after FlashAttention's
// csrc/flash_attn/src/kernel_traits.h and flash_fwd_kernel.h; no code taken from it).
// Needs sm_80 or newer (cp.async, bf16 mma, cvt.rn.bf16x2).
//
// One configuration per compilation (NVRTC -D options, kernels/gpu_tc.py): TC_BF16 (0: fp16),
// TC_HEAD_DIM (64, 128), TC_BLOCK_Q, TC_BLOCK_KV, TC_WARPS, TC_STAGES (2); block sizes not given
// come from TcTraits<TC_HEAD_DIM>, the launch rule (kernels/emulation_tc_config.py and
// algorithms/flash2_rawkernel_tc.py hold the same table; tests/test_rawkernel_tc.py checks).
//
// Grid (ceil(Nq / BLOCK_Q), batch*heads); WARPS x 32 threads; warp w owns query rows
// [w*RPW, (w+1)*RPW) of the block, RPW = BLOCK_Q / WARPS, in M_TILES = RPW / 16 m-tiles. Per block:
//   cp.async (16 bytes a thread): Q_i, K_0, V_0 (one group); before computing tile j, K_{j+1} and
//     V_{j+1} into the other stage (one group), so it lands while tile j computes;
//   Q_i -> registers (ldmatrix) at the first tile; S = Q K_j^T (mma); mask; online softmax in
//     fp32 with exp2 (FA2's softmax.h); P -> input dtype (cvt.rn); O += P V_j (ldmatrix.trans, mma);
//   O = O / l -> input dtype, staged in Q_i's shared tile, stored 16 bytes a thread (rows < Nq);
//   lse = m scale + log l (fp32) into a tensor of Nq8 = ceil(Nq/8)*8 rows per batch-head, 8 rows
//     (one 32-byte sector) per warp store; rows >= Nq get -inf.
// Every global access is whole 32-byte sectors when the tensors start on 256 bytes (cudaMalloc):
// rows are HEAD_DIM * 2 = 128 or 256 bytes. Rows past a sequence are zero-filled in shared memory
// and never read from global memory. kernels/emulation_tc.py models this schedule and counts it.
// Shared memory (dynamic, no static): (BLOCK_Q + 2 * STAGES * BLOCK_KV) * HEAD_DIM * 2 bytes,
// rows XOR-swizzled in 16-byte chunks (chunk ^ (row % 8)) so that ldmatrix is conflict-free.
// Causal masking is bottom-right aligned: query r sees key j iff j <= r + (Nk - Nq); a row that
// sees no key gets O = 0 and lse = -inf.

template <int HEAD_DIM> struct TcTraits;
template <> struct TcTraits<64> {
    static constexpr int kBlockQ = 128; static constexpr int kBlockKV = 128;
    static constexpr int kWarps = 8; static constexpr int kStages = 2;
};
template <> struct TcTraits<128> {
    static constexpr int kBlockQ = 128; static constexpr int kBlockKV = 64;
    static constexpr int kWarps = 8; static constexpr int kStages = 2;
};

#ifndef TC_BF16
#define TC_BF16 0
#endif
#ifndef TC_HEAD_DIM
#define TC_HEAD_DIM 64
#endif
#ifndef TC_BLOCK_Q
#define TC_BLOCK_Q TcTraits<TC_HEAD_DIM>::kBlockQ
#endif
#ifndef TC_BLOCK_KV
#define TC_BLOCK_KV TcTraits<TC_HEAD_DIM>::kBlockKV
#endif
#ifndef TC_WARPS
#define TC_WARPS TcTraits<TC_HEAD_DIM>::kWarps
#endif
#ifndef TC_STAGES
#define TC_STAGES TcTraits<TC_HEAD_DIM>::kStages
#endif

#if TC_BF16
#define TC_MMA_TYPE "bf16"
#define TC_CVT "cvt.rn.bf16x2.f32"
#else
#define TC_MMA_TYPE "f16"
#define TC_CVT "cvt.rn.f16x2.f32"
#endif

typedef unsigned short u16;                           // fp16 / bf16 storage, bit patterns
struct alignas(16) Chunk { unsigned x, y, z, w; };    // 16 bytes: one cp.async / st.global.v4

constexpr int D = TC_HEAD_DIM, BQ = TC_BLOCK_Q, BKV = TC_BLOCK_KV, WARPS = TC_WARPS, STAGES = TC_STAGES;
constexpr int THREADS = WARPS * 32, RPW = BQ / WARPS, M_TILES = RPW / 16;
constexpr int ROW_CHUNKS = D / 8;                     // 16-byte chunks per row
static_assert(D == 64 || D == 128, "head dim 64 or 128");
static_assert(RPW % 16 == 0 && BKV % 16 == 0, "block_q a multiple of 16 x warps, block_kv of 16");
static_assert(STAGES == 2, "the K/V loads are double-buffered");

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}
// chunk index of (row, chunk) in a swizzled tile
__device__ __forceinline__ int swz(int row, int chunk) { return row * ROW_CHUNKS + (chunk ^ (row & 7)); }

__device__ __forceinline__ void cp_async16(Chunk* dst, const Chunk* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// ROWS x D tile from global rows [0, valid) (row-major, D elements a row) into a swizzled tile:
// chunk c by thread c % THREADS; rows >= valid are zero-filled and not read.
template <int ROWS>
__device__ __forceinline__ void load_tile(Chunk* s, const u16* g, int valid, int tid) {
    const Chunk* src = reinterpret_cast<const Chunk*>(g);
    #pragma unroll
    for (int c = tid; c < ROWS * ROW_CHUNKS; c += THREADS) {
        const int r = c / ROW_CHUNKS, ch = c % ROW_CHUNKS;
        if (r < valid) cp_async16(s + swz(r, ch), src + r * ROW_CHUNKS + ch);
        else s[swz(r, ch)] = Chunk{0u, 0u, 0u, 0u};
    }
}

__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const Chunk* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const Chunk* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
// d += a b: a 16x16 (row), b 16x8 (col), d 16x8 fp32
__device__ __forceinline__ void mma16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TC_MMA_TYPE "." TC_MMA_TYPE ".f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// two floats -> two 16-bit values (round to nearest even), lo in the low half
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
    asm(TC_CVT " %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

extern "C" __global__ void __launch_bounds__(THREADS)
flash_attention_tc(const u16* __restrict__ Q, const u16* __restrict__ K, const u16* __restrict__ V,
                   u16* __restrict__ O, float* __restrict__ LSE, int nq, int nk, float scale, float scale_log2,
                   int causal) {
    extern __shared__ Chunk smem[];
    Chunk* sQ = smem;                                  // BQ x D, later O_i
    Chunk* sK = sQ + BQ * ROW_CHUNKS;                  // STAGES x BKV x D
    Chunk* sV = sK + STAGES * BKV * ROW_CHUNKS;        // STAGES x BKV x D
    const float NEG_INF = -__int_as_float(0x7f800000);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
    const int r0 = blockIdx.x * BQ, n = min(BQ, nq - r0);
    const long long g = blockIdx.y;
    const u16* Qg = Q + (g * nq + r0) * D;
    const u16* Kg = K + g * nk * D;
    const u16* Vg = V + g * nk * D;
    const int kv_end = causal ? max(0, min(nk, r0 + n + nk - nq)) : nk;
    const int n_tiles = (kv_end + BKV - 1) / BKV;

    load_tile<BQ>(sQ, Qg, n, tid);                     // stage 0: Q_i, K_0, V_0
    if (n_tiles > 0) {
        load_tile<BKV>(sK, Kg, min(BKV, nk), tid);
        load_tile<BKV>(sV, Vg, min(BKV, nk), tid);
    }
    cp_async_commit();

    unsigned qf[M_TILES][D / 16][4];
    float acc[M_TILES][D / 8][4];
    float m[M_TILES][2], l[M_TILES][2];
    #pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
        m[mt][0] = m[mt][1] = NEG_INF;
        l[mt][0] = l[mt][1] = 0.f;
        #pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) acc[mt][dt][0] = acc[mt][dt][1] = acc[mt][dt][2] = acc[mt][dt][3] = 0.f;
    }
    const int wrow = warp * RPW;                       // the warp's first row in the block

    for (int j = 0; j < n_tiles; ++j) {
        const int stage = j & 1, c0 = j * BKV;
        if (j + 1 < n_tiles) {                         // the next tile into the other stage
            const int c1 = c0 + BKV;
            load_tile<BKV>(sK + (stage ^ 1) * BKV * ROW_CHUNKS, Kg + (long long)c1 * D, min(BKV, nk - c1), tid);
            load_tile<BKV>(sV + (stage ^ 1) * BKV * ROW_CHUNKS, Vg + (long long)c1 * D, min(BKV, nk - c1), tid);
        }
        cp_async_commit();                             // (an empty group on the last tile)
        cp_async_wait<1>();                            // all groups but the newest: tile j is in
        __syncthreads();
        const Chunk* k_s = sK + stage * BKV * ROW_CHUNKS;
        const Chunk* v_s = sV + stage * BKV * ROW_CHUNKS;
        if (j == 0) {                                  // Q_i -> registers, A fragments
            #pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
                #pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    const int row = wrow + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                    ldmatrix_x4(qf[mt][kk], sQ + swz(row, kk * 2 + (lane >> 4)));
                }
        }
        float s[M_TILES][BKV / 8][4];                  // S = Q K_j^T, C fragments
        #pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
            #pragma unroll
            for (int nt = 0; nt < BKV / 8; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            #pragma unroll
            for (int np = 0; np < BKV / 16; ++np) {    // keys np*16 .. +16: two n-tiles
                unsigned b[4];
                const int key = np * 16 + (lane & 7) + (lane >> 4) * 8;
                ldmatrix_x4(b, k_s + swz(key, kk * 2 + ((lane >> 3) & 1)));
                #pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma16816(s[mt][2 * np], qf[mt][kk], b[0], b[1]);
                    mma16816(s[mt][2 * np + 1], qf[mt][kk], b[2], b[3]);
                }
            }
        #pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {              // row gq (h = 0) and gq + 8 (h = 1) of the m-tile
                const int row = r0 + wrow + mt * 16 + gq + 8 * h;
                float mx = NEG_INF;
                #pragma unroll
                for (int nt = 0; nt < BKV / 8; ++nt)
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int col = c0 + nt * 8 + 2 * tq + e;
                        float& x = s[mt][nt][2 * h + e];
                        if (col >= nk || (causal && col > row + nk - nq)) x = NEG_INF;
                        mx = fmaxf(mx, x);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));        // the row's 4 threads
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m[mt][h], mx);
                const float m_safe = m_new == NEG_INF ? 0.f : m_new;
                const float alpha = exp2f((m[mt][h] - m_safe) * scale_log2);
                const float ms = m_safe * scale_log2;
                float sum = 0.f;
                #pragma unroll
                for (int nt = 0; nt < BKV / 8; ++nt)
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& x = s[mt][nt][2 * h + e];
                        x = exp2f(fmaf(x, scale_log2, -ms));
                        sum += x;
                    }
                l[mt][h] = alpha * l[mt][h] + sum;     // this thread's part of the row sum
                m[mt][h] = m_new;
                #pragma unroll
                for (int dt = 0; dt < D / 8; ++dt) {
                    acc[mt][dt][2 * h] *= alpha;
                    acc[mt][dt][2 * h + 1] *= alpha;
                }
            }
        #pragma unroll
        for (int kk = 0; kk < BKV / 16; ++kk) {        // O += P V_j over keys kk*16 .. +16
            unsigned pa[M_TILES][4];
            #pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {     // C fragments of two n-tiles = one A fragment
                pa[mt][0] = pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
            #pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {      // dims dp*16 .. +16: two n-tiles
                unsigned b[4];
                const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                ldmatrix_x4_trans(b, v_s + swz(key, dp * 2 + (lane >> 4)));
                #pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma16816(acc[mt][2 * dp], pa[mt], b[0], b[1]);
                    mma16816(acc[mt][2 * dp + 1], pa[mt], b[2], b[3]);
                }
            }
        }
        __syncthreads();                               // stage free for the load issued at j + 1
    }
    cp_async_wait<0>();                                // (Q_i's group, when no tile ran)
    __syncthreads();

    const int nq8 = (nq + 7) / 8 * 8;
    float* lse_g = LSE + g * nq8;
    u16* s_o = reinterpret_cast<u16*>(sQ);
    #pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            float sum = l[mt][h];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const bool ok = sum > 0.f;
            const float inv = ok ? 1.f / sum : 1.f;
            const int lrow = wrow + mt * 16 + gq + 8 * h, row = r0 + lrow;
            #pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {       // O row -> the staged tile, 2 values a thread
                const int col = dt * 8 + 2 * tq;
                *reinterpret_cast<unsigned*>(s_o + swz(lrow, col / 8) * 8 + col % 8) =
                    pack2(acc[mt][dt][2 * h] * inv, acc[mt][dt][2 * h + 1] * inv);
            }
            if (tq == 0 && row < nq8)                  // 8 rows = one sector per store instruction
                lse_g[row] = (row < nq && ok) ? m[mt][h] * scale + logf(sum) : NEG_INF;
        }
    __syncthreads();
    Chunk* Og = reinterpret_cast<Chunk*>(O + (g * nq + r0) * D);
    for (int c = tid; c < n * ROW_CHUNKS; c += THREADS) {                // 16-byte coalesced stores
        const int r = c / ROW_CHUNKS, ch = c % ROW_CHUNKS;
        Og[r * ROW_CHUNKS + ch] = sQ[swz(r, ch)];
    }
}
