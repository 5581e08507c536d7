"""The engine's side of a block's calls: `MachineContext` implements program.BlockContext on the
machine (machine.py), counting every tile against its tensor and issuing its requests to the L2
(l2.py) and HBM pools; `LaunchState` is what the contexts of one running launch share.

It knows the machine only by what it calls on it (its env, pools, L2, listeners and `compute`),
so that the engine depends on the program interface and on this module, never the other way.
"""
from __future__ import annotations

import simpy

from .errors import HbmsimError
from .loop_fold import INERT
from .results import KernelResult
from .simpy_adapter import Role, flags, timers
from .tensor import GATHER, SECTOR_BYTES, L2Lines, Tensor, TensorView, tile_sectors
from .time_model import ASYNC_TENSOR_OPS, FP32, LIBRARY


class LaunchState:
    """What one running launch's block slots share: the next block to hand out, how many slots
    still run, and the stores (and write-backs) still draining, which the kernel waits for."""

    __slots__ = ("next_block", "running", "done", "stores", "drain_s", "drained", "tensor_op", "fold", "loops",
                 "_tensors", "with_data", "vector_work", "instructions")

    def __init__(self, env: simpy.Environment, running: int, tensor_op: str = LIBRARY, vector_work: str = FP32,
                 instructions: tuple = ()):
        self.tensor_op = tensor_op       # the instruction driving this kernel's tensor cores (time_model.py)
        self.vector_work = vector_work   # what its vector work counts: FP32 operations or instructions
        # its warps' instructions per unit of counted work (Launch.warp_instructions), where the
        # warp_issue effect applies to it; else ()
        self.instructions = instructions
        self.next_block = 0
        self.running = running
        self.done = env.event()          # the last slot has run out of blocks
        self.stores = 0                  # HBM stores in flight
        self.drain_s = 0.0               # when the last store queued at L2 is served
        self.drained = None              # fired when `stores` reaches 0, if the kernel waits
        self.fold = None                 # a fold.LaunchFold when this launch may be folded
        self.loops = None                # a loop_fold.LaunchLoops when its blocks' loops may be
        self._tensors: dict = {}         # id of a kernel record -> (record, what its contexts know of each tensor)
        self.with_data = False           # whether a tensor the launch touched has data (else: count-only)

    def tensors_of(self, kernel: KernelResult) -> dict:
        """The launch's contexts' shared notes on each tensor (MachineContext._tensor), for the
        kernel record `kernel` (a launch's records live until it ends: their ids stay theirs)."""
        entry = self._tensors.get(id(kernel))
        if entry is None or entry[0] is not kernel:
            entry = self._tensors[id(kernel)] = (kernel, {})
        return entry[1]

    def track_store(self, hbm_ev, l2_done_s: float) -> None:
        """A store (or atomic, or write-back) nobody waits on: the kernel ends only after it."""
        if l2_done_s > self.drain_s:
            self.drain_s = l2_done_s
        if hbm_ev is not None:
            self.stores += 1
            hbm_ev.callbacks.append(self._store_done)

    def _store_done(self, _event) -> None:
        self.stores -= 1
        if self.stores == 0 and self.drained is not None:
            self.drained.succeed()


class NamedBarrier:
    """A barrier of `parties` warp roles, reused: the last to reach it releases the others, and
    the next round starts afresh (as bar.sync's count resets once every thread has arrived)."""

    __slots__ = ("parties", "arrived", "_flag", "_event")

    def __init__(self, flag, parties: int):
        self.parties, self.arrived, self._flag, self._event = parties, 0, flag, None

    def sync(self):
        if self.parties <= 1:
            return
        self.arrived += 1
        if self._event is None:
            self._event = self._flag()
        event = self._event
        if self.arrived == self.parties:          # the last one in: release this round, start the next
            self.arrived, self._event = 0, None
            event.succeed()
            return
        yield event


def _span(s: slice, limit: int, what: str, tensor: Tensor) -> int:
    if s.start is None or s.stop is None or not (0 <= s.start < s.stop <= limit):
        raise HbmsimError(f"tensor {tensor.name}: {what} slice {s.start}:{s.stop} outside 0:{limit}")
    return s.stop - s.start


