"""FlashAttention-3 forward as a simulated program (Shah et al. 2024, arXiv 2407.08608, sections
3.1-3.2; hopper/ in Dao-AILab/flash-attention): the same bytes as FlashAttention-2's forward,
another schedule.

One thread block (CTA) per (batch-head, query block), its warps in roles that run concurrently
(ctx.fork) and meet at events:
- the producer warp issues TMA tile loads: Q_i once, then K_j and V_j into a ring of `stages`
  shared-memory slots (kStages = 2 on sm90), waiting for a slot to be released before reusing
  it. A TMA load is a prefetch with no register or ldmatrix cost (the copy engine moves it);
- block_q / 64 consumer warpgroups, each owning 64 query rows, compute with wgmma at the
  library rate (time_model.WGMMA), B operand from shared memory. Each keeps its m, l and O.
- intra-warpgroup overlap (IntraWGOverlap, paper section 3.2, Algorithm 2): a warpgroup issues
  S_j = Q K_j^T and then O += P_{j-1} V_{j-1} on the tensor pipe before the softmax of S_j on
  the vector pipe, so that softmax j runs under the GEMM of j-1;
- ping-pong (UseSchedulerBarrier, section 3.1): named barriers order the warpgroups' GEMMs, so
  that one warpgroup's GEMMs are issued while the other does its softmax (events `turn`).
- FP8 (variant "fp8"): Q, K, V in e4m3 (1 byte), the matmuls at the FP8 rate
  (time_model.WGMMA_FP8), O in the workload's 16-bit dtype; V is transposed in shared memory by
  the producer warpgroup before P V can use it (Transpose_V: wgmma's FP8 B operand must be
  K-major), an SRAM read and write of each V tile.

Under the causal mask, K/V blocks no row of the query block can see are skipped, as in FA2.
For inference, PackGQA (flash3_pack.py: a K/V head's query heads as the rows of one tile) and a
paged KV cache (paged.py: K/V tiles read page by page) change which rows a block holds and where
its K/V tiles live, not the schedule; split-KV adds FA3's combine kernel (flash3_combine.py).
Numerics: in data mode each warpgroup runs FA2's unnormalised online softmax in float64 over its
rows (the FP8 rounding itself is not modelled: the values are those of exact arithmetic).
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace

import numpy as np

from hbmsim.simulator import HbmsimError, Launch, Program, Tensor
from hbmsim.simulator.tensor import L2Lines
from hbmsim.simulator.time_model import WGMMA, WGMMA_FP8

from .common import (STATS_DTYPE, block_rows, normalised_rows, online_softmax_vector_flops, output,
                     row_blocks_period, unnormalised_softmax_step)
from . import common
from .common import long_causal
from .common import tiles_per_step as coarse_step
from .flash2_splitkv import split_blocks
from .flash3_combine import fa3_combine_launch
from .flash3_pack import PackGQA
from .paged import KVLayout
from .workload import AttentionData, Workload

WG_ROWS = 64              # rows of one consumer warpgroup: AtomLayoutQK = kBlockM / 64 warpgroups
                          # (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp line 89)
FP8_BYTES = 1             # e4m3: one byte an element
FP8_DTYPE = "fp8_e4m3"


def fa3_tensor(name: str, shape: tuple, data, fp8: bool) -> Tensor:
    """A tensor in HBM; with `fp8`, stored in e4m3 (1 byte an element). simulator/tensor.py's
    DTYPE_BYTES has no FP8 entry yet (a proposal to the lead): the tensor is made as fp16 and its
    dtype and element size set to e4m3's, which is all the counters read."""
    t = Tensor(name, shape, "fp16", data, count_only=data is None)
    if fp8:
        t.dtype, t.itemsize = FP8_DTYPE, FP8_BYTES
    return t


