"""The machine: programs of kernel launches run on a SimPy model of HBM, L2 and the SMs.

- HBM: one SharedPool (bytes/s, fair share among transfers in flight) plus a fixed latency.
- L2 (when l2_bytes > 0): a tile-granular write-back LRU; hits are served by an L2 FifoPipe.
- Each SM: one FifoPipe of compute time. A `compute` call occupies it for the longest of its
  tensor-core, vector and SRAM-read times at the SM's full rates (the three pipeline); the
  blocks resident on the SM take turns in issue order.
- Launches run in program order. A launch's blocks are dispatched in linear order: first round
  robin over the SMs, then each freed slot takes the next block, like the hardware scheduler.
  Slots per SM = min(max_blocks_per_sm, SRAM per SM // SRAM per block).

Every number in the result comes from counters that the program's own loads, stores and compute
calls incremented.
"""
from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field
from typing import Callable

import simpy

from .errors import HbmsimError
from .hardware import GPU
from .l2 import L2Cache
from .resources import FifoPipe, SharedPool
from .results import KernelResult, SimResult
from .tensor import Tensor, TensorView


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

    def __init__(self, machine: "Machine", sm: int, kernel: KernelResult, launch_state: dict):
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
        self._m.post(self._launch, *self._issue(tiles, True))
        yield from ()   # a generator like the other context calls, that never waits

    def atomic_add(self, view: TensorView, rows: slice, cols: slice, value=None):
        """value is added to the tile in global memory, atomically (as atomicAdd / RED do, at L2):
        counted as a read and a write of the tile; like a store, it does not stall the block."""
        self._write(view, rows, cols, value, "atomic_add to", add=True)
        self._m.post(self._launch, *self._issue(((view, rows, cols),), False, also_write=True))
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
        tensor (requested, and DRAM when it misses L2 or there is no L2), asks the L2 model, and
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
            m.post(self._launch, m.hbm.request(m.writeback_bytes), 0.0)
            m.writeback_bytes = 0
        l2_done_s = m.l2_pool.reserve(l2_bytes) if l2_bytes else 0.0
        return (m.hbm.request(hbm_bytes) if hbm_bytes else None), l2_done_s

    def compute(self, matmul_flops: int = 0, vector_flops: int = 0, sram_bytes: int = 0):
        """Occupy this SM's tensor cores, vector units and SRAM reads (they pipeline)."""
        env = self._m.env
        done_s = self._m.compute(self, int(matmul_flops), int(vector_flops), int(sram_bytes))
        if done_s > env.now:
            yield env.timeout(done_s - env.now)


