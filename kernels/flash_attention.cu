// Forward flash attention in the FlashAttention-2 organisation (Dao 2023, Algorithm 1).
//
// Grid: blockIdx.x = query block i, blockIdx.y = batch-head g, so the linear block index is
// g * ceil(Nq / BLOCK_Q) + i, as in hbmsim's flash2 program. One thread per query row:
// thread t owns row r = i * BLOCK_Q + t. Per block:
//   load Q_i into shared memory once (rows clipped to Nq);
//   for each K/V block c0 = 0, BLOCK_KV, ... below the last key any row of Q_i can see:
//       load K_j, V_j (rows clipped to Nkv) into shared memory;
//       each thread computes its row of S = scale * Q_i K_j^T (8 keys at a time), masks it,
//       and updates its running max m, running sum l and output accumulator with the
//       online softmax;
//   write O_i (storage dtype) and the log-sum-exp (fp32) once.
//
// Where things live (hbmsim/algorithms/flash2.py, SMEM_TILES / REGISTER_TILES, must agree):
//   shared memory: Q_i (BLOCK_Q x HEAD_DIM), K_j and V_j (BLOCK_KV x HEAD_DIM each), all in the
//     storage dtype: (BLOCK_Q + 2 BLOCK_KV) * HEAD_DIM * sizeof(T) bytes of dynamic shared
//     memory and no static shared memory. O_i is staged through Q_i's tile for a coalesced
//     store, so it costs no extra bytes.
//   registers: the thread's row of S (which becomes its row of P), computed a few keys at a
//     time, its row of the O accumulator (fp32), m and l.
// Shared-memory tiles use an XOR swizzle (SwizzledTile) instead of padding: conflict-free for
// the row-per-thread reads and the cooperative row-major writes, and no extra bytes.
//
// Causal masking is bottom-right aligned: query r sees key j iff j <= r + (Nkv - Nq). A row
// that sees no key gets O = 0 and lse = -inf, never NaN.
//
// The same file compiles for the GPU (nvcc, NVRTC) and, with -DHBMSIM_EMULATION and
// cuda_emulation.h, with g++ for the CPU emulation, where GlobalIn/GlobalOut (portable.h)
// become counting, bounds-checked proxies. HBMSIM_OMIT_KV_BARRIER deletes one __syncthreads
// on purpose, so the ThreadSanitizer test can show that the emulation catches a missing barrier.

#include "portable.h"

// A BLOCK x HEAD_DIM tile in shared memory, row-major with the 4-byte words of each row
// permuted by an XOR of the row number. A bank is 4 bytes wide and there are 32 banks: without
// the swizzle, 32 threads reading column c of 32 different rows hit one bank (row stride
// HEAD_DIM is a multiple of 32 words for fp32). With it, those 32 reads land in 32 banks, and a
// warp writing 32 consecutive elements of one row still touches each bank at most once.
template <typename T, int HEAD_DIM>
struct SwizzledTile {
    static_assert(HEAD_DIM >= 32 && HEAD_DIM <= 256 && (HEAD_DIM & (HEAD_DIM - 1)) == 0,
                  "HEAD_DIM must be a power of two in [32, 256]");
    static constexpr int ELEMS_PER_WORD = 4 / sizeof(T);
    static constexpr int WORDS_PER_ROW = HEAD_DIM / ELEMS_PER_WORD;
    // Rows that together span the 32 banks once, and how many distinct XOR patterns to use.
    static constexpr int ROWS_PER_BANK_CYCLE = WORDS_PER_ROW >= 32 ? 1 : 32 / WORDS_PER_ROW;
    static constexpr int PHASES = WORDS_PER_ROW >= 32 ? 32 : WORDS_PER_ROW;

    __device__ static __forceinline__ int index(int row, int col) {
        const int word = col / ELEMS_PER_WORD;
        const int phase = (row / ROWS_PER_BANK_CYCLE) % PHASES;
        return row * HEAD_DIM + (word ^ phase) * ELEMS_PER_WORD + col % ELEMS_PER_WORD;
    }
};

