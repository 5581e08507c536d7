"""The `hbmsim` command: demo, run, hardware, bench, and for the real kernel emulate, profile, compare.

User errors (bad scenario, block too big, bad shapes) print one line and exit 2.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys

import numpy as np

from hbmsim.simulator import HbmsimError, TimeModel, load_gpu

from . import report
from .experiment import (EXPERIMENTS_DIR, HARDWARE_DIR, load_experiment, preset_names, resolve_experiment,
                         resolve_hardware, sweep_size)
from .measure import cmd_emulate, cmd_microbench, cmd_profile, cmd_profile_library
from .outputs import check_output_dir, check_output_path, check_plot_output, write_text_atomic
from .runner import estimated_wall_s, prepare, run_config, run_experiment, stderr_progress, with_data

DEMO_EXPERIMENT = "demo"


def _results_doc(name: str, results: list[dict], complete: bool, stopped: str | None = None) -> str:
    doc = {"experiment": name, "complete": complete}
    if stopped:
        doc["stopped"] = stopped
    doc["runs"] = results
    return json.dumps(doc, indent=1) + "\n"


def _write_json(results: list[dict], dest: str, name: str = "", complete: bool = True, stopped: str | None = None,
                quiet: bool = False) -> None:
    text = _results_doc(name, results, complete, stopped)
    if dest == "-":
        sys.stdout.write(text)
    else:
        write_text_atomic(dest, text)
        if not quiet:
            print(f"wrote {dest}", file=sys.stderr)


def _tracer(limit: int, out):
    state = {"n": 0}

    def trace(now_s, sm, kernel, block, what):
        if state["n"] < limit:
            print(f"{now_s * 1e6:10.3f} us  SM{sm:<3d} {kernel} block {block}: {what}", file=out)
        state["n"] += 1
    return trace


# A sweep larger than this (configurations, or estimated seconds of simulation) needs --yes.
CONFIRM_CONFIGS = 1000
CONFIRM_WALL_S = 3600.0


def _fmt_duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def cmd_run(args) -> int:
    to_stdout = args.json == "-"
    if args.json and not to_stdout:                       # every output checked before any work
        check_output_path(args.json, "--json")
    if args.plot:
        check_plot_output(args.plot, "--plot")
    if args.roofline:
        check_plot_output(args.roofline, "--roofline")
    if args.timeline:
        check_output_path(args.timeline, "--timeline")
    parallel = args.workers is not None or args.scheduler is not None
    if args.resume and not args.results:
        raise HbmsimError("--resume needs --results FILE.jsonl (the file to continue)")
    if args.results:
        if os.path.isdir(args.results):
            raise HbmsimError(f"--results {args.results}: is a folder, give a file")
        if os.path.exists(args.results) and not args.resume:
            raise HbmsimError(f"--results {args.results}: exists: pass --resume to continue it, or remove it")
        check_output_path(args.results, "--results")
    if parallel and args.timeline:
        raise HbmsimError("--timeline records configurations run here: not with --workers or --scheduler")
    size = sweep_size(args.file)
    if size > CONFIRM_CONFIGS and not args.yes:
        raise HbmsimError(f"{resolve_experiment(args.file)}: {size:,} configurations (more than {CONFIRM_CONFIGS:,}): "
                          "pass --yes to simulate them all, or narrow the [sweep]")
    exp = prepare(load_experiment(args.file))            # every point's SRAM fit and HBM footprint
    n = len(exp.configs)
    def estimate(cfg):     # fast mode for what runs count-only, unless --full
        return estimated_wall_s(cfg, fast=not args.full and not with_data(cfg, args.count_only))

    estimate_s = sum(estimate(cfg) for cfg in exp.configs)
    if estimate_s > CONFIRM_WALL_S and not args.yes:
        raise HbmsimError(f"{exp.path}: {n:,} configuration(s), estimated {_fmt_duration(estimate_s)} of simulation "
                          f"on this machine (more than {_fmt_duration(CONFIRM_WALL_S)}): pass --yes to start")
    if estimate_s > 2 and not args.quiet:             # long work says so before it starts
        fast = not args.full and any(not with_data(cfg, args.count_only) for cfg in exp.configs)
        print(f"{exp.name}: {n} configuration(s), roughly {_fmt_duration(estimate_s)} of simulation (estimated"
              + ("; fast mode may fold it to much less)" if fast else ")"),
              file=sys.stderr)
    out = sys.stderr if to_stdout else sys.stdout     # with --json -, stdout carries only the JSON
    if args.trace:
        for cfg in exp.configs:
            print(f"# trace of {cfg.run.algorithm} (first {args.trace} events, predicted times)", file=out)
            run_config(cfg, count_only=True, trace=_tracer(args.trace, out), model=time_model(args))
    results: list[dict] = []
    timelines: list | None = [] if args.timeline else None
    from .progress import RunProgress, wanted
    progress = RunProgress(n, estimate, enabled=wanted(args.quiet))    # counts what finished

    def save(rs):
        if args.json and not to_stdout:
            _write_json(rs, args.json, exp.name, complete=False, quiet=True)

    def finish(complete: bool, stopped: str | None = None):
        if args.json:
            _write_json(results, args.json, exp.name, complete, stopped, quiet=not complete)
        if not to_stdout and results:
            status = "" if complete else f" (partial: {progress.finished} of {n} configurations finished)"
            print(f"{exp.name} on {exp.gpu.name} (all numbers predicted by hbmsim, not measured; time model: "
                  f"{time_model(args).describe()}){status}")
            print(report.table(results))
            folded = report.fast_note(results)
            if folded:
                print(folded)
            text = report.ratios(results)
            if text:
                print(text)

    try:
        try:
            if parallel or args.results:
                from .sweep import ResultsLog, run_sweep
                run_sweep(exp, args.count_only, time_model(args), args.workers, args.scheduler,
                          ResultsLog(args.results) if args.results else None, results, save, progress.done,
                          fast=not args.full)
            else:
                run_experiment(exp, count_only=args.count_only, progress=progress, results=results, on_result=save,
                               model=time_model(args), timelines=timelines, fast=not args.full)
        finally:
            progress.close()
    except KeyboardInterrupt:
        finish(False, f"interrupted after {progress.finished} of {n} configurations")
        raise Interrupted(f"interrupted after {progress.finished} of {n} configurations"
                          + (f"; the finished ones are in {args.json}"
                             if args.json and not to_stdout else "")) from None
    except HbmsimError as err:
        finish(False, f"error after {progress.finished} of {n} configurations: {err}")
        raise HbmsimError(f"{err} (stopped after {progress.finished} of {n} configurations"
                          + (f"; the finished ones are in {args.json})"
                             if args.json and not to_stdout else ")")) from None
    finish(True)
    # Said after the run (and kept in each result's "notes"), so that a failing run still ends
    # in one line.
    for note in dict.fromkeys(f"{cfg.where}: {n}" for cfg in exp.configs for n in cfg.notes):
        print(f"hbmsim: note: {note}", file=sys.stderr)
    if args.plot:
        png = report.plot_vs_seq_len(results, args.plot, f"{exp.name} on {exp.gpu.name} (predicted)")
        print(f"wrote {png}", file=out)
    if args.roofline:
        from . import roofline
        png = roofline.plot(results, exp.gpu, args.roofline, f"Roofline of {exp.name} on {exp.gpu.name}")
        print(f"wrote {png}", file=out)
    if args.timeline:
        write_text_atomic(args.timeline, timeline_json(timelines, exp.name))
        print(f"wrote {args.timeline} (Chrome trace events: open in ui.perfetto.dev or chrome://tracing)", file=out)
    return 0


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


class Interrupted(Exception):
    """Ctrl-C during a run, after what finished was saved: one line, exit 130."""


def seed_example() -> str:
    """The 4x4 worked example: every program must give the same O as the float64 reference."""
    from hbmsim.algorithms import registry
    from hbmsim.algorithms.reference import attention_forward
    from hbmsim.algorithms.workload import AttentionData, Workload
    from hbmsim.simulator import simulate

    q = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]], float)
    k = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1]], float)
    v = np.arange(1, 17, dtype=float).reshape(4, 4)
    wl = Workload(1, 1, 4, 4, 4, dtype="fp32", scale=1.0)
    data = lambda: AttentionData(q[None, None].copy(), k[None, None].copy(), v[None, None].copy())
    o_ref, _ = attention_forward(wl, data())
    gpu = load_gpu(HARDWARE_DIR / "a100-sxm4-40gb.toml")
    lines = ["Seed example (Q, K 4x4, V = 1..16, scale 1, blocks 2x2): O through the simulator",
             np.array2string(o_ref[0, 0], precision=2)]
    for spec in registry.algorithms():
        mapping, _ = spec.resolved(gpu, wl, spec.uniform(2), False)     # every block / tile 2 wide
        prog = spec.build(wl, mapping, data(), False)
        o = simulate(gpu, prog).outputs["O"][0]
        lines.append(f"  {prog.name:17s} max |O - reference| = {np.max(np.abs(o - o_ref[0, 0])):.1e}")
    return "\n".join(lines)


def cmd_demo(args) -> int:
    out = check_output_dir(args.out, "--out")
    exp = prepare(load_experiment(EXPERIMENTS_DIR / f"{DEMO_EXPERIMENT}.toml"))
    print(seed_example())
    print()
    print(f"Standard vs flash attention forward on {exp.gpu.name}, count-only (numbers predicted, not measured):")
    results = run_experiment(exp, count_only=True, progress=stderr_progress)
    print(report.table(results))
    print(report.ratios(results))
    _write_json(results, str(out / "demo.json"), exp.name)
    png = report.plot_vs_seq_len(results, out / "demo.png",
                                 f"Attention forward on {exp.gpu.name}: predicted by hbmsim (simulated, not measured)")
    from . import roofline
    roof = roofline.plot(results, exp.gpu, out / "roofline.png", f"Roofline: attention forward on {exp.gpu.name}")
    print(f"\nWrote {png}, {roof.name} and {out / 'demo.json'} (folder: {out.resolve()})")
    return 0


def cmd_explain(args) -> int:
    from . import explain as X
    opts = dict(scale=args.scale, causal=args.causal, block_q=args.block_q, block_kv=args.block_kv,
                dtype=args.dtype)
    if args.inputs and args.random:
        raise HbmsimError("explain: give --inputs FILE or --random NQ NKV D, not both")
    if args.inputs:
        ex = X.load_example(args.inputs, **opts)
    elif args.random:
        ex = X.random_example(*args.random, args.seed, **opts)
    else:
        ex = X.default_example(**opts)
    nq, nkv, d = ex.q.shape[0], ex.k.shape[0], ex.q.shape[1]
    if max(nq, nkv) > X.MAX_ROWS or d > X.MAX_HEAD_DIM:
        raise HbmsimError(f"explain: {nq} x {nkv} with head dim {d} is too big to print (at most {X.MAX_ROWS} rows "
                          f"and head dim {X.MAX_HEAD_DIM}); `hbmsim run` simulates big workloads")
    for name, value, n in (("--block-q", args.block_q, ex.q.shape[0]), ("--block-kv", args.block_kv, ex.k.shape[0])):
        if value > n:
            raise HbmsimError(f"explain: {name} = {value} is longer than the sequence ({n} rows)")
    print(X.explain(ex, resolve_hardware(args.hardware)))
    return 0


def check_plot_and_json(args) -> None:
    """A command's --plot and --json outputs, checked before any work."""
    if args.plot:
        check_plot_output(args.plot, "--plot")
    if args.json:
        check_output_path(args.json, "--json")


