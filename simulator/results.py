"""Results of a simulated program: per-kernel and per-tensor counters, times, and the totals.

Every number here was accumulated by the simulator from the program's own loads, stores and
compute calls; `to_dict` gives DESIGN.md's results schema.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TensorTraffic:
    read: int = 0          # bytes requested by loads (global / L2 traffic)
    write: int = 0         # bytes requested by stores
    hbm_read: int = 0      # bytes that reached DRAM
    hbm_write: int = 0


@dataclass
class KernelResult:
    name: str
    grid: int
    sram_bytes_per_block: int
    blocks_per_sm: int
    start_s: float = 0.0
    end_s: float = 0.0
    matmul_flops: int = 0
    vector_flops: int = 0
    sram_read_bytes: int = 0
    tensors: dict = field(default_factory=dict)   # name -> TensorTraffic

    def traffic(self, name: str) -> TensorTraffic:
        t = self.tensors.get(name)
        if t is None:
            t = self.tensors[name] = TensorTraffic()
        return t

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s

    def total(self, attr: str) -> int:
        return sum(getattr(t, attr) for t in self.tensors.values())

    def to_dict(self, clock_hz: float) -> dict:
        return {
            "name": self.name, "grid": self.grid, "sram_bytes_per_block": self.sram_bytes_per_block,
            "blocks_per_sm": self.blocks_per_sm,
            "time_s": self.time_s, "cycles": round(self.time_s * clock_hz),
            "hbm_read_bytes": self.total("hbm_read"), "hbm_write_bytes": self.total("hbm_write"),
            "global_read_bytes": self.total("read"), "global_write_bytes": self.total("write"),
            "matmul_flops": self.matmul_flops, "vector_flops": self.vector_flops,
            "sram_read_bytes": self.sram_read_bytes,
            "tensors": {k: vars(v).copy() for k, v in sorted(self.tensors.items())},
        }


@dataclass
class SimResult:
    program: str
    hardware: str
    clock_hz: float
    kernels: list
    time_s: float
    hbm_peak_bytes: int
    sram_peak_bytes: int
    hbm_busy_s: float          # time DRAM had a request in flight
    compute_busy_s: float      # busiest SM's compute time (tensor/vector/SRAM pipeline)
    sim_events: int            # SimPy events the run scheduled (for the bench)
    outputs: dict = field(default_factory=dict)   # name -> numpy array (None in count-only)

    def total(self, attr: str) -> int:
        return sum(k.total(attr) for k in self.kernels)

    @property
    def tensors(self) -> dict:
        out: dict = {}
        for k in self.kernels:
            for name, t in k.tensors.items():
                acc = out.setdefault(name, TensorTraffic())
                acc.read += t.read
                acc.write += t.write
                acc.hbm_read += t.hbm_read
                acc.hbm_write += t.hbm_write
        return out

    @property
    def cycles(self) -> int:
        return round(self.time_s * self.clock_hz)

    @property
    def bound(self) -> str:
        return "memory" if self.hbm_busy_s >= self.compute_busy_s else "compute"

    def to_dict(self) -> dict:
        return {
            "hbm_read_bytes": self.total("hbm_read"), "hbm_write_bytes": self.total("hbm_write"),
            "global_read_bytes": self.total("read"), "global_write_bytes": self.total("write"),
            "hbm_peak_bytes": self.hbm_peak_bytes, "sram_peak_bytes": self.sram_peak_bytes,
            "matmul_flops": sum(k.matmul_flops for k in self.kernels),
            "vector_flops": sum(k.vector_flops for k in self.kernels),
            "time_s": self.time_s, "cycles": self.cycles, "bound": self.bound,
            "hbm_busy_s": self.hbm_busy_s, "compute_busy_s": self.compute_busy_s,
            "kernels": [k.to_dict(self.clock_hz) for k in self.kernels],
            "tensors": {k: vars(v).copy() for k, v in sorted(self.tensors.items())},
        }
