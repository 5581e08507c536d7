"""Closed-form L2-side traffic (bytes requested from global memory) of each program: bytes read and written, per tensor.

These are derived from the algorithms on paper, not from the simulator; tests require the
simulator's counters to equal them exactly for every shape, block size and mask. Ragged edges
are exact because a tile is clipped to the tensor, so a tensor's rows are read exactly once per
pass over them. With kv_heads < heads the flash programs request K/V tiles per query head as
before (the shared head is read, not copied: only DRAM bytes fall), and their backward adds
the group sums of the expanded dK, dV (gqa.reduce_kv_io).
Notation: G = batch*heads, e = bytes per element of the storage dtype,
Nq, Nk = query and key lengths, d = head dim, Br x Bc = flash blocks, Tr = ceil(Nq/Br).

Growth laws these formulas show (Nq = Nk = N, fixed d):
- standard: S and P cost Theta(G N^2 e) bytes each way, and P is an N x N HBM footprint.
- flash2: K and V are each read Tr = ceil(N/Br) times: G N d e ceil(N/Br); with the paper's
  Br ~ M/(4d) that is Theta(N^2 d^2 / M). Nothing of size N x N is stored.
"""
from __future__ import annotations

import math

from hbmsim.simulator import DTYPE_BYTES

from .gqa import reduce_kv_io
from .common import INDEX_DTYPE, MASK_DTYPE, STATS_DTYPE
from .workload import Workload, causal_first_q_block, causal_kv_end

STATS = DTYPE_BYTES[STATS_DTYPE]
MASK = DTYPE_BYTES[MASK_DTYPE]
INDEX = DTYPE_BYTES[INDEX_DTYPE]


def _add(io: dict, name: str, read: int = 0, write: int = 0) -> None:
    r, w = io.get(name, (0, 0))
    io[name] = (r + read, w + write)


def flash2_kv_rows_read(wl: Workload, block_q: int, block_kv: int) -> int:
    """Rows of K (and of V) one batch-head reads: every query block reads the K/V blocks it can
    see; under the causal mask that is blocks up to the one holding its last visible key."""
    nq, nk = wl.seq_len_q, wl.seq_len_kv
    tr = math.ceil(nq / block_q)
    if not wl.causal:
        return tr * nk
    rows = 0
    for i in range(tr):
        end = causal_kv_end(wl, min(nq, (i + 1) * block_q))
        rows += min(nk, math.ceil(end / block_kv) * block_kv)
    return rows


def flash2_table_entries(wl: Workload, block_q: int, block_kv: int) -> int:
    """Paged KV cache (algorithms/paged.py): block-table entries one batch-head's thread blocks
    read, each those of the pages its keys [0, end) touch, end its last K/V tile's end:
    ceil(end / P) per query block (0 when it sees no key)."""
    nq, nk, p = wl.seq_len_q, wl.seq_len_kv, wl.kv_page_size
    entries = 0
    for i in range(math.ceil(nq / block_q)):
        end = causal_kv_end(wl, min(nq, (i + 1) * block_q)) if wl.causal else nk
        entries += math.ceil(min(nk, math.ceil(end / block_kv) * block_kv) / p)
    return entries


def flash2_forward_io(wl: Workload, block_q: int, block_kv: int) -> dict:
    """K/V bytes are those of a contiguous cache whether paged or not (a tile read page by page
    moves the same bytes); a paged cache adds the block-table reads (4 B an entry)."""
    g, nq, d, e = wl.groups, wl.seq_len_q, wl.head_dim, wl.itemsize
    tr = math.ceil(nq / block_q)
    kv_rows = flash2_kv_rows_read(wl, block_q, block_kv)
    io: dict = {}
    _add(io, "Q", read=g * nq * d * e)
    _add(io, "K", read=g * kv_rows * d * e)
    _add(io, "V", read=g * kv_rows * d * e)
    if wl.key_padding_mask:
        _add(io, "kv_lens", read=g * tr * INDEX)
    if getattr(wl, "kv_page_size", None) is not None:
        _add(io, "block_table", read=g * flash2_table_entries(wl, block_q, block_kv) * INDEX)
    _add(io, "O", write=g * nq * d * e)
    _add(io, "lse", write=g * nq * STATS)
    return io


def flash1_q_rows_visited(wl: Workload, block_q: int, block_kv: int) -> tuple[int, int]:
    """(K/V rows loaded, query rows visited) per batch-head: the outer loop loads each K/V
    block that some query can see; the inner loop visits query blocks from the first that can."""
    nq, nk = wl.seq_len_q, wl.seq_len_kv
    tr = math.ceil(nq / block_q)
    kv_rows = q_rows = 0
    for c0 in range(0, nk, block_kv):
        i0 = causal_first_q_block(wl, c0, block_q)
        if i0 >= tr:
            continue
        kv_rows += min(nk, c0 + block_kv) - c0
        q_rows += nq - i0 * block_q
    return kv_rows, q_rows