def cmd_blockmap(args) -> int:
    from . import blockmap
    from .experiment import make_workload
    check_plot_and_json(args)
    try:
        sizes = tuple(int(x) for x in args.sizes.split(","))
    except ValueError:
        raise HbmsimError(f"blockmap: --sizes = {args.sizes!r} must be whole numbers separated by commas") from None
    if not sizes or min(sizes) < 1:
        raise HbmsimError(f"blockmap: --sizes = {args.sizes!r} must be whole numbers >= 1")
    gpu = resolve_hardware(args.hardware)
    wl = make_workload("blockmap", {"batch": args.batch, "heads": args.heads, "seq_len": args.seq_len,
                                    "head_dim": args.head_dim, "dtype": args.dtype, "causal": args.causal})
    passes = ("forward", "backward") if args.training else ("forward",)
    cells = blockmap.block_map(gpu, wl, args.algorithm, sizes, passes, progress=not args.quiet)
    what = f"{args.algorithm} {'+'.join(passes)}, B={args.batch} H={args.heads} N={args.seq_len} d={args.head_dim}"
    print(f"{what} on {gpu.name} (predicted by hbmsim, not measured)")
    print(blockmap.table(cells))
    if args.json:
        write_text_atomic(args.json, json.dumps({"source": "predicted", "hardware": gpu.name, "workload": what,
                                                 "cells": [vars(c) for c in cells]}, indent=1) + "\n")
    if args.plot:
        print(f"wrote {blockmap.plot(cells, args.plot, f'Block sizes: {what} on {gpu.name}')}", file=sys.stderr)
    return 0


