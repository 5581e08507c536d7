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

import math
from dataclasses import dataclass, replace

import numpy as np

from hbmsim.simulator import Launch, Program
from hbmsim.simulator.time_model import MMA_SYNC

from .common import (STATS_DTYPE, block_rows, finite_or_zero, input_tensors, masked_scores,
                     online_softmax_vector_flops, output, row_blocks_period, scaled_keep_mask, tiles_per_step)
from .blocks import AUTO, FlashBlocks, resolve_flash_blocks
from .registry import AlgorithmSpec, register
from .workload import AttentionData, Workload, causal_kv_end



def flash2_sram_bytes(wl: Workload, block_q: int, block_kv: int) -> int:
    # Q_i (block_q x d) and K_j, V_j (block_kv x d each) in the storage dtype; S/P, O, m, l in registers
    return (block_q + 2 * block_kv) * wl.head_dim * wl.itemsize


def flash2_forward(wl: Workload, block_q: int, block_kv: int, data: AttentionData | None = None,
                   warps: int = 1, tiles_per_step: int = 1, registers_per_thread: int = 0) -> Program:
    """`warps`: the kernel's kNWarps, which split the query rows (kernel_traits.h: the tiled MMA
    lays the warps out along M), so that every warp reads all of K_j and V_j from shared memory
    for its own rows; it sets the SRAM reads the time model sees, never a byte of traffic.
    `tiles_per_step` > 1 (fast mode, common.tiles_per_step): each simulated step loads and
    computes that many K/V tiles at once; every count is the sum of the tiles' own.
    `registers_per_thread`: the compiled kernel's (0: not known), with `warps` x 32 threads a
    block, for the time model's `registers` effect; it never changes a byte of traffic."""
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    O = output(wl, "O", nq, d, wl.dtype, data)
    LSE = output(wl, "lse", nq, 1, STATS_DTYPE, data)
    tr = math.ceil(nq / block_q)
    scale, itemsize = wl.softmax_scale, wl.itemsize
    keep = scaled_keep_mask(wl, data)
    numeric = data is not None
    all_cols = slice(0, d)

    step_cols = block_kv * tiles_per_step

    def kv_cols(c0, kv_end):
        """The K/V tiles of the step starting at column c0: (columns, how many tiles)."""
        tiles = math.ceil((min(kv_end, c0 + step_cols) - c0) / block_kv)
        return slice(c0, min(nk, c0 + tiles * block_kv)), tiles

    def block(ctx, index):
        g, i = divmod(index, tr)
        rows = block_rows(i, block_q, nq)
        r0, r1, n = rows.start, rows.stop, rows.stop - rows.start
        kv_end = causal_kv_end(wl, r1) if wl.causal else nk
        first = [(Q[g], rows, all_cols)]
        if wl.key_padding_mask:
            first.append((tensors["kv_lens"][g // wl.heads], slice(0, 1), slice(0, 1)))
        q_next = ctx.prefetch(*first)                     # Q_i and K_0 are fetched together
        k_next = ctx.prefetch((K[g], kv_cols(0, kv_end)[0], all_cols)) if kv_end > 0 else None
        q, *lens = yield from ctx.wait(q_next)
        kv_len = int(lens[0][0, 0]) if lens and lens[0] is not None else None
        if numeric:
            m, l, acc = np.full(n, -np.inf), np.zeros(n), np.zeros((n, d))
        for c0 in range(0, kv_end, step_cols):
            cols, tiles = kv_cols(c0, kv_end)
            c1, nc = cols.stop, cols.stop - c0
            (k,) = yield from ctx.wait(k_next)
            v_next = ctx.prefetch((V[g], cols, all_cols))
            # S = Q_i K_j^T: 2*n*nc*d FLOPs (multiply-add = 2); the tile's online softmax, with an exp
            # per score and one per row (the rescale exp(m_old - m_new)); SRAM: each warp reads its
            # rows of Q_i (Q is not kept in registers: Is_Q_in_regs = false) and all of K_j.
            # Several tiles in one step: the per-score terms add up over nc columns, the per-row
            # terms (softmax row updates, the rescale exp, Q_i's reads) come once per tile.
            yield from ctx.compute(matmul_flops=2 * n * nc * d,
                                   vector_flops=online_softmax_vector_flops(wl, n, nc)
                                   + (tiles - 1) * online_softmax_vector_flops(wl, n, 0),
                                   sram_bytes=(tiles * n + warps * nc) * d * itemsize, exp_ops=n * nc + tiles * n)
            if numeric:
                # The unnormalised form (FA2): acc = exp(m_old - m_new) acc + P V, divided by l once
                # at the end.
                s = masked_scores(wl, scale, q, k, kv_len, r0, r1, c0, c1)
                m_old = m
                m_new = np.maximum(m, s.max(axis=1))
                m_safe = finite_or_zero(m_new)
                p = np.exp(s - m_safe[:, None])
                alpha = np.exp(m - m_safe)
                l = alpha * l + p.sum(axis=1)
                if keep is not None:
                    p = p * keep[g, r0:r1, c0:c1]
                m = m_new
            (v,) = yield from ctx.wait(v_next)
            if c0 + step_cols < kv_end:
                k_next = ctx.prefetch((K[g], kv_cols(c0 + step_cols, kv_end)[0], all_cols))
            # acc += P V_j: P from registers, all of V_j from SRAM by every warp
            yield from ctx.compute(matmul_flops=2 * n * nc * d, sram_bytes=warps * nc * d * itemsize)
            if numeric:
                acc = alpha[:, None] * acc + p @ v
                ctx.note("flash2 tile", g=g, rows=(r0, r1), cols=(c0, c1), S=s, tile_max=s.max(axis=1),
                         m_old=m_old, m_new=m, c=alpha, P=p, l=l, O=acc)
        yield from ctx.compute(vector_flops=n * d + 2 * n)   # O = acc / l, lse = m + log l
        o_tile = lse_tile = None
        if numeric:
            pos = l > 0
            o_tile = np.zeros((n, d))
            o_tile[pos] = acc[pos] / l[pos, None]
            lse_tile = np.full((n, 1), -np.inf)
            lse_tile[pos, 0] = m[pos] + np.log(l[pos])
            ctx.note("flash2 final", g=g, rows=(r0, r1), m=m, l=l, O=o_tile, lse=lse_tile[:, 0])
        yield from ctx.store_tiles((O[g], rows, all_cols, o_tile), (LSE[g], rows, slice(0, 1), lse_tile))

    launch = Launch("flash2_fwd", g_count * tr, flash2_sram_bytes(wl, block_q, block_kv), block, allocs=(O, LSE),
                    tensor_op=MMA_SYNC, period=row_blocks_period(wl, block_q, nq), threads_per_block=32 * warps,
                    registers_per_thread=registers_per_thread)
    return Program("flash2_forward", [launch], inputs=tuple(tensors.values()), outputs={"O": O, "lse": LSE})


# ---- the registered program ----------------------------------------------------------------------

FA2_KERNEL, PAPER = "fa2-kernel", "paper"
# Registers per thread of FlashAttention-2's forward and backward kernels as compiled: 255, the
# most a thread may have (Nsight Compute launch__registers_per_thread on H100 for flash_fwd_kernel
# at head dims 64 and 128 and flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel, the FA2 kernels that
# PyTorch 2.11 vendors: scenarios/measured/h100-ncu-kernels.json). With 4 forward warps a block
# takes 32,768 of an SM's 65,536 registers, with 8 backward warps all of them.
FA2_KERNEL_REGISTERS_PER_THREAD = 255


@dataclass(frozen=True)
class Flash2Blocks:
    """flash2's mapping: the forward's block_q x block_kv and the backward's, each a number or
    "auto". variant "fa2-kernel" (the default): "auto" is what the FlashAttention-2 kernel
    launches (fa2_kernel_blocks); variant "paper": "auto" is the FlashAttention paper's rule,
    and the backward uses the forward's blocks."""
    block_q: int | str = AUTO
    block_kv: int | str = AUTO
    block_q_bwd: int | str = AUTO
    block_kv_bwd: int | str = AUTO
    variant: str = FA2_KERNEL
    # kNWarps of the forward and backward kernels: they set the shared-memory reads the time model
    # sees (every warp reads its operand slices), never a byte of traffic; "auto": the kernel's
    # (fa2_kernel_warps), 4 for the paper variant
    warps: int | str = AUTO
    warps_bwd: int | str = AUTO


def fa2_kernel_warps(sram_bytes_per_sm: int, wl: Workload) -> tuple[int, int]:
    """(forward kNWarps, backward kNWarps) of the same launch templates: the forward runs 4 warps
    except the 128 x 64 tiles of head dims 192-256, which run 8; every backward runs 8."""
    d = wl.head_dim
    fwd, _ = fa2_kernel_blocks(sram_bytes_per_sm, wl)
    return (8 if d > 160 and fwd == (128, 64) else 4), 8


def fa2_kernel_blocks(sram_bytes_per_sm: int, wl: Workload) -> tuple[tuple, tuple]:
    """((forward kBlockM, kBlockN), (backward kBlockM, kBlockN)) of the FlashAttention-2 kernel,
    v2.0.0 to v2.3.6 (the launch templates are identical over these tags): forward from
    csrc/flash_attn/src/flash_fwd_launch_template.h (run_mha_fwd_hdim32 .. hdim256), backward
    from flash_bwd_launch_template.h (run_mha_bwd_hdim32 .. hdim256). The head dim is rounded up
    to the kernel's 32/64/96/128/160/192/224/256. H100 runs the sm80 code path (FA2 has no sm90
    kernel), so A100 and H100 choose alike except where the templates test shared memory:
    `sram_bytes_per_sm` stands for cudaDevAttrMaxSharedMemoryPerBlockOptin (A100 163 KB, H100
    227 KB) and that plus 1 KB for the per-SM figure. The sm86/sm89 rows are not modelled."""
    d, smem = wl.head_dim, sram_bytes_per_sm
    dropout = wl.dropout > 0
    kb = 1024
    if d <= 32:
        fwd = (128, 128)
        bwd = (128, 128)
    elif d <= 64:
        fwd = (128, 64) if dropout else (128, 128)
        bwd = (128, 128) if smem >= 144 * kb else (64, 128)
    elif d <= 96:
        fwd, bwd = (128, 64), (64, 128)
    elif d <= 128:
        fwd = (128, 32) if dropout else (128, 64)
        bwd = (64, 128) if smem >= 144 * kb else (64, 64)
    elif d <= 160:
        fwd, bwd = (128, 32), (64, 64)
    elif d <= 192:
        fwd = (64, 64) if dropout else (128, 64)
        bwd = (64, 64)
    elif d <= 224:
        fwd, bwd = ((128, 64) if smem >= 112 * kb else (64, 64)), (64, 64)
    else:     # 256: 128 x 64 needs 128 KB per block and less than 192 KB per SM, i.e. A100 not H100
        fwd = (128, 64) if smem >= 128 * kb and smem + kb < 192 * kb else (64, 64)
        bwd = (64, 64)
    return fwd, bwd


def _fit(br: int, bc: int, need, limit: int, what: str, notes: list) -> tuple[int, int]:
    """Halve the larger block until `need` fits the simulated SRAM, saying so."""
    b0 = (br, bc)
    while need(br, bc) > limit and (br > 1 or bc > 1):
        if bc > 1 and bc >= br:
            bc //= 2
        else:
            br //= 2
    if (br, bc) != b0:
        notes.append(f"the kernel's {what} blocks {b0[0]}x{b0[1]} do not fit sram_bytes_per_sm = {limit}: "
                     f"{br}x{bc}")
    return br, bc


def _resolve(gpu, wl: Workload, m: Flash2Blocks, training: bool) -> tuple:
    from .flash2_backward import flash2_bwd_sram_bytes
    if m.variant == PAPER:
        need = lambda br, bc: max(flash2_sram_bytes(wl, br, bc), flash2_bwd_sram_bytes(wl, br, bc) if training else 0)
        fwd, notes = resolve_flash_blocks(gpu.sram_bytes_per_sm, wl, FlashBlocks(m.block_q, m.block_kv), need)
        bwd = (fwd.block_q if m.block_q_bwd == AUTO else m.block_q_bwd,
               fwd.block_kv if m.block_kv_bwd == AUTO else m.block_kv_bwd)
        return replace(m, block_q=fwd.block_q, block_kv=fwd.block_kv, block_q_bwd=bwd[0], block_kv_bwd=bwd[1],
                       warps=4 if m.warps == AUTO else m.warps,
                       warps_bwd=4 if m.warps_bwd == AUTO else m.warps_bwd), notes
    kernel_fwd, kernel_bwd = fa2_kernel_blocks(gpu.sram_bytes_per_sm, wl)
    warps = fa2_kernel_warps(gpu.sram_bytes_per_sm, wl)
    notes: list = []
    out = {"warps": warps[0] if m.warps == AUTO else m.warps,
           "warps_bwd": warps[1] if m.warps_bwd == AUTO else m.warps_bwd}
    for key, kernel, seq_field in (("block_q", kernel_fwd[0], "seq_len_q"), ("block_kv", kernel_fwd[1], "seq_len_kv"),
                                   ("block_q_bwd", kernel_bwd[0], "seq_len_q"),
                                   ("block_kv_bwd", kernel_bwd[1], "seq_len_kv")):
        value, seq = getattr(m, key), getattr(wl, seq_field)
        if value == AUTO:
            value = min(kernel, seq)      # tiles are clipped to the sequence: the same bytes, less SRAM
        elif value > seq:
            notes.append(f"{key} = {value} is longer than {seq_field} = {seq}: clamped to {seq}")
            value = seq
        out[key] = value
    # The kernel's own choice is shrunk to fit a smaller simulated SRAM (saying so); blocks the
    # user gave are kept, and a block that does not fit is an error before simulating.
    limit = gpu.sram_bytes_per_sm
    if m.block_q == AUTO and m.block_kv == AUTO:
        out["block_q"], out["block_kv"] = _fit(out["block_q"], out["block_kv"],
                                               lambda r, c: flash2_sram_bytes(wl, r, c), limit, "forward", notes)
    if training and m.block_q_bwd == AUTO and m.block_kv_bwd == AUTO:
        out["block_q_bwd"], out["block_kv_bwd"] = _fit(out["block_q_bwd"], out["block_kv_bwd"],
                                                       lambda r, c: flash2_bwd_sram_bytes(wl, r, c), limit,
                                                       "backward", notes)
    return replace(m, **out), tuple(notes)


def _build(wl: Workload, m: Flash2Blocks, data: AttentionData | None, training: bool, fast: bool = False) -> Program:
    """`fast`: inner loops longer than common.COARSE_ABOVE_TILES tiles run several tiles a step."""
    fwd_step = tiles_per_step(math.ceil(wl.seq_len_kv / m.block_kv)) if fast else 1
    regs = FA2_KERNEL_REGISTERS_PER_THREAD if m.variant == FA2_KERNEL else 0
    if training:
        from .flash2_backward import flash2_training
        bwd_step = tiles_per_step(math.ceil(wl.seq_len_q / m.block_q_bwd)) if fast else 1
        return flash2_training(wl, m.block_q, m.block_kv, data, (m.block_q_bwd, m.block_kv_bwd),
                               warps=(m.warps, m.warps_bwd), tiles_per_step=(fwd_step, bwd_step),
                               registers_per_thread=regs)
    return flash2_forward(wl, m.block_q, m.block_kv, data, m.warps, fwd_step, regs)


def _io(wl: Workload, m: Flash2Blocks, pass_name: str) -> dict:
    from . import io_formulas as F
    if pass_name == "forward":
        return F.flash2_forward_io(wl, m.block_q, m.block_kv)
    return F.flash2_backward_io(wl, m.block_q_bwd, m.block_kv_bwd)


def _sram_bytes(wl: Workload, m: Flash2Blocks, training: bool) -> int:
    from .flash2_backward import flash2_bwd_sram_bytes
    fwd = flash2_sram_bytes(wl, m.block_q, m.block_kv)
    return max(fwd, flash2_bwd_sram_bytes(wl, m.block_q_bwd, m.block_kv_bwd)) if training else fwd


def _steps(wl: Workload, m: Flash2Blocks, training: bool, fast: bool = False) -> int:
    c = math.ceil
    kv_tiles = c(wl.seq_len_kv / m.block_kv)
    steps = wl.groups * c(wl.seq_len_q / m.block_q) * c(kv_tiles / (tiles_per_step(kv_tiles) if fast else 1))
    if training:      # the backward visits every (K/V block, query block) pair, about twice the work
        q_tiles = c(wl.seq_len_q / m.block_q_bwd)
        q_steps = c(q_tiles / (tiles_per_step(q_tiles) if fast else 1))
        steps += 2 * wl.groups * c(wl.seq_len_kv / m.block_kv_bwd) * q_steps
    return steps


def _describe(m: Flash2Blocks) -> str:
    same = (m.block_q_bwd, m.block_kv_bwd) == (m.block_q, m.block_kv)
    text = f"{m.block_q}x{m.block_kv}" + ("" if same else f" bwd {m.block_q_bwd}x{m.block_kv_bwd}")
    return text + (" (paper)" if m.variant == PAPER else "")


SPEC = register(AlgorithmSpec(
    name="flash2", label="FlashAttention-2 (Dao 2023)", mapping_type=Flash2Blocks,
    build=_build, io=_io, sram_bytes=_sram_bytes, resolve=_resolve, steps=_steps, describe=_describe,
    auto_fields=("block_q", "block_kv", "block_q_bwd", "block_kv_bwd", "warps", "warps_bwd"),
    variants=(FA2_KERNEL, PAPER),
    match_fields=("block_q", "block_kv"), kernel="flash_attention", emulated=True, coarsens=True))
