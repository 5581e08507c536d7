"""The program API: what a simulated program is made of and what its blocks can do.

A Program is a list of kernel Launches run in order. A Launch has a grid of thread blocks, the
SRAM one block needs, and a block function: a generator run once per block against a
BlockContext, whose calls (`load`, `load_tiles`, `prefetch`/`wait`, `store`, `store_tiles`,
`atomic_add`, `compute`) move tiles and use the SM. Every byte a result reports was counted
here, by those calls. The engine that runs programs is machine.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from .errors import HbmsimError
from .results import KernelResult
from .tensor import Tensor, TensorView

if TYPE_CHECKING:
    from .machine import LaunchState, Machine


@dataclass(frozen=True)
class Launch:
    """One kernel launch. `block(ctx, index)` is a generator function run once per block."""
    name: str
    grid: int
    sram_bytes: int
    block: Callable
    allocs: tuple = ()      # tensors that come to exist in HBM when this launch starts
    frees: tuple = ()       # tensors released after it ends
    pass_name: str = "forward"   # which pass of a training step the kernel belongs to
    # what drives its tensor cores (time_model.py): "library" (cuBLAS: the GPU's best instruction)
    # or "mma.sync" (the warp-level instruction FlashAttention 1 and 2 are written with)
    tensor_op: str = "library"


@dataclass
class Program:
    name: str
    launches: list
    inputs: tuple = ()                              # tensors in HBM before the first launch
    outputs: dict = field(default_factory=dict)     # name -> Tensor, returned as numpy


def _span(s: slice, limit: int, what: str, tensor: Tensor) -> int:
    if s.start is None or s.stop is None or not (0 <= s.start < s.stop <= limit):
        raise HbmsimError(f"tensor {tensor.name}: {what} slice {s.start}:{s.stop} outside 0:{limit}")
    return s.stop - s.start


class BlockContext:
    """What a block sees: load, store, compute (SimPy generators: `yield from ctx.load(...)`)."""

    __slots__ = ("_m", "sm", "kernel", "block", "_launch")

    def __init__(self, machine: "Machine", sm: int, kernel: KernelResult, launch_state: "LaunchState"):
        self._m, self.sm, self.kernel, self.block, self._launch = machine, sm, kernel, -1, launch_state

    def load(self, view: TensorView, rows: slice, cols: slice):
        """Move one tile from global memory into SRAM; returns it (None in count-only mode)."""
        tiles = yield from self.load_tiles((view, rows, cols))
        return tiles[0]

    def load_tiles(self, *tiles):
        """Issue several tile loads at once (in flight together, as cp.async does) and wait
        for all of them. Each tile is (view, rows, cols); returns the list of tiles.
        (prefetch + wait, written out: this is the hottest call.)"""
        ev, l2_done_s = self._issue(tiles, False)
        if ev is not None:
            yield ev
        env = self._m.env
        if l2_done_s > env.now:
            yield env.timeout(l2_done_s - env.now)
        return [None if v.tensor.data is None else v.tensor.data[v.group, r, c].copy() for v, r, c in tiles]

    def prefetch(self, *tiles):
        """Start loading tiles without waiting (cp.async): returns a handle for `wait`. The
        block can compute meanwhile; the tiles' SRAM must be free, which the program ensures."""
        return tiles, *self._issue(tiles, False)

    def wait(self, handle):
        """Wait for a prefetch to land (cp.async.wait_group); returns its tiles."""
        tiles, ev, l2_done_s = handle
        if ev is not None and not ev.processed:
            yield ev
        env = self._m.env
        if l2_done_s > env.now:
            yield env.timeout(l2_done_s - env.now)
        return [None if v.tensor.data is None else v.tensor.data[v.group, r, c].copy() for v, r, c in tiles]

    def store(self, view: TensorView, rows: slice, cols: slice, value=None):
        """Write one tile back to global memory (value is ignored in count-only mode)."""
        yield from self.store_tiles((view, rows, cols, value))

    def store_tiles(self, *tiles):
        """Issue several tile stores at once; each is (view, rows, cols, value). Like a GPU's
        stores they do not stall the block: they use bandwidth, and the kernel ends only when
        all of them have drained."""
        for view, rows, cols, value in tiles:
            self._write(view, rows, cols, value, "store to")
        self._launch.track_store(*self._issue(tiles, True))
        yield from ()   # a generator like the other context calls, that never waits

    def atomic_add(self, view: TensorView, rows: slice, cols: slice, value=None):
        """value is added to the tile in global memory, atomically (as atomicAdd / RED do, at L2):
        counted as a read and a write of the tile; like a store, it does not stall the block."""
        self._write(view, rows, cols, value, "atomic_add to", add=True)
        self._launch.track_store(*self._issue(((view, rows, cols),), False, also_write=True))
        yield from ()

    @staticmethod
    def _write(view: TensorView, rows: slice, cols: slice, value, what: str, add: bool = False) -> None:
        """Put a tile's value into the tensor's data (none in count-only mode), checking its shape."""
        t = view.tensor
        if t.data is None:
            return
        shape = (_span(rows, t.shape[1], "row", t), _span(cols, t.shape[2], "col", t))
        if value is None or value.shape != shape:
            raise HbmsimError(f"{what} {t.name}: value shape {None if value is None else value.shape} "
                              f"disagrees with tile {shape}")
        if add:
            t.data[view.group, rows, cols] += value
        else:
            t.data[view.group, rows, cols] = value

    def _issue(self, tiles, write: bool, also_write: bool = False):
        """Count the tiles and issue their requests; returns (HBM event or None, time the L2 part
        is served). The HBM and L2 parts are in flight together: the transfer ends when the later
        one does. L2 hits are a FIFO pipe, so their finish time is known now and needs no event
        of its own unless it comes after the HBM part.

        This is the simulator's hot loop: per tile it checks bounds, counts the bytes against the
        tensor (L2-side, and DRAM when it misses L2 or there is no L2), asks the L2 model, and
        notes dirty lines the L2 evicted (written back by one request nobody waits on)."""
        m = self._m
        kernel = self.kernel
        counters = kernel.tensors
        l2 = m.l2
        trace = m.trace
        hbm_bytes = l2_bytes = 0
        for tile in tiles:
            view, rows, cols = tile[0], tile[1], tile[2]
            t = view.tensor
            _, n_rows, n_cols = t.shape
            if not (0 <= rows.start < rows.stop <= n_rows and 0 <= cols.start < cols.stop <= n_cols):
                _span(rows, n_rows, "row", t)      # raises with the numbers
                _span(cols, n_cols, "col", t)
            nbytes = (rows.stop - rows.start) * (cols.stop - cols.start) * t.itemsize
            key = (t.uid, view.group, rows.start, rows.stop, cols.start, cols.stop)
            traffic = counters.get(t.name) or kernel.traffic(t.name)
            for w in ((write, True) if also_write else (write,)):
                if w:
                    traffic.write += nbytes
                else:
                    traffic.read += nbytes
                if l2 is None:
                    from_hbm = True
                else:
                    evicted = l2.access(key, nbytes, (t.name, kernel.pass_name), w)
                    from_hbm = evicted is not None and not w        # a read miss
                    if evicted:
                        for (name, _), nb in evicted:
                            (counters.get(name) or kernel.traffic(name)).hbm_write += nb
                            m.writeback_bytes += nb
                if from_hbm:
                    hbm_bytes += nbytes
                    if w:
                        traffic.hbm_write += nbytes
                    else:
                        traffic.hbm_read += nbytes
                else:
                    l2_bytes += nbytes
                if trace is not None:
                    where = "HBM" if from_hbm else ("L2, written back later" if w else "L2 hit")
                    trace(m.env.now, self.sm, kernel.name, self.block,
                          f"{'store' if w else 'load '} {t.name}[{key[1]}][{key[2]}:{key[3]}, {key[4]}:{key[5]}] "
                          f"{nbytes} B ({where})")
        if m.writeback_bytes:
            # Dirty lines this access evicted go to DRAM: nobody waits for them, but like a
            # store they use bandwidth and the kernel ends only when they have drained.
            self._launch.track_store(m.hbm.request(m.writeback_bytes), 0.0)
            m.writeback_bytes = 0
        l2_done_s = m.l2_pool.reserve(l2_bytes) if l2_bytes else 0.0
        hbm_ev = m.hbm.request(hbm_bytes) if hbm_bytes else None
        if m.recorder is not None:
            self._record(tiles, write or also_write, hbm_ev, hbm_bytes, l2_bytes, l2_done_s)
        return hbm_ev, l2_done_s

    def _record(self, tiles, write: bool, hbm_ev, hbm_bytes: int, l2_bytes: int, l2_done_s: float) -> None:
        """One transfer for the timeline: from now until its DRAM part and its L2 part are served."""
        m, rec = self._m, self._m.recorder
        start_s, sm, kernel, block = m.env.now, self.sm, self.kernel.name, self.block
        what = ("store " if write else "load ") + " ".join(dict.fromkeys(t[0].tensor.name for t in tiles))
        if hbm_ev is None:
            rec.transfer(sm, kernel, block, what, start_s, max(start_s, l2_done_s), 0, l2_bytes)
        else:
            hbm_ev.callbacks.append(lambda _ev: rec.transfer(sm, kernel, block, what, start_s,
                                                             max(m.env.now, l2_done_s), hbm_bytes, l2_bytes))

    def compute(self, matmul_flops: int = 0, vector_flops: int = 0, sram_bytes: int = 0, exp_ops: int = 0):
        """Occupy this SM's tensor cores, vector units (of which `exp_ops` are exps, for the
        special-function unit) and SRAM reads, for as long as the time model (time_model.py) says."""
        env = self._m.env
        done_s = self._m.compute(self, int(matmul_flops), int(vector_flops), int(sram_bytes), int(exp_ops))
        if done_s > env.now:
            yield env.timeout(done_s - env.now)

    def note(self, what: str, **values) -> None:
        """An annotation of the program's own numbers (a tile's S, m, l, O...), for `hbmsim explain`:
        passed to the machine's listener, and nothing at all when nobody listens."""
        listener = self._m.listener
        if listener is not None:
            listener(self._m.env.now, self.sm, self.kernel.name, self.block, what, values)

    def compute_chain(self, *phases: dict):
        """Several compute calls that depend on each other (each a dict of `compute`'s arguments),
        run back to back on this SM: the same time as calling `compute` for each, in one event."""
        env, m = self._m.env, self._m
        done_s = env.now
        for ph in phases:
            done_s = m.compute(self, int(ph.get("matmul_flops", 0)), int(ph.get("vector_flops", 0)),
                               int(ph.get("sram_bytes", 0)), int(ph.get("exp_ops", 0)))
        if done_s > env.now:
            yield env.timeout(done_s - env.now)