class Machine:
    def __init__(self, gpu: GPU, trace: Callable | None = None):
        self.gpu = gpu
        self.trace = trace
        self.env = simpy.Environment()
        self.hbm = SharedPool(self.env, gpu.hbm_bytes_per_s, gpu.hbm_latency_s, "hbm_bytes_per_s")
        self.l2 = L2Cache(gpu.l2_bytes) if gpu.l2_bytes > 0 else None
        self.l2_pool = FifoPipe(self.env, gpu.l2_bytes_per_s, 0.0, "l2_bytes_per_s") if self.l2 else None
        self.sms = [FifoPipe(self.env, 1.0, 0.0, f"sm{i}") for i in range(gpu.sm_count)]
        self._mm_rate = gpu.matmul_flops_per_s_per_sm
        self._vec_rate = gpu.vector_flops_per_s_per_sm
        self._sram_rate = gpu.sram_bytes_per_s_per_sm
        self.kernels: list[KernelResult] = []
        self.writeback_bytes = 0      # dirty L2 evictions not yet sent to HBM
        self.live_bytes = 0

    # ---- what contexts call -------------------------------------------------------------
    def post(self, launch_state: dict, hbm_ev, l2_done_s: float) -> None:
        """Track a store nobody waits on, so that its kernel ends only after it has drained."""
        if l2_done_s > launch_state["drain_s"]:
            launch_state["drain_s"] = l2_done_s
        if hbm_ev is not None:
            launch_state["stores"] += 1
            hbm_ev.callbacks.append(launch_state["store_done"])

    def compute(self, ctx: BlockContext, matmul_flops: int, vector_flops: int, sram_bytes: int) -> float:
        k = ctx.kernel
        k.matmul_flops += matmul_flops
        k.vector_flops += vector_flops
        k.sram_read_bytes += sram_bytes
        if self.trace is not None:
            self.trace(self.env.now, ctx.sm, k.name, ctx.block,
                       f"compute matmul {matmul_flops} flop, vector {vector_flops} flop, SRAM reads {sram_bytes} B")
        work_s = max(matmul_flops / self._mm_rate, vector_flops / self._vec_rate, sram_bytes / self._sram_rate)
        if not work_s < math.inf:
            self._too_slow(f"kernel {k.name}: a compute step of {matmul_flops} matmul flop, {vector_flops} vector "
                           f"flop and {sram_bytes} SRAM bytes")
        return self.sms[ctx.sm].reserve(work_s)      # when this SM's pipe will have done it

    def _too_slow(self, what: str):
        g = self.gpu
        raise HbmsimError(f"{what} is too long for simulated time to count (floats end near 1e308 s or cycles): "
                          f"a rate is too small or the latency too large (hbm_latency_s = {g.hbm_latency_s!r}, "
                          f"matmul_flops_per_s = {g.matmul_flops_per_s!r}, vector_flops_per_s = "
                          f"{g.vector_flops_per_s!r}, sram_bytes_per_s_per_sm = {g.sram_bytes_per_s_per_sm!r}, "
                          f"hbm_bytes_per_s = {g.hbm_bytes_per_s!r}, l2_bytes_per_s = {g.l2_bytes_per_s!r})")

    # ---- running a program ----------------------------------------------------------------
    def slots_per_sm(self, launch: Launch) -> int:
        return self.slots_per_sm_of(self.gpu, launch)

    @staticmethod
    def slots_per_sm_of(gpu: GPU, launch: Launch) -> int:
        """Blocks of `launch` one SM holds at once; a block larger than SRAM is an error."""
        if launch.sram_bytes > gpu.sram_bytes_per_sm:
            raise HbmsimError(
                f"kernel {launch.name}: a block needs {launch.sram_bytes} bytes of SRAM, "
                f"more than sram_bytes_per_sm = {gpu.sram_bytes_per_sm} on {gpu.name}")
        if launch.sram_bytes <= 0:
            return gpu.max_blocks_per_sm
        return min(gpu.max_blocks_per_sm, gpu.sram_bytes_per_sm // launch.sram_bytes)

    def _alloc(self, tensors) -> None:
        self.live_bytes += sum(t.nbytes for t in tensors)
        if self.live_bytes > self.gpu.hbm_capacity_bytes:
            raise HbmsimError(
                f"HBM footprint {self.live_bytes} bytes exceeds hbm_capacity_bytes = "
                f"{self.gpu.hbm_capacity_bytes} on {self.gpu.name}")

    def _busy(self) -> tuple[float, list]:
        self.hbm._advance(self.env.now)
        return self.hbm.busy_s, [p.busy_s for p in self.sms]

    def _run_launch(self, launch: Launch):
        env = self.env
        slots = self.slots_per_sm(launch)
        self._alloc(launch.allocs)
        k = KernelResult(launch.name, launch.grid, launch.sram_bytes, slots, launch.pass_name,
                         start_s=env.now, hbm_peak_bytes=self.live_bytes)
        self.kernels.append(k)
        hbm0, sms0 = self._busy()
        n_workers = min(slots * self.gpu.sm_count, launch.grid)
        state = {"next": 0, "running": n_workers, "done": env.event(), "stores": 0, "drain_s": 0.0,
                 "drained": None}

        def store_done(_event):
            state["stores"] -= 1
            if state["stores"] == 0 and state["drained"] is not None:
                state["drained"].succeed()
        state["store_done"] = store_done
        resident = [0] * self.gpu.sm_count
        for w in range(n_workers):
            env.process(self._worker(launch, w % self.gpu.sm_count, k, state, resident))
        if n_workers:
            yield state["done"]
        if state["stores"]:                  # stores still in flight to HBM
            state["drained"] = env.event()
            yield state["drained"]
        if state["drain_s"] > env.now:       # stores still queued at L2
            yield env.timeout(state["drain_s"] - env.now)
        k.end_s = env.now
        hbm1, sms1 = self._busy()
        k.hbm_busy_s = hbm1 - hbm0
        k.compute_busy_s = max(b - a for a, b in zip(sms0, sms1))
        self.live_bytes -= sum(t.nbytes for t in launch.frees)

    def _worker(self, launch: Launch, sm: int, k: KernelResult, state: dict, resident: list):
        """One block slot on one SM: runs blocks in linear order until the grid is exhausted."""
        ctx = BlockContext(self, sm, k, state)
        block_fn = launch.block
        resident[sm] += launch.sram_bytes
        k.sram_peak_bytes = max(k.sram_peak_bytes, resident[sm])
        while state["next"] < launch.grid:
            ctx.block = state["next"]
            state["next"] += 1
            yield from block_fn(ctx, ctx.block)
        resident[sm] -= launch.sram_bytes
        state["running"] -= 1
        if state["running"] == 0:
            state["done"].succeed()

    def _flush_l2(self):
        """End of program: dirty L2 lines go to HBM, one `l2_writeback` step per pass that wrote
        them, so each pass is credited with its own writes."""
        if self.l2 is None:
            return
        by_pass: dict = {}
        for (name, pass_name), nb in self.l2.flush():
            by_pass.setdefault(pass_name, []).append((name, nb))
        for pass_name, dirty in by_pass.items():
            k = KernelResult("l2_writeback", 0, 0, 0, pass_name, start_s=self.env.now, hbm_peak_bytes=self.live_bytes)
            self.kernels.append(k)
            hbm0, _ = self._busy()
            for name, nb in dirty:
                k.traffic(name).hbm_write += nb
            # One request for the lot: the same bytes at the same shared bandwidth.
            yield self.hbm.request(sum(nb for _, nb in dirty))
            k.end_s = self.env.now
            k.hbm_busy_s = self._busy()[0] - hbm0

    def _main(self, program: Program):
        self._alloc(program.inputs)
        for launch in program.launches:
            yield from self._run_launch(launch)
        yield from self._flush_l2()

    def run(self, program: Program, max_events: int | None = None) -> SimResult:
        """Simulate `program`. `max_events` (tests of liveness) turns a run that would take more
        SimPy events than that into an error instead of a long wait."""
        check_program(self.gpu, program)   # fail before simulating anything
        self.env.process(self._main(program))
        # The cyclic garbage collector only slows a run down (about 10%): a run's objects are
        # freed by reference counting (peak memory measured the same without it).
        collecting = gc.isenabled()
        gc.disable()
        try:
            if max_events is None:
                self.env.run()
            else:
                self._run_bounded(program, max_events)
        finally:
            if collecting:
                gc.enable()
        if not self.env.now * self.gpu.clock_hz < math.inf:     # the result counts cycles too
            self._too_slow(f"program {program.name}: its predicted time of {self.env.now!r} s")
        events = next(self.env._eid)   # SimPy numbers every event it schedules; this is the count
        return SimResult(
            program=program.name, hardware=self.gpu.name, clock_hz=self.gpu.clock_hz,
            kernels=self.kernels, sim_events=events,
            outputs={name: (None if t.data is None else t.data.copy()) for name, t in program.outputs.items()},
        )


    def _run_bounded(self, program: Program, max_events: int) -> None:
        env = self.env
        for _ in range(max_events):
            if env.peek() == math.inf:
                return
            env.step()
        if env.peek() != math.inf:
            raise HbmsimError(f"program {program.name}: not finished after {max_events} SimPy events")


def program_footprint_bytes(program: Program) -> int:
    """Peak HBM bytes live during `program`: its inputs, plus each launch's allocations, less
    what earlier launches freed (the same bookkeeping the machine does as it runs)."""
    live = peak = sum(t.nbytes for t in program.inputs)
    for launch in program.launches:
        live += sum(t.nbytes for t in launch.allocs)
        peak = max(peak, live)
        live -= sum(t.nbytes for t in launch.frees)
    return peak


def check_program(gpu: GPU, program: Program) -> None:
    """Everything about a program that can fail, checked without simulating: each kernel's
    block fits SRAM, and the peak HBM footprint fits HBM. Raises HbmsimError with the numbers."""
    for launch in program.launches:
        Machine.slots_per_sm_of(gpu, launch)
    need = program_footprint_bytes(program)
    if need > gpu.hbm_capacity_bytes:
        raise HbmsimError(f"HBM footprint {need} bytes exceeds hbm_capacity_bytes = {gpu.hbm_capacity_bytes} "
                          f"on {gpu.name}")


def simulate(gpu: GPU, program: Program, trace: Callable | None = None, max_events: int | None = None) -> SimResult:
    """Run `program` on a fresh machine built from `gpu`."""
    return Machine(gpu, trace).run(program, max_events)
