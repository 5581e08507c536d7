"""What attention is run on: the workload (shapes, dtype, masks) and, for numerics, its data.

Shapes are (batch, heads, seq, head_dim). Masks:
- causal: bottom-right aligned, as FlashAttention 2.1+ does: query i sees key j iff
  j <= i + (seq_len_kv - seq_len_q). With seq_len_q == seq_len_kv that is j <= i.
- key padding: batch entry b has kv_lens[b] valid keys; keys j >= kv_lens[b] are masked.
A row whose keys are all masked gives zeros in O (and log-sum-exp -inf), never NaN.
Dropout multiplies P by keep / (1 - p), with a keep mask drawn from a seed so every program
(and the reference) sees the same one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hbmsim.simulator import DTYPE_BYTES, HbmsimError

STORAGE_DTYPES = ("fp16", "bf16", "fp32")


@dataclass(frozen=True)
class Workload:
    batch: int
    heads: int
    seq_len_q: int
    seq_len_kv: int
    head_dim: int
    dtype: str = "fp16"
    causal: bool = False
    key_padding_mask: bool = False
    dropout: float = 0.0
    scale: float | None = None          # None: 1/sqrt(head_dim)
    kv_heads: int | None = None         # None: heads (multi-head); 1: multi-query; else grouped-query
    kv_page_size: int | None = None     # paged KV cache: tokens per page; None: contiguous K/V

    def __post_init__(self):
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("batch", "heads", "seq_len_q", "seq_len_kv", "head_dim", "kv_heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise HbmsimError(f"workload: field '{name}' = {v!r} must be a whole number >= 1")
        if self.heads % self.kv_heads:
            raise HbmsimError(f"workload: field 'kv_heads' = {self.kv_heads!r} must divide heads = {self.heads}")
        p = self.kv_page_size
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            raise HbmsimError(f"workload: field 'kv_page_size' = {p!r} must be a whole number >= 1 (tokens per page) "
                              "or \"contiguous\" (not paged)")
        if self.dtype not in STORAGE_DTYPES:
            raise HbmsimError(f"workload: field 'dtype' = {self.dtype!r} must be one of {', '.join(STORAGE_DTYPES)}")
        for name in ("causal", "key_padding_mask"):
            if not isinstance(getattr(self, name), bool):
                raise HbmsimError(f"workload: field '{name}' = {getattr(self, name)!r} must be true or false")
        d = self.dropout
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not (0.0 <= d < 1.0):
            raise HbmsimError(f"workload: field 'dropout' = {d!r} must be a number in [0, 1)")
        s = self.scale
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0):
            raise HbmsimError(f"workload: field 'scale' = {s!r} must be a finite number > 0")

    @property
    def groups(self) -> int:
        return self.batch * self.heads

    @property
    def kv_groups(self) -> int:
        """Batch x K/V heads: how many distinct K (and V) matrices there are."""
        return self.batch * self.kv_heads

    @property
    def group_size(self) -> int:
        """Query heads per K/V head (FA2's h_h_k_ratio): 1 for multi-head attention."""
        return self.heads // self.kv_heads

    def kv_group(self, g: int) -> int:
        """The K/V batch-head that query batch-head g = b * heads + h reads, as FA2 indexes it:
        b * kv_heads + h // (heads // kv_heads)."""
        return (g // self.heads) * self.kv_heads + (g % self.heads) // self.group_size

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else float(self.scale)

    @property
    def masked(self) -> bool:
        return self.causal or self.key_padding_mask

    def describe(self) -> dict:
        """The fields as a dict (kv_page_size only when the KV cache is paged)."""
        d = {"batch": self.batch, "heads": self.heads, "kv_heads": self.kv_heads, "seq_len_q": self.seq_len_q,
             "seq_len_kv": self.seq_len_kv, "head_dim": self.head_dim, "dtype": self.dtype,
             "causal": self.causal, "key_padding_mask": self.key_padding_mask, "dropout": self.dropout}
        if self.kv_page_size is not None:
            d["kv_page_size"] = self.kv_page_size
        return d


@dataclass
class AttentionData:
    """float64 inputs for numerics: q (B,H,Nq,d), k and v (B,Hkv,Nkv,d) (Hkv = kv_heads: query
    head h reads K/V head h // (H // Hkv)), kv_lens (B,) or None,
    keep (B,H,Nq,Nkv) bool or None (dropout keep mask), d_o (B,H,Nq,d): the output gradient
    the backward pass starts from (None for forward only)."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    kv_lens: np.ndarray | None = None
    keep: np.ndarray | None = None
    d_o: np.ndarray | None = None

    def check(self, wl: Workload) -> None:
        b, h, nq, nk, d = wl.batch, wl.heads, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
        hk = wl.kv_heads
        arrays = [("q", self.q, (b, h, nq, d)), ("k", self.k, (b, hk, nk, d)), ("v", self.v, (b, hk, nk, d))]
        if self.d_o is not None:
            arrays.append(("dO", self.d_o, (b, h, nq, d)))
        for name, arr, want in arrays:
            if arr.shape != want:
                raise HbmsimError(f"input {name}: shape {arr.shape} disagrees with the workload's {want}")
            if not np.all(np.isfinite(arr)):
                raise HbmsimError(f"input {name}: contains NaN or inf")
        if wl.key_padding_mask:
            if self.kv_lens is None or self.kv_lens.shape != (b,):
                raise HbmsimError(f"input kv_lens: key_padding_mask needs shape ({b},), got "
                                  f"{None if self.kv_lens is None else self.kv_lens.shape}")
            if np.any(self.kv_lens < 0) or np.any(self.kv_lens > nk):
                raise HbmsimError(f"input kv_lens: values {self.kv_lens.tolist()} must lie in 0..{nk}")
        if wl.dropout > 0 and (self.keep is None or self.keep.shape != (b, h, nq, nk)):
            raise HbmsimError(f"input keep: dropout {wl.dropout} needs a keep mask of shape {(b, h, nq, nk)}")


def random_data(wl: Workload, seed: int = 0) -> AttentionData:
    """Standard-normal q, k, v and dO; ragged kv_lens (at least one key each) when padding is on."""
    rng = np.random.default_rng(seed)
    b, h, nq, nk, d = wl.batch, wl.heads, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    q = rng.standard_normal((b, h, nq, d))
    k = rng.standard_normal((b, wl.kv_heads, nk, d))
    v = rng.standard_normal((b, wl.kv_heads, nk, d))
    kv_lens = rng.integers(1, nk + 1, size=b) if wl.key_padding_mask else None
    keep = dropout_keep(wl, seed) if wl.dropout > 0 else None
    d_o = rng.standard_normal((b, h, nq, d))
    return AttentionData(q, k, v, kv_lens, keep, d_o)


def expand_kv(wl: Workload, x: np.ndarray) -> np.ndarray:
    """(B, kv_heads, ...) -> (B, heads, ...): each K/V head repeated for the query heads of its
    group (Hugging Face's repeat_kv); the identity for multi-head attention."""
    return x if wl.group_size == 1 else np.repeat(x, wl.group_size, axis=1)


def reduce_kv(wl: Workload, x: np.ndarray) -> np.ndarray:
    """(B, heads, ...) -> (B, kv_heads, ...): the sum over the query heads of each group (the
    gradient of expand_kv, as FA2's dk_expanded.sum(2))."""
    if wl.group_size == 1:
        return x
    return x.reshape(wl.batch, wl.kv_heads, wl.group_size, *x.shape[2:]).sum(axis=2)


def dropout_keep(wl: Workload, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0xD809])
    return rng.random((wl.batch, wl.heads, wl.seq_len_q, wl.seq_len_kv)) >= wl.dropout


def allowed(wl: Workload, kv_len: int | None, r0: int, r1: int, c0: int, c1: int) -> np.ndarray | None:
    """Boolean (r1-r0, c1-c0) tile: True where query i may attend key j. None: no mask."""
    if not wl.masked:
        return None
    ok = np.ones((r1 - r0, c1 - c0), dtype=bool)
    cols = np.arange(c0, c1)
    if wl.causal:
        rows = np.arange(r0, r1)
        ok &= cols[None, :] <= rows[:, None] + (wl.seq_len_kv - wl.seq_len_q)
    if wl.key_padding_mask:
        ok &= cols[None, :] < kv_len
    return ok


def causal_kv_end(wl: Workload, q_end: int) -> int:
    """Keys [0, end) that query rows [.., q_end) can see under the causal mask."""
    return max(0, min(wl.seq_len_kv, q_end + wl.seq_len_kv - wl.seq_len_q))


def causal_q_start(wl: Workload, kv_start: int) -> int:
    """First query row that can see key kv_start under the causal mask."""
    return max(0, kv_start - (wl.seq_len_kv - wl.seq_len_q))


def causal_first_q_block(wl: Workload, kv_start: int, block_q: int) -> int:
    """Index of the first query block that can see key kv_start (0 without the causal mask);
    a K/V block is skipped when this is past the last query block."""
    return causal_q_start(wl, kv_start) // block_q if wl.causal else 0
