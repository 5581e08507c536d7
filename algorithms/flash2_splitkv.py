"""FlashAttention-2's split-KV forward (Flash-Decoding, FA2 v2.1+) and its decode packing, as
simulated programs: csrc/flash_attn/src/flash_fwd_kernel.h (compute_attn_1rowblock_splitkv,
combine_attn_seqk_parallel), flash_fwd_launch_template.h (run_mha_fwd_splitkv_dispatch) and
flash_api.cpp (num_splits_heuristic, set_params_splitkv, seqlenq_ngroups_swapped), read, not copied.

Split kernel (flash_fwd_splitkv_kernel): one thread block per (batch-head, split, query block),
query blocks fastest, splits next, batch-heads last, as FA2's grid (num_m_blocks, num_splits,
b*h). Split s covers the K/V blocks [s*nbps, (s+1)*nbps) with nbps = ceil(ceil(Nk/Bc)/splits),
cut further by the causal mask; a block whose range is empty writes zeros to its partial O and
-inf to its log-sum-exp and reads nothing. Otherwise it loads Q_i (and kv_lens), streams its
K/V tiles as flash2 does, and writes its partial O (fp32, normalised by its own l) and its
log-sum-exp (fp32) per split: O_accum, lse_accum. With one split (num_splits = 1, which FA2 runs
through this kernel only to append new K/V) it writes O and lse directly.

Combine kernel (flash_fwd_splitkv_combine_kernel): the rows of every batch-head laid end to end,
kBlockM = 4, 8 or 16 rows a block (head dim rounded to the kernel's a multiple of 128, of 64, or
else); a block reads every split's log-sum-exp of its rows, computes lse = log sum exp(lse_s),
writes it, then reads every split's partial O and writes O = sum_s exp(lse_s - lse) O_s.

Decode packing (`pack`, FA2's seqlenq_ngroups_swapped): with one query row, no dropout, and query
heads sharing K/V heads, the heads of a group become the rows of one query block, so K/V are read
once per K/V head, not once per query head. It is a change of workload: heads = kv_heads,
seq_len_q = heads / kv_heads, causal off (one query row sees every key). `packed` makes it, and
the data with it (Q's (B, H, 1, d) is (B, Hkv, H/Hkv, d) in the same memory order; so is O).

KV-cache append (`kv_append`, flash_attn_with_kvcache's k / v arguments): the last seq_len_q
rows of K and V are the new tokens, in tensors K_new, V_new; every split-kernel block whose K/V
range holds some of them first copies those rows from K_new / V_new into the cache (K, V), as
FA2's Append_KV does (so with unpacked GQA each query head's block copies them again).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from hbmsim.simulator import HbmsimError, Launch, Program, Tensor
from hbmsim.simulator.time_model import MMA_SYNC

from .common import (STATS_DTYPE, block_rows, normalised_rows, unnormalised_softmax_step, input_tensors, masked_scores,
                     output, tiles_per_step)
from .flash2 import flash2_sram_bytes, pv_work, qk_softmax_work
from .flash3_pack import PackGQA
from .paged import KVLayout, table_entries
from .workload import AttentionData, Workload, causal_kv_end

SPLITKV_BLOCK_M = 64        # run_mha_fwd_splitkv_dispatch's kBlockM
MAX_SPLITS = 128            # set_params_splitkv: TORCH_CHECK(num_splits <= 128)
SPLITKV_WARPS = 4           # Flash_fwd_kernel_traits<Headdim, 64, kBlockN, 4, ...>
COMBINE_THREADS = 128
# A warp's fixed instructions, run once a block (fixed_chain effect), head dim 128 (the decode
# sets'), from Nsight's smsp__inst_executed over the blocks' warps (h100/h200-ncu-decode.json, the
# same on both GPUs): the split kernel 1,970 a warp at 1 K/V tile and 5,352 at 4 (36,768 at 32):
# 843 + 1,127 a tile; the combine kernel 619, 670 and 961 at 4, 8 and 32 splits: 573 + 12 a split.
# Other head dims: not measured (0).
SPLITKV_FIXED_INSTRUCTIONS = {128: 843}
COMBINE_FIXED_INSTRUCTIONS = {128: 573}

NOTES = {
    "split tile": {"heading": "split {split}, tile keys {cols}", "per_row": (
        {"S": "S", "m_new": "m_new", "c": "c = exp(m_old - m_new)"},
        {"P": "exp(S - m_new)", "l": "l = c l + sum"},
        {"O": "O (unnormalised) = c O + P V"})},
    "split final": {"heading": "split {split} writes (fp32)", "per_row": (
        {"O": "O_s = O / l", "lse": "lse_s = m + log l"},)},
    "combine": {"heading": "combine", "per_row": (
        {"lse_s": "lse_s (per split)", "lse": "lse = log sum_s exp(lse_s)"},
        {"scale": "exp(lse_s - lse)"},
        {"O": "O = sum_s exp(lse_s - lse) O_s"})},
}


def splitkv_block_n(head_dim: int) -> int:
    """kBlockN of the split kernel (flash_api.cpp set_params_splitkv, which must match
    run_mha_fwd_splitkv_dispatch): 256 up to head dim 64, 128 up to 128, else 64."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


