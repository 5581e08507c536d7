"""What `hbmsim validate` prints and writes: per-family tables at the event and the kernel level,
the kernel groups that are off, the ablation table, the predicted-vs-measured plot and the JSON.

A family is (implementation, GPU, pass). Errors are (predicted - measured) / measured; negative:
the model is optimistic. Each table gives n, the median and worst |error| and the signed median,
for every sequence length and for N >= LONG_N.
"""
from __future__ import annotations

import json
import statistics
import textwrap
from pathlib import Path

from hbmsim.simulator import TimeModel

from .outputs import pyplot, save_figure
from .validate import LONG_N

# Issue 23's targets, per family over all N: (median |error|, worst |error|) at the event level (the
# pass a stopwatch sees) and at the kernel level (the profiler's kernel rows)
EVENT_TARGET = (0.10, 0.25)
KERNEL_TARGET = (0.08, 0.20)

def family_stats(points: list, error=lambda p: p.error) -> dict:
    """{family: {"all": (n, median |err|, worst |err|, signed median), "long": the same for N >= LONG_N}}
    of `error` (a point's event-level error by default; points whose error is None left out)."""
    out: dict = {}
    for fam in dict.fromkeys(p.family for p in points):
        row = {}
        for key, keep in (("all", lambda p: True), ("long", lambda p: p.seq_len >= LONG_N)):
            errs = [e for p in points if p.family == fam and keep(p) and (e := error(p)) is not None]
            row[key] = ((len(errs), statistics.median(abs(e) for e in errs), max(abs(e) for e in errs),
                         statistics.median(errs)) if errs else (0, None, None, None))
        if row["all"][0]:
            out[fam] = row
    return out


def _pct(x) -> str:
    return "    -" if x is None else f"{100 * x:+5.0f}%" if x < 0 else f"{100 * x:5.0f}%"


def family_table(stats: dict) -> list:
    """The lines of one per-family table (family_stats' output)."""
    width = max(len(" ".join(f)) for f in stats)
    lines = [f"{'family':{width}s}   {'all N':>30s}   {'N >= ' + str(LONG_N):>30s}",
             f"{'':{width}s}   {'n  median|e|  worst|e|  median e':>30s}   {'n  median|e|  worst|e|  median e':>30s}"]
    for fam, row in stats.items():
        cells = []
        for key in ("all", "long"):
            n, med, worst, signed = row[key]
            cells.append(f"{n:2d}  {_pct(med):>9s}  {_pct(worst):>8s}  {_pct(signed):>8s}")
        lines.append(f"{' '.join(fam):{width}s}   {cells[0]:>30s}   {cells[1]:>30s}")
    return lines


def targets_line(stats: dict, target: tuple) -> str:
    """How many of the families (family_stats' output) are within `target` = (median, worst) |error|,
    all N, and which are."""
    median_max, worst_max = target
    met = [" ".join(f) for f, row in stats.items() if row["all"][1] <= median_max and row["all"][2] <= worst_max]
    return (f"within median |e| <= {100 * median_max:.0f}% and worst |e| <= {100 * worst_max:.0f}% (all N): "
            f"{len(met)} of {len(stats)} families" + (f" ({', '.join(met)})" if met else ""))


def kernel_group_table(points: list) -> list:
    """Per family and kernel group: n, median and worst |error| and signed median of the group's
    device time (groups only measured or only predicted: their median time instead)."""
    rows: dict = {}
    for p in points:
        for label, pred, meas in p.kernels:
            rows.setdefault((p.family, label), []).append((pred, meas))
    if not rows:
        return []
    width = max(len(" ".join(f)) + 2 + len(g) for f, g in rows)
    lines = [f"{'family: kernel group':{width}s}   {'n  median|e|  worst|e|  median e':>30s}"]
    for (fam, label), pairs in rows.items():
        name = f"{' '.join(fam)}: {label}"
        errs = [(pred - meas) / meas for pred, meas in pairs if meas and pred]
        if errs:
            cell = (f"{len(errs):2d}  {_pct(statistics.median(abs(e) for e in errs)):>9s}  "
                    f"{_pct(max(abs(e) for e in errs)):>8s}  {_pct(statistics.median(errs)):>8s}")
        else:
            which = "measured" if any(meas for _, meas in pairs) else "predicted"
            t = statistics.median(meas or pred for pred, meas in pairs)
            cell = f"{len(pairs):2d}  {which} only, median {t * 1e6:.1f} us a pass"
        lines.append(f"{name:{width}s}   {cell:>30s}")
    return lines


