"""flash2 variant "rawkernel-teaching": exactly what this project's teaching kernel
(kernels/flash_attention.cu, the CuPy RawKernel `hbmsim profile` measures) issues, counted in
32-byte sectors.

The kernel runs BLOCK_Q threads a block, one per query row, and moves every tile with the same
loop, `for (e = threadIdx.x; e < rows * HEAD_DIM; e += BLOCK_Q)` (load_tile / store_tile,
flash_attention.cu lines 58-75, called at lines 117, 128-129 and 186): each warp instruction
touches the sectors of its (up to 32) consecutive elements, so a tile costs the sectors of its
warp-sized chunks (simulator/tensor.py: Strided(BLOCK_Q)). The log-sum-exp is stored one fp32
per thread, threads t < rows (line 184): the same pattern over a tile of one column. O is staged through shared
memory and stored by that loop (lines 183, 186), not thread by thread. With BLOCK_Q a multiple of
32 and rows of whole sectors (HEAD_DIM * itemsize a multiple of 32, as for every head dim the
kernel takes) the chunks are whole sectors and the counts are the tile's own bytes; blocks of,
say, 9 or 16 threads store 18- or 32-byte chunks, and the log-sum-exp of a ragged batch-head
starts mid-sector.

Its loads and stores, tile for tile, are flash2_forward's (algorithms/flash2.py; K/V blocks that
no row can see skipped as the kernel's kv_end does). Its arithmetic is not FA2's: S = Q K^T and
P V run as FP32 FMAs on the vector lanes (no tensor cores), which the program says by counting
them as vector FLOPs; its time is not validated (docs/kernels.md: about 30x the FA2-like time).
"""
from __future__ import annotations

import math
from dataclasses import replace

from hbmsim.simulator import DTYPE_BYTES, HbmsimError
from hbmsim.simulator.tensor import SECTOR_BYTES, Strided, tile_sectors

from .common import STATS_DTYPE
from .workload import Workload, causal_kv_end

TEACHING = "rawkernel-teaching"
# What kernels/config.py compiles: the kernel's head dims and storage dtypes.
TEACHING_HEAD_DIMS = (32, 64, 128)
TEACHING_DTYPES = ("fp16", "fp32")
MAX_THREADS_PER_BLOCK = 1024           # one thread per query row (CUDA's limit per block)


def teaching_mapping(wl: Workload, m, training: bool, fa2_kernel: str) -> tuple:
    """(mapping, notes) for variant TEACHING before flash2 resolves its blocks. The variant models
    any flash2 forward with the kernel's tiles and access pattern (the registry's property tests
    run every variant everywhere), saying in a note what the kernel itself cannot run; key
    padding (a 4-byte kv_lens read per block, one sector) and grouped K/V heads are modelled as
    flash2 does them. It has no backward: a training run is FA2's (variant `fa2_kernel`). A
    paged KV cache is refused: the kernel reads K/V contiguously."""
    if training:
        return replace(m, variant=fa2_kernel), (f"{TEACHING}: the teaching kernel has no backward: a training run "
                                                f"is FA2's forward and backward (variant {fa2_kernel})",)
    if wl.kv_page_size is not None:
        raise HbmsimError(f"flash2: kv_page_size = {wl.kv_page_size}: variant \"{TEACHING}\" reads K/V contiguously; "
                          f"use variant \"{fa2_kernel}\" for a paged KV cache")
    why = []
    if wl.head_dim not in TEACHING_HEAD_DIMS:
        why.append(f"head_dim = {wl.head_dim} (it compiles {', '.join(map(str, TEACHING_HEAD_DIMS))})")
    if wl.dtype not in TEACHING_DTYPES:
        why.append(f"dtype = {wl.dtype} (it stores {' and '.join(TEACHING_DTYPES)})")
    if wl.key_padding_mask or wl.dropout > 0 or wl.kv_heads != wl.heads:
        why.append("key padding, dropout or grouped K/V heads")
    if isinstance(m.block_q, int) and m.block_q > MAX_THREADS_PER_BLOCK:
        why.append(f"block_q = {m.block_q} (one thread per query row: at most {MAX_THREADS_PER_BLOCK})")
    return m, ((f"{TEACHING}: kernels/flash_attention.cu does not run {'; '.join(why)}: modelled, not runnable",)
               if why else ())


def teaching_forward_io(wl: Workload, block_q: int, block_kv: int) -> dict:
    """Closed form: L2-side bytes per tensor, in sectors, of the teaching kernel's forward. Per
    (batch-head g, query block i): Q_i once; each visible K/V block once (kv_end as in the
    kernel; K/V head kv_group(g)); O_i and lse_i once; every tile under Strided(block_q)."""
    g_count, nq, nk, d, e = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.itemsize
    access = Strided(block_q)
    tr = math.ceil(nq / block_q)
    stats_e = DTYPE_BYTES[STATS_DTYPE]
    kv_shape = (wl.batch * wl.kv_heads, nk, d)
    io = {"Q": [0, 0], "K": [0, 0], "V": [0, 0], "O": [0, 0], "lse": [0, 0]}
    if wl.key_padding_mask:            # one int32 kv_lens entry per block: one sector
        io["kv_lens"] = [g_count * tr, 0]
    for g in range(g_count):
        for i in range(tr):
            r0, r1 = i * block_q, min(nq, (i + 1) * block_q)
            q_sectors = tile_sectors((g_count, nq, d), e, g, r0, r1, 0, d, access)
            io["Q"][0] += q_sectors
            io["O"][1] += q_sectors           # O has Q's shape and dtype: the same tile, stored
            io["lse"][1] += tile_sectors((g_count, nq, 1), stats_e, g, r0, r1, 0, 1, access)
            kv_end = causal_kv_end(wl, r1) if wl.causal else nk
            for c0 in range(0, kv_end, block_kv):
                s = tile_sectors(kv_shape, e, wl.kv_group(g), c0, min(nk, c0 + block_kv), 0, d, access)
                io["K"][0] += s
                io["V"][0] += s
    return {name: (r * SECTOR_BYTES, w * SECTOR_BYTES) for name, (r, w) in io.items()}


def teaching_aligned(wl: Workload, block_q: int) -> bool:
    """Whether every tile's warp chunks are whole sectors, so that the sector counts equal the
    element bytes (flash2_forward_io): BLOCK_Q a multiple of 32 rows, rows of whole sectors,
    and each batch-head's log-sum-exp starting on a sector."""
    return (block_q % 32 == 0 and wl.head_dim * wl.itemsize % SECTOR_BYTES == 0
            and wl.seq_len_q * DTYPE_BYTES[STATS_DTYPE] % SECTOR_BYTES == 0)

