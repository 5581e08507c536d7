"""FlashAttention (v1) backward as a simulated program: Algorithm 4 of Dao et al. 2022.

Kernels (pass "backward"), after flash1's forward:
  bwd_init  writes dQ = dK = dV = 0 to HBM (Algorithm 4, line 5).
  bwd       one block per batch-head. Outer loop over K/V blocks: K_j, V_j loaded once, dK_j,
            dV_j accumulated on chip and written once. Inner loop over the query blocks that can
            see block j: Q_i, O_i, dO_i, dQ_i, l_i, m_i read from HBM, P recomputed from l and m,
            D_i = rowsum(dO_i * O_i) recomputed, and dQ_i written back at every step.
Dropout is regenerated from the seed: no mask bytes.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import Launch, Program
from hbmsim.simulator.time_model import MMA_SYNC

from .backward_common import bwd_vector_flops, d_o_tensor, grad_tensor, named, tile_grads
from .gqa import kv_grad_tensors, reduce_kv_grads
from .common import finite_or_zero, load_kv_len, masked_scores, scaled_keep_mask
from .flash1 import flash1_forward
from .workload import AttentionData, Workload, causal_first_q_block


def flash1_bwd_sram_bytes(wl: Workload, block_q: int, block_kv: int) -> int:
    return 4 * (block_q + block_kv) * wl.head_dim * wl.itemsize + 2 * block_q * 4


def flash1_training(wl: Workload, block_q: int, block_kv: int, data: AttentionData | None = None) -> Program:
    """Algorithm 1 (keeping O, l, m in HBM), then Algorithm 4, with the same blocks."""
    fwd = flash1_forward(wl, block_q, block_kv, data)
    bwd, grads = flash1_backward(wl, fwd, block_q, block_kv, data)
    return Program("flash1_training", list(fwd.launches) + bwd, inputs=fwd.inputs, outputs={**fwd.outputs, **grads})


def flash1_backward(wl: Workload, fwd: Program, block_q: int, block_kv: int, data: AttentionData | None) -> tuple:
    """Algorithm 4's launches after the forward `fwd`, and its gradients {dQ, dK, dV}."""
    tensors = named(fwd)
    Q, K, V, O, L, M = tensors["Q"], tensors["K"], tensors["V"], tensors["O"], tensors["l"], tensors["m"]
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    dO = d_o_tensor(wl, data)
    dQ, dK, dV = grad_tensor("dQ", Q, data), *kv_grad_tensors(wl, K, V, data)
    tr = math.ceil(nq / block_q)
    scale, itemsize = wl.softmax_scale, wl.itemsize
    keep = scaled_keep_mask(wl, data)
    numeric = data is not None
    all_cols, one = slice(0, d), slice(0, 1)
    q_tiles = [slice(r, min(nq, r + block_q)) for r in range(0, nq, block_q)]
    kv_tiles = [slice(c, min(nk, c + block_kv)) for c in range(0, nk, block_kv)]

    def zeros(rows):
        return np.zeros((rows.stop - rows.start, d)) if numeric else None

    def init_block(ctx, g):
        yield from ctx.store_tiles(*[(dQ[g], r, all_cols, zeros(r)) for r in q_tiles],
                                   *[(T[g], c, all_cols, zeros(c)) for c in kv_tiles for T in (dK, dV)])

    def block(ctx, g):
        kv_len = yield from load_kv_len(ctx, tensors, wl, g)
        for cols in kv_tiles:
            c0, c1 = cols.start, cols.stop
            i_first = causal_first_q_block(wl, c0, block_q)
            if i_first >= tr:
                continue      # dK_j = dV_j = 0, as initialised
            nc = c1 - c0
            k, v = yield from ctx.load_tiles((K[wl.kv_group(g)], cols, all_cols), (V[wl.kv_group(g)], cols, all_cols))
            dk_acc = dv_acc = None
            if numeric:
                dk_acc, dv_acc = np.zeros((nc, d)), np.zeros((nc, d))
            for rows in q_tiles[i_first:]:
                r0, r1 = rows.start, rows.stop
                n = r1 - r0
                q, o, d_o, dq, l, m = yield from ctx.load_tiles(
                    (Q[g], rows, all_cols), (O[g], rows, all_cols), (dO[g], rows, all_cols),
                    (dQ[g], rows, all_cols), (L[g], rows, one), (M[g], rows, one))
                # matmul: five n x nc x d products, 2*n*nc*d each: S = Q K^T (recompute), dV += P^T dO,
                # dP = dO V^T, dQ += dS K, dK += dS^T Q; vector: the backward's per-score work plus
                # D_i = rowsum(dO o O) (2*n*d); SRAM: Q, O, dO (n x d), K, V, dK-or-dV (nc x d), S/dS (n x nc).
                yield from ctx.compute(matmul_flops=10 * n * nc * d,
                                       vector_flops=bwd_vector_flops(wl, n, nc) + 2 * n * d,
                                       sram_bytes=(3 * n * d + 3 * nc * d + 2 * n * nc) * itemsize,
                                       exp_ops=n * nc)        # recomputing P: an exp per score
                if numeric:
                    s = masked_scores(wl, scale, q, k, kv_len, r0, r1, c0, c1)
                    e_s = np.exp(s - finite_or_zero(m[:, 0])[:, None])
                    p = np.divide(e_s, l, out=np.zeros_like(e_s), where=l > 0)     # Algorithm 4, line 13
                    big_d = (d_o * o).sum(axis=1)                                   # line 19
                    dq_part, dk_part, dv_part = tile_grads(wl, scale, q, k, v, d_o, p, big_d,
                                                           None if keep is None else keep[g, r0:r1, c0:c1])
                    dq = dq + dq_part
                    dk_acc += dk_part
                    dv_acc += dv_part
                yield from ctx.store(dQ[g], rows, all_cols, dq)
            yield from ctx.store_tiles((dK[g], cols, all_cols, dk_acc), (dV[g], cols, all_cols, dv_acc))

    launches = [
        Launch("flash1_bwd_init", g_count, 0, init_block, allocs=(dO, dQ, dK, dV), pass_name="backward"),
        Launch("flash1_bwd", g_count, flash1_bwd_sram_bytes(wl, block_q, block_kv), block, pass_name="backward",
               tensor_op=MMA_SYNC),
    ]
    sums, grads = reduce_kv_grads(wl, dK, dV, data)       # kv_heads < heads: dK, dV per query head, summed
    return launches + sums, {"dQ": dQ, **grads}