def ablation_report(points: list) -> str:
    """Signed median time error per family (N >= 1024) with each effect off in turn: how much of
    the measured time each effect explains."""
    labels = list(points[0].ablation)
    fams = list(dict.fromkeys(p.family for p in points))
    width = max(len(" ".join(f)) for f in fams)
    cols = ["model"] + labels
    lines = [f"ablation: signed median time error, N >= {LONG_N} (all N where a family has none), "
             "with each effect of the time model switched off in turn",
             f"{'family':{width}s}  " + "  ".join(f"{c:>{max(9, len(c))}s}" for c in cols)]
    for fam in fams:
        pts = [p for p in points if p.family == fam and p.seq_len >= LONG_N] or \
              [p for p in points if p.family == fam]
        cells = [statistics.median(p.error for p in pts)]
        cells += [statistics.median((p.ablation[c] - p.measured_s) / p.measured_s for p in pts) for c in labels]
        lines.append(f"{' '.join(fam):{width}s}  " + "  ".join(f"{100 * e:>+{max(9, len(c)) - 1}.0f}%"
                                                               for c, e in zip(cols, cells)))
    allp = [p for p in points if p.seq_len >= LONG_N] or points
    cells = [statistics.median(abs(p.error) for p in allp)]
    cells += [statistics.median(abs(p.ablation[c] - p.measured_s) / p.measured_s for p in allp) for c in labels]
    lines.append(f"{'median |error|, all':{width}s}  " + "  ".join(f"{100 * e:>{max(9, len(c)) - 1}.0f}%"
                                                                    for c, e in zip(cols, cells)))
    return "\n".join(lines)


# (implementation, its baseline): issue 26's speed-up, the baseline's time over the implementation's on
# the same configuration (GPU, pass, workload), predicted against measured, where one measured file
# timed both (a paper's FA3 against this project's FA2 would mix two machines and two clocks)
SPEEDUP_PAIRS = (("fa3", "fa2-fa3paper"), ("fa3", "fa2"), ("cudnn", "fa2"))


def speedup_stats(points: list) -> dict:
    """{(implementation, baseline, GPU, pass, level): (n, median |e|, worst |e|, signed median)} with e =
    predicted speed-up / measured speed-up - 1 (positive: the model predicts too large a gain), a
    speed-up being the baseline's time over the implementation's on one configuration of one measured
    file; at the event level, and at the kernel level where both runs have kernel rows."""
    by_impl: dict = {}
    for p in points:
        impl, config = p.label.split(" ", 1)           # "IMPL GPU PASS workload..."
        by_impl.setdefault(impl, {})[(p.source, config)] = p
    out: dict = {}
    for impl, base in SPEEDUP_PAIRS:
        mine, theirs = by_impl.get(impl, {}), by_impl.get(base, {})
        for config in sorted(mine.keys() & theirs.keys()):
            a, b = mine[config], theirs[config]
            levels = [("event", b.predicted_s / a.predicted_s, b.measured_s / a.measured_s)]
            if a.measured_kernel_s and b.measured_kernel_s:
                levels.append(("kernel", b.predicted_kernel_s / a.predicted_kernel_s,
                               b.measured_kernel_s / a.measured_kernel_s))
            for level, predicted, measured in levels:
                out.setdefault((impl, base, a.family[1], a.family[2], level), []).append(predicted / measured - 1)
    return {k: (len(v), statistics.median(abs(e) for e in v), max(abs(e) for e in v), statistics.median(v))
            for k, v in out.items()}


