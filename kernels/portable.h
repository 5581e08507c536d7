// What the kernels use beyond plain CUDA C++, in one place so that the CPU emulation
// (cuda_emulation.h, which defines HBMSIM_EMULATION) can replace it: the global-memory
// pointer types, the dynamic shared memory declaration, and fp16 storage.
#pragma once

#ifndef HBMSIM_EMULATION
// Global-memory pointers; the emulation build replaces these with counting proxies.
template <typename T> using GlobalIn = const T* __restrict__;
template <typename T> using GlobalOut = T* __restrict__;
#define DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]

// fp16 storage without cuda_fp16.h (which NVRTC cannot always find): 16 raw bits, converted
// with the hardware's cvt instructions (round to nearest even, as __float2half_rn).
struct fp16 { unsigned short bits; };
__device__ __forceinline__ float to_float(fp16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
}
__device__ __forceinline__ void from_float(float f, fp16& h) {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
}
#endif

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ void from_float(float f, float& x) { x = f; }

template <typename T> __device__ __forceinline__ T convert(float f) {
    T x;
    from_float(f, x);
    return x;
}
