"""What each of this project's GPU kernels is, so that code asks the kernel rather than
comparing its name: the name the programs' specs give (`kernel=` in the algorithm registry, and
RunSpec.kernel in kernels/profile.py), where it lives, the passes it runs, what a measured run of
it records, whether it is tiled (block sizes, a KernelConfig, shared memory per block), whether
causal masking reads a precomputed mask tensor, and how to launch one forward pass.

A new kernel is measured by `hbmsim profile` once it has a row in KERNELS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hbmsim.simulator import HbmsimError


def _launch_flash_attention(spec, q, k, v, mask=None):
    from . import gpu
    return gpu.flash_attention(q, k, v, block_q=spec.block_q, block_kv=spec.block_kv, causal=spec.causal,
                               scale=spec.scale)


def _launch_flash_attention_tc(spec, q, k, v, mask=None):
    from . import gpu_tc
    return gpu_tc.flash_attention_tc(q, k, v, dtype=spec.dtype, block_q=spec.block_q, block_kv=spec.block_kv,
                                     warps=getattr(spec, "warps", None), causal=spec.causal, scale=spec.scale)


def _launch_standard_attention(spec, q, k, v, mask=None):
    from . import gpu
    return gpu.standard_attention(q, k, v, causal=spec.causal, scale=spec.scale, mask=mask), None


@dataclass(frozen=True)
class KernelTraits:
    name: str                   # as the programs' specs and RunSpec.kernel name it
    source: str                 # where it lives (kernels/)
    passes: tuple[str, ...]     # the passes it runs
    measures: str               # what a measured run of it records
    tiled: bool                 # takes block_q / block_kv: a KernelConfig, shared memory per block
    causal_mask_tensor: bool    # causal masking reads a (seq_len_q, seq_len_kv) bool mask built before the timing
    launch: Callable            # (spec, q, k, v, mask) -> (O, lse or None), one forward pass on CuPy arrays
    takes_warps: bool = False   # compiled per warps per block too (RunSpec.warps)


KERNELS: dict[str, KernelTraits] = {t.name: t for t in (
    KernelTraits("flash_attention", "flash_attention.cu (FlashAttention-2 organisation)", ("forward",),
                 "CUDA-event time of one forward pass, shared memory per block; DRAM / L2 bytes under ncu",
                 tiled=True, causal_mask_tensor=False, launch=_launch_flash_attention),
    KernelTraits("flash_attention_tc", "flash_attention_tc.cu (tensor cores: mma.sync m16n8k16, ldmatrix, cp.async)",
                 ("forward",),
                 "CUDA-event time of one forward pass, shared memory per block; DRAM / L2 bytes under ncu",
                 tiled=True, causal_mask_tensor=False, launch=_launch_flash_attention_tc, takes_warps=True),
    KernelTraits("standard_attention", "CuPy matmuls + softmax.cu (S and P through global memory)", ("forward",),
                 "CUDA-event time of one forward pass; DRAM / L2 bytes under ncu",
                 tiled=False, causal_mask_tensor=True, launch=_launch_standard_attention),
)}


def kernel_traits(name: str) -> KernelTraits:
    """The traits of the kernel called `name`; HbmsimError naming the known ones otherwise."""
    try:
        return KERNELS[name]
    except KeyError:
        raise HbmsimError(f"profile: no GPU kernel {name!r} ({', '.join(KERNELS)})") from None
