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
