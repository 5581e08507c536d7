"""Exact float64 attention forward in numpy: the answer every program must reproduce.

O = dropout(softmax(scale * Q K^T + mask)) V, also returning the row log-sum-exp
lse_i = log sum_j exp(s_ij) over allowed keys (-inf for a fully masked row, whose O row is 0).
"""
from __future__ import annotations

import numpy as np

from hbmsim.simulator import HbmsimError

from .workload import AttentionData, Workload, allowed, expand_kv, reduce_kv


def softmax_probabilities(wl: Workload, data: AttentionData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """P = softmax(scale * QK^T + mask) with 0 on masked entries and fully masked rows; also the
    row max m (-inf for a fully masked row) and the row sum l of exp(s - m)."""
    s = wl.softmax_scale * np.einsum("bhid,bhjd->bhij", data.q, expand_kv(wl, data.k))
    if wl.masked:
        for b in range(wl.batch):
            ok = allowed(wl, None if data.kv_lens is None else int(data.kv_lens[b]), 0, wl.seq_len_q, 0, wl.seq_len_kv)
            s[b][:, ~ok] = -np.inf
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = e.sum(axis=-1, keepdims=True)
    return np.divide(e, l, out=np.zeros_like(e), where=l > 0), m, l


def attention_forward(wl: Workload, data: AttentionData) -> tuple[np.ndarray, np.ndarray]:
    """Returns O (B,H,Nq,d) and lse (B,H,Nq)."""
    data.check(wl)
    p, m, l = softmax_probabilities(wl, data)
    if wl.dropout > 0:
        p = p * data.keep / (1.0 - wl.dropout)
    o = np.einsum("bhij,bhjd->bhid", p, expand_kv(wl, data.v))
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)) + m_safe[..., 0], -np.inf)
    return o, lse


def attention_backward(wl: Workload, data: AttentionData, d_o: np.ndarray) -> dict:
    """Exact float64 gradients of O = dropout(softmax(scale * QK^T + mask)) V given dO.

    P = softmax(S) (0 on masked entries and fully masked rows), Pd = P * keep / (1 - p):
      dV = Pd^T dO;  dPd = dO V^T;  dP = dPd * keep / (1 - p)
      D_i = sum_j P_ij dP_ij  (= rowsum(dO * O))
      dS = P * (dP - D);  dQ = scale dS K;  dK = scale dS^T Q
    With kv_heads < heads K and V are shared by a group of query heads, so dK and dV of a K/V
    head are the sums of the per-query-head ones over its group.
    Returns dQ, dK, dV (shapes of q, k, v) and the intermediates P, dP, dS, D for teaching.
    """
    data.check(wl)
    if d_o.shape != data.q.shape:
        raise HbmsimError(f"input dO: shape {d_o.shape} disagrees with the workload's {data.q.shape}")
    if not np.all(np.isfinite(d_o)):
        raise HbmsimError("input dO: contains NaN or inf")
    scale = wl.softmax_scale
    p, _, _ = softmax_probabilities(wl, data)
    keep = data.keep / (1.0 - wl.dropout) if wl.dropout > 0 else None
    p_drop = p if keep is None else p * keep
    k, v = expand_kv(wl, data.k), expand_kv(wl, data.v)
    d_v = reduce_kv(wl, np.einsum("bhij,bhid->bhjd", p_drop, d_o))
    d_p = np.einsum("bhid,bhjd->bhij", d_o, v)
    if keep is not None:
        d_p = d_p * keep
    big_d = (p * d_p).sum(axis=-1)
    d_s = p * (d_p - big_d[..., None])
    d_q = scale * np.einsum("bhij,bhjd->bhid", d_s, k)
    d_k = reduce_kv(wl, scale * np.einsum("bhij,bhid->bhjd", d_s, data.q))
    return {"dQ": d_q, "dK": d_k, "dV": d_v, "P": p, "dP": d_p, "dS": d_s, "D": big_d}
