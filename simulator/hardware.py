"""The hardware spec: one frozen dataclass, loaded and validated from a TOML preset.

Every field is a number with a unit in its name; `source` maps field names to where each number
comes from (spec sheet, whitepaper, microbenchmark paper). Rates are for the whole GPU unless
the name says `_per_sm`.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import HbmsimError

# Fields that must be whole numbers (sizes and counts).
INT_FIELDS = ("sm_count", "hbm_capacity_bytes", "sram_bytes_per_sm", "l2_bytes", "max_blocks_per_sm",
              "registers_per_sm", "has_wgmma", "l2_sector_request_bytes")
# Fields that may be zero: no L2 modelled.
# Fields that may be zero: no L2 modelled; a rate of the time model (time_model.py) the preset
# does not give, which switches that effect off for this GPU.
ZERO_OK_FIELDS = ("l2_bytes", "l2_bytes_per_s", "hbm_stream_fraction", "tensor_achievable_fraction",
                  "mma_sync_fraction", "sfu_ops_per_clk_per_sm", "registers_per_sm", "mma_sync_operands_serial",
                   "fp8_matmul_flops_per_s", "has_wgmma", "warp_instructions_per_clk_per_sm", "block_dispatch_s",
                   "l2_hit_latency_s", "l2_dirty_fraction", "dependent_issue_cycles")
# Fractions: at most 1 (field -> of what, for the error).
FRACTION_FIELDS = {"hbm_stream_fraction": "of a peak", "tensor_achievable_fraction": "of a peak",
                   "mma_sync_fraction": "of a peak", "mma_sync_operands_serial": "of a peak",
                   "l2_dirty_fraction": "of the L2's bytes"}


@dataclass(frozen=True)
class GPU:
    name: str
    sm_count: int
    clock_hz: float
    hbm_bytes_per_s: float            # achievable-peak DRAM bandwidth, whole GPU
    hbm_latency_s: float              # fixed latency added to every DRAM request
    hbm_capacity_bytes: int
    sram_bytes_per_sm: int            # shared memory a thread block may use on one SM
    sram_bytes_per_s_per_sm: float    # shared-memory bandwidth of one SM
    matmul_flops_per_s: float         # tensor cores, dense fp16/bf16, whole GPU
    vector_flops_per_s: float         # fp32 CUDA cores, whole GPU
    l2_bytes: int = 0                 # 0 = no L2 modelled
    l2_bytes_per_s: float = 0.0       # L2 hit bandwidth, whole GPU
    max_blocks_per_sm: int = 32       # resident thread blocks per SM (compute capability limit)
    registers_per_sm: int = 0         # 32-bit registers of one SM's register file; 0 = not modelled
    # The time model's numbers (time_model.py); 0 = not given, the effect is off on this GPU.
    hbm_stream_fraction: float = 0.0      # of hbm_bytes_per_s, what a STREAM-like kernel reaches
    tensor_achievable_fraction: float = 0.0   # of matmul_flops_per_s, what the best measured GEMM reaches
    mma_sync_fraction: float = 0.0        # of matmul_flops_per_s, what the warp-level mma.sync reaches
    sfu_ops_per_clk_per_sm: float = 0.0   # special-function unit results (exp2) per clock per SM
    # warp instructions the SM's schedulers issue per clock (one per scheduler): the rate a measured
    # instruction count runs at (time_model.py: instruction_issue)
    warp_instructions_per_clk_per_sm: float = 0.0
    # 1: an mma.sync kernel's shared-memory operand reads (ldmatrix) and its mma.sync run one after
    # the other (measured on H100); 0: pipelined under the tensor cores
    mma_sync_operands_serial: float = 0.0
    # FP8 (e4m3) tensor-core peak, dense, whole GPU; 0 = no FP8 tensor cores (FP8 runs at the fp16 rate)
    fp8_matmul_flops_per_s: float = 0.0
    # 1: the SMs have Hopper's TMA copy engine and warpgroup MMA (wgmma), which FlashAttention-3
    # needs (compute capability 9.0); 0: they do not (flash3 is refused)
    has_wgmma: int = 0
    # load-to-use latency of a load served by the L2 (a pointer chase's, `hbmsim microbench`:
    # load_latency_l2_hit), added after an L2 hit's bytes are served (time_model.py: l2_hit_latency);
    # 0 = not given
    l2_hit_latency_s: float = 0.0
    # seconds between the block scheduler's hand-outs of a launch's first blocks, round robin over
    # the SMs (time_model.py: block_dispatch); 0 = the first wave starts at once. `hbmsim microbench --host` records
    # it (block_dispatch's per_block_s): 0.9 ns on the H100 and H200, the reading of a timer whose tick
    # is coarser than the spread (an upper bound: at most 1.8 ns); not measured on the A100s: 0
    block_dispatch_s: float = 0.0
    # bytes of the L2's bandwidth (l2_bytes_per_s, a coalesced-load figure) that one lone 32-byte
    # sector request takes: a tile read one element a request (tensor.GATHER; time_model.py:
    # l2_sectors). 32 = the sector itself; `hbmsim microbench` measures it (l2_sector_cost_bytes)
    l2_sector_request_bytes: int = 32
    # the most of the L2's bytes (l2_bytes) it holds dirty: past it, the least recently stored dirty
    # lines go to DRAM while the kernel runs (l2.py; time_model.py: l2_dirty_limit). Measured by
    # kernels/store_retention.py under Nsight Compute (what a store-only kernel larger than the L2
    # leaves dirty at its end, over l2_bytes); 0 = not measured: the whole L2 may be dirty
    l2_dirty_fraction: float = 0.0
    # cycles between a warp's dependent arithmetic instructions (an instruction's result is ready
    # for the next this many cycles after issue): a chain of N such instructions takes N x this,
    # whatever the pipes' throughput (time_model.py: fixed_chain); 0 = not given
    dependent_issue_cycles: float = 0.0
    source: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        where = self.source.get("__file__", self.name)
        if not isinstance(self.name, str) or not self.name:
            raise HbmsimError(f"{where}: field 'name' = {self.name!r} must be a non-empty string")
        for f in dataclasses.fields(self):
            if f.name in ("name", "source"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
                raise HbmsimError(f"{where}: field '{f.name}' = {value!r} must be a finite number")
            if f.name in INT_FIELDS and value != int(value):
                raise HbmsimError(f"{where}: field '{f.name}' = {value!r} must be a whole number")
            if value < 0 or (value == 0 and f.name not in ZERO_OK_FIELDS):
                limit = ">= 0 (0: not given)" if f.name in ZERO_OK_FIELDS else "> 0"
                raise HbmsimError(f"{where}: field '{f.name}' = {value!r} must be {limit}")
            if 0 < value < sys.float_info.min:
                raise HbmsimError(f"{where}: field '{f.name}' = {value!r} must be 0 or at least {sys.float_info.min!r} "
                                  "(smaller floats lose precision in every rate computed from them)")
        for per_sm in self.SM_RATES:
            value = getattr(self, per_sm)
            if value > 0 and value / self.sm_count < sys.float_info.min:
                raise HbmsimError(f"{where}: field '{per_sm}' = {value!r} is too small: split over sm_count = "
                                  f"{self.sm_count} SMs it underflows below {sys.float_info.min!r}")
        for f, of_what in FRACTION_FIELDS.items():
            if getattr(self, f) > 1:
                raise HbmsimError(f"{where}: field '{f}' = {getattr(self, f)!r} must be at most 1 "
                                  f"(a fraction {of_what})")
        if self.l2_sector_request_bytes < 32:
            raise HbmsimError(f"{where}: field 'l2_sector_request_bytes' = {self.l2_sector_request_bytes!r} "
                              "must be at least 32 (a request moves a whole 32-byte sector)")
        if self.has_wgmma not in (0, 1):
            raise HbmsimError(f"{where}: field 'has_wgmma' = {self.has_wgmma!r} must be 0 or 1")
        if self.l2_bytes > 0 and self.l2_bytes_per_s <= 0:
            raise HbmsimError(f"{where}: field 'l2_bytes_per_s' = {self.l2_bytes_per_s!r} "
                              "must be > 0 when l2_bytes > 0")
        for f in INT_FIELDS:
            object.__setattr__(self, f, int(getattr(self, f)))

    # Whole-GPU compute rates: these grow with the number of SMs (per-SM rates are fixed by the SM design).
    SM_RATES = ("matmul_flops_per_s", "vector_flops_per_s", "fp8_matmul_flops_per_s")

    def with_sms(self, sm_count: int) -> "GPU":
        """The same GPU with more or fewer SMs of the same kind (per-SM rates unchanged)."""
        f = sm_count / self.sm_count
        return dataclasses.replace(self, sm_count=sm_count, **{r: getattr(self, r) * f for r in self.SM_RATES})

    def slice_of(self, k: int) -> "GPU":
        """One k-th of this GPU: sm_count / k SMs of the same kind with their share of everything
        the SMs share (DRAM bandwidth and capacity, the L2's bytes and bandwidth), so that each SM
        sees what it sees in the whole GPU when the whole runs k alike copies of the slice's work
        (fast mode's slices, scenarios/runner.py). k must divide sm_count."""
        if k < 1 or self.sm_count % k:
            raise HbmsimError(f"{self.name}: a slice of 1/{k} needs k to divide sm_count = {self.sm_count}")
        return dataclasses.replace(self.with_sms(self.sm_count // k), hbm_bytes_per_s=self.hbm_bytes_per_s / k,
                                   hbm_capacity_bytes=self.hbm_capacity_bytes // k, l2_bytes=self.l2_bytes // k,
                                   l2_bytes_per_s=self.l2_bytes_per_s / k)

    def with_overrides(self, overrides: dict, where: str = "hardware_overrides") -> "GPU":
        known = {f.name for f in dataclasses.fields(self)} - {"source"}
        for key in overrides:
            if key not in known:
                raise HbmsimError(f"{where}: unknown hardware field '{key}' (known: {', '.join(sorted(known))})")
        src = dict(self.source, __file__=where)
        for key in overrides:
            src[key] = f"override in {where}"
        return dataclasses.replace(self, **overrides, source=src)

    def summary(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "source"}


def gpu_from_dict(data: dict, where: str) -> GPU:
    """Build a GPU from a parsed TOML table; every error names the field and `where`."""
    data = dict(data)
    source = data.pop("source", {})
    if not isinstance(source, dict):
        raise HbmsimError(f"{where}: 'source' must be a table of field = \"citation\"")
    fields = {f.name: f for f in dataclasses.fields(GPU)}
    for key in data:
        if key not in fields or key == "source":
            raise HbmsimError(f"{where}: unknown hardware field '{key}'")
    for name, f in fields.items():
        if name != "source" and name not in data and f.default is dataclasses.MISSING:
            raise HbmsimError(f"{where}: missing hardware field '{name}'")
    return GPU(**data, source={**source, "__file__": where})


def load_gpu(path: str | Path) -> GPU:
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise HbmsimError(f"hardware file '{path}' not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise HbmsimError(f"{path}: not valid TOML ({err})") from None
    except OSError as err:
        raise HbmsimError(f"{path}: cannot be read ({err.strerror or err})") from None
    return gpu_from_dict(data, str(path))
