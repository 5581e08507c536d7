"""FlashAttention-2 forward as a simulated program (Dao 2023, Algorithm 1).

One thread block per (batch-head, query block); query blocks of one batch-head are adjacent in
the grid, as in FA2's launch, so they share K/V tiles in L2. The block loads Q_i once, streams
K_j, V_j through SRAM, keeps m, l and the O accumulator on chip, and writes O_i and the
log-sum-exp once. Loads overlap compute as in FA2's main loop, with no extra buffers: V_j is
fetched while S_ij = Q_i K_j^T and its softmax are computed, and K_{j+1} while P_ij V_j is.
Under the causal mask, K/V blocks that no row of the query block can see are skipped; the
diagonal blocks are masked element-wise.

Where the tiles live (the kernel in kernels/ must agree): Q_i, K_j and V_j in shared memory
(flash2_sram_bytes), S_ij, P_ij, the O accumulator, m_i and l_i in registers.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from hbmsim.simulator import Launch, Program
from hbmsim.simulator.tensor import L2Lines, Strided
from hbmsim.simulator.time_model import MMA_SYNC

from . import common
from .common import (STATS_DTYPE, block_rows, fa2_batch_head, long_causal, normalised_rows, unnormalised_softmax_step,
                     input_tensors, masked_scores, online_softmax_vector_flops, output, row_blocks_period,
                     scaled_keep_mask)
from .common import tiles_per_step as coarse_step
from .flash2_teaching import teaching_aligned
from .paged import KVLayout
from .workload import AttentionData, Workload, causal_kv_end

# What flash2_forward's annotations (ctx.note) mean, for whoever listens (`hbmsim explain` prints
# them from this table): per note, a heading ({rows}, {cols}: the query rows and keys it covers;
# None: none) and its values per query row, one dict a printed line, each value with the formula
# that made it. O / l is the running normalised output: the attention of the keys seen so far.
NOTES = {
    "flash2 tile": {"heading": "tile keys {cols}", "per_row": (
        {"S": "S", "tile_max": "tile max", "m_old": "m_old", "m_new": "m_new", "c": "c = exp(m_old - m_new)"},
        {"P": "exp(S - m_new)", "l": "l = c l + sum"},
        {"O": "O (unnormalised) = c O + P V", "O_over_l": "O / l"})},
    "flash2 final": {"heading": None, "per_row": ({"O": "O = O / l", "lse": "log-sum-exp m + log l"},
                                                  {"m": "m", "l": "l"})},
}


def flash2_sram_bytes(wl: Workload, block_q: int, block_kv: int) -> int:
    # Q_i (block_q x d) and K_j, V_j (block_kv x d each) in the storage dtype; S/P, O, m, l in registers
    return (block_q + 2 * block_kv) * wl.head_dim * wl.itemsize


def pv_work(wl: Workload, n: int, nc: int, warps: int) -> dict:
    """`compute`'s arguments for acc += P V_j over n query rows and nc keys (one simulated step; FA2's
    forward and its split-KV kernel alike): 2*n*nc*d FLOPs (multiply-add = 2), P from registers and
    all of V_j read from shared memory by every warp."""
    return dict(matmul_flops=2 * n * nc * wl.head_dim, sram_bytes=warps * nc * wl.head_dim * wl.itemsize)


def qk_softmax_work(wl: Workload, n: int, nc: int, tiles: int, warps: int) -> dict:
    """`compute`'s arguments for S = Q_i K_j^T and the online softmax of n query rows over nc keys
    in `tiles` K/V tiles (one simulated step; FA2's forward and its split-KV kernel alike)."""
    d = wl.head_dim
    # S = Q_i K_j^T: 2*n*nc*d FLOPs (multiply-add = 2); the tile's online softmax, with an exp
    # per score and one per row (the rescale exp(m_old - m_new)); SRAM: each warp reads its
    # rows of Q_i (Q is not kept in registers: Is_Q_in_regs = false) and all of K_j.
    # Several tiles in one step: the per-score terms add up over nc columns, the per-row
    # terms (softmax row updates, the rescale exp, Q_i's reads) come once per tile.
    return dict(matmul_flops=2 * n * nc * d,
                vector_flops=online_softmax_vector_flops(wl, n, nc)
                + (tiles - 1) * online_softmax_vector_flops(wl, n, 0),
                sram_bytes=(tiles * n + warps * nc) * d * wl.itemsize, exp_ops=n * nc + tiles * n)


# The instruction shapes FA2's kernels are written with (kernel_traits.h): mma.sync m16n8k16
# (SM80_16x8x16_F32F16F16F32_TN), 16 x 8 x 16 multiply-adds = 4,096 FLOPs a warp instruction; ldmatrix
# .x4 (SM75_U32x4_LDSM_N, and SM75_U16x8_LDSM_T for V), four 8 x 8 matrices of 2-byte elements = 512
# bytes of shared memory a warp instruction.
MMA_SYNC_FLOPS_PER_INSTRUCTION = 4096
LDMATRIX_BYTES_PER_INSTRUCTION = 512


def warp_instructions(wl: Workload, step_instructions: tuple, tile_rows: int, block_kv: int, warps: int) -> tuple:
    """The forward's warp instructions per unit of a compute call's counted work, (per GEMM FLOP, per
    shared-memory byte, per vector operation), for the time model's warp_issue effect: the mma.sync
    and ldmatrix ones by their shapes, and the rest of what Nsight counted a step (`step_instructions`
    = (rows, keys, warps, a warp's instructions a K/V step): the softmax, masking and address
    arithmetic) shared over the step's vector operations, the S call's. (): the tile, the warps or
    the element size differ from the counted kernel's (fp16 and bf16 alike; the count is that
    kernel's, not another tile's or dtype's)."""
    if not step_instructions or tuple(step_instructions[:3]) != (tile_rows, block_kv, warps) or wl.itemsize != 2:
        return ()
    qk, pv = qk_softmax_work(wl, tile_rows, block_kv, 1, warps), pv_work(wl, tile_rows, block_kv, warps)
    # a step's GEMMs, S = Q_i K_j^T and P V_j, and its ldmatrix reads, the S call's and P V's
    flops = qk["matmul_flops"] + pv["matmul_flops"]
    sram_bytes = qk["sram_bytes"] + pv["sram_bytes"]
    rest = step_instructions[3] * warps - flops / MMA_SYNC_FLOPS_PER_INSTRUCTION \
        - sram_bytes / LDMATRIX_BYTES_PER_INSTRUCTION
    assert rest > 0, "a step's counted instructions are fewer than its mma.sync and ldmatrix ones"
    return (1 / MMA_SYNC_FLOPS_PER_INSTRUCTION, 1 / LDMATRIX_BYTES_PER_INSTRUCTION, rest / qk["vector_flops"])


def flash2_forward(wl: Workload, block_q: int, block_kv: int, data: AttentionData | None = None,
                   warps: int = 1, tiles_per_step: int = 1, registers_per_thread: int = 0,
                   teaching: bool = False, tile_rows: int = 0, fixed_instructions: int = 0,
                   step_instructions: tuple = (), whole_kv: bool = False) -> Program:
    """`warps`: the kernel's kNWarps, which split the query rows (kernel_traits.h: the tiled MMA
    lays the warps out along M), so that every warp reads all of K_j and V_j from shared memory
    for its own rows; it sets the SRAM reads the time model sees, never a byte of traffic.
    `tiles_per_step` > 1 (fast mode, common.tiles_per_step): each simulated step loads and
    computes that many K/V tiles at once; every count is the sum of the tiles' own.
    `registers_per_thread`: the compiled kernel's (0: not known), with `warps` x 32 threads a
    block, for the time model's `registers` effect; it never changes a byte of traffic.
    `teaching`: the teaching kernel (algorithms/flash2_teaching.py): block_q threads move every
    tile (Strided(block_q), counted in sectors), K/V tile by tile even in a coarse step, and
    the matmuls run as FP32 FMAs (vector FLOPs). `tile_rows`: the rows the kernel's tile computes
    (Flash2Blocks.q_tile_rows; 0: each block's own rows). `fixed_instructions`: a warp's
    instructions run once a block, not a step (the compiled kernel's, counted by Nsight; 0: not
    known), run after the loop as a dependent chain (context.chain); never a byte of traffic.
    `step_instructions`: (tile rows, block_kv, warps, a warp's instructions a K/V step) as Nsight
    counted them in the compiled kernel (flash2_spec.FA2_FWD_STEP_INSTRUCTIONS; empty: not known),
    for the time model's warp_issue effect where this kernel's tile is that one; never a byte.
    `whole_kv`: a last K/V tile past seq_len_kv computes all block_kv of its columns, as the
    kernel's MMAs and softmax do (its keys past the sequence are loaded as zeros and masked to
    -inf: flash_fwd_kernel.h, Is_even_MN false); false: its real columns only."""
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    tensors = input_tensors(wl, data, paged=True)
    kv = KVLayout(wl, tensors, data)          # contiguous, or paged (algorithms/paged.py)
    Q = tensors["Q"]
    O = output(wl, "O", nq, d, wl.dtype, data)
    LSE = output(wl, "lse", nq, 1, STATS_DTYPE, data)
    tr = math.ceil(nq / block_q)
    scale = wl.softmax_scale
    keep = scaled_keep_mask(wl, data)
    numeric = data is not None
    all_cols = slice(0, d)
    access = Strided(block_q) if teaching else None
    lines = L2Lines(block_kv)                 # a coarse step's K/V as the L2 keeps them
    # a long causal loop in fast mode: every K/V load as the L2's prefix lines (common.long_causal)
    prefix = (L2Lines(block_kv, prefix=True)
              if tiles_per_step > 1 and long_causal(wl, block_q, block_kv) and not (teaching or kv.paged) else None)

    def tiles_of(tiles):
        """The tiles with the kernel's access pattern attached (teaching), or as they are."""
        return tiles if access is None else [(*t, access) for t in tiles]

    def kv_tiles(name, kg, c0, c1):
        """K or V rows [c0, c1): in a fast-mode step of several tiles under a causal mask (whose
        blocks' steps differ), one tile that the L2 keeps as lines of block_kv rows, the tiles
        the kernel loads one by one (L2Lines: a transfer per step, one L2 line, made the L2 miss
        the tiles other blocks had loaded, and the forward's DRAM bytes 2.2x at N = 32768); paged,
        and in the teaching kernel (its sectors counted per tile), tile by tile in one request;
        otherwise one tile a step, every block's steps alike."""
        if prefix is not None:
            return [(*t, prefix) for t in kv.tiles(name, kg, c0, c1)]
        if not (teaching or wl.causal) or c1 - c0 <= block_kv:
            return tiles_of(kv.tiles(name, kg, c0, c1))
        if not teaching and not kv.paged:     # one tile, which the L2 keeps tile by tile
            return [(*t, lines) for t in kv.tiles(name, kg, c0, c1)]
        return tiles_of([t for s in range(c0, c1, block_kv) for t in kv.tiles(name, kg, s, min(c1, s + block_kv))])

    def work(kw):
        """compute's arguments: FA2's, or the teaching kernel's (its matmuls on the FP32 lanes)."""
        if teaching:
            kw = dict(kw, vector_flops=kw.get("vector_flops", 0) + kw.get("matmul_flops", 0), matmul_flops=0)
        return kw

    def kv_cols(c0, c_end):
        """The K/V tiles of the step from column c0 to c_end: (columns, how many tiles)."""
        tiles = math.ceil((c_end - c0) / block_kv)
        return slice(c0, min(nk, c0 + tiles * block_kv)), tiles

    def span(cols):
        return cols.start, cols.stop

    @functools.cache
    def step_works(n_work, nc, tiles):
        """(S and softmax, P V) compute arguments of one step: the same for every block whose step has
        that shape (rows computed, keys, tiles), so made once (a dict per call is most of a step's own
        Python)."""
        return (work(qk_softmax_work(wl, n_work, nc, tiles, warps)),
                work(pv_work(wl, n_work, nc, warps)))                  # acc += P V_j

    def kv_steps(kv_end):
        """[(c0, c_end)] of a block's steps. Fast mode: the block's own loop sets the step, so a
        causal mask's short rows keep steps of one tile."""
        tiles = math.ceil(kv_end / block_kv)
        # a long causal launch (common.long_causal): every block a fixed number of steps
        own = (max(1, tiles // common.LONG_CAUSAL_STEPS_PER_BLOCK) if prefix is not None
               else coarse_step(tiles, even=not wl.causal))
        step_cols = block_kv * (min(tiles_per_step, own) if tiles_per_step > 1 else 1)
        starts = range(0, kv_end, step_cols)
        return [(c0, min(kv_end, c0 + step_cols)) for c0 in starts]

    def block(ctx, index):
        bh, i = divmod(index, tr)
        # FA2's grid (blocks, batch, heads); the teaching kernel's (flash_attention.cu) is (query block,
        # batch-head): batch-heads in order
        g = bh if teaching else fa2_batch_head(wl, bh)
        rows = block_rows(i, block_q, nq)
        r0, r1, n = rows.start, rows.stop, rows.stop - rows.start
        # the rows the block computes: FA2's kernel runs its MMAs and softmax over every row of its
        # tile (tile_rows), a last block's rows past seq_len_q and decode's 1-8 rows too; only Q's
        # loads and O's stores are cut to the real rows (flash_fwd_kernel.h: the tiled MMA over
        # kBlockM, "we'll only write out the valid outputs"). The teaching kernel loops over its rows.
        n_work = n if teaching else max(n, tile_rows)
        kv_end = causal_kv_end(wl, r1) if wl.causal else nk
        steps = kv_steps(kv_end)
        kg = wl.kv_group(g)
        first = [(Q[g], rows, all_cols)]
        if wl.key_padding_mask:
            first.append((tensors["kv_lens"][g // wl.heads], slice(0, 1), slice(0, 1)))
        kv_hi = kv_cols(*steps[-1])[0].stop if steps else 0     # the keys its tiles read: [0, kv_hi)
        first += kv.table_tiles(kg, 0, kv_hi)             # paged: the block-table entries of those keys
        q_next = ctx.prefetch(*tiles_of(first))           # Q_i and K_0 are fetched together
        k_next = ctx.prefetch(*kv_tiles("K", kg, *span(kv_cols(*steps[0])[0]))) if steps else None
        q, *rest = yield from ctx.wait(q_next)
        lens = rest[0] if wl.key_padding_mask else None
        kv_len = int(lens[0, 0]) if lens is not None else None
        if numeric:
            m, l, acc = np.full(n, -np.inf), np.zeros(n), np.zeros((n, d))
        for s_i, (c0, c_end) in enumerate(steps):
            cols, tiles = kv_cols(c0, c_end)
            c1, nc = cols.stop, cols.stop - c0
            qk_work, pv_work = step_works(n_work, tiles * block_kv if whole_kv else nc, tiles)
            k = kv.join((yield from ctx.wait(k_next)))
            v_next = ctx.prefetch(*kv_tiles("V", kg, c0, c1))
            yield from ctx.compute(**qk_work)
            if numeric:
                # The unnormalised form (FA2): acc = exp(m_old - m_new) acc + P V, divided by l once
                # at the end.
                s = masked_scores(wl, scale, q, k, kv_len, r0, r1, c0, c1)
                m_old = m
                m_new, p, alpha, l = unnormalised_softmax_step(s, m, l)
                if keep is not None:
                    p = p * keep[g, r0:r1, c0:c1]
                m = m_new
            v = kv.join((yield from ctx.wait(v_next)))
            if s_i + 1 < len(steps):
                k_next = ctx.prefetch(*kv_tiles("K", kg, *span(kv_cols(*steps[s_i + 1])[0])))
            yield from ctx.compute(**pv_work)                  # acc += P V_j (step_works)
            if numeric:
                acc = alpha[:, None] * acc + p @ v
                ctx.note("flash2 tile", g=g, rows=(r0, r1), cols=(c0, c1), S=s, tile_max=s.max(axis=1),
                         m_old=m_old, m_new=m, c=alpha, P=p, l=l, O=acc,
                         O_over_l=np.divide(acc, l[:, None], out=np.zeros_like(acc), where=l[:, None] > 0))
        yield from ctx.compute(vector_flops=n_work * d + 2 * n_work)   # O = acc / l, lse = m + log l
        if fixed_instructions:           # the epilogue's (and prologue's) instructions, a dependent chain
            yield from ctx.chain(fixed_instructions)
        o_tile = lse_tile = None
        if numeric:
            o_tile, lse_tile = normalised_rows(acc, l, m)
            ctx.note("flash2 final", g=g, rows=(r0, r1), m=m, l=l, O=o_tile, lse=lse_tile[:, 0])
        yield from ctx.store_tiles(*tiles_of([(O[g], rows, all_cols, o_tile), (LSE[g], rows, slice(0, 1), lse_tile)]))

    # A period (fold.py) needs blocks a period apart to count alike: sectors of the teaching
    # kernel's unaligned tiles depend on where the tile starts, so those launches never fold.
    period = row_blocks_period(wl, block_q, nq) if not teaching or teaching_aligned(wl, block_q) else 0
    launch = Launch("flash2_fwd", g_count * tr, flash2_sram_bytes(wl, block_q, block_kv), block, allocs=(O, LSE),
                    tensor_op=MMA_SYNC, period=period, threads_per_block=block_q if teaching else 32 * warps,
                    registers_per_thread=registers_per_thread,
                    warp_instructions=warp_instructions(wl, step_instructions, max(block_q, tile_rows), block_kv,
                                                        warps))
    return Program("flash2_forward", [launch], inputs=tuple(tensors.values()), outputs={"O": O, "lse": LSE})
