"""Standard attention as flash-attention's tests compute their reference: `attention_ref`
(tests/test_flash_attn.py@v2.0.0, spec8 section 3.2).

Forward (pass "forward"): upcast to fp32, repeat copies of k and v, q * scale, einsum,
masked_fill_(-inf) for padding then causal (ones -> triu built in HBM), fp32 softmax, dropout by
masked_fill(~dropout_mask, 0) with v * 1/(1-p) (that multiply always runs), einsum, downcast of O
and of the returned attention. Backward (pass "backward", after the forward keeping what autograd
saves): the einsums' grads, the masked_fills' and softmax's, in reverse, and the casts back.
fp32 workloads skip every cast (`.float()` / `.to(fp32)` of an fp32 tensor is a no-op).
"""
from __future__ import annotations

import numpy as np

from hbmsim.simulator import Program, Tensor

from .backward_common import d_o_tensor, grad_tensor
from .gqa import reduce_kv_grads, repeat_launch
from .common import MASK_DTYPE, input_tensors, output
from .standard_kernels import (GEMM_TILE, SOFTMAX_BWD_VECTOR_FLOPS, SOFTMAX_VECTOR_FLOPS, gemm_launch, panels_of,
                               variant_program)
from .standard_torch_kernels import (F32, broadcast_group, causal_triu_launch, copy_launch, fill_launch,
                                     key_padding_mask_tensor, own_group, padding_fill_launch, panel_launch,
                                     softmax_rows, softmax_rows_backward)
from .workload import AttentionData, Workload


