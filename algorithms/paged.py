"""FlashAttention-2's paged KV cache (issue 25 item 4; vLLM's block tables, FA2's `block_table`
argument of flash_attn_with_kvcache and flash_attn_varlen_func), as flash2's forward and split-KV
kernels read it. Read from csrc/flash_attn/flash_api.cpp and flash_fwd_kernel.h, not copied.

Layout, as FA2 takes it: the cache K (and V) is a pool of pages, (num_pages, page_size, kv_heads,
head_dim) in memory; here a Tensor of (num_pages, page_size, kv_heads * head_dim), so K/V head h
of a page is columns h*d:(h+1)*d. Sequence b's logical page j (tokens j*P .. (j+1)*P - 1) lives
in physical page block_table[b, j]; the table is int32, (batch, ceil(N_kv / P)), stored here as
(batch, 1, pages per sequence). The pool holds exactly batch x pages-per-sequence pages, placed
non-contiguously: a fixed permutation (PAGE_SEED) of 0..num_pages-1, the same for every run, so
that a sequence's consecutive pages are never assumed adjacent. The last page of a ragged
N_kv is partly filled; its unused rows are never read.

What the kernel reads of it:
- K/V tiles: a tile of keys [c0, c1) is read page by page, one access per page it touches
  (rows of one page are contiguous, the next page is elsewhere): the same bytes as a contiguous
  tile, split at page boundaries. With FA2's own blocks (kBlockN <= 256 dividing the page, a
  multiple of 256) a tile never straddles a page; blocks given by hand and fast mode's
  several-tile steps may.
- The block table: FA2 reads block_table[b, n_block * kBlockN / page_size] as its K/V loop
  walks (flash_fwd_kernel.h, the tKgK / tVgV pointer updates), one int32 per tile, through L1.
  Modelled as one read per thread block, at its start with Q, of the entries its K/V range
  touches: pages floor(c_lo / P) .. ceil(c_end / P) - 1 of its sequence's row, 4 bytes each
  (the L2-side bytes of those entries; the walk's re-reads of an entry that several tiles of one
  page share are L1 hits and not counted). A block whose range is empty reads none.

Page sizes: FA2 (flash_api.cpp, v2.5 to v2.8.3 and main: mha_fwd_kvcache and mha_varlen_fwd)
checks `page_block_size % 256 == 0` ("Paged KV cache block size must be divisible by 256"); a
page size of 16 is vLLM's fork (vllm-flash-attn), not upstream FA2. flash2 follows upstream.
Training with a paged cache is refused: FA2 pages the KV cache of inference only.

flash3 reads the same layout (FA3's page_table, hopper/paged_kv.h), with pages of any size and
FA3's own choice of TMA or cp.async (flash3_spec.fa3_paged_tma); its table entries are counted as
here, once per thread block.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import HbmsimError, Tensor

from .common import INDEX_DTYPE
from .workload import AttentionData, Workload

PAGE_MULTIPLE = 256        # flash_api.cpp: TORCH_CHECK(page_block_size % 256 == 0, ...)
PAGE_SEED = 0x9A6E         # the fixed placement of the pages in the pool
TABLE = "block_table"


def check_page_size(wl: Workload, program: str = "flash2") -> None:
    """FA2's limit on the page size, in one line (the workload already refused 0 or negative)."""
    p = wl.kv_page_size
    if p is not None and p % PAGE_MULTIPLE:
        raise HbmsimError(f"{program}: field 'kv_page_size' = {p} must be a multiple of {PAGE_MULTIPLE} (FA2's "
                          f"paged KV cache: \"Paged KV cache block size must be divisible by 256\")")


def pages_per_seq(wl: Workload) -> int:
    return math.ceil(wl.seq_len_kv / wl.kv_page_size)


def block_table(wl: Workload) -> np.ndarray:
    """(batch, pages per sequence) physical page of each logical page: a fixed permutation."""
    n = wl.batch * pages_per_seq(wl)
    perm = np.random.default_rng(PAGE_SEED).permutation(n)
    return perm.reshape(wl.batch, pages_per_seq(wl))


