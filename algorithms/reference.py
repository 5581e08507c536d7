"""Exact float64 attention forward in numpy: the answer every program must reproduce.

O = dropout(softmax(scale * Q K^T + mask)) V, also returning the row log-sum-exp
lse_i = log sum_j exp(s_ij) over allowed keys (-inf for a fully masked row, whose O row is 0).
"""
from __future__ import annotations

import numpy as np

from .workload import AttentionData, Workload, allowed


def attention_forward(wl: Workload, data: AttentionData) -> tuple[np.ndarray, np.ndarray]:
    """Returns O (B,H,Nq,d) and lse (B,H,Nq)."""
    data.check(wl)
    s = wl.softmax_scale * np.einsum("bhid,bhjd->bhij", data.q, data.k)
    if wl.masked:
        for b in range(wl.batch):
            ok = allowed(wl, None if data.kv_lens is None else int(data.kv_lens[b]), 0, wl.seq_len_q, 0, wl.seq_len_kv)
            s[b][:, ~ok] = -np.inf
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m_safe)
    l = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, l, out=np.zeros_like(e), where=l > 0)
    if wl.dropout > 0:
        p = p * data.keep / (1.0 - wl.dropout)
    o = np.einsum("bhij,bhjd->bhid", p, data.v)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)) + m_safe[..., 0], -np.inf)
    return o, lse
