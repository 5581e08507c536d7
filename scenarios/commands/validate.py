"""`hbmsim validate`: predicted time against published and measured times (scenarios/validate.py),
at the event and the kernel level (scenarios/validate_report.py)."""
from __future__ import annotations

import argparse
import sys

from ..outputs import write_text_atomic
from ..signals import sigterm_as_interrupt
from .common import Interrupted, add_without, check_plot_and_json, count, time_model

# How validate's plot labels its y axis, by the measured files' "source"
MEASUREMENT_KINDS = {"published": "published measurement", "measured": "measured (this project's runs on a GPU)"}


def add_parser(sub) -> None:
    v = sub.add_parser("validate", help="predicted time against published and measured times (scenarios/measured/)")
    v.add_argument("files", nargs="*", metavar="FILE|NAME",
                   help="measured files (a path, or a shipped name such as fa2-paper-fwd-bwd; default: all shipped)")
    v.add_argument("--only", metavar="TEXT", help="keep runs whose implementation, program, variant, GPU or pass "
                   "contains TEXT (e.g. fa2, h100-sxm5-80gb)")
    v.add_argument("--max-seq-len", type=count(1), metavar="N", help="keep runs with a sequence length of at most N")
    v.add_argument("--plot", metavar="PNG", help="predicted against measured time, log axes, y = x")
    v.add_argument("--json", metavar="PATH", help="write every point (predicted, measured, error) to PATH")
    v.add_argument("--quiet", action="store_true", help="no progress on stderr")
    v.add_argument("--ablation", action="store_true",
                   help="also simulate every run with each effect of the time model off in turn, and report "
                        "how much of the measured time each one explains (takes 10x as long)")
    v.add_argument("--full", action="store_true",
                   help="simulate every block (default: fast mode, steady launches folded, within 1%% of the full "
                        "simulation; each point says how much of it was simulated)")
    v.add_argument("--fast", action="store_true", help=argparse.SUPPRESS)     # the default now; kept for old scripts
    v.add_argument("--workers", type=count(1), metavar="N",
                   help="simulate on N local processes (a Dask LocalCluster, as `run --workers`; default: every "
                        "core when there are 16 distinct configurations or more, 1: this process only)")
    v.add_argument("--no-cache", action="store_true",
                   help="simulate every configuration again (default: reuse what earlier validates kept in "
                        "$HBMSIM_CACHE/validate, ~/.cache/hbmsim by default, for the same configuration, hardware "
                        "fields and program code: an edited preset or program simulates only its own again)")
    add_without(v)
    v.set_defaults(func=cmd_validate)


def progress_of(quiet: bool):
    """(progress callback, tqdm bar or None): a bar on a terminal, a line per simulation in a log."""
    from .. import validate as V
    from ..progress import wanted
    if quiet:
        return None, None
    if not wanted(quiet):
        return V.stderr_lines, None
    from tqdm import tqdm
    bar = tqdm(total=0, unit="simulation", desc="validate", file=sys.stderr)

    def progress(done: int, n: int) -> None:
        bar.total = n
        bar.update(done - bar.n)
    return progress, bar


def cmd_validate(args) -> int:
    from .. import validate as V
    from .. import validate_report as R
    from ..published import measured_names
    check_plot_and_json(args)
    refs = args.files or measured_names()
    model = time_model(args)
    points: list = []
    progress, bar = progress_of(args.quiet)
    try:
        with sigterm_as_interrupt():
            V.validate(refs, args.only, args.max_seq_len, progress, points, model=model, ablation=args.ablation,
                       full=args.full, workers=args.workers, cache=not args.no_cache)
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        if points:
            print(R.report(points, refs, model) + f"\n(partial: interrupted after {len(points)} run(s))")
        if args.json and points:
            write_text_atomic(args.json, R.to_json(points, complete=False, model=model))
        raise Interrupted(f"validate interrupted after {len(points)} run(s)") from None
    if bar is not None:
        bar.close()
    print(R.report(points, refs, model))
    if args.json:
        write_text_atomic(args.json, R.to_json(points, complete=True, model=model))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot(R, points, refs, args.plot, model)
    return 0


def plot(R, points: list, refs: list, path: str, model) -> None:
    """Predicted against measured time, its y axis named after what the measured files are."""
    from ..compare import load
    from ..published import resolve_measured
    files = [load(resolve_measured(r)) for r in refs]
    kind = " / ".join(dict.fromkeys(MEASUREMENT_KINDS.get(f.source, f.source) for f in files))
    source = "; ".join(str(f.provenance.get("short") or f"{r}: {f.provenance.get('gpu', '')}")
                       for r, f in zip(refs, files))
    print(f"wrote {R.plot(points, path, kind + ': ' + source, model, kind)}", file=sys.stderr)
