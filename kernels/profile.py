"""Measuring the kernels: one run's record for the measurement file, from the CPU emulation or
from a GPU (CUDA-event timings, and Nsight Compute counters when `ncu` is on the PATH), and the
file's provenance.

A measurement file is {"source": "emulated" | "measured", "provenance": {...}, "runs": [...],
"skipped": [...]}; each run uses the predicted results' keys where they exist (scenarios/
runner.py) and carries only what was really obtained: emulated runs have global bytes per
tensor and no times; measured runs have CUDA-event times, and DRAM / L2 bytes when ncu ran.

L2's starting state is stated and controlled (`l2_start`, recorded in the provenance and in each
measured run): "cold" flushes L2 before each timed pass (a write of FLUSH_L2_MULTIPLE x the L2
size between CUDA-event timings; `ncu --cache-control all`), "warm" leaves the inputs resident
as the copy that made them (or the pass before) left them (`--cache-control none`).

`python -m hbmsim.kernels.profile RUN.json` is the worker that ncu profiles: it runs one
forward pass of each configuration it is given (one, or a block grid's workload) on inputs saved
by the parent, and nothing else.
"""
from __future__ import annotations

import csv
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from hbmsim.simulator import HbmsimError

from .config import KernelConfig
from .traits import KernelTraits, kernel_traits

NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sectors_op_read.sum",
               "lts__t_sectors_op_write.sum", "gpu__time_duration.sum",
               # the same sectors, only those the SMs sent (srcunit_tex): H100's L2 is two partitions
               # joined by a fabric, and the all-sources counters above may also count the sectors one
               # partition forwards to the other (srcunit_ltcfabric). Recorded as
               # global_*_bytes_from_sm, to settle whether that is the 1.5x of the shipped L2 writes
               # (docs/kernels.md).
               "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum")
L2_SECTOR_BYTES = 32
TC_KERNEL = "flash_attention_tc"     # the tensor-core kernel (kernels/flash_attention_tc.cu): takes warps
# ncu's settings, recorded in the provenance (ncu_settings(l2_start) adds cache_control): clocks
# locked at base, each kernel replayed on its own.
NCU_SETTINGS = {"clock_control": "base", "replay_mode": "kernel"}
L2_STARTS = ("cold", "warm")
# ncu --cache-control per L2 starting state. "all" flushes every cache before each kernel (and
# each replay pass): every kernel starts cold, so a multi-kernel pass (the standard baseline)
# re-reads S and P from DRAM. "none" leaves L2 as the previous kernel (or the input copy) left it,
# as the simulator's L2 carries state from one kernel to the next (Nsight Compute CLI guide,
# "--cache-control").
NCU_CACHE_CONTROL = {"cold": "all", "warm": "none"}
# Cold CUDA-event timings: before each timed pass, write a buffer this many times the L2 size
# (cudaDevAttrL2CacheSize) so that no input line survives in L2. 2x: L2 on A100/H100 is two
# partitions with their own replacement (NVIDIA A100 whitepaper, "L2 cache"), so one L2's worth
# of writes need not evict every line of both; triton.testing.do_bench flushes by zeroing a fixed
# 256 MB buffer for the same reason.
FLUSH_L2_MULTIPLE = 2
ATTR_L2_CACHE_SIZE = 38              # cudaDevAttrL2CacheSize (CUDA runtime API, cudaDeviceAttr)
_UNIT_SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "sector": 1, "nsecond": 1e-9, "ns": 1e-9,
               "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0, "s": 1.0}


@dataclass(frozen=True)
class RunSpec:
    """One configuration to run, in plain numbers (kernels/ does not import algorithms/)."""
    kernel: str                 # a name in kernels/traits.py's KERNELS (flash_attention, standard_attention)
    batch: int
    heads: int
    seq_len_q: int
    seq_len_kv: int
    head_dim: int
    dtype: str                  # "fp16" | "fp32"
    causal: bool = False
    block_q: int | None = None  # tiled kernels only
    block_kv: int | None = None
    scale: float | None = None
    # warps per block of a kernel that takes them (flash_attention_tc's launch reads it); None:
    # the kernel's default. The teaching kernel runs one thread per query row and takes none
    # (kernels/profile_grid.py refuses warps for it).
    warps: int | None = None

    @property
    def traits(self) -> KernelTraits:
        return kernel_traits(self.kernel)

    def kernel_config(self):
        """The instantiation this spec runs, with .smem_bytes and .label(): the tensor-core kernel's
        TcConfig (kernels/emulation_tc_config.py: its launch rule fills what is None), else the
        teaching kernel's KernelConfig. HbmsimError (one line) for one the kernel does not have."""
        if self.kernel == TC_KERNEL:
            from .emulation_tc_config import TcConfig
            return TcConfig.default(self.dtype, self.head_dim, self.block_q, self.block_kv, self.warps)
        return KernelConfig(self.dtype, self.block_q, self.block_kv, self.head_dim)


