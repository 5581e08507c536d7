"""Standard attention as Megatron-LM's CoreAttention runs it, with FusedScaleMaskSoftmax (spec8
section 4).

Forward (pass "forward"): baddbmm on strided views (no copies), one fused softmax kernel (causal:
generates the mask and reads only the lower triangle j <= i of S, backward in place into dP;
padding: reads a uint8 [b, sq, sk] mask per head; no mask: reads S), dropout, bmm, the
permute(...).contiguous() copy of O. When `megatron_fused_applies` is False the torch fallback
runs: masked_fill_(-1e4) with a bool mask [1 or b, sq, sk] read per head, then softmax (defaults
softmax_in_fp32 = False, scale = None: no upcast and no extra scale kernel). Backward (pass
"backward"): autograd's kernels in reverse, the baddbmm grads each followed by its x alpha kernel.
"""
from __future__ import annotations

import numpy as np

from hbmsim.simulator import Launch, Program, Tensor

from .backward_common import d_o_tensor, grad_tensor
from .common import MASK_DTYPE, input_tensors, output
from .standard_kernels import (GEMM_TILE, SOFTMAX_BWD_VECTOR_FLOPS, SOFTMAX_VECTOR_FLOPS, Panels, gemm_launch,
                               panels_of, store_panel, variant_program)
from .standard_torch_kernels import (add_dropout, add_dropout_backward, copy_launch, own_group, panel_launch,
                                     softmax_rows, softmax_rows_backward)
from .workload import AttentionData, Workload, allowed


def megatron_batch_per_block(seq_len_kv: int) -> int:
    """(128 / warp_size) * batches_per_warp: 8 for sk <= 128, 4 above (scaled_masked_softmax.h)."""
    return 8 if seq_len_kv <= 128 else 4


def megatron_fused_applies(wl: Workload) -> bool:
    """FusedScaleMaskSoftmax.is_kernel_available (megatron/model/fused_softmax.py@040eac9414:152-172)
    with fusion on: fp16/bf16, 16 < sk <= 4096, sq, sk, b*np multiples of 4; causal (upper-triangular
    kernel, no padding): b*np % batch_per_block == 0; otherwise (padding mask or none):
    sq % batch_per_block == 0. Added: the causal kernel asserts sq == sk, so sq != sk falls back
    here instead of failing."""
    nq, nk, g = wl.seq_len_q, wl.seq_len_kv, wl.groups
    if wl.dtype not in ("fp16", "bf16") or not (16 < nk <= 4096) or nq % 4 or nk % 4 or g % 4:
        return False
    bpb = megatron_batch_per_block(nk)
    if wl.causal and not wl.key_padding_mask:
        return g % bpb == 0 and nq == nk
    return nq % bpb == 0


