"""A two-number what-if for the FlashAttention-3 paper's forward times (docs/validation.md, "The
FlashAttention-3 set"): each run's time if the tensor cores ran every wgmma at the preset's spec
peak and the exps ran on the special-function units with nothing overlapping the two, against the
**published** time. No simulation: the FLOPs and exps of the tiles each query block visits (the
kernel's own tiles, flash3_spec.fa3_forward_tiles), the GPU's rates at the run's clock.

    python scripts/fa3_serial_bound.py [MEASURED_FILE]      (default: the shipped fa3-paper-h100)

Printed per run: the bound's error (bound - published) / published, and per family (FA3 fp16 or
FP8, causal or not) the median and worst |error|. A bad file is one line, exit 2.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys

from hbmsim.algorithms.flash3_spec import fa3_forward_tiles
from hbmsim.scenarios.compare import load
from hbmsim.scenarios.experiment import resolve_hardware
from hbmsim.scenarios.published import resolve_measured
from hbmsim.simulator import HbmsimError


def visited(n: int, d: int, block_q: int, block_kv: int, causal: bool) -> tuple[int, int, list]:
    """(FLOPs, exps, per-block FLOPs) of one batch-head's forward: query block i (its rows r) runs
    every K/V tile up to its causal end (all N without a mask), whole tiles as the kernel does:
    S = Q K^T and O += P V are 2 r c d FLOPs each (c: the keys of the tiles it visits), one exp a
    score."""
    flops = exps = 0
    blocks = []
    for i in range(math.ceil(n / block_q)):
        r1 = min(n, (i + 1) * block_q)
        rows = r1 - i * block_q
        cols = min(n, math.ceil((r1 if causal else n) / block_kv) * block_kv)
        flops += 4 * rows * cols * d
        exps += rows * cols
        blocks.append(4 * rows * cols * d)
    return flops, exps, blocks


def bound_s(run: dict) -> float:
    """The run's time with wgmma at the spec peak and the exps after it, never under it; without
    a mask, times the last wave's share (ceil(grid / SMs) / (grid / SMs)): blocks alike, one an SM."""
    gpu = resolve_hardware(run["hardware"])
    if run.get("hardware_overrides"):
        gpu = gpu.with_overrides(run["hardware_overrides"])
    w = run["workload"]
    d, n, causal = w["head_dim"], w["seq_len"], w.get("causal", False)
    fp8 = run.get("variant") == "fp8"
    block_q, block_kv, _, _ = fa3_forward_tiles(d, causal, fp8)
    flops, exps, _ = visited(n, d, block_q, block_kv, causal)
    groups = w["batch"] * w["heads"]
    peak = gpu.fp8_matmul_flops_per_s if fp8 else gpu.matmul_flops_per_s
    exp_per_s = gpu.sfu_ops_per_clk_per_sm * gpu.sm_count * gpu.clock_hz
    grid = groups * math.ceil(n / block_q)
    waves = 1.0 if causal else math.ceil(grid / gpu.sm_count) / (grid / gpu.sm_count)
    return (groups * flops / peak + groups * exps / exp_per_s) * waves


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", nargs="?", default="fa3-paper-h100", help="a measured file or a shipped set's name")
    args = ap.parse_args(argv)
    try:
        path = resolve_measured(args.file)
        runs = [r for r in load(path).runs if r.get("algorithm") == "flash3" and r.get("pass") == "forward"]
        if not runs:
            raise HbmsimError(f"{path}: no flash3 forward run to bound")
        families: dict = {}
        print(f"{'run':44s} {'published ms':>12s} {'bound ms':>9s} {'error':>7s}")
        for r in runs:
            w = r["workload"]
            fam = f"{r.get('variant', 'fa3-kernel')} {'causal' if w.get('causal') else 'no mask'}"
            b = bound_s(r)
            err = (b - r["time_s"]) / r["time_s"]
            families.setdefault(fam, []).append(err)
            label = f"{fam} d={w['head_dim']} B={w['batch']} H={w['heads']} N={w['seq_len']}"
            print(f"{label:44s} {r['time_s'] * 1e3:12.3f} {b * 1e3:9.3f} {err:+7.1%}")
    except HbmsimError as err:
        print(f"fa3_serial_bound: {err}", file=sys.stderr)
        return 2
    print("\nfamily                  n  median|e|  worst|e|  median e")
    for fam, errs in families.items():
        print(f"{fam:22s} {len(errs):2d} {statistics.median(map(abs, errs)):9.1%} {max(map(abs, errs)):9.1%} "
              f"{statistics.median(errs):+9.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
