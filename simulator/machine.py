"""The engine: programs of kernel launches (program.py) run on a SimPy model of HBM, L2 and the SMs.
A block's calls reach the machine through its context (context.py).

- HBM: one SharedPool (bytes/s, fair share among transfers in flight) plus a fixed latency.
- L2 (when l2_bytes > 0): a tile-granular write-back LRU; hits are served by an L2 FifoPipe.
- Each SM: one FifoPipe of compute time; a `compute` call occupies it for as long as the time
  model (time_model.py) says: its tensor-core, vector, SFU and SRAM-read times at the SM's
  rates, added where they depend on each other and overlapped where they do not; the blocks
  resident on the SM take turns in issue order. For kernels built on Hopper's asynchronous
  `wgmma` with time_model.py's sm_pipes (and xu_tensor_serial off: measured, the two do not
  overlap), and for mma.sync kernels on GPUs whose preset measured their operand reads serial
  (mma_sync_pipes), the SM's tensor pipe and its vector (FP32/SFU) pipe are two pipes: a call's
  GEMM occupies the first and its softmax the second, so one warp role's (or resident block's)
  softmax runs under another's GEMM as the kernel's schedule lets it. With pipe_sharing (the
  default) they are processor-sharing pools: the warp roles with work in flight on a pipe share
  its rate, each role's own requests in its program order (shared_pipes.py); without, FifoPipes.
- Launches run in program order. A launch's blocks are dispatched in linear order: first round
  robin over the SMs, then each freed slot takes the next block, like the hardware scheduler.
  Slots per SM = min(max_blocks_per_sm, SRAM per SM // SRAM per block, and with the `registers`
  effect, registers per SM // registers per block).

Every number in the result comes from counters that the program's own loads, stores and compute
calls incremented.
"""
from __future__ import annotations

import gc
import math
from typing import Callable

import simpy

from .context import LaunchState, MachineContext
from .errors import HbmsimError
from .fold import LaunchFold, fold_unit_blocks
from .loop_fold import LaunchLoops
from .hardware import GPU
from .l2 import L2Cache
from .resources import FifoPipe, SharedPool
from .program import Launch, Program
from .results import KernelResult, SimResult
from .shared_pipes import SharedPipes
from .simpy_adapter import Inline, events_scheduled, run
from .tensor import SECTOR_BYTES
from .host import DEFAULT_HOST
from .time_model import MMA_SYNC, TENSOR_OPS, VECTOR_WORK, SmRates, TimeModel, hbm_rate


