"""Tensors in global memory: a name, a shape (groups, rows, cols), a storage dtype, and data.

A group is one independent matrix (for attention: one batch-head). Programs address a tile as
`tensor[group]` plus row and column slices. `data` is float64 numpy for exact numerics, or
None in count-only mode: counts and times are the same either way.
"""
from __future__ import annotations

import itertools

import numpy as np

from .errors import HbmsimError

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "int32": 4, "bool": 1}
_ids = itertools.count()
# The unit the L2 and DRAM move and count: a 32-byte sector (CUDA C++ Best Practices Guide,
# "Coalesced Access to Global Memory": a warp's accesses are served by 32-byte transactions;
# Nsight Compute's lts__t_sectors_* and dram__sectors_* count them).
SECTOR_BYTES = 32
WARP_THREADS = 32


class Tensor:
    __slots__ = ("name", "shape", "dtype", "itemsize", "data", "uid", "_views", "shared")

    def __init__(self, name: str, shape: tuple, dtype: str, data: np.ndarray | None = None, count_only: bool = False,
                 shared: bool = False):
        if dtype not in DTYPE_BYTES:
            raise HbmsimError(f"tensor {name}: dtype '{dtype}' unknown (known: {', '.join(DTYPE_BYTES)})")
        shape = tuple(int(s) for s in shape)
        if len(shape) != 3 or min(shape) < 1:
            raise HbmsimError(f"tensor {name}: shape {shape} must be (groups, rows, cols), each >= 1")
        if data is not None:
            data = np.asarray(data, dtype=np.float64)
            if data.shape != shape:
                raise HbmsimError(f"tensor {name}: data shape {data.shape} disagrees with shape {shape}")
        elif not count_only:
            data = np.zeros(shape)
        self.name, self.shape, self.dtype = name, shape, dtype
        self.itemsize = DTYPE_BYTES[dtype]
        self.data = data
        self.uid = next(_ids)
        self._views = None
        # one tensor for every batch-head (a causal mask broadcast over them): a fast-mode slice of
        # the batch-heads (program.slice_shared) holds it whole, so its footprint is not taken k times
        self.shared = shared

    @property
    def nbytes(self) -> int:
        g, r, c = self.shape
        return g * r * c * self.itemsize

    def __getitem__(self, group: int) -> "TensorView":
        if self._views is None:          # made once: programs index views in their hot loops
            self._views = [TensorView(self, g) for g in range(self.shape[0])]
        return self._views[group]

    def __repr__(self) -> str:
        return f"Tensor({self.name}, {self.shape}, {self.dtype})"


class TensorView:
    """One group of a tensor: what `ctx.load` / `ctx.store` address."""

    __slots__ = ("tensor", "group")

    def __init__(self, tensor: Tensor, group: int):
        self.tensor, self.group = tensor, group


# ---- sectors: what an access pattern touches -----------------------------------------------
# A tensor lives row-major as (groups, rows, cols), its base 256-byte aligned (cudaMalloc's
# alignment, CUDA C++ Programming Guide, "Device Memory Accesses"), so element (g, r, c) is at
# byte ((g * rows + r) * cols + c) * itemsize from a sector boundary.

class Strided:
    """How a kernel with `threads` threads copies a tile element by element: the tile's elements,
    row-major, handed out as `for (e = tid; e < n; e += threads)` (the teaching kernel's
    load_tile / store_tile, kernels/flash_attention.cu). Each warp instruction touches the
    sectors of its (up to 32) consecutive elements; with `threads` a multiple of 32 and the
    tile starting on a sector, that is the coalesced tile."""
    __slots__ = ("threads",)

    def __init__(self, threads: int):
        if threads < 1:
            raise HbmsimError(f"Strided access: threads = {threads} must be >= 1")
        self.threads = int(threads)

    def __repr__(self) -> str:
        return f"Strided({self.threads})"


class Coalesced:
    """A coalesced tile: per row, the sectors its bytes span (whole rows: one contiguous span)."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "COALESCED"


COALESCED = Coalesced()


class PerThreadRow:
    """One thread per row of the tile, writing (or reading) its row element by element: each
    warp instruction touches, for each of its 32 rows, the sector holding that row's element."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "PerThreadRow()"


PER_THREAD_ROW = PerThreadRow()


