"""FlashAttention-3's split-KV combine kernel as a simulated launch (hopper/flash_fwd_combine_kernel.h,
flash_fwd_combine_launch_template.h, flash_api.cpp run_mha_fwd_combine; commit 0251105a).

After a forward whose K/V range is split over `num_splits` thread blocks (each writing an fp32
partial O and its log-sum-exp, flash3.flash3_forward), one block per (kBlockM rows of a batch's
(head, query row) pairs, kBlockK columns of the head dim, batch), 256 threads:
1. loads every split's lse of its rows (cp.async), and the partial O of splits 0..kStages-2 (in
   flight while it reduces the lse: "Step 2 ... as we compute the LSE");
2. lse = log sum_s exp(lse_s) with the max taken out, and each split's scale exp(lse_s - lse);
   the column block 0 writes lse;
3. O = sum_s scale_s O_s, split after split, the partial O of split s + kStages - 1 loaded while
   split s is added in (a ring of kStages = 4 shared-memory stages), then O in the output dtype.
kBlockK is 64 for head dims up to 64, else 128; kBlockM 16 and 8 for them ("as small as possible
to maximize parallelism"). Numerics: the float64 combination flash2's combine computes
(flash2_splitkv.combined).
"""
from __future__ import annotations

import math


from hbmsim.simulator import Launch

from .flash2_splitkv import combined_rows, flat_row_pieces

COMBINE_THREADS = 256      # kNThreads (run_flash_fwd_combine)
COMBINE_STAGES = 4         # kStages (FlashAttnFwdCombine)


def combine_tile(head_dim: int) -> tuple[int, int]:
    """(kBlockM, kBlockK): kBlockK 64 for dv <= 64 else 128 (run_mha_fwd_combine); kBlockM 8 where
    kBlockK is a multiple of 128, 16 of 64 (run_mha_fwd_combine_)."""
    block_k = 64 if head_dim <= 64 else 128
    return (8 if block_k % 128 == 0 else 16), block_k


def combine_blocks(wl, head_dim: int) -> int:
    """The combine's grid: ceil(Nq x heads / kBlockM) x ceil(d / kBlockK) x batch."""
    block_m, block_k = combine_tile(head_dim)
    return math.ceil(wl.seq_len_q * wl.heads / block_m) * math.ceil(head_dim / block_k) * wl.batch


def fa3_combine_launch(wl, num_splits: int, O_acc, L_acc, O, LSE, numeric: bool) -> Launch:
    """The combine launch over `wl` (its query heads' rows, packed by the forward or not: the partial
    outputs are in the unpacked layout either way)."""
    G, H, nq, d = wl.groups, wl.heads, wl.seq_len_q, wl.head_dim
    block_m, block_k = combine_tile(d)
    m_blocks, k_blocks = math.ceil(nq * H / block_m), math.ceil(d / block_k)
    one = slice(0, 1)

    def block(ctx, index):
        b, rest = divmod(index, m_blocks * k_blocks)
        kb, mb = divmod(rest, m_blocks)          # grid (m blocks, k blocks, batch): m fastest
        # (batch-head, rows) of the block's (head, row) pairs: rows of batch b's heads laid end to end
        pieces = flat_row_pieces(nq, b * H * nq + mb * block_m, b * H * nq + min(nq * H, (mb + 1) * block_m))
        rows_n = sum(r.stop - r.start for _, r in pieces)
        cols = slice(kb * block_k, min(d, (kb + 1) * block_k))
        nk = cols.stop - cols.start
        lse_load = ctx.prefetch(*[(L_acc[s * G + g], r, one) for s in range(num_splits) for g, r in pieces])
        ahead = COMBINE_STAGES - 1               # the partial O of the first kStages - 1 splits, in flight
        o_loads = [ctx.prefetch(*[(O_acc[s * G + g], r, cols) for g, r in pieces]) for s in range(min(ahead,
                                                                                                   num_splits))]
        lses = yield from ctx.wait(lse_load)
        # lse = log sum_s exp(lse_s) with the max taken out (a max, a sub + exp and a sum per value; a log
        # and an add per row), then each scale exp(lse_s - max) x (1 / sum): a multiply per value
        yield from ctx.compute(vector_flops=5 * num_splits * rows_n + 2 * rows_n, exp_ops=num_splits * rows_n)
        parts = []
        for s in range(num_splits):
            if s + ahead < num_splits:           # the ring's next stage
                o_loads.append(ctx.prefetch(*[(O_acc[(s + ahead) * G + g], r, cols) for g, r in pieces]))
            parts += yield from ctx.wait(o_loads[s])
            yield from ctx.compute(vector_flops=2 * rows_n * nk)      # O += scale_s O_s: a multiply-add
        stores = []
        for g, r, o_tile, lse_tile, _, _ in combined_rows(pieces, lses, parts, num_splits, numeric):
            stores.append((O[g], r, cols, o_tile))
            if kb == 0:                          # the column block 0 writes lse
                stores.append((LSE[g], r, one, lse_tile))
        yield from ctx.store_tiles(*stores)

    # shared memory: the lse of every split (kMaxSplits, a power of two) x kBlockM fp32, and the
    # ring of kStages partial O tiles (kBlockM x kBlockK fp32)
    max_splits = max(16, 1 << (num_splits - 1).bit_length())
    smem = max_splits * block_m * 4 + COMBINE_STAGES * block_m * block_k * 4
    # fold.py's period: with one column block and whole row blocks every block does alike work; else
    # blocks a batch apart do
    period = 1 if k_blocks == 1 and (nq * H) % block_m == 0 else m_blocks * k_blocks
    return Launch("flash3_fwd_combine", m_blocks * k_blocks * wl.batch, smem, block, allocs=(O, LSE),
                  frees=(O_acc, L_acc), period=period, threads_per_block=COMBINE_THREADS, host_ops=0)
