"""Standard attention backward as PyTorch's autograd runs it, after the training forward.

Kernels (pass "backward"), the forward's in reverse:
  gemm_dv       dV = Pd^T dO            (Pd = P_drop with dropout, else P)
  gemm_dp       dPd = dO V^T            writes an N x N matrix
  dropout_bwd   dP = dPd * keep/(1-p)   (dropout > 0) reads dPd and the stored 1-byte mask
  softmax_bwd   dS = P * (dP - rowsum(dP * P))   reads dP and P, writes dS
  mask_bwd      dS masked to 0          (causal / padding) reads dS and the mask(s)
  scale_bwd     dS = scale * dS
  gemm_dq       dQ = dS K
  gemm_dk       dK = dS^T Q
Each N x N matrix is freed after its last reader.
"""
from __future__ import annotations


import numpy as np

from hbmsim.simulator import Launch, Program

from .backward_common import d_o_tensor, grad_tensor, named
from .common import output
from .standard import standard_forward
from .standard_kernels import (GEMM_TILE, SOFTMAX_BWD_VECTOR_FLOPS, gemm_launch, load_panel, mask_panel, panels_of,
                               store_panel)
from .workload import AttentionData, Workload


def standard_training(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    """The training forward (keeping P, P_drop and the masks in HBM), then the backward."""
    fwd = standard_forward(wl, data, gemm_tile, training=True)
    bwd, grads = standard_backward(wl, fwd, data, gemm_tile)
    return Program("standard_training", list(fwd.launches) + bwd, inputs=fwd.inputs,
                   outputs={"O": fwd.outputs["O"], **grads})


def standard_backward(wl: Workload, fwd: Program, data: AttentionData | None, gemm_tile: tuple) -> tuple:
    """The backward's launches after the training forward `fwd`, and its gradients {dQ, dK, dV}."""
    tensors = named(fwd)
    Q, K, V, P = tensors["Q"], tensors["K"], tensors["V"], tensors["P"]
    g_count, nq, nk = wl.groups, wl.seq_len_q, wl.seq_len_kv
    numeric = data is not None
    dropout = wl.dropout > 0
    P_used = tensors["P_drop"] if dropout else P
    DM = tensors.get("dropout_mask")
    CM, KPM = tensors.get("causal_mask"), tensors.get("key_padding_mask")
    dO = d_o_tensor(wl, data)
    dQ, dK, dV = grad_tensor("dQ", Q, data), grad_tensor("dK", K, data), grad_tensor("dV", V, data)
    dPd = output(wl, "dP_drop" if dropout else "dP", nq, nk, wl.dtype, data)
    dP = output(wl, "dP", nq, nk, wl.dtype, data) if dropout else dPd
    dS = output(wl, "dS", nq, nk, wl.dtype, data)
    panel = panels_of(wl, gemm_tile)
    s_chunks, p_chunks = panel.s_chunks, panel.p_chunks
    keep_scale = 1.0 / (1.0 - wl.dropout) if dropout else 1.0

    def dropout_bwd(ctx, index):
        g, rows = panel(index)
        got = yield from ctx.load_tiles(*[(dPd[g], rows, c) for c in s_chunks], *[(DM[g], rows, c) for c in p_chunks])
        yield from ctx.compute(vector_flops=2 * (rows.stop - rows.start) * nk)     # dP = dPd * keep / (1-p)
        val = None
        if numeric:
            val = np.hstack(got[:len(s_chunks)]) * np.hstack(got[len(s_chunks):]) * keep_scale
        yield from store_panel(ctx, dP, g, rows, s_chunks, val)

    def softmax_bwd(ctx, index):
        g, rows = panel(index)
        got = yield from ctx.load_tiles(*[(dP[g], rows, c) for c in s_chunks], *[(P[g], rows, c) for c in p_chunks])
        yield from ctx.compute(vector_flops=SOFTMAX_BWD_VECTOR_FLOPS * (rows.stop - rows.start) * nk)
        val = None
        if numeric:
            dp, p = np.hstack(got[:len(s_chunks)]), np.hstack(got[len(s_chunks):])
            val = p * (dp - (dp * p).sum(axis=1, keepdims=True))
        yield from store_panel(ctx, dS, g, rows, p_chunks, val)

    def mask_bwd(ctx, index):
        g, rows = panel(index)
        yield from mask_panel(ctx, wl, data, dS, g, rows, p_chunks, CM, KPM, 0.0)

    def scale_bwd(ctx, index):
        g, rows = panel(index)
        ds = yield from load_panel(ctx, dS, g, rows, p_chunks)
        yield from ctx.compute(vector_flops=(rows.stop - rows.start) * nk)     # one operation per element
        yield from store_panel(ctx, dS, g, rows, p_chunks, None if ds is None else wl.softmax_scale * ds)

    grid = g_count * panel.count
    bwd = [
        gemm_launch("gemm_dv", P_used, dO, dV, False, gemm_tile, allocs=(dO, dV), a_transposed=True,
                    frees=(P_used,) if dropout else (), pass_name="backward"),
        gemm_launch("gemm_dp", dO, V, dPd, True, gemm_tile, allocs=(dPd,), pass_name="backward"),
    ]
    if dropout:
        bwd.append(Launch("dropout_bwd", grid, 0, dropout_bwd, allocs=(dP,), frees=(dPd, DM), pass_name="backward",
                          period=panel.count))
    bwd.append(Launch("softmax_bwd", grid, 0, softmax_bwd, allocs=(dS,), frees=(dP, P), pass_name="backward",
                      period=panel.count))
    if wl.masked:
        bwd.append(Launch("mask_bwd", grid, 0, mask_bwd, pass_name="backward", period=panel.count))
    bwd += [
        Launch("scale_bwd", grid, 0, scale_bwd, pass_name="backward", period=panel.count),
        gemm_launch("gemm_dq", dS, K, dQ, False, gemm_tile, allocs=(dQ,), pass_name="backward"),
        gemm_launch("gemm_dk", dS, Q, dK, False, gemm_tile, allocs=(dK,), a_transposed=True, frees=(dS,),
                    pass_name="backward"),
    ]
    return bwd, {"dQ": dQ, "dK": dK, "dV": dV}
