"""Closed-form traffic of the standard-attention variants (standard_pytorch_bench.py,
standard_attention_ref.py, standard_megatron.py; spec8 sections 3 and 4), derived on paper:
{tensor: (bytes read, bytes written)}.

Notation as in io_formulas: G = batch*heads, e = storage itemsize, NN = G*Nq*Nk (elements of an
N x N matrix over all heads), N1 = Nq*Nk (one broadcast mask), QD = G*Nq*d, KD = G*Nk*d.
Elementwise kernels touch every element of what they read and write exactly once (tiles are
clipped to the tensor), so their bytes do not depend on the tiling, except the key padding row,
re-read once per row panel (elementwise_panels). Tiled GEMMs cost gemm_io. Broadcast masks are read
once per (batch, head): G*N1 bytes.
"""
from __future__ import annotations

from hbmsim.simulator import DTYPE_BYTES
from hbmsim.simulator.tensor import SECTOR_BYTES

from .common import MASK_DTYPE
from .io_formulas import _add, elementwise_panels, gemm_io
from .workload import Workload, causal_kv_end

MASK = DTYPE_BYTES[MASK_DTYPE]
F32 = DTYPE_BYTES["fp32"]


def _dims(wl: Workload):
    g, nq, nk, d, e = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.itemsize
    return g, nq, nk, d, e, g * nq * nk, nq * nk, g * nq * d, g * nk * d


def _gemm(io, g, m, n, k, e, tile, a, b, c):
    """C[m, n] = A[m, k] B[k, n]: A re-read per column tile, B per row tile, C written once."""
    ra, rb, wc = gemm_io(g, m, n, k, e, tile)
    _add(io, a, read=ra)
    _add(io, b, read=rb)
    _add(io, c, write=wc)


def _copy(io, src, dst, nbytes_src, nbytes_dst):
    """An elementwise kernel reads every element of src once and writes dst once."""
    _add(io, src, read=nbytes_src)
    _add(io, dst, write=nbytes_dst)