def megatron_forward(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return variant_program("megatron", _forward, None, wl, data, gemm_tile)


def megatron_training(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return variant_program("megatron", _forward, _backward, wl, data, gemm_tile)


def _upper_triangular(wl: Workload) -> bool:
    """ScaledUpperTriangMaskedSoftmax runs: the fused kernel, causal without padding."""
    return megatron_fused_applies(wl) and wl.causal and not wl.key_padding_mask


def _attention_mask(wl: Workload, data: AttentionData | None):
    """The bool/uint8 mask [b (or 1 for causal only), 1, sq, sk], 1 = masked, read for every head
    (None when the upper-triangular kernel generates it or nothing is masked), and the function
    from a batch-head to its slice."""
    if not wl.masked or _upper_triangular(wl):
        return None, None
    nq, nk = wl.seq_len_q, wl.seq_len_kv
    pad_groups = wl.batch if wl.key_padding_mask else 1
    AM = Tensor("attention_mask", (pad_groups, nq, nk), MASK_DTYPE, count_only=data is None)
    if data is not None:
        for b in range(pad_groups):
            kv_len = None if data.kv_lens is None else int(data.kv_lens[b])
            AM.data[b] = ~allowed(wl, kv_len, 0, nq, 0, nk)
    heads = wl.heads
    return AM, (lambda g: g // heads) if pad_groups > 1 else (lambda g: 0)


def _forward(wl: Workload, data: AttentionData | None, gemm_tile: tuple) -> tuple:
    """(launches, inputs, the tensors autograd saves by name)."""
    nq, nk, d = wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    inputs = [Q, K, V] + [v for k, v in tensors.items() if k not in "QKV"]
    panel = panels_of(wl, gemm_tile)
    sc, pc = panel.s_chunks, panel.p_chunks
    fused = megatron_fused_applies(wl)
    S = output(wl, "S", nq, nk, wl.dtype, data)
    P = output(wl, "P", nq, nk, wl.dtype, data)
    ctxt = output(wl, "context", nq, d, wl.dtype, data)
    O = output(wl, "O", nq, d, wl.dtype, data)
    # S = scale * Q K^T (baddbmm on strided views)
    L = [gemm_launch("baddbmm", Q, K, S, True, gemm_tile, scale=wl.softmax_scale, allocs=(S,))]
    AM, am_group = _attention_mask(wl, data)
    if AM is not None:
        inputs.append(AM)
    # P = softmax(S masked): the upper-triangular kernel, the fused masked kernel, or the torch fallback
    if _upper_triangular(wl):
        L.append(_upper_triang_forward(wl, panel, S, P))
    elif fused:
        reads = [(S, own_group, sc)] + ([(AM, am_group, sc)] if AM is not None else [])
        L.append(panel_launch("scaled_masked_softmax" if AM is not None else "scaled_softmax", wl, panel, reads,
                              [(P, pc)],
                              lambda g, r, a: [softmax_rows(np.where(a[1] > 0, -np.inf, a[0]) if len(a) > 1 else a[0])],
                              SOFTMAX_VECTOR_FLOPS + 1, allocs=(P,), frees=(S,), exps=1))
    else:
        if AM is not None:
            L.append(panel_launch("mask_fill", wl, panel, [(S, own_group, sc), (AM, am_group, sc)], [(S, sc)],
                                  lambda g, r, a: [np.where(a[1] > 0, -np.inf, a[0])], 1))
        L.append(panel_launch("softmax", wl, panel, [(S, own_group, sc)], [(P, pc)],
                              lambda g, r, a: [softmax_rows(a[0])], SOFTMAX_VECTOR_FLOPS, allocs=(P,), exps=1,
                              frees=(S,)))
    # Pd = dropout(P); context = Pd V; O = context.permute(...).contiguous()
    P_used, DM = add_dropout(wl, data, panel, L, P, wl.dtype)
    L.append(gemm_launch("bmm_pv", P_used, V, ctxt, False, gemm_tile, allocs=(ctxt,)))
    L.append(copy_launch("context_contiguous", [(ctxt, O, False, None)], panel.rows, allocs=(O,), frees=(ctxt,)))
    saved = dict(Q=Q, K=K, V=V, P=P, P_used=P_used, dropout_mask=DM, attention_mask=AM, am_group=am_group, O=O)
    return L, inputs, saved


def _backward(wl: Workload, data: AttentionData | None, gemm_tile: tuple, saved: dict, L: list) -> dict:
    """Autograd's kernels, reversing the forward, appended to L; returns {dQ, dK, dV}."""
    B = "backward"
    nq, nk = wl.seq_len_q, wl.seq_len_kv
    Q, K, V, P, P_used, DM = (saved[k] for k in ("Q", "K", "V", "P", "P_used", "dropout_mask"))
    AM, am_group = saved["attention_mask"], saved["am_group"]
    panel = panels_of(wl, gemm_tile)
    sc, pc = panel.s_chunks, panel.p_chunks
    fused = megatron_fused_applies(wl)
    dO = d_o_tensor(wl, data)
    dPd = output(wl, "dP_drop" if wl.dropout > 0 else "dP", nq, nk, wl.dtype, data)
    dQ, dK, dV = grad_tensor("dQ", Q, data), grad_tensor("dK", K, data), grad_tensor("dV", V, data)
    # bmm's grads: dPd = dO V^T, dV = Pd^T dO; dropout's: dP = dPd * mask / (1 - p)
    L += [gemm_launch("bmm_bwd_dp", dO, V, dPd, True, gemm_tile, allocs=(dO, dPd), pass_name=B),
          gemm_launch("bmm_bwd_dv", P_used, dO, dV, False, gemm_tile, allocs=(dV,), a_transposed=True, pass_name=B)]
    dP = add_dropout_backward(wl, data, panel, L, dPd, DM, wl.dtype)
    # dS = P (dP - rowsum(dP P)): in place into dP (upper-triangular kernel), or a new dS
    if _upper_triangular(wl):
        L.append(_upper_triang_backward(wl, panel, dP, P))
        dS = dP                                         # in place: dS overwrites dP
    else:
        dS = output(wl, "dS", nq, nk, wl.dtype, data)
        name = ("scaled_masked_softmax_bwd" if AM is not None else "scaled_softmax_bwd") if fused else "softmax_bwd"
        L.append(panel_launch(name, wl, panel, [(dP, own_group, sc), (P, own_group, pc)], [(dS, pc)],
                              lambda g, r, a: [softmax_rows_backward(a[0], a[1])], SOFTMAX_BWD_VECTOR_FLOPS, B,
                              allocs=(dS,), frees=(dP, P)))
        if not fused and AM is not None:
            L.append(panel_launch("mask_fill_bwd", wl, panel, [(dS, own_group, pc), (AM, am_group, pc)], [(dS, pc)],
                                  lambda g, r, a: [np.where(a[1] > 0, 0.0, a[0])], 1, B))
    # baddbmm's grads: dQ = dS K, dK = dS^T Q, each then x alpha in its own kernel
    tr = panel.rows
    L += [gemm_launch("baddbmm_bwd_dq", dS, K, dQ, False, gemm_tile, allocs=(dQ,), pass_name=B),
          copy_launch("mul_alpha_dq", [(dQ, dQ, False, wl.softmax_scale)], tr, B),
          gemm_launch("baddbmm_bwd_dk", dS, Q, dK, False, gemm_tile, allocs=(dK,), a_transposed=True,
                      frees=(dS,), pass_name=B),
          copy_launch("mul_alpha_dk", [(dK, dK, False, wl.softmax_scale)], tr, B)]
    return {"dQ": dQ, "dK": dK, "dV": dV}


def _upper_triang_forward(wl: Workload, panel: Panels, S: Tensor, P: Tensor) -> Launch:
    """scaled_upper_triang_masked_softmax_warp_forward: row i reads S[i, 0:i+1] only (the mask is
    generated, sq == sk), writes the full P row (zeros past the diagonal)."""
    nk = wl.seq_len_kv

    def block(ctx, index):
        g, rows = panel(index)
        got = yield from ctx.load_tiles(*[(S[g], slice(i, i + 1), slice(0, i + 1))
                                          for i in range(rows.start, rows.stop)])
        yield from ctx.compute(vector_flops=SOFTMAX_VECTOR_FLOPS * (rows.stop - rows.start) * nk,
                               exp_ops=(rows.stop - rows.start) * nk)      # one exp per element
        p = None
        if got[0] is not None:
            p = np.zeros((rows.stop - rows.start, nk))
            for j, s in enumerate(got):
                p[j, :s.shape[1]] = softmax_rows(s)[0]
        yield from store_panel(ctx, P, g, rows, panel.p_chunks, p)
    return Launch("scaled_upper_triang_masked_softmax", wl.groups * panel.count, 0, block, (P,), (S,))


def _upper_triang_backward(wl: Workload, panel: Panels, dP: Tensor, P: Tensor) -> Launch:
    """..._warp_backward: row i reads dP[i, 0:i+1] and P[i, 0:i+1], writes the full row of dS in
    place into dP (zeros past the diagonal)."""
    nk = wl.seq_len_kv

    def block(ctx, index):
        g, rows = panel(index)
        n = rows.stop - rows.start
        tiles = [(T[g], slice(i, i + 1), slice(0, i + 1)) for T in (dP, P) for i in range(rows.start, rows.stop)]
        got = yield from ctx.load_tiles(*tiles)
        yield from ctx.compute(vector_flops=SOFTMAX_BWD_VECTOR_FLOPS * n * nk)
        ds = None
        if got[0] is not None:
            ds = np.zeros((n, nk))
            for j in range(n):
                dp, p = got[j], got[n + j]
                ds[j, :dp.shape[1]] = softmax_rows_backward(dp, p)[0]
        yield from store_panel(ctx, dP, g, rows, panel.s_chunks, ds)
    return Launch("scaled_upper_triang_masked_softmax_bwd", wl.groups * panel.count, 0, block, (), (P,), "backward")
