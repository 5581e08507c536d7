"""What the backward programs share: the training program's tensors and gradient numerics.

A training step is one program: the forward's launches (pass "forward", keeping what the
backward needs in HBM) followed by the backward's (pass "backward"). dO arrives in HBM when the
backward starts.
"""
from __future__ import annotations

import numpy as np

from hbmsim.simulator import Program, Tensor

from .workload import AttentionData, Workload, causal_first_q_block

# Per score element of a backward tile: recompute P (scale, sub, exp: 3), dS = P (dP - D) (2),
# plus mask 1 and dropout 3 (regenerate, multiply P, multiply dP).
BWD_VECTOR_PER_SCORE = 5
BWD_DS_PER_SCORE = 2      # of those, dS = P o (dP - D): a subtract and a multiply


def bwd_vector_flops(wl: Workload, rows: int, cols: int) -> int:
    per = BWD_VECTOR_PER_SCORE + (1 if wl.masked else 0) + (3 if wl.dropout > 0 else 0)
    return rows * cols * per + 4 * rows


def bwd_ds_flops(rows: int, cols: int) -> int:
    """The part of bwd_vector_flops that computes dS = P o (dP - D) (the rest recomputes P)."""
    return rows * cols * BWD_DS_PER_SCORE


def kv_block(wl: Workload, index: int, kv_blocks: int, block_kv: int, block_q: int) -> tuple:
    """A key-parallel backward block's place: (batch-head, its key columns, how many, the first
    query block that sees them: causal_first_q_block, 0 without a mask). Blocks run key block
    by key block within a batch-head, as FA2's and FA3's grids (key blocks fastest)."""
    g, j = divmod(index, kv_blocks)
    c0, c1 = j * block_kv, min(wl.seq_len_kv, (j + 1) * block_kv)
    return g, slice(c0, c1), c1 - c0, causal_first_q_block(wl, c0, block_q)


def unseen_kv_block(ctx, dK, dV, g: int, cols: slice, d: int, numeric: bool):
    """A K/V block no query sees (causal): its gradients are zero, stored as such (a generator,
    as the block's other calls)."""
    z = np.zeros((cols.stop - cols.start, d)) if numeric else None
    yield from ctx.store_tiles((dK[g], cols, slice(0, d), z), (dV[g], cols, slice(0, d), z))


def named(program: Program) -> dict:
    """Every tensor of a program by name: its inputs and its outputs."""
    out = {t.name: t for t in program.inputs}
    out.update(program.outputs)
    return out


def grad_tensor(name: str, like: Tensor, data: AttentionData | None, dtype: str | None = None) -> Tensor:
    return Tensor(name, like.shape, dtype or like.dtype, count_only=data is None)


def d_o_tensor(wl: Workload, data: AttentionData | None) -> Tensor:
    shape = (wl.groups, wl.seq_len_q, wl.head_dim)
    return Tensor("dO", shape, wl.dtype, None if data is None else data.d_o.reshape(shape), count_only=data is None)


def recompute_p(wl: Workload, scale: float, q, k, ok, lse) -> np.ndarray:
    """P tile from the stored log-sum-exp: exp(scale q k^T - lse), 0 where masked or the whole
    row is masked (lse = -inf)."""
    s = scale * (q @ k.T)
    if ok is not None:
        s = np.where(ok, s, -np.inf)
    lse_safe = np.where(np.isfinite(lse), lse, 0.0)      # a fully masked row: P = 0, not NaN
    return np.exp(s - lse_safe[:, None])


def tile_grads(wl: Workload, scale: float, q, k, v, d_o, p, big_d, keep, steps: dict | None = None):
    """One (query block, K/V block) tile of the backward: returns dQ, dK, dV contributions (and
    puts dP and dS in `steps`, when given, for annotations)."""
    p_drop = p if keep is None else p * keep
    d_v = p_drop.T @ d_o                       # dV_j += P_ij^T dO_i
    d_p = d_o @ v.T                            # dP_ij = dO_i V_j^T
    if keep is not None:
        d_p = d_p * keep
    d_s = p * (d_p - big_d[:, None])           # dS_ij = P_ij o (dP_ij - D_i)
    if steps is not None:
        steps.update(dP=d_p, dS=d_s)
    return scale * (d_s @ k), scale * (d_s.T @ q), d_v
