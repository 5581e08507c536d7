"""Standard attention forward as PyTorch runs it: every intermediate goes through HBM.

Kernels, in order (each a separate launch, as in eager PyTorch):
  gemm_qk   S = Q K^T            tiled GEMM (tile_m x tile_n outputs, tile_k steps), writes S
  scale     S = scale * S        elementwise: reads S, writes S
  mask      S = S masked         (causal and/or key padding on) reads S and the bool mask(s)
  softmax   P = softmax(S)       row-wise: reads S, writes P; fully masked rows give 0
  dropout   Pd = P * keep/(1-p)  (dropout > 0) reads P, writes P_drop and the 1-byte keep mask
  gemm_pv   O = Pd V             tiled GEMM, writes O
Elementwise and row-wise kernels work on row panels (standard_kernels.py).
S is freed after the softmax; for inference P (and P_drop, the mask) after their last reader; for
training (`training=True`) P, P_drop and the mask stay in HBM for the backward pass.
"""
from __future__ import annotations

import numpy as np

from hbmsim.simulator import Launch, Program, Tensor

from .common import MASK_DTYPE, input_tensors, scaled_keep_mask, output
from .standard_kernels import (GEMM_TILE, SOFTMAX_VECTOR_FLOPS, Panels, gemm_launch, load_panel, mask_panel,
                               panels_of, store_panel)
from .workload import AttentionData, Workload, allowed


def standard_forward(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE,
                     training: bool = False) -> Program:
    nq, nk, d = wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    S = output(wl, "S", nq, nk, wl.dtype, data)
    P = output(wl, "P", nq, nk, wl.dtype, data)
    O = output(wl, "O", nq, d, wl.dtype, data)
    panel = panels_of(wl, gemm_tile)
    inputs = [Q, K, V]
    # S = Q K^T, then S = scale * S
    launches = [gemm_launch("gemm_qk", Q, K, S, True, gemm_tile, allocs=(S,)), _scale_launch(wl, panel, S)]
    # S = S masked: -inf where the causal mask or the key padding forbids the key
    if wl.masked:
        CM, KPM = _mask_tensors(wl, data)
        inputs += [t for t in (CM, KPM) if t is not None]
        launches.append(_mask_launch(wl, data, panel, S, CM, KPM))
    # P = softmax(S); S is freed
    launches.append(_softmax_launch(wl, panel, S, P))
    # Pd = P * keep / (1 - p), with the 1-byte keep mask written for the backward
    outputs = {"O": O}
    P_used = P
    if wl.dropout > 0:
        P_used = output(wl, "P_drop", nq, nk, wl.dtype, data)
        DM = output(wl, "dropout_mask", nq, nk, MASK_DTYPE, data)
        outputs.update(P_drop=P_used, dropout_mask=DM)
        launches.append(_dropout_launch(wl, data, panel, P, P_used, DM, frees=() if training else (P,)))
    # O = Pd V; inference frees Pd (and the mask) after it, training keeps them for the backward
    launches.append(gemm_launch("gemm_pv", P_used, V, O, False, gemm_tile, allocs=(O,),
                                frees=() if training else tuple(t for t in (P_used, outputs.get("dropout_mask"))
                                                                if t is not None)))
    if training:
        outputs["P"] = P
    extra = tuple(v for k, v in tensors.items() if k not in "QKV")
    return Program("standard_forward", launches, inputs=tuple(inputs) + extra, outputs=outputs)


def _rows_elements(rows: slice, nk: int) -> int:
    return (rows.stop - rows.start) * nk


def _scale_launch(wl: Workload, panel: Panels, S: Tensor) -> Launch:
    def scale_block(ctx, index):
        g, rows = panel(index)
        s = yield from load_panel(ctx, S, g, rows, panel.s_chunks)
        yield from ctx.compute(vector_flops=_rows_elements(rows, wl.seq_len_kv))      # one multiply per element
        yield from store_panel(ctx, S, g, rows, panel.s_chunks, None if s is None else wl.softmax_scale * s)
    return Launch("scale", wl.groups * panel.count, 0, scale_block, period=panel.count)


def _mask_tensors(wl: Workload, data: AttentionData | None) -> tuple:
    """(causal_mask, key_padding_mask), each None when off: a precomputed (Nq, Nkv) bool causal
    mask broadcast over batch and heads, and a (batch, Nkv) bool padding mask broadcast over heads
    and rows; filled in numeric mode."""
    nq, nk = wl.seq_len_q, wl.seq_len_kv
    numeric = data is not None
    CM = KPM = None
    if wl.causal:
        CM = Tensor("causal_mask", (1, nq, nk), MASK_DTYPE, count_only=not numeric, shared=True)
        if numeric:
            CM.data[0] = allowed(Workload(1, 1, nq, nk, 1, causal=True), None, 0, nq, 0, nk)
    if wl.key_padding_mask:
        KPM = Tensor("key_padding_mask", (wl.batch, 1, nk), MASK_DTYPE, count_only=not numeric)
        if numeric:
            KPM.data[:, 0, :] = np.arange(nk)[None, :] < data.kv_lens[:, None]
    return CM, KPM


def _mask_launch(wl: Workload, data: AttentionData | None, panel: Panels, S: Tensor, CM, KPM) -> Launch:
    def mask_block(ctx, index):
        g, rows = panel(index)
        yield from mask_panel(ctx, wl, data, S, g, rows, panel.s_chunks, CM, KPM, -np.inf)
    return Launch("mask", wl.groups * panel.count, 0, mask_block, period=panel.count)


def _softmax_launch(wl: Workload, panel: Panels, S: Tensor, P: Tensor) -> Launch:
    def softmax_block(ctx, index):
        g, rows = panel(index)
        s = yield from load_panel(ctx, S, g, rows, panel.s_chunks)
        n = _rows_elements(rows, wl.seq_len_kv)
        yield from ctx.compute(vector_flops=SOFTMAX_VECTOR_FLOPS * n, exp_ops=n)     # 1 exp each
        p = None
        if s is not None:
            mx = s.max(axis=1, keepdims=True)
            ex = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
            tot = ex.sum(axis=1, keepdims=True)
            p = np.divide(ex, tot, out=np.zeros_like(ex), where=tot > 0)
            ctx.note("softmax", g=g, rows=(rows.start, rows.stop), S=s, max=mx[:, 0], exp=ex, sum=tot[:, 0], P=p)
        yield from store_panel(ctx, P, g, rows, panel.p_chunks, p)
    return Launch("softmax", wl.groups * panel.count, 0, softmax_block, allocs=(P,), frees=(S,), period=panel.count)


def _dropout_launch(wl: Workload, data: AttentionData | None, panel: Panels, P: Tensor, P_drop: Tensor,
                    DM: Tensor, frees: tuple) -> Launch:
    keep = scaled_keep_mask(wl, data)

    def dropout_block(ctx, index):
        g, rows = panel(index)
        p = yield from load_panel(ctx, P, g, rows, panel.p_chunks)
        yield from ctx.compute(vector_flops=2 * _rows_elements(rows, wl.seq_len_kv))     # compare + multiply
        k = None if p is None else keep[g, rows, :]
        yield from ctx.store_tiles(*[(P_drop[g], rows, c, None if p is None else p[:, c] * k[:, c])
                                     for c in panel.p_chunks],
                                   *[(DM[g], rows, c, None if p is None else (k[:, c] > 0).astype(float))
                                     for c in panel.p_chunks])
    return Launch("dropout", wl.groups * panel.count, 0, dropout_block, allocs=(P_drop, DM), frees=frees,
                  period=panel.count)
