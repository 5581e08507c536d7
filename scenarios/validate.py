"""`hbmsim validate`: predicted time against published measurements.

For every run of a measured file (scenarios/measured/, or any file in the compare schema with
`"source": "published"` or `"measured"`), build the configuration that reproduces it (the run's
hardware preset, workload, program and variant), simulate it count-only, and compare the
predicted time of the run's pass with the measured one. The report gives, per family
(implementation x GPU x pass), the number of runs, the median and worst |time error| and the
signed median (negative: the model is optimistic), for every sequence length and for N >= 1024.
Nothing here is fitted: the numbers say how far the model is off, never what a constant should be.

With `ablation`, every run is also simulated with each effect of the time model
(simulator/time_model.py) switched off in turn, and with all of them off (spec-sheet rates), so
the report can say how much of the measured time each effect explains.

With `fast`, each run is simulated in fast mode (runner.run_config: long inner loops several
tiles a step, steady launches folded; within 1% of the full simulation where both were compared),
for sequences too long to simulate whole; each point keeps the fraction of blocks simulated.
"""
from __future__ import annotations

import json
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from hbmsim.simulator import BASELINE, HbmsimError, TimeModel

from .compare import load
from .experiment import Config, Experiment, RunSpec, make_workload, resolve_hardware
from .outputs import pyplot, save_figure
from .published import resolve_measured
from .runner import estimated_wall_s, prepare, run_config

LONG_N = 1024          # the targets are stated for N >= 1024