def cmd_hardware(args) -> int:
    if args.name:
        gpu = resolve_hardware(args.name)
        for key, value in gpu.summary().items():
            print(f"{key:26s} {value!s:>18s}   {gpu.source.get(key, '(no source given)')}")
        return 0
    print(f"{'preset':18s} {'SMs':>4s} {'clock':>9s} {'HBM':>10s} {'SRAM/SM':>9s} {'L2':>8s} {'tensor':>12s}")
    for name in preset_names():
        g = load_gpu(HARDWARE_DIR / f"{name}.toml")
        print(f"{name:18s} {g.sm_count:4d} {g.clock_hz / 1e9:6.2f} GHz {g.hbm_bytes_per_s / 1e12:6.3f} TB/s "
              f"{g.sram_bytes_per_sm / 1024:6.0f} KiB {g.l2_bytes / 2**20:5.0f} MiB "
              f"{g.matmul_flops_per_s / 1e12:7.0f} TFLOP/s")
    return 0


def cmd_anomalies(args) -> int:
    from .anomalies import measure
    print(json.dumps(measure(resolve_hardware(args.hardware), args.trials, args.seed), indent=1))
    return 0


def cmd_bench(args) -> int:
    from .bench import bench
    if args.json:
        check_output_path(args.json, "--json")
    result = bench(args.experiment, mode=args.mode, instructions=args.instructions)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        write_text_atomic(args.json, text + "\n")
    return 0