def traffic_fields(traffic: dict) -> dict:
    """{name: (read, write)} -> the results schema's totals and per-tensor table."""
    return {"global_read_bytes": sum(r for r, _ in traffic.values()),
            "global_write_bytes": sum(w for _, w in traffic.values()),
            "tensors": {name: {"read": int(r), "write": int(w)} for name, (r, w) in sorted(traffic.items())}}


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _first_line(cmd: list[str], containing: str | None = None) -> str | None:
    """The first non-empty line of `cmd`'s output (the first that contains `containing`, when given
    and present: ncu prints its name first, then 'Version ...'), or None when it cannot run."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    if containing:
        lines = [ln for ln in lines if containing in ln.lower()] or lines
    return lines[0] if lines else None


def _hbmsim_version() -> str:
    try:
        from importlib.metadata import version
        return version("hbmsim")
    except Exception:            # running from a source tree that is not installed
        return "unknown"


def emulation_provenance(command: list[str], compiler: str) -> dict:
    from .emulation import BASE_FLAGS, LIBRARY_FLAGS
    return {"source": "emulated", "what": "CPU emulation of kernels/flash_attention.cu (one OS thread per CUDA "
                                          "thread, blocks one at a time); bytes counted by its global-memory proxies",
            "compiler": _first_line([compiler, "--version"]), "compiler_flags": " ".join(BASE_FLAGS + LIBRARY_FLAGS),
            "host": platform.platform(), "python": platform.python_version(), "hbmsim": _hbmsim_version(),
            "date": now_utc(), "command": " ".join(command)}


# ---- GPU ----

def ncu_settings(l2_start: str) -> dict:
    """The ncu settings a measurement under `l2_start` uses (recorded in the provenance)."""
    return {"cache_control": NCU_CACHE_CONTROL[check_l2_start(l2_start)], **NCU_SETTINGS}


def check_l2_start(l2_start: str) -> str:
    if l2_start not in L2_STARTS:
        raise HbmsimError(f"profile: --l2 = {l2_start!r} must be one of {', '.join(L2_STARTS)}")
    return l2_start


def l2_provenance(l2_start: str, flush_bytes: int | None) -> dict:
    """What the provenance says about L2's starting state."""
    if check_l2_start(l2_start) == "cold":
        how = (f"L2 flushed before each timed pass: a {flush_bytes:,}-byte buffer ({FLUSH_L2_MULTIPLE}x the L2 size) "
               "written between CUDA-event timings (not timed); ncu --cache-control all (flushed before each kernel)")
    else:
        how = ("no flush: the inputs start as the copy that made them (or the previous pass) left them in L2; "
               "ncu --cache-control none")
    return {"l2_start": l2_start, "how": how, "flush_bytes": flush_bytes if l2_start == "cold" else None}


def gpu_provenance(command: list[str], warmup: int, repeats: int, ncu: str | None,
                   l2_start: str | None = None) -> dict:
    from .gpu import cupy_module
    cp = cupy_module()
    rt = cp.cuda.runtime
    dev = cp.cuda.Device()
    props = rt.getDeviceProperties(dev.id)
    name = props.get("name", b"unknown")
    prov = {"source": "measured", "gpu": name.decode() if isinstance(name, bytes) else str(name),
            "compute_capability": dev.compute_capability,     # e.g. "80"
            "sm_count": props.get("multiProcessorCount"), "driver_version": rt.driverGetVersion(),
            "cuda_runtime_version": rt.runtimeGetVersion(), "cupy": cp.__version__,
            "sm_clock_khz": rt.deviceGetAttribute(13, dev.id),        # cudaDevAttrClockRate (peak)
            "memory_clock_khz": rt.deviceGetAttribute(36, dev.id),    # cudaDevAttrMemoryClockRate (peak)
            "timing": {"method": "CUDA events around one forward pass", "warmup": warmup, "repeats": repeats,
                       "statistic": "median"},
            "ncu": _first_line([ncu, "--version"], "version") if ncu else None,
            "ncu_metrics": list(NCU_METRICS) if ncu else None,
            "ncu_settings": ncu_settings(l2_start or "warm") if ncu else None,
            "host": platform.platform(), "hbmsim": _hbmsim_version(), "date": now_utc(), "command": " ".join(command)}
    if l2_start is not None:
        prov["l2"] = l2_provenance(l2_start, l2_flush_bytes())
    if shutil.which("nvidia-smi"):
        prov["nvidia_smi"] = _first_line(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,"
                                          "clocks.max.sm,clocks.max.mem", "--format=csv,noheader"])
    return prov


