"""FlashAttention (v1) forward as a simulated program: Algorithm 1 of Dao et al. 2022.

An init kernel writes O = 0, l = 0, m = -inf to HBM (Algorithm 1, line 2). The main kernel has
one thread block per batch-head (FA1 parallelises over batch and heads only). Outer loop over
K/V blocks: K_j, V_j are loaded once. Inner loop over query blocks: Q_i, O_i, l_i, m_i are read
from HBM, updated, and O_i, l_i, m_i written back at every step, so O is rewritten once per K/V
block. Under the causal mask, query blocks that cannot see any key of block j are skipped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from hbmsim.simulator import Launch, Program
from hbmsim.simulator.time_model import MMA_SYNC

from .common import (STATS_DTYPE, block_rows, input_tensors, load_kv_len, masked_scores, online_softmax_update,
                     online_softmax_vector_flops, output, scaled_keep_mask)
from .blocks import AUTO, FlashBlocks, flash_steps, resolve_flash_blocks
from .registry import AlgorithmSpec, register
from .workload import AttentionData, Workload, causal_first_q_block



def flash1_sram_bytes(wl: Workload, block_q: int, block_kv: int) -> int:
    return 2 * (block_q + block_kv) * wl.head_dim * wl.itemsize + 2 * block_q * 4


def flash1_forward(wl: Workload, block_q: int, block_kv: int, data: AttentionData | None = None) -> Program:
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    O = output(wl, "O", nq, d, wl.dtype, data)
    L = output(wl, "l", nq, 1, STATS_DTYPE, data)
    M = output(wl, "m", nq, 1, STATS_DTYPE, data)
    tr = math.ceil(nq / block_q)
    scale, itemsize = wl.softmax_scale, wl.itemsize
    keep = scaled_keep_mask(wl, data)
    numeric = data is not None
    all_cols, one = slice(0, d), slice(0, 1)

    def init_block(ctx, index):
        g, i = divmod(index, tr)
        rows = block_rows(i, block_q, nq)
        n = rows.stop - rows.start
        yield from ctx.store_tiles((O[g], rows, all_cols, np.zeros((n, d)) if numeric else None),
                                   (L[g], rows, one, np.zeros((n, 1)) if numeric else None),
                                   (M[g], rows, one, np.full((n, 1), -np.inf) if numeric else None))

    def block(ctx, g):
        kv_len = yield from load_kv_len(ctx, tensors, wl, g)
        for c0 in range(0, nk, block_kv):
            i_first = causal_first_q_block(wl, c0, block_q)
            if i_first >= tr:
                continue   # no query row sees this K/V block
            c1 = min(nk, c0 + block_kv)
            cols, nc = slice(c0, c1), c1 - c0
            k, v = yield from ctx.load_tiles((K[g], cols, all_cols), (V[g], cols, all_cols))
            for i in range(i_first, tr):
                r0, r1 = i * block_q, min(nq, (i + 1) * block_q)
                rows, n = slice(r0, r1), r1 - r0
                q, o, l, m = yield from ctx.load_tiles((Q[g], rows, all_cols), (O[g], rows, all_cols),
                                                       (L[g], rows, one), (M[g], rows, one))
                # matmul: S = Q_i K_j^T and P V_j, 2*n*nc*d each (a multiply-add is 2 FLOPs); vector: the
                # online softmax of the n x nc tile plus rescaling O_i (2*n*d), with an exp per score and
                # two per row (exp(m_old - m_new), exp(m_tile - m_new)); SRAM: Q_i, K_j, V_j read once.
                yield from ctx.compute(matmul_flops=4 * n * nc * d,
                                       vector_flops=online_softmax_vector_flops(wl, n, nc) + 2 * n * d,
                                       sram_bytes=(n + 2 * nc) * d * itemsize, exp_ops=n * nc + 2 * n)
                if numeric:
                    o, l, m = online_softmax_update(masked_scores(wl, scale, q, k, kv_len, r0, r1, c0, c1), v, o,
                                                    l[:, 0], m[:, 0], None if keep is None else keep[g, r0:r1, c0:c1])
                yield from ctx.store_tiles((O[g], rows, all_cols, o), (L[g], rows, one, l), (M[g], rows, one, m))

    launches = [
        Launch("flash1_init", g_count * tr, 0, init_block, allocs=(O, L, M)),
        Launch("flash1_fwd", g_count, flash1_sram_bytes(wl, block_q, block_kv), block, tensor_op=MMA_SYNC),
    ]
    return Program("flash1_forward", launches, inputs=tuple(tensors.values()), outputs={"O": O, "l": L, "m": M})


# ---- the registered program ----------------------------------------------------------------------

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
    from .flash1_backward import flash1_bwd_sram_bytes
    return lambda br, bc: max(flash1_sram_bytes(wl, br, bc), flash1_bwd_sram_bytes(wl, br, bc) if training else 0)


def _resolve(gpu, wl: Workload, m: Flash1Blocks, training: bool) -> tuple:
    if m.variant == PAPER:
        blocks, notes = resolve_flash_blocks(gpu.sram_bytes_per_sm, wl, FlashBlocks(m.block_q, m.block_kv),
                                             _need(wl, training))
        return replace(m, block_q=blocks.block_q, block_kv=blocks.block_kv, num_splits=1, bwd_parallel=False), notes
    from .flash1_kernel import QUERY_STEP, fa1_bwd_parallel, fa1_kernel_blocks, fa1_kernel_sram_bytes, fa1_num_splits
    notes = []
    if m.block_q not in (AUTO, QUERY_STEP):
        notes.append(f"block_q = {m.block_q} does not apply to the fa1-kernel variant: its query step is "
                     f"{QUERY_STEP} rows")
    bkv = fa1_kernel_blocks(wl) if m.block_kv == AUTO else m.block_kv

    def ctas_per_sm(training_kernel: bool) -> int:
        # what cudaOccupancyMaxActiveBlocksPerMultiprocessor gives, by shared memory alone
        need = fa1_kernel_sram_bytes(wl, bkv, training_kernel)
        return max(1, min(gpu.max_blocks_per_sm, gpu.sram_bytes_per_sm // need))
    splits = m.num_splits
    if splits == AUTO:
        splits = fa1_num_splits(wl.groups, gpu.sm_count, ctas_per_sm(False), wl.seq_len_q)
    parallel = m.bwd_parallel
    if parallel == AUTO:
        parallel = fa1_bwd_parallel(wl.groups, gpu.sm_count, ctas_per_sm(True), wl.seq_len_kv, bkv, wl.causal)
    return replace(m, block_q=QUERY_STEP, block_kv=bkv, num_splits=splits, bwd_parallel=bool(parallel)), tuple(notes)


def _build(wl: Workload, m: Flash1Blocks, data: AttentionData | None, training: bool) -> Program:
    if m.variant == FA1_KERNEL:
        from .flash1_kernel import fa1_kernel_forward, fa1_kernel_training
        if training:
            return fa1_kernel_training(wl, m.block_kv, m.num_splits, m.bwd_parallel, data)
        return fa1_kernel_forward(wl, m.block_kv, m.num_splits, data)
    if training:
        from .flash1_backward import flash1_training
        return flash1_training(wl, m.block_q, m.block_kv, data)
    return flash1_forward(wl, m.block_q, m.block_kv, data)


def _io(wl: Workload, m: Flash1Blocks, pass_name: str) -> dict:
    if m.variant == FA1_KERNEL:
        from .io_flash1_kernel import fa1_kernel_backward_io, fa1_kernel_forward_io
        if pass_name == "forward":
            return fa1_kernel_forward_io(wl, m.block_kv, m.num_splits)
        return fa1_kernel_backward_io(wl, m.block_kv, m.bwd_parallel)
    from . import io_formulas as F
    return (F.flash1_forward_io if pass_name == "forward" else F.flash1_backward_io)(wl, m.block_q, m.block_kv)


def _sram_bytes(wl: Workload, m: Flash1Blocks, training: bool) -> int:
    if m.variant == FA1_KERNEL:
        from .flash1_kernel import fa1_kernel_sram_bytes
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
    no_kernel_reason="no kernel implements flash1 (the CUDA kernel is FlashAttention-2)"))
