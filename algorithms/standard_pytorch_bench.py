"""Standard attention as `attention_pytorch` of flash-attention's benchmarks runs it
(benchmarks/benchmark_flash_attention.py, spec8 section 3.1): the FA2 paper's baseline.

Forward (pass "forward"): rearrange copies of q and k (K^T materialised), baddbmm with alpha =
scale into a fresh S (the preallocated buffer is never read: beta = 0), the causal mask built as
full(-1e4, fp32) -> triu -> .to(dtype) and ADDED (out of place, a new S_masked), softmax,
dropout, the einsum's copy of v, bmm. Backward (pass "backward", after the forward keeping what
autograd saves): bmm grads, dropout and softmax backward (torch's `tmp = grad * output` kernel,
then the row kernel), baddbmm grads with the extra elementwise x alpha kernels, and the unbind
backward's stack into qkv.grad (modelled as its three slices dQ, dK, dV). The benchmark has no
key padding; a workload that asks for it gets standard.py's masked_fill with the key_padding_mask
row (after the causal add; backward: masked_fill of dS with that row, in place).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hbmsim.simulator import Program, Tensor

from .backward_common import d_o_tensor, grad_tensor
from .common import input_tensors, output
from .standard_kernels import GEMM_TILE, SOFTMAX_BWD_VECTOR_FLOPS, gemm_launch, panels_of, variant_program
from .standard_torch_kernels import (F32, add_dropout, add_dropout_backward, broadcast_group, causal_triu_launch,
                                     copy_launch, fill_launch, key_padding_mask_tensor, own_group,
                                     padding_fill_launch, panel_launch, softmax_rows)
from .workload import AttentionData, Workload

# PyTorch's softmax forward as compiled issues far more instructions than softmax's five operations
# per element: index arithmetic, warp shuffles, block-wide max and sum reductions per row, and the
# accurate expf (not exp2f), whose range checks cost more on rows with masked (-10000) scores. Nsight
# Compute on H100 (torch 2.11.0+cu130, fp16; scenarios/measured/h100-ncu-kernels.json) counted
# smsp__inst_executed per element; x 32 lanes it is the lane operations the time model issues at the
# warp schedulers' rate (time_model.py: instruction_issue; the launches say vector_work = "instructions").
# Which kernel runs depends on the row's bytes (seen at N = 512 to 16384 in h100-torch-fwd-bwd.json's
# kernel lists; the switch points between those sizes are not known):
#  - rows up to 4 KB (N <= 2048 in fp16): softmax_warp_forward, a warp per row: 1.23 and 1.21 warp
#    instructions per element at N = 1024 and 2048 -> 39.0 lane operations; causal 1.78 -> 57.0;
#  - up to 16 KB (N = 4096, 8192): cunn_SoftMaxForwardReg, a block per row held in registers: 2.48 and
#    2.42 -> 78.4 (causal, N = 8192: 2.97 -> 94.9); its issue slots were 66-77% busy and DRAM at 39% of
#    peak: issue-bound, not memory-bound;
#  - longer rows (N = 16384): cunn_SoftMaxForwardSmem, the row staged in shared memory: 1.43 -> 45.6
#    (causal not measured: the same figure is used).
# (row bytes up to, lane operations without a mask, with the causal mask)
TORCH_SOFTMAX_LANE_OPS = ((4096, 39.0, 57.0), (16384, 78.4, 94.9), (None, 45.6, 45.6))


def torch_softmax_lane_ops(wl: Workload) -> float:
    """Lane operations per element of torch.softmax's forward kernel over rows of seq_len_kv."""
    row_bytes = wl.seq_len_kv * wl.itemsize
    plain, causal = next((p, c) for limit, p, c in TORCH_SOFTMAX_LANE_OPS if limit is None or row_bytes <= limit)
    return causal if wl.causal else plain


# The same count for PyTorch's copies of permuted (non-contiguous) tensors, which run
# elementwise_kernel with an offset calculator (a division and a multiply-add per dimension per
# element): 69.7e6 warp instructions for the 33.5e6 elements of q's rearrange -> 66.6 lane operations
# per element (issue slots 78% busy); the unbind backward's CatArrayBatchedCopy into qkv.grad:
# 268.7e6 for 100.7e6 elements -> 85.4 (70% busy; the same at N = 2048, head dim 128). Same source as
# above, N = 4096, head dim 64.
TORCH_STRIDED_COPY_LANE_OPS = 66.6
TORCH_CAT_COPY_LANE_OPS = 85.4
# The causal mask's add, scores (B, H, N, N) + mask (N, N) broadcast, takes the same non-vectorized
# path: 1.77 warp instructions per element at N = 2048 and 8192 (head dim 128, causal) -> 56.8, issue
# slots 70-76% busy.
TORCH_BROADCAST_ADD_LANE_OPS = 56.8


