"""The FlashAttention v1.0.9 kernel's backward (spec8 section 1; see flash1_kernel.py), after its
forward: non-parallel (`compute_dq_dk_dv_1xN`, one block per batch-head) or seq-parallel (zero
dq_tmp, dot_do_o, one block per (batch-head, key block) with fp32 atomics into dq_tmp, then dq_tmp
-> dQ), chosen by `fa1_bwd_parallel` (num_splits_heuristic_bwd). Dropout regenerates its mask
in-kernel (Philox): no mask bytes.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import Launch, Program
from hbmsim.simulator.time_model import MMA_SYNC

from .backward_common import (bwd_vector_flops, d_o_tensor, grad_tensor, named, recompute_p, tile_grads,
                              unseen_kv_block)
from .gqa import kv_grad_tensors, reduce_kv_grads
from .common import STATS_DTYPE, load_kv_len, scaled_keep_mask
from .flash1_kernel import (BWD_THREADS, BWD_WARPS_N, DOT_DO_O_REGISTERS, DOT_DO_O_ROWS, QUERY_STEP, fa1_kernel_forward,
                            fa1_kernel_sram_bytes, fa1_registers, key_blocks, query_step_rows)
from .workload import AttentionData, Workload, allowed


def fa1_kernel_training(wl: Workload, block_kv: int, num_splits: int, bwd_parallel: bool,
                        data: AttentionData | None = None) -> Program:
    """The kernel's forward (num_splits thread blocks per batch-head), then its backward."""
    fwd = fa1_kernel_forward(wl, block_kv, num_splits, data)
    bwd, grads = fa1_kernel_backward(wl, fwd, block_kv, bwd_parallel, data)
    return Program("flash1_kernel_training", list(fwd.launches) + bwd, inputs=fwd.inputs,
                   outputs={**fwd.outputs, **grads})


