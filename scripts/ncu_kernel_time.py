"""Predicted kernel time against Nsight Compute's, kernel group by kernel group, under Nsight's own
conditions: each kernel from an empty L2 and the SM clock locked where Nsight locked it.

    python scripts/ncu_kernel_time.py [NCU_FILE ...]   (default: the H200's short and long causal FA2 runs)

The kernel rows `hbmsim validate` compares were timed at the boost clock with a warm L2; an Nsight
file's `gpu__time_duration` is at its locked base clock (`sm__cycles_elapsed.avg.per_second`,
1.3-1.6 GHz), each kernel after an L2 flush. Each run (an ncu file name, as scripts/ncu_dram_bytes.py
reads them; IMPL fa2, pytorch or cudnn, the last the flash3 variant cudnn-sm90) is simulated with the
preset's per-clock rates at the clock Nsight measured for the run's main kernel, as the FA3 paper
set's locked clock is (scenarios/published_fa3.py): the SM clock, the FP32 lanes, shared memory and
the L2 scale with it; the tensor cores' peak is the preset's at 1.83 GHz (the GH100 whitepaper's
132 SMs x 4096 FP16 FLOPs a clock x 1.83 GHz), so below that clock it scales too; DRAM keeps its
own clock. Printed per kernel group: Nsight's clock, the measured and predicted microseconds and
the error (predicted - measured) / measured. A bad file is one line, exit 2.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ncu_dram_bytes as nd  # noqa: E402  (the ncu files' names and loading, one place)

from hbmsim.scenarios.experiment import Experiment, resolve_hardware  # noqa: E402
from hbmsim.scenarios.kernel_rows import GROUPS  # noqa: E402
from hbmsim.scenarios.runner import build_program, prepare  # noqa: E402
from hbmsim.scenarios.validate import config_of  # noqa: E402
from hbmsim.simulator import HbmsimError, simulate  # noqa: E402

DEFAULT = ("h200-ncu-short", "h200-ncu-short-causal", "h200-ncu-causal-long")
TENSOR_PEAK_CLOCK_HZ = 1.83e9      # the clock the GH100 presets' tensor peaks are quoted at
IMPLS = {**nd.IMPLS, "cudnn": ("flash3", "cudnn-sm90")}


def at_clock(gpu, clock_hz: float) -> dict:
    """The hardware overrides of a run timed with the SM clock at `clock_hz`: every per-clock rate
    of the preset (FP32 lanes, shared memory, L2) at that clock, the tensor peaks at the lower of
    it and TENSOR_PEAK_CLOCK_HZ."""
    per_clock = clock_hz / gpu.clock_hz
    tensor = min(clock_hz, TENSOR_PEAK_CLOCK_HZ) / TENSOR_PEAK_CLOCK_HZ
    return {"clock_hz": clock_hz, "vector_flops_per_s": gpu.vector_flops_per_s * per_clock,
            "sram_bytes_per_s_per_sm": gpu.sram_bytes_per_s_per_sm * per_clock,
            "l2_bytes_per_s": gpu.l2_bytes_per_s * per_clock,
            "matmul_flops_per_s": gpu.matmul_flops_per_s * tensor,
            "fp8_matmul_flops_per_s": gpu.fp8_matmul_flops_per_s * tensor}


def run_of(file_name: str, hardware: str) -> dict | None:
    m = nd.NAME.match(file_name)
    if m is None or m["impl"] not in IMPLS:
        return None
    # the shape as ncu_dram_bytes reads it (any implementation's name), then this one's program
    run = nd.run_of(file_name.replace(f"-{m['impl']}-", "-fa2-", 1), hardware)
    run["algorithm"], run["variant"] = IMPLS[m["impl"]]
    return run


def config_at_clock(run: dict, where: str, clock_hz: float):
    """The run's configuration (validate's config_of) on its preset at `clock_hz` (at_clock), prepared."""
    gpu = resolve_hardware(run["hardware"])
    cfg = config_of(where, 0, {**run, "hardware_overrides": at_clock(gpu, clock_hz)})
    return prepare(Experiment("ncu", "ncu", cfg.gpu, [cfg])).configs[0]


def predicted_s(run: dict, where: str, clock_hz: float) -> dict:
    """{kernel name: seconds} of the run's pass, each kernel from an empty L2, at `clock_hz`."""
    cfg = config_at_clock(run, where, clock_hz)
    result = simulate(cfg.gpu, build_program(cfg, None, True), fold=True, flush_launches=True)
    out: dict = {}
    for k in result.kernels:
        if k.pass_name == run["ncu_pass"] and k.launched:
            out[k.name] = out.get(k.name, 0.0) + k.time_s
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", default=list(DEFAULT))
    a = ap.parse_args(argv)
    errors, simulated = [], {}
    try:
        for ref in a.files:
            path, gpu, runs = nd.load_ncu(ref)
            print(f"{Path(path).name} (measured: Nsight Compute's gpu__time_duration at its locked clock; "
                  "predicted: hbmsim at that clock, each kernel from an empty L2)")
            print(f"  {'run: kernel group':58s} {'clock GHz':>9s} {'measured us':>12s} {'predicted us':>13s}"
                  f" {'error':>7s}")
            for r in runs:
                run = run_of(r["file"], gpu)
                if run is None:
                    continue
                for g in GROUPS[(run["algorithm"], run["variant"])]:
                    rows = [k for k in r["kernels"] if re.search(g.measured, k["name"])]
                    if not rows:
                        continue
                    clock = rows[0]["sm__cycles_elapsed.avg.per_second"]
                    if (r["file"], clock) not in simulated:
                        simulated[r["file"], clock] = predicted_s(run, path, clock)
                    predicted = simulated[r["file"], clock]
                    p = sum(predicted.get(n, 0.0) for n in g.predicted)
                    m = sum(k["gpu__time_duration.sum"] for k in rows) * 1e-9        # ncu reports ns
                    errors.append((p - m) / m)
                    print(f"  {(r['file'] + ': ' + g.label)[:58]:58s} {clock / 1e9:9.3f} {m * 1e6:12.1f} "
                          f"{p * 1e6:13.1f} {errors[-1]:+7.1%}")
    except (HbmsimError, KeyError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if errors:
        print(f"{len(errors)} kernel groups: median |error| {statistics.median(map(abs, errors)):.1%}, "
              f"worst {max(map(abs, errors)):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