def cmd_compare(args) -> int:
    from .compare import compare_files
    if args.plot:
        check_plot_output(args.plot, "--plot")
    print(compare_files(args.predicted, args.measured, args.plot))
    return 0


# How validate's plot labels its y axis, by the measured files' "source"
MEASUREMENT_KINDS = {"published": "published measurement", "measured": "measured (this project's runs on a GPU)"}


def cmd_validate(args) -> int:
    from . import validate as V
    from .published import measured_names
    check_plot_and_json(args)
    refs = args.files or measured_names()
    model = time_model(args)
    points: list = []
    try:
        V.validate(refs, args.only, args.max_seq_len, None if args.quiet else V.stderr_progress, points,
                   model=model, ablation=args.ablation, fast=args.fast)
    except KeyboardInterrupt:
        if points:
            print(V.report(points, refs, model) + f"\n(partial: interrupted after {len(points)} run(s))")
        if args.json and points:
            write_text_atomic(args.json, V.to_json(points, complete=False, model=model))
        raise Interrupted(f"validate interrupted after {len(points)} run(s)") from None
    print(V.report(points, refs, model))
    if args.json:
        write_text_atomic(args.json, V.to_json(points, complete=True, model=model))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        from .compare import load
        from .published import resolve_measured
        files = [load(resolve_measured(r)) for r in refs]
        kind = " / ".join(dict.fromkeys(MEASUREMENT_KINDS.get(f.source, f.source) for f in files))
        source = "; ".join(str(f.provenance.get("short") or f"{r}: {f.provenance.get('gpu', '')}")
                           for r, f in zip(refs, files))
        print(f"wrote {V.plot(points, args.plot, kind + ': ' + source, model, kind)}", file=sys.stderr)
    return 0


