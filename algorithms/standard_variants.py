"""Variants of standard attention as published baselines ran it (spec8 sections 3 and 4).

Three programs, each a forward kernel list (pass "forward") and a training list (the forward,
keeping what autograd saves, then pass "backward"), built from standard.py's helpers:

- pytorch_bench: `attention_pytorch` of flash-attention's benchmarks/benchmark_flash_attention.py
  (spec 3.1): rearrange copies of q and k (K^T materialised), baddbmm with alpha = scale into a
  fresh S (the preallocated buffer is never read: beta = 0), the causal mask built as
  full(-1e4, fp32) -> triu -> .to(dtype) and ADDED (out of place, a new S_masked), softmax,
  dropout, the einsum's copy of v, bmm. Backward: bmm grads, dropout and softmax backward (torch's
  `tmp = grad * output` kernel, then the row kernel),
  baddbmm grads with the extra elementwise x alpha kernels, and the unbind backward's stack
  into qkv.grad (modelled as its three slices dQ, dK, dV). The benchmark has no key padding;
  a workload that asks for it gets standard.py's masked_fill with the key_padding_mask row
  (after the causal add; backward: masked_fill of dS with that row, in place).
- attention_ref: the tests' reference (spec 3.2, tests/test_flash_attn.py@v2.0.0): upcast to fp32,
  repeat copies of k and v, q * scale, einsum, masked_fill_(-inf) for padding then causal
  (ones -> triu built in HBM), fp32 softmax, dropout by masked_fill(~dropout_mask, 0) with
  v * 1/(1-p) (that multiply always runs), einsum, downcast of O and of the returned attention.
  fp32 workloads skip every cast (`.float()` / `.to(fp32)` of an fp32 tensor is a no-op).
- megatron: Megatron-LM's CoreAttention with FusedScaleMaskSoftmax (spec 4): baddbmm on strided
  views (no copies), one fused softmax kernel (causal: generates the mask and reads only the
  lower triangle j <= i of S, backward in place into dP; padding: reads a uint8 [b, sq, sk] mask
  per head; no mask: reads S), dropout, bmm, the permute(...).contiguous() copy of O. When
  `megatron_fused_applies` is False the torch fallback runs: masked_fill_(-1e4) with a bool mask
  [1 or b, sq, sk] read per head, then softmax (defaults softmax_in_fp32 = False, scale = None:
  no upcast and no extra scale kernel).

Numerics: everything is computed in float64 (fp32 copies are only bytes). Additive -1e4 masks and
masked_fill(-1e4) are computed as -inf, so masked entries (and fully masked rows) get exactly 0
probability as in the float64 reference; their bytes are counted as the kernels move them.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import Launch, Program, Tensor

from .backward_common import d_o_tensor, grad_tensor
from .common import MASK_DTYPE, input_tensors, scaled_keep_mask, output
from .standard import GEMM_TILE, SOFTMAX_VECTOR_FLOPS, gemm_launch, mask_panel, panels_of, store_panel
from .standard_backward import SOFTMAX_BWD_VECTOR_FLOPS
from .workload import AttentionData, Workload, allowed

F32 = "fp32"

# PyTorch's softmax forward as compiled issues far more instructions than softmax's five operations
# per element: index arithmetic, warp shuffles, block-wide max and sum reductions per row, and the
# accurate expf (not exp2f), whose range checks cost more on rows with masked (-10000) scores. Nsight
# Compute on H100 (torch 2.11.0+cu130, fp16; scenarios/measured/h100-ncu-kernels.json) counted
# smsp__inst_executed per element; x 32 lanes it is the lane operations the time model issues at one
# per lane-clock (the fp32_ops rate). Which kernel runs depends on the row's bytes (seen at N = 512 to
# 16384 in h100-torch-fwd-bwd.json's kernel lists; the switch points between those sizes are not known):
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


# ---- generic kernels ---------------------------------------------------------------------------

def copy_launch(name: str, pairs: list, tile_rows: int, pass_name: str = "forward", allocs=(), frees=(),
                lane_ops: float = 1) -> Launch:
    """One elementwise kernel over (G, R, C) tensors: for each (src, dst, transpose, factor) it reads
    src in row panels of min(tile_rows, R) full rows and writes factor * src (transposed into a
    (G, C, R) dst when asked). A dtype change is only the dst's itemsize. `lane_ops`: the vector
    operations the kernel issues per element (1; a strided PyTorch copy: TORCH_STRIDED_COPY_LANE_OPS)."""
    jobs = []
    for src, dst, transpose, factor in pairs:
        g_count, r, _ = src.shape
        rows = min(tile_rows, r)
        for g in range(g_count):
            for r0 in range(0, r, rows):
                jobs.append((src, dst, transpose, factor, g, slice(r0, min(r, r0 + rows))))

    def block(ctx, index):
        src, dst, transpose, factor, g, rows = jobs[index]
        cols = slice(0, src.shape[2])
        x = yield from ctx.load(src[g], rows, cols)
        yield from ctx.compute(vector_flops=round(lane_ops * (rows.stop - rows.start) * src.shape[2]))
        if x is not None and factor is not None:
            x = factor * x
        if transpose:
            yield from ctx.store(dst[g], cols, rows, None if x is None else x.T)
        else:
            yield from ctx.store(dst[g], rows, cols, x)
    return Launch(name, len(jobs), 0, block, allocs, frees, pass_name)


def panel_launch(name: str, wl: Workload, panel, reads: list, writes: list, fn, flops: int,
                 pass_name: str = "forward", allocs=(), frees=(), exps: int = 0) -> Launch:
    """An elementwise / row-wise kernel over N x N matrices in standard.py's row panels; `flops`
    vector operations per element (a measured instruction count may be fractional), `exps` of them
    exps (softmax: 1).
    reads: (tensor, group_of(g), column chunks); writes: (tensor, column chunks).
    fn(g, rows, [read panels]) -> [write panels] (numeric mode only)."""
    nk = wl.seq_len_kv

    def block(ctx, index):
        g, rows = panel(index)
        tiles, spans = [], []
        for T, gsel, chunks in reads:
            tiles += [(T[gsel(g)], rows, c) for c in chunks]
            spans.append(len(chunks))
        got = yield from ctx.load_tiles(*tiles)
        elements = (rows.stop - rows.start) * nk
        yield from ctx.compute(vector_flops=round(flops * elements), exp_ops=exps * elements)
        vals = [None] * len(writes)
        if got[0] is not None:
            arrays, i = [], 0
            for n in spans:
                arrays.append(np.hstack(got[i:i + n]))
                i += n
            vals = fn(g, rows, arrays)
        yield from ctx.store_tiles(*[(T[g], rows, c, None if v is None else v[:, c])
                                     for (T, chunks), v in zip(writes, vals) for c in chunks])
    return Launch(name, wl.groups * panel.count, 0, block, allocs, frees, pass_name)


def fill_launch(name: str, T: Tensor, tile_rows: int, value_fn, pass_name: str = "forward") -> Launch:
    """A kernel that only writes T (G, R, C) in row panels: torch.full / torch.ones."""
    g_count, r, c = T.shape
    rows = min(tile_rows, r)
    per = math.ceil(r / rows)

    def block(ctx, index):
        g, i = divmod(index, per)
        rs = slice(i * rows, min(r, (i + 1) * rows))
        yield from ctx.compute(vector_flops=(rs.stop - rs.start) * c)
        yield from ctx.store(T[g], rs, slice(0, c), None if T.data is None else value_fn(rs))
    return Launch(name, g_count * per, 0, block, (T,), (), pass_name)


def _softmax(s):
    mx = s.max(axis=1, keepdims=True)
    ex = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
    tot = ex.sum(axis=1, keepdims=True)
    return np.divide(ex, tot, out=np.zeros_like(ex), where=tot > 0)


def _softmax_bwd(dp, p):
    return p * (dp - (dp * p).sum(axis=1, keepdims=True))


def _ok(wl, data, g, rows, causal=None, padding=None):
    """Allowed tile for rows x all keys; causal/padding select which mask (default: the workload's)."""
    w = Workload(wl.batch, wl.heads, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.dtype,
                 wl.causal if causal is None else causal, wl.key_padding_mask if padding is None else padding)
    kv_len = None if data is None or data.kv_lens is None else int(data.kv_lens[g // wl.heads])
    return allowed(w, kv_len, rows.start, rows.stop, 0, wl.seq_len_kv)


def _kpm(wl, data):
    KPM = Tensor("key_padding_mask", (wl.batch, 1, wl.seq_len_kv), MASK_DTYPE, count_only=data is None)
    if data is not None:
        KPM.data[:, 0, :] = np.arange(wl.seq_len_kv)[None, :] < data.kv_lens[:, None]
    return KPM


def _causal_ok(wl, rs):
    causal = Workload(1, 1, wl.seq_len_q, wl.seq_len_kv, 1, causal=True)
    return allowed(causal, None, rs.start, rs.stop, 0, wl.seq_len_kv)


def _same(g):
    return g


def _zero(g):
    return 0


# ---- pytorch_bench -------------------------------------------------------------------------------

def _pytorch_bench(wl: Workload, data: AttentionData | None, gemm_tile: tuple, training: bool) -> Program:
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
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
    L = [copy_launch("rearrange_q", [(Q, Qr, False, None)], tr, allocs=(Qr,), lane_ops=TORCH_STRIDED_COPY_LANE_OPS),
         copy_launch("rearrange_k", [(K, KT, True, None)], tr, allocs=(KT,), lane_ops=TORCH_STRIDED_COPY_LANE_OPS),
         gemm_launch("baddbmm", Qr, KT, S, False, gemm_tile, scale=wl.softmax_scale, allocs=(S,))]
    cur = S
    if wl.causal:
        full = Tensor("mask_full", (1, nq, nk), F32, count_only=not numeric)
        triu = Tensor("mask_triu", (1, nq, nk), F32, count_only=not numeric)
        # -1e4 above the (bottom-right aligned) diagonal, computed as -inf (see the module docstring)
        L.append(fill_launch("causal_full", full, tr, lambda rs: np.full((rs.stop - rs.start, nk), -np.inf)))
        L.append(panel_launch_1("causal_triu", wl, full, triu, tr, lambda rs, x: np.where(_causal_ok(wl, rs), 0.0, x)))
        cm = triu
        if wl.dtype != F32:
            cm = Tensor("causal_mask", (1, nq, nk), wl.dtype, count_only=not numeric)
            L.append(copy_launch("causal_to_dtype", [(triu, cm, False, None)], tr, allocs=(cm,), frees=(triu,)))
        Sm = output(wl, "S_masked", nq, nk, wl.dtype, data)
        L.append(panel_launch("causal_add", wl, panel, [(S, _same, sc), (cm, _zero, sc)], [(Sm, sc)],
                              lambda g, rows, a: [a[0] + a[1]], TORCH_BROADCAST_ADD_LANE_OPS, allocs=(Sm,),
                              frees=(S, cm)))
        cur = Sm
    KPM = None
    if wl.key_padding_mask:
        KPM = _kpm(wl, data)
        inputs.append(KPM)
        T = cur

        def pad_block(ctx, index):
            g, rows = panel(index)
            yield from mask_panel(ctx, wl, data, T, g, rows, sc, None, KPM, -np.inf)
        L.append(Launch("mask_padding", g_count * panel.count, 0, pad_block))
    L.append(panel_launch("softmax", wl, panel, [(cur, _same, sc)], [(P, pc)], lambda g, r, a: [_softmax(a[0])],
                          torch_softmax_lane_ops(wl), allocs=(P,), exps=1, frees=(cur,)))
    P_used, DM = _dropout_fwd(wl, data, panel, L, P, wl.dtype)
    L.append(copy_launch("einsum_copy_v", [(V, Vr, False, None)], tr, allocs=(Vr,),
                         lane_ops=TORCH_STRIDED_COPY_LANE_OPS))
    L.append(gemm_launch("bmm_pv", P_used, Vr, O, False, gemm_tile, allocs=(O,)))
    outputs = {"O": O}
    if not training:
        return Program("pytorch_bench_forward", L, inputs=tuple(inputs), outputs=outputs)

    # ---- backward (autograd, reversing the forward) ----
    B = "backward"
    dropout = wl.dropout > 0
    dO = d_o_tensor(wl, data)
    dPd = output(wl, "dP_drop" if dropout else "dP", nq, nk, wl.dtype, data)
    dS = output(wl, "dS", nq, nk, wl.dtype, data)
    dQr = output(wl, "dQ_r", nq, d, wl.dtype, data)
    dKT = output(wl, "dK_T", d, nk, wl.dtype, data)
    dVr = output(wl, "dV_r", nk, d, wl.dtype, data)
    dQ, dK, dV = grad_tensor("dQ", Q, data), grad_tensor("dK", K, data), grad_tensor("dV", V, data)
    L += [gemm_launch("bmm_bwd_dp", dO, Vr, dPd, True, gemm_tile, allocs=(dO, dPd), pass_name=B),
          gemm_launch("bmm_bwd_dv", P_used, dO, dVr, False, gemm_tile, allocs=(dVr,), a_transposed=True, pass_name=B)]
    dP = _dropout_bwd(wl, data, panel, L, dPd, DM, wl.dtype)
    # softmax_backward_cuda_out (aten/src/ATen/native/cuda/SoftMax.cu): `tmp = grad * output`, its own
    # elementwise kernel, then host_softmax_backward(tmp, output): dS = tmp - P * rowsum(tmp)
    dPP = output(wl, "dP_P", nq, nk, wl.dtype, data)
    L.append(panel_launch("softmax_bwd_mul", wl, panel, [(dP, _same, sc), (P, _same, pc)], [(dPP, pc)],
                          lambda g, r, a: [a[0] * a[1]], 1, B, allocs=(dPP,), frees=(dP,)))
    L.append(panel_launch("softmax_bwd", wl, panel, [(dPP, _same, pc), (P, _same, pc)], [(dS, pc)],
                          lambda g, r, a: [a[0] - a[1] * a[0].sum(axis=1, keepdims=True)],
                          SOFTMAX_BWD_VECTOR_FLOPS - 1, B, allocs=(dS,), frees=(dPP, P)))
    if wl.key_padding_mask:
        def pad_bwd(ctx, index):
            g, rows = panel(index)
            yield from mask_panel(ctx, wl, data, dS, g, rows, pc, None, KPM, 0.0)
        L.append(Launch("mask_padding_bwd", g_count * panel.count, 0, pad_bwd, pass_name=B))
    L += [gemm_launch("baddbmm_bwd_dq", dS, KT, dQr, True, gemm_tile, allocs=(dQr,), pass_name=B),
          copy_launch("mul_alpha_dq", [(dQr, dQr, False, wl.softmax_scale)], tr, B),
          gemm_launch("baddbmm_bwd_dk", Qr, dS, dKT, False, gemm_tile, allocs=(dKT,), a_transposed=True,
                      frees=(dS,), pass_name=B),
          copy_launch("mul_alpha_dk", [(dKT, dKT, False, wl.softmax_scale)], tr, B),
          copy_launch("stack_qkv_grad", [(dQr, dQ, False, None), (dKT, dK, True, None), (dVr, dV, False, None)],
                      tr, B, allocs=(dQ, dK, dV), frees=(dQr, dKT, dVr), lane_ops=TORCH_CAT_COPY_LANE_OPS)]
    outputs.update(dQ=dQ, dK=dK, dV=dV)
    return Program("pytorch_bench_training", L, inputs=tuple(inputs), outputs=outputs)


def _dropout_fwd(wl, data, panel, L, P, dtype):
    """F.dropout / nn.Dropout with p > 0: read P, write P_drop and the 1-byte mask."""
    if wl.dropout <= 0:
        return P, None
    Pd = output(wl, "P_drop", wl.seq_len_q, wl.seq_len_kv, dtype, data)
    DM = output(wl, "dropout_mask", wl.seq_len_q, wl.seq_len_kv, MASK_DTYPE, data)
    keep = scaled_keep_mask(wl, data)
    pc = panel.p_chunks
    L.append(panel_launch("dropout", wl, panel, [(P, _same, pc)], [(Pd, pc), (DM, pc)],
                          lambda g, r, a: [a[0] * keep[g, r, :], (keep[g, r, :] > 0).astype(float)], 2,
                          allocs=(Pd, DM)))
    return Pd, DM


def _dropout_bwd(wl, data, panel, L, dPd, DM, dtype):
    """native_dropout_backward: read dP_drop and the mask, write dP."""
    if wl.dropout <= 0:
        return dPd
    dP = output(wl, "dP", wl.seq_len_q, wl.seq_len_kv, dtype, data)
    ks = 1.0 / (1.0 - wl.dropout)
    pc = panel.p_chunks
    sc = panel.s_chunks
    L.append(panel_launch("dropout_bwd", wl, panel, [(dPd, _same, sc), (DM, _same, pc)], [(dP, sc)],
                          lambda g, r, a: [a[0] * a[1] * ks], 2, "backward", allocs=(dP,), frees=(dPd, DM)))
    return dP


def pytorch_bench_forward(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return _pytorch_bench(wl, data, gemm_tile, False)


def pytorch_bench_training(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return _pytorch_bench(wl, data, gemm_tile, True)


# ---- attention_ref -------------------------------------------------------------------------------

def _attention_ref(wl: Workload, data: AttentionData | None, gemm_tile: tuple, training: bool) -> Program:
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    numeric = data is not None
    up = wl.dtype != F32            # .float() / .to(dtype_og) are no-ops for fp32
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    inputs = [Q, K, V] + [v for k, v in tensors.items() if k not in "QKV"]
    panel = panels_of(wl, gemm_tile)
    sc, pc = panel.s_chunks, panel.p_chunks
    tr = panel.rows
    L = []

    def f32(name, rows, cols):
        return output(wl, name, rows, cols, F32, data)

    if up:
        Q32, K32, V32 = f32("Q32", nq, d), f32("K32", nk, d), f32("V32", nk, d)
        L.append(copy_launch("upcast_q", [(Q, Q32, False, None)], tr, allocs=(Q32,)))
        L.append(copy_launch("upcast_k", [(K, K32, False, None)], tr, allocs=(K32,)))
        L.append(copy_launch("upcast_v", [(V, V32, False, None)], tr, allocs=(V32,)))
    else:
        Q32, K32, V32 = Q, K, V
    Krep, Vrep, Qs = f32("K_rep", nk, d), f32("V_rep", nk, d), f32("Q_scaled", nq, d)
    S, P = f32("S", nq, nk), f32("P", nq, nk)
    L += [copy_launch("repeat_k", [(K32, Krep, False, None)], tr, allocs=(Krep,)),
          copy_launch("repeat_v", [(V32, Vrep, False, None)], tr, allocs=(Vrep,)),
          copy_launch("scale_q", [(Q32, Qs, False, wl.softmax_scale)], tr, allocs=(Qs,)),
          gemm_launch("einsum_qk", Qs, Krep, S, True, gemm_tile, allocs=(S,))]
    KPM = CM = None
    if wl.key_padding_mask:
        KPM = _kpm(wl, data)
        inputs.append(KPM)

        def pad_block(ctx, index):
            g, rows = panel(index)
            yield from mask_panel(ctx, wl, data, S, g, rows, sc, None, KPM, -np.inf)
        L.append(Launch("mask_padding", g_count * panel.count, 0, pad_block))
    if wl.causal:
        ones = Tensor("causal_ones", (1, nq, nk), MASK_DTYPE, count_only=not numeric)
        CM = Tensor("causal_mask", (1, nq, nk), MASK_DTYPE, count_only=not numeric)
        L.append(fill_launch("causal_ones", ones, tr, lambda rs: np.ones((rs.stop - rs.start, nk))))
        L.append(panel_launch_1("causal_triu", wl, ones, CM, tr, lambda rs, x: np.where(_causal_ok(wl, rs), 0.0, x)))
        L.append(panel_launch("mask_causal", wl, panel, [(S, _same, sc), (CM, _zero, sc)], [(S, sc)],
                              lambda g, r, a: [np.where(a[1] > 0, -np.inf, a[0])], 1))
    L.append(panel_launch("softmax", wl, panel, [(S, _same, sc)], [(P, pc)], lambda g, r, a: [_softmax(a[0])],
                          SOFTMAX_VECTOR_FLOPS, allocs=(P,), exps=1, frees=(S,)))
    dropout = wl.dropout > 0
    P_used = P
    DMn = None
    if dropout:
        DM = Tensor("dropout_mask", (g_count, nq, nk), MASK_DTYPE,
                    None if not numeric else data.keep.reshape(g_count, nq, nk).astype(float), count_only=not numeric)
        inputs.append(DM)
        DMn = output(wl, "dropout_mask_not", nq, nk, MASK_DTYPE, data)
        P_used = f32("P_drop", nq, nk)
        L.append(panel_launch("not_dropout_mask", wl, panel, [(DM, _same, pc)], [(DMn, pc)],
                              lambda g, r, a: [1.0 - a[0]], 1, allocs=(DMn,)))
        L.append(panel_launch("dropout_masked_fill", wl, panel, [(P, _same, pc), (DMn, _same, pc)], [(P_used, pc)],
                              lambda g, r, a: [np.where(a[1] > 0, 0.0, a[0])], 1, allocs=(P_used,)))
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
        L.append(panel_launch("downcast_attention", wl, panel, [(P, _same, pc)], [(A, pc)], lambda g, r, a: [a[0]], 1,
                              allocs=(A,)))
    outputs = {"O": O}
    if not training:
        return Program("attention_ref_forward", L, inputs=tuple(inputs), outputs=outputs)

    B = "backward"
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
    L.append(copy_launch("scale_v_bwd", [(dVs, dVrep, False, ks)], tr, B, allocs=(dVrep,), frees=(dVs,)))
    dP = dPd
    if dropout:
        dP = f32("dP", nq, nk)
        L.append(panel_launch("dropout_masked_fill_bwd", wl, panel, [(dPd, _same, sc), (DMn, _same, pc)], [(dP, sc)],
                              lambda g, r, a: [np.where(a[1] > 0, 0.0, a[0])], 1, B, allocs=(dP,), frees=(dPd, DMn)))
    dS = f32("dS", nq, nk)
    L.append(panel_launch("softmax_bwd", wl, panel, [(dP, _same, sc), (P, _same, pc)], [(dS, pc)],
                          lambda g, r, a: [_softmax_bwd(a[0], a[1])], SOFTMAX_BWD_VECTOR_FLOPS, B,
                          allocs=(dS,), frees=(dP,)))
    if wl.causal:
        L.append(panel_launch("mask_causal_bwd", wl, panel, [(dS, _same, pc), (CM, _zero, pc)], [(dS, pc)],
                              lambda g, r, a: [np.where(a[1] > 0, 0.0, a[0])], 1, B))
    if wl.key_padding_mask:
        def pad_bwd(ctx, index):
            g, rows = panel(index)
            yield from mask_panel(ctx, wl, data, dS, g, rows, pc, None, KPM, 0.0)
        L.append(Launch("mask_padding_bwd", g_count * panel.count, 0, pad_bwd, pass_name=B))
    dQs = f32("dQ_scaled", nq, d)
    dKrep = f32("dK_rep", nk, d) if up else grad_tensor("dK", K, data)
    dQ32 = f32("dQ32", nq, d) if up else grad_tensor("dQ", Q, data)
    L += [gemm_launch("einsum_qk_bwd_dq", dS, Krep, dQs, False, gemm_tile, allocs=(dQs,), pass_name=B),
          gemm_launch("einsum_qk_bwd_dk", dS, Qs, dKrep, False, gemm_tile, allocs=(dKrep,), a_transposed=True,
                      frees=(dS,), pass_name=B),
          copy_launch("scale_q_bwd", [(dQs, dQ32, False, wl.softmax_scale)], tr, B, allocs=(dQ32,), frees=(dQs,))]
    if up:
        dQ, dK, dV = grad_tensor("dQ", Q, data), grad_tensor("dK", K, data), grad_tensor("dV", V, data)
        L += [copy_launch("float_bwd_q", [(dQ32, dQ, False, None)], tr, B, allocs=(dQ,)),
              copy_launch("float_bwd_k", [(dKrep, dK, False, None)], tr, B, allocs=(dK,)),
              copy_launch("float_bwd_v", [(dVrep, dV, False, None)], tr, B, allocs=(dV,))]
    else:
        dQ, dK, dV = dQ32, dKrep, dVrep
    outputs.update(dQ=dQ, dK=dK, dV=dV)
    return Program("attention_ref_training", L, inputs=tuple(inputs), outputs=outputs)


def panel_launch_1(name, wl, src, dst, tile_rows, fn, pass_name="forward") -> Launch:
    """A (1, R, C) -> (1, R, C) elementwise kernel in row panels with a numeric fn(rows, x)."""
    _, r, c = src.shape
    rows = min(tile_rows, r)

    def block(ctx, index):
        rs = slice(index * rows, min(r, (index + 1) * rows))
        x = yield from ctx.load(src[0], rs, slice(0, c))
        yield from ctx.compute(vector_flops=(rs.stop - rs.start) * c)
        yield from ctx.store(dst[0], rs, slice(0, c), None if x is None else fn(rs, x))
    return Launch(name, math.ceil(r / rows), 0, block, (dst,), (), pass_name)


def attention_ref_forward(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return _attention_ref(wl, data, gemm_tile, False)


def attention_ref_training(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return _attention_ref(wl, data, gemm_tile, True)


# ---- megatron ------------------------------------------------------------------------------------

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


def _megatron(wl: Workload, data: AttentionData | None, gemm_tile: tuple, training: bool) -> Program:
    nq, nk, d = wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    numeric = data is not None
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    inputs = [Q, K, V] + [v for k, v in tensors.items() if k not in "QKV"]
    panel = panels_of(wl, gemm_tile)
    sc, pc = panel.s_chunks, panel.p_chunks
    tr = panel.rows
    fused = megatron_fused_applies(wl)
    tri = fused and wl.causal and not wl.key_padding_mask      # ScaledUpperTriangMaskedSoftmax
    S = output(wl, "S", nq, nk, wl.dtype, data)
    P = output(wl, "P", nq, nk, wl.dtype, data)
    ctxt = output(wl, "context", nq, d, wl.dtype, data)
    O = output(wl, "O", nq, d, wl.dtype, data)
    L = [gemm_launch("baddbmm", Q, K, S, True, gemm_tile, scale=wl.softmax_scale, allocs=(S,))]
    AM = None
    if wl.masked and not tri:
        # bool/uint8 mask [b (or 1 for causal only), 1, sq, sk]: 1 = masked; read for every head
        pad_groups = wl.batch if wl.key_padding_mask else 1
        AM = Tensor("attention_mask", (pad_groups, nq, nk), MASK_DTYPE, count_only=not numeric)
        inputs.append(AM)
        if numeric:
            for b in range(pad_groups):
                AM.data[b] = ~_ok(wl, data, b * wl.heads, slice(0, nq))
    heads = wl.heads

    def am_group(g):
        return g // heads if AM.shape[0] > 1 else 0

    if tri:
        L.append(_upper_triang_fwd(wl, panel, S, P))
    elif fused:
        reads = [(S, _same, sc)] + ([(AM, am_group, sc)] if AM is not None else [])
        L.append(panel_launch("scaled_masked_softmax" if AM is not None else "scaled_softmax", wl, panel, reads,
                              [(P, pc)],
                              lambda g, r, a: [_softmax(np.where(a[1] > 0, -np.inf, a[0]) if len(a) > 1 else a[0])],
                              SOFTMAX_VECTOR_FLOPS + 1, allocs=(P,), frees=(S,), exps=1))
    else:
        if AM is not None:
            L.append(panel_launch("mask_fill", wl, panel, [(S, _same, sc), (AM, am_group, sc)], [(S, sc)],
                                  lambda g, r, a: [np.where(a[1] > 0, -np.inf, a[0])], 1))
        L.append(panel_launch("softmax", wl, panel, [(S, _same, sc)], [(P, pc)], lambda g, r, a: [_softmax(a[0])],
                              SOFTMAX_VECTOR_FLOPS, allocs=(P,), exps=1, frees=(S,)))
    P_used, DM = _dropout_fwd(wl, data, panel, L, P, wl.dtype)
    L.append(gemm_launch("bmm_pv", P_used, V, ctxt, False, gemm_tile, allocs=(ctxt,)))
    L.append(copy_launch("context_contiguous", [(ctxt, O, False, None)], tr, allocs=(O,), frees=(ctxt,)))
    outputs = {"O": O}
    if not training:
        return Program("megatron_forward", L, inputs=tuple(inputs), outputs=outputs)

    B = "backward"
    dropout = wl.dropout > 0
    dO = d_o_tensor(wl, data)
    dPd = output(wl, "dP_drop" if dropout else "dP", nq, nk, wl.dtype, data)
    dQ, dK, dV = grad_tensor("dQ", Q, data), grad_tensor("dK", K, data), grad_tensor("dV", V, data)
    L += [gemm_launch("bmm_bwd_dp", dO, V, dPd, True, gemm_tile, allocs=(dO, dPd), pass_name=B),
          gemm_launch("bmm_bwd_dv", P_used, dO, dV, False, gemm_tile, allocs=(dV,), a_transposed=True, pass_name=B)]
    dP = _dropout_bwd(wl, data, panel, L, dPd, DM, wl.dtype)
    if tri:
        L.append(_upper_triang_bwd(wl, panel, dP, P))
        dS = dP                                         # in place: dS overwrites dP
    else:
        dS = output(wl, "dS", nq, nk, wl.dtype, data)
        name = ("scaled_masked_softmax_bwd" if AM is not None else "scaled_softmax_bwd") if fused else "softmax_bwd"
        L.append(panel_launch(name, wl, panel, [(dP, _same, sc), (P, _same, pc)], [(dS, pc)],
                              lambda g, r, a: [_softmax_bwd(a[0], a[1])], SOFTMAX_BWD_VECTOR_FLOPS, B,
                              allocs=(dS,), frees=(dP, P)))
        if not fused and AM is not None:
            L.append(panel_launch("mask_fill_bwd", wl, panel, [(dS, _same, pc), (AM, am_group, pc)], [(dS, pc)],
                                  lambda g, r, a: [np.where(a[1] > 0, 0.0, a[0])], 1, B))
    L += [gemm_launch("baddbmm_bwd_dq", dS, K, dQ, False, gemm_tile, allocs=(dQ,), pass_name=B),
          copy_launch("mul_alpha_dq", [(dQ, dQ, False, wl.softmax_scale)], tr, B),
          gemm_launch("baddbmm_bwd_dk", dS, Q, dK, False, gemm_tile, allocs=(dK,), a_transposed=True,
                      frees=(dS,), pass_name=B),
          copy_launch("mul_alpha_dk", [(dK, dK, False, wl.softmax_scale)], tr, B)]
    outputs.update(dQ=dQ, dK=dK, dV=dV)
    return Program("megatron_training", L, inputs=tuple(inputs), outputs=outputs)


def _upper_triang_fwd(wl, panel, S, P) -> Launch:
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
                p[j, :s.shape[1]] = _softmax(s)[0]
        yield from store_panel(ctx, P, g, rows, panel.p_chunks, p)
    return Launch("scaled_upper_triang_masked_softmax", wl.groups * panel.count, 0, block, (P,), (S,))


def _upper_triang_bwd(wl, panel, dP, P) -> Launch:
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
                ds[j, :dp.shape[1]] = _softmax_bwd(dp, p)[0]
        yield from store_panel(ctx, dP, g, rows, panel.s_chunks, ds)
    return Launch("scaled_upper_triang_masked_softmax_bwd", wl.groups * panel.count, 0, block, (), (P,), "backward")


def megatron_forward(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return _megatron(wl, data, gemm_tile, False)


def megatron_training(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE) -> Program:
    return _megatron(wl, data, gemm_tile, True)
