"""flash2 variant "rawkernel-tc": the program of this project's tensor-core RawKernel
(kernels/flash_attention_tc.cu), its closed-form traffic, and its mapping rule.

The kernel, as issued (one thread block per (batch-head, query block), warps x 32 threads, each
warp 16 query rows per m-tile of mma.sync.m16n8k16):
- stage 0: cp.async of Q_i, K_0 and V_0 in 16-byte chunks (one cp.async group); then per K/V tile
  j, the loads of K_{j+1} and V_{j+1} into the other of two shared-memory stages are issued before
  tile j is computed (double buffering), so tile j+1 lands while tile j's mma run;
- Q_i goes to registers (ldmatrix) once; S = Q K_j^T, the online softmax and O += P V_j stay in
  registers; P is rounded to the input dtype before the P V mma;
- O_i is staged through Q_i's shared tile and written with 16-byte coalesced stores (valid rows
  only); the log-sum-exp goes to an fp32 tensor whose rows are padded to a multiple of 8 per
  batch-head (Nq8 = ceil(Nq / 8) * 8), 8 rows (one 32-byte sector) per warp store, so that every
  global access of the kernel is whole 32-byte sectors and its bytes equal sectors x 32 (the
  emulation, kernels/emulation_tc.py, counts sectors per warp instruction and checks it).
The kernel runs fp16/bf16, head dims 64 and 128, block_q a multiple of 16 x warps, block_kv a
multiple of 16, no key padding or dropout. The variant models any flash2 workload with the same
schedule (for the registry's property tests), saying in a note when the kernel cannot run it; key
padding (one 4-byte kv_lens read per block) and dropout are then modelled as flash2 does them. It
has no backward kernel: a training run resolves to variant "fa2-kernel" (FA2's forward and backward).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from hbmsim.simulator import HbmsimError, Launch, Program
from hbmsim.simulator.tensor import COALESCED, SECTOR_BYTES
from hbmsim.simulator.time_model import MMA_SYNC

from .blocks import halve_until
from .common import (STATS_DTYPE, block_rows, input_tensors, masked_scores, online_softmax_vector_flops, output,
                     row_blocks_period, scaled_keep_mask, unnormalised_softmax_step)
from .common import tiles_per_step as coarse_step
from .io_formulas import INDEX, STATS, flash2_kv_rows_read
from .workload import AttentionData, Workload, causal_kv_end

RAWKERNEL_TC = "rawkernel-tc"
FA2_KERNEL = "fa2-kernel"                  # flash2_spec.FA2_KERNEL (not imported: it imports this module)
AUTO = "auto"
SECTOR = 32                 # bytes: the L2 / DRAM access unit (CUDA C++ Best Practices Guide)
LSE_ROW_ALIGN = 8           # 8 fp32 rows = one 32-byte L2 sector (CUDA C Programming Guide, 5.3.2)
MMA_M = 16                  # rows of one mma.sync.m16n8k16 (PTX ISA, "Matrix shape" of mma)
MMA_K = 16                  # its k: block_kv must be a multiple (the P V mma runs over keys)
KERNEL_DTYPES = ("fp16", "bf16")


@dataclass(frozen=True)
class TcTileTraits:
    """One row of the kernel's launch rule (kernels/flash_attention_tc.cu's TcTraits and
    kernels/emulation_tc_config.py hold the same table; tests/test_rawkernel_tc.py checks)."""
    block_q: int
    block_kv: int
    warps: int
    stages: int


# Per head dim: 8 warps of 16 query rows (one m-tile each), two K/V stages. 64: 128 x 128 tiles,
# 80 KiB of shared memory; 128: 128 x 64, 96 KiB: two blocks fit an H100 SM's 228 KiB, one an
# A100's 164 KiB (NVIDIA H100 / A100 tuning guides, "Shared memory capacity").
TC_TRAITS = {64: TcTileTraits(128, 128, 8, 2), 128: TcTileTraits(128, 64, 8, 2)}


def tc_tile_traits(head_dim: int) -> TcTileTraits:
    """The launch rule: head dims up to 64 take the 64 row, larger ones the 128 row."""
    return TC_TRAITS[64 if head_dim <= 64 else 128]


def tc_sram_bytes(wl: Workload, block_q: int, block_kv: int, stages: int = 2) -> int:
    # Q_i (block_q x d, reused to stage O_i) and `stages` buffers of K_j and V_j (block_kv x d
    # each), all in the storage dtype; S/P, the O accumulator, m and l live in registers
    return (block_q + 2 * stages * block_kv) * wl.head_dim * wl.itemsize


def tc_registers_estimate(head_dim: int, block_kv: int, rows_per_warp: int) -> int:
    """Registers per thread, an ESTIMATE from the fragments a thread holds (to be replaced by the
    figure Nsight Compute reports on a GPU): per m-tile of 16 rows, 1/32 of S (16 x block_kv fp32),
    of the O accumulator (16 x d fp32) and of Q (16 x d, two 16-bit values a register), and m, l
    for its two rows; the B fragments of the whole K_j tile (d x block_kv 16-bit values over 32
    threads), which the unrolled loop keeps live; 32 for addresses, indices and loop state. Capped
    at 255, the most a thread may have. ptxas -v (CUDA 13.0, sm_80) reports 255, 252, 167, 127
    for d = 64 128x128 8 warps, d = 128 128x64 8 warps, d = 64 64x64 4 warps, d = 64 128x32 8
    warps, where this gives 255, 255, 180, 132 (docs/kernels.md)."""
    m_tiles = max(1, rows_per_warp // MMA_M)
    per_tile = MMA_M * block_kv // 32 + MMA_M * head_dim // 32 + MMA_M * head_dim // 64 + 4
    return min(255, m_tiles * per_tile + head_dim * block_kv // 64 + 32)


def lse_rows_padded(seq_len_q: int) -> int:
    """Nq8: the lse tensor's rows per batch-head, a whole number of 32-byte sectors."""
    return math.ceil(seq_len_q / LSE_ROW_ALIGN) * LSE_ROW_ALIGN


