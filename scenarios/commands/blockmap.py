"""`hbmsim blockmap`: one workload over a grid of block_q x block_kv (scenarios/blockmap.py), or,
with --measured FILE, a measured or emulated block-grid file against the prediction of the same
points (scenarios/blockmap_measured.py).

Everything is checked before the first simulation (the program has block sizes, the workload fits
HBM, some cell fits SRAM, the file's fields, the outputs can be written); the cells run in fast
mode unless --full, with a time estimate first when it is long and a progress bar on a terminal."""
from __future__ import annotations

import json
import sys

from hbmsim.simulator import HbmsimError

from ..experiment import resolve_hardware
from ..outputs import write_text_atomic
from .common import check_plot_and_json, count
from .run import CONFIRM_WALL_S, fmt_duration


def add_parser(sub) -> None:
    m = sub.add_parser("blockmap", help="DRAM bytes, L2-side bytes and predicted time over block_q x block_kv")
    m.add_argument("--algorithm", default="flash2",
                   help="a program with block_q x block_kv: flash1 or flash2 (default flash2)")
    m.add_argument("--hardware", help="preset or hardware TOML (default a100-sxm4-40gb; with --measured, the preset of "
                   "the GPU the file names)")
    m.add_argument("--batch", type=count(1), default=1, help="batch (default 1)")
    m.add_argument("--heads", type=count(1), default=16, help="heads (default 16)")
    m.add_argument("--seq-len", type=count(1), default=4096, help="sequence length, queries and keys (default 4096)")
    m.add_argument("--head-dim", type=count(1), default=64, help="head dim (default 64)")
    m.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"), help="storage dtype (default fp16)")
    m.add_argument("--causal", action="store_true", help="causal mask")
    m.add_argument("--training", action="store_true", help="forward and backward (default: forward)")
    m.add_argument("--sizes", default="16,32,64,128,256", help="block sizes to try for both axes")
    m.add_argument("--full", action="store_true",
                   help="no fast mode: simulate every block and tile step of every cell (fast mode, the default: "
                        "long inner loops run several tiles a step and steady launches are folded)")
    m.add_argument("--yes", action="store_true",
                   help=f"start a map estimated at over {fmt_duration(CONFIRM_WALL_S)} of simulation")
    m.add_argument("--plot", metavar="PNG", help="three heatmaps: DRAM bytes, L2-side bytes, predicted time")
    m.add_argument("--json", metavar="PATH", help="write every cell to PATH")
    m.add_argument("--measured", metavar="FILE",
                   help="a block-grid file from `hbmsim profile` (measured or --emulate): predicted and measured side "
                        "by side per workload, with Spearman's rank correlation and the regret of the predicted best "
                        "(the workload flags and --sizes are taken from the file)")
    m.add_argument("--quiet", action="store_true",
                   help="no estimate and no progress on stderr (progress is also off when stderr is not a terminal)")
    m.set_defaults(func=cmd_blockmap)