def flash1_forward_io(wl: Workload, block_q: int, block_kv: int) -> dict:
    g, nq, d, e = wl.groups, wl.seq_len_q, wl.head_dim, wl.itemsize
    kv_rows, q_rows = flash1_q_rows_visited(wl, block_q, block_kv)
    io: dict = {}
    # init kernel: O = 0, l = 0, m = -inf
    _add(io, "O", write=g * nq * d * e)
    _add(io, "l", write=g * nq * STATS)
    _add(io, "m", write=g * nq * STATS)
    _add(io, "K", read=g * kv_rows * d * e)
    _add(io, "V", read=g * kv_rows * d * e)
    _add(io, "Q", read=g * q_rows * d * e)
    _add(io, "O", read=g * q_rows * d * e, write=g * q_rows * d * e)
    _add(io, "l", read=g * q_rows * STATS, write=g * q_rows * STATS)
    _add(io, "m", read=g * q_rows * STATS, write=g * q_rows * STATS)
    if wl.key_padding_mask:
        _add(io, "kv_lens", read=g * INDEX)
    return io


def gemm_io(g: int, m: int, n: int, k: int, e: int, tile: tuple) -> tuple[int, int, int]:
    """(A bytes read, B bytes read, C bytes written) of a tiled GEMM C[m,n] = A[m,k] B[k,n]:
    each output tile reads its whole row panel of A and column panel of B. A tile never exceeds
    its matrix: tm = min(tile_m, m), tn = min(tile_n, n)."""
    tm, tn = min(tile[0], m), min(tile[1], n)
    return g * m * k * e * math.ceil(n / tn), g * k * n * e * math.ceil(m / tm), g * m * n * e


def elementwise_panels(wl: Workload, gemm_tile: tuple) -> int:
    """Row panels per batch-head of standard attention's elementwise kernels: they follow
    gemm_qk's output tiles, min(tile_m, Nq) rows each."""
    return math.ceil(wl.seq_len_q / min(gemm_tile[0], wl.seq_len_q))


def standard_forward_io(wl: Workload, gemm_tile: tuple = (128, 128, 128)) -> dict:
    g, nq, nk, d, e = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.itemsize
    nn = g * nq * nk                        # elements of S (and of P)
    panels = elementwise_panels(wl, gemm_tile)          # row panels of the elementwise kernels
    io: dict = {}
    q_r, k_r, s_w = gemm_io(g, nq, nk, d, e, gemm_tile)
    _add(io, "Q", read=q_r)
    _add(io, "K", read=k_r)
    _add(io, "S", write=s_w)
    _add(io, "S", read=nn * e, write=nn * e)            # scale
    if wl.masked:
        _add(io, "S", read=nn * e, write=nn * e)        # mask
        if wl.causal:
            _add(io, "causal_mask", read=nn * MASK)
        if wl.key_padding_mask:
            _add(io, "key_padding_mask", read=g * panels * nk * MASK)
    _add(io, "S", read=nn * e)                          # softmax
    _add(io, "P", write=nn * e)
    p_used = "P"
    if wl.dropout > 0:
        p_used = "P_drop"
        _add(io, "P", read=nn * e)
        _add(io, "P_drop", write=nn * e)
        _add(io, "dropout_mask", write=nn * MASK)
    p_r, v_r, o_w = gemm_io(g, nq, d, nk, e, gemm_tile)
    _add(io, p_used, read=p_r)
    _add(io, "V", read=v_r)
    _add(io, "O", write=o_w)
    return io


def total_io(io: dict) -> tuple[int, int]:
    return sum(r for r, _ in io.values()), sum(w for _, w in io.values())


# ---- training step: the forward (saving what the backward needs) plus the backward ----------

