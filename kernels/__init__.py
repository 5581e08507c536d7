"""The real kernel: forward flash attention in CUDA (flash_attention.cu, FlashAttention-2
organisation) and a standard-attention baseline (softmax.cu + CuPy matmuls), with

- gpu.py: flash_attention / standard_attention on CuPy arrays (batch, heads, seq, head_dim);
- emulation.py: the same .cu compiled by g++ against cuda_emulation.h and run on the CPU, with
  counting, bounds-checked global memory (bytes per tensor; marked "emulated");
- compile_check.py: nvcc + ptxas for sm_80 / sm_90 without a GPU (registers, shared memory);
- profile.py: CUDA-event timings and Nsight Compute counters, and the measurement file format.

This package never imports hbmsim.algorithms: tests compare the two. CuPy is imported only
when a GPU function is called.
"""
from .config import KernelConfig
from .emulation import Emulator, emulate_flash_attention
from .gpu import flash_attention, standard_attention

__all__ = ["KernelConfig", "Emulator", "emulate_flash_attention", "flash_attention", "standard_attention"]
