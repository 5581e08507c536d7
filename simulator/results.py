"""Results of a simulated program: per-kernel and per-tensor counters, times, and the totals.

Every number here was accumulated by the simulator from the program's own loads, stores and
compute calls; `to_dict` gives the results schema (README, Results JSON reference), for the whole program or for the
kernels of one pass (forward or backward).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .host import HostSpec, HostStep, PassTimes, call_time_s, pass_times


@dataclass
class TensorTraffic:
    read: int = 0          # L2-side bytes: what loads requested from global memory
    write: int = 0         # L2-side bytes stores requested
    hbm_read: int = 0      # bytes that reached DRAM
    hbm_write: int = 0

    def add(self, other: "TensorTraffic") -> None:
        self.read += other.read
        self.write += other.write
        self.hbm_read += other.hbm_read
        self.hbm_write += other.hbm_write


@dataclass
class KernelResult:
    name: str
    grid: int
    sram_bytes_per_block: int
    blocks_per_sm: int
    pass_name: str = "forward"
    start_s: float = 0.0
    end_s: float = 0.0
    matmul_flops: int = 0
    vector_flops: int = 0
    exp_ops: int = 0               # of the vector operations, exps (the special-function unit's work)
    sram_read_bytes: int = 0
    hbm_peak_bytes: int = 0        # HBM footprint while this kernel runs
    hbm_shared_bytes: int = 0      # of which tensors every batch-head shares (Tensor.shared: a slice holds them whole)
    sram_peak_bytes: int = 0       # most SRAM one SM held for this kernel
    hbm_busy_s: float = 0.0        # time DRAM had a request in flight during this kernel
    compute_busy_s: float = 0.0    # busiest SM's compute time during this kernel
    # steady-state folding (fold.py): blocks not simulated but extrapolated, and their time
    folded_blocks: int = 0
    folded_s: float = 0.0
    tensors: dict = field(default_factory=dict)   # name -> TensorTraffic
    # the host's part (host.py): framework ops dispatched before its launch (Launch.host_ops), and
    # whether a launch starts it (False: device work of the machine's own, the L2's write-back)
    host_ops: int = 1
    launched: bool = True

    def scale(self, k: int) -> None:
        """k alike copies of this kernel's work (fast mode's slices): every count, the grid and the
        footprint times k, less the shared tensors' (held once); times, busy times and per-SM
        figures unchanged."""
        self.grid *= k
        self.folded_blocks *= k
        self.matmul_flops *= k
        self.vector_flops *= k
        self.exp_ops *= k
        self.sram_read_bytes *= k
        self.hbm_peak_bytes = k * (self.hbm_peak_bytes - self.hbm_shared_bytes) + self.hbm_shared_bytes
        for t in self.tensors.values():
            t.read, t.write, t.hbm_read, t.hbm_write = k * t.read, k * t.write, k * t.hbm_read, k * t.hbm_write

    def traffic(self, name: str) -> TensorTraffic:
        t = self.tensors.get(name)
        if t is None:
            t = self.tensors[name] = TensorTraffic()
        return t

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s + self.folded_s

    def total(self, attr: str) -> int:
        return sum(getattr(t, attr) for t in self.tensors.values())

    def to_dict(self, clock_hz: float) -> dict:
        return {
            "name": self.name, "pass": self.pass_name, "grid": self.grid,
            "sram_bytes_per_block": self.sram_bytes_per_block, "blocks_per_sm": self.blocks_per_sm,
            "time_s": self.time_s, "cycles": round(self.time_s * clock_hz),
            "hbm_read_bytes": self.total("hbm_read"), "hbm_write_bytes": self.total("hbm_write"),
            "global_read_bytes": self.total("read"), "global_write_bytes": self.total("write"),
            "matmul_flops": self.matmul_flops, "vector_flops": self.vector_flops,
            "exp_ops": self.exp_ops,
            "sram_read_bytes": self.sram_read_bytes, "hbm_peak_bytes": self.hbm_peak_bytes,
            "folded_blocks": self.folded_blocks, "host_ops": self.host_ops, "launched": self.launched,
            "tensors": {k: vars(v).copy() for k, v in sorted(self.tensors.items())},
        }


@dataclass
class SimResult:
    program: str
    hardware: str
    clock_hz: float
    kernels: list
    sim_events: int            # SimPy events the run scheduled (for the bench)
    outputs: dict = field(default_factory=dict)   # name -> numpy array (None in count-only)
    host: HostSpec | None = None   # the host that launches the kernels (None: the host effect is off)
    # fast mode's slice (scenarios/runner.py): 1/slice_of of the GPU simulated, its counts times it
    slice_of: int = 1
    # pass -> (how many kernels ran before the next pass began, the l2_writeback steps that pass
    # would have ended with had none followed): Machine._note_writeback_alone
    alone: dict = field(default_factory=dict)

    def scaled(self, k: int) -> "SimResult":
        """This result of a 1/k slice as the whole GPU's (KernelResult.scale), said in slice_of."""
        for kernel in self.kernels + [step for _, steps in self.alone.values() for step in steps]:
            kernel.scale(k)
        self.slice_of *= k
        return self

    def run_alone(self, pass_name: str) -> "SimResult":
        """Pass `pass_name` as a program of that pass alone would have run it: its kernels, then
        the L2's write-back of what it left dirty (the forward of a training run, as a
        forward-only run; the program's last pass is that already)."""
        if pass_name not in self.alone:
            return self
        before, steps = self.alone[pass_name]      # (not the program's final write-back of its lines)
        mine = [k for k in self.kernels[:before] if k.pass_name == pass_name]
        return dataclasses.replace(self, kernels=mine + steps, alone={})

    def select(self, pass_name: str | None = None) -> list:
        return [k for k in self.kernels if pass_name is None or k.pass_name == pass_name]

    def total(self, attr: str, pass_name: str | None = None) -> int:
        return sum(k.total(attr) for k in self.select(pass_name))

    def time(self, pass_name: str | None = None) -> float:
        """The kernels' device time (what a profiler's kernel rows add up to): back to back."""
        return sum(k.time_s for k in self.select(pass_name))

    def host_steps(self, pass_name: str | None = None) -> dict:
        """{pass: [HostStep, ...]}: the host's view of the kernels (host.py), pass by pass."""
        out: dict = {}
        for k in self.select(pass_name):
            out.setdefault(k.pass_name, []).append(HostStep(k.time_s, k.host_ops, k.launched))
        return out

    def pass_times(self, pass_name: str) -> PassTimes:
        """The stopwatch's view of one pass (host.py): its kernels behind the host's dispatch."""
        return pass_times(self.host_steps(pass_name).get(pass_name, []), backward=pass_name == "backward",
                          host=self.host or HostSpec())

    def event_time(self, pass_name: str | None = None) -> float:
        """What a stopwatch around the pass sees (each pass of a training step its own stopwatch,
        summed for the whole step); the kernels' time alone when the host effect is off."""
        if self.host is None:
            return self.time(pass_name)
        return call_time_s(self.host_steps(pass_name), self.host)

    def loop_time(self, pass_name: str | None = None) -> float:
        """What a call takes when calls run back to back (a benchmark loop between two synchronises:
        one call's host work overlaps the kernels of the one before; host.PassTimes.period_s), each
        pass of a training step its own loop, summed; the kernels' time alone when the host effect
        is off."""
        if self.host is None:
            return self.time(pass_name)
        return call_time_s(self.host_steps(pass_name), self.host, loop=True)

    def tensors(self, pass_name: str | None = None) -> dict:
        out: dict = {}
        for k in self.select(pass_name):
            for name, t in k.tensors.items():
                out.setdefault(name, TensorTraffic()).add(t)
        return out

    @property
    def time_s(self) -> float:
        return self.time()

    @property
    def cycles(self) -> int:
        return round(self.time_s * self.clock_hz)

    @property
    def hbm_peak_bytes(self) -> int:
        return max((k.hbm_peak_bytes for k in self.kernels), default=0)

    @property
    def sram_peak_bytes(self) -> int:
        return max((k.sram_peak_bytes for k in self.kernels), default=0)

    def bound(self, pass_name: str | None = None) -> str:
        ks = self.select(pass_name)
        hbm = sum(k.hbm_busy_s for k in ks)
        return "memory" if hbm >= sum(k.compute_busy_s for k in ks) else "compute"

    def to_dict(self, pass_name: str | None = None) -> dict:
        ks = self.select(pass_name)
        time_s = self.event_time(pass_name)
        kernel_time_s = self.time(pass_name)
        return {
            "hbm_read_bytes": self.total("hbm_read", pass_name), "hbm_write_bytes": self.total("hbm_write", pass_name),
            "global_read_bytes": self.total("read", pass_name), "global_write_bytes": self.total("write", pass_name),
            "hbm_peak_bytes": max((k.hbm_peak_bytes for k in ks), default=0),
            "sram_peak_bytes": max((k.sram_peak_bytes for k in ks), default=0),
            "matmul_flops": sum(k.matmul_flops for k in ks), "vector_flops": sum(k.vector_flops for k in ks),
            "exp_ops": sum(k.exp_ops for k in ks),
            # time_s: what a stopwatch around the pass sees; kernel_time_s: the kernels' device time alone;
            # loop_time_s: a call's time in a loop of calls (a benchmark's timeit)
            "time_s": time_s, "kernel_time_s": kernel_time_s, "loop_time_s": self.loop_time(pass_name),
            "cycles": round(kernel_time_s * self.clock_hz),
            "bound": self.bound(pass_name),
            "hbm_busy_s": sum(k.hbm_busy_s for k in ks), "compute_busy_s": sum(k.compute_busy_s for k in ks),
            # blocks simulated / blocks in the grids: below 1 when folding extrapolated the rest,
            # or when a slice of the GPU stood for all of it
            "simulated_fraction": simulated_fraction(ks) / self.slice_of, "slice_of": self.slice_of,
            "kernels": [k.to_dict(self.clock_hz) for k in ks],
            "tensors": {k: vars(v).copy() for k, v in sorted(self.tensors(pass_name).items())},
        }


def simulated_fraction(kernels: list) -> float:
    """Fraction of the kernels' blocks that were simulated (1.0 unless folding skipped some)."""
    grid = sum(k.grid for k in kernels)
    return 1.0 if grid == 0 else 1.0 - sum(k.folded_blocks for k in kernels) / grid