def flash2_backward_io(wl: Workload, block_q: int, block_kv: int) -> dict:
    """FA2 backward: D and the dQ accumulator (fp32) per query row; per visited (K/V block,
    query block) pair Q, dO, lse, D read and the dQ accumulator tile read+written (atomics);
    K, V read once per visited K/V block; dK, dV written once (zeros for unseen blocks)."""
    g, nq, nk, d, e = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.itemsize
    kv_rows, q_rows = flash1_q_rows_visited(wl, block_q, block_kv)
    visited_blocks = sum(1 for c0 in range(0, nk, block_kv)
                         if causal_first_q_block(wl, c0, block_q) < math.ceil(nq / block_q))
    io: dict = {}
    _add(io, "dO", read=g * nq * d * e)                       # bwd_dot_do_o
    _add(io, "O", read=g * nq * d * e)
    _add(io, "D", write=g * nq * STATS)
    _add(io, "dQ_accum", write=g * nq * d * STATS)
    _add(io, "K", read=g * kv_rows * d * e)                   # bwd
    _add(io, "V", read=g * kv_rows * d * e)
    if wl.key_padding_mask:
        _add(io, "kv_lens", read=g * visited_blocks * INDEX)
    _add(io, "Q", read=g * q_rows * d * e)
    _add(io, "dO", read=g * q_rows * d * e)
    _add(io, "lse", read=g * q_rows * STATS)
    _add(io, "D", read=g * q_rows * STATS)
    _add(io, "dQ_accum", read=g * q_rows * d * STATS, write=g * q_rows * d * STATS)
    _add(io, "dK", write=g * nk * d * e)
    _add(io, "dV", write=g * nk * d * e)
    _add(io, "dQ_accum", read=g * nq * d * STATS)             # bwd_convert_dq
    _add(io, "dQ", write=g * nq * d * e)
    return reduce_kv_io(wl, io)        # kv_heads < heads: expanded dK, dV and their group sums


def flash1_backward_io(wl: Workload, block_q: int, block_kv: int) -> dict:
    """FA1 backward (Algorithm 4): dQ, dK, dV zeroed in HBM; per visited pair Q, O, dO, dQ, l, m
    read and dQ written; K, V read and dK, dV written once per visited K/V block."""
    g, nq, nk, d, e = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.itemsize
    kv_rows, q_rows = flash1_q_rows_visited(wl, block_q, block_kv)
    io: dict = {}
    _add(io, "dQ", write=g * nq * d * e)                      # bwd_init
    _add(io, "dK", write=g * nk * d * e)
    _add(io, "dV", write=g * nk * d * e)
    if wl.key_padding_mask:
        _add(io, "kv_lens", read=g * INDEX)
    for name in ("K", "V"):
        _add(io, name, read=g * kv_rows * d * e)
    for name in ("dK", "dV"):
        _add(io, name, write=g * kv_rows * d * e)
    for name in ("Q", "O", "dO", "dQ"):
        _add(io, name, read=g * q_rows * d * e)
    _add(io, "dQ", write=g * q_rows * d * e)
    _add(io, "l", read=g * q_rows * STATS)
    _add(io, "m", read=g * q_rows * STATS)
    return reduce_kv_io(wl, io)        # kv_heads < heads: expanded dK, dV and their group sums


def standard_backward_io(wl: Workload, gemm_tile: tuple = (128, 128, 128)) -> dict:
    g, nq, nk, d, e = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.itemsize
    nn = g * nq * nk
    panels = elementwise_panels(wl, gemm_tile)
    dropout = wl.dropout > 0
    p_used, d_pd = ("P_drop", "dP_drop") if dropout else ("P", "dP")
    io: dict = {}
    a, b, c = gemm_io(g, nk, d, nq, e, gemm_tile)             # gemm_dv: dV = Pd^T dO
    _add(io, p_used, read=a)
    _add(io, "dO", read=b)
    _add(io, "dV", write=c)
    a, b, c = gemm_io(g, nq, nk, d, e, gemm_tile)             # gemm_dp: dPd = dO V^T
    _add(io, "dO", read=a)
    _add(io, "V", read=b)
    _add(io, d_pd, write=c)
    if dropout:                                               # dropout_bwd
        _add(io, "dP_drop", read=nn * e)
        _add(io, "dropout_mask", read=nn * MASK)
        _add(io, "dP", write=nn * e)
    _add(io, "dP", read=nn * e)                               # softmax_bwd
    _add(io, "P", read=nn * e)
    _add(io, "dS", write=nn * e)
    if wl.masked:                                             # mask_bwd
        _add(io, "dS", read=nn * e, write=nn * e)
        if wl.causal:
            _add(io, "causal_mask", read=nn * MASK)
        if wl.key_padding_mask:
            _add(io, "key_padding_mask", read=g * panels * nk * MASK)
    _add(io, "dS", read=nn * e, write=nn * e)                 # scale_bwd
    a, b, c = gemm_io(g, nq, d, nk, e, gemm_tile)             # gemm_dq: dQ = dS K
    _add(io, "dS", read=a)
    _add(io, "K", read=b)
    _add(io, "dQ", write=c)
    a, b, c = gemm_io(g, nk, d, nq, e, gemm_tile)             # gemm_dk: dK = dS^T Q
    _add(io, "dS", read=a)
    _add(io, "Q", read=b)
    _add(io, "dK", write=c)
    return io