def fa3_inputs(wl: Workload, data: AttentionData | None, fp8: bool) -> dict:
    """Q (batch*heads, Nq, d), K and V (batch*kv_heads, Nkv, d), in e4m3 or the workload's dtype."""
    g, gk, nq, nk, d = wl.groups, wl.kv_groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    if data is not None:
        data.check(wl)
    if not fp8:
        from .common import input_tensors
        return input_tensors(wl, data, paged=True)
    return {"Q": fa3_tensor("Q", (g, nq, d), None if data is None else data.q.reshape(g, nq, d), True),
            "K": fa3_tensor("K", (gk, nk, d), None if data is None else data.k.reshape(gk, nk, d), True),
            "V": fa3_tensor("V", (gk, nk, d), None if data is None else data.v.reshape(gk, nk, d), True)}


def flash3_sram_bytes(wl: Workload, block_q: int, block_kv: int, stages: int, fp8: bool, pv_is_rs: bool = True) -> int:
    # Q_i (block_q x d) once, K_j and V_j in `stages` ring slots each, and with FP8 the transposed
    # V (its own ring, TensorStorageTransposeV); S, O, m, l live in the consumers' registers, and P
    # too unless the P V GEMM reads it from shared memory (MmaPV_is_RS false: smem_p, block_q x block_kv)
    e = FP8_BYTES if fp8 else wl.itemsize
    v_rings = 2 if fp8 else 1
    p_tile = 0 if pv_is_rs else block_q * block_kv * wl.itemsize
    return (block_q + stages * block_kv * (1 + v_rings)) * wl.head_dim * e + p_tile


# FA3's tile scheduler under a causal mask (hopper/tile_scheduler.hpp at commit 0251105a,
# DynamicPersistentTileScheduler; flash_fwd_launch_template.h: LPT = Is_causal || Is_local): the
# persistent CTAs take tiles in the order of a counter, "longest-processing-time-first" (a
# batch-head's query blocks from the last, the longest under the mask, to the first), the
# batch-heads in sections of `swizzle` so that their K and V fit "32 MB for K & V": swizzle = 1
# where one K/V head's K and V (seqlen_k x (d + d_v) x element size) exceed it, else the largest
# power of two whose heads fit, times the query heads a K/V head serves (PackGQA off); within a
# section the batch-heads turn fastest, then the query blocks. The FA3 release of the paper
# (commit 3c4053b7) took tiles query block first, in order, as the grid order does.
LPT_L2_SECTION_BYTES = 32 * 1024 * 1024