def attention_ref_forward(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return variant_program("attention_ref", _forward, None, wl, data, gemm_tile)


def attention_ref_training(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return variant_program("attention_ref", _forward, _backward, wl, data, gemm_tile)


def _upcast(wl: Workload) -> bool:
    return wl.dtype != F32            # .float() / .to(dtype_og) are no-ops for fp32


def _forward(wl: Workload, data: AttentionData | None, gemm_tile: tuple) -> tuple:
    """(launches, inputs, the tensors autograd saves by name)."""
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    numeric = data is not None
    up = _upcast(wl)
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    inputs = [Q, K, V] + [v for k, v in tensors.items() if k not in "QKV"]
    panel = panels_of(wl, gemm_tile)
    sc, pc = panel.s_chunks, panel.p_chunks
    tr = panel.rows
    L = []

    def f32(name, rows, cols):
        return output(wl, name, rows, cols, F32, data)

    # q, k, v .float()
    gqa = wl.group_size > 1
    if up:
        Q32 = f32("Q32", nq, d)
        K32, V32 = (Tensor(n, K.shape, F32, count_only=not numeric) for n in ("K32", "V32"))
        L.append(copy_launch("upcast_q", [(Q, Q32, False, None)], tr, allocs=(Q32,)))
        L.append(copy_launch("upcast_k", [(K, K32, False, None)], tr, allocs=(K32,)))
        L.append(copy_launch("upcast_v", [(V, V32, False, None)], tr, allocs=(V32,)))
    else:
        Q32, K32, V32 = Q, K, V
    # k, v repeated (copies); S = (q * scale) k^T
    Krep, Vrep, Qs = f32("K_rep", nk, d), f32("V_rep", nk, d), f32("Q_scaled", nq, d)
    S, P = f32("S", nq, nk), f32("P", nq, nk)
    # (kv_heads < heads: einops repeat "b s h d -> b s (h g) d" reads the shared head per copy)
    L += [repeat_launch(wl, K32, Krep) if gqa else copy_launch("repeat_k", [(K32, Krep, False, None)], tr,
                                                                 allocs=(Krep,)),
          repeat_launch(wl, V32, Vrep) if gqa else copy_launch("repeat_v", [(V32, Vrep, False, None)], tr,
                                                                 allocs=(Vrep,)),
          copy_launch("scale_q", [(Q32, Qs, False, wl.softmax_scale)], tr, allocs=(Qs,)),
          gemm_launch("einsum_qk", Qs, Krep, S, True, gemm_tile, allocs=(S,))]
    # S.masked_fill_(-inf): the key padding row, then the causal mask (ones -> triu, built in HBM)
    KPM = CM = None
    if wl.key_padding_mask:
        KPM = key_padding_mask_tensor(wl, data)
        inputs.append(KPM)
        L.append(padding_fill_launch("mask_padding", wl, data, panel, S, sc, KPM, -np.inf))
    if wl.causal:
        ones = Tensor("causal_ones", (1, nq, nk), MASK_DTYPE, count_only=not numeric, shared=True)
        CM = Tensor("causal_mask", (1, nq, nk), MASK_DTYPE, count_only=not numeric, shared=True)
        L.append(fill_launch("causal_ones", ones, tr, lambda rs: np.ones((rs.stop - rs.start, nk))))
        L.append(causal_triu_launch(wl, ones, CM, tr))
        L.append(panel_launch("mask_causal", wl, panel, [(S, own_group, sc), (CM, broadcast_group, sc)], [(S, sc)],
                              lambda g, r, a: [np.where(a[1] > 0, -np.inf, a[0])], 1))
    # P = softmax(S) in fp32
    L.append(panel_launch("softmax", wl, panel, [(S, own_group, sc)], [(P, pc)], lambda g, r, a: [softmax_rows(a[0])],
                          SOFTMAX_VECTOR_FLOPS, allocs=(P,), exps=1, frees=(S,)))
    # Pd = P.masked_fill(~dropout_mask, 0), with ~dropout_mask its own kernel
    P_used = P
    DMn = None
    if wl.dropout > 0:
        DM = Tensor("dropout_mask", (g_count, nq, nk), MASK_DTYPE,
                    None if not numeric else data.keep.reshape(g_count, nq, nk).astype(float), count_only=not numeric)
        inputs.append(DM)
        DMn = output(wl, "dropout_mask_not", nq, nk, MASK_DTYPE, data)
        P_used = f32("P_drop", nq, nk)
        L.append(panel_launch("not_dropout_mask", wl, panel, [(DM, own_group, pc)], [(DMn, pc)],
                              lambda g, r, a: [1.0 - a[0]], 1, allocs=(DMn,)))
        L.append(panel_launch("dropout_masked_fill", wl, panel, [(P, own_group, pc), (DMn, own_group, pc)],
                              [(P_used, pc)], lambda g, r, a: [np.where(a[1] > 0, 0.0, a[0])], 1, allocs=(P_used,)))
    # O = Pd (v * 1/(1-p)), then O and the attention downcast
    Vs = f32("V_dropscaled", nk, d)
    ks = 1.0 / (1.0 - wl.dropout)
    L.append(copy_launch("scale_v", [(Vrep, Vs, False, ks)], tr, allocs=(Vs,)))
    O32 = f32("O32", nq, d) if up else output(wl, "O", nq, d, wl.dtype, data)
    L.append(gemm_launch("einsum_pv", P_used, Vs, O32, False, gemm_tile, allocs=(O32,)))
    O = O32
    if up:
        O = output(wl, "O", nq, d, wl.dtype, data)
        A = output(wl, "attention", nq, nk, wl.dtype, data)
        L.append(copy_launch("downcast_o", [(O32, O, False, None)], tr, allocs=(O,)))
        L.append(panel_launch("downcast_attention", wl, panel, [(P, own_group, pc)], [(A, pc)], lambda g, r, a: [a[0]],
                              1, allocs=(A,)))
    saved = dict(Q=Q, K=K, V=V, Q_scaled=Qs, K_rep=Krep, V_dropscaled=Vs, P=P, P_used=P_used,
                 dropout_mask_not=DMn, causal_mask=CM, key_padding_mask=KPM, O=O)
    return L, inputs, saved


def _backward(wl: Workload, data: AttentionData | None, gemm_tile: tuple, saved: dict, L: list) -> dict:
    """Autograd's kernels, reversing the forward, appended to L; returns {dQ, dK, dV}."""
    B = "backward"
    nq, nk, d = wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    up = _upcast(wl)
    dropout = wl.dropout > 0
    Q, K, V, Qs, Krep, Vs = (saved[k] for k in ("Q", "K", "V", "Q_scaled", "K_rep", "V_dropscaled"))
    P, P_used, DMn = saved["P"], saved["P_used"], saved["dropout_mask_not"]
    CM, KPM = saved["causal_mask"], saved["key_padding_mask"]
    panel = panels_of(wl, gemm_tile)
    sc, pc = panel.s_chunks, panel.p_chunks
    tr = panel.rows
    ks = 1.0 / (1.0 - wl.dropout)

    def f32(name, rows, cols):
        return output(wl, name, rows, cols, F32, data)

    # dO .float(); the second einsum's grads: dPd = dO Vs^T, dVs = Pd^T dO, then dV = dVs / (1-p)
    dO = d_o_tensor(wl, data)
    dO32 = dO
    if up:
        dO32 = f32("dO32", nq, d)
        L.append(copy_launch("to_bwd_do", [(dO, dO32, False, None)], tr, B, allocs=(dO, dO32)))
    dPd = f32("dP_drop" if dropout else "dP", nq, nk)
    dVs = f32("dV_dropscaled", nk, d)
    L += [gemm_launch("einsum_pv_bwd_dp", dO32, Vs, dPd, True, gemm_tile, allocs=(dPd,) + (() if up else (dO,)),
                      pass_name=B),
          gemm_launch("einsum_pv_bwd_dv", P_used, dO32, dVs, False, gemm_tile, allocs=(dVs,), a_transposed=True,
                      pass_name=B)]
    dVrep = f32("dV_rep", nk, d) if up else grad_tensor("dV", V, data)
    if wl.group_size > 1 and not up:
        dVrep = output(wl, "dV_rep", nk, d, wl.dtype, data)
    L.append(copy_launch("scale_v_bwd", [(dVs, dVrep, False, ks)], tr, B, allocs=(dVrep,), frees=(dVs,)))
    # dP = dPd.masked_fill(~dropout_mask, 0); dS = P (dP - rowsum(dP P)); the masks' fills to 0
    dP = dPd
    if dropout:
        dP = f32("dP", nq, nk)
        L.append(panel_launch("dropout_masked_fill_bwd", wl, panel, [(dPd, own_group, sc), (DMn, own_group, pc)],
                              [(dP, sc)], lambda g, r, a: [np.where(a[1] > 0, 0.0, a[0])], 1, B, allocs=(dP,),
                              frees=(dPd, DMn)))
    dS = f32("dS", nq, nk)
    L.append(panel_launch("softmax_bwd", wl, panel, [(dP, own_group, sc), (P, own_group, pc)], [(dS, pc)],
                          lambda g, r, a: [softmax_rows_backward(a[0], a[1])], SOFTMAX_BWD_VECTOR_FLOPS, B,
                          allocs=(dS,), frees=(dP,)))
    if wl.causal:
        L.append(panel_launch("mask_causal_bwd", wl, panel, [(dS, own_group, pc), (CM, broadcast_group, pc)],
                              [(dS, pc)], lambda g, r, a: [np.where(a[1] > 0, 0.0, a[0])], 1, B))
    if wl.key_padding_mask:
        L.append(padding_fill_launch("mask_padding_bwd", wl, data, panel, dS, pc, KPM, 0.0, B))
    # the first einsum's grads: dQs = dS K_rep, dK = dS^T Qs; dQ = dQs * scale; then the casts back
    dQs = f32("dQ_scaled", nq, d)
    dKrep = f32("dK_rep", nk, d) if up else grad_tensor("dK", K, data)
    if wl.group_size > 1 and not up:
        dKrep = output(wl, "dK_rep", nk, d, wl.dtype, data)
    dQ32 = f32("dQ32", nq, d) if up else grad_tensor("dQ", Q, data)
    L += [gemm_launch("einsum_qk_bwd_dq", dS, Krep, dQs, False, gemm_tile, allocs=(dQs,), pass_name=B),
          gemm_launch("einsum_qk_bwd_dk", dS, Qs, dKrep, False, gemm_tile, allocs=(dKrep,), a_transposed=True,
                      frees=(dS,), pass_name=B),
          copy_launch("scale_q_bwd", [(dQs, dQ32, False, wl.softmax_scale)], tr, B, allocs=(dQ32,), frees=(dQs,))]
    # kv_heads < heads: the repeat's backward sums each group's gradients (in fp32 when upcast)
    sums, kv_grads = reduce_kv_grads(wl, dKrep, dVrep, data)
    L += sums
    if not up:
        return {"dQ": dQ32, **kv_grads}
    dQ, dK, dV = grad_tensor("dQ", Q, data), grad_tensor("dK", K, data), grad_tensor("dV", V, data)
    L += [copy_launch("float_bwd_q", [(dQ32, dQ, False, None)], tr, B, allocs=(dQ,)),
          copy_launch("float_bwd_k", [(kv_grads["dK"], dK, False, None)], tr, B, allocs=(dK,)),
          copy_launch("float_bwd_v", [(kv_grads["dV"], dV, False, None)], tr, B, allocs=(dV,))]
    return {"dQ": dQ, "dK": dK, "dV": dV}