// Copies rows [0, valid_rows) of a row-major global tile into shared memory and zero-fills the
// rest of the ROWS rows (those lie past the end of the sequence: never read from global).
// Consecutive threads read consecutive elements, so each warp's loads are coalesced.
template <typename T, int ROWS, int HEAD_DIM, int THREADS>
__device__ __forceinline__ void load_tile(T* tile, GlobalIn<T> src, int valid_rows) {
    using Tile = SwizzledTile<T, HEAD_DIM>;
    for (int e = threadIdx.x; e < ROWS * HEAD_DIM; e += THREADS) {
        const int row = e / HEAD_DIM, col = e % HEAD_DIM;
        tile[Tile::index(row, col)] = row < valid_rows ? src[e] : convert<T>(0.0f);
    }
}

// The inverse: rows [0, valid_rows) of the shared tile to global memory, coalesced.
template <typename T, int HEAD_DIM, int THREADS>
__device__ __forceinline__ void store_tile(GlobalOut<T> dst, const T* tile, int valid_rows) {
    using Tile = SwizzledTile<T, HEAD_DIM>;
    for (int e = threadIdx.x; e < valid_rows * HEAD_DIM; e += THREADS) {
        dst[e] = tile[Tile::index(e / HEAD_DIM, e % HEAD_DIM)];
    }
}

// Dynamic shared memory the kernel needs; the launcher passes exactly this many bytes.
template <typename T, int BLOCK_Q, int BLOCK_KV, int HEAD_DIM>
struct FlashSmem {
    static constexpr int q_elems = BLOCK_Q * HEAD_DIM;
    static constexpr int kv_elems = BLOCK_KV * HEAD_DIM;
    static constexpr int bytes = (q_elems + 2 * kv_elems) * (int)sizeof(T);
};