def time_model(args) -> TimeModel:
    """The time model with the effects named by --without switched off."""
    return TimeModel().off(*(args.without or ()))


def add_without(parser) -> None:
    parser.add_argument("--without", action="append", choices=TimeModel.effects(), metavar="EFFECT",
                        help="switch an effect of the time model off (repeatable): "
                             + ", ".join(TimeModel.effects()))


class Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors (and exit code 2)."""

    def error(self, message):
        print(f"hbmsim: error: {self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def count(minimum: int):
    """An argparse type: a whole number >= minimum, named in the error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="hbmsim", description="Simulate attention on a GPU memory hierarchy.")
    p.add_argument("--version", action="version", version=f"hbmsim {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="standard vs flash attention on the A100 preset: table + figure")
    d.add_argument("--out", default="hbmsim-demo", help="folder for demo.png and demo.json (default: hbmsim-demo)")
    d.set_defaults(func=cmd_demo)
    r = sub.add_parser("run", help="run an experiment TOML (a path or a shipped experiment's name)")
    r.add_argument("file", help="experiment TOML: a path, or a shipped experiment's name (e.g. demo, gpt2-medium)")
    r.add_argument("--json", metavar="PATH|-", help="write {\"runs\": [...]} to PATH, or to stdout only with -")
    r.add_argument("--count-only", action="store_true", help="no data: counts and times only (in fast mode)")
    r.add_argument("--full", action="store_true",
                   help="no fast mode: count-only runs simulate every block and tile step too (fast mode, the "
                        "default: long inner loops run several tiles a step and steady launches are folded)")
    r.add_argument("--plot", metavar="PNG", help="plot traffic, footprint and time against sequence length")
    r.add_argument("--roofline", metavar="PNG", help="plot every kernel on the machine's roofline")
    r.add_argument("--timeline", metavar="JSON", help="write the run as Chrome trace events (Perfetto): a track per "
                   "SM with its blocks, loads and compute, the kernels, and the DRAM bandwidth in use")
    r.add_argument("--trace", type=count(0), default=0, metavar="N",
                   help="print the first N simulator events of each run")
    r.add_argument("--yes", action="store_true",
                   help=f"start a sweep of more than {CONFIRM_CONFIGS} configurations or over "
                        f"{_fmt_duration(CONFIRM_WALL_S)} of estimated simulation")
    r.add_argument("--quiet", action="store_true", help="no progress on stderr (also off when stderr is not a "
                   "terminal)")
    r.add_argument("--workers", type=count(1), metavar="N",
                   help="run the configurations in parallel on N local worker processes (a Dask LocalCluster)")
    r.add_argument("--scheduler", metavar="ADDRESS", help="run them on an existing Dask cluster (tcp://HOST:PORT)")
    r.add_argument("--results", metavar="FILE.jsonl",
                   help="append each configuration's results to FILE.jsonl as it finishes (nothing is lost)")
    r.add_argument("--resume", action="store_true", help="continue --results FILE: skip the configurations it holds")
    add_without(r)
    r.set_defaults(func=cmd_run)
    x = sub.add_parser("explain", help="walk through standard and flash attention on a small example, "
                       "tile by tile, with the numbers the programs compute")
    x.add_argument("--inputs", metavar="FILE", help="JSON (nested lists) or .npz with Q, K, V and optionally dO")
    x.add_argument("--random", nargs=3, type=count(1), metavar=("NQ", "NKV", "D"),
                   help="a random example of this size (values rounded to 2 decimals)")
    x.add_argument("--seed", type=count(0), default=0, help="seed of --random (default 0)")
    x.add_argument("--block-q", type=count(1), default=2, help="query block (default 2)")
    x.add_argument("--block-kv", type=count(1), default=2, help="key/value block (default 2)")
    x.add_argument("--scale", type=float, default=1.0, help="softmax scale (default 1)")
    x.add_argument("--causal", action="store_true", help="causal mask")
    x.add_argument("--dtype", default="fp32", choices=("fp16", "bf16", "fp32"), help="storage dtype (bytes only)")
    x.add_argument("--hardware", default="a100-sxm4-40gb", help="preset or hardware TOML (default a100-sxm4-40gb)")
    x.set_defaults(func=cmd_explain)
    m = sub.add_parser("blockmap", help="DRAM bytes, L2-side bytes and predicted time over block_q x block_kv")
    m.add_argument("--algorithm", default="flash2", help="a flash program (default flash2)")
    m.add_argument("--hardware", default="a100-sxm4-40gb", help="preset or hardware TOML (default a100-sxm4-40gb)")
    m.add_argument("--batch", type=count(1), default=1, help="batch (default 1)")
    m.add_argument("--heads", type=count(1), default=16, help="heads (default 16)")
    m.add_argument("--seq-len", type=count(1), default=4096, help="sequence length, queries and keys (default 4096)")
    m.add_argument("--head-dim", type=count(1), default=64, help="head dim (default 64)")
    m.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"), help="storage dtype (default fp16)")
    m.add_argument("--causal", action="store_true", help="causal mask")
    m.add_argument("--training", action="store_true", help="forward and backward (default: forward)")
    m.add_argument("--sizes", default="16,32,64,128,256", help="block sizes to try for both axes")
    m.add_argument("--plot", metavar="PNG", help="three heatmaps: DRAM bytes, L2-side bytes, predicted time")
    m.add_argument("--json", metavar="PATH", help="write every cell to PATH")
    m.add_argument("--quiet", action="store_true", help="no progress on stderr")
    m.set_defaults(func=cmd_blockmap)
    h = sub.add_parser("hardware", help="list hardware presets, or show one with its sources")
    h.add_argument("name", nargs="?", help="a preset's name (see the list) or a hardware TOML file")
    h.set_defaults(func=cmd_hardware)
    b = sub.add_parser("bench", help="time the simulator on a GPT-2-medium-sized experiment vs bare SimPy")
    b.add_argument("--experiment", default="gpt2-medium", help="experiment to time (default: gpt2-medium)")
    b.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    b.add_argument("--mode", choices=("both", "fast", "full"), default="both",
                   help="fast mode (as hbmsim run), full simulation, or both (default)")
    b.add_argument("--instructions", action="store_true",
                   help="count instructions under valgrind's callgrind instead of timing (repeatable; minutes)")
    b.set_defaults(func=cmd_bench)
    a = sub.add_parser("anomalies", help="measure how often a bigger GPU is predicted slower (scheduling anomalies)")
    a.add_argument("--hardware", default="a100-sxm4-40gb", help="preset or hardware TOML (default: a100-sxm4-40gb)")
    a.add_argument("--trials", type=count(1), default=30, help="random configurations to try (default 30)")
    a.add_argument("--seed", type=count(0), default=1, help="seed of the random configurations (default 1)")
    a.set_defaults(func=cmd_anomalies)
    e = sub.add_parser("emulate", help="run the CUDA kernel's CPU emulation over an experiment: bytes per tensor")
    e.add_argument("experiment", help="experiment TOML (a path or a shipped experiment's name)")
    e.add_argument("--out", default="emulated.json", help="measurement file to write (default: emulated.json)")
    e.add_argument("--seed", type=count(0), default=0, help="seed of the random inputs")
    e.set_defaults(func=cmd_emulate)
    pr = sub.add_parser("profile", help="time the CUDA kernels on this machine's GPU (and count bytes with ncu)")
    pr.add_argument("experiment", help="experiment TOML (a path or a shipped experiment's name)")
    pr.add_argument("--out", default="measured.json", help="measurement file to write (default: measured.json)")
    pr.add_argument("--warmup", type=count(0), default=3, help="untimed runs before timing (default 3)")
    pr.add_argument("--repeats", type=count(1), default=20, help="timed runs; the median is kept (default 20)")
    pr.add_argument("--no-ncu", action="store_true", help="do not run Nsight Compute even if ncu is on the PATH")
    pr.add_argument("--seed", type=count(0), default=0, help="seed of the random inputs")
    pr.set_defaults(func=cmd_profile)
    pl = sub.add_parser("profile-library", help="time PyTorch's FA2 kernels and the FA2 paper's PyTorch baseline "
                        "on this GPU, forward and backward, kernel by kernel (a measured file for validate)")
    pl.add_argument("--out", default="library.json", help="measured file to write (default: library.json)")
    pl.add_argument("--impl", nargs="+", default=["fa2", "pytorch"], help="fa2 and/or pytorch (default both)")
    pl.add_argument("--head-dim", nargs="+", type=count(1), default=[64, 128], help="64 and/or 128 (default both)")
    pl.add_argument("--causal", nargs="+", choices=("false", "true"), default=["false", "true"],
                    help="without and/or with the causal mask (default both)")
    pl.add_argument("--max-seq-len", type=count(1), default=16384, help="skip the grid's longer sequences")
    pl.add_argument("--warmup", type=count(0), default=3, help="untimed runs before timing (default 3)")
    pl.add_argument("--repeats", type=count(1), default=30, help="timed runs; the mean is kept (default 30)")
    pl.set_defaults(func=cmd_profile_library)
    mb = sub.add_parser("microbench", help="measure mma.sync, exp2 (SFU) and DRAM rates on this GPU")
    mb.add_argument("--out", default="microbench.json", help="file to write (default: microbench.json)")
    mb.add_argument("--repeats", type=count(1), default=10, help="timed launches; the median is kept (default 10)")
    mb.set_defaults(func=cmd_microbench)
    c = sub.add_parser("compare", help="predicted (hbmsim run --json) vs measured (emulate/profile) per field")
    c.add_argument("predicted", help="results of `hbmsim run ... --json PATH` (source: predicted)")
    c.add_argument("measured", help="a measurement file: `hbmsim emulate` (emulated) or `hbmsim profile` (measured)")
    c.add_argument("--plot", metavar="PNG", help="draw predicted against measured traffic (log axes, y = x)")
    c.set_defaults(func=cmd_compare)
    v = sub.add_parser("validate", help="predicted time against published measurements (scenarios/measured/)")
    v.add_argument("files", nargs="*", metavar="FILE|NAME",
                   help="measured files (a path, or a shipped name such as fa2-paper-fwd-bwd; default: all shipped)")
    v.add_argument("--only", metavar="TEXT", help="keep runs whose implementation, program, variant, GPU or pass "
                   "contains TEXT (e.g. fa2, h100-sxm5-80gb)")
    v.add_argument("--max-seq-len", type=count(1), metavar="N", help="keep runs with a sequence length of at most N")
    v.add_argument("--plot", metavar="PNG", help="predicted against published time, log axes, y = x")
    v.add_argument("--json", metavar="PATH", help="write every point (predicted, measured, error) to PATH")
    v.add_argument("--quiet", action="store_true", help="no progress on stderr")
    v.add_argument("--ablation", action="store_true",
                   help="also simulate every run with each effect of the time model off in turn, and report "
                        "how much of the measured time each one explains (takes 7x as long)")
    v.add_argument("--fast", action="store_true",
                   help="simulate in fast mode (steady launches folded, within 1%% of the full simulation): "
                        "for sequences too long to simulate whole; each point says how much was simulated")
    add_without(v)
    v.set_defaults(func=cmd_validate)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("hbmsim")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        code = args.func(args)
        sys.stdout.flush()          # a closed pipe shows here, where it is handled, not at exit
        return code
    except HbmsimError as err:
        print(f"hbmsim: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if isinstance(err, BrokenPipeError) or err.errno == errno.EPIPE:
            # The reader went away (`hbmsim compare ... | head`): stop quietly, as Unix tools do.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 141
        print(f"hbmsim: error: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)   # a folder, unwritable
        return 2
    except Interrupted as err:
        print(f"hbmsim: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("hbmsim: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
