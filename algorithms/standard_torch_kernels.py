"""PyTorch's elementwise and row-wise kernels as simulated launches: what the published baselines
of standard attention (standard_pytorch_bench.py, standard_attention_ref.py, standard_megatron.py)
are built of, besides standard_kernels.py's GEMM and row panels.

Numerics: everything is computed in float64 (fp32 copies are only bytes). Additive -1e4 masks and
masked_fill(-1e4) are computed as -inf, so masked entries (and fully masked rows) get exactly 0
probability as in the float64 reference; their bytes are counted as the kernels move them.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import Launch, Tensor
from hbmsim.simulator.tensor import GATHER
from hbmsim.simulator.time_model import FP32, INSTRUCTIONS

from .common import MASK_DTYPE, output, scaled_keep_mask
from .standard_kernels import Panels, mask_panel
from .workload import AttentionData, Workload, allowed

F32 = "fp32"


# ---- which slice of a read tensor a batch-head reads (panel_launch's group_of) ----------------------

def own_group(g: int) -> int:
    """Batch-head g reads its own slice."""
    return g


def broadcast_group(g: int) -> int:
    """A (1, R, C) tensor, broadcast over batch and heads: every batch-head reads its one slice."""
    return 0


# ---- row numerics -----------------------------------------------------------------------------------

def softmax_rows(s):
    """Row softmax; a fully masked (all -inf) row gives zeros."""
    mx = s.max(axis=1, keepdims=True)
    ex = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
    tot = ex.sum(axis=1, keepdims=True)
    return np.divide(ex, tot, out=np.zeros_like(ex), where=tot > 0)


def softmax_rows_backward(dp, p):
    """dS = P * (dP - rowsum(dP * P))."""
    return p * (dp - (dp * p).sum(axis=1, keepdims=True))


def causal_allowed(wl: Workload, rows: slice):
    """Where rows x all keys may attend under the causal mask alone (bottom-right aligned)."""
    causal = Workload(1, 1, wl.seq_len_q, wl.seq_len_kv, 1, causal=True)
    return allowed(causal, None, rows.start, rows.stop, 0, wl.seq_len_kv)


def key_padding_mask_tensor(wl: Workload, data: AttentionData | None) -> Tensor:
    """The (batch, 1, Nkv) bool key padding mask, filled in numeric mode."""
    KPM = Tensor("key_padding_mask", (wl.batch, 1, wl.seq_len_kv), MASK_DTYPE, count_only=data is None)
    if data is not None:
        KPM.data[:, 0, :] = np.arange(wl.seq_len_kv)[None, :] < data.kv_lens[:, None]
    return KPM


# ---- generic kernels --------------------------------------------------------------------------------

def copy_launch(name: str, pairs: list, tile_rows: int, pass_name: str = "forward", allocs=(), frees=(),
                lane_ops: float = 1, instructions: bool = False) -> Launch:
    """One elementwise kernel over (G, R, C) tensors: for each (src, dst, transpose, factor) it reads
    src in row panels of min(tile_rows, R) full rows and writes factor * src (transposed into a
    (G, C, R) dst when asked). A dtype change is only the dst's itemsize. `lane_ops`: the vector
    operations the kernel issues per element (1; a strided PyTorch copy:
    standard_pytorch_bench.TORCH_STRIDED_COPY_LANE_OPS); `instructions`: they are a measured
    instruction count, issued at the warp schedulers' rate (Launch.vector_work).
    A wide tensor (fewer rows than columns: K^T's (d, N)) is read in square tiles of that many rows
    and columns instead: its full rows would make a few huge tiles, so a few blocks would do the
    whole copy, where the kernel (elementwise, a thread per few elements) spreads it over every SM.
    The tiles are only the simulation's unit of work: the bytes are the tensor's either way.
    A transposing copy reads its source under tensor.GATHER: the kernel walks its output
    contiguously, so a warp's 32 output elements are 32 source rows, each its own 32-byte sector
    request at the L2 (the L2 side moves 16x an fp16 tensor's bytes; DRAM once)."""
    jobs = []
    for src, dst, transpose, factor in pairs:
        g_count, r, c = src.shape
        rows = min(tile_rows, r)
        width = rows if c > r else c
        for g in range(g_count):
            for r0 in range(0, r, rows):
                for c0 in range(0, c, width):
                    jobs.append((src, dst, transpose, factor, g, slice(r0, min(r, r0 + rows)),
                                 slice(c0, min(c, c0 + width))))

    def block(ctx, index):
        src, dst, transpose, factor, g, rows, cols = jobs[index]
        x = yield from ctx.load(src[g], rows, cols, GATHER if transpose else None)
        yield from ctx.compute(vector_flops=round(lane_ops * (rows.stop - rows.start) * (cols.stop - cols.start)))
        if x is not None and factor is not None:
            x = factor * x
        if transpose:
            yield from ctx.store(dst[g], cols, rows, None if x is None else x.T)
        else:
            yield from ctx.store(dst[g], rows, cols, x)
    # (a copy into a tensor every batch-head shares is itself shared: program.slice_shared)
    return Launch(name, len(jobs), 0, block, allocs, frees, pass_name, shared=all(p[1].shared for p in pairs),
                  vector_work=INSTRUCTIONS if instructions else FP32)


def panel_launch(name: str, wl: Workload, panel: Panels, reads: list, writes: list, fn, flops: int,
                 pass_name: str = "forward", allocs=(), frees=(), exps: int = 0, instructions: bool = False) -> Launch:
    """An elementwise / row-wise kernel over N x N matrices in standard_kernels.py's row panels;
    `flops` vector operations per element (with `instructions`, a measured instruction count x 32
    lanes, issued at the warp schedulers' rate: Launch.vector_work), `exps` of them exps (softmax: 1).
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
    return Launch(name, wl.groups * panel.count, 0, block, allocs, frees, pass_name,
                  vector_work=INSTRUCTIONS if instructions else FP32)


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
    return Launch(name, g_count * per, 0, block, (T,), (), pass_name, shared=T.shared)


def causal_triu_launch(wl: Workload, src: Tensor, dst: Tensor, tile_rows: int) -> Launch:
    """torch.triu of the broadcast (1, Nq, Nkv) mask matrix, in row panels: where the causal mask
    allows a key the result is 0, above the diagonal it keeps src (1, or -1e4 computed as -inf)."""
    _, r, c = src.shape
    rows = min(tile_rows, r)

    def block(ctx, index):
        rs = slice(index * rows, min(r, (index + 1) * rows))
        x = yield from ctx.load(src[0], rs, slice(0, c))
        yield from ctx.compute(vector_flops=(rs.stop - rs.start) * c)
        yield from ctx.store(dst[0], rs, slice(0, c), None if x is None else np.where(causal_allowed(wl, rs), 0.0, x))
    return Launch("causal_triu", math.ceil(r / rows), 0, block, (dst,), (), "forward", shared=dst.shared)


def padding_fill_launch(name: str, wl: Workload, data: AttentionData | None, panel: Panels, T: Tensor,
                        chunks: list, KPM: Tensor, fill: float, pass_name: str = "forward") -> Launch:
    """masked_fill of T (in place) with the key_padding_mask row: `fill` (-inf forward, 0 backward)."""
    def block(ctx, index):
        g, rows = panel(index)
        yield from mask_panel(ctx, wl, data, T, g, rows, chunks, None, KPM, fill)
    return Launch(name, wl.groups * panel.count, 0, block, pass_name=pass_name)


# ---- dropout ----------------------------------------------------------------------------------------

def add_dropout(wl: Workload, data: AttentionData | None, panel: Panels, launches: list, P: Tensor, dtype: str):
    """F.dropout / nn.Dropout with p > 0: read P, write P_drop and the 1-byte mask (appended to
    `launches`). Returns (P_drop, mask), or (P, None) without dropout."""
    if wl.dropout <= 0:
        return P, None
    Pd = output(wl, "P_drop", wl.seq_len_q, wl.seq_len_kv, dtype, data)
    DM = output(wl, "dropout_mask", wl.seq_len_q, wl.seq_len_kv, MASK_DTYPE, data)
    keep = scaled_keep_mask(wl, data)
    pc = panel.p_chunks
    launches.append(panel_launch("dropout", wl, panel, [(P, own_group, pc)], [(Pd, pc), (DM, pc)],
                                 lambda g, r, a: [a[0] * keep[g, r, :], (keep[g, r, :] > 0).astype(float)], 2,
                                 allocs=(Pd, DM)))
    return Pd, DM


def add_dropout_backward(wl: Workload, data: AttentionData | None, panel: Panels, launches: list, dPd: Tensor,
                         DM: Tensor, dtype: str) -> Tensor:
    """native_dropout_backward: read dP_drop and the mask, write dP (appended to `launches`).
    Returns dP (dPd itself without dropout)."""
    if wl.dropout <= 0:
        return dPd
    dP = output(wl, "dP", wl.seq_len_q, wl.seq_len_kv, dtype, data)
    ks = 1.0 / (1.0 - wl.dropout)
    pc, sc = panel.p_chunks, panel.s_chunks
    launches.append(panel_launch("dropout_bwd", wl, panel, [(dPd, own_group, sc), (DM, own_group, pc)], [(dP, sc)],
                                 lambda g, r, a: [a[0] * a[1] * ks], 2, "backward", allocs=(dP,), frees=(dPd, DM)))
    return dP
