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

from .io_formulas import flash2_backward_io, flash2_kv_rows_read
from .workload import Workload

STATS = 4          # fp32 log-sum-exp
FP8 = 1            # e4m3


def flash3_forward_io(wl: Workload, block_q: int, block_kv: int, fp8: bool = False) -> dict:
    """{tensor: (read bytes, write bytes)} of flash3's forward with block_q x block_kv tiles."""
    g, nq, d = wl.groups, wl.seq_len_q, wl.head_dim
    e_in = FP8 if fp8 else wl.itemsize          # Q, K, V
    kv_rows = flash2_kv_rows_read(wl, block_q, block_kv)   # per batch-head, summed over its query blocks
    return {
        "Q": (g * nq * d * e_in, 0),               # each query block's Q_i, one TMA load
        "K": (g * kv_rows * d * e_in, 0),          # the K_j each query block sees
        "V": (g * kv_rows * d * e_in, 0),          # ... and V_j
        "O": (0, g * nq * d * wl.itemsize),        # every row's output once
        "lse": (0, g * nq * STATS),                # and its log-sum-exp
    }


def flash3_backward_io(wl: Workload, block_q: int, block_kv: int) -> dict:
    """The backward's launches are FA2's (D and the dQ accumulator, the main kernel over every
    visited (K/V block, query block) pair with dQ added atomically, the conversion of dQ), so
    their bytes are flash2_backward_io's with FA3's blocks."""
    return flash2_backward_io(wl, block_q, block_kv)


def flash3_query_blocks(wl: Workload, block_q: int) -> int:
    """Query blocks (thread blocks of the forward) per batch-head."""
    return math.ceil(wl.seq_len_q / block_q)
