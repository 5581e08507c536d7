// C entry points of the CPU emulation build of flash_attention.cu (used by kernels/emulation.py
// through ctypes). The build is one generated translation unit:
//     #include "emulation_entry.h"
//     HBMSIM_DISPATCH_BEGIN
//     HBMSIM_FLASH_CASE(fp16, 64, 64, 64)      // one line per template instantiation
//     HBMSIM_DISPATCH_END
// With HBMSIM_EMULATION_MAIN it also has a main() that runs one case on made-up data (the
// ThreadSanitizer build is such an executable, since TSan cannot be loaded into Python).
#pragma once

#include "cuda_emulation.h"
#include "flash_attention.cu"

#include <cstdlib>

enum { HBMSIM_FP32 = 1, HBMSIM_FP16 = 2 };
enum { T_Q, T_K, T_V, T_O, T_LSE, T_COUNT };

// Mirrored by EmuFlashArgs in kernels/emulation.py: keep the two in the same order.
struct EmuFlashArgs {
    int dtype, block_q, block_kv, head_dim;
    int batch, heads, seq_len_q, seq_len_kv, causal;
    float scale;
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;
    long long elems[T_COUNT];                // extent of each buffer, for the bounds checks
    unsigned long long read_bytes[T_COUNT];  // out: bytes the kernel loaded from each tensor
    unsigned long long write_bytes[T_COUNT]; // out: bytes it stored
    char error[512];                         // out: why the launch failed, when it did
};

template <typename T> constexpr int dtype_code();
template <> constexpr int dtype_code<float>() { return HBMSIM_FP32; }
template <> constexpr int dtype_code<fp16>() { return HBMSIM_FP16; }

template <typename T, int BLOCK_Q, int BLOCK_KV, int HEAD_DIM>
int run_flash(EmuFlashArgs* a) {
    static const char* names[T_COUNT] = {"Q", "K", "V", "O", "lse"};
    emu::Extent extents[T_COUNT];
    for (int i = 0; i < T_COUNT; ++i) {
        extents[i].name = names[i];
        extents[i].elems = a->elems[i];
    }
    emu::Fault fault;
    emu::g_fault = &fault;
    const dim3 grid((a->seq_len_q + BLOCK_Q - 1) / BLOCK_Q, a->batch * a->heads);
    emu::launch(flash_attention_forward<T, BLOCK_Q, BLOCK_KV, HEAD_DIM>, grid, dim3(BLOCK_Q),
                FlashSmem<T, BLOCK_Q, BLOCK_KV, HEAD_DIM>::bytes,
                GlobalIn<T>(static_cast<const T*>(a->q), &extents[T_Q]),
                GlobalIn<T>(static_cast<const T*>(a->k), &extents[T_K]),
                GlobalIn<T>(static_cast<const T*>(a->v), &extents[T_V]),
                GlobalOut<T>(static_cast<T*>(a->o), &extents[T_O]),
                GlobalOut<float>(a->lse, &extents[T_LSE]),
                a->seq_len_q, a->seq_len_kv, a->scale, a->causal);
    emu::g_fault = nullptr;
    for (int i = 0; i < T_COUNT; ++i) {
        a->read_bytes[i] = extents[i].read_bytes.load();
        a->write_bytes[i] = extents[i].write_bytes.load();
    }
    if (fault.set) {
        std::snprintf(a->error, sizeof a->error, "%s", fault.message);
        return 1;
    }
    return 0;
}

#define HBMSIM_DISPATCH_BEGIN                                                              \
    extern "C" int hbmsim_flash_forward(EmuFlashArgs* a, int smem_query_only) {
#define HBMSIM_FLASH_CASE(T, BQ, BKV, D)                                                   \
    if (a->dtype == dtype_code<T>() && a->block_q == BQ && a->block_kv == BKV && a->head_dim == D) \
        return smem_query_only ? FlashSmem<T, BQ, BKV, D>::bytes : run_flash<T, BQ, BKV, D>(a);
#define HBMSIM_DISPATCH_END                                                                \
    std::snprintf(a->error, sizeof a->error, "this emulation build has no instantiation "  \
                  "dtype=%d block_q=%d block_kv=%d head_dim=%d", a->dtype, a->block_q,    \
                  a->block_kv, a->head_dim);                                               \
    return -1;                                                                             \
    }

