"""FlashAttention-2 forward as a simulated program (Dao 2023, Algorithm 1).

One thread block per (batch-head, query block); query blocks of one batch-head are adjacent in
the grid, as in FA2's launch, so they share K/V tiles in L2. The block loads Q_i once, streams
K_j, V_j through SRAM, keeps m, l and the O accumulator on chip, and writes O_i and the
log-sum-exp once. Loads overlap compute as in FA2's main loop, with no extra buffers: V_j is
fetched while S_ij = Q_i K_j^T and its softmax are computed, and K_{j+1} while P_ij V_j is. Under the causal mask, K/V blocks that no row of the query block can see are
skipped; the diagonal blocks are masked element-wise.

Where the tiles live (the kernel in kernels/ must agree): SMEM_TILES in shared memory, the
rest in registers.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import Launch, Program

from .common import STATS_DTYPE, input_tensors, keep_groups, online_softmax_vector_flops, output
from .blocks import FlashBlocks, describe_blocks, flash_steps, resolve_flash_blocks
from .registry import AlgorithmSpec, register
from .workload import AttentionData, Workload, allowed, causal_kv_end

SMEM_TILES = ("Q_i", "K_j", "V_j")                 # storage dtype, block_q x d and block_kv x d
REGISTER_TILES = ("S_ij", "P_ij", "O_acc", "m_i", "l_i")


def flash2_sram_bytes(wl: Workload, block_q: int, block_kv: int) -> int:
    return (block_q + 2 * block_kv) * wl.head_dim * wl.itemsize


def flash2_forward(wl: Workload, block_q: int, block_kv: int, data: AttentionData | None = None) -> Program:
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    t = input_tensors(wl, data)
    Q, K, V = t["Q"], t["K"], t["V"]
    O = output(wl, "O", nq, d, wl.dtype, data)
    LSE = output(wl, "lse", nq, 1, STATS_DTYPE, data)
    tr = math.ceil(nq / block_q)
    scale, e = wl.softmax_scale, wl.itemsize
    keep = keep_groups(wl, data)
    numeric = data is not None
    all_cols = slice(0, d)

    def kv_cols(c0):
        return slice(c0, min(nk, c0 + block_kv))

    def block(ctx, index):
        g, i = divmod(index, tr)
        r0, r1 = i * block_q, min(nq, (i + 1) * block_q)
        rows, n = slice(r0, r1), r1 - r0
        kv_end = causal_kv_end(wl, r1) if wl.causal else nk
        first = [(Q[g], rows, all_cols)]
        if wl.key_padding_mask:
            first.append((t["kv_lens"][g // wl.heads], slice(0, 1), slice(0, 1)))
        q_next = ctx.prefetch(*first)                     # Q_i and K_0 are fetched together
        k_next = ctx.prefetch((K[g], kv_cols(0), all_cols)) if kv_end > 0 else None
        q, *lens = yield from ctx.wait(q_next)
        kv_len = int(lens[0][0, 0]) if lens and lens[0] is not None else None
        if numeric:
            m, l, acc = np.full(n, -np.inf), np.zeros(n), np.zeros((n, d))
        for c0 in range(0, kv_end, block_kv):
            cols = kv_cols(c0)
            c1, nc = cols.stop, cols.stop - c0
            (k,) = yield from ctx.wait(k_next)
            v_next = ctx.prefetch((V[g], cols, all_cols))
            yield from ctx.compute(matmul_flops=2 * n * nc * d, vector_flops=online_softmax_vector_flops(wl, n, nc),
                                   sram_bytes=(n + nc) * d * e)
            if numeric:
                s = scale * (q @ k.T)
                ok = allowed(wl, kv_len, r0, r1, c0, c1)
                if ok is not None:
                    s = np.where(ok, s, -np.inf)
                m_new = np.maximum(m, s.max(axis=1))
                m_safe = np.where(np.isfinite(m_new), m_new, 0.0)
                p = np.exp(s - m_safe[:, None])
                alpha = np.exp(m - m_safe)
                l = alpha * l + p.sum(axis=1)
                if keep is not None:
                    p = p * keep[g, r0:r1, c0:c1]
                m = m_new
            (v,) = yield from ctx.wait(v_next)
            if c0 + block_kv < kv_end:
                k_next = ctx.prefetch((K[g], kv_cols(c0 + block_kv), all_cols))
            yield from ctx.compute(matmul_flops=2 * n * nc * d, sram_bytes=nc * d * e)
            if numeric:
                acc = alpha[:, None] * acc + p @ v
        yield from ctx.compute(vector_flops=n * d + 2 * n)   # O = acc / l, lse = m + log l
        o_tile = lse_tile = None
        if numeric:
            pos = l > 0
            o_tile = np.zeros((n, d))
            o_tile[pos] = acc[pos] / l[pos, None]
            lse_tile = np.full((n, 1), -np.inf)
            lse_tile[pos, 0] = m[pos] + np.log(l[pos])
        yield from ctx.store_tiles((O[g], rows, all_cols, o_tile), (LSE[g], rows, slice(0, 1), lse_tile))

    launch = Launch("flash2_fwd", g_count * tr, flash2_sram_bytes(wl, block_q, block_kv), block, allocs=(O, LSE))
    return Program("flash2_forward", [launch], inputs=tuple(t.values()), outputs={"O": O, "lse": LSE})


# ---- the registered program ----------------------------------------------------------------------

def _need(wl: Workload, training: bool):
    from .flash2_backward import flash2_bwd_sram_bytes
    return lambda br, bc: max(flash2_sram_bytes(wl, br, bc), flash2_bwd_sram_bytes(wl, br, bc) if training else 0)


def _build(wl: Workload, m: FlashBlocks, data: AttentionData | None, training: bool) -> Program:
    if training:
        from .flash2_backward import flash2_training
        return flash2_training(wl, m.block_q, m.block_kv, data)
    return flash2_forward(wl, m.block_q, m.block_kv, data)


def _io(wl: Workload, m: FlashBlocks, pass_name: str) -> dict:
    from . import io_formulas as F
    return (F.flash2_forward_io if pass_name == "forward" else F.flash2_backward_io)(wl, m.block_q, m.block_kv)


SPEC = register(AlgorithmSpec(
    name="flash2", label="FlashAttention-2 (Dao 2023)", mapping_type=FlashBlocks,
    build=_build, io=_io, sram_bytes=lambda wl, m, training: _need(wl, training)(m.block_q, m.block_kv),
    resolve=lambda gpu, wl, m, training: resolve_flash_blocks(gpu.sram_bytes_per_sm, wl, m, _need(wl, training)),
    steps=flash_steps, describe=describe_blocks, auto_fields=("block_q", "block_kv"),
    match_fields=("block_q", "block_kv"), kernel="flash_attention", emulated=True))
