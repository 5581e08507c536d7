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
from hbmsim.simulator.time_model import MMA_SYNC

from .common import (STATS_DTYPE, block_rows, input_tensors, load_kv_len, masked_scores, online_softmax_update,
                     online_softmax_vector_flops, output, scaled_keep_mask)
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
            k, v = yield from ctx.load_tiles((K[wl.kv_group(g)], cols, all_cols), (V[wl.kv_group(g)], cols, all_cols))
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