@dataclass
class Point:
    family: tuple          # (implementation, hardware, pass)
    seq_len: int
    label: str             # one line naming the configuration
    predicted_s: float
    measured_s: float
    ablation: dict | None = None     # {"without <effect>" | "all off": predicted time (s)}
    simulated_fraction: float = 1.0  # fast mode: the share of the run's blocks simulated (the rest folded)

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: (predicted - measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s


def _passes(pass_name: str, where: str) -> tuple:
    passes = {"forward": ("forward",), "backward": ("forward", "backward"),
              "forward+backward": ("forward", "backward")}
    if pass_name not in passes:
        raise HbmsimError(f"{where}: field 'pass' = {pass_name!r} must be forward, backward or forward+backward")
    return passes[pass_name]


def configs_of(path: str, runs: list, only: str | None = None, max_seq_len: int | None = None) -> list:
    """(Config, run) for every run of a measured file that `only` (a substring of the run's
    implementation, algorithm, hardware or pass) and `max_seq_len` keep."""
    out = []
    for i, r in enumerate(runs):
        where = f"{path}: runs[{i}]"
        impl = r.get("implementation") or r.get("algorithm")
        text = " ".join(str(x) for x in (impl, r.get("algorithm"), r.get("variant"), r.get("hardware"), r.get("pass")))
        if only and only not in text:
            continue
        w = dict(r.get("workload") or {})
        if w.get("seq_len_q") is not None and w.get("seq_len_q") == w.get("seq_len_kv"):
            w.pop("seq_len_q")
            w.pop("seq_len_kv")
        n = w.get("seq_len") or w.get("seq_len_q")
        if max_seq_len and n and n > max_seq_len:
            continue
        for key in ("hardware", "algorithm", "time_s"):
            if r.get(key) is None:
                raise HbmsimError(f"{where}: missing field '{key}' (validate needs the GPU preset, the program and "
                                  "the measured time)")
        gpu = resolve_hardware(r["hardware"])
        params = {"variant": r["variant"]} if r.get("variant") else {}
        spec = RunSpec(r["algorithm"], _passes(r.get("pass", "forward"), where), params)
        spec.spec.mapping_from(params, where)          # the variant must exist
        out.append((Config(gpu, make_workload(where, w), spec, where=where), r))
    return out


def ablation_models(model: TimeModel) -> dict:
    """{label: model} for an ablation: `model` with each of its effects that is on switched off in
    turn, then with every effect off ("all off": spec-sheet rates, a compute call as long as its
    slowest part; the programs' own dependent phases, e.g. FA1's split-K reduction, stay)."""
    out = {f"without {name}": model.off(name) for name in TimeModel.effects() if getattr(model, name)}
    out["all off"] = BASELINE
    return out


def validate(refs: list, only: str | None = None, max_seq_len: int | None = None,
             progress=None, points: list | None = None, model: TimeModel | None = None,
             ablation: bool = False, fast: bool = False) -> list[Point]:
    """Simulate every kept run of the measured files `refs` with `model` (default: every effect
    on), and with `ablation` also without each effect, in fast mode with `fast`; returns the
    points (appended to `points` as they finish, so that a caller keeps them through an error or
    Ctrl-C)."""
    model = TimeModel() if model is None else model
    others = ablation_models(model) if ablation else {}
    points = [] if points is None else points
    plan = []
    for ref in refs:
        path = resolve_measured(ref)
        measured = load(path)                      # every number checked, duplicates refused
        plan += configs_of(str(path), measured.runs, only, max_seq_len)
    if not plan:
        raise HbmsimError("validate: no run left to simulate (check --only and --max-seq-len)")
    exp = prepare(Experiment("validate", "validate", plan[0][0].gpu, [cfg for cfg, _ in plan]))
    # (fast mode: no estimate; the step count is an upper bound, and folding usually skips most of it)
    total_s = None if fast else (1 + len(others)) * sum(estimated_wall_s(cfg) for cfg in exp.configs)
    if progress:
        progress(0, len(plan), None, total_s)
    for i, (cfg, (_, r)) in enumerate(zip(exp.configs, plan)):
        t0 = time.perf_counter()
        pass_name = r.get("pass", "forward")

        def simulate(m: TimeModel) -> dict:         # the measured pass's result under model m
            return next(res for res in run_config(cfg, count_only=True, model=m, fast=fast) if res["pass"] == pass_name)
        res = simulate(model)
        predicted = res["time_s"]
        without = {label: simulate(m)["time_s"] for label, m in others.items()}
        wl = cfg.workload
        impl = r.get("implementation") or f"{cfg.run.algorithm} {r.get('variant', '')}".strip()
        label = (f"{impl} {r['hardware']} {pass_name} d={wl.head_dim} B={wl.batch} H={wl.heads} N={wl.seq_len_q}"
                 + (" causal" if wl.causal else ""))
        point = Point((impl, r["hardware"], pass_name), wl.seq_len_q, label, predicted, r["time_s"],
                      without or None, res["simulated_fraction"])
        points.append(point)
        if progress:
            progress(i + 1, len(plan), point, time.perf_counter() - t0)
    return points


def family_stats(points: list) -> dict:
    """{family: {"all": (n, median |err|, worst |err|, signed median), "long": the same for N >= 1024}}."""
    out: dict = {}
    for fam in dict.fromkeys(p.family for p in points):
        row = {}
        for key, keep in (("all", lambda p: True), ("long", lambda p: p.seq_len >= LONG_N)):
            errs = [p.error for p in points if p.family == fam and keep(p)]
            row[key] = ((len(errs), statistics.median(abs(e) for e in errs), max(abs(e) for e in errs),
                         statistics.median(errs)) if errs else (0, None, None, None))
        out[fam] = row
    return out


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


def report(points: list, sources: list, model: TimeModel | None = None) -> str:
    stats = family_stats(points)
    width = max(len(" ".join(f)) for f in stats)
    pct = lambda x: "    -" if x is None else f"{100 * x:+5.0f}%" if x < 0 else f"{100 * x:5.0f}%"
    lines = [f"predicted by hbmsim (time model: {(model or TimeModel()).describe()}) against {', '.join(sources)}",
             "time error = (predicted - measured) / measured; negative: the model is optimistic", "",
             f"{'family':{width}s}   {'all N':>30s}   {'N >= ' + str(LONG_N):>30s}",
             f"{'':{width}s}   {'n  median|e|  worst|e|  median e':>30s}   {'n  median|e|  worst|e|  median e':>30s}"]
    for fam, row in stats.items():
        cells = []
        for key in ("all", "long"):
            n, med, worst, signed = row[key]
            cells.append(f"{n:2d}  {pct(med):>9s}  {pct(worst):>8s}  {pct(signed):>8s}")
        lines.append(f"{' '.join(fam):{width}s}   {cells[0]:>30s}   {cells[1]:>30s}")
    errs = [abs(p.error) for p in points]
    lines += ["", f"all {len(points)} runs: median |time error| {100 * statistics.median(errs):.0f}%, "
                  f"worst {100 * max(errs):.0f}%"]
    folded = [p.simulated_fraction for p in points if p.simulated_fraction < 1]
    if folded:
        lines.append(f"fast mode: {len(folded)} of the {len(points)} runs folded, {100 * min(folded):.1f}% to "
                     f"{100 * max(folded):.1f}% of their blocks simulated and the rest extrapolated "
                     "(simulator/fold.py)")
    if points[0].ablation:
        lines += ["", ablation_report(points)]
    return "\n".join(lines)


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
        pts = [(p.predicted_s * 1e3, p.measured_s * 1e3) for p in points if p.family == fam]
        ax.scatter(*zip(*pts), color=colours[impls.index(fam[0]) % len(colours)],
                   marker=markers[shapes.index(fam[1:]) % len(markers)], alpha=0.8,
                   label=f"{fam[0]} on {fam[1]}, {fam[2]} ({len(pts)})")
    values = [v for p in points for v in (p.predicted_s * 1e3, p.measured_s * 1e3)]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="gray", ls="--", label="y = x (prediction exact)")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="predicted by hbmsim (ms)",
           ylabel=f"{kind} (ms)")
    fast = "fast mode, folded; " if any(p.simulated_fraction < 1 for p in points) else ""
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
    return json.dumps({"complete": complete, "time_model": (model or TimeModel()).describe(), "points": [
        {"implementation": p.family[0], "hardware": p.family[1], "pass": p.family[2], "seq_len": p.seq_len,
         "label": p.label, "predicted_time_s": p.predicted_s, "measured_time_s": p.measured_s,
         "error": p.error, "simulated_fraction": p.simulated_fraction,
         **({"ablation_time_s": p.ablation} if p.ablation else {})} for p in points]},
        indent=1) + "\n"


def stderr_progress(i: int, n: int, point, wall_or_total_s: float | None) -> None:
    if point is None:
        how_long = "in fast mode" if wall_or_total_s is None else f"roughly {wall_or_total_s / 60:.0f} min (estimated)"
        print(f"validate: {n} run(s) to simulate, {how_long}", file=sys.stderr, flush=True)
        return
    folded = (f", {100 * point.simulated_fraction:.1f}% of the blocks simulated"
              if point.simulated_fraction < 1 else "")
    print(f"[{i}/{n}] {point.label}: predicted {point.predicted_s * 1e3:.3g} ms, measured "
          f"{point.measured_s * 1e3:.3g} ms ({100 * point.error:+.0f}%), {wall_or_total_s:.1f} s wall{folded}",
          file=sys.stderr, flush=True)
