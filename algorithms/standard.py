"""Standard attention forward as PyTorch runs it: every intermediate goes through HBM.

Kernels, in order (each a separate launch, as in eager PyTorch):
  gemm_qk   S = Q K^T            tiled GEMM (tile_m x tile_n outputs, tile_k steps), writes S
  scale     S = scale * S        elementwise: reads S, writes S
  mask      S = S masked         (causal and/or key padding on) reads S and the bool mask(s)
  softmax   P = softmax(S)       row-wise: reads S, writes P; fully masked rows give 0
  dropout   Pd = P * keep/(1-p)  (dropout > 0) reads P, writes P_drop and the 1-byte keep mask
  gemm_pv   O = Pd V             tiled GEMM, writes O
Elementwise and row-wise kernels work on panels of tile_m full rows and stream through
registers (no shared memory). They touch S in the tile_m x tile_n tiles gemm_qk wrote, and P in
the tile_m x tile_k tiles gemm_pv reads, so the L2 model can see reuse across kernels.
S is freed after the softmax; for inference P (and P_drop, the mask) after their last reader; for
training (`training=True`) P, P_drop and the mask stay in HBM for the backward pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hbmsim.simulator import Launch, Program, Tensor

from .common import MASK_DTYPE, input_tensors, scaled_keep_mask, output
from .registry import AlgorithmSpec, register
from .workload import AttentionData, Workload, allowed

# (tile_m, tile_n, tile_k). A k-step moves a 128-wide slice: CUTLASS's sm80 fp16 128x128x32 tile
# with a 4-stage cp.async pipeline keeps 4 x 32 = 128 columns of A and B in shared memory (64 KiB),
# the same footprint as one 128-wide step. Traffic does not depend on tile_k.
GEMM_TILE = (128, 128, 128)
SOFTMAX_VECTOR_FLOPS = 5       # per element: max, subtract + exp, sum, divide


def gemm_tiles(m: int, n: int, k: int, tile: tuple) -> tuple[int, int, int]:
    """Tile sizes clamped to the matrix (a tile never exceeds the operand)."""
    return min(tile[0], m), min(tile[1], n), min(tile[2], k)


def gemm_sram_bytes(itemsize: int, tm: int, tn: int, tk: int) -> int:
    return (tm * tk + tk * tn) * itemsize


def gemm_launch(name: str, A: Tensor, B: Tensor, C: Tensor, b_transposed: bool, tile: tuple,
                scale: float = 1.0, allocs=(), frees=(), a_transposed: bool = False,
                pass_name: str = "forward") -> Launch:
    """C[g] = op(A[g]) @ op(B[g]), op = transpose where asked; one block per (g, C tile), tile_n
    fastest. A transposed operand is read as the transposed tile of its stored layout."""
    g_count = A.shape[0]
    m, kdim = (A.shape[2], A.shape[1]) if a_transposed else (A.shape[1], A.shape[2])
    n = C.shape[2]
    tm, tn, tk = gemm_tiles(m, n, kdim, tile)
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    itemsize = A.itemsize
    numeric = A.data is not None
    k_steps = [slice(k0, min(kdim, k0 + tk)) for k0 in range(0, kdim, tk)]     # the same for every block
    row_tiles = [slice(r0, min(m, r0 + tm)) for r0 in range(0, m, tm)]        # C's tile rows, then columns
    col_tiles = [slice(c0, min(n, c0 + tn)) for c0 in range(0, n, tn)]

    def block(ctx, index):
        g, rest = divmod(index, tiles_m * tiles_n)
        mi, ni = divmod(rest, tiles_n)
        rows, cols = row_tiles[mi], col_tiles[ni]
        rm, cn = rows.stop - rows.start, cols.stop - cols.start
        acc = np.zeros((rm, cn)) if numeric else None
        a_g, b_g = A[g], B[g]
        for ks in k_steps:
            kk = ks.stop - ks.start
            a, b = yield from ctx.load_tiles((a_g, ks, rows) if a_transposed else (a_g, rows, ks),
                                             (b_g, cols, ks) if b_transposed else (b_g, ks, cols))
            # rm x cn outputs, kk multiply-adds each (2 FLOPs); the A and B tiles read from SRAM once
            yield from ctx.compute(matmul_flops=2 * rm * cn * kk, sram_bytes=(rm + cn) * kk * itemsize)
            if numeric:
                acc += (a.T if a_transposed else a) @ (b.T if b_transposed else b)
        if numeric:
            ctx.note("gemm", g=g, out=C.name, rows=(rows.start, rows.stop), cols=(cols.start, cols.stop),
                     value=scale * acc)
        yield from ctx.store(C[g], rows, cols, None if acc is None else scale * acc)

    # the output tiles of one batch-head, repeated for each (period: fast mode may fold the launch)
    return Launch(name, g_count * tiles_m * tiles_n, gemm_sram_bytes(itemsize, tm, tn, tk), block, allocs, frees,
                  pass_name, period=tiles_m * tiles_n)


def col_chunks(n: int, width: int) -> list[slice]:
    return [slice(c, min(n, c + width)) for c in range(0, n, width)]


@dataclass(frozen=True)
class Panels:
    """How the elementwise kernels cut the N x N matrices: row panels of gemm_qk's tile_m rows,
    touched as S tiles (gemm_qk's tile_n wide) or P tiles (gemm_pv's tile_k wide)."""
    rows: int
    count: int            # panels per batch-head
    seq_len_q: int
    s_chunks: list
    p_chunks: list

    def __call__(self, index: int) -> tuple[int, slice]:
        """Block index -> (batch-head, row slice)."""
        g, i = divmod(index, self.count)
        return g, slice(i * self.rows, min(self.seq_len_q, (i + 1) * self.rows))


def panels_of(wl: Workload, gemm_tile: tuple) -> Panels:
    nq, nk, d = wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    rows, s_width, _ = gemm_tiles(nq, nk, d, gemm_tile)       # gemm_qk's output tiles
    _, _, p_width = gemm_tiles(nq, d, nk, gemm_tile)          # gemm_pv's A-operand tiles
    return Panels(rows, math.ceil(nq / rows), nq, col_chunks(nk, s_width), col_chunks(nk, p_width))


def load_panel(ctx, T: Tensor, g: int, rows: slice, chunks: list):
    """A row panel, fetched as the tiles of `chunks` in one go; returns it whole (or None)."""
    t_g = T[g]
    tiles = yield from ctx.load_tiles(*[(t_g, rows, c) for c in chunks])
    return None if tiles[0] is None else np.hstack(tiles)


def mask_panel(ctx, wl: Workload, data, T: Tensor, g: int, rows: slice, chunks: list, CM, KPM, fill: float):
    """The mask kernel's block, forward (fill -inf) and backward (fill 0): read a row panel of T
    and the masks it needs (causal_mask tiles, the batch's key_padding_mask row), write it back."""
    nk = T.shape[2]
    t_g = T[g]
    tiles = [(t_g, rows, c) for c in chunks]
    if CM is not None:
        cm = CM[0]
        tiles += [(cm, rows, c) for c in chunks]
    if KPM is not None:
        tiles.append((KPM[g // wl.heads], slice(0, 1), slice(0, nk)))
    got = yield from ctx.load_tiles(*tiles)
    yield from ctx.compute(vector_flops=(rows.stop - rows.start) * nk)     # one select per element
    val = None
    if data is not None:
        kv_len = None if data.kv_lens is None else int(data.kv_lens[g // wl.heads])
        val = np.where(allowed(wl, kv_len, rows.start, rows.stop, 0, nk), np.hstack(got[:len(chunks)]), fill)
    yield from store_panel(ctx, T, g, rows, chunks, val)


def store_panel(ctx, T: Tensor, g: int, rows: slice, chunks: list, value):
    """A row panel, stored as the tiles of `chunks`; returns what to `yield from` (a store
    never waits: nothing)."""
    t_g = T[g]
    return ctx.store_tiles(*[(t_g, rows, c, None if value is None else value[:, c]) for c in chunks])


def standard_forward(wl: Workload, data: AttentionData | None = None, gemm_tile: tuple = GEMM_TILE,
                     training: bool = False) -> Program:
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    numeric = data is not None
    S = output(wl, "S", nq, nk, wl.dtype, data)
    P = output(wl, "P", nq, nk, wl.dtype, data)
    O = output(wl, "O", nq, d, wl.dtype, data)
    panel = panels_of(wl, gemm_tile)
    s_chunks, p_chunks, panels = panel.s_chunks, panel.p_chunks, panel.count
    inputs = [Q, K, V]

    def s_size(rows):
        return (rows.stop - rows.start) * nk

    def scale_block(ctx, index):
        g, rows = panel(index)
        s = yield from load_panel(ctx, S, g, rows, s_chunks)
        yield from ctx.compute(vector_flops=s_size(rows))      # scale: one multiply per element
        yield from store_panel(ctx, S, g, rows, s_chunks, None if s is None else wl.softmax_scale * s)

    launches = [gemm_launch("gemm_qk", Q, K, S, True, gemm_tile, allocs=(S,)),
                Launch("scale", g_count * panels, 0, scale_block, period=panels)]

    if wl.masked:
        CM = KPM = None
        if wl.causal:   # a precomputed (Nq, Nkv) bool mask, broadcast over batch and heads
            CM = Tensor("causal_mask", (1, nq, nk), MASK_DTYPE, count_only=not numeric)
            inputs.append(CM)
        if wl.key_padding_mask:   # (batch, Nkv) bool, broadcast over heads and rows
            KPM = Tensor("key_padding_mask", (wl.batch, 1, nk), MASK_DTYPE, count_only=not numeric)
            inputs.append(KPM)

        def mask_block(ctx, index):
            g, rows = panel(index)
            yield from mask_panel(ctx, wl, data, S, g, rows, s_chunks, CM, KPM, -np.inf)
        launches.append(Launch("mask", g_count * panels, 0, mask_block, period=panels))

    def softmax_block(ctx, index):
        g, rows = panel(index)
        s = yield from load_panel(ctx, S, g, rows, s_chunks)
        yield from ctx.compute(vector_flops=SOFTMAX_VECTOR_FLOPS * s_size(rows), exp_ops=s_size(rows))   # 1 exp each
        p = None
        if numeric:
            mx = s.max(axis=1, keepdims=True)
            ex = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
            tot = ex.sum(axis=1, keepdims=True)
            p = np.divide(ex, tot, out=np.zeros_like(ex), where=tot > 0)
            ctx.note("softmax", g=g, rows=(rows.start, rows.stop), S=s, max=mx[:, 0], exp=ex, sum=tot[:, 0], P=p)
        yield from store_panel(ctx, P, g, rows, p_chunks, p)
    launches.append(Launch("softmax", g_count * panels, 0, softmax_block, allocs=(P,), frees=(S,), period=panels))

    outputs = {"O": O}
    P_used = P
    if wl.dropout > 0:
        P_used = output(wl, "P_drop", nq, nk, wl.dtype, data)
        DM = output(wl, "dropout_mask", nq, nk, MASK_DTYPE, data)
        keep = scaled_keep_mask(wl, data)
        outputs.update(P_drop=P_used, dropout_mask=DM)

        def dropout_block(ctx, index):
            g, rows = panel(index)
            p = yield from load_panel(ctx, P, g, rows, p_chunks)
            yield from ctx.compute(vector_flops=2 * s_size(rows))     # dropout: compare + multiply
            k = None if p is None else keep[g, rows, :]
            yield from ctx.store_tiles(*[(P_used[g], rows, c, None if p is None else p[:, c] * k[:, c])
                                         for c in p_chunks],
                                       *[(DM[g], rows, c, None if p is None else (k[:, c] > 0).astype(float))
                                         for c in p_chunks])
        launches.append(Launch("dropout", g_count * panels, 0, dropout_block, allocs=(P_used, DM),
                               frees=() if training else (P,), period=panels))

    launches.append(gemm_launch("gemm_pv", P_used, V, O, False, gemm_tile, allocs=(O,),
                                frees=() if training else tuple(t for t in (P_used, outputs.get("dropout_mask"))
                                                                if t is not None)))
    if training:
        outputs["P"] = P
    if numeric and wl.masked:
        _fill_masks(wl, data, CM, KPM)
    extra = tuple(v for k, v in tensors.items() if k not in "QKV")
    return Program("standard_forward", launches, inputs=tuple(inputs) + extra, outputs=outputs)


def _fill_masks(wl, data, CM, KPM):
    if CM is not None:
        causal_only = Workload(1, 1, wl.seq_len_q, wl.seq_len_kv, 1, causal=True)
        CM.data[0] = allowed(causal_only, None, 0, wl.seq_len_q, 0, wl.seq_len_kv)
    if KPM is not None:
        KPM.data[:, 0, :] = np.arange(wl.seq_len_kv)[None, :] < data.kv_lens[:, None]


# ---- the registered program ----------------------------------------------------------------------

# Kernel lists (standard_variants.py), each from the source that was timed or that others use:
EAGER = "eager"                   # this module: PyTorch eager as autograd runs it
PYTORCH_BENCH = "pytorch-bench"   # attention_pytorch, flash-attention benchmarks (the FA2 paper's baseline)
ATTENTION_REF = "attention-ref"   # attention_ref, flash-attention tests (fp32 upcast)
MEGATRON = "megatron"             # Megatron-LM's fused scale-mask-softmax
VARIANTS = (EAGER, PYTORCH_BENCH, ATTENTION_REF, MEGATRON)


@dataclass(frozen=True)
class GemmTile:
    """Standard attention's mapping: the output tile (tile_m x tile_n) and k-step of its GEMMs,
    and which kernel list runs (`variant`)."""
    tile_m: int = GEMM_TILE[0]
    tile_n: int = GEMM_TILE[1]
    tile_k: int = GEMM_TILE[2]
    variant: str = EAGER

    @property
    def tile(self) -> tuple:
        return (self.tile_m, self.tile_n, self.tile_k)


def _build(wl: Workload, m: GemmTile, data: AttentionData | None, training: bool) -> Program:
    if m.variant != EAGER:
        from . import standard_variants as V
        name = m.variant.replace("-", "_")
        return getattr(V, f"{name}_training" if training else f"{name}_forward")(wl, data, m.tile)
    if training:
        from .standard_backward import standard_training
        return standard_training(wl, data, m.tile)
    return standard_forward(wl, data, m.tile)


def _io(wl: Workload, m: GemmTile, pass_name: str) -> dict:
    if m.variant != EAGER:
        from . import io_standard_variants as V
        return getattr(V, f"{m.variant.replace('-', '_')}_{pass_name}_io")(wl, m.tile)
    from . import io_formulas as F
    return (F.standard_forward_io if pass_name == "forward" else F.standard_backward_io)(wl, m.tile)


def _sram_bytes(wl: Workload, m: GemmTile, training: bool) -> int:
    """The largest GEMM block: its A and B tiles, each clamped to its matrix."""
    nq, nk, d = wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    shapes = [(nq, nk, d), (nq, d, nk)] + ([(nk, d, nq), (nq, d, nk)] if training else [])
    return max(gemm_sram_bytes(wl.itemsize, *gemm_tiles(a, b, c, m.tile)) for a, b, c in shapes)


def _steps(wl: Workload, m: GemmTile, training: bool) -> int:
    """Tile steps: the two GEMMs' k-steps (S = QK^T: Nq x Nkv outputs over d; O = PV: Nq x d
    outputs over Nkv) and the elementwise kernels' tiles (counted as two per S tile)."""
    c = math.ceil
    tm, tn, tk = m.tile
    g, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    steps = g * (c(nq / tm) * c(nk / tn) * (c(d / tk) + 2) + c(nq / tm) * c(d / tn) * c(nk / tk))
    return steps * (3 if training else 1)


SPEC = register(AlgorithmSpec(
    name="standard", label="standard attention (PyTorch eager)", mapping_type=GemmTile,
    build=_build, io=_io, sram_bytes=_sram_bytes, steps=_steps,
    describe=lambda m: f"gemm {m.tile_m}x{m.tile_n}x{m.tile_k}" + ("" if m.variant == EAGER else f" {m.variant}"),
    nn_arrays=(4, 8), variants=VARIANTS, kernel="standard_attention",
    no_emulation_reason="the emulation runs only the flash kernel: the standard baseline's GEMMs are cuBLAS, "
                        "whose traffic a CPU emulation cannot count honestly"))