class MachineContext:
    """program.BlockContext on the machine: one per block slot, reused by the slot's blocks.
    The loads and `wait` are SimPy generators; store, atomic_add and compute do their work when
    called and return the events to wait for (none, or one), cheaper than a generator."""

    __slots__ = ("_m", "sm", "kernel", "block", "_launch", "_after", "_flag", "_tensors", "_tensors_of", "role")

    def __init__(self, machine, sm: int, kernel: KernelResult, launch_state: LaunchState):
        """`machine`: the machine.Machine running the launch."""
        self._m, self.sm, self.kernel, self.block, self._launch = machine, sm, kernel, -1, launch_state
        self.role = None                      # the warp role whose code is running (fork), for the timeline
        self._after = timers(machine.env)     # env.timeout, cheaper (simpy_adapter.py)
        self._flag = flags(machine.env)       # env.event, cheaper
        # per tensor, what _issue needs of it for `self.kernel` (shared by the launch's contexts): see _tensor
        self._tensors, self._tensors_of = launch_state.tensors_of(kernel), kernel

    def load(self, view: TensorView, rows: slice, cols: slice, access=None):
        """Move one tile from global memory into SRAM; returns it (None in count-only mode).
        `access`: how the kernel's threads read it (tensor.py: COALESCED, Strided, PER_THREAD_ROW),
        counted in the 32-byte sectors it touches; None: the tile's own bytes."""
        tiles = yield from self.load_tiles((view, rows, cols) if access is None else (view, rows, cols, access))
        return tiles[0]

    def load_tiles(self, *tiles):
        """Issue several tile loads at once (in flight together, as cp.async does) and wait
        for all of them. Each tile is (view, rows, cols) or (view, rows, cols, access); returns
        the list of tiles.
        (prefetch + wait, written out: this is the hottest call.)"""
        ev, l2_done_s = self._issue(tiles, False)
        if ev is not None:
            yield ev
        now = self._m.env._now
        if l2_done_s > now:
            yield self._after(l2_done_s - now)
        return self._values(tiles)

    def _values(self, tiles) -> list:
        """The loaded tiles' values (copies), or Nones in count-only runs."""
        if not self._launch.with_data:           # count-only: none of the tensors has data
            return [None] * len(tiles)
        return [None if t[0].tensor.data is None else t[0].tensor.data[t[0].group, t[1], t[2]].copy() for t in tiles]

    def prefetch(self, *tiles):
        """Start loading tiles without waiting (cp.async): returns a handle for `wait`. The
        block can compute meanwhile; the tiles' SRAM must be free, which the program ensures."""
        return tiles, *self._issue(tiles, False)

    def wait(self, handle):
        """Wait for a prefetch to land (cp.async.wait_group); returns its tiles."""
        tiles, ev, l2_done_s = handle
        if ev is not None and ev.callbacks is not None:     # not processed yet
            yield ev
        now = self._m.env._now
        if l2_done_s > now:
            yield self._after(l2_done_s - now)
        return self._values(tiles)

    def store(self, view: TensorView, rows: slice, cols: slice, value=None, access=None) -> tuple:
        """Write one tile back to global memory (value is ignored in count-only mode); `access`
        as for `load`."""
        return self.store_tiles((view, rows, cols, value) if access is None else (view, rows, cols, value, access))

    def store_tiles(self, *tiles) -> tuple:
        """Issue several tile stores at once; each is (view, rows, cols, value[, access]). Like a GPU's
        stores they do not stall the block: they use bandwidth, and the kernel ends only when
        all of them have drained. (Nothing to wait for: returns no events.)"""
        for tile in tiles:
            if tile[0].tensor.data is not None:
                self._write(tile[0], tile[1], tile[2], tile[3], "store to")
        self._launch.track_store(*self._issue(tiles, True))
        return ()

    def atomic_add(self, view: TensorView, rows: slice, cols: slice, value=None, access=None) -> tuple:
        """value is added to the tile in global memory, atomically (as atomicAdd / RED do, at L2):
        counted as a read and a write of the tile; like a store, it does not stall the block.
        `access`: as for `load` (tensor.L2Lines: the L2's lines of a fast-mode step)."""
        self._write(view, rows, cols, value, "atomic_add to", add=True)
        tile = (view, rows, cols) if access is None else (view, rows, cols, access)
        self._launch.track_store(*self._issue((tile,), False, also_write=True))
        return ()

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

        The simulator's hot loop, in one piece (a call per issue costs a percent of a run): per
        tile, check bounds, count the bytes against the tensor (L2-side, and DRAM when it misses
        the L2 or there is no L2), apply the L2's policy (l2.py) and credit what it writes back.
        A tile's bytes are its elements' bytes; a tile that names an access pattern (its optional
        last element, after the value for a store: tensor.py's COALESCED, Strided, PER_THREAD_ROW)
        counts the 32-byte sectors that pattern touches instead (tensor.tile_sectors; GATHER: the
        sectors requested at the L2, while a miss fetches the tile's own bytes from DRAM); one that
        names tensor.L2Lines counts its bytes, and the L2 sees it line by line."""
        kernel = self.kernel
        if kernel is not self._tensors_of:        # the worker switched records (fold.py)
            self._tensors, self._tensors_of = self._launch.tensors_of(kernel), kernel
        known = self._tensors
        m = self._m
        l2 = m.l2
        if l2 is not None:
            l2_access, written_back = l2.access, l2.written_back
        trace, t_prev = m.trace, None
        hbm_bytes = l2_bytes = writeback_bytes = 0
        # the L2 pipe's time for a GATHER tile's hits differs from their counted bytes: each sector
        # request takes gpu.l2_sector_request_bytes of it (l2_sectors effect; 32 = its bytes), or,
        # with the effect off, the tile's own bytes only
        pace_adjust = 0.0
        plain = 4 if write else 3                      # a tile with more elements names its access pattern
        for w in ((write, True) if also_write else (write,)):     # an atomic reads its tile, then writes it
            for tile in tiles:
                view, rows, cols = tile[0], tile[1], tile[2]
                t = view.tensor
                if t is not t_prev:                    # (tiles of one tensor often come in a row)
                    n_rows, n_cols, itemsize, uid, traffic, owner = known.get(t) or self._tensor(t)
                    t_prev = t
                r0, r1, c0, c1 = rows.start, rows.stop, cols.start, cols.stop
                if r0 < 0 or r1 <= r0 or r1 > n_rows or c0 < 0 or c1 <= c0 or c1 > n_cols:
                    _span(rows, n_rows, "row", t), _span(cols, n_cols, "col", t)     # raises with the numbers
                lines, prefix, gather = None, False, False
                fetched = nbytes = (r1 - r0) * (c1 - c0) * itemsize     # the bytes requested
                if len(tile) > plain:                  # an access pattern: the 32-byte sectors it touches
                    if tile[plain].__class__ is L2Lines:          # (or the bytes, in the L2's lines)
                        lines, prefix = tile[plain].rows, tile[plain].prefix
                    else:                              # (GATHER: requested at the L2; DRAM fetches the bytes)
                        nbytes = SECTOR_BYTES * tile_sectors(t.shape, itemsize, view.group, r0, r1, c0, c1,
                                                             tile[plain])
                        gather = tile[plain] is GATHER
                        if not gather:
                            fetched = nbytes
                if w:
                    traffic.write += nbytes
                else:
                    traffic.read += nbytes
                if l2 is None:
                    miss = nbytes
                else:                                  # a load that misses: from DRAM; the rest: the L2
                    if lines is None:
                        miss = fetched if l2_access((uid, view.group, r0, r1, c0, c1), fetched, w, owner) else 0
                    elif prefix:                       # lines of `lines` rows from row 0, kept as prefixes
                        miss = l2.access_prefix(uid, view.group, r0, r1, c0, c1, lines, (c1 - c0) * itemsize, owner)
                    else:                              # line by line, each of `lines` rows
                        miss = l2.access_lines(uid, view.group, r0, r1, c0, c1, lines, (c1 - c0) * itemsize, w,
                                               owner)
                    if written_back:                   # it sent dirty bytes to DRAM: credit their owners
                        for (name, _pass), old_bytes in written_back:
                            (kernel.tensors.get(name) or kernel.traffic(name)).hbm_write += old_bytes
                            writeback_bytes += old_bytes
                        written_back.clear()
                if miss:
                    hbm_bytes += miss
                    if w:
                        traffic.hbm_write += miss
                    else:
                        traffic.hbm_read += miss
                l2_bytes += nbytes - miss
                if gather:
                    pace = m.gather_pace            # L2 pipe bytes per counted byte of its requests
                    pace_adjust += (nbytes - miss) * (pace - 1) if pace else fetched - nbytes
                if trace is not None:
                    self._trace(trace, w, view, rows, cols, nbytes, miss > 0)
        if writeback_bytes:     # to DRAM, waited on by nobody: like a store, the kernel ends after it
            self._launch.track_store(m.hbm.request(writeback_bytes), 0.0)
        paced = l2_bytes + pace_adjust if pace_adjust else l2_bytes
        l2_done_s = m.l2_pool.reserve(paced) if paced > 0 else 0.0
        hbm_ev = m.hbm.request(hbm_bytes) if hbm_bytes else None
        if m.recorder is not None:
            self._record(tiles, write or also_write, hbm_ev, hbm_bytes, l2_bytes, l2_done_s)
        return hbm_ev, l2_done_s

    def _trace(self, trace, w: bool, view: TensorView, rows: slice, cols: slice, nbytes: int, from_hbm: bool) -> None:
        """One line of the machine's trace for a tile: what moved, and where it was served."""
        where = "HBM" if from_hbm else ("L2, written back later" if w else "L2 hit")
        trace(self._m.env.now, self.sm, self.kernel.name, self.block,
              f"{'store' if w else 'load '} {view.tensor.name}[{view.group}][{rows.start}:{rows.stop}, "
              f"{cols.start}:{cols.stop}] {nbytes} B ({where})")

    def _tensor(self, t: Tensor) -> tuple:
        """What _issue needs of tensor `t`, found once per kernel record (by the launch's first
        context to touch it): its rows and columns, bytes per element and L2 id, the kernel's
        counters for it (made at its first access) and the owner of its L2 lines (tensor, pass)."""
        kernel = self.kernel
        _, n_rows, n_cols = t.shape
        if t.data is not None:
            self._launch.with_data = True
        info = self._tensors[t] = (n_rows, n_cols, t.itemsize, t.uid,
                                   kernel.tensors.get(t.name) or kernel.traffic(t.name), (t.name, kernel.pass_name))
        return info

    def _record(self, tiles, write: bool, hbm_ev, hbm_bytes: int, l2_bytes: int, l2_done_s: float) -> None:
        """One transfer for the timeline: from now until its DRAM part and its L2 part are served."""
        m, rec = self._m, self._m.recorder
        start_s, sm, kernel, block, role = m.env.now, self.sm, self.kernel.name, self.block, self.role
        what = ("store " if write else "load ") + " ".join(dict.fromkeys(t[0].tensor.name for t in tiles))
        if hbm_ev is None:
            rec.transfer(sm, kernel, block, what, start_s, max(start_s, l2_done_s), 0, l2_bytes, role=role)
        else:
            hbm_ev.callbacks.append(lambda _ev: rec.transfer(sm, kernel, block, what, start_s,
                                                             max(m.env.now, l2_done_s), hbm_bytes, l2_bytes,
                                                             role=role))

    def compute(self, matmul_flops: int = 0, vector_flops: int = 0, sram_bytes: int = 0, exp_ops: int = 0) -> tuple:
        """Occupy this SM's tensor cores, vector units (of which `exp_ops` are exps, for the
        special-function unit) and SRAM reads, for as long as the time model (time_model.py) says.
        Returns the event to wait for (none when the SM is done already)."""
        m = self._m
        if m.shared_pipes is not None and self._launch.tensor_op in ASYNC_TENSOR_OPS:      # pipe_sharing
            ev = m.shared_pipes.compute(self, ((int(matmul_flops), int(vector_flops), int(sram_bytes), int(exp_ops)),))
            return () if ev is None else (ev,)
        done_s = m.compute(self, int(matmul_flops), int(vector_flops), int(sram_bytes), int(exp_ops))
        now = m.env._now
        return (self._after(done_s - now),) if done_s > now else ()

    def chain(self, instructions: int) -> tuple:
        """Each of this block's warps runs `instructions` dependent instructions (its fixed work: a
        prologue's or epilogue's), one every gpu.dependent_issue_cycles at clock_hz (fixed_chain
        effect): the block waits that long, taking no pipe. Returns the event to wait for."""
        delay_s = self._m.chain_s_per_instruction * instructions
        return (self._after(delay_s),) if delay_s > 0 else ()

    def fork(self, role, name: str | None = None):
        """Run the generator `role` (a warp role of this block: a producer warp, a consumer
        warpgroup, called `name` on the timeline) concurrently with the caller, on this block's SM
        with this context's calls. Returns an event that fires when it ends (`yield` it to join)."""
        if name is not None and self._m.recorder is not None:
            role = self._named(role, name)
        return Role(self._m.env, role)         # env.process(role), cheaper

    def _named(self, role, name: str):
        """`role`, with `self.role` = name while its code runs (SimPy runs one generator at a time,
        so the machine's records of its calls name the role that made them)."""
        value, error = None, None
        while True:
            self.role = name
            try:
                event = role.throw(error) if error is not None else role.send(value)
            except StopIteration as stop:
                return stop.value
            finally:
                self.role = None
            try:
                value, error = (yield event), None
            except BaseException as exc:     # a failed event: the role gets its exception
                value, error = None, exc

    def event(self):
        """A fresh event for roles to meet at (a barrier, a buffer-full or buffer-empty flag):
        `yield` it to wait, `.succeed()` it (once) to release the waiters."""
        return self._flag()

    def barrier(self, parties: int):
        """A named barrier of `parties` warp roles of this block (bar.sync: CUTLASS's
        NamedBarrier::sync over their threads), reused step after step: `yield from b.sync()`.
        Off (named_barriers effect), a role never waits at it."""
        return NamedBarrier(self._flag, parties if self._m.model.named_barriers else 1)

    def steady_loop(self, first: int, last: int):
        """A handle on this block's loop of alike iterations `first`..`last` (loop_fold.py): `j =
        loop.next(j)` at the top of iteration j gives the iteration to run, later than j
        once every block of a single-wave launch was steady and they skipped together (fast mode)."""
        loops = self._launch.loops
        return INERT if loops is None else loops.loop(self, first, last)

    def note(self, what: str, **values) -> None:
        """An annotation of the program's own numbers (a tile's S, m, l, O...), for `hbmsim explain`:
        passed to the machine's listener, and nothing at all when nobody listens."""
        listener = self._m.listener
        if listener is not None:
            listener(self._m.env.now, self.sm, self.kernel.name, self.block, what, values)

    def compute_chain(self, *phases: dict) -> tuple:
        """Several compute calls that depend on each other (each a dict of `compute`'s arguments),
        run back to back on this SM: the same time as calling `compute` for each, in one event
        (returned to wait for, as `compute` does)."""
        m = self._m
        if m.shared_pipes is not None and self._launch.tensor_op in ASYNC_TENSOR_OPS:      # pipe_sharing
            ev = m.shared_pipes.compute(self, [(int(ph.get("matmul_flops", 0)), int(ph.get("vector_flops", 0)),
                                          int(ph.get("sram_bytes", 0)), int(ph.get("exp_ops", 0))) for ph in phases])
            return () if ev is None else (ev,)
        now = done_s = m.env._now
        for ph in phases:
            done_s = m.compute(self, int(ph.get("matmul_flops", 0)), int(ph.get("vector_flops", 0)),
                               int(ph.get("sram_bytes", 0)), int(ph.get("exp_ops", 0)), done_s)
        return (self._after(done_s - now),) if done_s > now else ()