class Machine:
    def __init__(self, gpu: GPU, trace: Callable | None = None, model: TimeModel | None = None,
                 listener: Callable | None = None, recorder=None, progress: Callable | None = None,
                 fold: bool = False, l2_start="cold", flush_launches: bool = False):
        self.gpu = gpu
        # flush_launches: the L2 written back and emptied before every launch, outside it, as Nsight
        # Compute's cache control does around each kernel it profiles (scripts/ncu_dram_bytes.py)
        self.flush_launches = flush_launches
        self.l2_start = check_l2_start(l2_start)    # what the L2 holds when the program starts (_warm_l2)
        # fold.py: launches that declare a period are simulated until steady, the rest extrapolated;
        # never while someone watches every step (trace, listener, timeline)
        self.fold = fold and trace is None and listener is None and recorder is None
        self.trace = trace
        self.progress = progress      # progress(blocks_done, blocks_total) after every block, if given
        self.blocks_done = self.blocks_total = 0
        self.recorder = recorder      # a timeline.Timeline, or None: nothing recorded, nothing paid
        self.listener = listener      # gets the programs' annotations (BlockContext.note), if anyone listens
        self.model = TimeModel() if model is None else model
        self.env = simpy.Environment()
        self.hbm = SharedPool(self.env, hbm_rate(gpu, self.model), gpu.hbm_latency_s, "hbm_bytes_per_s")
        # (l2_dirty_limit effect: the preset's bound on dirty bytes, a fraction of the L2; off or 0,
        # the whole L2 may be dirty)
        dirty_limit = int(gpu.l2_bytes * gpu.l2_dirty_fraction) if self.model.l2_dirty_limit else 0
        self.l2 = L2Cache(gpu.l2_bytes, dirty_limit) if gpu.l2_bytes > 0 else None
        # an L2 hit is served at the L2's rate, then waits its load-to-use latency (l2_hit_latency)
        l2_latency_s = gpu.l2_hit_latency_s if self.model.l2_hit_latency else 0.0
        self.l2_pool = FifoPipe(self.env, gpu.l2_bytes_per_s, l2_latency_s, "l2_bytes_per_s") if self.l2 else None
        # L2 pipe bytes per counted byte of a GATHER tile's sector requests (context._issue): each
        # request takes l2_sector_request_bytes of the pipe (l2_sectors effect); 0: the effect off
        self.gather_pace = gpu.l2_sector_request_bytes / SECTOR_BYTES if self.model.l2_sectors else 0.0
        # seconds a warp's dependent instruction takes (context.chain; fixed_chain effect; 0: off)
        self.chain_s_per_instruction = gpu.dependent_issue_cycles / gpu.clock_hz if self.model.fixed_chain else 0.0
        # each SM's compute: its tensor pipe (the only one with sm_pipes off) and its vector (FP32/SFU) pipe
        self.sms = [FifoPipe(self.env, 1.0, 0.0, f"sm{i}") for i in range(gpu.sm_count)]
        self.vector_pipes = [FifoPipe(self.env, 1.0, 0.0, f"sm{i}_vector") for i in range(gpu.sm_count)]
        self.rates = SmRates(gpu, self.model)
        # pipe_sharing: a wgmma kernel's two pipes per SM shared by its warp roles (shared_pipes.py)
        self.shared_pipes = SharedPipes(self, gpu.sm_count) if self.model.pipe_sharing and self.rates.pipes \
            else None
        self.kernels: list[KernelResult] = []
        # pass -> (kernels before the next pass, its l2_writeback steps had it been the last):
        # _note_writeback_alone
        self.alone: dict = {}
        self.live_bytes = 0
        self.shared_live_bytes = 0    # of which tensors every batch-head shares (Tensor.shared)

    # ---- what contexts call -------------------------------------------------------------
    def compute(self, ctx: MachineContext, matmul_flops: int, vector_flops: int, sram_bytes: int,
                exp_ops: int, after_s: float = 0.0) -> float:
        """Occupy ctx's SM with one compute call, starting no earlier than `after_s` (the phase it
        depends on, in compute_chain); returns when it is done."""
        k = self.count_compute(ctx, matmul_flops, vector_flops, sram_bytes, exp_ops)
        if self.trace is not None:
            self.trace(self.env.now, ctx.sm, k.name, ctx.block,
                       f"compute matmul {matmul_flops} flop, vector {vector_flops} flop ({exp_ops} exp), "
                       f"SRAM reads {sram_bytes} B")
        rates = self.rates
        state = ctx._launch
        tensor_op = state.tensor_op
        tensor_s, vector_s = rates.compute_s(tensor_op, matmul_flops, vector_flops, exp_ops, sram_bytes,
                                             state.vector_work)
        sm = ctx.sm
        try:
            if state.instructions and matmul_flops:
                # warp_issue: the SM's pipe for the GEMM's tensor time and then the issue of all the
                # call's instructions, the resident blocks' calls one after another; the block itself
                # no sooner than its own dependent chain (GEMM and ldmatrix, then the softmax)
                issue_done_s = self.sms[sm].reserve(
                    rates.issue_s(matmul_flops, sram_bytes, vector_flops, state.instructions), after_s)
                start_s = after_s if after_s > self.env._now else self.env._now
                chain_done_s = start_s + rates.call_s(tensor_s, vector_s)
                done_s = chain_done_s if chain_done_s > issue_done_s else issue_done_s
                work_s = done_s - start_s        # the timeline: the block's call, from its start to its end
            elif tensor_op in rates.two_pipe_ops:
                # sm_pipes (mma_sync_pipes): a wgmma (mma.sync) kernel's GEMM on the tensor pipe, then
                # (if its softmax needs the GEMM) its vector work on the vector pipe
                tensor_done_s = self.sms[sm].reserve(tensor_s, after_s) if tensor_s else max(self.env._now, after_s)
                vector_done_s = self.vector_pipes[sm].reserve(vector_s, tensor_done_s if rates.serial else after_s) \
                    if vector_s else tensor_done_s
                done_s = vector_done_s if vector_done_s > tensor_done_s else tensor_done_s
                work_s = tensor_s + vector_s if rates.serial else max(tensor_s, vector_s)
            else:
                work_s = rates.call_s(tensor_s, vector_s)
                done_s = self.sms[sm].reserve(work_s, after_s)      # when this SM's pipe will have done it
            if self.recorder is not None:
                self.recorder.compute(sm, k.name, ctx.block, done_s - work_s, done_s,
                                      {"matmul_flops": matmul_flops, "vector_flops": vector_flops, "exp_ops": exp_ops,
                                       "sram_bytes": sram_bytes}, role=ctx.role)
            return done_s
        except HbmsimError:                              # the pipe's clock left the float range
            self._too_slow(f"kernel {k.name}: a compute step of {matmul_flops} matmul flop, {vector_flops} vector "
                           f"flop and {sram_bytes} SRAM bytes")

    @staticmethod
    def count_compute(ctx: MachineContext, matmul_flops: int, vector_flops: int, sram_bytes: int,
                      exp_ops: int) -> KernelResult:
        """A compute call's counts, into the record ctx counts into (returned); no time."""
        k = ctx.kernel
        k.matmul_flops += matmul_flops
        k.vector_flops += vector_flops
        k.exp_ops += exp_ops
        k.sram_read_bytes += sram_bytes
        return k

    def _too_slow(self, what: str):
        g = self.gpu
        raise HbmsimError(f"{what} is too long for simulated time to count (floats end near 1e308 s or cycles): "
                          f"a rate is too small, the latency or clock too large (clock_hz = {g.clock_hz!r}, "
                          f"hbm_latency_s = {g.hbm_latency_s!r}, "
                          f"matmul_flops_per_s = {g.matmul_flops_per_s!r}, vector_flops_per_s = "
                          f"{g.vector_flops_per_s!r}, sram_bytes_per_s_per_sm = {g.sram_bytes_per_s_per_sm!r}, "
                          f"hbm_bytes_per_s = {g.hbm_bytes_per_s!r}, l2_bytes_per_s = {g.l2_bytes_per_s!r})")

    # ---- running a program ----------------------------------------------------------------
    def slots_per_sm(self, launch: Launch) -> int:
        return self.slots_per_sm_of(self.gpu, launch, self.model.registers)

    @staticmethod
    def slots_per_sm_of(gpu: GPU, launch: Launch, registers: bool = True) -> int:
        """Blocks of `launch` one SM holds at once; a block larger than SRAM (or, with
        `registers`, than the register file) is an error."""
        if launch.tensor_op not in TENSOR_OPS:
            raise HbmsimError(f"kernel {launch.name}: tensor_op = {launch.tensor_op!r} must be one of "
                              f"{', '.join(TENSOR_OPS)}")
        if launch.vector_work not in VECTOR_WORK:
            raise HbmsimError(f"kernel {launch.name}: vector_work = {launch.vector_work!r} must be one of "
                              f"{', '.join(VECTOR_WORK)}")
        if launch.sram_bytes > gpu.sram_bytes_per_sm:
            raise HbmsimError(
                f"kernel {launch.name}: a block needs {launch.sram_bytes} bytes of SRAM, "
                f"more than sram_bytes_per_sm = {gpu.sram_bytes_per_sm} on {gpu.name}")
        slots = gpu.max_blocks_per_sm
        if launch.sram_bytes > 0:
            slots = min(slots, gpu.sram_bytes_per_sm // launch.sram_bytes)
        regs = block_registers(launch)
        if registers and regs > 0 and gpu.registers_per_sm > 0:
            if regs > gpu.registers_per_sm:
                raise HbmsimError(f"kernel {launch.name}: a block needs {regs} registers ({launch.threads_per_block} "
                                  f"threads x {launch.registers_per_thread}), more than registers_per_sm = "
                                  f"{gpu.registers_per_sm} on {gpu.name}")
            slots = min(slots, gpu.registers_per_sm // regs)
        return slots

    def _alloc(self, tensors) -> None:
        self.live_bytes += sum(t.nbytes for t in tensors)
        self.shared_live_bytes += sum(t.nbytes for t in tensors if t.shared)
        if self.live_bytes > self.gpu.hbm_capacity_bytes:
            raise HbmsimError(
                f"HBM footprint {self.live_bytes} bytes exceeds hbm_capacity_bytes = "
                f"{self.gpu.hbm_capacity_bytes} on {self.gpu.name}")

    def _busy(self) -> tuple[float, list]:
        self.hbm._advance(self.env.now)
        busy = [max(t.busy_s, v.busy_s) for t, v in zip(self.sms, self.vector_pipes)]
        if self.shared_pipes is not None:
            busy = [max(b, self.shared_pipes.busy_s(i)) for i, b in enumerate(busy)]
        return self.hbm.busy_s, busy

    def _run_launch(self, launch: Launch):
        env = self.env
        slots = self.slots_per_sm(launch)
        self._alloc(launch.allocs)
        k = KernelResult(launch.name, launch.grid, launch.sram_bytes, slots, launch.pass_name,
                         start_s=env.now, hbm_peak_bytes=self.live_bytes, hbm_shared_bytes=self.shared_live_bytes,
                         host_ops=launch.host_ops)
        self.kernels.append(k)
        hbm0, sms0 = self._busy()
        n_workers = min(slots * self.gpu.sm_count, launch.grid)
        # warp_issue: a launch's instructions per unit of work, where the effect applies to it (time_model.py)
        instructions = tuple(launch.warp_instructions) \
            if launch.tensor_op == MMA_SYNC and self.rates.s_per_warp_instruction else ()
        state = LaunchState(env, n_workers, launch.tensor_op, launch.vector_work, instructions)
        unit = fold_unit_blocks(launch.period, n_workers, launch.grid) if self.fold else 0
        if unit:
            state.fold = LaunchFold(k, unit, launch.grid, self.l2, self.hbm)
        resident = [0] * self.gpu.sm_count
        # block_dispatch: the first wave's blocks start one after another, round robin over the SMs (slot
        # k of SM i is worker k x SMs + i, and starts that many staggers late)
        stagger_s = self.gpu.block_dispatch_s if self.model.block_dispatch else 0.0
        if self.fold and state.fold is None and launch.grid <= n_workers:
            # one wave, every block resident from its slot's start (a stagger offsets the loops'
            # phases): loop_fold.py
            state.loops = LaunchLoops(k, self._busy)
        for w in range(n_workers):
            sm = w % self.gpu.sm_count
            env.process(self._worker(launch, sm, k, state, resident, w * stagger_s))
        if n_workers:
            yield state.done
        if state.stores:                     # stores still in flight to HBM
            state.drained = env.event()
            yield state.drained
        if state.drain_s > env.now:          # stores still queued at L2
            yield env.timeout(state.drain_s - env.now)
        k.end_s = env.now
        if self.recorder is not None:
            self.recorder.kernel(k.name, k.start_s, k.end_s, launch.grid)
        hbm1, sms1 = self._busy()
        k.hbm_busy_s = hbm1 - hbm0
        k.compute_busy_s = max(b - a for a, b in zip(sms0, sms1))
        if state.fold is not None:
            state.fold.merge()
        if state.loops is not None:
            state.loops.merge()
        self.live_bytes -= sum(t.nbytes for t in launch.frees)
        self.shared_live_bytes -= sum(t.nbytes for t in launch.frees if t.shared)

    def _worker(self, launch: Launch, sm: int, k: KernelResult, state: LaunchState, resident: list,
                start_after_s: float = 0.0):
        """One block slot on one SM: from `start_after_s` after the launch (block_dispatch), runs
        blocks in linear order until the grid is exhausted. The blocks run inline
        (simpy_adapter.Inline: the events they wait for resume them directly, not through this
        process, which only waits for the last one to end)."""
        if start_after_s > 0.0:
            yield self.env.timeout(start_after_s)
        ctx = MachineContext(self, sm, k, state)
        block_fn = launch.block
        resident[sm] += launch.sram_bytes
        k.sram_peak_bytes = max(k.sram_peak_bytes, resident[sm])
        recorder, progress, fold, loops = self.recorder, self.progress, state.fold, state.loops

        def blocks():
            """The slot's blocks, each a generator (run by Inline as `yield from` would)."""
            while state.next_block < launch.grid:
                b = state.next_block
                if fold is not None:
                    if b == fold.next_start:               # a unit starts: measure, maybe skip units
                        b = fold.dispatch(b, self.env.now, self._busy)
                        self.blocks_done += fold.skipped_blocks if b != state.next_block else 0
                    ctx.kernel = fold.records[-1]          # the block counts into its unit's record
                ctx.block = b
                state.next_block = b + 1
                start_s = self.env.now
                yield block_fn(ctx, ctx.block)
                if loops is not None:
                    loops.ended(ctx.block, self.env.now)
                if recorder is not None:
                    recorder.block(sm, k.name, ctx.block, start_s, self.env.now)
                if progress is not None:
                    self.blocks_done += 1
                    progress(self.blocks_done, self.blocks_total)

        yield Inline(self.env, blocks())
        resident[sm] -= launch.sram_bytes
        state.running -= 1
        if state.running == 0:
            state.done.succeed()

    def _writeback_steps(self, dirty_lines: list, start_s: float) -> list:
        """One `l2_writeback` step per pass that wrote the dirty lines ((owner, bytes) each, as
        l2.py gives them), so each pass is credited with its own writes: the L2's own work at the
        pass's end, no launch. Their times are the caller's."""
        by_pass: dict = {}
        for (name, pass_name), nb in dirty_lines:
            by_pass.setdefault(pass_name, []).append((name, nb))
        steps = []
        for pass_name, dirty in by_pass.items():
            k = KernelResult("l2_writeback", 0, 0, 0, pass_name, start_s=start_s, hbm_peak_bytes=self.live_bytes,
                             hbm_shared_bytes=self.shared_live_bytes,
                             host_ops=0, launched=False)
            for name, nb in dirty:
                k.traffic(name).hbm_write += nb
            steps.append(k)
        return steps

    def _flush_l2(self):
        """End of program: dirty L2 lines go to HBM (_writeback_steps), one step after another."""
        if self.l2 is None:
            return
        for k in self._writeback_steps(self.l2.flush(), self.env.now):
            k.start_s = self.env.now
            self.kernels.append(k)
            hbm0, _ = self._busy()
            # One request for the lot: the same bytes at the same shared bandwidth.
            yield self.hbm.request(k.total("hbm_write"))
            k.end_s = self.env.now
            k.hbm_busy_s = self._busy()[0] - hbm0

    def _main(self, program: Program):
        self._alloc(program.inputs)
        self._warm_l2(program)
        previous = None
        for launch in program.launches:
            if previous is not None and launch.pass_name != previous:
                self._note_writeback_alone(previous)
            previous = launch.pass_name
            if self.flush_launches and self.l2 is not None:
                self.l2.invalidate()           # outside every kernel: neither counted nor timed
            yield from self._run_launch(launch)
        yield from self._flush_l2()

    def _note_writeback_alone(self, pass_name: str) -> None:
        """At the end of pass `pass_name` (a later pass follows): the l2_writeback steps it would
        end with were it the program's last, as _flush_l2 would run them now. Not simulated,
        noted (SimResult.alone): the DRAM pool is idle between launches (a launch ends when its
        stores have drained), so each step is its dirty bytes at the pool's rate plus its latency,
        as the pool serves a lone request. A forward-only run is the training run's forward plus
        these (validate simulates one for both; tests/test_alone.py checks the equality)."""
        if self.l2 is None:
            return
        steps = self._writeback_steps(self.l2.dirty(), self.env.now)
        t_s = self.env.now
        for k in steps:
            k.start_s = t_s
            k.hbm_busy_s = k.total("hbm_write") / self.hbm.rate_per_s
            t_s = k.end_s = t_s + k.hbm_busy_s + self.hbm.latency_s
        self.alone[pass_name] = (len(self.kernels), steps)

    def _warm_l2(self, program: Program) -> None:
        """A warm start: the inputs named by l2_start ("warm": all of them) are L2 lines before the
        first launch, clean, in input order (the last copied the most recent): l2.py's `warm`."""
        if self.l2 is None or self.l2_start == "cold":
            return
        names = {t.name for t in program.inputs}
        wanted = names if self.l2_start == "warm" else set(self.l2_start)
        if not wanted <= names:
            raise HbmsimError(f"l2_start: {', '.join(sorted(wanted - names))} not an input of program {program.name} "
                              f"(inputs: {', '.join(sorted(names))})")
        pass_name = program.launches[0].pass_name if program.launches else "forward"
        for t in program.inputs:
            if t.name in wanted:
                self.l2.warm(t.uid, t.nbytes, (t.name, pass_name))

    def run(self, program: Program, max_events: int | None = None) -> SimResult:
        """Simulate `program`. `max_events` (tests of liveness) turns a run that would take more
        SimPy events than that into an error instead of a long wait."""
        check_program(self.gpu, program)   # fail before simulating anything
        self.blocks_total = sum(launch.grid for launch in program.launches)
        self.env.process(self._main(program))
        # The cyclic garbage collector only slows a run down (about 10%): a run's objects are
        # freed by reference counting (peak memory measured the same without it).
        collecting = gc.isenabled()
        gc.disable()
        try:
            if max_events is None:
                run(self.env)
            else:
                self._run_bounded(program, max_events)
        finally:
            if collecting:
                gc.enable()
        if not self.env.now * self.gpu.clock_hz < math.inf:     # the result counts cycles too
            self._too_slow(f"program {program.name}: its predicted time of {self.env.now!r} s")
        events = events_scheduled(self.env)
        return SimResult(
            program=program.name, hardware=self.gpu.name, clock_hz=self.gpu.clock_hz,
            kernels=self.kernels, sim_events=events, alone=self.alone,
            host=(self.model.host_spec or DEFAULT_HOST) if self.model.host else None,
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


L2_STARTS = ("cold", "warm")


def check_l2_start(l2_start):
    """"cold", "warm", or a tuple of input names (a warm start with only those resident)."""
    if isinstance(l2_start, str):
        if l2_start not in L2_STARTS:
            raise HbmsimError(f"l2_start = {l2_start!r} must be one of {', '.join(L2_STARTS)} (or input names)")
        return l2_start
    if not l2_start or not all(isinstance(n, str) for n in l2_start):
        raise HbmsimError(f"l2_start = {l2_start!r} must be one of {', '.join(L2_STARTS)} or a list of input names")
    return tuple(l2_start)


def program_footprint_bytes(program: Program) -> int:
    """Peak HBM bytes live during `program`: its inputs, plus each launch's allocations, less
    what earlier launches freed (the same bookkeeping the machine does as it runs)."""
    live = peak = sum(t.nbytes for t in program.inputs)
    for launch in program.launches:
        live += sum(t.nbytes for t in launch.allocs)
        peak = max(peak, live)
        live -= sum(t.nbytes for t in launch.frees)
    return peak


# The register file is allocated per warp in units of 256 registers (CUDA Occupancy Calculator,
# "Register allocation unit size" 256 and granularity "warp" for compute capability 8.x and 9.x).
REGISTER_ALLOC_UNIT = 256
WARP_THREADS = 32


def block_registers(launch: Launch) -> int:
    """Registers one resident block of `launch` takes: per warp, threads x registers rounded up to
    the allocation unit; 0 when the launch does not say."""
    if launch.threads_per_block <= 0 or launch.registers_per_thread <= 0:
        return 0
    warps = -(-launch.threads_per_block // WARP_THREADS)
    per_warp = -(-WARP_THREADS * launch.registers_per_thread // REGISTER_ALLOC_UNIT) * REGISTER_ALLOC_UNIT
    return warps * per_warp


def check_program(gpu: GPU, program: Program) -> None:
    """Everything about a program that can fail, checked without simulating: each kernel's
    block fits SRAM, and the peak HBM footprint fits HBM. Raises HbmsimError with the numbers."""
    for launch in program.launches:
        Machine.slots_per_sm_of(gpu, launch)
    need = program_footprint_bytes(program)
    if need > gpu.hbm_capacity_bytes:
        raise HbmsimError(f"HBM footprint {need} bytes exceeds hbm_capacity_bytes = {gpu.hbm_capacity_bytes} "
                          f"on {gpu.name}")


def simulate(gpu: GPU, program: Program, trace: Callable | None = None, max_events: int | None = None,
             model: TimeModel | None = None, listener: Callable | None = None, recorder=None,
             progress: Callable | None = None, fold: bool = False, l2_start="cold",
             flush_launches: bool = False) -> SimResult:
    """Run `program` on a fresh machine built from `gpu`, timed by `model` (default: every effect on).
    `listener(time_s, sm, kernel, block, what, values)` receives the programs' annotations;
    `recorder` (a timeline.Timeline) records blocks, transfers and compute for a Chrome trace;
    `progress(blocks_done, blocks_total)` is called after every block; `fold`: launches that
    declare a period may be folded once steady (fold.py: the result says how much was simulated);
    `l2_start`: "cold" (an empty L2), "warm" (the program's inputs resident, as the copies that made
    them left them) or the names of the inputs resident (machine.check_l2_start); `flush_launches`:
    the L2 written back and emptied before every launch, uncounted, as a profiler flushes it before
    each kernel it measures (a pass's time is then not a pass's: counts per kernel only)."""
    return Machine(gpu, trace, model, listener, recorder, progress, fold, l2_start,
                   flush_launches).run(program, max_events)