def _swizzle(section_bytes: int, head_bytes: int) -> int:
    """Batch-heads a section of FA3's tile schedulers holds: 1 where one head's bytes exceed the
    section's, else the largest power of two of heads that fit (find_log2_floor in the source)."""
    return 1 if section_bytes < head_bytes else 1 << (section_bytes // head_bytes).bit_length() - 1


def _sections(groups: int, blocks: int, swizzle: int):
    """index -> (batch-head, block) in sections of `swizzle` batch-heads (the last, the remainder,
    may be shorter), the batch-heads turning fastest within a section, then the blocks."""
    whole, rest = divmod(groups, swizzle)

    def place(index: int) -> tuple:
        section, l2_mod = divmod(index, swizzle * blocks)
        block, r = divmod(l2_mod, swizzle if section < whole else (rest or 1))
        return section * swizzle + r, block

    return place


def lpt_period(groups: int, blocks: int, swizzle: int) -> int:
    """A launch's `period` in its LPT order: a section of batch-heads, blocks a period apart doing
    alike work; none (0) when the last section is shorter."""
    return swizzle * blocks if groups % swizzle == 0 else 0


def lpt_tile(wl: Workload, tr: int, element_size: int, pack: int = 1):
    """index -> (batch-head g, query block i) in FA3's causal tile order (above); g = b x heads + h,
    or with PackGQA (`pack` > 1) b x kv_heads + h_k."""
    # K and V of one K/V head, times the query heads it serves unpacked (tile_scheduler.hpp: "If not
    # PackGQA already, the size of each section can increase by qhead_per_khead")
    swizzle = _swizzle(LPT_L2_SECTION_BYTES, wl.seq_len_kv * 2 * wl.head_dim * element_size) \
        * (1 if pack > 1 else wl.group_size)
    place = _sections(wl.kv_groups if pack > 1 else wl.groups, tr, swizzle)

    def tile(index: int) -> tuple:
        g, block = place(index)
        return g, tr - 1 - block                  # longest first

    return tile, swizzle


# The backward under a causal mask (hopper/flash_bwd_launch_template.h: SingleTileBwdLPTScheduler when
# Is_causal; SPT, the reverse, only when deterministic): K/V blocks first to last, which under the
# mask are longest first, the batch-heads in sections whose Q, dO and fp32 dQ accumulator fit "40 MB
# for Q, dO, and dQaccum" (seqlen_k x ((d + d_v) x element size + d x 4) a head), turning fastest.
LPT_BWD_L2_SECTION_BYTES = 40 * 1024 * 1024


def lpt_bwd_tile(wl: Workload, tc: int, element_size: int):
    """index -> the grid's index (batch-head x tc + K/V block) in FA3's causal backward order (above)."""
    # Q and dO of a head, and its fp32 dQ accumulator
    swizzle = _swizzle(LPT_BWD_L2_SECTION_BYTES, wl.seq_len_kv * (2 * wl.head_dim * element_size + wl.head_dim * 4))
    place = _sections(wl.groups, tc, swizzle)

    def tile(index: int) -> int:
        g, block = place(index)
        return g * tc + block

    return tile, swizzle


def flash3_forward(wl: Workload, block_q: int, block_kv: int, data: AttentionData | None = None, stages: int = 2,
                   intra_wg_overlap: bool = True, pingpong: bool = True, fp8: bool = False,
                   tiles_per_step: int = 1, registers_per_thread: int = 0, pv_is_rs: bool = True,
                   lpt: bool = False, tile_rows: int = 0, whole_kv: bool = True, num_splits: int = 1,
                   pack: int = 1) -> Program:
    """`lpt`: the blocks in FA3's causal tile order (lpt_tile: longest first, batch-heads in L2
    sections), not the grid's (query block fastest, first to last). `tile_rows`: the rows the
    kernel's tile computes (Flash3Blocks.q_tile_rows; 0: each block's own rows), in warpgroups of
    64 (wgmma's M is 64 rows; blocks of fewer rows, a what-if, keep theirs): every consumer
    warpgroup of the tile runs its 64-row wgmma and softmax, those of a last block's rows past
    seq_len_q too (the mainloop has no row bound; TMA fills Q's rows past the sequence with zeros,
    and the epilogue stores only the real rows), so Q's loads and O's stores are cut to the real
    rows and the work is not. `whole_kv`: so are a last K/V tile's block_kv columns past
    seq_len_kv (loaded as zeros, masked to -inf); false: its real keys. `stages`: the K/V ring's
    slots; `intra_wg_overlap` and `pingpong`: the kernel's IntraWGOverlap and UseSchedulerBarrier;
    `fp8`: Q, K, V in e4m3; `pv_is_rs`: MmaPV_is_RS (P reaches the P V GEMM from registers; false:
    each warpgroup stores its P to shared memory after its softmax, and the GEMM reads it there).
    `tiles_per_step` > 1 (fast mode): each simulated step loads and computes that many K/V tiles;
    counts are the sum of the tiles' own. None of them changes a byte of traffic except `fp8`
    (1-byte Q, K, V) and `num_splits` > 1: split-KV (FA3's Split; not persistent: its
    SingleTileScheduler, the grid (query block, split, head, batch), query block fastest), each
    (batch-head, query block) in num_splits blocks over its K/V blocks' equal shares
    (flash2_splitkv.split_blocks: FA3's n_block_min/max of a split), each writing an fp32 partial O
    and lse of its real rows (zeros and -inf where its share is empty, with no work), and the
    combine kernel after them (flash3_combine.py); `lpt` is then not taken. `pack` > 1: FA3's
    PackGQA, a K/V head's `pack` query heads as the rows of one tile (flash3_pack.py: one block per
    K/V batch-head and block_q packed rows, Q read and O written head by head, the causal mask by
    each row's query row). A paged workload (kv_page_size): K and V in pages (paged.KVLayout, FA2's
    layout and block table: FA3's page_table), a tile read page by page (TMA's page-aligned tiles,
    or the producer warpgroup's cp.async rows, PagedKVNonTMA: the same bytes, and here the same
    time) and each block's table entries read with its Q."""
    if wl.dropout > 0 or wl.key_padding_mask:
        raise HbmsimError("flash3: FlashAttention-3 has no dropout and no key-padding mask: set dropout = 0 and "
                          "key_padding_mask = false")
    nq, nk, d = wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    pk = PackGQA(wl, pack)
    g_count, n_rows = pk.groups, pk.rows       # the grid's batch-heads, and the rows of one (packed or not)
    tensors = fa3_inputs(wl, data, fp8)
    kv = KVLayout(wl, tensors, data)           # contiguous, or paged (algorithms/paged.py)
    if fp8 and kv.paged:                       # the page pools in e4m3 too
        for t in (kv.K, kv.V):
            t.dtype, t.itemsize = FP8_DTYPE, FP8_BYTES
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    O = output(wl, "O", nq, d, wl.dtype, data)
    LSE = output(wl, "lse", nq, 1, STATS_DTYPE, data)
    split = num_splits > 1
    lpt = lpt and not split
    if split:                  # each split's partial O and lse, fp32 (FA3's out_accum, softmax_lse_accum)
        O_acc = Tensor("O_accum", (num_splits * wl.groups, nq, d), STATS_DTYPE, count_only=data is None)
        L_acc = Tensor("lse_accum", (num_splits * wl.groups, nq, 1), STATS_DTYPE, count_only=data is None)
    e = Q.itemsize
    tr = pk.blocks(block_q)
    scale = wl.softmax_scale
    numeric = data is not None
    all_cols = slice(0, d)
    op = WGMMA_FP8 if fp8 else WGMMA
    kv_lines = L2Lines(block_kv)
    # a long causal loop in fast mode: every K/V load as the L2's prefix lines (common.long_causal)
    prefix = L2Lines(block_kv, prefix=True) if tiles_per_step > 1 and long_causal(wl, block_q, block_kv) else None

    def kv_steps(kv_lo, kv_end):
        """[(c0, c1, tiles)] of a block's steps over its keys [kv_lo, kv_end)."""
        tiles = math.ceil((kv_end - kv_lo) / block_kv)
        # a long causal launch: every block a fixed number of steps
        own = (max(1, tiles // common.LONG_CAUSAL_STEPS_PER_BLOCK) if prefix is not None
               else coarse_step(tiles, not wl.causal, g_count * tr))
        step_cols = block_kv * (min(tiles_per_step, own) if tiles_per_step > 1 else 1)
        out = []
        for c0 in range(kv_lo, kv_end, step_cols):
            c_end = min(kv_end, c0 + step_cols)
            tiles = math.ceil((c_end - c0) / block_kv)
            out.append((c0, min(nk, c0 + tiles * block_kv), tiles))
        return out

    def p_smem_bytes(n, nc):
        # P (n x nc, converted to the 16-bit dtype) through shared memory: 0 with MmaPV_is_RS
        # (P stays in registers; FP8 always does)
        return 0 if pv_is_rs else n * nc * wl.itemsize

    def pv_work(n, nc, tiles):
        # O += P V_j: 2 n nc d FLOPs; wgmma reads V_j (nc x d) from shared memory, and P (its A
        # operand) from registers or, without MmaPV_is_RS, from shared memory; with several
        # tiles a step, V's and P's columns add up
        return dict(matmul_flops=2 * n * nc * d, sram_bytes=nc * d * e + p_smem_bytes(n, nc))

    @functools.cache
    def softmax_work(n, nc, tiles):
        # the online softmax of an n x nc tile (tiles K/V tiles a step: the per-row terms once a
        # tile), an exp per score and one per row a tile; P's shared-memory bytes (p_smem_bytes).
        # The same for every step of that shape: made once
        return dict(vector_flops=online_softmax_vector_flops(wl, n, nc)
                    + (tiles - 1) * online_softmax_vector_flops(wl, n, 0),
                    exp_ops=n * nc + tiles * n, sram_bytes=p_smem_bytes(n, nc))

    order, swizzle = lpt_tile(wl, tr, e, pack) if lpt else (None, 1)

    def block(ctx, index):
        if split:              # the grid (query block, split, head, batch)
            g, rest = divmod(index, num_splits * tr)
            s_idx, i = divmod(rest, tr)
        else:
            g, i = order(index) if lpt else divmod(index, tr)
        rows = block_rows(i, block_q, n_rows)
        r0, r1 = rows.start, rows.stop

        def out_views(gq):     # query batch-head gq's O and lse (its split's fp32 partials)
            return (O_acc[s_idx * wl.groups + gq], L_acc[s_idx * wl.groups + gq]) if split else (O[gq], LSE[gq])

        if split:              # this split's K/V blocks [lo, hi)
            lo, hi = split_blocks(wl, pk.q_end(r1), s_idx, num_splits, block_kv)
            if lo >= hi:       # nothing to see: O_s = 0, lse_s = -inf, no reads
                stores = []
                for gq, q_rows in pk.pieces(g, r0, r1):
                    n_q = q_rows.stop - q_rows.start
                    zeros = np.zeros((n_q, d)) if numeric else None
                    ninf = np.full((n_q, 1), -np.inf) if numeric else None
                    o_view, l_view = out_views(gq)
                    stores += [(o_view, q_rows, all_cols, zeros), (l_view, q_rows, slice(0, 1), ninf)]
                yield from ctx.store_tiles(*stores)
                return
            steps = kv_steps(lo * block_kv, min(nk, hi * block_kv))
        else:
            steps = kv_steps(0, pk.kv_end(r1))
        kg = pk.kv_group(g)
        # each warpgroup's real rows [w0, w1) (none past the sequence) and the rows it computes
        work_rows = max(r1 - r0, tile_rows)
        if block_q >= WG_ROWS:
            work_rows = -(-work_rows // WG_ROWS) * WG_ROWS
        wgs = [(min(r1, r0 + o), min(r1, r0 + o + WG_ROWS), min(WG_ROWS, work_rows - o))
               for o in range(0, work_rows, WG_ROWS)]
        n_wg = len(wgs)
        k_loads: list = [None] * len(steps)
        v_loads: list = [None] * len(steps)
        k_ready = [ctx.event() for _ in steps]      # the producer issued K_j's TMA load
        v_ready = [ctx.event() for _ in steps]      # ... V_j's (and, FP8, transposed it)
        # every warpgroup is done with slot j's K_j (its S GEMM done) / V_j (its P V done): the kernel's
        # two pipelines (pipeline_k, pipeline_v: K's slot is released as soon as the QK GEMM has read
        # it, mainloop_fwd_sm90_tma_gmma_ws.hpp), so K_{j+stages} loads while P_j V_j still runs
        released = {p: [ctx.event() for _ in steps] for p in "kv"}
        done_with = {p: [0] * len(steps) for p in "kv"}
        turn = [ctx.event() for _ in wgs]           # ping-pong: whose GEMMs go next
        q_pieces = pk.pieces(g, r0, r1)              # Q's rows, head by head (one piece unpacked)
        # paged: the block-table entries of the keys its tiles read, with Q
        table = kv.table_tiles(kg, steps[0][0], steps[-1][1]) if steps else []
        q_load = ctx.prefetch(*[(Q[gq], q_rows, all_cols) for gq, q_rows in q_pieces], *table)

        def release(p, s_i):
            done_with[p][s_i] += 1
            if done_with[p][s_i] == n_wg:
                released[p][s_i].succeed()

        def transpose_v(s_i, nc):
            # FP8: the producer warpgroup reads V_j from shared memory and writes it back
            # transposed (ldmatrix / stmatrix): one SRAM read and one write of the tile
            yield from ctx.wait(v_loads[s_i])
            yield from ctx.compute(sram_bytes=2 * nc * d * e)
            v_ready[s_i].succeed()

        def producer():
            for s_i, (c0, c1, tiles) in enumerate(steps):
                if s_i >= stages:
                    yield released["k"][s_i - stages]    # the slot's previous K is no longer read
                k_loads[s_i] = ctx.prefetch(*kv_tiles(K, c0, c1))
                k_ready[s_i].succeed()
                if s_i >= stages:
                    yield released["v"][s_i - stages]    # ... nor its previous V
                v_loads[s_i] = ctx.prefetch(*kv_tiles(V, c0, c1))
                if fp8:
                    ctx.fork(transpose_v(s_i, tiles * block_kv if whole_kv else c1 - c0), "V transpose")
                else:
                    v_ready[s_i].succeed()

        def kv_tiles(T, c0, c1):
            # a step's K or V rows, tile by tile (one TMA load each): in a coarse step too, the L2
            # keeps them as the lines of single tiles (L2Lines), so that every block, whatever its
            # causal end, asks it for the same lines. Paged: page by page
            if kv.paged:
                return kv.tiles("K" if T is K else "V", kg, c0, c1)
            if prefix is not None:                # a long causal launch: the L2's prefix lines
                return [(T[kg], slice(c0, c1), all_cols, prefix)]
            if c1 - c0 <= block_kv:
                return [(T[kg], slice(c0, c1), all_cols)]
            return [(T[kg], slice(c0, c1), all_cols, kv_lines)]

        def kv_value(got):
            return None if got[0] is None else np.vstack(got)

        def hand_over(gemms, turn_next):
            for ev in gemms:
                if ev.callbacks is not None:      # not done yet
                    yield ev
            turn_next.succeed()

        def consumer(w):
            w0, w1, n = wgs[w]               # its real rows, and the n rows its wgmma and softmax run over
            q = pk.gather((yield from ctx.wait(q_load))[:len(q_pieces)], q_pieces, r0, r1)
            q = None if q is None else q[w0 - r0:w1 - r0]
            m = l = acc = None
            numeric_rows = numeric and w1 > w0
            if numeric_rows:                 # the real rows' online softmax
                m, l, acc = np.full(w1 - w0, -np.inf), np.zeros(w1 - w0), np.zeros((w1 - w0, d))
            pending = None       # (step, nc, tiles, P, alpha) whose P V is not issued yet
            for s_i, (c0, c1, tiles) in enumerate(steps):
                nc = tiles * block_kv if whole_kv else c1 - c0   # (whole_kv: a last tile's keys past the sequence too)
                yield k_ready[s_i]
                k = kv_value((yield from ctx.wait(k_loads[s_i])))
                if pingpong and n_wg > 1:
                    if w > 0 or s_i > 0:
                        yield turn[w]
                    turn[w] = ctx.event()
                # S = Q_w K_j^T: 2 n nc d FLOPs, wgmma's A (Q) and B (K_j) from shared memory
                s_ev = ctx.compute(matmul_flops=2 * n * nc * d, sram_bytes=(tiles * n + nc) * d * e)
                pv_ev = ()
                if intra_wg_overlap and pending is not None:
                    yield v_ready[pending[0]]
                    v = kv_value((yield from ctx.wait(v_loads[pending[0]])))
                    pv_ev = ctx.compute(**pv_work(n, *pending[1:3]))
                    if numeric_rows:
                        acc = pending[4][:, None] * acc + pending[3] @ v
                if pingpong and n_wg > 1:
                    # the scheduler barrier lets the next warpgroup issue its GEMMs now; the tensor
                    # cores run wgmma in issue order, so they start when these two are done
                    ctx.fork(hand_over(s_ev + tuple(pv_ev), turn[(w + 1) % n_wg]))
                yield from s_ev
                release("k", s_i)
                # the online softmax of S_j on the vector pipe (under P_{j-1} V_{j-1}); without
                # MmaPV_is_RS its P (n x nc, 16-bit) is then stored to shared memory for the P V GEMM
                yield from ctx.compute(**softmax_work(n, nc, tiles))
                yield from pv_ev
                if pending is not None:
                    release("v", pending[0])
                p = alpha = None
                if numeric_rows:
                    s = scale * (q @ k.T)       # S = scale Q K^T, -inf where the causal mask forbids
                    ok = pk.causal_mask(w0, w1, c0, c1)
                    s = s if ok is None else np.where(ok, s, -np.inf)
                    m_new, p, alpha, l = unnormalised_softmax_step(s, m, l)
                    m = m_new
                pending = (s_i, nc, tiles, p, alpha)
                if not intra_wg_overlap:         # P V_j now, after the softmax
                    yield v_ready[s_i]
                    v = kv_value((yield from ctx.wait(v_loads[s_i])))
                    yield from ctx.compute(**pv_work(n, nc, tiles))
                    if numeric_rows:
                        acc = alpha[:, None] * acc + p @ v
                    release("v", s_i)
                    pending = None
            if pending is not None:              # the last P V
                yield v_ready[pending[0]]
                v = kv_value((yield from ctx.wait(v_loads[pending[0]])))
                yield from ctx.compute(**pv_work(n, *pending[1:3]))
                if numeric_rows:
                    acc = pending[4][:, None] * acc + pending[3] @ v
                release("v", pending[0])
            yield from ctx.compute(vector_flops=n * d + 2 * n)     # O = acc / l, lse = m + log l
            o_tile = lse_tile = None
            if numeric_rows:
                o_tile, lse_tile = normalised_rows(acc, l, m)
            if w1 > w0:                          # the real rows' O and lse, head by head
                pieces = pk.pieces(g, w0, w1)
                stores = []
                for (gq, q_rows), o_v, l_v in zip(pieces, pk.scatter(o_tile, pieces, w0),
                                                  pk.scatter(lse_tile, pieces, w0)):
                    o_view, l_view = out_views(gq)
                    stores += [(o_view, q_rows, all_cols, o_v), (l_view, q_rows, slice(0, 1), l_v)]
                yield from ctx.store_tiles(*stores)

        roles = [ctx.fork(producer(), "producer")] + [ctx.fork(consumer(w), f"consumer {w}") for w in range(n_wg)]
        for role in roles:
            yield role

    n_wg_max = math.ceil(max(min(block_q, n_rows), tile_rows) / WG_ROWS)
    # (one query row sees every key: its blocks are alike, causal or not)
    period = (num_splits * tr if split else lpt_period(g_count, tr, swizzle) if lpt
              else row_blocks_period(wl if nq > 1 else replace(wl, causal=False), block_q, n_rows))
    launches = [Launch("flash3_fwd", g_count * num_splits * tr, flash3_sram_bytes(wl, block_q, block_kv, stages, fp8),
                       block, allocs=(O_acc, L_acc) if split else (O, LSE), tensor_op=op, period=period,
                       threads_per_block=128 * (n_wg_max + 1), registers_per_thread=registers_per_thread)]
    if split:
        launches.append(fa3_combine_launch(wl, num_splits, O_acc, L_acc, O, LSE, numeric))
    return Program("flash3_forward", launches, inputs=tuple(tensors.values()), outputs={"O": O, "lse": LSE})
