"""`hbmsim run FILE`: simulate an experiment's configurations and print the table (runner.py runs
them, sweep.py in parallel or into a results log, report.py prints). Every output and every sweep
point is checked before the first simulation; what finished is kept through an error or Ctrl-C."""
from __future__ import annotations

import dataclasses

import json
import os
import sys

from hbmsim.simulator import HbmsimError

from .. import report
from ..experiment import load_experiment, resolve_experiment, sweep_size
from ..outputs import check_output_path, check_plot_output, write_text_atomic
from ..runner import estimated_wall_s, prepare, run_config, run_experiment, with_data
from .common import Interrupted, add_without, count, time_model, write_results

# A sweep larger than this (configurations, or estimated seconds of simulation) needs --yes.
CONFIRM_CONFIGS = 1000
CONFIRM_WALL_S = 3600.0


def add_parser(sub) -> None:
    r = sub.add_parser("run", help="run an experiment TOML (a path or a shipped experiment's name)")
    r.add_argument("file", help="experiment TOML: a path, or a shipped experiment's name (e.g. demo, gpt2-medium)")
    r.add_argument("--json", metavar="PATH|-", help="write {\"runs\": [...]} to PATH, or to stdout only with -")
    r.add_argument("--count-only", action="store_true", help="no data: counts and times only (in fast mode)")
    r.add_argument("--full", action="store_true",
                   help="no fast mode: count-only runs simulate every block and tile step too (fast mode, the "
                        "default: long inner loops run several tiles a step and steady launches are folded)")
    r.add_argument("--plot", metavar="PNG", help="plot traffic, footprint and time against the swept field (N "
                   "when N is swept), a line per program, variant and block")
    r.add_argument("--roofline", metavar="PNG", help="plot every kernel on the machine's roofline")
    r.add_argument("--timeline", metavar="JSON", help="write the run as Chrome trace events (Perfetto): a track per "
                   "SM with its blocks, loads and compute, the kernels, and the DRAM bandwidth in use")
    r.add_argument("--trace", type=count(0), default=0, metavar="N",
                   help="print the first N simulator events of each run")
    r.add_argument("--yes", action="store_true",
                   help=f"start a sweep of more than {CONFIRM_CONFIGS} configurations or over "
                        f"{fmt_duration(CONFIRM_WALL_S)} of estimated simulation")
    r.add_argument("--quiet", action="store_true", help="no progress on stderr (also off when stderr is not a "
                   "terminal)")
    r.add_argument("--workers", type=count(1), metavar="N",
                   help="run the configurations in parallel on N local worker processes (a Dask LocalCluster)")
    r.add_argument("--scheduler", metavar="ADDRESS", help="run them on an existing Dask cluster (tcp://HOST:PORT)")
    r.add_argument("--results", metavar="FILE.jsonl",
                   help="append each configuration's results to FILE.jsonl as it finishes (nothing is lost)")
    r.add_argument("--resume", action="store_true", help="continue --results FILE: skip the configurations it holds")
    r.add_argument("--l2-start", choices=("cold", "warm"), default="cold",
                   help="the L2's contents when each run starts: cold (empty, the default) or warm (the inputs "
                        "resident, as the copy that made them leaves them; hbmsim profile --l2 warm measures that)")
    add_without(r)
    r.set_defaults(func=cmd_run)


def fmt_duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def cmd_run(args) -> int:
    check_outputs(args)
    time_model(args)              # --without and --host-spec, checked before any work
    exp, estimate = checked_experiment(args)
    out = sys.stderr if args.json == "-" else sys.stdout     # with --json -, stdout carries only the JSON
    if args.trace:
        print_traces(args, exp, out)
    results, timelines = simulate_all(args, exp, estimate)
    # Said after the run (and kept in each result's "notes"), so that a failing run still ends
    # in one line.
    for note in dict.fromkeys(f"{cfg.where}: {n}" for cfg in exp.configs for n in cfg.notes):
        print(f"hbmsim: note: {note}", file=sys.stderr)
    write_figures(args, exp, results, timelines, out)
    return 0