# The framework ops attention_pytorch dispatches before each of its forward launches (Launch.host_ops,
# what the stopwatch's host pays: simulator/host.py), counted from the benchmark's code: unbind,
# permute, reshape (q's copy); permute, reshape (k's); empty, baddbmm; view, full (the mask); triu;
# .to; the add; softmax (with the view when there is no mask); dropout (no kernel at p = 0: its op is
# paid before the einsum's); einsum (v's copy); the einsum's bmm. The backward keeps one autograd
# node a launch (Launch's default).
FORWARD_HOST_OPS = {"rearrange_q": 3, "rearrange_k": 2, "baddbmm": 2, "causal_full": 2, "causal_triu": 1,
                    "causal_to_dtype": 1, "causal_add": 1, "mask_padding": 1, "softmax": 1, "dropout": 1,
                    "einsum_copy_v": 1, "bmm_pv": 1}


def _with_forward_host_ops(launches: list, wl: Workload) -> list:
    """The forward's launches with FORWARD_HOST_OPS, and the ops that launch nothing (the view when
    no mask follows baddbmm, dropout at p = 0) paid by the next launch."""
    extra = {"softmax": 0 if wl.causal else 1,
             "einsum_copy_v": 0 if any(launch.name == "dropout" for launch in launches) else 1}
    return [dataclasses.replace(launch, host_ops=FORWARD_HOST_OPS[launch.name] + extra.get(launch.name, 0))
            for launch in launches]