def speedup_table(points: list) -> list:
    """The lines of the speed-up table (none where no pair was timed on the same configuration)."""
    stats = speedup_stats(points)
    if not stats:
        return []
    names = {k: f"{k[0]} over {k[1]} {k[2]} {k[3]}" for k in stats}
    width = max(len(n) for n in names.values())
    lines = ["", "speed-up: the baseline's time over the implementation's on the same configuration, predicted "
                 "against measured (e = predicted / measured speed-up - 1; positive: too large a gain predicted)",
             f"{'implementation over baseline':{width}s}  level    n  median|e|  worst|e|  median e"]
    for k, (n, med, worst, signed) in stats.items():
        lines.append(f"{names[k]:{width}s}  {k[4]:6s} {n:3d}  {_pct(med):>9s}  {_pct(worst):>8s}  {_pct(signed):>8s}")
    return lines


def report(points: list, sources: list, model: TimeModel | None = None) -> str:
    lines = [f"predicted by hbmsim (time model: {(model or TimeModel()).describe()}) against {', '.join(sources)}",
             "time error = (predicted - measured) / measured; negative: the model is optimistic", "",
             "event level: the pass's predicted time against the measured pass (CUDA events, or a paper's figure),",
             "  timed as its harness timed it: one synchronised call, or a call of a loop of calls (a paper's)"]
    event_stats = family_stats(points)
    lines += family_table(event_stats)
    errs = [abs(p.error) for p in points]
    lines += ["", targets_line(event_stats, EVENT_TARGET)]
    lines += [f"all {len(points)} runs: median |time error| {100 * statistics.median(errs):.0f}%, "
              f"worst {100 * max(errs):.0f}%"]
    lines += repeats_lines(points)
    kernel_stats = family_stats(points, lambda p: p.kernel_error)
    if kernel_stats:
        kerrs = [abs(p.kernel_error) for p in points if p.kernel_error is not None]
        lines += ["", "kernel level: the pass's predicted kernel device time against its measured kernel rows "
                      "(torch.profiler)"]
        lines += family_table(kernel_stats)
        lines += ["", targets_line(kernel_stats, KERNEL_TARGET),
                  f"{len(kerrs)} runs with kernel rows: median |kernel error| "
                  f"{100 * statistics.median(kerrs):.0f}%, worst {100 * max(kerrs):.0f}%", ""]
        lines += kernel_group_table(points)
    lines += speedup_table(points)
    folded = [p.simulated_fraction for p in points if p.simulated_fraction < 1]
    if folded:
        lines.append(f"fast mode: {len(folded)} of the {len(points)} runs folded, {100 * min(folded):.1f}% to "
                     f"{100 * max(folded):.1f}% of their blocks simulated and the rest extrapolated "
                     "(steady launches folded, simulator/fold.py; flash1 and PyTorch attention on a slice of the "
                     "GPU, scenarios/runner.py)")
    if points[0].ablation:
        lines += ["", ablation_report(points)]
    return "\n".join(lines)


def repeats_lines(points: list) -> list:
    """What the measurement's own spread says of the errors, for the runs that keep their repeats:
    how many predictions fall within the repeats' range, and the errors against their median (the
    mean, which the tables use, takes in every outlier repeat)."""
    kept = [p for p in points if p.repeats]
    if not kept:
        return []
    inside = sum(lo <= p.predicted_s <= hi for p in kept for lo, _, hi in [p.repeats])
    med = [abs(p.predicted_s - p.repeats[1]) / p.repeats[1] for p in kept]
    return [f"the {len(kept)} runs that keep their repeats: {inside} predictions within the repeats' range "
            f"(min..max); against the repeats' median instead of their mean: median |time error| "
            f"{100 * statistics.median(med):.0f}%, worst {100 * max(med):.0f}%"]