def _parallel(args) -> bool:
    return args.workers is not None or args.scheduler is not None


def check_outputs(args) -> None:
    """Every output of the run (and --results/--resume), checked before any work."""
    if args.json and args.json != "-":
        check_output_path(args.json, "--json")
    if args.plot:
        check_plot_output(args.plot, "--plot")
    if args.roofline:
        check_plot_output(args.roofline, "--roofline")
    if args.timeline:
        check_output_path(args.timeline, "--timeline")
    if args.resume and not args.results:
        raise HbmsimError("--resume needs --results FILE.jsonl (the file to continue)")
    if args.results:
        if os.path.isdir(args.results):
            raise HbmsimError(f"--results {args.results}: is a folder, give a file")
        if os.path.exists(args.results) and not args.resume:
            raise HbmsimError(f"--results {args.results}: exists: pass --resume to continue it, or remove it")
        check_output_path(args.results, "--results")
    if _parallel(args) and args.timeline:
        raise HbmsimError("--timeline records configurations run here: not with --workers or --scheduler")


def checked_experiment(args):
    """(the experiment, every configuration checked, and its estimate of wall seconds per
    configuration): a sweep too large for its size or estimated time needs --yes, and long work
    says how long before it starts."""
    size = sweep_size(args.file)
    if size > CONFIRM_CONFIGS and not args.yes:
        raise HbmsimError(f"{resolve_experiment(args.file)}: {size:,} configurations (more than {CONFIRM_CONFIGS:,}): "
                          "pass --yes to simulate them all, or narrow the [sweep]")
    exp = prepare(load_experiment(args.file))            # every point's SRAM fit and HBM footprint
    if args.l2_start != "cold":
        exp = dataclasses.replace(exp, configs=[dataclasses.replace(c, l2_start=args.l2_start) for c in exp.configs])
    n = len(exp.configs)

    def estimate(cfg):     # fast mode for what runs count-only, unless --full
        return estimated_wall_s(cfg, fast=not args.full and not with_data(cfg, args.count_only))

    estimate_s = sum(estimate(cfg) for cfg in exp.configs)
    if estimate_s > CONFIRM_WALL_S and not args.yes:
        raise HbmsimError(f"{exp.path}: {n:,} configuration(s), estimated {fmt_duration(estimate_s)} of simulation "
                          f"on this machine (more than {fmt_duration(CONFIRM_WALL_S)}): pass --yes to start")
    if estimate_s > 2 and not args.quiet:             # long work says so before it starts
        fast = not args.full and any(not with_data(cfg, args.count_only) for cfg in exp.configs)
        print(f"{exp.name}: {n} configuration(s), roughly {fmt_duration(estimate_s)} of simulation (estimated"
              + ("; fast mode may fold it to much less)" if fast else ")"),
              file=sys.stderr)
    return exp, estimate


def tracer(limit: int, out):
    """A simulator trace callback printing its first `limit` events to `out`."""
    state = {"n": 0}

    def trace(now_s, sm, kernel, block, what):
        if state["n"] < limit:
            print(f"{now_s * 1e6:10.3f} us  SM{sm:<3d} {kernel} block {block}: {what}", file=out)
        state["n"] += 1
    return trace


def print_traces(args, exp, out) -> None:
    for cfg in exp.configs:
        print(f"# trace of {cfg.run.algorithm} (first {args.trace} events, predicted times)", file=out)
        run_config(cfg, count_only=True, trace=tracer(args.trace, out), model=time_model(args))