class Gather:
    """A tile the kernel reads down its columns, one element a thread, from a strided view whose
    rows lie at least a sector apart: PyTorch's copy of a transposed tensor walks its output
    contiguously, so a warp's 32 consecutive output elements are 32 rows of the source (K's rows
    in qkv are 3 x heads x head_dim elements apart; K^T-shaped gradients' N). Each element is then
    its own 32-byte sector request at the L2 (what Nsight's lts__t_sectors counts), while the L2
    fetches each of the tile's sectors from DRAM once: the sector's other elements are asked for by
    later instructions, which hit. So the L2 side moves 32 bytes an element, DRAM the tile's own."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "GATHER"


GATHER = Gather()


class L2Lines:
    """A tile requested at once that the L2 (l2.py, tile granular) keeps as lines of `rows` rows
    each, from the tile's first row: the tiles a kernel loads one by one, taken together in a
    fast-mode step. Its bytes are the tile's own; each line hits or misses by itself, so every
    block asks the L2 for the same lines whatever its step.

    `prefix` (loads only): the lines are `rows` rows each from the tensor's row 0, whatever the
    tile's first row, and the L2 keeps each as the part of it requested so far, a prefix that
    grows (l2.L2Cache.access_prefix): a stream that every block reads from row 0 upwards (K and V
    under a causal mask, in long loops), so that a step costs the L2 a line or two instead of one
    a tile."""
    __slots__ = ("rows", "prefix")

    def __init__(self, rows: int, prefix: bool = False):
        if rows < 1:
            raise HbmsimError(f"L2Lines: rows = {rows} must be >= 1")
        self.rows = int(rows)
        self.prefix = bool(prefix)

    def __repr__(self) -> str:
        return f"L2Lines({self.rows}{', prefix=True' if self.prefix else ''})"


def _span_sectors(start: int, end: int) -> int:
    """Sectors the bytes [start, end) touch."""
    return ((end + SECTOR_BYTES - 1) // SECTOR_BYTES - start // SECTOR_BYTES) if end > start else 0


def tile_sectors(shape: tuple, itemsize: int, group: int, r0: int, r1: int, c0: int, c1: int, access=None) -> int:
    """32-byte sectors that tile [group, r0:r1, c0:c1] of a tensor of `shape` touches under
    `access` (COALESCED or None: per row, the sectors its bytes span, one contiguous span for
    whole rows; Strided; PER_THREAD_ROW; GATHER: one request an element, the sectors requested
    at the L2, not the ones DRAM moves). The simulator's counters (for tiles that name an access
    pattern) and the closed forms both call this."""
    _, n_rows, n_cols = shape
    e = itemsize
    row_bytes = n_cols * e
    row0 = (group * n_rows + r0) * row_bytes             # byte offset of the tile's first row
    whole = c0 == 0 and c1 == n_cols
    if access is None or access is COALESCED:
        if whole:
            return _span_sectors(row0, row0 + (r1 - r0) * row_bytes)
        if row_bytes % SECTOR_BYTES == 0:                # every row alike
            return (r1 - r0) * _span_sectors(c0 * e, c1 * e)
        return sum(_span_sectors(row0 + i * row_bytes + c0 * e, row0 + i * row_bytes + c1 * e)
                   for i in range(r1 - r0))
    width = c1 - c0
    if access is GATHER:                                 # one sector request an element
        return (r1 - r0) * width * -(-e // SECTOR_BYTES)

    def addr(k):                                         # byte offset of the tile's k-th element
        return row0 + (k // width) * row_bytes + (c0 + k % width) * e

    if isinstance(access, Strided):
        t, n = access.threads, (r1 - r0) * width
        if whole and t % WARP_THREADS == 0 and row0 % SECTOR_BYTES == 0:
            return _span_sectors(row0, row0 + n * e)     # aligned warps over one span: coalesced
        total = 0
        for base in range(0, n, t):                      # one pass of the block's threads
            for w0 in range(base, min(n, base + t), WARP_THREADS):     # one warp instruction
                w1 = min(n, base + t, w0 + WARP_THREADS)
                if whole:
                    total += _span_sectors(addr(w0), addr(w0) + (w1 - w0) * e)
                else:
                    total += len({a // SECTOR_BYTES for k in range(w0, w1) for a in (addr(k), addr(k) + e - 1)})
        return total
    if isinstance(access, PerThreadRow):
        if row_bytes >= SECTOR_BYTES and SECTOR_BYTES % e == 0:     # rows never share a sector
            return (r1 - r0) * width
        total = 0
        for w0 in range(r0, r1, WARP_THREADS):           # each warp, each column: one instruction
            rows = range(w0, min(r1, w0 + WARP_THREADS))
            for c in range(c0, c1):
                total += len({((group * n_rows + r) * n_cols + c) * e // SECTOR_BYTES for r in rows})
        return total
    raise HbmsimError(f"access pattern {access!r} unknown (known: COALESCED, Strided(threads), PER_THREAD_ROW, "
                      "GATHER)")


def tile_sector_bytes(shape: tuple, itemsize: int, group: int, r0: int, r1: int, c0: int, c1: int,
                      access=None) -> int:
    """tile_sectors in bytes: what the L2 and DRAM move for the tile."""
    return SECTOR_BYTES * tile_sectors(shape, itemsize, group, r0, r1, c0, c1, access)