def combine_block_m(head_dim: int) -> int:
    """kBlockM of the combine kernel: 4 when the kernel's head dim (rounded up to 32, 64, 96, ...,
    256 as HEADDIM_SWITCH does) is a multiple of 128, 8 when of 64, else 16."""
    kd = next(k for k in (32, 64, 96, 128, 160, 192, 224, 256) if head_dim <= k) if head_dim <= 256 else head_dim
    return 4 if kd % 128 == 0 else 8 if kd % 64 == 0 else 16


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int,
                         max_splits: int = MAX_SPLITS) -> int:
    """FA2's num_splits_heuristic (flash_api.cpp): 1 when the blocks almost fill the SMs (80%);
    else, over the eligible split counts (those that change the blocks per split), the smallest
    whose wave efficiency n_waves / ceil(n_waves) is at least 85% of the best. float32 as in C++."""
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    cdiv = lambda a, b: (a + b - 1) // b
    eligible = [s for s in range(1, max_splits + 1) if s == 1 or cdiv(num_n_blocks, s) != cdiv(num_n_blocks, s - 1)]
    return fewest_splits(batch_nheads_mblocks, num_sms, eligible)


def fewest_splits(blocks: int, num_sms: int, candidates: list) -> int:
    """The wave-efficiency step of FA2's and FA3's num_splits_heuristic: over the candidate split
    counts (ascending), each's n_waves = blocks x splits / SMs and efficiency n_waves / ceil(n_waves),
    in float32 as the C++ computes them; the fewest whose efficiency is at least 0.85 of the best (1
    if none)."""
    f32 = np.float32
    eff = []
    for s in candidates:
        waves = f32(blocks * s) / f32(num_sms)
        eff.append(waves / f32(math.ceil(waves)))
    best = float(max(eff, default=f32(0)))
    return next((s for s, e in zip(candidates, eff) if float(e) >= 0.85 * best), 1)


def auto_num_splits(wl_kernel: Workload, block_q: int, block_kv: int, sm_count: int) -> int:
    """set_params_splitkv's call for the workload the kernel sees (packed or not): blocks =
    batch x heads x ceil(Nq / 64), SMs x 2 (two 128-thread blocks an SM), K/V blocks of kBlockN;
    1 with dropout (split-KV has none)."""
    if wl_kernel.dropout > 0:
        return 1
    mblocks = math.ceil(wl_kernel.seq_len_q / block_q)
    return num_splits_heuristic(wl_kernel.groups * mblocks, 2 * sm_count, math.ceil(wl_kernel.seq_len_kv / block_kv))


def pack_applies(wl: Workload) -> bool:
    """FA2's seqlenq_ngroups_swapped: one query row, query heads sharing a K/V head, no dropout,
    head dim a multiple of 8 (no sliding window or ALiBi here)."""
    kv_heads = getattr(wl, "kv_heads", wl.heads)
    return wl.seq_len_q == 1 and kv_heads < wl.heads and wl.dropout == 0 and wl.head_dim % 8 == 0