def simulate_all(args, exp, estimate) -> tuple[list, list | None]:
    """(results, timelines or None): every configuration simulated here, or in parallel / into a
    results log; the results file written as they finish, the table printed at the end (also
    when an error or Ctrl-C stops the run, before it is raised again as one line)."""
    from ..progress import RunProgress, wanted
    n = len(exp.configs)
    to_file = bool(args.json) and args.json != "-"
    results: list[dict] = []
    timelines: list | None = [] if args.timeline else None
    progress = RunProgress(n, estimate, enabled=wanted(args.quiet))    # counts what finished

    def save(rs):
        if to_file:
            write_results(rs, args.json, exp.name, complete=False, quiet=True)

    def finish(complete: bool, stopped: str | None = None):
        print_results(args, exp, results, complete, stopped, progress.finished)

    kept = f"; the finished ones are in {args.json}" if to_file else ""
    try:
        try:
            _simulate(args, exp, results, save, progress, timelines)
        finally:
            progress.close()
    except KeyboardInterrupt:
        finish(False, f"interrupted after {progress.finished} of {n} configurations")
        raise Interrupted(f"interrupted after {progress.finished} of {n} configurations" + kept) from None
    except HbmsimError as err:
        finish(False, f"error after {progress.finished} of {n} configurations: {err}")
        raise HbmsimError(f"{err} (stopped after {progress.finished} of {n} configurations{kept})") from None
    finish(True)
    return results, timelines


def _simulate(args, exp, results: list, save, progress, timelines) -> None:
    if _parallel(args) or args.results:
        from ..sweep import ResultsLog, run_sweep
        run_sweep(exp, args.count_only, time_model(args), args.workers, args.scheduler,
                  ResultsLog(args.results) if args.results else None, results, save, progress.done,
                  fast=not args.full)
    else:
        run_experiment(exp, count_only=args.count_only, progress=progress, results=results, on_result=save,
                       model=time_model(args), timelines=timelines, fast=not args.full)


def print_results(args, exp, results: list, complete: bool, stopped: str | None, finished: int) -> None:
    """The results file (complete or not) and, unless stdout carries the JSON, the table."""
    if args.json:
        write_results(results, args.json, exp.name, complete, stopped, quiet=not complete)
    if args.json == "-" or not results:
        return
    status = "" if complete else f" (partial: {finished} of {len(exp.configs)} configurations finished)"
    print(f"{exp.name} on {exp.gpu.name} (all numbers predicted by hbmsim, not measured; time model: "
          f"{time_model(args).describe()}){status}")
    print(report.table(results))
    folded = report.fast_note(results)
    if folded:
        print(folded)
    text = report.ratios(results)
    if text:
        print(text)


def write_figures(args, exp, results: list, timelines: list | None, out) -> None:
    """--plot, --roofline and --timeline, after the run."""
    if args.plot:
        swept = list(dict.fromkeys(k for cfg in exp.configs for k in cfg.point))    # x-axis: the swept field
        png = report.plot_sweep(results, args.plot, f"{exp.name} on {exp.gpu.name} (predicted)", swept)
        print(f"wrote {png}", file=out)
    if args.roofline:
        from .. import roofline
        png = roofline.plot(results, exp.gpu, args.roofline, f"Roofline of {exp.name} on {exp.gpu.name}")
        print(f"wrote {png}", file=out)
    if args.timeline:
        write_text_atomic(args.timeline, timeline_json(timelines, exp.name))
        print(f"wrote {args.timeline} (Chrome trace events: open in ui.perfetto.dev or chrome://tracing)", file=out)


def timeline_json(timelines: list, name: str) -> str:
    """Every configuration's timeline in one Chrome trace: configuration i's tracks are processes
    10 i + 1..3 (SMs, kernels, HBM), each named after its configuration."""
    events, other = [], {"source": "predicted by hbmsim (simulated, not measured)",
                         "time_unit": "microseconds of predicted time; every configuration starts at 0",
                         "configurations": []}
    for i, (cfg, tl) in enumerate(timelines):
        doc = tl.to_chrome(cfg.gpu.sm_count, name)
        wl = cfg.workload
        label = (f"{cfg.run.algorithm} {'+'.join(cfg.run.passes)} N={wl.seq_len_q}x{wl.seq_len_kv} d={wl.head_dim} "
                 f"B*H={wl.groups}")
        for e in doc["traceEvents"]:
            e = dict(e, pid=10 * i + e["pid"])
            if e["ph"] == "M" and e["name"] == "process_name":
                e["args"] = {"name": f"config {i + 1} ({label}): {e['args']['name']}"}
            events.append(e)
        other["configurations"].append({"label": label, "blocks_drawn": doc["otherData"]["blocks_drawn"]})
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}) + "\n"