def pytorch_bench_forward(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return variant_program("pytorch_bench", _forward, None, wl, data, gemm_tile)


def pytorch_bench_training(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return variant_program("pytorch_bench", _forward, _backward, wl, data, gemm_tile)


def _forward(wl: Workload, data: AttentionData | None, gemm_tile: tuple) -> tuple:
    """(launches, inputs, the tensors autograd saves by name)."""
    nq, nk, d = wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    numeric = data is not None
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    inputs = [Q, K, V] + [v for k, v in tensors.items() if k not in "QKV"]
    panel = panels_of(wl, gemm_tile)
    sc, pc = panel.s_chunks, panel.p_chunks
    tr = panel.rows
    Qr = output(wl, "Q_r", nq, d, wl.dtype, data)
    KT = output(wl, "K_T", d, nk, wl.dtype, data)
    Vr = output(wl, "V_r", nk, d, wl.dtype, data)
    S = output(wl, "S", nq, nk, wl.dtype, data)
    P = output(wl, "P", nq, nk, wl.dtype, data)
    O = output(wl, "O", nq, d, wl.dtype, data)
    # q, k rearranged (strided copies, K^T materialised); S = scale * Q K^T (baddbmm, beta = 0)
    L = [copy_launch("rearrange_q", [(Q, Qr, False, None)], tr, allocs=(Qr,), lane_ops=TORCH_STRIDED_COPY_LANE_OPS,
                     instructions=True),
         copy_launch("rearrange_k", [(K, KT, True, None)], tr, allocs=(KT,), lane_ops=TORCH_STRIDED_COPY_LANE_OPS,
                     instructions=True),
         gemm_launch("baddbmm", Qr, KT, S, False, gemm_tile, scale=wl.softmax_scale, allocs=(S,))]
    cur = S
    if wl.causal:
        # S_masked = S + triu(full(-1e4)).to(dtype): -1e4 above the (bottom-right aligned) diagonal,
        # computed as -inf (see standard_torch_kernels.py)
        full = Tensor("mask_full", (1, nq, nk), F32, count_only=not numeric, shared=True)
        triu = Tensor("mask_triu", (1, nq, nk), F32, count_only=not numeric, shared=True)
        L.append(fill_launch("causal_full", full, tr, lambda rs: np.full((rs.stop - rs.start, nk), -np.inf)))
        L.append(causal_triu_launch(wl, full, triu, tr))
        cm = triu
        if wl.dtype != F32:
            cm = Tensor("causal_mask", (1, nq, nk), wl.dtype, count_only=not numeric, shared=True)
            L.append(copy_launch("causal_to_dtype", [(triu, cm, False, None)], tr, allocs=(cm,), frees=(triu,)))
        Sm = output(wl, "S_masked", nq, nk, wl.dtype, data)
        L.append(panel_launch("causal_add", wl, panel, [(S, own_group, sc), (cm, broadcast_group, sc)], [(Sm, sc)],
                              lambda g, rows, a: [a[0] + a[1]], TORCH_BROADCAST_ADD_LANE_OPS, allocs=(Sm,),
                              instructions=True,
                              frees=(S, cm)))
        cur = Sm
    KPM = None
    if wl.key_padding_mask:
        # masked_fill(-inf) with the key_padding_mask row, in place
        KPM = key_padding_mask_tensor(wl, data)
        inputs.append(KPM)
        L.append(padding_fill_launch("mask_padding", wl, data, panel, cur, sc, KPM, -np.inf))
    # P = softmax(S_masked); Pd = dropout(P); O = Pd v (after the einsum's copy of v)
    L.append(panel_launch("softmax", wl, panel, [(cur, own_group, sc)], [(P, pc)], lambda g, r, a: [softmax_rows(a[0])],
                          torch_softmax_lane_ops(wl), allocs=(P,), exps=1, frees=(cur,), instructions=True))
    P_used, DM = add_dropout(wl, data, panel, L, P, wl.dtype)
    L.append(copy_launch("einsum_copy_v", [(V, Vr, False, None)], tr, allocs=(Vr,),
                         lane_ops=TORCH_STRIDED_COPY_LANE_OPS, instructions=True))
    L.append(gemm_launch("bmm_pv", P_used, Vr, O, False, gemm_tile, allocs=(O,)))
    saved = dict(Q=Q, K=K, V=V, Q_r=Qr, K_T=KT, V_r=Vr, P=P, P_used=P_used, dropout_mask=DM,
                 key_padding_mask=KPM, O=O)
    return _with_forward_host_ops(L, wl), inputs, saved


def _backward(wl: Workload, data: AttentionData | None, gemm_tile: tuple, saved: dict, L: list) -> dict:
    """Autograd's kernels, reversing the forward, appended to L; returns {dQ, dK, dV}."""
    B = "backward"
    nq, nk, d = wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    Q, K, V, Qr, KT, Vr = (saved[k] for k in ("Q", "K", "V", "Q_r", "K_T", "V_r"))
    P, P_used, DM, KPM = saved["P"], saved["P_used"], saved["dropout_mask"], saved["key_padding_mask"]
    panel = panels_of(wl, gemm_tile)
    sc, pc = panel.s_chunks, panel.p_chunks
    tr = panel.rows
    dropout = wl.dropout > 0
    dO = d_o_tensor(wl, data)
    dPd = output(wl, "dP_drop" if dropout else "dP", nq, nk, wl.dtype, data)
    dS = output(wl, "dS", nq, nk, wl.dtype, data)
    dQr = output(wl, "dQ_r", nq, d, wl.dtype, data)
    dKT = output(wl, "dK_T", d, nk, wl.dtype, data)
    dVr = output(wl, "dV_r", nk, d, wl.dtype, data)
    dQ, dK, dV = grad_tensor("dQ", Q, data), grad_tensor("dK", K, data), grad_tensor("dV", V, data)
    # bmm's grads: dPd = dO V_r^T, dV_r = Pd^T dO; dropout's: dP = dPd * mask / (1 - p)
    L += [gemm_launch("bmm_bwd_dp", dO, Vr, dPd, True, gemm_tile, allocs=(dO, dPd), pass_name=B),
          gemm_launch("bmm_bwd_dv", P_used, dO, dVr, False, gemm_tile, allocs=(dVr,), a_transposed=True, pass_name=B)]
    dP = add_dropout_backward(wl, data, panel, L, dPd, DM, wl.dtype)
    # softmax_backward_cuda_out (aten/src/ATen/native/cuda/SoftMax.cu): `tmp = grad * output`, its own
    # elementwise kernel, then host_softmax_backward(tmp, output): dS = tmp - P * rowsum(tmp)
    dPP = output(wl, "dP_P", nq, nk, wl.dtype, data)
    L.append(panel_launch("softmax_bwd_mul", wl, panel, [(dP, own_group, sc), (P, own_group, pc)], [(dPP, pc)],
                          lambda g, r, a: [a[0] * a[1]], 1, B, allocs=(dPP,), frees=(dP,)))
    L.append(panel_launch("softmax_bwd", wl, panel, [(dPP, own_group, pc), (P, own_group, pc)], [(dS, pc)],
                          lambda g, r, a: [a[0] - a[1] * a[0].sum(axis=1, keepdims=True)],
                          SOFTMAX_BWD_VECTOR_FLOPS - 1, B, allocs=(dS,), frees=(dPP, P)))
    if wl.key_padding_mask:
        L.append(padding_fill_launch("mask_padding_bwd", wl, data, panel, dS, pc, KPM, 0.0, B))
    # baddbmm's grads: dQ_r = dS K_T^T, dK_T = Q_r^T dS, each then x alpha in its own kernel;
    # the unbind backward stacks dQ, dK, dV into qkv.grad
    L += [gemm_launch("baddbmm_bwd_dq", dS, KT, dQr, True, gemm_tile, allocs=(dQr,), pass_name=B),
          copy_launch("mul_alpha_dq", [(dQr, dQr, False, wl.softmax_scale)], tr, B),
          gemm_launch("baddbmm_bwd_dk", Qr, dS, dKT, False, gemm_tile, allocs=(dKT,), a_transposed=True,
                      frees=(dS,), pass_name=B),
          copy_launch("mul_alpha_dk", [(dKT, dKT, False, wl.softmax_scale)], tr, B),
          copy_launch("stack_qkv_grad", [(dQr, dQ, False, None), (dKT, dK, True, None), (dVr, dV, False, None)],
                      tr, B, allocs=(dQ, dK, dV), frees=(dQr, dKT, dVr), lane_ops=TORCH_CAT_COPY_LANE_OPS,
                      instructions=True)]
    return {"dQ": dQ, "dK": dK, "dV": dV}