def table_entries(wl: Workload, c_lo: int, c_end: int) -> int:
    """Block-table entries a thread block whose keys are [c_lo, c_end) reads (0 when empty)."""
    if c_end <= c_lo:
        return 0
    p = wl.kv_page_size
    return math.ceil(c_end / p) - c_lo // p


class KVLayout:
    """Where the K/V tiles a flash kernel asks for live: contiguous ((batch*kv_heads, N_kv, d),
    one access per tile) or paged (one access per page a tile touches, plus block-table reads).
    `tensors` is input_tensors' dict; when paged, its K and V are replaced by the page pools and
    a block_table tensor is added (the program's inputs)."""

    def __init__(self, wl: Workload, tensors: dict, data: AttentionData | None):
        self.wl, self.paged = wl, wl.kv_page_size is not None
        self.d = wl.head_dim
        self.all_cols = slice(0, wl.head_dim)
        if not self.paged:
            self.K, self.V = tensors["K"], tensors["V"]
            return
        p, pps, hk, d = wl.kv_page_size, pages_per_seq(wl), wl.kv_heads, wl.head_dim
        self.table = block_table(wl)
        count_only = data is None
        pools = {}
        for name, src in (("K", None if count_only else data.k), ("V", None if count_only else data.v)):
            val = None
            if src is not None:
                # (B, Hkv, Nk, d) -> per logical page (B, pps, P, Hkv*d), then placed by the table
                pad = np.zeros((wl.batch, hk, pps * p, d))
                pad[:, :, :wl.seq_len_kv] = src
                logical = pad.reshape(wl.batch, hk, pps, p, d).transpose(0, 2, 3, 1, 4)
                logical = logical.reshape(wl.batch, pps, p, hk * d)
                val = np.zeros((wl.batch * pps, p, hk * d))
                val[self.table.reshape(-1)] = logical.reshape(-1, p, hk * d)
            pools[name] = Tensor(name, (wl.batch * pps, p, hk * d), wl.dtype, val, count_only)
        self.K, self.V = tensors["K"], tensors["V"] = pools["K"], pools["V"]
        tab = None if count_only else self.table.reshape(wl.batch, 1, pps).astype(np.float64)
        self.block_table = tensors[TABLE] = Tensor(TABLE, (wl.batch, 1, pps), INDEX_DTYPE, tab, count_only)

    def tiles(self, name: str, kg: int, c0: int, c1: int) -> list:
        """The (view, rows, cols) accesses of keys [c0, c1) of K/V batch-head kg."""
        t = self.K if name == "K" else self.V
        if not self.paged:
            return [(t[kg], slice(c0, c1), self.all_cols)]
        p, d = self.wl.kv_page_size, self.d
        b, h = divmod(kg, self.wl.kv_heads)
        cols = slice(h * d, (h + 1) * d)
        out = []
        for j in range(c0 // p, math.ceil(c1 / p)):
            lo, hi = max(c0, j * p) - j * p, min(c1, (j + 1) * p) - j * p
            out.append((t[int(self.table[b, j])], slice(lo, hi), cols))
        return out

    @staticmethod
    def join(parts: list):
        """The tile from its pieces' values (None in count-only mode)."""
        if parts[0] is None:
            return None
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def table_tiles(self, kg: int, c_lo: int, c_end: int) -> list:
        """The block-table read of a thread block whose keys are [c_lo, c_end) ([] if contiguous
        or empty)."""
        if not self.paged or c_end <= c_lo:
            return []
        p = self.wl.kv_page_size
        return [(self.block_table[kg // self.wl.kv_heads], slice(0, 1), slice(c_lo // p, math.ceil(c_end / p)))]

    def store_tiles(self, name: str, kg: int, c0: int, c1: int, value) -> list:
        """(view, rows, cols, value) stores of keys [c0, c1) (the KV-cache append), page by page."""
        out, at = [], 0
        for view, rows, cols in self.tiles(name, kg, c0, c1):
            n = rows.stop - rows.start
            out.append((view, rows, cols, None if value is None else value[at:at + n]))
            at += n
        return out
