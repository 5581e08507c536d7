"""L2 as a write-back LRU cache of tiles.

Tile granular, like the rest of the model: a line is one tile a program loaded or stored
(tensor, batch-head, row range, column range). A request hits only when the same tile is still
resident, which is how tiled programs reuse data (K/V tiles across query blocks, GEMM operand
tiles across output tiles). Reuse across differently shaped tiles is not detected, so HBM
traffic is over- rather than under-estimated. A line's owner (the simulator passes the tensor
name and the pass that touched it) is what write-backs are credited to.

The policy (`access`, one call per tile request; `access_lines`, a request the L2 keeps as
several such tiles; `access_prefix`, a stream read from row 0 whose lines hold the prefix of their
rows read so far, below):
- hit: the line becomes the most recent; a store marks it dirty and takes it over (owner);
- miss: least recently used lines are evicted until the tile fits, each dirty one costing an
  HBM write of its bytes; the tile becomes a line, dirty for a store (a store allocates);
- a tile larger than the whole cache streams through: a load reads HBM, a store writes it now;
- dirty bytes are bounded (`dirty_limit_bytes`: the preset's l2_dirty_fraction of it; 0: the whole
  cache may be dirty): a store that takes them over the bound writes back the least recently
  stored dirty lines, which stay resident, clean, until they are under it. Measured: a kernel
  that stores more than the L2 holds ends with 23.5 MiB of the H100's 50 MiB dirty and 27.8 MiB
  of the H200's 60 MiB (kernels/store_retention.py under Nsight Compute); the rest of its stores
  went to DRAM while it ran.
Dirty lines still resident when the program ends are written back then (`flush`).

Starting state (`warm`): a program may start with whole tensors resident, as the copy that made
its inputs left them. Each is one clean "warm" line of its bytes (the last one warmed the most
recent; one larger than the L2 keeps the L2's worth). A request for a tile of a warm tensor that
misses is served by the L2 (a hit, no DRAM read): the tile becomes a line of its own and the warm
line shrinks by its bytes, so the L2 holds the same bytes. A warm line evicted (least recently
used) takes the rest of its tensor out of the L2: later first touches read DRAM.
"""
from __future__ import annotations

from collections import OrderedDict

# access_prefix groups a stream's lines into lines of about 1 / PREFIX_LINES_PER_L2 of the cache (at
# least one of the caller's): small enough for the LRU to keep what is reused, few enough that a
# long step costs a line or two
PREFIX_LINES_PER_L2 = 256