def plot(points: list, path: str | Path, source: str, model: TimeModel | None = None,
         kind: str = "published measurement") -> Path:
    """Predicted (x) against measured (y) time, log-log, with y = x; one colour per
    implementation, one marker per GPU and pass. `kind` labels the y axis: published or measured."""
    plt = pyplot()
    import matplotlib.ticker
    fig, ax = plt.subplots(figsize=(7.5, 7))
    colours = ("tab:blue", "tab:orange", "tab:red", "tab:green", "tab:purple", "tab:brown")
    markers = ("o", "s", "^", "D", "v", "P")
    impls = list(dict.fromkeys(p.family[0] for p in points))
    shapes = list(dict.fromkeys(p.family[1:] for p in points))     # one marker per (GPU, pass)
    for fam in dict.fromkeys(p.family for p in points):
        colour = colours[impls.index(fam[0]) % len(colours)]
        pts = [(p.predicted_s * 1e3, p.measured_s * 1e3) for p in points if p.family == fam]
        ax.scatter(*zip(*pts), color=colour, marker=markers[shapes.index(fam[1:]) % len(markers)], alpha=0.8,
                   label=f"{fam[0]} on {fam[1]}, {fam[2]} ({len(pts)})")
        spread = [p for p in points if p.family == fam and p.repeats]
        if spread:                              # the measurement's repeats, min..max, around its mean
            ax.errorbar([p.predicted_s * 1e3 for p in spread], [p.measured_s * 1e3 for p in spread],
                        yerr=[[(p.measured_s - p.repeats[0]) * 1e3 for p in spread],
                              [(p.repeats[2] - p.measured_s) * 1e3 for p in spread]],
                        fmt="none", ecolor=colour, alpha=0.4, elinewidth=0.8)
    values = [v for p in points for v in (p.predicted_s * 1e3, p.measured_s * 1e3) + (
        (p.repeats[0] * 1e3, p.repeats[2] * 1e3) if p.repeats else ())]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="gray", ls="--", label="y = x (prediction exact)")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="predicted by hbmsim (ms)",
           ylabel=f"{kind} (ms)")
    fast = "fast mode, folded; " if any(p.simulated_fraction < 1 for p in points) else ""
    if any(p.repeats for p in points):
        source += " (bars: the measured repeats, min..max, around their mean)"
    ax.set_title(textwrap.fill(f"Time per run: predicted by hbmsim ({fast}time model: "
                               f"{(model or TimeModel()).describe()}) vs {kind}", 90)
                 + "\n" + textwrap.fill(source, 90), fontsize=9)
    for axis in (ax.xaxis, ax.yaxis):           # ticks at 1, 2, 5 x 10^k, written as plain numbers
        axis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return save_figure(fig, path)


def to_json(points: list, complete: bool, model: TimeModel | None = None) -> str:
    speedups = [{"implementation": k[0], "baseline": k[1], "hardware": k[2], "pass": k[3], "level": k[4], "n": n,
                 "median_abs_error": med, "worst_abs_error": worst, "median_error": signed}
                for k, (n, med, worst, signed) in speedup_stats(points).items()]
    return json.dumps({"complete": complete, "time_model": (model or TimeModel()).describe(), "speedups": speedups,
                       "points": [
        {"implementation": p.family[0], "hardware": p.family[1], "pass": p.family[2], "seq_len": p.seq_len,
         "label": p.label, "measured_file": p.source,
         "predicted_time_s": p.predicted_s, "measured_time_s": p.measured_s,
         "error": p.error, "simulated_fraction": p.simulated_fraction,
         "predicted_kernel_time_s": p.predicted_kernel_s, "measured_kernel_time_s": p.measured_kernel_s,
         "kernel_error": p.kernel_error,
         **({"measured_repeats_s": {"min": p.repeats[0], "median": p.repeats[1], "max": p.repeats[2]}}
            if p.repeats else {}),
         "kernel_groups": [{"group": g, "predicted_time_s": pr, "measured_time_s": me} for g, pr, me in p.kernels],
         **({"ablation_time_s": p.ablation} if p.ablation else {})} for p in points]},
        indent=1) + "\n"


