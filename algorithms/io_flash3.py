"""Closed forms of FlashAttention-3's traffic (algorithms/flash3.py, flash3_backward.py): what its
counters must equal, derived on paper.

FA3 moves the bytes FA2 moves; what differs is when. Forward: Q_i once per query block, the K/V
rows each query block can see (every key without the causal mask, up to the block holding its
last visible key with it), O and the log-sum-exp once. FP8: Q, K and V are e4m3 (1 byte), O stays
in the workload's 16-bit dtype. The in-kernel transpose of V (FP8) stays in shared memory: no
global bytes. Backward (fp16/bf16 only, as in FA3): the preprocessing, main and dQ-conversion
kernels of FA2's backward, element for element (flash2_backward_io)."""
from __future__ import annotations

import math

from .flash3_pack import PackGQA
from .io_formulas import flash2_backward_io
from .paged import table_entries
from .workload import Workload

STATS = 4          # fp32 log-sum-exp
INDEX = 4          # an int32 page-table entry
FP8 = 1            # e4m3


def flash3_kv_ends(wl: Workload, block_q: int, block_kv: int, pack: int = 1) -> list:
    """Per block of rows of one of the grid's batch-heads (a K/V head's, packed), the keys [0, end)
    its tiles read: all of them, or under the causal mask up to the tile holding its last query
    row's last visible key (real keys only: TMA does not read past Nk)."""
    pk, nk = PackGQA(wl, pack), wl.seq_len_kv
    if not wl.causal:
        return [nk] * pk.blocks(block_q)
    return [min(nk, math.ceil(pk.kv_end(min(pk.rows, (i + 1) * block_q)) / block_kv) * block_kv)
            for i in range(pk.blocks(block_q))]


def flash3_forward_io(wl: Workload, block_q: int, block_kv: int, fp8: bool = False, pack: int = 1) -> dict:
    """{tensor: (read bytes, write bytes)} of flash3's forward with block_q x block_kv tiles; `pack`
    query heads a K/V head packed as a tile's rows (PackGQA: the same Q and O bytes, K and V read
    once per block of packed rows of a K/V head). A paged cache: the same K/V bytes (a tile read
    page by page) and each block's page_table entries, 4 B each (paged.table_entries: the pages its
    keys [0, end) touch)."""
    g, nq, d = wl.groups, wl.seq_len_q, wl.head_dim
    e_in = FP8 if fp8 else wl.itemsize          # Q, K, V
    ends = flash3_kv_ends(wl, block_q, block_kv, pack)   # per block of a batch-head of the grid
    kv_rows = sum(ends)
    g_kv = PackGQA(wl, pack).groups            # ... of which there are
    io = {
        "Q": (g * nq * d * e_in, 0),               # each query row once (its block's Q load)
        "K": (g_kv * kv_rows * d * e_in, 0),       # the K_j each block sees
        "V": (g_kv * kv_rows * d * e_in, 0),       # ... and V_j
        "O": (0, g * nq * d * wl.itemsize),        # every row's output once
        "lse": (0, g * nq * STATS),                # and its log-sum-exp
    }
    if wl.kv_page_size is not None:               # each block's page-table entries
        io["block_table"] = (g_kv * sum(table_entries(wl, 0, end) for end in ends) * INDEX, 0)
    return io


def flash3_backward_io(wl: Workload, block_q: int, block_kv: int) -> dict:
    """The backward's launches are FA2's (D and the dQ accumulator, the main kernel over every
    visited (K/V block, query block) pair with dQ added atomically, the conversion of dQ), so
    their bytes are flash2_backward_io's with FA3's blocks."""
    return flash2_backward_io(wl, block_q, block_kv)


def flash3_query_blocks(wl: Workload, block_q: int) -> int:
    """Query blocks (thread blocks of the forward) per batch-head."""
    return math.ceil(wl.seq_len_q / block_q)