def parse_sizes(text: str) -> tuple[int, ...]:
    """--sizes: whole numbers >= 1 separated by commas."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise HbmsimError(f"blockmap: --sizes = {text!r} must be whole numbers separated by commas") from None
    if not sizes or min(sizes) < 1:
        raise HbmsimError(f"blockmap: --sizes = {text!r} must be whole numbers >= 1")
    return tuple(dict.fromkeys(sizes))


def cmd_blockmap(args) -> int:
    from .. import blockmap
    from ..experiment import make_workload
    from ..progress import RunProgress, wanted
    check_plot_and_json(args)
    if args.measured:
        return cmd_blockmap_measured(args)
    sizes = parse_sizes(args.sizes)
    blockmap.mappable(args.algorithm)
    gpu = resolve_hardware(args.hardware or "a100-sxm4-40gb")
    where = (f"blockmap --batch {args.batch} --heads {args.heads} --seq-len {args.seq_len} "
             f"--head-dim {args.head_dim} --dtype {args.dtype}")
    wl = make_workload(where, {"batch": args.batch, "heads": args.heads, "seq_len": args.seq_len,
                               "head_dim": args.head_dim, "dtype": args.dtype, "causal": args.causal})
    passes = ("forward", "backward") if args.training else ("forward",)
    planned = blockmap.plan(gpu, wl, args.algorithm, sizes, passes, where)
    fast = not args.full
    n = sum(not isinstance(c, blockmap.Cell) for c in planned)
    estimate_s = blockmap.estimate_s(planned, fast)
    bound = "at most " if fast else ""
    folds = "; fast mode folds steady launches, often to far less" if fast else ""
    if estimate_s > CONFIRM_WALL_S and not args.yes:
        raise HbmsimError(f"{where}: {n} cell(s) that fit, estimated {bound}{fmt_duration(estimate_s)} of simulation "
                          f"on this machine (more than {fmt_duration(CONFIRM_WALL_S)}{folds}): pass --yes to start, "
                          "or give fewer or larger --sizes")
    if estimate_s > 2 and not args.quiet:             # long work says so before it starts
        print(f"blockmap: {n} cell(s) to simulate, roughly {bound}{fmt_duration(estimate_s)} (estimated{folds})",
              file=sys.stderr)
    progress = RunProgress(n, lambda cfg: blockmap.estimated_wall_s(cfg, fast=fast), enabled=wanted(args.quiet))
    progress.outer.unit = "cell"
    progress.outer.set_description("blockmap cells")
    try:
        cells = blockmap.simulate(planned, fast, progress)
    finally:
        progress.close()
    what = f"{args.algorithm} {'+'.join(passes)}, B={args.batch} H={args.heads} N={args.seq_len} d={args.head_dim}"
    if args.causal:
        what += " causal"
    print(f"{what} on {gpu.name} (predicted by hbmsim, not measured)")
    print(blockmap.table(cells))
    note = blockmap.fast_note(cells)
    if note:
        print(note)
    if args.json:
        write_text_atomic(args.json, json.dumps({"source": "predicted", "hardware": gpu.name, "workload": what,
                                                 "fast": fast, "cells": [vars(c) for c in cells]}, indent=1) + "\n")
    if args.plot:
        print(f"wrote {blockmap.plot(cells, args.plot, f'Block sizes: {what} on {gpu.name}')}", file=sys.stderr)
    return 0


def cmd_blockmap_measured(args) -> int:
    from .. import blockmap_measured as M
    from ..progress import RunProgress, wanted
    from ..runner import estimated_wall_s
    if args.algorithm != "flash2":
        raise HbmsimError(f"blockmap --measured: --algorithm = {args.algorithm!r}: the grid's kernels are modelled by "
                          "flash2 (leave --algorithm out)")
    doc, points, panels = M.load(args.measured)
    gpu = resolve_hardware(args.hardware or M.hardware_of(doc))
    configs, notes = M.plan(gpu, points)
    todo = [c for c in configs if c is not None]
    if not todo:
        first = next(p for p in points if p.reason)
        raise HbmsimError(f"blockmap --measured: {args.measured}: no point can be predicted on {gpu.name}, e.g. "
                          f"runs[{first.index}]: {first.reason}")
    fast = not args.full
    estimate_s = sum(estimated_wall_s(c, fast=fast) for c in todo)
    if estimate_s > CONFIRM_WALL_S and not args.yes:
        raise HbmsimError(f"blockmap --measured: {len(todo)} point(s) to predict, estimated {fmt_duration(estimate_s)} "
                          f"of simulation (more than {fmt_duration(CONFIRM_WALL_S)}): pass --yes to start")
    if estimate_s > 2 and not args.quiet:
        print(f"blockmap: {len(todo)} point(s) to predict, roughly {'at most ' if fast else ''}"
              f"{fmt_duration(estimate_s)} (estimated)", file=sys.stderr)
    progress = RunProgress(len(todo), lambda cfg: estimated_wall_s(cfg, fast=fast), enabled=wanted(args.quiet))
    progress.outer.unit = "point"
    progress.outer.set_description("predicting the grid")
    try:
        M.predict(points, configs, fast, progress)
    finally:
        progress.close()
    prov = doc.get("provenance") or {}
    if doc["source"] == "emulated":
        source = "emulated on the CPU (the kernel's CPU emulation: bytes only)"
    else:
        l2 = (prov.get("l2") or {}).get("l2_start")
        source = f"measured on {prov.get('gpu', 'an unnamed GPU')}" + (f" (L2 {l2})" if l2 else "")
    variants = sorted({M.variant_for(p.run.get("kernel", "flash_attention"))[0] for p in points})
    predicted = (f"predicted by hbmsim (flash2 {', '.join(variants)} on {gpu.name}, "
                 f"{'fast' if fast else 'full'} mode)")
    print(f"{args.measured}: {len(points)} point(s), {source}; {predicted}")
    print(M.table(points, panels))
    print("per panel, over the workloads:")
    print(M.summary(points, panels))
    spill = M.spill_note(points, panels)
    if spill:
        print(spill)
    if "time_s" not in panels:
        print("time: not measured" + (" (emulated on the CPU)" if doc["source"] == "emulated" else ""))
    if "hbm_read_bytes" not in panels:
        print("DRAM bytes: not in the file" + (" (the emulation counts the kernel's global loads and stores, the "
                                               "L2-side requests)" if doc["source"] == "emulated"
                                               else " (ncu did not run)"))
    for note in notes:
        print(f"note: {note}")
    for p in points:
        if p.reason:
            print(f"not predicted: runs[{p.index}] {p.label}: {p.reason}")
    if args.json:
        out = {"source": "predicted vs " + doc["source"], "file": args.measured, "hardware": gpu.name, "fast": fast,
               "points": [{"index": p.index, "label": p.label, "workload": M.group_label(M.group_key(p.run)),
                           "measured": {f: p.run[f] for f in panels},
                           "predicted": {f: p.predicted.get(f) for f in panels}, "reason": p.reason or None}
                          for p in points],
               "stats": [{"workload": M.group_label(k), "panel": f, **dict(zip(("spearman", "regret", "points"),
                                                                                 M.stats(pts, f)))}
                         for k, pts in M.groups(points).items() for f in panels]}
        text = json.dumps(out, indent=1).replace("NaN", "null").replace("Infinity", "null")
        write_text_atomic(args.json, text + "\n")
    if args.plot:
        print(f"wrote {M.plot(points, panels, args.plot, source, predicted)}", file=sys.stderr)
    return 0