def resolve_pack(wl: Workload, pack) -> bool:
    """pack_gqa "auto": FA2's rule; true: packed, which needs the rule's conditions; false: not."""
    if pack == "auto":
        return pack_applies(wl)
    if pack and not pack_applies(wl):
        kv_heads = getattr(wl, "kv_heads", wl.heads)
        if wl.seq_len_q != 1 or wl.dropout > 0 or wl.head_dim % 8:
            raise HbmsimError(f"flash2: pack_gqa = true needs seq_len_q = 1 (got {wl.seq_len_q}), no dropout and "
                              f"a head dim that is a multiple of 8 (FA2's seqlenq_ngroups_swapped)")
        return kv_heads < wl.heads
    return bool(pack)


def packed(wl: Workload, data: AttentionData | None = None) -> tuple:
    """(workload, data) the kernel sees when decode packing applies: heads = kv_heads, the
    group's query heads as rows, causal off (one query row sees every key)."""
    ratio = wl.heads // wl.kv_heads
    weff = replace(wl, heads=wl.kv_heads, seq_len_q=ratio * wl.seq_len_q, causal=False)
    if data is None:
        return weff, None
    b, d = wl.batch, wl.head_dim
    q = data.q.reshape(b, wl.kv_heads, ratio * wl.seq_len_q, d)
    d_o = None if data.d_o is None else data.d_o.reshape(q.shape)
    return weff, AttentionData(q, data.k, data.v, data.kv_lens, None, d_o)


def kernel_workload(wl: Workload, m, data: AttentionData | None = None) -> tuple:
    """(workload, data) a forward kernel sees: packed when the mapping's resolved pack_gqa says so
    (flash2's Flash2Blocks; flash3 packs in its own kernel, flash3_pack.py)."""
    return packed(wl, data) if m.pack_gqa is True else (wl, data)


def split_blocks(wl: Workload, q_end: int, split: int, num_splits: int, block_kv: int) -> tuple[int, int]:
    """[n_block_min, n_block_max) of K/V blocks the split kernel's block (query rows ending at
    q_end, split `split`) visits; empty when min >= max."""
    nb = math.ceil(wl.seq_len_kv / block_kv)
    per = math.ceil(nb / num_splits)
    lo, hi = split * per, min(nb, (split + 1) * per)
    if wl.causal:
        hi = min(hi, math.ceil(causal_kv_end(wl, q_end) / block_kv))
    return lo, hi


def append_rows(wl: Workload, lo: int, hi: int, block_kv: int, n_new: int) -> tuple[int, int]:
    """Rows [a0, a1) of the K/V cache a block with K/V blocks [lo, hi) appends: the new tokens
    (the last n_new rows) inside its range (FA2: n_block from max(lo, cache_len / Bc) to hi)."""
    nk = wl.seq_len_kv
    a0, a1 = max(lo * block_kv, nk - n_new), min(nk, hi * block_kv)
    return (a0, a1) if a1 > a0 else (a0, a0)


def kv_group_of(wl: Workload, g: int) -> int:
    return wl.kv_group(g) if hasattr(wl, "kv_group") else g


