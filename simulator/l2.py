"""L2 as a write-back LRU cache of tiles.

Tile granular, like the rest of the model: a line is one tile a program loaded or stored
(tensor, batch-head, row range, column range). A request hits only when the same tile is still
resident, which is how tiled programs reuse data (K/V tiles across query blocks, GEMM operand
tiles across output tiles). Reuse across differently shaped tiles is not detected, so HBM
traffic is over- rather than under-estimated. A line's owner (the simulator passes the tensor
name and the pass that touched it) is what write-backs are credited to.

The policy (`access`, one call per tile request):
- hit: the line becomes the most recent; a store marks it dirty and takes it over (owner);
- miss: least recently used lines are evicted until the tile fits, each dirty one costing an
  HBM write of its bytes; the tile becomes a line, dirty for a store (a store allocates);
- a tile larger than the whole cache streams through: a load reads HBM, a store writes it now.
Dirty lines still resident when the program ends are written back then (`flush`).
"""
from __future__ import annotations

from collections import OrderedDict


class L2Cache:
    __slots__ = ("capacity_bytes", "used_bytes", "inserted_bytes", "lines", "written_back")

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.inserted_bytes = 0        # bytes of every line ever put in (fold.py: has the L2 turned over?)
        # key -> [nbytes, dirty, owner], least recently used first
        self.lines: OrderedDict = OrderedDict()
        # (owner, nbytes) of the dirty bytes sent to HBM since the caller last emptied it: lines
        # evicted dirty, and stores larger than the cache
        self.written_back: list = []

    def access(self, key, nbytes: int, write: bool, owner) -> bool:
        """One request for tile `key` of `nbytes` bytes, a store if `write`, on behalf of `owner`.
        Returns whether HBM must serve it now: a load that misses (or streams through). Dirty
        bytes this sends to HBM are appended to `written_back`."""
        lines = self.lines
        line = lines.get(key)
        if line is not None:                # hit: now the most recent; a store dirties it
            lines.move_to_end(key)
            if write:
                line[1] = True
                line[2] = owner
            return False
        capacity = self.capacity_bytes
        if nbytes > capacity:               # larger than the L2: streams through
            if write:                       # (a store goes to HBM now, as a write-back)
                self.written_back.append((owner, nbytes))
                return False
            return True
        used = self.used_bytes + nbytes     # miss: a load reads HBM, a store allocates
        if used > capacity:
            written_back = self.written_back
            while used > capacity:          # evict least recently used lines until it fits
                old_bytes, dirty, old_owner = lines.popitem(False)[1]
                used -= old_bytes
                if dirty:                   # written back, credited to its owner
                    written_back.append((old_owner, old_bytes))
        self.used_bytes = used
        lines[key] = [nbytes, write, owner]
        self.inserted_bytes += nbytes
        return not write

    def flush(self) -> list:
        """Write back every dirty line (end of program): its (owner, nbytes); lines stay, clean."""
        out = []
        for line in self.lines.values():
            if line[1]:
                out.append((line[2], line[0]))
                line[1] = False
        return out