class L2Cache:
    __slots__ = ("capacity_bytes", "used_bytes", "inserted_bytes", "lines", "written_back", "warm_lines",
                 "dirty_limit_bytes", "dirty_bytes", "dirty_keys")

    def __init__(self, capacity_bytes: int, dirty_limit_bytes: int = 0):
        self.capacity_bytes = int(capacity_bytes)
        # at most this many bytes dirty (0: no bound); with a bound, the dirty lines' keys, least
        # recently stored first, and their bytes
        self.dirty_limit_bytes = int(dirty_limit_bytes)
        self.dirty_bytes = 0
        self.dirty_keys: OrderedDict = OrderedDict()
        self.used_bytes = 0
        self.inserted_bytes = 0        # bytes of every line ever put in (fold.py: has the L2 turned over?)
        # key -> [nbytes, dirty, owner], least recently used first
        self.lines: OrderedDict = OrderedDict()
        # (owner, nbytes) of the dirty bytes sent to HBM since the caller last emptied it: lines
        # evicted dirty, and stores larger than the cache
        self.written_back: list = []
        self.warm_lines = 0            # at least the warm lines still resident (0: no miss looks for one)

    def access(self, key, nbytes: int, write: bool, owner) -> bool:
        """One request for tile `key` of `nbytes` bytes, a store if `write`, on behalf of `owner`.
        Returns whether HBM must serve it now: a load that misses (or streams through). Dirty
        bytes this sends to HBM are appended to `written_back`."""
        lines = self.lines
        line = lines.get(key)
        if line is not None:                # hit: now the most recent; a store dirties it
            lines.move_to_end(key)
            if write:
                was_dirty = line[1]
                line[1] = True
                line[2] = owner
                if self.dirty_limit_bytes:
                    self._stored(key, line[0], was_dirty)
            return False
        capacity = self.capacity_bytes
        if self.warm_lines and self._from_warm(key[0], nbytes):      # a warm tensor's first touch: a hit
            lines[key] = [nbytes, write, owner]
            if write and self.dirty_limit_bytes:
                self._stored(key, nbytes, False)
            return False
        if nbytes > capacity:               # larger than the L2: streams through
            if write:                       # (a store goes to HBM now, as a write-back)
                self.written_back.append((owner, nbytes))
                return False
            return True
        used = self.used_bytes + nbytes     # miss: a load reads HBM, a store allocates
        if used > capacity:
            written_back = self.written_back
            while used > capacity:          # evict least recently used lines until it fits
                old_key, (old_bytes, dirty, old_owner) = lines.popitem(False)
                used -= old_bytes
                if dirty:                   # written back, credited to its owner
                    written_back.append((old_owner, old_bytes))
                    if self.dirty_limit_bytes:
                        self.dirty_bytes -= old_bytes
                        del self.dirty_keys[old_key]
        self.used_bytes = used
        lines[key] = [nbytes, write, owner]
        self.inserted_bytes += nbytes
        if write and self.dirty_limit_bytes:
            self._stored(key, nbytes, False)
        return not write

    def _stored(self, key, nbytes: int, was_dirty: bool) -> None:
        """With a bound on dirty bytes: tile `key` (`nbytes`, now a dirty line) has just been stored.
        It becomes the most recently stored dirty line; while the dirty bytes exceed the bound, the
        least recently stored dirty line is written back (to `written_back`, credited to its owner)
        and stays, clean: a line larger than the bound goes to DRAM at once."""
        keys = self.dirty_keys
        if was_dirty:                       # already counted: now the most recently stored
            keys.move_to_end(key)
            return
        keys[key] = None
        self.dirty_bytes += nbytes
        lines = self.lines
        while self.dirty_bytes > self.dirty_limit_bytes:
            old_key = keys.popitem(False)[0]
            old = lines[old_key]
            old[1] = False
            self.dirty_bytes -= old[0]
            self.written_back.append((old[2], old[0]))

    def access_lines(self, uid, group: int, r0: int, r1: int, c0: int, c1: int, lines: int, row_bytes: int,
                     write: bool, owner) -> int:
        """One request for rows [r0, r1), columns [c0, c1) of batch-head `group` of tensor `uid`
        that the L2 keeps as lines of `lines` rows from r0 (tensor.L2Lines: the tiles a fast-mode
        step takes together), each line an `access` of its own (`row_bytes` a row). Returns the
        bytes HBM must serve now."""
        resident, miss = self.lines, 0
        for s0 in range(r0, r1, lines):
            s1 = s0 + lines if s0 + lines < r1 else r1
            key = (uid, group, s0, s1, c0, c1)
            if not write and key in resident:      # a load's hit: `access`'s first case, without the call
                resident.move_to_end(key)
            elif self.access(key, (s1 - s0) * row_bytes, write, owner):
                miss += (s1 - s0) * row_bytes
        return miss

    def access_prefix(self, uid, group: int, r0: int, r1: int, c0: int, c1: int, lines: int, row_bytes: int,
                      owner) -> int:
        """One load of rows [r0, r1), columns [c0, c1) of batch-head `group` of tensor `uid` that the
        L2 keeps as lines from row 0 (tensor.L2Lines with prefix), each a whole number of `lines`
        rows, about 1 / PREFIX_LINES_PER_L2 of the cache (`row_bytes` a row), and each the prefix
        of its rows requested so far. A request within a line's prefix hits; the rows past it are
        read from DRAM and the line grows to hold them (least recently used lines make room); a
        line not resident is put in by a request from its first row, while one that starts past a
        line's prefix (the line was evicted and put back shorter) reads its rows from DRAM without
        keeping them. Returns the bytes HBM must serve now."""
        lines *= max(1, self.capacity_bytes // PREFIX_LINES_PER_L2 // (lines * row_bytes))
        resident, miss = self.lines, 0
        s0 = r0 - r0 % lines
        while s0 < r1:
            s1 = s0 + lines
            a, b = (r0 if r0 > s0 else s0), (r1 if r1 < s1 else s1)
            key = (uid, group, s0, s1, c0, c1, "prefix")
            line = resident.get(key)
            if line is None:
                if a == s0:                        # a new line of the rows requested
                    if self.access(key, (b - s0) * row_bytes, False, owner):
                        miss += (b - s0) * row_bytes
                else:
                    miss += (b - a) * row_bytes
            else:
                resident.move_to_end(key)          # now the most recent
                held = s0 + line[0] // row_bytes   # rows [s0, held) are resident
                if b > held:
                    if a > held:                   # past the prefix, with a gap: not kept
                        miss += (b - a) * row_bytes
                    else:                          # the prefix grows by the rows past it
                        extra = (b - held) * row_bytes
                        line[0] += extra
                        if self.warm_lines and self._from_warm(uid, extra):   # still in its warm line: a hit
                            pass                   # (_from_warm moved the bytes and made room)
                        elif line[0] > self.capacity_bytes:      # larger than the L2: it streams through
                            miss += extra
                            self.inserted_bytes += extra
                            del resident[key]
                            self.used_bytes -= line[0] - extra
                        else:
                            miss += extra
                            self.inserted_bytes += extra
                            self.used_bytes = self._evict_until(self.used_bytes + extra)
            s0 = s1
        return miss

    def warm(self, uid, nbytes: int, owner) -> None:
        """Tensor `uid` (its `nbytes`) starts resident, clean, the most recent line; the least
        recent lines make room (one larger than the L2 keeps capacity_bytes of it)."""
        nbytes = min(int(nbytes), self.capacity_bytes)
        used = self.used_bytes + nbytes
        self.used_bytes = self._evict_until(used)
        self.lines[("warm", uid)] = [nbytes, False, owner]
        self.warm_lines += 1

    def _evict_until(self, used: int) -> int:
        """Evict least recently used lines (dirty ones to `written_back`) until `used` bytes fit;
        returns what is then used (the warming and warm-line paths; `access` inlines its own)."""
        while used > self.capacity_bytes:
            old_key, (old_bytes, dirty, old_owner) = self.lines.popitem(False)
            used -= old_bytes
            if dirty:
                self.written_back.append((old_owner, old_bytes))
                if self.dirty_limit_bytes:
                    self.dirty_bytes -= old_bytes
                    del self.dirty_keys[old_key]
            if isinstance(old_key, tuple) and old_key[0] == "warm":
                self.warm_lines -= 1
        return used

    def _from_warm(self, uid, nbytes: int) -> bool:
        """Whether a tile of tensor `uid` that missed is still in the L2 as part of its warm line:
        if so, the warm line gives up the tile's bytes (it is dropped when it has none left)."""
        key = ("warm", uid)
        line = self.lines.get(key)
        if line is None:
            return False
        if line[0] > nbytes:
            line[0] -= nbytes
            self.used_bytes -= nbytes        # (the tile's own line adds them back)
        else:
            self.used_bytes -= line[0]
            del self.lines[key]
            self.warm_lines -= 1
        used = self.used_bytes + nbytes
        self.used_bytes = self._evict_until(used)     # the tile was larger than what was left of its warm line
        self.inserted_bytes += nbytes
        return True

    def dirty(self) -> list:
        """(owner, nbytes) of every dirty line, in flush's order; nothing changes."""
        return [(line[2], line[0]) for line in self.lines.values() if line[1]]

    def flush(self) -> list:
        """Write back every dirty line (end of program): its (owner, nbytes); lines stay, clean."""
        out = []
        for line in self.lines.values():
            if line[1]:
                out.append((line[2], line[0]))
                line[1] = False
        self.dirty_bytes = 0
        self.dirty_keys.clear()
        return out

    def invalidate(self) -> list:
        """Write back every dirty line and empty the cache, as a profiler's cache control does
        before each kernel it measures (Nsight Compute's default `--cache-control all`); returns
        the dirty lines' (owner, nbytes)."""
        out = self.flush()
        self.lines.clear()
        self.used_bytes = 0
        self.warm_lines = 0
        return out
