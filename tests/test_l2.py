"""The L2 model (simulator/l2.py) against a plain reference LRU, over random access sequences,
cache sizes and read/write mixes."""
from hypothesis import given, settings, strategies as st

from hbmsim.simulator.l2 import L2Cache


class ReferenceLRU:
    """A write-back, write-allocate LRU cache of variable-size lines, written as simply as it can
    be: a list of [key, nbytes, dirty, owner], least recently used first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.lines = []
        self.inserted = 0

    def used(self) -> int:
        return sum(line[1] for line in self.lines)

    def access(self, key, nbytes: int, write: bool, owner) -> tuple[bool, list]:
        """(whether DRAM serves the request now, the (owner, nbytes) it writes back to DRAM)."""
        for line in self.lines:
            if line[0] == key:                          # hit: the most recent; a store dirties it
                self.lines.remove(line)
                self.lines.append(line)
                if write:
                    line[2], line[3] = True, owner
                return False, []
        if nbytes > self.capacity:                      # cannot fit: straight through
            return (False, [(owner, nbytes)]) if write else (True, [])
        written_back = []
        while self.used() + nbytes > self.capacity:     # evict the least recent until it fits
            old = self.lines.pop(0)
            if old[2]:
                written_back.append((old[3], old[1]))
        self.lines.append([key, nbytes, write, owner])
        self.inserted += nbytes
        return not write, written_back


@st.composite
def workloads(draw):
    capacity = draw(st.integers(1, 300))
    # a key always names a tile of one size (as in the simulator, where the key is the tile's extent)
    sizes = draw(st.lists(st.integers(1, 2 * capacity), min_size=1, max_size=12))
    write_share = draw(st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]))
    accesses = draw(st.lists(st.tuples(st.integers(0, len(sizes) - 1), st.floats(0, 1),
                                       st.sampled_from(["A", "B", "C"])), max_size=80))
    return capacity, sizes, [(k, u < write_share, owner) for k, u, owner in accesses]


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_l2_cache_is_the_reference_lru(case):
    capacity, sizes, accesses = case
    l2, ref = L2Cache(capacity), ReferenceLRU(capacity)
    for key, write, owner in accesses:
        from_dram = l2.access(("t", key), sizes[key], write, owner)
        assert (from_dram, l2.written_back) == ref.access(("t", key), sizes[key], write, owner)
        l2.written_back.clear()
        assert [[k, *line] for k, line in l2.lines.items()] == ref.lines
        assert l2.used_bytes == ref.used() <= capacity
        assert l2.inserted_bytes == ref.inserted
    assert l2.flush() == [(line[3], line[1]) for line in ref.lines if line[2]]
    assert not any(dirty for _, dirty, _ in l2.lines.values())          # flushed lines stay, clean
    assert l2.flush() == []


def test_l2_cache_policy_by_hand():
    """The rules one by one, in a 100-byte cache."""
    l2 = L2Cache(100)
    assert l2.access("a", 60, True, "A") is False           # store miss: allocates, dirty
    assert l2.access("b", 30, False, "B") is True           # load miss: DRAM
    assert l2.access("a", 60, False, "X") is False          # hit: a is the most recent, still A's
    assert l2.access("c", 40, False, "C") is True           # evicts b (least recent, clean)
    assert l2.written_back == []
    assert l2.access("b", 30, False, "B") is True           # evicts dirty a: written back
    assert l2.written_back == [("A", 60)]
    l2.written_back.clear()
    assert l2.access("e", 500, True, "E") is False          # larger than the cache: a write-back now
    assert l2.access("f", 500, False, "F") is True          # ... and a load streams from DRAM
    assert l2.written_back == [("E", 500)]
    assert list(l2.lines) == ["c", "b"] and l2.used_bytes == 70 and l2.inserted_bytes == 160


class ReferenceBoundedLRU(ReferenceLRU):
    """The reference with a bound on dirty bytes, written as plainly: after a store, while the dirty
    lines hold more than `dirty_limit` bytes, the one stored least recently is written back and
    stays, clean."""

    def __init__(self, capacity: int, dirty_limit: int):
        super().__init__(capacity)
        self.dirty_limit, self.clock, self.stored_at = dirty_limit, 0, {}

    def access(self, key, nbytes: int, write: bool, owner) -> tuple[bool, list]:
        from_dram, written_back = super().access(key, nbytes, write, owner)
        if write and nbytes <= self.capacity:
            self.clock += 1
            self.stored_at[key] = self.clock
            while sum(line[1] for line in self.lines if line[2]) > self.dirty_limit:
                oldest = min((line for line in self.lines if line[2]), key=lambda line: self.stored_at[line[0]])
                oldest[2] = False
                written_back.append((oldest[3], oldest[1]))
        return from_dram, written_back


@settings(max_examples=300, deadline=None)
@given(workloads(), st.floats(0.01, 1.0))
def test_a_bounded_l2_is_the_reference(case, fraction):
    capacity, sizes, accesses = case
    limit = max(1, int(capacity * fraction))
    l2, ref = L2Cache(capacity, limit), ReferenceBoundedLRU(capacity, limit)
    for key, write, owner in accesses:
        from_dram = l2.access(("t", key), sizes[key], write, owner)
        assert (from_dram, l2.written_back) == ref.access(("t", key), sizes[key], write, owner)
        l2.written_back.clear()
        assert [[k, *line] for k, line in l2.lines.items()] == ref.lines
        dirty = sum(line[1] for line in ref.lines if line[2])
        assert l2.dirty_bytes == dirty <= limit
    assert l2.flush() == [(line[3], line[1]) for line in ref.lines if line[2]]
    assert l2.dirty_bytes == 0 and l2.flush() == []


def test_a_bounded_l2_by_hand():
    """The store-retention microbenchmark in miniature (kernels/store_retention.py): a 100-byte L2
    that holds at most 47 bytes dirty, and a kernel storing ten 10-byte tiles, then 3 more. From the
    5th store on, each store writes the least recently stored dirty tile back: the kernel ends with
    4 tiles (40 bytes) dirty, the rest of its stores (60, then 90 bytes) went to DRAM as it ran."""
    l2 = L2Cache(100, 47)
    for i in range(4):
        assert l2.access(i, 10, True, "O") is False
    assert l2.written_back == [] and l2.dirty_bytes == 40
    assert l2.access(4, 10, True, "O") is False
    assert l2.written_back == [("O", 10)] and l2.dirty_bytes == 40     # tile 0, still resident, clean
    assert l2.lines[0] == [10, False, "O"]
    for i in range(5, 13):                         # from tile 10 on, the L2 is full: LRU evicts clean tiles
        l2.access(i, 10, True, "O")
    assert sum(nb for _, nb in l2.written_back) == 90 and l2.dirty_bytes == 40
    assert [nb for _, nb in l2.flush()] == [10] * 4         # the last 4 stored, written at the end
    # a re-store of a dirty tile makes it the most recently stored: it stays dirty
    l2 = L2Cache(100, 25)
    l2.access("a", 10, True, "A"), l2.access("b", 10, True, "B"), l2.access("a", 10, True, "A2")
    l2.access("c", 10, True, "C")
    assert l2.written_back == [("B", 10)] and l2.lines["a"][1] and l2.lines["a"][2] == "A2"
    # a tile larger than the bound (but not the L2) is written back at once and stays, clean
    l2 = L2Cache(100, 25)
    assert l2.access("big", 30, True, "G") is False and l2.written_back == [("G", 30)]
    assert l2.lines["big"] == [30, False, "G"] and l2.dirty_bytes == 0


def test_prefix_lines_by_hand():
    """access_prefix (tensor.L2Lines with prefix): lines of 4 rows from row 0, 10 bytes a row, each
    kept as the prefix of it requested so far, in an L2 of 100 bytes."""
    l2 = L2Cache(100)
    pre = lambda r0, r1: l2.access_prefix("K", 0, r0, r1, 0, 8, 4, 10, ("K", "forward"))
    line = lambda s0: l2.lines.get(("K", 0, s0, s0 + 4, 0, 8, "prefix"))
    assert pre(0, 2) == 20                       # a new line: rows 0-1 from DRAM
    assert line(0)[0] == 20 and l2.used_bytes == 20
    assert pre(0, 3) == 10                       # rows 0-1 hit, row 2 read; the prefix grows to 3 rows
    assert line(0)[0] == 30 and l2.used_bytes == 30 and l2.inserted_bytes == 30
    assert pre(1, 3) == 0                        # within the prefix: a hit
    assert pre(2, 6) == 30                       # row 3 of line 0 (it grows to 4) and rows 4-5, a new line
    assert (line(0)[0], line(4)[0], l2.used_bytes) == (40, 20, 60)
    assert pre(5, 8) == 20                       # line 4 holds rows 4-5: rows 6-7 read, it grows
    assert line(4)[0] == 40
    assert pre(9, 11) == 20                      # line 8 not resident and the request starts past row 8:
    assert line(8) is None                       # read from DRAM, not kept
    assert pre(8, 12) == 40                      # from its first row: kept, whole (used 40 + 40 + 40 > 100):
    assert line(0) is None and l2.used_bytes == 80          # line 0, the least recent, made room
    assert pre(0, 1) == 10                       # back, shorter: one row
    assert pre(2, 4) == 20                       # past its prefix with a gap (row 1 is not held): not kept
    assert line(0)[0] == 10
    assert l2.access_prefix("K", 0, 0, 20, 0, 8, 20, 10, None) == 200      # a line larger than the L2 streams
    assert l2.lines.get(("K", 0, 0, 20, 0, 8, "prefix")) is None and l2.used_bytes <= 100


def test_prefix_lines_of_one_row_are_the_lines_of_single_rows():
    """Prefix lines of one row are access_lines' lines of one row: the same misses, request by
    request, over a stream of growing prefixes (every block reading its keys from 0)."""
    import random
    rng = random.Random(3)
    a, b = L2Cache(300), L2Cache(300)
    for _ in range(400):
        r1 = rng.randrange(1, 60)
        r0 = rng.randrange(0, r1)
        assert (a.access_prefix("K", 1, r0, r1, 0, 4, 1, 8, None)
                == b.access_lines("K", 1, r0, r1, 0, 4, 1, 8, False, None))
        assert a.used_bytes == b.used_bytes


def test_prefix_lines_take_a_warm_tensor_s_bytes():
    """A tensor that starts resident (`warm`, as the copy that made it leaves it): its prefix lines'
    rows, new or grown, are served by the L2 while its warm line lasts."""
    l2 = L2Cache(1000)
    l2.warm("K", 300, ("K", "input"))
    pre = lambda r0, r1: l2.access_prefix("K", 0, r0, r1, 0, 8, 4, 10, ("K", "forward"))
    assert pre(0, 2) == 0 and pre(0, 4) == 0 and pre(4, 8) == 0      # 80 of the warm 300 bytes
    assert l2.lines[("warm", "K")][0] == 220 and l2.used_bytes == 300
    assert pre(0, 4) == 0                                              # a hit in its own line now
