"""FlashAttention (v1) forward as a simulated program: Algorithm 1 of Dao et al. 2022.

An init kernel writes O = 0, l = 0, m = -inf to HBM (Algorithm 1, line 2). The main kernel has
one thread block per batch-head (FA1 parallelises over batch and heads only). Outer loop over
K/V blocks: K_j, V_j are loaded once. Inner loop over query blocks: Q_i, O_i, l_i, m_i are read
from HBM, updated, and O_i, l_i, m_i written back at every step, so O is rewritten once per K/V
block. Under the causal mask, query blocks that cannot see any key of block j are skipped.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import Launch, Program

from .common import STATS_DTYPE, input_tensors, keep_groups, online_softmax_vector_flops, output
from .blocks import FlashBlocks, describe_blocks, flash_steps, resolve_flash_blocks
from .registry import AlgorithmSpec, register
from .workload import AttentionData, Workload, allowed, causal_first_q_block

SMEM_TILES = ("Q_i", "O_i", "K_j", "V_j", "l_i", "m_i")   # S_ij / P_ij in registers


def flash1_sram_bytes(wl: Workload, block_q: int, block_kv: int) -> int:
    return 2 * (block_q + block_kv) * wl.head_dim * wl.itemsize + 2 * block_q * 4


def flash1_forward(wl: Workload, block_q: int, block_kv: int, data: AttentionData | None = None) -> Program:
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    t = input_tensors(wl, data)
    Q, K, V = t["Q"], t["K"], t["V"]
    O = output(wl, "O", nq, d, wl.dtype, data)
    L = output(wl, "l", nq, 1, STATS_DTYPE, data)
    M = output(wl, "m", nq, 1, STATS_DTYPE, data)
    tr = math.ceil(nq / block_q)
    scale, e = wl.softmax_scale, wl.itemsize
    keep = keep_groups(wl, data)
    numeric = data is not None
    all_cols, one = slice(0, d), slice(0, 1)

    def init_block(ctx, index):
        g, i = divmod(index, tr)
        rows = slice(i * block_q, min(nq, (i + 1) * block_q))
        n = rows.stop - rows.start
        yield from ctx.store_tiles((O[g], rows, all_cols, np.zeros((n, d)) if numeric else None),
                                   (L[g], rows, one, np.zeros((n, 1)) if numeric else None),
                                   (M[g], rows, one, np.full((n, 1), -np.inf) if numeric else None))

    def block(ctx, g):
        kv_len = None
        if wl.key_padding_mask:
            lens = yield from ctx.load(t["kv_lens"][g // wl.heads], one, one)
            kv_len = None if lens is None else int(lens[0, 0])
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
                yield from ctx.compute(matmul_flops=4 * n * nc * d,
                                       vector_flops=online_softmax_vector_flops(wl, n, nc) + 2 * n * d,
                                       sram_bytes=(n + 2 * nc) * d * e)
                if numeric:
                    o, l, m = _update(wl, scale, q, k, v, o, l[:, 0], m[:, 0],
                                      allowed(wl, kv_len, r0, r1, c0, c1),
                                      None if keep is None else keep[g, r0:r1, c0:c1])
                yield from ctx.store_tiles((O[g], rows, all_cols, o), (L[g], rows, one, l), (M[g], rows, one, m))

    launches = [
        Launch("flash1_init", g_count * tr, 0, init_block, allocs=(O, L, M)),
        Launch("flash1_fwd", g_count, flash1_sram_bytes(wl, block_q, block_kv), block),
    ]
    return Program("flash1_forward", launches, inputs=tuple(t.values()), outputs={"O": O, "l": L, "m": M})


def _update(wl, scale, q, k, v, o, l, m, ok, keep):
    """Algorithm 1 lines 9-13, with -inf handled so fully masked rows stay O = 0, l = 0."""
    s = scale * (q @ k.T)
    if ok is not None:
        s = np.where(ok, s, -np.inf)
    m_tile = s.max(axis=1)
    m_tile_safe = np.where(np.isfinite(m_tile), m_tile, 0.0)
    p = np.exp(s - m_tile_safe[:, None])
    l_tile = p.sum(axis=1)
    m_new = np.maximum(m, m_tile)
    m_new_safe = np.where(np.isfinite(m_new), m_new, 0.0)
    a_old, a_tile = np.exp(m - m_new_safe), np.exp(m_tile - m_new_safe)
    l_new = a_old * l + a_tile * l_tile
    if keep is not None:
        p = p * keep
    num = (l * a_old)[:, None] * o + a_tile[:, None] * (p @ v)
    o_new = np.divide(num, l_new[:, None], out=np.zeros_like(num), where=l_new[:, None] > 0)
    return o_new, l_new[:, None], m_new[:, None]


# ---- the registered program ----------------------------------------------------------------------

def _need(wl: Workload, training: bool):
    from .flash1_backward import flash1_bwd_sram_bytes
    return lambda br, bc: max(flash1_sram_bytes(wl, br, bc), flash1_bwd_sram_bytes(wl, br, bc) if training else 0)


def _build(wl: Workload, m: FlashBlocks, data: AttentionData | None, training: bool) -> Program:
    if training:
        from .flash1_backward import flash1_training
        return flash1_training(wl, m.block_q, m.block_kv, data)
    return flash1_forward(wl, m.block_q, m.block_kv, data)


def _io(wl: Workload, m: FlashBlocks, pass_name: str) -> dict:
    from . import io_formulas as F
    return (F.flash1_forward_io if pass_name == "forward" else F.flash1_backward_io)(wl, m.block_q, m.block_kv)


SPEC = register(AlgorithmSpec(
    name="flash1", label="FlashAttention (Dao et al. 2022), Algorithms 1 and 4", mapping_type=FlashBlocks,
    build=_build, io=_io, sram_bytes=lambda wl, m, training: _need(wl, training)(m.block_q, m.block_kv),
    resolve=lambda gpu, wl, m, training: resolve_flash_blocks(gpu.sram_bytes_per_sm, wl, m, _need(wl, training)),
    steps=flash_steps, describe=describe_blocks, auto_fields=("block_q", "block_kv"),
    match_fields=("block_q", "block_kv"),
    no_kernel_reason="no kernel implements flash1 (the CUDA kernel is FlashAttention-2)"))
