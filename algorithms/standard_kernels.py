"""The kernels standard attention is built of, whichever kernel list runs them (eager,
pytorch-bench, attention-ref, megatron): a tiled GEMM launch, and the row panels in which the
elementwise and row-wise kernels cut the N x N matrices (load, mask and store a panel).

Elementwise and row-wise kernels work on panels of gemm_qk's tile_m full rows and stream
through registers (no shared memory). They touch S in the tile_m x tile_n tiles gemm_qk wrote,
and P in the tile_m x tile_k tiles gemm_pv reads, so the L2 model can see reuse across kernels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hbmsim.simulator import Launch, Program, Tensor

from .workload import Workload, allowed

# (tile_m, tile_n, tile_k). A k-step moves a 128-wide slice: CUTLASS's sm80 fp16 128x128x32 tile
# with a 4-stage cp.async pipeline keeps 4 x 32 = 128 columns of A and B in shared memory (64 KiB),
# the same footprint as one 128-wide step. Traffic does not depend on tile_k.
GEMM_TILE = (128, 128, 128)
# Fast mode (count-only runs): a GEMM block whose k-loop has 2 x GEMM_FAST_MIN_STEPS k-steps or more
# takes up to GEMM_FAST_MAX_K_STEPS of them a simulated step (its tiles loaded tile by tile, as the
# other kernels' L2 lines; one compute call), keeping GEMM_FAST_MIN_STEPS steps or more. Passed as a
# fourth element of the GEMM tile (tile_m, tile_n, tile_k, most k-steps a step); the kernel's tiles
# and shared memory do not change. Against a step per k-step, PyTorch's attention, training, N =
# 8192-16384, A100, H100 and H200: time within 0.4%, DRAM bytes within 0.3%, 1.2-1.8x faster.
# (Keeping 16 steps instead moved A100's backward at N = 4096, head dim 128, by +1.5%.)
GEMM_FAST_MAX_K_STEPS = 4
GEMM_FAST_MIN_STEPS = 32


def gemm_k_steps_at_once(k_steps: int, most: int) -> int:
    """k-steps one simulated step of a GEMM block covers: up to `most` (fast mode), keeping
    GEMM_FAST_MIN_STEPS steps or more; 1 for a shorter k-loop."""
    return max(1, min(most, k_steps // GEMM_FAST_MIN_STEPS))


SOFTMAX_VECTOR_FLOPS = 5       # per element: max, subtract + exp, sum, divide
SOFTMAX_BWD_VECTOR_FLOPS = 4   # per element: dP * P, row sum, subtract, multiply


def variant_program(name: str, forward, backward, wl: Workload, data, gemm_tile: tuple) -> Program:
    """A standard variant's program: its kernel list `forward(wl, data, tile) -> (launches, inputs,
    saved)` and, for training, `backward(wl, data, tile, saved, launches) -> gradients` appending
    the backward's launches ("<name>_forward" or "<name>_training")."""
    launches, inputs, saved = forward(wl, data, gemm_tile)
    outputs = {"O": saved["O"]}
    if backward is not None:
        outputs.update(backward(wl, data, gemm_tile, saved, launches))
    return Program(f"{name}_{'forward' if backward is None else 'training'}", launches, inputs=tuple(inputs),
                   outputs=outputs)


def gemm_tiles(m: int, n: int, k: int, tile: tuple) -> tuple[int, int, int]:
    """Tile sizes clamped to the matrix (a tile never exceeds the operand)."""
    return min(tile[0], m), min(tile[1], n), min(tile[2], k)


def gemm_sram_bytes(itemsize: int, tm: int, tn: int, tk: int) -> int:
    return (tm * tk + tk * tn) * itemsize


def gemm_launch(name: str, A: Tensor, B: Tensor, C: Tensor, b_transposed: bool, tile: tuple,
                scale: float = 1.0, allocs=(), frees=(), a_transposed: bool = False,
                pass_name: str = "forward") -> Launch:
    """C[g] = op(A[g]) @ op(B[g]), op = transpose where asked; one block per (g, C tile), tile_n
    fastest. A transposed operand is read as the transposed tile of its stored layout. A fourth
    element of `tile` (fast mode) lets a block take several k-steps a simulated step."""
    g_count = A.shape[0]
    m, kdim = (A.shape[2], A.shape[1]) if a_transposed else (A.shape[1], A.shape[2])
    n = C.shape[2]
    tm, tn, tk = gemm_tiles(m, n, kdim, tile)
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    itemsize = A.itemsize
    numeric = A.data is not None
    k_steps = [slice(k0, min(kdim, k0 + tk)) for k0 in range(0, kdim, tk)]     # the same for every block
    at_once = 1 if len(tile) < 4 else gemm_k_steps_at_once(len(k_steps), tile[3])
    step_groups = [k_steps[i:i + at_once] for i in range(0, len(k_steps), at_once)]
    row_tiles = [slice(r0, min(m, r0 + tm)) for r0 in range(0, m, tm)]        # C's tile rows, then columns
    col_tiles = [slice(c0, min(n, c0 + tn)) for c0 in range(0, n, tn)]

    def block(ctx, index):
        g, rest = divmod(index, tiles_m * tiles_n)
        mi, ni = divmod(rest, tiles_n)
        rows, cols = row_tiles[mi], col_tiles[ni]
        rm, cn = rows.stop - rows.start, cols.stop - cols.start
        acc = np.zeros((rm, cn)) if numeric else None
        a_g, b_g = A[g], B[g]
        for group in step_groups:
            got = yield from ctx.load_tiles(*[t for ks in group for t in (
                (a_g, ks, rows) if a_transposed else (a_g, rows, ks),
                (b_g, cols, ks) if b_transposed else (b_g, ks, cols))])
            kk = sum(ks.stop - ks.start for ks in group)
            # rm x cn outputs, kk multiply-adds each (2 FLOPs); the A and B tiles read from SRAM once
            yield from ctx.compute(matmul_flops=2 * rm * cn * kk, sram_bytes=(rm + cn) * kk * itemsize)
            if numeric:
                for a, b in zip(got[0::2], got[1::2]):
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
