"""The real kernel: forward flash attention in CUDA (flash_attention.cu, FlashAttention-2
organisation) and a standard-attention baseline (softmax.cu + CuPy matmuls), with

- gpu.py: flash_attention / standard_attention on CuPy arrays (batch, heads, seq, head_dim);
- emulation.py: the same .cu compiled by g++ against cuda_emulation.h and run on the CPU, with
  counting, bounds-checked global memory (bytes per tensor; marked "emulated");
- compile_check.py: nvcc + ptxas for sm_80 / sm_90 without a GPU (registers, shared memory);
- traits.py: what each kernel is (passes, what it measures, tiled or not, how to launch it);
- profile.py: CUDA-event timings and Nsight Compute counters, and the measurement file format;
- microbench.py (+ microbench.cu): the achievable rates the hardware presets cite;
- sm_clock.py: the SM clock sampled through NVML while something is timed.

And the implementations others ship, timed on this machine's GPU:

- implementations.py: the one table from an implementation a measured file names (fa2, fa1,
  pytorch, sdpa-gqa-decode, fa2-kvcache) to the hbmsim program and variant that reproduce it
  (scenarios/published.py uses it);
- library_timing.py: PyTorch's FlashAttention-2 kernels and the FA2 paper's PyTorch baseline
  over the paper's grid, pass by pass;
- library_nsight.py: those under Nsight Compute and torch.profiler, and ncu's raw page summarised;
- library_decode.py: decode (one query row, grouped-query heads, long KV) over a batch x KV-length
  grid: torch SDPA's FLASH backend with enable_gqa, flash-attn's flash_attn_with_kvcache (paged);
- library.py: their command, `python -m hbmsim.kernels.library` (`hbmsim profile-library`).

This package never imports hbmsim.algorithms or hbmsim.scenarios: tests compare the kernels
with the programs, and scenarios import from here. CuPy and PyTorch are imported only when a
GPU function is called.
"""
from .config import KernelConfig
from .emulation import Emulator, emulate_flash_attention
from .gpu import flash_attention, standard_attention

__all__ = ["KernelConfig", "Emulator", "emulate_flash_attention", "flash_attention", "standard_attention"]