def _span_bytes(start: int, nbytes: int) -> int:
    """Bytes of the 32-byte sectors that the contiguous bytes [start, start + nbytes) touch: what a
    coalesced access moves (a sector is the L2's and DRAM's unit: CUDA C++ Best Practices Guide,
    "Coalesced Access to Global Memory"), every tensor starting on a sector (cudaMalloc aligns to
    256 bytes)."""
    return ((start + nbytes + SECTOR - 1) // SECTOR - start // SECTOR) * SECTOR if nbytes > 0 else 0


def kv_tile_spans(wl: Workload, block_q: int, block_kv: int, i: int) -> list[tuple[int, int]]:
    """The key ranges [c0, c1) of the K/V tiles query block i loads: every tile up to the one
    holding its last visible key, each clipped to Nk."""
    nq, nk = wl.seq_len_q, wl.seq_len_kv
    kv_end = causal_kv_end(wl, min(nq, (i + 1) * block_q)) if wl.causal else nk
    return [(c0, min(nk, c0 + block_kv)) for c0 in range(0, kv_end, block_kv)]


def rawkernel_tc_forward_io(wl: Workload, block_q: int, block_kv: int) -> dict:
    """Closed-form bytes of the kernel's forward, per tensor, as 32-byte sectors x 32 (G =
    batch*heads, e = itemsize, rows of d e bytes):
    Q read once, O written once: G Nq d e; K and V: every query block reads the K/V tiles it can
    see, clipped to Nk (flash2_kv_rows_read rows): G rows d e each; lse: the Nq8 padded rows once,
    4 bytes each: G Nq8 4. These are exact when d e is a multiple of 32 and block_q of 8 (the
    kernel's only configurations: every access whole sectors). Other shapes, which the variant
    models but the kernel does not run, add up each tile's sector span (_span_bytes), as the
    simulator counts a tile; key padding adds a 4-byte kv_lens read per block, one sector."""
    g, nq, nk, d, e = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.itemsize
    row, tr, nq8 = d * e, math.ceil(nq / block_q), lse_rows_padded(nq)
    if row % SECTOR == 0:
        q_bytes, kv_bytes = g * nq * row, g * flash2_kv_rows_read(wl, block_q, block_kv) * row
    else:
        q_bytes = sum(_span_bytes((gi * nq + r0) * row, (min(nq, r0 + block_q) - r0) * row)
                      for gi in range(g) for r0 in range(0, nq, block_q))
        kv_bytes = sum(_span_bytes((wl.kv_group(gi) * nk + c0) * row, (c1 - c0) * row)
                       for gi in range(g) for i in range(tr) for c0, c1 in kv_tile_spans(wl, block_q, block_kv, i))
    if block_q % LSE_ROW_ALIGN == 0:
        lse_bytes = g * nq8 * STATS
    else:
        lse_bytes = sum(_span_bytes((gi * nq8 + r0) * STATS, (min(nq8, r0 + block_q) - r0) * STATS)
                        for gi in range(g) for r0 in range(0, nq, block_q))
    io = {"Q": (q_bytes, 0), "K": (kv_bytes, 0), "V": (kv_bytes, 0)}
    if wl.key_padding_mask:        # one kv_lens entry per block: a 4-byte read, one sector
        io["kv_lens"] = (sum(_span_bytes((gi // wl.heads) * INDEX, INDEX) for gi in range(g)) * tr, 0)
    io["O"] = (0, q_bytes)
    io["lse"] = (0, lse_bytes)
    return io


def _lse_rows(r0: int, block_q: int, nq8: int) -> slice:
    """lse rows a block writes: its own, and the last block of a batch-head the padding too."""
    return slice(r0, min(nq8, r0 + block_q))


def rawkernel_tc_forward(wl: Workload, block_q: int, block_kv: int, data: AttentionData | None = None,
                         warps: int = 8, stages: int = 2, tiles_per_step: int = 1,
                         registers_per_thread: int = 0) -> Program:
    """The kernel's forward (module docstring). `tiles_per_step` > 1 (fast mode): a simulated
    step loads and computes that many K/V tiles; counts are the sum of the tiles' own."""
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    nq8 = lse_rows_padded(nq)
    O = output(wl, "O", nq, d, wl.dtype, data)
    LSE = output(wl, "lse", nq8, 1, STATS_DTYPE, data)
    tr = math.ceil(nq / block_q)
    scale, e = wl.softmax_scale, wl.itemsize
    keep = scaled_keep_mask(wl, data)
    numeric = data is not None
    all_cols = slice(0, d)

    def steps_of(kv_end):
        own = coarse_step(math.ceil(kv_end / block_kv), even=not wl.causal)
        width = block_kv * (min(tiles_per_step, own) if tiles_per_step > 1 else 1)
        return [(c0, min(kv_end, c0 + width)) for c0 in range(0, kv_end, width)]

    def kv_tiles(kg, c0, c_end):
        """(end, K and V tiles) of a step's keys [c0, c_end): whole tiles, clipped to Nk, each
        its own access (one cp.async pass of the block's threads)."""
        c1 = min(nk, c0 + math.ceil((c_end - c0) / block_kv) * block_kv)
        spans = [slice(a, min(c1, a + block_kv)) for a in range(c0, c1, block_kv)]
        return c1, [(K[kg], c, all_cols, COALESCED) for c in spans] + [(V[kg], c, all_cols, COALESCED) for c in spans]

    def block(ctx, index):
        g, i = divmod(index, tr)
        rows = block_rows(i, block_q, nq)
        r0, r1, n = rows.start, rows.stop, rows.stop - rows.start
        kv_end = causal_kv_end(wl, r1) if wl.causal else nk
        steps, kg = steps_of(kv_end), wl.kv_group(g)
        # every access as the kernel's coalesced warp instructions touch it: whole 32-byte sectors
        first = [(Q[g], rows, all_cols, COALESCED)]
        if wl.key_padding_mask:
            first.append((tensors["kv_lens"][g // wl.heads], slice(0, 1), slice(0, 1), COALESCED))
        if steps:                                  # stage 0: Q_i, K_0, V_0 in one cp.async group
            first += kv_tiles(kg, *steps[0])[1]
        handle = ctx.prefetch(*first)
        kv_len = None
        if numeric:
            m, l, acc = np.full(n, -np.inf), np.zeros(n), np.zeros((n, d))
        for s_i, (c0, c_end) in enumerate(steps):
            c1, _ = kv_tiles(kg, c0, c_end)
            nc, tiles = c1 - c0, math.ceil((c1 - c0) / block_kv)
            nxt = ctx.prefetch(*kv_tiles(kg, *steps[s_i + 1])[1]) if s_i + 1 < len(steps) else None
            got = yield from ctx.wait(handle)
            if s_i == 0:
                q = got[0]
                if wl.key_padding_mask and numeric:
                    kv_len = int(got[1][0, 0])
            kv = got[-2 * tiles:]
            if numeric:
                k, v = np.vstack(kv[:tiles]), np.vstack(kv[tiles:])
            # S = Q_i K_j^T and P V_j: 2 n nc d FLOPs each (multiply-add = 2); the online softmax
            # (common.online_softmax_vector_flops), the per-row terms once per tile; an exp per
            # score and per row (the rescale). SRAM: Q_i read once into registers (first tile),
            # and every warp reads all of K_j and V_j for its own rows.
            yield from ctx.compute(matmul_flops=4 * n * nc * d,
                                   vector_flops=online_softmax_vector_flops(wl, n, nc)
                                   + (tiles - 1) * online_softmax_vector_flops(wl, n, 0),
                                   sram_bytes=((n if s_i == 0 else 0) + 2 * warps * nc) * d * e,
                                   exp_ops=n * nc + tiles * n)
            if numeric:
                s = masked_scores(wl, scale, q, k, kv_len, r0, r1, c0, c1)
                m_new, p, alpha, l = unnormalised_softmax_step(s, m, l)
                if keep is not None:
                    p = p * keep[g, r0:r1, c0:c1]
                acc = alpha[:, None] * acc + p @ v
                m = m_new
            handle = nxt
        if not steps:
            yield from ctx.wait(handle)           # Q_i is loaded even when the block sees no key
        yield from ctx.compute(vector_flops=n * d + 2 * n)   # O = acc / l, lse = m + log l
        lse_rows = _lse_rows(r0, block_q, nq8)
        o_tile = lse_tile = None
        if numeric:
            pos = l > 0
            o_tile = np.zeros((n, d))
            o_tile[pos] = acc[pos] / l[pos, None]
            lse_tile = np.full((lse_rows.stop - r0, 1), -np.inf)      # padding rows: -inf
            lse_tile[:n][pos, 0] = m[pos] + np.log(l[pos])
        yield from ctx.store_tiles((O[g], rows, all_cols, o_tile, COALESCED),
                                   (LSE[g], lse_rows, slice(0, 1), lse_tile, COALESCED))

    # A period (fold.py) needs blocks a period apart to count alike. Their tiles are the same rows of
    # another batch-head, which starts (G x rows x cols x itemsize) bytes further on: the same
    # sectors only when Q's, K's and V's batch-heads are whole sectors (the lse's, Nq8 rows of 4
    # bytes, always are). Else those launches never fold: Nk = 129, d = 8, fp16 has batch-heads of
    # 2064 bytes, 64.5 sectors, and every other one touched one more sector per tile row end.
    aligned = all(rows * d * e % SECTOR_BYTES == 0 for rows in (nq, nk))
    launch = Launch("flash_attention_tc", g_count * tr, tc_sram_bytes(wl, block_q, block_kv, stages), block,
                    allocs=(O, LSE), tensor_op=MMA_SYNC, period=row_blocks_period(wl, block_q, nq) if aligned else 0,
                    threads_per_block=32 * warps, registers_per_thread=registers_per_thread)
    # "lse_padded": (G, Nq8, 1) as the kernel writes it; rows Nq.. are -inf
    return Program("flash2_rawkernel_tc_forward", [launch], inputs=tuple(tensors.values()),
                   outputs={"O": O, "lse_padded": LSE})


# ---- the variant's hooks (flash2_spec routes mappings with variant = "rawkernel-tc" here) ----------

def kernel_runs(wl: Workload, m) -> list[str]:
    """Why the RawKernel itself cannot run this resolved mapping (empty: it can)."""
    why = []
    if wl.dtype not in KERNEL_DTYPES:
        why.append(f"dtype {wl.dtype} (fp16, bf16)")
    if wl.head_dim not in TC_TRAITS:
        why.append(f"head_dim {wl.head_dim} (64, 128)")
    if m.block_q % (MMA_M * m.warps) or m.block_kv % MMA_K:
        why.append(f"blocks {m.block_q}x{m.block_kv} with {m.warps} warps (block_q a multiple of 16 x warps, "
                   "block_kv of 16)")
    if wl.key_padding_mask or wl.dropout > 0:
        why.append("key padding / dropout")
    return why


def resolve(gpu, wl: Workload, m, training: bool) -> tuple:
    """Auto blocks and warps from TC_TRAITS (halved until they fit the simulated SRAM, saying
    so); given blocks kept as they are (the kernel allocates whole tiles). Split-KV, packing, KV append and a paged
    cache are FA2 kernel features: one line (HbmsimError)."""
    if wl.kv_page_size is not None:
        raise HbmsimError(f"flash2: kv_page_size = {wl.kv_page_size}: variant \"{RAWKERNEL_TC}\" reads K/V "
                          "contiguously; use variant \"fa2-kernel\" for a paged KV cache")
    if m.num_splits not in (1, AUTO) or m.pack_gqa is True or m.kv_append is True:
        raise HbmsimError("flash2: num_splits, pack_gqa and kv_append model the FA2 kernel: use variant "
                          "\"fa2-kernel\"")
    row, notes = tc_tile_traits(wl.head_dim), []
    bq = row.block_q if m.block_q == AUTO else m.block_q
    bkv = row.block_kv if m.block_kv == AUTO else m.block_kv
    if m.block_q == AUTO and m.block_kv == AUTO:
        limit, b0 = gpu.sram_bytes_per_sm, (bq, bkv)
        bq, bkv = halve_until(bq, bkv, lambda r, c: tc_sram_bytes(wl, r, c, row.stages) <= limit, floor=MMA_M)
        if (bq, bkv) != b0:
            notes.append(f"{RAWKERNEL_TC}: the kernel's blocks {b0[0]}x{b0[1]} do not fit sram_bytes_per_sm = "
                         f"{limit}: {bq}x{bkv}")
    warps = min(row.warps, max(1, bq // MMA_M)) if m.warps == AUTO else m.warps
    m = replace(m, block_q=bq, block_kv=bkv, warps=warps, num_splits=1, pack_gqa=False, kv_append=False,
                block_q_bwd=bq if m.block_q_bwd == AUTO else m.block_q_bwd,
                block_kv_bwd=bkv if m.block_kv_bwd == AUTO else m.block_kv_bwd,
                warps_bwd=warps if m.warps_bwd == AUTO else m.warps_bwd)     # unused: no backward
    why = kernel_runs(wl, m)
    if why:
        notes.append(f"{RAWKERNEL_TC}: the kernel does not run {', '.join(why)}: modelled, not runnable")
    return m, tuple(notes)


def registers(wl: Workload, m) -> int:
    return tc_registers_estimate(wl.head_dim, m.block_kv, max(MMA_M, m.block_q // m.warps))


def _fwd_step(wl: Workload, block_kv: int, fast: bool) -> int:
    return coarse_step(math.ceil(wl.seq_len_kv / block_kv), not wl.causal) if fast else 1


def build(wl: Workload, m, data: AttentionData | None, training: bool, fast: bool = False) -> Program:
    if training:      # resolve() hands training runs to variant fa2-kernel
        raise HbmsimError(f"flash2: variant \"{RAWKERNEL_TC}\" has no backward; resolve the mapping for training first")
    return rawkernel_tc_forward(wl, m.block_q, m.block_kv, data, m.warps, tc_tile_traits(wl.head_dim).stages,
                                _fwd_step(wl, m.block_kv, fast), registers(wl, m))


def io(wl: Workload, m, pass_name: str) -> dict:
    return rawkernel_tc_forward_io(wl, m.block_q, m.block_kv)


def sram_bytes(wl: Workload, m, training: bool) -> int:
    return tc_sram_bytes(wl, m.block_q, m.block_kv, tc_tile_traits(wl.head_dim).stages)


def steps(wl: Workload, m, training: bool, fast: bool = False) -> int:
    kv_tiles = math.ceil(wl.seq_len_kv / m.block_kv)
    return wl.groups * math.ceil(wl.seq_len_q / m.block_q) * math.ceil(kv_tiles / _fwd_step(wl, m.block_kv, fast))


def hooks(**default) -> dict:
    """flash2's AlgorithmSpec hooks (build, io, sram_bytes, resolve, steps, describe), each
    routed to this module's own when the mapping has variant = "rawkernel-tc". The kernel has no
    backward: a training run resolves to variant "fa2-kernel" (FA2's forward and backward), and
    says so in a note."""
    ours = {"build": build, "io": io, "sram_bytes": sram_bytes, "steps": steps}
    out = {name: _routed(default[name], ours[name]) for name in ours}
    fa2_resolve, describe = default["resolve"], default["describe"]

    def resolve_any(gpu, wl, m, training):
        if m.variant != RAWKERNEL_TC:
            return fa2_resolve(gpu, wl, m, training)
        if training:
            m, notes = fa2_resolve(gpu, wl, replace(m, variant=FA2_KERNEL), training)
            return m, (f"{RAWKERNEL_TC}: no backward kernel yet: a training run is FA2's forward and backward "
                       f"(variant {FA2_KERNEL})",) + tuple(notes)
        return resolve(gpu, wl, m, training)
    out["resolve"] = resolve_any
    out["describe"] = lambda m: describe(m) + (" (rawkernel-tc)" if m.variant == RAWKERNEL_TC else "")
    return out


def _routed(default, ours):
    """`default`, or `ours` when the mapping (the second positional argument) is this variant's."""
    def hook(*args, **kwargs):
        return (ours if args[1].variant == RAWKERNEL_TC else default)(*args, **kwargs)
    return hook
