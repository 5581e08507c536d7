"""Audit fast mode's folding rule (simulator/fold.py) over validate's simulations, without the hours
a `validate --full` takes.

Each distinct simulation `hbmsim validate` would run (fast mode, training twins shared) runs with
fold.AUDIT set: every launch that declares a period is simulated whole, and where the rule fires,
the time its skip would have added (K units x the window's mean) is set against the time those
K units took in this run. That difference, over the kernel's time, is the fold's extrapolation
error; the tail a folded run simulates from another unit's state is not part of it (under a
tolerance loosened to 0.5%, that tail put a causal flash2 forward on 16 SMs 1% off: docs/speed.md),
so this is a lower bound of the fold's error, and `hbmsim validate --full` the whole measure.

    python scripts/fold_audit.py --workers 2           # every shipped set: about 15 min on 2 cores
    python scripts/fold_audit.py --only fa3 --max-seq-len 4096 --workers 2 --json audit.json

Prints each launch whose extrapolation is off by more than --show (default 0.3%) of its kernel
time, then: launches audited, how many the rule folds, the share of all audited kernel time it
skips (blocks skipped / grid, times the kernel's time), the worst error and how many are off by
more than 0.5%. This release, every shipped set: 517 launches, 125 folded, about 40% skipped,
worst +4.93% (FA3's backward at N = 1024: docs/speed.md), 1 off by more than 0.5%.
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor

from hbmsim.kernels.library import positive_int
from hbmsim.scenarios.experiment import Experiment
from hbmsim.scenarios.published import measured_names
from hbmsim.scenarios.runner import prepare, run_config
from hbmsim.scenarios.validate import plan, share_training_runs
from hbmsim.simulator import HbmsimError, TimeModel
from hbmsim.simulator import fold


def audit_one(cfg) -> list:
    """The audit entries of one simulation's launches, each labelled with where it comes from."""
    fold.AUDIT = []
    run_config(cfg, True, model=TimeModel(), fast=True, forward_alone="backward" in cfg.run.passes)
    entries, fold.AUDIT = fold.AUDIT, None
    return [dict(e, where=str(cfg.where), gpu=cfg.gpu.name) for e in entries]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="as validate --only")
    ap.add_argument("--max-seq-len", type=positive_int, help="as validate --max-seq-len")
    ap.add_argument("--workers", type=positive_int, default=1, help="local processes (default 1)")
    ap.add_argument("--show", type=float, default=0.003, help="print launches off by more than this fraction")
    ap.add_argument("--json", help="write every launch's entry to this file")
    args = ap.parse_args(argv)
    try:
        configs, jobs = plan(measured_names(), args.only, args.max_seq_len)
        exp = prepare(Experiment("validate", "validate", configs[0].gpu, configs))
        configs, _ = share_training_runs(exp.configs, jobs)
    except HbmsimError as err:
        print(f"fold_audit: {err}", file=sys.stderr)
        return 2
    entries = []
    try:              # Ctrl-C: what was audited so far is still summarised (and written)
        with ProcessPoolExecutor(args.workers) as pool:
            for i, found in enumerate(pool.map(audit_one, configs), 1):
                entries += found
                print(f"fold_audit: {i}/{len(configs)} simulations", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"fold_audit: interrupted; what follows covers the {len(entries)} launches audited so far",
              file=sys.stderr)
    folded = [e for e in entries if e["would_skip_blocks"]]
    for e in sorted(folded, key=lambda e: -abs(e["error_s"]) / e["kernel_s"]):
        rel = e["error_s"] / e["kernel_s"]
        if abs(rel) > args.show:
            print(f"{100 * rel:+7.2f}%  {e['kernel']:24s} {e['gpu']:16s} {e['where']}  "
                  f"(skip {e['would_skip_blocks']} of {e['grid']} blocks, {e['units']} units)")
    skipped_s = sum(e["kernel_s"] * e["would_skip_blocks"] / e["grid"] for e in folded)
    total_s = sum(e["kernel_s"] for e in entries)
    worst = max((abs(e["error_s"]) / e["kernel_s"] for e in folded), default=0.0)
    print(f"launches audited: {len(entries)}; folded by the rule: {len(folded)}, skipping about "
          f"{100 * skipped_s / max(total_s, 1e-30):.0f}% of the audited launches' kernel time; "
          f"worst extrapolation error {100 * worst:.2f}% of a kernel's time; "
          f"off by more than 0.5%: {sum(abs(e['error_s']) > 0.005 * e['kernel_s'] for e in folded)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(entries, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
