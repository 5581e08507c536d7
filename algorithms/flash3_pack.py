"""FlashAttention-3's PackGQA: the query heads that share a K/V head as the rows of one tile
(hopper/pack_gqa.h, block.h, mask.h, tile_scheduler.hpp; commit 0251105a). Read, not copied.

A packed kernel has one block per (batch, K/V head, block of kBlockM packed rows) instead of one
per (batch, query head, block of query rows). Its rows interleave the group's query heads, query
row fastest-varying last (pack_gqa.h's ((qhead_per_khead, seqlen_q)) layout):

    packed row r  =  query row r // ratio  of query head  r % ratio  (ratio = heads / kv_heads)

so a tile of packed rows reads each head's share of Q (a run of consecutive query rows a head)
and writes O and lse back to the same places: the same bytes as unpacked, in `ratio` pieces. Under
the causal mask a packed row sees the keys its query row sees (mask.h divides the row index by
qhead_per_khead; block.h's n_block_max takes the last query row of the tile). Each K/V head is
read once per block of packed rows instead of once per query head: the point of packing, where
seq_len_q is short (a decode step: ratio rows fill a tile FA3 would otherwise run with one).

ratio 1 is the unpacked kernel: one piece a block, the rows its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .workload import Workload, causal_kv_end


@dataclass(frozen=True)
class PackGQA:
    """The rows of a flash3 forward's tiles: `ratio` query heads packed (1: unpacked)."""
    wl: Workload
    ratio: int = 1

    @property
    def groups(self) -> int:
        """The grid's batch-heads: batch x K/V heads packed, batch x query heads unpacked."""
        return self.wl.kv_groups if self.ratio > 1 else self.wl.groups

    @property
    def rows(self) -> int:
        """Rows of one batch-head's tiles: seq_len_q x ratio."""
        return self.wl.seq_len_q * self.ratio

    def kv_group(self, g: int) -> int:
        """The K/V batch-head block row g reads."""
        return g if self.ratio > 1 else self.wl.kv_group(g)

    def q_end(self, r1: int) -> int:
        """One past the last query row of packed rows [.., r1)."""
        return (r1 - 1) // self.ratio + 1 if r1 > 0 else 0

    def kv_end(self, r1: int) -> int:
        """Keys [0, end) packed rows [.., r1) see: all, or under the causal mask those of the last
        query row (block.h get_n_block_min_max)."""
        return causal_kv_end(self.wl, self.q_end(r1)) if self.wl.causal else self.wl.seq_len_kv

    def pieces(self, g: int, r0: int, r1: int) -> list:
        """[(query batch-head, query rows)] of packed rows [r0, r1) of batch-head g: head
        g x ratio + j holds rows r = q x ratio + j, q in [ceil((r0 - j) / ratio), ceil((r1 - j) / ratio))."""
        if self.ratio == 1:
            return [(g, slice(r0, r1))]
        k = self.ratio
        out = []
        for j in range(k):
            qa, qb = -(-(r0 - j) // k), -(-(r1 - j) // k)
            if qb > qa:
                out.append((g * k + j, slice(qa, qb)))
        return out

    def _places(self, pieces: list, r0: int) -> list:
        """Each piece's rows' places in the tile of packed rows from r0."""
        k = self.ratio
        return [np.arange(s.start, s.stop) * k + (gq % k) - r0 for gq, s in pieces]

    def gather(self, values: list, pieces: list, r0: int, r1: int):
        """The tile (r1 - r0 rows) of the pieces' values (None in count-only mode)."""
        if not values or values[0] is None:
            return None
        if self.ratio == 1:
            return values[0]
        tile = np.empty((r1 - r0, values[0].shape[1]))
        for place, v in zip(self._places(pieces, r0), values):
            tile[place] = v
        return tile

    def scatter(self, tile, pieces: list, r0: int) -> list:
        """The pieces' values of a tile of packed rows from r0 (Nones in count-only mode)."""
        if tile is None:
            return [None] * len(pieces)
        if self.ratio == 1:
            return [tile]
        return [tile[place] for place in self._places(pieces, r0)]

    def causal_mask(self, r0: int, r1: int, c0: int, c1: int):
        """(r1 - r0, c1 - c0) booleans, True where packed row r may see key c: c <= r // ratio +
        (Nk - Nq) (mask.h); None without the causal mask."""
        if not self.wl.causal:
            return None
        q = np.arange(r0, r1) // self.ratio
        return np.arange(c0, c1)[None, :] <= q[:, None] + (self.wl.seq_len_kv - self.wl.seq_len_q)

    def blocks(self, block_q: int) -> int:
        """Blocks of packed rows a batch-head has."""
        return math.ceil(self.rows / block_q)
