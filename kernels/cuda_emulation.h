// A small CUDA emulation that lets g++ compile a .cu kernel and run it on the CPU.
//
// Model: blocks run one at a time in linear order (x fastest), each CUDA thread of a block is
// one OS thread, __syncthreads is a pthread barrier over the block's threads, and shared
// memory (dynamic or `__shared__`) is one buffer shared by the block's threads. No warps, no
// timing: this is for correctness, bounds and byte counts, and for ThreadSanitizer, which sees
// a missing barrier as a data race between OS threads.
//
// Global memory is reached only through GlobalIn<T> / GlobalOut<T>. Here they are proxies
// over a named extent: every element access is bounds-checked and adds sizeof(T) to the
// tensor's read or write counter. An out-of-bounds access is recorded (first one wins, with
// tensor, index, block and thread), reads 0 and writes nothing; the launcher reports it.
#pragma once

#include <math.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#ifndef HBMSIM_EMULATION
#define HBMSIM_EMULATION 1
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Blocks run one at a time, so a function-local static is shared by exactly one block's threads.
#define __shared__ static
#define DYNAMIC_SHARED(name) unsigned char* name = ::emu::dynamic_shared()

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float __int_as_float(int bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// ---- fp16 storage: IEEE binary16 bits, converted with round-to-nearest-even like the GPU ----
struct fp16 { unsigned short bits; };

inline float half_bits_to_float(std::uint16_t h) {
    const float sign = (h & 0x8000) ? -1.0f : 1.0f;
    const int exp = (h >> 10) & 0x1f;
    const int mant = h & 0x3ff;
    if (exp == 0x1f) return mant ? NAN : sign * INFINITY;
    if (exp == 0) return sign * ldexpf((float)mant, -24);          // zero and subnormals
    return sign * ldexpf((float)(mant | 0x400), exp - 25);
}

inline std::uint16_t float_to_half_bits(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const std::uint32_t sign = (x >> 16) & 0x8000;
    const int exp = (x >> 23) & 0xff;
    std::uint32_t mant = x & 0x7fffff;
    if (exp == 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);    // inf, nan
    const int e = exp - 127 + 15;                                  // half's biased exponent
    if (e >= 0x1f) return sign | 0x7c00;                           // overflow: inf
    std::uint32_t half, rest, halfway;
    if (e <= 0) {                                                   // half subnormal or zero
        if (e < -11) return sign;
        mant |= 0x800000;
        const int shift = 14 - e;
        half = mant >> shift;
        rest = mant & ((1u << shift) - 1);
        halfway = 1u << (shift - 1);
    } else {
        half = ((std::uint32_t)e << 10) | (mant >> 13);
        rest = mant & 0x1fff;
        halfway = 0x1000;
    }
    if (rest > halfway || (rest == halfway && (half & 1))) ++half;  // a carry may bump the exponent: still right
    return sign | half;
}

inline float to_float(fp16 h) { return half_bits_to_float(h.bits); }
inline void from_float(float f, fp16& h) { h.bits = float_to_half_bits(f); }

namespace emu {

// A tensor in global memory as the kernel sees it: a name, an extent, byte counters.
struct Extent {
    const char* name;
    long long elems;
    std::atomic<unsigned long long> read_bytes{0};
    std::atomic<unsigned long long> write_bytes{0};
};

// The first out-of-bounds access of a launch.
struct Fault {
    std::mutex lock;
    bool set = false;
    char message[512] = {0};
};
inline Fault* g_fault = nullptr;

inline void report_out_of_bounds(const Extent* x, const char* op, long long index) {
    if (!g_fault) return;
    std::lock_guard<std::mutex> guard(g_fault->lock);
    if (g_fault->set) return;
    g_fault->set = true;
    std::snprintf(g_fault->message, sizeof g_fault->message,
                  "out-of-bounds %s of %s: element %lld, valid 0..%lld, block (%u, %u, %u) thread (%u, %u, %u)",
                  op, x->name, index, x->elems - 1, blockIdx.x, blockIdx.y, blockIdx.z,
                  threadIdx.x, threadIdx.y, threadIdx.z);
}

template <typename T>
class GlobalIn {
public:
    GlobalIn(const T* base, Extent* extent, long long offset = 0) : base_(base), x_(extent), offset_(offset) {}
    GlobalIn operator+(long long delta) const { return GlobalIn(base_, x_, offset_ + delta); }
    T operator[](long long i) const {
        const long long at = offset_ + i;
        if (at < 0 || at >= x_->elems) {
            report_out_of_bounds(x_, "read", at);
            return T{};
        }
        x_->read_bytes.fetch_add(sizeof(T), std::memory_order_relaxed);
        return base_[at];
    }

private:
    const T* base_;
    Extent* x_;
    long long offset_;
};

template <typename T>
class GlobalOut {
public:
    // What `out[i]` is: a reference that counts and checks the store.
    class Ref {
    public:
        Ref(T* base, Extent* x, long long at) : base_(base), x_(x), at_(at) {}
        Ref& operator=(const T& value) {
            if (at_ < 0 || at_ >= x_->elems) {
                report_out_of_bounds(x_, "write", at_);
                return *this;
            }
            x_->write_bytes.fetch_add(sizeof(T), std::memory_order_relaxed);
            base_[at_] = value;
            return *this;
        }

    private:
        T* base_;
        Extent* x_;
        long long at_;
    };

    GlobalOut(T* base, Extent* extent, long long offset = 0) : base_(base), x_(extent), offset_(offset) {}
    GlobalOut operator+(long long delta) const { return GlobalOut(base_, x_, offset_ + delta); }
    Ref operator[](long long i) const { return Ref(base_, x_, offset_ + i); }

private:
    T* base_;
    Extent* x_;
    long long offset_;
};

// The block being run: its barriers and its shared memory. __syncthreads alternates between
// two barrier objects. ThreadSanitizer models a barrier wait as "release on arrival, acquire on
// departure" of one sync object; with a single object, a fast thread's arrival at the next
// barrier would be acquired by a slow thread still leaving this one, hiding the race of a
// missing __syncthreads in between. Two objects are enough: no thread can arrive at barrier
// k+2 before every thread has left barrier k.
struct Block {
    pthread_barrier_t barrier[2];
    std::vector<unsigned char> smem;
};
inline Block* g_block = nullptr;
inline thread_local unsigned t_barrier_count = 0;   // barriers this thread has passed

inline void block_barrier() { pthread_barrier_wait(&g_block->barrier[t_barrier_count++ & 1]); }

inline unsigned char* dynamic_shared() { return g_block->smem.data(); }

// Runs kernel(args...) over the grid: one OS thread per CUDA thread, one block at a time.
// Each block's shared memory starts as 0xFF bytes (NaN in fp32 and fp16), so reading a tile
// element the block never wrote shows up in the results (not a previous block's data).
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, dim3 block, std::size_t dynamic_smem_bytes, Args... args) {
    const unsigned threads = block.x * block.y * block.z;
    Block state;
    state.smem.assign(dynamic_smem_bytes + 16, 0xFF);
    for (auto& b : state.barrier) pthread_barrier_init(&b, nullptr, threads);
    g_block = &state;
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned tid = 0; tid < threads; ++tid) {
        pool.emplace_back([=, &state]() {
            threadIdx = uint3{tid % block.x, (tid / block.x) % block.y, tid / (block.x * block.y)};
            blockDim = block;
            gridDim = grid;
            for (unsigned z = 0; z < grid.z; ++z)
                for (unsigned y = 0; y < grid.y; ++y)
                    for (unsigned x = 0; x < grid.x; ++x) {
                        if (tid == 0) std::fill(state.smem.begin(), state.smem.end(), (unsigned char)0xFF);
                        block_barrier();                        // shared memory is fresh
                        blockIdx = uint3{x, y, z};
                        kernel(args...);
                        block_barrier();                        // the block has finished
                    }
        });
    }
    for (auto& t : pool) t.join();
    for (auto& b : state.barrier) pthread_barrier_destroy(&b);
    g_block = nullptr;
}

}  // namespace emu

inline void __syncthreads() { ::emu::block_barrier(); }

template <typename T> using GlobalIn = emu::GlobalIn<T>;
template <typename T> using GlobalOut = emu::GlobalOut<T>;
