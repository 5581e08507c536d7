"""Closed-form L2-side traffic of the FlashAttention v1 *kernel* programs (flash1_kernel.py),
derived on paper from spec8 section 1 (v1.0.9), not from the simulator: {tensor: (read, write)}.

Notation (per batch-head; every term is then multiplied by G = batch*heads): e = storage bytes
per element, 4 = fp32 (o_tmp, lse, D, dq_tmp), d = head dim, Bc = key block, steps of 16 query
rows, T = ceil(Nq/16) steps, key blocks j = 0..n_kb-1 covering keys [j*Bc, min(Nk, (j+1)*Bc)).

b_j = first step key block j visits: 0 for j = 0, else the first 16-row step that can see key
j*Bc under the (bottom-right) causal mask, 0 without it. R_j = Nq - 16*b_j rows are visited
at block j (0 if b_j >= T). A step is final at block j iff it is before b_{j+1} (b_{n_kb} = T):
F_j = min(Nq, 16*b_{j+1}) - 16*b_j rows are final there. Each step is final exactly once, so
sum_j F_j = Nq.

Forward (grid (G, S)): per visited (j, step) Q read, lse written; for j > 0 o_tmp (fp32) and lse
read; final rows write O, the others o_tmp. K_j, V_j are read once by every split that has a
step in [b_j, T): those are min(S, T - b_j) splits (consecutive steps cover every residue mod S).
kv_lens: once per split with any step, min(S, T).
Non-causal, Nq = Nk = N: Q n_kb*N*d*e, K/V S*N*d*e each (N >= 16*S), o_tmp (n_kb-1)*N*d*4 each
way, O N*d*e, lse written n_kb*N*4 and read (n_kb-1)*N*4 (spec 1.3).
"""
from __future__ import annotations

import math

from hbmsim.simulator import DTYPE_BYTES

from .common import INDEX_DTYPE, STATS_DTYPE
from .gqa import reduce_kv_io
from .workload import Workload, causal_first_q_block

STATS = DTYPE_BYTES[STATS_DTYPE]
INDEX = DTYPE_BYTES[INDEX_DTYPE]
STEP = 16            # query rows per step (Cta_tile_p::M)


def _add(io: dict, name: str, read: int = 0, write: int = 0) -> None:
    r, w = io.get(name, (0, 0))
    io[name] = (r + read, w + write)


def _blocks(wl: Workload, block_kv: int) -> list:
    """[(kv rows of block j, b_j, R_j, F_j)] for one batch-head."""
    nq, nk = wl.seq_len_q, wl.seq_len_kv
    t = math.ceil(nq / STEP)
    starts = list(range(0, nk, block_kv))
    b = [0 if c0 == 0 else causal_first_q_block(wl, c0, STEP) for c0 in starts] + [t]
    b = [min(x, t) for x in b]
    out = []
    for j, c0 in enumerate(starts):
        visited = nq - STEP * b[j] if b[j] < t else 0
        final = min(nq, STEP * b[j + 1]) - STEP * b[j] if b[j] < t else 0
        out.append((min(nk, c0 + block_kv) - c0, b[j], visited, final))
    return out


def fa1_kernel_forward_io(wl: Workload, block_kv: int, num_splits: int) -> dict:
    g, nq, d, e = wl.groups, wl.seq_len_q, wl.head_dim, wl.itemsize
    t = math.ceil(nq / STEP)
    blocks = _blocks(wl, block_kv)
    io: dict = {}
    if wl.key_padding_mask:
        _add(io, "kv_lens", read=g * min(num_splits, t) * INDEX)
    for j, (nc, b, visited, final) in enumerate(blocks):
        splits = min(num_splits, t - b) if b < t else 0
        _add(io, "K", read=g * splits * nc * d * e)
        _add(io, "V", read=g * splits * nc * d * e)
        _add(io, "Q", read=g * visited * d * e)                 # Q re-read for every key block
        _add(io, "lse", write=g * visited * STATS)              # lse written at every j
        if j > 0:
            _add(io, "lse", read=g * visited * STATS)
            _add(io, "o_tmp", read=g * visited * d * STATS)
        _add(io, "O", write=g * final * d * e)
        if visited > final:
            _add(io, "o_tmp", write=g * (visited - final) * d * STATS)
    return io


def fa1_kernel_backward_io(wl: Workload, block_kv: int, bwd_parallel: bool) -> dict:
    """Non-parallel (one block per batch-head): per visited (j, step) Q, dO read (storage) and
    lse, D read (fp32); at j = 0 also O read and D written; for j > 0 dq_tmp read; final rows
    write dQ, the others dq_tmp. K_j, V_j read once per visited key block, dK, dV written once
    for every key block (zeros when unvisited). kv_lens once per block.
    Seq-parallel: dq_tmp zero-filled (Nq*d*4); dot_do_o reads dO, O and writes D once; per
    visited (j, step) Q, dO, lse, D read and an fp32 atomicAdd into dq_tmp (read + write);
    K_j, V_j and kv_lens once per visited key block; then dq_tmp read and dQ written once."""
    g, nq, nk, d, e = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.itemsize
    t = math.ceil(nq / STEP)
    blocks = _blocks(wl, block_kv)
    io: dict = {}
    visited_blocks = sum(1 for _, b, _, _ in blocks if b < t)
    kv_rows = sum(nc for nc, b, _, _ in blocks if b < t)
    _add(io, "K", read=g * kv_rows * d * e)
    _add(io, "V", read=g * kv_rows * d * e)
    _add(io, "dK", write=g * nk * d * e)
    _add(io, "dV", write=g * nk * d * e)
    rows = sum(v for _, _, v, _ in blocks)
    for name in ("Q", "dO"):
        _add(io, name, read=g * rows * d * e)
    for name in ("lse", "D"):
        _add(io, name, read=g * rows * STATS)
    if bwd_parallel:
        if wl.key_padding_mask:
            _add(io, "kv_lens", read=g * visited_blocks * INDEX)
        _add(io, "dq_tmp", write=g * nq * d * STATS)                     # zero-fill
        _add(io, "dO", read=g * nq * d * e)                              # dot_do_o
        _add(io, "O", read=g * nq * d * e)
        _add(io, "D", write=g * nq * STATS)
        _add(io, "dq_tmp", read=g * rows * d * STATS, write=g * rows * d * STATS)   # atomics
        _add(io, "dq_tmp", read=g * nq * d * STATS)                      # convert
        _add(io, "dQ", write=g * nq * d * e)
        return reduce_kv_io(wl, io)
    if wl.key_padding_mask:
        _add(io, "kv_lens", read=g * INDEX)
    _, _, r0, _ = blocks[0]
    _add(io, "O", read=g * r0 * d * e)                                   # j == 0 only
    _add(io, "D", write=g * r0 * STATS)
    for j, (_, _, visited, final) in enumerate(blocks):
        if j > 0:
            _add(io, "dq_tmp", read=g * visited * d * STATS)
        _add(io, "dQ", write=g * final * d * e)
        if visited > final:
            _add(io, "dq_tmp", write=g * (visited - final) * d * STATS)
    return reduce_kv_io(wl, io)