def flash2_splitkv_forward(wl: Workload, block_q: int, block_kv: int, num_splits: int,
                           data: AttentionData | None = None, kv_append: int = 0, warps: int = SPLITKV_WARPS,
                           fast: bool = False, registers_per_thread: int = 0, tile_rows: int = 0,
                           fixed_instructions: tuple = (0, 0)) -> Program:
    """The split kernel (+ the combine kernel when num_splits > 1) on `wl`, the workload the
    kernel sees (already packed where packing applies). `kv_append`: how many new tokens (the
    last rows of K and V) the split kernel appends from K_new / V_new (0: none). `fast`: a
    split's loop of more than common.COARSE_ABOVE_TILES tiles runs several a step. `tile_rows`: the
    rows the kernel's tile computes (Flash2Blocks.q_tile_rows, 64; 0: each block's own rows).
    `fixed_instructions`: a warp's instructions run once a block (the compiled kernels', counted by
    Nsight: SPLITKV_/COMBINE_FIXED_INSTRUCTIONS; 0: not known), the split kernel's and the combine
    kernel's, each block's run after its work as a dependent chain (context.chain)."""
    if num_splits < 1 or num_splits > MAX_SPLITS:
        raise HbmsimError(f"flash2: num_splits = {num_splits} must be 1..{MAX_SPLITS} (FA2's split-KV kernel)")
    if wl.dropout > 0:
        raise HbmsimError("flash2: split-KV (num_splits > 1 or kv_append) has no dropout in FA2; set dropout = 0")
    G, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    split = num_splits > 1
    tensors = input_tensors(wl, data, paged=True)
    kv = KVLayout(wl, tensors, data)          # contiguous, or paged (algorithms/paged.py)
    Q = tensors["Q"]
    numeric = data is not None
    kv_groups = getattr(wl, "kv_groups", G)
    new = {}
    if kv_append:
        for name, src in (("K_new", None if not numeric else data.k), ("V_new", None if not numeric else data.v)):
            val = None if src is None else src[:, :, nk - kv_append:, :].reshape(kv_groups, kv_append, d)
            new[name] = Tensor(name, (kv_groups, kv_append, d), wl.dtype, val, count_only=not numeric)
    if split:
        O_acc = Tensor("O_accum", (num_splits * G, nq, d), STATS_DTYPE, count_only=not numeric)
        L_acc = Tensor("lse_accum", (num_splits * G, nq, 1), STATS_DTYPE, count_only=not numeric)
    O = output(wl, "O", nq, d, wl.dtype, data)
    LSE = output(wl, "lse", nq, 1, STATS_DTYPE, data)
    tm = math.ceil(nq / block_q)
    scale = wl.softmax_scale
    all_cols = slice(0, d)
    per_split = math.ceil(math.ceil(nk / block_kv) / num_splits)
    fixed, combine_fixed = fixed_instructions
    step_tiles = tiles_per_step(per_split) if fast else 1

    def outputs_of(g, s):
        return (O_acc[s * G + g], L_acc[s * G + g]) if split else (O[g], LSE[g])

    def block(ctx, index):
        g, rest = divmod(index, num_splits * tm)
        s, i = divmod(rest, tm)
        rows = block_rows(i, block_q, nq)
        r0, r1, n = rows.start, rows.stop, rows.stop - rows.start
        n_work = max(n, tile_rows)
        o_view, l_view = outputs_of(g, s)
        lo, hi = split_blocks(wl, r1, s, num_splits, block_kv)
        if lo >= hi:      # nothing to see: O_s = 0, lse_s = -inf, no reads
            zeros = np.zeros((n, d)) if numeric else None
            ninf = np.full((n, 1), -np.inf) if numeric else None
            yield from ctx.store_tiles((o_view, rows, all_cols, zeros), (l_view, rows, slice(0, 1), ninf))
            return
        kg = kv_group_of(wl, g)
        if kv_append:
            a0, a1 = append_rows(wl, lo, hi, block_kv, kv_append)
            if a1 > a0:
                src = slice(a0 - (nk - kv_append), a1 - (nk - kv_append))
                kn, vn = yield from ctx.load_tiles((new["K_new"][kg], src, all_cols), (new["V_new"][kg], src, all_cols))
                yield from ctx.store_tiles(*kv.store_tiles("K", kg, a0, a1, kn), *kv.store_tiles("V", kg, a0, a1, vn))
        c_lo, c_end = lo * block_kv, min(nk, hi * block_kv)
        step_cols = block_kv * step_tiles
        first = [(Q[g], rows, all_cols)]
        if wl.key_padding_mask:
            first.append((tensors["kv_lens"][g // wl.heads], slice(0, 1), slice(0, 1)))
        first += kv.table_tiles(kg, c_lo, c_end)     # paged: the block-table entries of its keys
        q_next = ctx.prefetch(*first)
        k_next = ctx.prefetch(*kv.tiles("K", kg, c_lo, min(c_end, c_lo + step_cols)))
        q, *rest = yield from ctx.wait(q_next)
        lens = rest[0] if wl.key_padding_mask else None
        kv_len = int(lens[0, 0]) if lens is not None else None
        if numeric:
            m, l, acc = np.full(n, -np.inf), np.zeros(n), np.zeros((n, d))
        for c0 in range(c_lo, c_end, step_cols):
            c1 = min(c_end, c0 + step_cols)
            nc, tiles = c1 - c0, math.ceil((c1 - c0) / block_kv)
            k = kv.join((yield from ctx.wait(k_next)))
            v_next = ctx.prefetch(*kv.tiles("V", kg, c0, c1))
            # every row of the block's tile, as flash2's kernel (flash2.py: n_work)
            yield from ctx.compute(**qk_softmax_work(wl, n_work, nc, tiles, warps))
            if numeric:
                sc = masked_scores(wl, scale, q, k, kv_len, r0, r1, c0, c1)
                m_new, p, alpha, l = unnormalised_softmax_step(sc, m, l)
                m = m_new
            v = kv.join((yield from ctx.wait(v_next)))
            if c1 < c_end:
                k_next = ctx.prefetch(*kv.tiles("K", kg, c1, min(c_end, c1 + step_cols)))
            yield from ctx.compute(**pv_work(wl, n_work, nc, warps))         # acc += P V_j
            if numeric:
                acc = alpha[:, None] * acc + p @ v
                ctx.note("split tile", g=g, split=s, rows=(r0, r1), cols=(c0, c1), S=sc, m_new=m, c=alpha,
                         P=p, l=l, O=acc)
        yield from ctx.compute(vector_flops=n_work * d + 2 * n_work)
        if fixed:                        # the block's fixed instructions, a dependent chain
            yield from ctx.chain(fixed)
        o_tile = lse_tile = None
        if numeric:
            o_tile, lse_tile = normalised_rows(acc, l, m)
            ctx.note("split final", g=g, split=s, rows=(r0, r1), O=o_tile, lse=lse_tile[:, 0])
        yield from ctx.store_tiles((o_view, rows, all_cols, o_tile), (l_view, rows, slice(0, 1), lse_tile))

    allocs = tuple(new.values()) + ((O_acc, L_acc) if split else (O, LSE))
    launches = [Launch("flash2_fwd_splitkv", G * num_splits * tm, flash2_sram_bytes(wl, block_q, block_kv), block,
                       allocs=allocs, tensor_op=MMA_SYNC, period=num_splits * tm, threads_per_block=32 * warps,
                       registers_per_thread=registers_per_thread)]
    if split:
        launches.append(combine_launch(wl, num_splits, O_acc, L_acc, O, LSE, numeric, combine_fixed))
    return Program("flash2_splitkv_forward", launches, inputs=tuple(tensors.values()) + tuple(new.values()),
                   outputs={"O": O, "lse": LSE})


def combine_pieces(wl: Workload, index: int, cbm: int) -> list:
    """(batch-head, rows) pieces of the combine kernel's block `index`: rows index*cbm.. of the
    batch-heads' rows laid end to end."""
    total = wl.groups * wl.seq_len_q
    return flat_row_pieces(wl.seq_len_q, index * cbm, min(total, (index + 1) * cbm))


def flat_row_pieces(nq: int, f0: int, f1: int) -> list:
    """(batch-head, rows) pieces of rows [f0, f1) of the batch-heads' nq rows laid end to end."""
    out = []
    while f0 < f1:
        g, r = divmod(f0, nq)
        stop = min(nq, r + (f1 - f0))
        out.append((g, slice(r, stop)))
        f0 += stop - r
    return out


def combined_rows(pieces: list, lses: list, parts: list, num_splits: int, numeric: bool) -> list:
    """Per piece (g, rows) of a combine block: (g, rows, O, lse (rows x 1), lse_s (splits x rows),
    scales), from its loads split by split (lses[s x pieces + j], parts[s x pieces + j]) by
    `combined`; Nones in count-only mode."""
    out = []
    for j, (g, r) in enumerate(pieces):
        if not numeric:
            out.append((g, r, None, None, None, None))
            continue
        ls = np.stack([lses[s * len(pieces) + j][:, 0] for s in range(num_splits)])     # (splits, rows)
        o_tile, lse, sc = combined(ls, [parts[s * len(pieces) + j] for s in range(num_splits)])
        out.append((g, r, o_tile, lse[:, None], ls, sc))
    return out


def combined(ls: np.ndarray, parts: list) -> tuple:
    """(O, lse, scales) of rows whose splits' log-sum-exps are ls (splits x rows) and partial outputs
    parts[s] (rows x d), in float64: lse = log sum_s exp(lse_s) with the max taken out, scale_s =
    exp(lse_s - lse), O = sum_s scale_s O_s (rows that saw no key: lse -inf, O 0)."""
    mx = np.max(ls, axis=0)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    tot = np.exp(ls - mx).sum(axis=0)
    with np.errstate(divide="ignore"):
        lse = np.where(tot > 0, np.log(np.where(tot > 0, tot, 1.0)) + mx, -np.inf)
    sc = np.where(np.isfinite(lse), np.exp(ls - np.where(np.isfinite(lse), lse, 0.0)), 0.0)
    return sum(sc[s][:, None] * parts[s] for s in range(len(parts))), lse, sc


def combine_launch(wl: Workload, num_splits: int, O_acc, L_acc, O, LSE, numeric: bool, fixed: int = 0) -> Launch:
    G, nq, d = wl.groups, wl.seq_len_q, wl.head_dim
    cbm = combine_block_m(d)
    total = G * nq
    one = slice(0, 1)

    def block(ctx, index):
        pieces = combine_pieces(wl, index, cbm)
        rows_n = sum(r.stop - r.start for _, r in pieces)
        lses = yield from ctx.load_tiles(*[(L_acc[s * G + g], r, one) for s in range(num_splits) for g, r in pieces])
        # lse = log sum_s exp(lse_s) with the max taken out: a max, a sub + exp and a sum per value
        yield from ctx.compute(vector_flops=4 * num_splits * rows_n + 2 * rows_n, exp_ops=num_splits * rows_n)
        # O = sum_s scale_s O_s, split after split: the kernel loads each split's partial outputs into one
        # register tile and adds them in before it loads the next (a runtime trip count, not unrolled:
        # combine_attn_seqk_parallel), so each split's load waits its latency (time_model: l2_hit_latency)
        parts = []                   # split by split, each split's pieces in order
        for s in range(num_splits):
            parts += yield from ctx.load_tiles(*[(O_acc[s * G + g], r, slice(0, d)) for g, r in pieces])
            # a multiply-add per output element: 2 FLOPs
            yield from ctx.compute(vector_flops=2 * rows_n * d)
        if fixed:                        # the block's fixed instructions, a dependent chain
            yield from ctx.chain(fixed)
        stores = []
        for g, r, o_tile, lse_tile, ls, sc in combined_rows(pieces, lses, parts, num_splits, numeric):
            if numeric:
                ctx.note("combine", g=g, rows=(r.start, r.stop), lse_s=ls.T, lse=lse_tile[:, 0], scale=sc.T,
                         O=o_tile)
            stores += [(O[g], r, slice(0, d), o_tile), (LSE[g], r, one, lse_tile)]
        yield from ctx.store_tiles(*stores)

    alike = total % cbm == 0 and (nq % cbm == 0 or cbm % nq == 0)
    # shared memory: sLSE[kMaxSplits][kBlockM + 1] fp32, kMaxSplits the power of two >= num_splits (>= 2)
    max_splits = max(2, 1 << (num_splits - 1).bit_length())
    return Launch("flash2_fwd_splitkv_combine", math.ceil(total / cbm), max_splits * (cbm + 1) * 4, block,
                  allocs=(O, LSE), frees=(O_acc, L_acc), period=1 if alike else 0,
                  threads_per_block=COMBINE_THREADS, host_ops=0)


def splitkv_steps(wl: Workload, block_q: int, block_kv: int, num_splits: int, fast: bool = False) -> int:
    """Tile steps of the split kernel (for the "this will take" estimate), plus the combine's blocks."""
    per = math.ceil(math.ceil(wl.seq_len_kv / block_kv) / num_splits)
    steps = math.ceil(per / (tiles_per_step(per) if fast else 1))
    combine = math.ceil(wl.groups * wl.seq_len_q / combine_block_m(wl.head_dim)) if num_splits > 1 else 0
    return wl.groups * math.ceil(wl.seq_len_q / block_q) * num_splits * steps + combine


def flash2_splitkv_io(wl: Workload, block_q: int, block_kv: int, num_splits: int, kv_append: int = 0,
                      pack: int = 1) -> dict:
    """Closed-form bytes {tensor: (read, write)} of flash2_splitkv_forward on `wl` (the workload
    the kernel sees), derived from the kernels, not the simulator. Per batch-head (all alike), per
    (query block of n rows, split) with K/V blocks [lo, hi) (split_blocks): empty -> n d 4 + n 4
    written (zeros, -inf); else Q n d e, K and V (min(Nk, hi Bc) - lo Bc) d e each, kv_lens 4,
    the new rows a (append_rows) read from K_new, V_new and written to K, V, with a paged cache
    the block-table entries of its keys (paged.table_entries, 4 B each), and n d 4 + n 4 of
    O_accum, lse_accum (O n d e + lse n 4 with one split). Combine: every split's O_accum and
    lse_accum read once (G Nq d 4 S, G Nq 4 S), O and lse written once. `pack` > 1: FA3's PackGQA
    on `wl` unpacked (flash3_pack.py): G = batch x K/V heads, each of Nq x pack packed rows, a
    block's causal end its last query row's."""
    pk = PackGQA(wl, pack)
    G, nq, nk, d, e = pk.groups, pk.rows, wl.seq_len_kv, wl.head_dim, wl.itemsize
    stats, index = 4, 4
    split = num_splits > 1
    q = kv = lens = new = out_rows = table = 0
    for i in range(math.ceil(nq / block_q)):
        rows = block_rows(i, block_q, nq)
        n = rows.stop - rows.start
        for s in range(num_splits):
            lo, hi = split_blocks(wl, pk.q_end(rows.stop), s, num_splits, block_kv)
            out_rows += n
            if lo >= hi:
                continue
            q += n
            kv += min(nk, hi * block_kv) - lo * block_kv
            if wl.kv_page_size is not None:
                table += table_entries(wl, lo * block_kv, min(nk, hi * block_kv))
            lens += 1 if wl.key_padding_mask else 0
            if kv_append:
                a0, a1 = append_rows(wl, lo, hi, block_kv, kv_append)
                new += a1 - a0
    io: dict = {}

    def add(name, read=0, write=0):
        r, w = io.get(name, (0, 0))
        io[name] = (r + read, w + write)

    add("Q", read=G * q * d * e)
    add("K", read=G * kv * d * e, write=G * new * d * e)
    add("V", read=G * kv * d * e, write=G * new * d * e)
    if kv_append:
        add("K_new", read=G * new * d * e)
        add("V_new", read=G * new * d * e)
    if wl.key_padding_mask:
        add("kv_lens", read=G * lens * index)
    if wl.kv_page_size is not None:
        add("block_table", read=G * table * index)
    if split:
        add("O_accum", write=G * out_rows * d * stats, read=G * nq * num_splits * d * stats)
        add("lse_accum", write=G * out_rows * stats, read=G * nq * num_splits * stats)
    add("O", write=G * nq * d * e)
    add("lse", write=G * nq * stats)
    return io