// Where SwizzledTile puts element (row, col) of a tile, for the bank-conflict test; -1 for a
// (dtype, head_dim) the kernel does not support.
extern "C" int hbmsim_swizzle_index(int dtype, int head_dim, int row, int col) {
#define HBMSIM_SWIZZLE(T, D) \
    if (dtype == dtype_code<T>() && head_dim == D) return SwizzledTile<T, D>::index(row, col);
    HBMSIM_SWIZZLE(float, 32) HBMSIM_SWIZZLE(float, 64) HBMSIM_SWIZZLE(float, 128) HBMSIM_SWIZZLE(float, 256)
    HBMSIM_SWIZZLE(fp16, 32) HBMSIM_SWIZZLE(fp16, 64) HBMSIM_SWIZZLE(fp16, 128) HBMSIM_SWIZZLE(fp16, 256)
#undef HBMSIM_SWIZZLE
    return -1;
}

// fp32 -> fp16 bits as the emulation rounds them (tested against numpy).
extern "C" void hbmsim_float_to_half(const float* x, unsigned short* out, long long n) {
    for (long long i = 0; i < n; ++i) out[i] = float_to_half_bits(x[i]);
}

#ifdef HBMSIM_EMULATION_MAIN
extern "C" int hbmsim_flash_forward(EmuFlashArgs* a, int smem_query_only);

// usage: prog DTYPE(fp16|fp32) BLOCK_Q BLOCK_KV HEAD_DIM BATCH HEADS SEQ_Q SEQ_KV CAUSAL
// Runs one forward pass on deterministic made-up inputs and prints the bytes moved.
int main(int argc, char** argv) {
    if (argc != 10) {
        std::fprintf(stderr, "usage: %s fp16|fp32 block_q block_kv head_dim batch heads seq_q seq_kv causal\n", argv[0]);
        return 2;
    }
    EmuFlashArgs a{};
    a.dtype = std::strcmp(argv[1], "fp16") == 0 ? HBMSIM_FP16 : HBMSIM_FP32;
    int* fields[] = {&a.block_q, &a.block_kv, &a.head_dim, &a.batch, &a.heads, &a.seq_len_q, &a.seq_len_kv, &a.causal};
    for (int i = 0; i < 8; ++i) *fields[i] = std::atoi(argv[2 + i]);
    a.scale = 1.0f / sqrtf((float)a.head_dim);
    const long long groups = (long long)a.batch * a.heads;
    const long long nq = groups * a.seq_len_q * a.head_dim, nk = groups * a.seq_len_kv * a.head_dim;
    const std::size_t e = a.dtype == HBMSIM_FP16 ? 2 : 4;
    std::vector<unsigned char> q(nq * e), k(nk * e), v(nk * e), o(nq * e);
    std::vector<float> lse(groups * a.seq_len_q);
    unsigned state = 12345;                       // small LCG: values in [-1, 1)
    auto fill = [&](std::vector<unsigned char>& buf) {
        for (std::size_t i = 0; i < buf.size() / e; ++i) {
            state = state * 1664525u + 1013904223u;
            const float x = (float)(state >> 8) / (float)(1u << 23) - 1.0f;
            if (e == 2) { const std::uint16_t h = float_to_half_bits(x); std::memcpy(&buf[i * 2], &h, 2); }
            else std::memcpy(&buf[i * 4], &x, 4);
        }
    };
    fill(q); fill(k); fill(v);
    a.q = q.data(); a.k = k.data(); a.v = v.data(); a.o = o.data(); a.lse = lse.data();
    const long long elems[T_COUNT] = {nq, nk, nk, nq, groups * a.seq_len_q};
    for (int i = 0; i < T_COUNT; ++i) a.elems[i] = elems[i];
    const int rc = hbmsim_flash_forward(&a, 0);
    if (rc != 0) {
        std::fprintf(stderr, "error: %s\n", a.error);
        return 1;
    }
    std::printf("Q read %llu K read %llu V read %llu O write %llu lse write %llu\n", a.read_bytes[T_Q],
                a.read_bytes[T_K], a.read_bytes[T_V], a.write_bytes[T_O], a.write_bytes[T_LSE]);
    return 0;
}
#endif