def forward(spec: RunSpec, q, k, v, mask=None):
    """One forward pass of spec on CuPy inputs; returns (O, lse), lse None for an untiled kernel."""
    return spec.traits.launch(spec, q, k, v, mask)


def l2_flush_bytes() -> int:
    """Bytes written between cold timings: FLUSH_L2_MULTIPLE x this GPU's L2 size."""
    from .gpu import cupy_module
    cp = cupy_module()
    return FLUSH_L2_MULTIPLE * cp.cuda.runtime.deviceGetAttribute(ATTR_L2_CACHE_SIZE, cp.cuda.Device().id)


def time_forward(spec: RunSpec, q, k, v, warmup: int = 3, repeats: int = 20, l2_start: str = "warm") -> float:
    """Median seconds of one forward pass, timed with CUDA events on the current stream. With
    l2_start "cold", L2 is flushed (a buffer of l2_flush_bytes written, on the same stream,
    before the start event) ahead of every timed and untimed pass."""
    from .gpu import causal_mask, cupy_module
    cp = cupy_module()
    mask = causal_mask(spec.seq_len_q, spec.seq_len_kv) if spec.causal and spec.traits.causal_mask_tensor else None
    flush = cp.empty(l2_flush_bytes(), dtype=cp.uint8) if check_l2_start(l2_start) == "cold" else None
    for _ in range(warmup):
        if flush is not None:
            flush.fill(1)
        forward(spec, q, k, v, mask)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times_s = []
    for _ in range(repeats):
        if flush is not None:
            # evicts the inputs (and the last pass's O): the pass starts cold. The flush's dirty lines
            # are written back to DRAM while the pass runs, as in triton's do_bench: a small cost
            flush.fill(1)
        start.record()
        forward(spec, q, k, v, mask)
        end.record()
        end.synchronize()
        times_s.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)     # ms -> s
    return statistics.median(times_s)


def ncu_table(text: str) -> str | None:
    """ncu --csv output from its header row ('"ID",...') on, without the ==PROF== lines before it;
    None when there is no table."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    return None if start is None else "\n".join(lines[start:])


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu --csv (details page, one row per kernel and metric) -> one dict per kernel launch:
    {"name", metric: value in base units (bytes, sectors, seconds)}."""
    table = ncu_table(text)
    if table is None:
        return []
    kernels: dict = {}
    for row in csv.DictReader(io.StringIO(table)):
        if not row.get("Metric Name") or row.get("ID") is None:
            continue
        k = kernels.setdefault(row["ID"], {"name": row.get("Kernel Name", "")})
        raw = (row.get("Metric Value") or "").replace(",", "")
        try:
            value = float(raw)
        except ValueError:
            continue
        k[row["Metric Name"]] = value * _UNIT_SCALE.get((row.get("Metric Unit") or "").strip(), 1)
    return [kernels[i] for i in sorted(kernels, key=lambda s: int(s) if s.isdigit() else s)]


def ncu_measure(spec: RunSpec, q: np.ndarray, k: np.ndarray, v: np.ndarray, ncu: str,
                l2_start: str = "warm") -> list[dict]:
    """Profile one forward pass of spec under ncu (a child process running this module)."""
    return ncu_measure_many([spec], q, k, v, ncu, l2_start)[0]


def ncu_measure_many(specs: list[RunSpec], q: np.ndarray, k: np.ndarray, v: np.ndarray, ncu: str,
                     l2_start: str = "warm") -> list[list[dict]]:
    """Profile one forward pass of each spec (same inputs; a block grid's points) in ONE ncu child
    process, in order; returns each pass's kernels. A pass is assumed to launch the same number
    of kernels whatever its blocks (one for the flash kernels); a count that does not divide
    evenly is an error, not a guess."""
    settings = ncu_settings(l2_start)
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "inputs.npz", q=q, k=k, v=v)
        run = Path(tmp) / "run.json"
        run.write_text(json.dumps({"specs": [asdict(s) for s in specs], "inputs": str(Path(tmp) / "inputs.npz")}))
        cmd = [ncu, "--csv", "--print-units", "base", "--metrics", ",".join(NCU_METRICS), "--target-processes", "all",
               "--cache-control", settings["cache_control"], "--clock-control", settings["clock_control"],
               "--replay-mode", settings["replay_mode"], sys.executable, "-m", "hbmsim.kernels.profile", str(run)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        raise HbmsimError(f"profile: ncu failed (exit {proc.returncode}): "
                          + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:]))
    kernels = parse_ncu_csv(proc.stdout)
    if not kernels:
        raise HbmsimError("profile: ncu reported no kernels (is profiling permitted for this user? "
                          "see NVIDIA's ERR_NVGPUCTRPERM)")
    if len(kernels) % len(specs):
        raise HbmsimError(f"profile: ncu reported {len(kernels)} kernels for {len(specs)} passes: "
                          "cannot tell which pass launched which")
    per = len(kernels) // len(specs)
    return [kernels[i * per:(i + 1) * per] for i in range(len(specs))]


