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