// q, k, v, o: contiguous (batch, heads, seq, HEAD_DIM) in storage type T (float or fp16);
// lse: fp32 (batch, heads, seq_len_q). scale multiplies Q K^T; causal is 0 or 1.
template <typename T, int BLOCK_Q, int BLOCK_KV, int HEAD_DIM>
__global__ void __launch_bounds__(BLOCK_Q)
flash_attention_forward(GlobalIn<T> q, GlobalIn<T> k, GlobalIn<T> v, GlobalOut<T> o,
                        GlobalOut<float> lse, int seq_len_q, int seq_len_kv, float scale,
                        int causal) {
    using Tile = SwizzledTile<T, HEAD_DIM>;
    using Smem = FlashSmem<T, BLOCK_Q, BLOCK_KV, HEAD_DIM>;
    // Keys per unrolled step: the largest power of two <= 8 that divides BLOCK_KV, so a step
    // never reads past the K/V tile.
    constexpr int KEYS_PER_STEP = (BLOCK_KV & -BLOCK_KV) < 8 ? (BLOCK_KV & -BLOCK_KV) : 8;
    const float NEG_INF = -__int_as_float(0x7f800000);   // -infinity

    DYNAMIC_SHARED(smem);
    T* q_tile = reinterpret_cast<T*>(smem);   // later reused to stage O_i
    T* k_tile = q_tile + Smem::q_elems;
    T* v_tile = k_tile + Smem::kv_elems;

    const int t = threadIdx.x;
    const int row0 = blockIdx.x * BLOCK_Q;
    const int rows = min(BLOCK_Q, seq_len_q - row0);          // valid query rows in this block
    const long long group = blockIdx.y;                        // batch * heads + head
    const long long q_base = (group * seq_len_q + row0) * HEAD_DIM;
    const long long kv_base = group * seq_len_kv * HEAD_DIM;

    // Keys [0, kv_end) are visible to some row of this block; row r sees keys [0, row_key_end).
    const int diagonal = seq_len_kv - seq_len_q;               // bottom-right aligned causal mask
    const int kv_end = causal ? max(0, min(seq_len_kv, row0 + rows + diagonal)) : seq_len_kv;
    const int row_key_end = t >= rows ? 0                      // a padding row: no work
                          : causal ? max(0, min(seq_len_kv, row0 + t + 1 + diagonal)) : seq_len_kv;

    load_tile<T, BLOCK_Q, HEAD_DIM, BLOCK_Q>(q_tile, q + q_base, rows);

    float m = NEG_INF;       // running max of the row's scores
    float l = 0.0f;          // running sum of exp(score - m)
    float acc[HEAD_DIM];     // running sum of exp(score - m) * V row
#pragma unroll
    for (int c = 0; c < HEAD_DIM; ++c) acc[c] = 0.0f;

    for (int c0 = 0; c0 < kv_end; c0 += BLOCK_KV) {
        const int kv_rows = min(BLOCK_KV, seq_len_kv - c0);
        __syncthreads();     // every thread is done with the previous K_j, V_j
        load_tile<T, BLOCK_KV, HEAD_DIM, BLOCK_Q>(k_tile, k + kv_base + (long long)c0 * HEAD_DIM, kv_rows);
        load_tile<T, BLOCK_KV, HEAD_DIM, BLOCK_Q>(v_tile, v + kv_base + (long long)c0 * HEAD_DIM, kv_rows);
#ifndef HBMSIM_OMIT_KV_BARRIER
        __syncthreads();     // K_j, V_j (and, on the first pass, Q_i) are visible to all threads
#endif

        // This thread's row of S = scale * Q_i K_j^T and of P, KEYS_PER_STEP keys at a time
        // (a register array needs compile-time indices, so the loops over a step are unrolled;
        // stepping keeps the unrolled code, and so compile time and registers, small). Keys
        // past the row's last visible key are skipped, those inside the last step masked.
        const int keys = min(kv_rows, row_key_end - c0);
        for (int j0 = 0; j0 < keys; j0 += KEYS_PER_STEP) {
            float s[KEYS_PER_STEP];
#pragma unroll
            for (int j = 0; j < KEYS_PER_STEP; ++j) s[j] = 0.0f;
#pragma unroll 4
            for (int c = 0; c < HEAD_DIM; ++c) {
                const float q_c = to_float(q_tile[Tile::index(t, c)]);
#pragma unroll
                for (int j = 0; j < KEYS_PER_STEP; ++j) s[j] += q_c * to_float(k_tile[Tile::index(j0 + j, c)]);
            }
            float step_max = NEG_INF;
#pragma unroll
            for (int j = 0; j < KEYS_PER_STEP; ++j) {
                s[j] = j0 + j < keys ? s[j] * scale : NEG_INF;
                step_max = fmaxf(step_max, s[j]);
            }
            // Online softmax: rescale the old sum and accumulator to the new max. Key j0 is
            // visible, so m_new is finite, and exp(-inf) = 0 covers the first visible key.
            const float m_new = fmaxf(m, step_max);
            const float alpha = expf(m - m_new);
            float p_sum = 0.0f;
#pragma unroll
            for (int j = 0; j < KEYS_PER_STEP; ++j) {
                s[j] = expf(s[j] - m_new);               // S becomes P in place
                p_sum += s[j];
            }
            l = alpha * l + p_sum;
#pragma unroll
            for (int c = 0; c < HEAD_DIM; ++c) {
                float pv = 0.0f;
#pragma unroll
                for (int j = 0; j < KEYS_PER_STEP; ++j) pv += s[j] * to_float(v_tile[Tile::index(j0 + j, c)]);
                acc[c] = alpha * acc[c] + pv;
            }
            m = m_new;
        }
    }

    // O_i = acc / l, staged in Q_i's tile: each thread writes its own row, then the block
    // stores the tile with coalesced writes. lse = m + log l (-inf for a row with no key).
    __syncthreads();         // Q_i's rows were written by other threads; order before reuse
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    T* o_tile = q_tile;
#pragma unroll
    for (int c = 0; c < HEAD_DIM; ++c) o_tile[Tile::index(t, c)] = convert<T>(acc[c] * inv_l);
    if (t < rows) lse[group * seq_len_q + row0 + t] = l > 0.0f ? m + logf(l) : NEG_INF;
    __syncthreads();         // the whole O_i tile is staged
    store_tile<T, HEAD_DIM, BLOCK_Q>(o + q_base, o_tile, rows);
}