def smem_bytes(spec: RunSpec) -> int:
    """Dynamic shared memory one block of a tiled kernel takes: the kernel's own rule when its
    traits give one (`smem_bytes(spec)`), else the teaching kernel's KernelConfig."""
    rule = getattr(spec.traits, "smem_bytes", None)
    return int(rule(spec)) if callable(rule) else spec.kernel_config().smem_bytes


def ncu_fields(kernels: list[dict]) -> dict:
    """Totals over a run's kernels in the results schema: DRAM bytes, L2-side bytes, per-kernel list."""
    total = lambda metric: sum(k.get(metric, 0.0) for k in kernels)
    from_sm = {f"global_{op}_bytes_from_sm": f"lts__t_sectors_srcunit_tex_op_{op}.sum" for op in ("read", "write")}
    per_source = lambda k: {field: int(k[m] * L2_SECTOR_BYTES) for field, m in from_sm.items() if m in k}
    return {**per_source({m: total(m) for m in from_sm.values() if all(m in k for k in kernels)}),
            "hbm_read_bytes": int(total("dram__bytes_read.sum")),
            "hbm_write_bytes": int(total("dram__bytes_write.sum")),
            "global_read_bytes": int(total("lts__t_sectors_op_read.sum") * L2_SECTOR_BYTES),
            "global_write_bytes": int(total("lts__t_sectors_op_write.sum") * L2_SECTOR_BYTES),
            "ncu_time_s": total("gpu__time_duration.sum"),
            "kernels": [{"name": k["name"], "time_s": k.get("gpu__time_duration.sum"),
                         "hbm_read_bytes": int(k.get("dram__bytes_read.sum", 0)),
                         "hbm_write_bytes": int(k.get("dram__bytes_write.sum", 0)),
                         "global_read_bytes": int(k.get("lts__t_sectors_op_read.sum", 0) * L2_SECTOR_BYTES),
                         "global_write_bytes": int(k.get("lts__t_sectors_op_write.sum", 0) * L2_SECTOR_BYTES),
                         **per_source(k)}
                        for k in kernels]}


def measure_on_gpu(spec: RunSpec, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, warmup: int = 3,
                   repeats: int = 20, ncu: str | None = None, l2_start: str = "warm", device_inputs=None) -> dict:
    """Time spec on the GPU under `l2_start` (and profile it with ncu when given); returns the
    run's measured fields plus "o" (numpy) for the caller's numerics check. `device_inputs`:
    (q, k, v) already on the GPU (a grid's points share them)."""
    from .gpu import cupy_module
    cp = cupy_module()
    qd, kd, vd = device_inputs if device_inputs is not None else (cp.asarray(x) for x in (q, k, v))
    o, _ = forward(spec, qd, kd, vd)
    out = {"o": cp.asnumpy(o), "time_s": time_forward(spec, qd, kd, vd, warmup, repeats, l2_start),
           "l2_start": l2_start}
    if spec.traits.tiled:
        out["smem_bytes_per_block"] = smem_bytes(spec)
    if ncu:
        out.update(ncu_fields(ncu_measure(spec, q, k, v, ncu, l2_start)))
    return out


def _worker(run_json: str) -> int:
    """Under ncu: one forward pass per spec, in order, nothing else launched on the GPU (the
    inputs are host-to-device copies, which ncu does not profile)."""
    from .gpu import cupy_module
    cp = cupy_module()
    run = json.loads(Path(run_json).read_text())
    specs = [RunSpec(**s) for s in run.get("specs") or [run["spec"]]]
    data = np.load(run["inputs"])
    q, k, v = (cp.asarray(data[n]) for n in ("q", "k", "v"))        # host-to-device copies, no kernels
    for spec in specs:
        mask = None
        if spec.causal and spec.traits.causal_mask_tensor:          # built on the host: no kernels
            i, j = np.arange(spec.seq_len_q)[:, None], np.arange(spec.seq_len_kv)[None, :]
            mask = cp.asarray(j <= i + (spec.seq_len_kv - spec.seq_len_q))
        forward(spec, q, k, v, mask)
        cp.cuda.Device().synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1]))
