"""Standard attention as a registered program: its mapping (GEMM tiles and which kernel list
runs), the kernel lists it may run, and its AlgorithmSpec.

Kernel lists, each from the source that was timed or that others use:
  eager          PyTorch eager as autograd runs it (standard.py, standard_backward.py)
  pytorch-bench  attention_pytorch, flash-attention benchmarks: the FA2 paper's baseline
                 (standard_pytorch_bench.py)
  attention-ref  attention_ref, flash-attention tests, fp32 upcast (standard_attention_ref.py)
  megatron       Megatron-LM's fused scale-mask-softmax (standard_megatron.py)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from hbmsim.simulator import Program

from . import io_formulas, io_standard_variants
from .gqa import expands_kv, expands_kv_io
from .registry import AlgorithmSpec, register
from .standard import standard_forward
from .standard_attention_ref import attention_ref_forward, attention_ref_training
from .standard_backward import standard_training
from .standard_kernels import GEMM_FAST_MAX_K_STEPS, GEMM_TILE, gemm_k_steps_at_once, gemm_sram_bytes, gemm_tiles
from .standard_megatron import megatron_forward, megatron_training
from .standard_pytorch_bench import pytorch_bench_forward, pytorch_bench_training
from .workload import AttentionData, Workload

EAGER = "eager"
PYTORCH_BENCH = "pytorch-bench"
ATTENTION_REF = "attention-ref"
MEGATRON = "megatron"


@dataclass(frozen=True)
class KernelList:
    """One variant: its programs (workload, data, gemm tile) -> Program and its closed-form traffic
    (workload, gemm tile) -> {tensor: (read, write)}, per pass."""
    forward: Callable
    training: Callable
    forward_io: Callable
    backward_io: Callable


def _expanding(forward, training, forward_io, backward_io) -> KernelList:
    """A kernel list that, with kv_heads < heads, first repeats K and V per query head as the
    PyTorch code it models does (gqa.expands_kv: Hugging Face's repeat_kv, Megatron-LM's
    repeat_interleave) and sums the expanded dK, dV per group in its backward."""
    return KernelList(expands_kv(forward), expands_kv(training),
                      expands_kv_io(forward_io, "forward"), expands_kv_io(backward_io, "backward"))


KERNEL_LISTS = {
    EAGER: _expanding(standard_forward, standard_training,
                      io_formulas.standard_forward_io, io_formulas.standard_backward_io),
    PYTORCH_BENCH: _expanding(pytorch_bench_forward, pytorch_bench_training,
                              io_standard_variants.pytorch_bench_forward_io,
                              io_standard_variants.pytorch_bench_backward_io),
    # attention_ref repeats k and v itself (einops repeat, a copy even for multi-head attention):
    # its own program reads the shared K/V head in that copy (standard_attention_ref.py)
    ATTENTION_REF: KernelList(attention_ref_forward, attention_ref_training,
                              io_standard_variants.attention_ref_forward_io,
                              io_standard_variants.attention_ref_backward_io),
    MEGATRON: _expanding(megatron_forward, megatron_training,
                         io_standard_variants.megatron_forward_io, io_standard_variants.megatron_backward_io),
}
VARIANTS = tuple(KERNEL_LISTS)      # the default (eager) first


@dataclass(frozen=True)
class GemmTile:
    """Standard attention's mapping: the output tile (tile_m x tile_n) and k-step of its GEMMs,
    and which kernel list runs (`variant`)."""
    tile_m: int = GEMM_TILE[0]
    tile_n: int = GEMM_TILE[1]
    tile_k: int = GEMM_TILE[2]
    variant: str = EAGER

    @property
    def tile(self) -> tuple:
        return (self.tile_m, self.tile_n, self.tile_k)


def _build(wl: Workload, m: GemmTile, data: AttentionData | None, training: bool, fast: bool = False) -> Program:
    """`fast`: the GEMMs' long k-loops take several k-steps a simulated step (GEMM_FAST_MAX_K_STEPS)."""
    kernels = KERNEL_LISTS[m.variant]
    tile = m.tile + ((GEMM_FAST_MAX_K_STEPS,) if fast else ())
    return (kernels.training if training else kernels.forward)(wl, data, tile)


def _io(wl: Workload, m: GemmTile, pass_name: str) -> dict:
    kernels = KERNEL_LISTS[m.variant]
    return (kernels.forward_io if pass_name == "forward" else kernels.backward_io)(wl, m.tile)


def _sram_bytes(wl: Workload, m: GemmTile, training: bool) -> int:
    """The largest GEMM block: its A and B tiles, each clamped to its matrix."""
    nq, nk, d = wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    shapes = [(nq, nk, d), (nq, d, nk)] + ([(nk, d, nq), (nq, d, nk)] if training else [])
    return max(gemm_sram_bytes(wl.itemsize, *gemm_tiles(a, b, c, m.tile)) for a, b, c in shapes)


def _steps(wl: Workload, m: GemmTile, training: bool, fast: bool = False) -> int:
    """Tile steps: the two GEMMs' k-steps (S = QK^T: Nq x Nkv outputs over d; O = PV: Nq x d
    outputs over Nkv; `fast`: several a step, as gemm_launch takes them) and the elementwise
    kernels' tiles (counted as two per S tile)."""
    c = math.ceil
    tm, tn, tk = m.tile
    g, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    pv_k_steps = c(nk / tk)
    if fast:
        pv_k_steps = c(pv_k_steps / gemm_k_steps_at_once(pv_k_steps, GEMM_FAST_MAX_K_STEPS))
    steps = g * (c(nq / tm) * c(nk / tn) * (c(d / tk) + 2) + c(nq / tm) * c(d / tn) * pv_k_steps)
    return steps * (3 if training else 1)


def _slices(wl: Workload, l2_bytes: int, k: int) -> bool:
    """Whether fast mode may run a 1/k slice (scenarios/runner.py). Every batch-head is alike; the
    causal mask, one N x N tensor for all of them, is built by shared launches (the slice runs a
    k-th of their blocks: program.slice_shared) or is a shared input, and is read again by every
    batch-head. Between two batch-heads' reads of a mask row, the mask kernel moves a batch-head's
    S panel, its mask panel and its output panel: about 3 x Nq x Nkv x itemsize bytes. The slice
    keeps that reuse as the whole GPU has it only when that distance fits the slice's L2 (the mask
    stays: both hit) or exceeds the whole L2 (both miss); in between, a slice misses where the
    whole hits (PyTorch's forward at N = 2048: DRAM reads +31%, time +6..+14% on a slice)."""
    if not wl.causal:
        return True
    reuse_bytes = 3 * wl.seq_len_q * wl.seq_len_kv * wl.itemsize
    return reuse_bytes <= l2_bytes // k or reuse_bytes >= l2_bytes


SPEC = register(AlgorithmSpec(
    name="standard", label="standard attention (PyTorch eager)", mapping_type=GemmTile,
    build=_build, io=_io, sram_bytes=_sram_bytes, steps=_steps,
    describe=lambda m: f"gemm {m.tile_m}x{m.tile_n}x{m.tile_k}" + ("" if m.variant == EAGER else f" {m.variant}"),
    nn_arrays=(4, 8), variants=VARIANTS, kernel="standard_attention", coarsens=True,
    slices=_slices,
    no_emulation_reason="the emulation runs only the flash kernel: the standard baseline's GEMMs are cuBLAS, "
                        "whose traffic a CPU emulation cannot count honestly"))
