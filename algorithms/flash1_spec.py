"""FlashAttention (v1) as a registered program: its mapping (the paper's Algorithms 1 and 4 with
block_q x block_kv, or the v1.0.9 CUDA kernel's organisation), how a mapping is resolved for a
GPU, how its forward or training program is built, and its AlgorithmSpec."""
from __future__ import annotations

from dataclasses import dataclass, replace

from hbmsim.simulator import Program

from .blocks import AUTO, FlashBlocks, flash_steps, resolve_flash_blocks
from .flash1 import flash1_forward, flash1_sram_bytes
from .flash1_backward import flash1_bwd_sram_bytes, flash1_training
from .flash1_kernel import (QUERY_STEP, fa1_bwd_parallel, fa1_ctas_per_sm, fa1_kernel_blocks, fa1_kernel_forward,
                            fa1_kernel_sram_bytes, fa1_num_splits)
from .flash1_kernel_backward import fa1_kernel_training
from .io_flash1_kernel import fa1_kernel_backward_io, fa1_kernel_forward_io
from .io_formulas import flash1_backward_io, flash1_forward_io
from .registry import AlgorithmSpec, register
from .workload import AttentionData, Workload

PAPER, FA1_KERNEL = "paper", "fa1-kernel"


@dataclass(frozen=True)
class Flash1Blocks:
    """flash1's mapping. variant "paper" (the default): Algorithms 1 and 4 of the FlashAttention
    paper with block_q x block_kv ("auto": the paper's rule). variant "fa1-kernel": the v1.0.9
    CUDA kernel the FlashAttention-2 paper timed (flash1_kernel.py): 16-row query steps
    (block_q = 16), key blocks of block_kv ("auto": 256 for head dim <= 64, 128 above or when
    seq_len_kv <= 128), the forward split over `num_splits` thread blocks per batch-head and the
    backward parallel over key blocks or not (`bwd_parallel`), "auto" being the kernel's own
    heuristics at the occupancy the simulated GPU gives."""
    block_q: int | str = AUTO
    block_kv: int | str = AUTO
    variant: str = PAPER
    num_splits: int | str = AUTO
    bwd_parallel: bool | str = AUTO


def _need(wl: Workload, training: bool):
    """SRAM bytes one block needs with block_q x block_kv: the forward's, or the larger of the
    forward's and the backward's when training."""
    return lambda br, bc: max(flash1_sram_bytes(wl, br, bc), flash1_bwd_sram_bytes(wl, br, bc) if training else 0)


def _resolve(gpu, wl: Workload, m: Flash1Blocks, training: bool) -> tuple:
    if m.variant == PAPER:
        blocks, notes = resolve_flash_blocks(gpu.sram_bytes_per_sm, wl, FlashBlocks(m.block_q, m.block_kv),
                                             _need(wl, training))
        return replace(m, block_q=blocks.block_q, block_kv=blocks.block_kv, num_splits=1, bwd_parallel=False), notes
    notes = []
    if m.block_q not in (AUTO, QUERY_STEP):
        notes.append(f"block_q = {m.block_q} does not apply to the fa1-kernel variant: its query step is "
                     f"{QUERY_STEP} rows")
    bkv = fa1_kernel_blocks(wl) if m.block_kv == AUTO else m.block_kv

    splits = m.num_splits
    if splits == AUTO:
        splits = fa1_num_splits(wl.groups, gpu.sm_count, fa1_ctas_per_sm(gpu, wl, bkv, False), wl.seq_len_q)
    parallel = m.bwd_parallel
    if parallel == AUTO:
        parallel = fa1_bwd_parallel(wl.groups, gpu.sm_count, fa1_ctas_per_sm(gpu, wl, bkv, True), wl.seq_len_kv, bkv,
                                    wl.causal)
    return replace(m, block_q=QUERY_STEP, block_kv=bkv, num_splits=splits, bwd_parallel=bool(parallel)), tuple(notes)


def _build(wl: Workload, m: Flash1Blocks, data: AttentionData | None, training: bool) -> Program:
    if m.variant == FA1_KERNEL:
        if training:
            return fa1_kernel_training(wl, m.block_kv, m.num_splits, m.bwd_parallel, data)
        return fa1_kernel_forward(wl, m.block_kv, m.num_splits, data)
    if training:
        return flash1_training(wl, m.block_q, m.block_kv, data)
    return flash1_forward(wl, m.block_q, m.block_kv, data)


def _io(wl: Workload, m: Flash1Blocks, pass_name: str) -> dict:
    if m.variant == FA1_KERNEL:
        if pass_name == "forward":
            return fa1_kernel_forward_io(wl, m.block_kv, m.num_splits)
        return fa1_kernel_backward_io(wl, m.block_kv, m.bwd_parallel)
    return (flash1_forward_io if pass_name == "forward" else flash1_backward_io)(wl, m.block_q, m.block_kv)


def _sram_bytes(wl: Workload, m: Flash1Blocks, training: bool) -> int:
    if m.variant == FA1_KERNEL:
        return fa1_kernel_sram_bytes(wl, m.block_kv, training)
    return _need(wl, training)(m.block_q, m.block_kv)


def _describe(m: Flash1Blocks) -> str:
    if m.variant == FA1_KERNEL:
        return f"fa1-kernel 16x{m.block_kv} split {m.num_splits}" + (" kv-par" if m.bwd_parallel is True else "")
    return f"{m.block_q}x{m.block_kv}"


SPEC = register(AlgorithmSpec(
    name="flash1", label="FlashAttention (Dao et al. 2022): Algorithms 1 and 4, or the v1 kernel",
    mapping_type=Flash1Blocks, build=_build, io=_io, sram_bytes=_sram_bytes, resolve=_resolve,
    steps=lambda wl, m, training: flash_steps(wl, FlashBlocks(m.block_q, m.block_kv), training),
    describe=_describe, auto_fields=("block_q", "block_kv", "num_splits"), bool_fields=("bwd_parallel",),
    variants=(PAPER, FA1_KERNEL), match_fields=("block_q", "block_kv"),
    slices=lambda wl, l2_bytes, k: True,          # one long block per batch-head: fold.py cannot fold it, a slice can
    no_kernel_reason="no kernel implements flash1 (the CUDA kernel is FlashAttention-2)"))