def fa1_kernel_backward(wl: Workload, fwd: Program, block_kv: int, bwd_parallel: bool,
                        data: AttentionData | None) -> tuple:
    """The backward's launches after the forward `fwd`: seq-parallel (zero dq_tmp, dot_do_o, one
    block per (batch-head, key block), convert dQ) or one block per batch-head; and {dQ, dK, dV}."""
    tensors = named(fwd)
    Q, K, V, O, LSE = tensors["Q"], tensors["K"], tensors["V"], tensors["O"], tensors["lse"]
    g_count, nq, d = wl.groups, wl.seq_len_q, wl.head_dim
    dO = d_o_tensor(wl, data)
    D = grad_tensor("D", LSE, data)                                 # softmax_d, fp32
    dQ, dK, dV = grad_tensor("dQ", Q, data), *kv_grad_tensors(wl, K, V, data)
    kblocks = key_blocks(wl, block_kv)
    n_kb, n_steps = len(kblocks), math.ceil(nq / QUERY_STEP)
    loop = n_kb > 1
    # dq_tmp: fp32, `if (loop)` in the non-parallel path (fmha_api.cpp:450-451); always (zeroed)
    # in the seq-parallel one (:483-490).
    DQT = grad_tensor("dq_tmp", Q, data, STATS_DTYPE) if (loop or bwd_parallel) else None
    scale, itemsize = wl.softmax_scale, wl.itemsize
    keep = scaled_keep_mask(wl, data)
    numeric = data is not None
    all_cols, one = slice(0, d), slice(0, 1)
    sram = fa1_kernel_sram_bytes(wl, block_kv, True)
    n_chunks = math.ceil(nq / DOT_DO_O_ROWS)

    def step_rows(i):
        rows = query_step_rows(i, nq)
        return rows, rows.start, rows.stop, rows.stop - rows.start

    def step_loads(g, i, with_o=False):
        """The tiles a 16-row step reads ahead: Q_i, dO_i, lse_i, and D_i, or with_o O_i (the
        one-block-per-batch-head kernel's first key block, which computes D_i from it)."""
        rows = step_rows(i)[0]
        return (Q[g], rows, all_cols), (dO[g], rows, all_cols), (LSE[g], rows, one), \
            ((O[g], rows, all_cols) if with_o else (D[g], rows, one))

    def put_d(ctx, g, i, d_o, o):
        """D_i = rowsum(dO_i o O_i) (2*n*d FLOPs: multiply + row sum), written to softmax_d and
        read back (the first step's at :327 and :369, the next one's at :632-638 and :671-672):
        returns the read's handle, to `wait` for where D_i is used."""
        rows, _, _, n = step_rows(i)
        yield from ctx.compute(vector_flops=2 * n * d)
        yield from ctx.store(D[g], rows, one, (d_o * o).sum(axis=1, keepdims=True) if numeric else None)
        return ctx.prefetch((D[g], rows, one))

    def read_lens(ctx, g):
        return (yield from load_kv_len(ctx, tensors, wl, g))

    def tile(ctx, g, kv_len, q, k, v, d_o, lse, big_d, r0, r1, c0, c1, extra_vector, between=None):
        """One (key block, query step) of the backward: FLOPs, then the numeric gradients (dQ_i,
        dK_j, dV_j parts) and what `between` (run after the GEMMs, before the dQ reduction) returned."""
        n, nc = r1 - r0, c1 - c0
        # FLOPs: five GEMMs of 2*n*nc*d (S = QK^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q,
        # dQ = dS K); vector: recompute P and dS per score (bwd_vector_flops) plus extra_vector.
        # SRAM: every warp reads all of Q_i and dO_i, each for two GEMMs (4*W*n*d*e), S/dS staged
        # transposed through Smem_tile_s (2*n*nc*e written and read back), K_j/V_j re-read from
        # smem (2*nc*d*e).
        W = BWD_WARPS_N
        gemms = dict(matmul_flops=10 * n * nc * d, vector_flops=bwd_vector_flops(wl, n, nc) + extra_vector,
                     sram_bytes=(4 * W * n * d + 2 * n * nc + 2 * nc * d) * itemsize,
                     exp_ops=n * nc)                            # recomputing P: an exp per score
        # the split-K reduction of dQ_i, after the GEMM it depends on: W partial n x d fp32
        # written to smem_dq and read back, (W-1)*n*d adds
        reduction = dict(vector_flops=(W - 1) * n * d, sram_bytes=2 * W * n * d * 4)
        got = None
        if between is None:
            yield from ctx.compute_chain(gemms, reduction)
        else:
            yield from ctx.compute_chain(gemms)
            got = yield from between()
            yield from ctx.compute_chain(reduction)
        if not numeric:
            return None, None, None, got
        p = recompute_p(wl, scale, q, k, allowed(wl, kv_len, r0, r1, c0, c1), lse[:, 0])
        return (*tile_grads(wl, scale, q, k, v, d_o, p, big_d[:, 0], None if keep is None else keep[g, r0:r1, c0:c1]),
                got)

    def load_kv(ctx, g, cols, first_step):
        """K_j and V_j of key block `cols` with the tiles of its first step (`first_step`), loaded
        together (fmha_dgrad_kernel_1xN_loop.h:308-317: the loads of K, Q, V, dO and O are triggered
        at once); its dK_j, dV_j accumulators (zeros; None without data); the first step's tiles."""
        k, v, *first = yield from ctx.load_tiles((K[wl.kv_group(g)], cols, all_cols),
                                                 (V[wl.kv_group(g)], cols, all_cols), *first_step)
        nc = cols.stop - cols.start
        return (k, v, np.zeros((nc, d)), np.zeros((nc, d)), first) if numeric else (k, v, None, None, first)

    def bwd_loop(ctx, g):
        """compute_dq_dk_dv_1xN: one block per batch-head walks every key block."""
        kv_len = yield from read_lens(ctx, g)
        for j, (c0, c1, begin, next_begin) in enumerate(kblocks):
            cols = slice(c0, c1)
            if begin >= n_steps:                      # no rows: dK_j = dV_j = 0 (:273-290)
                yield from unseen_kv_block(ctx, dK, dV, g, cols, d, numeric)
                continue
            k, v, dk_acc, dv_acc, ahead = yield from load_kv(ctx, g, cols, step_loads(g, begin, j == 0))
            if j == 0:                                # Is_first: D of the first step before the loop (:327, :369)
                d_back = yield from put_d(ctx, g, begin, ahead[1], ahead[3])
            nxt = None
            for i in range(begin, n_steps):
                rows, r0, r1, n = step_rows(i)
                if i > begin and j > 0:
                    ahead = yield from ctx.wait(nxt)
                q, d_o, lse, big_d = ahead            # (for j = 0 the fourth is O_i: D_i is read back)
                if j == 0:
                    (big_d,) = yield from ctx.wait(d_back)
                # the next step's tiles load during this one (as in bwd_seqparallel); the fp32
                # dq_tmp_i is loaded mid-step and used at its end (:628)
                nxt = ctx.prefetch(*step_loads(g, i + 1, j == 0)) if i + 1 < n_steps else None
                dq_tmp = ctx.prefetch((DQT[g], rows, all_cols)) if j > 0 else None
                between = None
                if j == 0 and nxt is not None:        # Is_first: the next step's D, from its dO and O (:632-638)
                    def between(nxt=nxt, i=i):
                        tiles = yield from ctx.wait(nxt)
                        return tiles, (yield from put_d(ctx, g, i + 1, tiles[1], tiles[3]))
                # extra vector work: n*d adds of the loaded fp32 dq_tmp (j > 0)
                dq_part, dk_part, dv_part, got = yield from tile(ctx, g, kv_len, q, k, v, d_o, lse, big_d,
                                                                 r0, r1, c0, c1, n * d if j > 0 else 0, between)
                if got is not None:
                    ahead, d_back = got
                (dq_prev,) = (yield from ctx.wait(dq_tmp)) if dq_tmp is not None else (None,)
                dq = None
                if numeric:
                    dk_acc += dk_part
                    dv_acc += dv_part
                    dq = dq_part if dq_prev is None else dq_prev + dq_part
                final = i < next_begin                # last key block or causal diagonal (:678-699)
                yield from ctx.store(dQ[g] if final else DQT[g], rows, all_cols, dq)
            yield from ctx.store_tiles((dK[g], cols, all_cols, dk_acc), (dV[g], cols, all_cols, dv_acc))

    def zero_dq_tmp(ctx, index):                      # host dq_tmp.zero_() (fmha_api.cpp:483-490)
        g, c = divmod(index, n_chunks)
        rows = slice(c * DOT_DO_O_ROWS, min(nq, (c + 1) * DOT_DO_O_ROWS))
        yield from ctx.store(DQT[g], rows, all_cols, np.zeros((rows.stop - rows.start, d)) if numeric else None)

    def dot_do_o(ctx, index):                         # fmha_bwd_dot_do_o_kernel, 128 rows per block
        g, c = divmod(index, n_chunks)
        rows = slice(c * DOT_DO_O_ROWS, min(nq, (c + 1) * DOT_DO_O_ROWS))
        d_o, o = yield from ctx.load_tiles((dO[g], rows, all_cols), (O[g], rows, all_cols))
        yield from ctx.compute(vector_flops=2 * (rows.stop - rows.start) * d)   # multiply + row sum
        yield from ctx.store(D[g], rows, one, (d_o * o).sum(axis=1, keepdims=True) if numeric else None)

    def bwd_seqparallel(ctx, index):                  # compute_dq_dk_dv_seqparallel, grid (b, h, n_kb)
        j, g = divmod(index, g_count)                 # blockIdx.z = key block, slowest
        c0, c1, begin, _ = kblocks[j]
        cols = slice(c0, c1)
        if begin >= n_steps:
            yield from unseen_kv_block(ctx, dK, dV, g, cols, d, numeric)
            return
        kv_len = yield from read_lens(ctx, g)
        # Each step's Q_i, dO_i (double-buffered in smem), lse_i and D_i (registers) are loaded
        # during the step before (fmha_dgrad_kernel_1xN_loop.h:454-458, 529-537, 641, 671-672, "Trigger
        # the load for the next ..."); the first step's with K_j and V_j.
        # (not coarsened in fast mode: with the loads a step ahead, 2-4 steps at once ran within
        # 0.1% at N >= 8192 but hardly faster, and 4 at N = 1024 +2.2%)
        k, v, dk_acc, dv_acc, ahead = yield from load_kv(ctx, g, cols, step_loads(g, begin))
        nxt = None
        for i in range(begin, n_steps):
            rows, r0, r1, n = step_rows(i)
            if i > begin:
                ahead = yield from ctx.wait(nxt)
            q, d_o, lse, big_d = ahead
            nxt = ctx.prefetch(*step_loads(g, i + 1)) if i + 1 < n_steps else None
            dq_part, dk_part, dv_part, _ = yield from tile(ctx, g, kv_len, q, k, v, d_o, lse, big_d, r0, r1, c0, c1, 0)
            if numeric:
                dk_acc += dk_part
                dv_acc += dv_part
            yield from ctx.atomic_add(DQT[g], rows, all_cols, dq_part)    # fp32 atomicAdd (:700-708)
        yield from ctx.store_tiles((dK[g], cols, all_cols, dk_acc), (dV[g], cols, all_cols, dv_acc))

    def convert_dq(ctx, index):                       # host dq.copy_(dq_tmp): fp32 -> storage dtype
        g, c = divmod(index, n_chunks)
        rows = slice(c * DOT_DO_O_ROWS, min(nq, (c + 1) * DOT_DO_O_ROWS))
        acc = yield from ctx.load(DQT[g], rows, all_cols)
        yield from ctx.store(dQ[g], rows, all_cols, acc)

    # every (batch-head, key block) block alike when no mask changes its steps and the key blocks are
    # whole: what lets the machine fold the launch in fast mode (program.Launch.period; 0: never)
    regs = fa1_registers(wl, block_kv, True)
    kb_period = 1 if not wl.causal and not wl.key_padding_mask and wl.seq_len_kv % block_kv == 0 else 0
    if bwd_parallel:
        bwd = [
            Launch("fa1_bwd_zero_dq_tmp", g_count * n_chunks, 0, zero_dq_tmp, allocs=(dO, DQT, dQ, dK, dV),
                   pass_name="backward"),
            Launch("fa1_bwd_dot_do_o", g_count * n_chunks, 0, dot_do_o, allocs=(D,), pass_name="backward",
                   threads_per_block=BWD_THREADS, registers_per_thread=DOT_DO_O_REGISTERS),
            Launch("fa1_bwd_seqparallel", g_count * n_kb, sram, bwd_seqparallel, pass_name="backward",
                   tensor_op=MMA_SYNC, period=kb_period, threads_per_block=BWD_THREADS, registers_per_thread=regs),
            Launch("fa1_bwd_convert_dq", g_count * n_chunks, 0, convert_dq, frees=(DQT, D), pass_name="backward"),
        ]
    else:
        allocs = (dO, D, dQ, dK, dV) + ((DQT,) if DQT is not None else ())
        frees = (D,) + ((DQT,) if DQT is not None else ())
        bwd = [Launch("fa1_bwd", g_count, sram, bwd_loop, allocs=allocs, frees=frees, pass_name="backward",
                      tensor_op=MMA_SYNC, threads_per_block=BWD_THREADS, registers_per_thread=regs)]
    sums, grads = reduce_kv_grads(wl, dK, dV, data)       # kv_heads < heads: dK, dV per query head, summed
    return bwd + sums, {"dQ": dQ, **grads}