def _gathered(elements: int, e: int) -> int:
    """L2-side bytes of a transposing copy's source: each element its own 32-byte sector request
    (tensor.GATHER: the copy walks its output contiguously, so a warp's 32 elements are 32 source
    rows, each at least a sector apart). DRAM still moves the elements' own bytes once."""
    return elements * SECTOR_BYTES * -(-e // SECTOR_BYTES)


# ---- pytorch_bench (spec 3.1) ---------------------------------------------------------------------

def pytorch_bench_forward_io(wl: Workload, gemm_tile: tuple = (128, 128, 128)) -> dict:
    g, nq, nk, d, e, nn, n1, qd, kd = _dims(wl)
    io: dict = {}
    _copy(io, "Q", "Q_r", qd * e, qd * e)                      # rearrange q: (b h) cannot merge -> copy
    _copy(io, "K", "K_T", _gathered(kd, e), kd * e)            # rearrange k to (bh, d, N): K^T copy
    _gemm(io, g, nq, nk, d, e, gemm_tile, "Q_r", "K_T", "S")   # baddbmm, beta=0: buffer never read
    cur = "S"
    if wl.causal:
        _add(io, "mask_full", write=n1 * F32)                  # torch.full((N,N), -1e4): fp32
        _copy(io, "mask_full", "mask_triu", n1 * F32, n1 * F32)   # torch.triu(.., 1), out of place
        cm = "mask_triu"
        if wl.dtype != "fp32":                                 # .to(fp16): no-op when already fp32
            _copy(io, "mask_triu", "causal_mask", n1 * F32, n1 * e)
            cm = "causal_mask"
        _add(io, "S", read=nn * e)                             # scores + mask: new S_masked,
        _add(io, cm, read=g * n1 * e)                          # the mask broadcast, read per (b, h)
        _add(io, "S_masked", write=nn * e)
        cur = "S_masked"
    if wl.key_padding_mask:                                    # masked_fill with the padding row
        _add(io, cur, read=nn * e, write=nn * e)
        _add(io, "key_padding_mask", read=g * elementwise_panels(wl, gemm_tile) * nk * MASK)
    _copy(io, cur, "P", nn * e, nn * e)                        # softmax: fp16 in, fp16 out
    p_used = "P"
    if wl.dropout > 0:                                         # dropout: P -> P_drop + 1-byte mask
        p_used = "P_drop"
        _copy(io, "P", "P_drop", nn * e, nn * e)
        _add(io, "dropout_mask", write=nn * MASK)
    _copy(io, "V", "V_r", kd * e, kd * e)                      # einsum: v permute+reshape copy
    _gemm(io, g, nq, d, nk, e, gemm_tile, p_used, "V_r", "O")  # bmm; the output permute is a view
    return io


def pytorch_bench_backward_io(wl: Workload, gemm_tile: tuple = (128, 128, 128)) -> dict:
    g, nq, nk, d, e, nn, n1, qd, kd = _dims(wl)
    dropout = wl.dropout > 0
    p_used, d_pd = ("P_drop", "dP_drop") if dropout else ("P", "dP")
    io: dict = {}
    _gemm(io, g, nq, nk, d, e, gemm_tile, "dO", "V_r", d_pd)     # bmm bwd: dPd = dO V_r^T
    _gemm(io, g, nk, d, nq, e, gemm_tile, p_used, "dO", "dV_r")  # bmm bwd: dV_r = Pd^T dO
    if dropout:                                                 # native_dropout_backward
        _add(io, "dP_drop", read=nn * e)
        _add(io, "dropout_mask", read=nn * MASK)
        _add(io, "dP", write=nn * e)
    _add(io, "dP", read=nn * e)                                 # softmax backward, first tmp = dP * P
    _add(io, "P", read=nn * e)
    _add(io, "dP_P", write=nn * e)
    _add(io, "dP_P", read=nn * e)                               # then dS = tmp - P * rowsum(tmp)
    _add(io, "P", read=nn * e)
    _add(io, "dS", write=nn * e)                                # (causal add: pass-through, no kernel)
    if wl.key_padding_mask:                                     # masked_fill backward, in place
        _add(io, "dS", read=nn * e, write=nn * e)
        _add(io, "key_padding_mask", read=g * elementwise_panels(wl, gemm_tile) * nk * MASK)
    _gemm(io, g, nq, d, nk, e, gemm_tile, "dS", "K_T", "dQ_r")   # baddbmm bwd: dS K_T^T
    _add(io, "dQ_r", read=qd * e, write=qd * e)                 # ... then x alpha, elementwise
    _gemm(io, g, d, nk, nq, e, gemm_tile, "Q_r", "dS", "dK_T")   # Q_r^T dS: (d x Nk)
    _add(io, "dK_T", read=kd * e, write=kd * e)                 # ... then x alpha
    for src, dst, n in (("dQ_r", "dQ", qd), ("dV_r", "dV", kd)):
        _copy(io, src, dst, n * e, n * e)                       # unbind bwd: stack into qkv.grad,
    _copy(io, "dK_T", "dK", _gathered(kd, e), kd * e)           # dK_T's part transposed back
    return io


# ---- attention_ref (spec 3.2) ---------------------------------------------------------------------

def attention_ref_forward_io(wl: Workload, gemm_tile: tuple = (128, 128, 128)) -> dict:
    g, nq, nk, d, e, nn, n1, qd, kd = _dims(wl)
    up = wl.dtype != "fp32"
    kvd = wl.kv_groups * nk * d                                 # elements of K (of V) before the repeat
    io: dict = {}
    q32, k32, v32 = ("Q32", "K32", "V32") if up else ("Q", "K", "V")
    if up:                                                      # .float(): read e, write 4 bytes
        for src, dst, n in (("Q", q32, qd), ("K", k32, kvd), ("V", v32, kvd)):
            _copy(io, src, dst, n * e, n * F32)
    # einops.repeat copies (spec: even g=1); with kv_heads < heads each copy reads the shared head
    _copy(io, k32, "K_rep", kd * F32, kd * F32)
    _copy(io, v32, "V_rep", kd * F32, kd * F32)
    _copy(io, q32, "Q_scaled", qd * F32, qd * F32)              # q / sqrt(d)
    _gemm(io, g, nq, nk, d, F32, gemm_tile, "Q_scaled", "K_rep", "S")   # einsum in fp32
    if wl.key_padding_mask:                                     # masked_fill_(-inf), padding row
        _add(io, "S", read=nn * F32, write=nn * F32)
        _add(io, "key_padding_mask", read=g * elementwise_panels(wl, gemm_tile) * nk * MASK)
    if wl.causal:
        _add(io, "causal_ones", write=n1 * MASK)                # torch.ones(bool)
        _copy(io, "causal_ones", "causal_mask", n1 * MASK, n1 * MASK)   # triu(.., 1)
        _add(io, "S", read=nn * F32, write=nn * F32)            # masked_fill_(-inf), mask per (b, h)
        _add(io, "causal_mask", read=g * n1 * MASK)
    _copy(io, "S", "P", nn * F32, nn * F32)                     # softmax in fp32
    p_used = "P"
    if wl.dropout > 0:
        p_used = "P_drop"
        _copy(io, "dropout_mask", "dropout_mask_not", nn * MASK, nn * MASK)   # ~dropout_mask
        _add(io, "P", read=nn * F32)                            # masked_fill(~mask, 0)
        _add(io, "dropout_mask_not", read=nn * MASK)
        _add(io, "P_drop", write=nn * F32)
    _copy(io, "V_rep", "V_dropscaled", kd * F32, kd * F32)      # v * 1/(1-p): runs even for p = 0
    o32 = "O32" if up else "O"
    _gemm(io, g, nq, d, nk, F32, gemm_tile, p_used, "V_dropscaled", o32)
    if up:                                                      # .to(dtype_og) of O and attention
        _copy(io, "O32", "O", qd * F32, qd * e)
        _copy(io, "P", "attention", nn * F32, nn * e)
    return io


def attention_ref_backward_io(wl: Workload, gemm_tile: tuple = (128, 128, 128)) -> dict:
    g, nq, nk, d, e, nn, n1, qd, kd = _dims(wl)
    up = wl.dtype != "fp32"
    gqa = wl.group_size > 1
    kvd = wl.kv_groups * nk * d
    dropout = wl.dropout > 0
    p_used, d_pd = ("P_drop", "dP_drop") if dropout else ("P", "dP")
    io: dict = {}
    do32 = "dO32" if up else "dO"
    if up:
        _copy(io, "dO", "dO32", qd * e, qd * F32)               # .to backward: grad to fp32
    _gemm(io, g, nq, nk, d, F32, gemm_tile, do32, "V_dropscaled", d_pd)      # einsum bwd
    _gemm(io, g, nk, d, nq, F32, gemm_tile, p_used, do32, "dV_dropscaled")
    _copy(io, "dV_dropscaled", "dV_rep" if up or gqa else "dV", kd * F32, kd * F32)  # mul bwd: x 1/(1-p)
    if dropout:                                                 # masked_fill bwd: zero dropped
        _add(io, "dP_drop", read=nn * F32)
        _add(io, "dropout_mask_not", read=nn * MASK)
        _add(io, "dP", write=nn * F32)
    _add(io, "dP", read=nn * F32)                               # softmax backward
    _add(io, "P", read=nn * F32)
    _add(io, "dS", write=nn * F32)
    if wl.causal:                                               # masked_fill_ bwd (causal first)
        _add(io, "dS", read=nn * F32, write=nn * F32)
        _add(io, "causal_mask", read=g * n1 * MASK)
    if wl.key_padding_mask:
        _add(io, "dS", read=nn * F32, write=nn * F32)
        _add(io, "key_padding_mask", read=g * elementwise_panels(wl, gemm_tile) * nk * MASK)
    _gemm(io, g, nq, d, nk, F32, gemm_tile, "dS", "K_rep", "dQ_scaled")      # einsum bwd
    _gemm(io, g, nk, d, nq, F32, gemm_tile, "dS", "Q_scaled", "dK_rep" if up or gqa else "dK")
    _copy(io, "dQ_scaled", "dQ32" if up else "dQ", qd * F32, qd * F32)      # div bwd: x scale
    if gqa:                                                     # repeat bwd: the sum over each group
        for name in ("dK", "dV"):
            _copy(io, name + "_rep", name + "32" if up else name, kd * F32, kvd * F32)
    if up:                                                      # .float() bwd: back to e bytes
        kv_src = ("dK32", "dV32") if gqa else ("dK_rep", "dV_rep")
        for src, dst, n in (("dQ32", "dQ", qd), (kv_src[0], "dK", kvd), (kv_src[1], "dV", kvd)):
            _copy(io, src, dst, n * F32, n * e)
    return io


# ---- megatron (spec 4) ----------------------------------------------------------------------------

def megatron_kernel_available(wl: Workload) -> bool:
    """is_kernel_available (fused_softmax.py@040eac9414:152-172), fusion on; batch_per_block is
    8 for sk <= 128, else 4; the causal kernel needs sq == sk."""
    nq, nk, g = wl.seq_len_q, wl.seq_len_kv, wl.groups
    if wl.dtype == "fp32" or not 16 < nk <= 4096 or nq % 4 or nk % 4 or g % 4:
        return False
    bpb = 8 if nk <= 128 else 4
    if wl.causal and not wl.key_padding_mask:
        return g % bpb == 0 and nq == nk
    return nq % bpb == 0


def _lower_triangle(wl: Workload) -> int:
    """Elements j <= i over all rows of one head (sq == sk): row i reads causal_kv_end(i+1) = i+1."""
    return sum(causal_kv_end(wl, i + 1) for i in range(wl.seq_len_q))


def megatron_forward_io(wl: Workload, gemm_tile: tuple = (128, 128, 128)) -> dict:
    g, nq, nk, d, e, nn, n1, qd, kd = _dims(wl)
    fused = megatron_kernel_available(wl)
    tri = fused and wl.causal and not wl.key_padding_mask
    io: dict = {}
    _gemm(io, g, nq, nk, d, e, gemm_tile, "Q", "K", "S")        # baddbmm on strided views, no copies
    if tri:                                                     # upper-triang kernel: mask generated,
        _add(io, "S", read=g * _lower_triangle(wl) * e)         # only j <= i read, full P row written
        _add(io, "P", write=nn * e)
    else:
        if wl.masked and not fused:                             # fallback: masked_fill_(-1e4) in place
            _add(io, "S", read=nn * e, write=nn * e)
        if wl.masked:                                           # uint8/bool [b or 1, sq, sk] per head
            _add(io, "attention_mask", read=nn * MASK)
        _copy(io, "S", "P", nn * e, nn * e)                     # fused kernel or torch softmax
    p_used = "P"
    if wl.dropout > 0:
        p_used = "P_drop"
        _copy(io, "P", "P_drop", nn * e, nn * e)
        _add(io, "dropout_mask", write=nn * MASK)
    _gemm(io, g, nq, d, nk, e, gemm_tile, p_used, "V", "context")   # bmm with v.transpose: no copy
    _copy(io, "context", "O", qd * e, qd * e)                   # permute(2,0,1,3).contiguous()
    return io


def megatron_backward_io(wl: Workload, gemm_tile: tuple = (128, 128, 128)) -> dict:
    g, nq, nk, d, e, nn, n1, qd, kd = _dims(wl)
    fused = megatron_kernel_available(wl)
    tri = fused and wl.causal and not wl.key_padding_mask
    dropout = wl.dropout > 0
    p_used, d_pd = ("P_drop", "dP_drop") if dropout else ("P", "dP")
    io: dict = {}
    _gemm(io, g, nq, nk, d, e, gemm_tile, "dO", "V", d_pd)      # bmm bwd (contiguous bwd: identity)
    _gemm(io, g, nk, d, nq, e, gemm_tile, p_used, "dO", "dV")
    if dropout:
        _add(io, "dP_drop", read=nn * e)
        _add(io, "dropout_mask", read=nn * MASK)
        _add(io, "dP", write=nn * e)
    ds = "dS"
    if tri:                                                     # reads j <= i of dP and P, writes the
        _add(io, "dP", read=g * _lower_triangle(wl) * e, write=nn * e)   # full row in place into dP
        _add(io, "P", read=g * _lower_triangle(wl) * e)
        ds = "dP"
    else:                                                       # new dS (fused masked / torch)
        _add(io, "dP", read=nn * e)
        _add(io, "P", read=nn * e)
        _add(io, "dS", write=nn * e)
        if wl.masked and not fused:                             # masked_fill_ backward
            _add(io, "dS", read=nn * e, write=nn * e)
            _add(io, "attention_mask", read=nn * MASK)
    _gemm(io, g, nq, d, nk, e, gemm_tile, ds, "K", "dQ")        # baddbmm bwd, then x alpha
    _add(io, "dQ", read=qd * e, write=qd * e)
    _gemm(io, g, nk, d, nq, e, gemm_tile, ds, "Q", "dK")
    _add(io, "dK", read=kd * e, write=kd * e)
    return io
