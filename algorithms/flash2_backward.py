"""FlashAttention-2 backward as a simulated program (Dao 2023, Algorithm 2), after flash2's forward.

Kernels (pass "backward"):
  bwd_dot_do_o   one block per (batch-head, query block): D_i = rowsum(dO_i * O_i), written in
                 fp32; it also clears the fp32 dQ accumulator, as FA2's preprocessing does.
  bwd            one block per (batch-head, K/V block): loads K_j, V_j once, keeps dK_j, dV_j on
                 chip; for each query block that can see the block it loads Q_i, dO_i, lse_i,
                 D_i, recomputes P from the log-sum-exp, and adds its dQ_i part into the
                 accumulator with atomic adds (counted as a read and a write of the tile).
                 A K/V block no query can see (causal) only writes dK_j = dV_j = 0.
  bwd_convert_dq one block per (batch-head, query block): dQ = dQ_accum in the storage dtype.
Dropout is regenerated from the seed: no mask bytes.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import Launch, Program
from hbmsim.simulator.tensor import L2Lines
from hbmsim.simulator.time_model import MMA_SYNC

from .backward_common import (bwd_vector_flops, d_o_tensor, grad_tensor, kv_block, named, recompute_p,
                              tile_grads, unseen_kv_block)
from .gqa import kv_grad_tensors, reduce_kv_grads
from .common import STATS_DTYPE, block_rows, fa2_batch_head, load_kv_len, row_blocks_period, scaled_keep_mask
from .flash2 import flash2_forward
from .workload import AttentionData, Workload, allowed


# What the backward's annotations (ctx.note below) mean, for `hbmsim explain`: a heading and, per
# value, the formula that made it (as flash2.py's NOTES describes the forward's).
NOTES = {
    "flash2 D": {"heading": "rows {rows}", "values": ({"D": "D = rowsum(dO o O)"},)},
    "flash2 bwd tile": {"heading": "tile: query rows {rows}, keys {cols}", "values": (
        {"lse": "lse (the forward's log-sum-exp)"}, {"P": "P = exp(scale Q K^T - lse)"},
        {"dV": "dV_j += P^T dO"}, {"dP": "dP = dO V^T"}, {"dS": "dS = P o (dP - D)"},
        {"dQ": "dQ_i += scale dS K"}, {"dK": "dK_j += scale dS^T Q"})},
}


# Registers per thread of FA2's two small backward kernels as compiled, by head dim: (dot_do_o,
# convert_dq). Nsight Compute launch__registers_per_thread on H100 for flash_bwd_dot_do_o_kernel
# (40 at head dim 64, 51 at 128) and flash_bwd_convert_dq_kernel (48 at both), the kernels PyTorch
# 2.11 vendors (scenarios/measured/h100-ncu-kernels.json): with 256 threads, 6, 4 and 5 blocks an
# SM (Nsight's launch__occupancy_limit_registers says the same). Other head dims: not measured.
# Used on every GPU, as the main kernels' 255 are (the sm80 build was not measured).
FA2_PREPROCESS_REGISTERS = {64: (40, 48), 128: (51, 48)}


def flash2_bwd_sram_bytes(wl: Workload, block_q: int, block_kv: int) -> int:
    itemsize = wl.itemsize
    return (2 * block_q + 2 * block_kv) * wl.head_dim * itemsize + block_q * block_kv * itemsize + 2 * block_q * 4


def fa2_bwd_atoms(wl: Workload, warps: int) -> tuple[int, int, int, bool]:
    """(AtomLayoutMSdP, AtomLayoutNdKV, AtomLayoutMdQ, Is_V_in_regs) of the FlashAttention-2
    backward kernel for this head dim on A100/H100 (flash_bwd_launch_template.h, v2.0.0-v2.3.6:
    Flash_bwd_kernel_traits<d, kBlockM, kBlockN, kNWarps=8, MSdP, NdKV, MdQ, V_in_regs, ...>).
    Each AtomLayout is how many warps tile the first dimension of that GEMM's output (S and dP:
    along M; dK and dV: along N; dQ: along M); the rest of the warps tile the second. Clamped to
    `warps` when the mapping gives another warp count."""
    d, dropout = wl.head_dim, wl.dropout > 0
    if d <= 32:
        atoms, v_regs = (4, 4, 4), not dropout
    elif d <= 64:
        atoms, v_regs = (4, 4, 4), False
    elif d <= 96:
        atoms, v_regs = (2, 4, 4), not dropout
    elif d <= 128:
        atoms, v_regs = (2, 4, 2), False
    elif d <= 160 or 192 < d <= 224:
        atoms, v_regs = (4, 4, 4), False
    else:                        # 192 and 256
        atoms, v_regs = (4, 2, 2), False
    a_sdp, a_dkv, a_dq = (min(a, warps) for a in atoms)
    return a_sdp, a_dkv, a_dq, v_regs


def bwd_sram_read_elements(n: int, nc: int, d: int, warps: int, atoms: tuple) -> int:
    """Shared-memory elements one (query block, key block) step of the FA2 backward reads and
    writes: in a GEMM whose warps are a x b (a along the output's rows, b along its columns),
    each warp reads its slice of the A operand and of the B operand, so A is read b times and B a
    times in all. P and dS are written to shared memory once each, for the GEMMs that read them."""
    a_sdp, a_dkv, a_dq, v_regs = atoms
    b_sdp, b_dkv, b_dq = warps // a_sdp, warps // a_dkv, warps // a_dq
    q = do = n * d                 # Q_i, dO_i
    k = v = nc * d                 # K_j, V_j
    p = ds = n * nc                # P_ij, dS_ij
    return (q * b_sdp + k * a_sdp                          # S = Q K^T
            + do * b_sdp + (0 if v_regs else v * a_sdp)    # dP = dO V^T (V from registers when V_in_regs)
            + p * b_dkv + do * a_dkv                       # dV += P^T dO
            + ds * b_dkv + q * a_dkv                       # dK += dS^T Q
            + ds * b_dq + k * a_dq                         # dQ = dS K
            + p + ds)                                      # P and dS written to shared memory


def flash2_training(wl: Workload, block_q: int, block_kv: int, data: AttentionData | None = None,
                    bwd_blocks: tuple | None = None, warps: tuple = (1, 1), tiles_per_step: tuple = (1, 1),
                    registers_per_thread: int = 0, fixed_instructions: int = 0,
                    step_instructions: tuple = (), tile_rows: int = 0, whole_tiles: bool = False) -> Program:
    """The forward with block_q x block_kv, then the backward with bwd_blocks (block_q, block_kv)
    when given (the FA2 kernel picks the backward's blocks separately), else the same blocks.
    `warps` (forward, backward) set the shared-memory reads the time model sees (with 1 warp
    every operand is read once); they never change a byte of traffic. `tiles_per_step`
    (forward K/V tiles, backward query tiles; fast mode): tiles one simulated step covers.
    `registers_per_thread`: the compiled kernels' (0: not known), for the `registers` effect;
    `fixed_instructions`, `step_instructions`, `tile_rows`: the forward's (flash2_forward);
    `whole_tiles`: both passes compute their kernels' whole tiles at the sequence's ends (the
    forward's whole_kv, the backward's whole_tiles)."""
    fwd = flash2_forward(wl, block_q, block_kv, data, warps[0], tiles_per_step[0], registers_per_thread,
                         fixed_instructions=fixed_instructions, step_instructions=step_instructions,
                         tile_rows=tile_rows, whole_kv=whole_tiles)
    bwd, grads = flash2_backward(wl, fwd, *(bwd_blocks or (block_q, block_kv)), data, warps=warps[1],
                                 q_step=tiles_per_step[1], registers_per_thread=registers_per_thread,
                                 whole_tiles=whole_tiles)
    return Program("flash2_training", list(fwd.launches) + bwd, inputs=fwd.inputs, outputs={**fwd.outputs, **grads})


def flash2_backward(wl: Workload, fwd: Program, block_q: int, block_kv: int, data: AttentionData | None,
                    warps: int = 1, q_step: int = 1, registers_per_thread: int = 0,
                    batch_first: bool = True, whole_tiles: bool = False) -> tuple:
    """Algorithm 2's launches after the forward `fwd`, with block_q x block_kv, and its gradients
    {dQ, dK, dV}. `whole_tiles`: a last query or K/V block past the sequence computes the whole
    block_q x block_kv tile, as the kernel's MMAs do (its rows loaded as zeros: flash_bwd_kernel.h,
    Is_even_MN false); false: its real rows only. `warps`: the backward kernel's; `q_step`: query
    tiles one simulated step covers; `batch_first`: FA2's grids (blocks, batch, heads), a block's
    batch turning before its head (common.fa2_batch_head); false: the batch-heads in order, heads
    first (FA3's grids)."""
    warps_bwd = warps
    atoms = fa2_bwd_atoms(wl, warps_bwd)
    tensors = named(fwd)
    Q, K, V, O, LSE = tensors["Q"], tensors["K"], tensors["V"], tensors["O"], tensors["lse"]
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    dO = d_o_tensor(wl, data)
    D = grad_tensor("D", LSE, data)
    dQacc = grad_tensor("dQ_accum", Q, data, STATS_DTYPE)
    dQ, dK, dV = grad_tensor("dQ", Q, data), *kv_grad_tensors(wl, K, V, data)
    tr, tc = math.ceil(nq / block_q), math.ceil(nk / block_kv)
    scale, itemsize = wl.softmax_scale, wl.itemsize
    keep = scaled_keep_mask(wl, data)
    numeric = data is not None
    all_cols, one = slice(0, d), slice(0, 1)
    lines = L2Lines(block_q)              # a coarse step's query rows as the L2 keeps them

    def q_rows(i):
        return block_rows(i, block_q, nq)

    def batch_head(bh):
        return fa2_batch_head(wl, bh) if batch_first else bh

    def dot_do_o(ctx, index):
        bh, i = divmod(index, tr)
        g = batch_head(bh)
        rows = q_rows(i)
        n = rows.stop - rows.start
        d_o, o = yield from ctx.load_tiles((dO[g], rows, all_cols), (O[g], rows, all_cols))
        yield from ctx.compute(vector_flops=2 * n * d)        # D = rowsum(dO o O): a multiply and an add per element
        big_d = None if not numeric else (d_o * o).sum(axis=1, keepdims=True)
        if numeric:
            ctx.note("flash2 D", g=g, rows=(rows.start, rows.stop), D=big_d[:, 0])
        yield from ctx.store_tiles((D[g], rows, one, big_d),
                                   (dQacc[g], rows, all_cols, np.zeros((n, d)) if numeric else None))

    def bwd(ctx, index):
        bh, j = divmod(index, tc)
        g, cols, nc, i_first = kv_block(wl, batch_head(bh) * tc + j, tc, block_kv, block_q)
        c0, c1 = cols.start, cols.stop
        if i_first >= tr:       # no query sees this block: its gradients are zero
            yield from unseen_kv_block(ctx, dK, dV, g, cols, d, numeric)
            return
        kv_len = yield from load_kv_len(ctx, tensors, wl, g)
        k, v = yield from ctx.load_tiles((K[wl.kv_group(g)], cols, all_cols), (V[wl.kv_group(g)], cols, all_cols))
        dk_acc = dv_acc = None
        if numeric:
            dk_acc, dv_acc = np.zeros((nc, d)), np.zeros((nc, d))
        # steps end at multiples of q_step, so that every K/V block's steps cover the same query
        # tiles whatever i_first. Under a causal mask the L2 keeps a step's Q, dO, lse, D (and dQ's
        # atomics) as lines of block_q rows (L2Lines), the lines the forward and dot_do_o made, as
        # every K/V block sees them whatever its first step (one line a step made the backward's
        # DRAM bytes 1.2-2.1x); without one every block's steps are alike, one line a step.
        def step(i):
            """(query tiles, rows, their L2 lines, the Q, dO, lse and D tiles) of the step at query tile i."""
            tiles = min(tr, (i // q_step + 1) * q_step) - i      # query tiles in this step
            rows = slice(q_rows(i).start, q_rows(i + tiles - 1).stop)
            by_tile = (lines,) if wl.causal and tiles > 1 else ()
            loads = [(T[g], rows, c, *by_tile) for T, c in ((Q, all_cols), (dO, all_cols), (LSE, one), (D, one))]
            return tiles, rows, by_tile, loads

        # The kernel loads the next step's Q (double-buffered sQ) and dO while this step's last GEMMs
        # run (flash_bwd_kernel.h: "Double buffer for sQ", then dO once the dV GEMM is done with sdO):
        # each step's tiles are prefetched during the step before, their latency under its compute.
        plan = [step(i) for i in (i_first, *range((i_first // q_step + 1) * q_step, tr, q_step))]
        ahead = ctx.prefetch(*plan[0][3])
        for at, (tiles, rows, by_tile, _) in enumerate(plan):
            r0, r1 = rows.start, rows.stop
            n = r1 - r0
            q, d_o, lse, big_d = yield from ctx.wait(ahead)
            if at + 1 < len(plan):
                ahead = ctx.prefetch(*plan[at + 1][3])
            # five n x nc x d products at 2 FLOPs per multiply-add: S = Q K^T, dV += P^T dO, dP = dO V^T,
            # dQ += dS K, dK += dS^T Q; recomputing P takes an exp per score; SRAM: every warp's
            # operand slices (bwd_sram_read_elements). Several query tiles in one step: everything
            # grows with the rows n except the reads of K_j and V_j, which come once per tile.
            # (whole_tiles: the tiles' rows and columns, a last block's past the sequence too)
            n_work, nc_work = (tiles * block_q, block_kv) if whole_tiles else (n, nc)
            sram_elements = (bwd_sram_read_elements(n_work, nc_work, d, warps_bwd, atoms)
                             + (tiles - 1) * bwd_sram_read_elements(0, nc_work, d, warps_bwd, atoms))
            yield from ctx.compute(matmul_flops=10 * n_work * nc_work * d,
                                   vector_flops=bwd_vector_flops(wl, n_work, nc_work),
                                   sram_bytes=sram_elements * itemsize, exp_ops=n_work * nc_work)
            dq_part = None
            if numeric:
                p = recompute_p(wl, scale, q, k, allowed(wl, kv_len, r0, r1, c0, c1), lse[:, 0])
                steps: dict = {}
                dq_part, dk_part, dv_part = tile_grads(wl, scale, q, k, v, d_o, p, big_d[:, 0],
                                                       None if keep is None else keep[g, r0:r1, c0:c1], steps)
                ctx.note("flash2 bwd tile", g=g, rows=(r0, r1), cols=(c0, c1), lse=lse[:, 0], P=p, dV=dv_part,
                         dP=steps["dP"], dS=steps["dS"], dQ=dq_part, dK=dk_part)
                dk_acc += dk_part
                dv_acc += dv_part
            yield from ctx.atomic_add(dQacc[g], rows, all_cols, dq_part, *by_tile)
        yield from ctx.store_tiles((dK[g], cols, all_cols, dk_acc), (dV[g], cols, all_cols, dv_acc))

    def convert_dq(ctx, index):
        bh, i = divmod(index, tr)
        g = batch_head(bh)
        rows = q_rows(i)
        acc = yield from ctx.load(dQacc[g], rows, all_cols)
        yield from ctx.store(dQ[g], rows, all_cols, acc)

    # the D and dQ conversion blocks are alike under any mask (they do not look at it)
    q_period = 1 if nq % block_q == 0 else tr
    # one call of the library's backward (run_mha_bwd) launches all three kernels: the host
    # dispatches one op (an autograd node) before the first and only launches the others (host_ops 0)
    # The two small kernels run with the backward's kNThreads (flash_bwd_launch_template.h launches
    # both with Kernel_traits::kNThreads threads, the dQ conversion with kSmemdQSize = block_q x d
    # elements of shared memory); their registers are known for the compiled FA2 kernels only.
    threads = 32 * warps_bwd
    regs_do_o, regs_dq = FA2_PREPROCESS_REGISTERS.get(d, (0, 0)) if registers_per_thread else (0, 0)
    launches = [
        Launch("flash2_bwd_dot_do_o", g_count * tr, 0, dot_do_o, allocs=(dO, D, dQacc), pass_name="backward",
               period=q_period, threads_per_block=threads, registers_per_thread=regs_do_o),
        Launch("flash2_bwd", g_count * tc, flash2_bwd_sram_bytes(wl, block_q, block_kv), bwd, allocs=(dK, dV),
               pass_name="backward", tensor_op=MMA_SYNC, period=row_blocks_period(wl, block_kv, nk),
               threads_per_block=threads, registers_per_thread=registers_per_thread, host_ops=0),
        Launch("flash2_bwd_convert_dq", g_count * tr, block_q * d * wl.itemsize, convert_dq, allocs=(dQ,),
               frees=(dQacc, D), pass_name="backward", period=q_period, host_ops=0, threads_per_block=threads,
               registers_per_thread=regs_dq),
    ]
    # kv_heads < heads: dK, dV per query head (dk_expanded), then at::sum_out over each group (mha_bwd)
    sums, grads = reduce_kv_grads(wl, dK, dV, data)
    return launches + sums, {"dQ": dQ, **grads}
