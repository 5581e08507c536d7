"""L2 as a write-back LRU cache of tiles.

Tile granular, like the rest of the model: a line is one tile a program loaded or stored
(tensor, batch-head, row range, column range). A request hits only when the same tile is still
resident, which is how tiled programs reuse data (K/V tiles across query blocks, GEMM operand
tiles across output tiles). Reuse across differently shaped tiles is not detected, so HBM
traffic is over- rather than under-estimated. Stores allocate dirty lines; a dirty line costs an
HBM write when it is evicted or when the program ends. A line's owner (the simulator passes the
tensor name and the pass that touched it) is what write-backs are credited to.
"""
from __future__ import annotations

from collections import OrderedDict


_NONE: list = []     # shared "nothing evicted" (callers only iterate it)


class L2Cache:
    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.inserted_bytes = 0        # bytes of every line ever put in (fold.py: has the L2 turned over?)
        self._lines: OrderedDict = OrderedDict()  # key -> [nbytes, dirty, owner]

    def access(self, key, nbytes: int, owner, write: bool):
        """Touch a tile. Returns None on a hit; on a miss, the dirty lines it evicted as
        (owner, nbytes) (often none). One return value: this is on the simulator's hot path."""
        lines = self._lines
        line = lines.get(key)
        if line is not None:
            lines.move_to_end(key)
            if write:
                line[1] = True
                line[2] = owner
            return None
        capacity = self.capacity_bytes
        if nbytes > capacity:
            # Larger than the cache: streams straight through (a write goes to HBM now).
            return [(owner, nbytes)] if write else _NONE
        evicted = _NONE
        used = self.used_bytes + nbytes          # with the new line
        if used > capacity:
            pop_oldest = lines.popitem
            while used > capacity:               # evict least recently used lines until it fits
                old_bytes, dirty, old_owner = pop_oldest(False)[1]
                used -= old_bytes
                if dirty:
                    if evicted is _NONE:
                        evicted = []
                    evicted.append((old_owner, old_bytes))
        lines[key] = [nbytes, write, owner]
        self.used_bytes = used
        self.inserted_bytes += nbytes
        return evicted

    def flush(self) -> list:
        """Write back every dirty line (end of program); lines stay, clean."""
        out = []
        for line in self._lines.values():
            if line[1]:
                out.append((line[2], line[0]))
                line[1] = False
        return out
