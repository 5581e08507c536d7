"""Pieces every attention program shares: its input tensors and its flop accounting.

Vector flops are counted per element as the kernels do the work: scale 1, mask 1, running max 1,
subtract + exp 2, sum 1 (softmax: also the divide, 1), dropout 2 (compare + multiply). They only
set compute time; traffic never depends on them.
"""
from __future__ import annotations

import numpy as np

from hbmsim.simulator import Tensor

from .workload import AttentionData, Workload

STATS_DTYPE = "fp32"       # m, l and log-sum-exp are kept in fp32, as FlashAttention does
MASK_DTYPE = "bool"        # standard attention's masks and dropout mask: 1 byte per element
INDEX_DTYPE = "int32"      # kv_lens


def online_softmax_vector_flops(wl: Workload, rows: int, cols: int) -> int:
    """One score tile of an online softmax: per score scale, max, sub+exp, sum (+mask, +dropout);
    per row the m/l updates; the accumulator rescale."""
    per_score = 5 + (1 if wl.masked else 0) + (2 if wl.dropout > 0 else 0)
    return rows * cols * per_score + 6 * rows + rows * wl.head_dim


def input_tensors(wl: Workload, data: AttentionData | None) -> dict:
    """Q, K, V as (batch*heads, seq, head_dim) in the storage dtype; kv_lens when padding is on."""
    g, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    count_only = data is None
    if data is not None:
        data.check(wl)
    t = {
        "Q": Tensor("Q", (g, nq, d), wl.dtype, None if count_only else data.q.reshape(g, nq, d), count_only),
        "K": Tensor("K", (g, nk, d), wl.dtype, None if count_only else data.k.reshape(g, nk, d), count_only),
        "V": Tensor("V", (g, nk, d), wl.dtype, None if count_only else data.v.reshape(g, nk, d), count_only),
    }
    if wl.key_padding_mask:
        lens = None if count_only else data.kv_lens.reshape(wl.batch, 1, 1).astype(np.float64)
        t["kv_lens"] = Tensor("kv_lens", (wl.batch, 1, 1), INDEX_DTYPE, lens, count_only)
    return t


def keep_groups(wl: Workload, data: AttentionData | None) -> np.ndarray | None:
    """Dropout keep mask as (groups, Nq, Nkv), scaled by 1/(1-p); None without dropout or data."""
    if data is None or wl.dropout <= 0:
        return None
    return data.keep.reshape(wl.groups, wl.seq_len_q, wl.seq_len_kv) / (1.0 - wl.dropout)


def output(wl: Workload, name: str, rows: int, cols: int, dtype: str, data) -> Tensor:
    return Tensor(name, (wl.groups, rows, cols), dtype, count_only=data is None)
