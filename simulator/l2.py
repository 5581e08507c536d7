"""L2 as a write-back LRU cache of tiles.

Tile granular, like the rest of the model: a line is one tile a program loaded or stored
(tensor, batch-head, row range, column range). A request hits only when the same tile is still
resident, which is how tiled programs reuse data (K/V tiles across query blocks, GEMM operand
tiles across output tiles). Reuse across differently shaped tiles is not detected, so HBM
traffic is over- rather than under-estimated. A line's owner (the simulator passes the tensor
name and the pass that touched it) is what write-backs are credited to.

The policy, applied tile by tile in the simulator's hot loop (program.py, `BlockContext._issue`,
where it is written out: one method call per tile cost 7% of a run's wall time):
- hit: the line becomes the most recent; a store marks it dirty and takes it over (owner);
- miss: least recently used lines are evicted until the tile fits, each dirty one costing an
  HBM write of its bytes; the tile becomes a line, dirty for a store (a store allocates);
- a tile larger than the whole cache streams through: a load reads HBM, a store writes it now.
Dirty lines still resident when the program ends are written back then (`flush`).
"""
from __future__ import annotations

from collections import OrderedDict


class L2Cache:
    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.inserted_bytes = 0        # bytes of every line ever put in (fold.py: has the L2 turned over?)
        # key -> [nbytes, dirty, owner], least recently used first
        self.lines: OrderedDict = OrderedDict()

    def flush(self) -> list:
        """Write back every dirty line (end of program): its (owner, nbytes); lines stay, clean."""
        out = []
        for line in self.lines.values():
            if line[1]:
                out.append((line[2], line[0]))
                line[1] = False
        return out
