"""`hbmsim blockmap --measured FILE`: a measured (or emulated) block-grid file (`hbmsim profile`
without an experiment) against hbmsim's prediction of the same points, panel by panel: L2-side
reads and writes, DRAM reads and writes, and time, each where the file has it.

For each workload of the file (head dim, N, causal, ...) and each panel it prints Spearman's rank
correlation of predicted against measured over the workload's blocks (does the model order the
blocks as the GPU does?) and the regret of the predicted best: the measured value of the block the
model ranks best over the measured best, minus 1 (what trusting the model's choice costs). A tie
for the predicted best counts the worst measured of the tied blocks (a model that cannot tell
them apart gets no credit). The file is checked before any simulation (one line naming the file,
the run, the field and the value).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hbmsim.algorithms import registry
from hbmsim.simulator import HbmsimError

from .experiment import Config, Experiment, RunSpec
from .runner import prepare, run_config

# (field, panel title, unit label, scale to the unit)
PANELS = (("global_read_bytes", "L2-side reads", "MB", 1e-6), ("global_write_bytes", "L2-side writes", "MB", 1e-6),
          ("hbm_read_bytes", "DRAM reads", "MB", 1e-6), ("hbm_write_bytes", "DRAM writes", "MB", 1e-6),
          ("time_s", "time", "us", 1e6))
# The flash2 variant that models each kernel's loads, stores and time (issue 24 items 3 and 4);
# where it is not registered yet, flash2's default variant predicts and the report says so.
WORKLOAD_INTS = ("batch", "heads", "seq_len_q", "seq_len_kv", "head_dim")
MAX_PLOTTED_WORKLOADS = 8


@dataclass
class Point:
    index: int                          # in the file's "runs"
    run: dict
    predicted: dict = field(default_factory=dict)
    reason: str = ""                    # why it was not predicted

    @property
    def label(self) -> str:
        w = self.run.get("warps")
        return f"{self.run['block_q']}x{self.run['block_kv']}" + (f" w{w}" if w is not None else "")


def spearman(x, y) -> float:
    """Spearman's rank correlation: Pearson's correlation of the average ranks (ties share the
    mean of the ranks they span). NaN with fewer than 2 points or when either side is constant."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2:
        return math.nan
    rx, ry = average_ranks(x), average_ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(dx @ dy) / den if den > 0 else math.nan


def average_ranks(x) -> np.ndarray:
    """Ranks 1..n of x, tied values given the average of the ranks they occupy."""
    x = np.asarray(x, float)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1         # positions i..j hold ranks i+1..j+1
        i = j + 1
    return ranks


def regret(predicted, measured) -> float:
    """measured value of the predicted best (the worst measured among tied predicted bests) /
    the measured best - 1; 0 when both are 0, inf when only the measured best is 0, NaN empty."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if not len(p):
        return math.nan
    chosen = float(m[p == p.min()].max())
    best = float(m.min())
    if best == 0:
        return 0.0 if chosen == 0 else math.inf
    return chosen / best - 1


# ---- the file ----

def _fail(path, where: str, text: str):
    raise HbmsimError(f"blockmap --measured: {path}: {where}{text}")


def load(path: str | Path) -> tuple[dict, list[Point], list[str]]:
    """(document, the flash2 grid points, panel fields present), every field checked."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        _fail(path, "", "no such file")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        _fail(path, "", f"not a JSON measurement file ({err})")
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        _fail(path, "", "not a measurement file (no 'runs' list)")
    if doc.get("source") not in ("measured", "emulated"):
        _fail(path, "", f"field 'source' = {doc.get('source')!r} must be 'measured' or 'emulated' (a predicted file "
                        "has nothing to compare with)")
    points = [Point(i, r) for i, r in enumerate(doc["runs"]) if isinstance(r, dict) and r.get("algorithm") == "flash2"]
    if not points:
        _fail(path, "", "no flash2 run (the block-grid points `hbmsim profile` writes)")
    panels = [f for f, *_ in PANELS if f in points[0].run]
    if not panels:
        _fail(path, f"runs[{points[0].index}]: ", f"none of {', '.join(f for f, *_ in PANELS)}")
    for p in points:
        _check_run(path, p, panels, points[0].index)
    return doc, points, panels


def _check_run(path, p: Point, panels: list[str], first: int) -> None:
    r, where = p.run, f"runs[{p.index}]: "
    wl = r.get("workload")
    if not isinstance(wl, dict):
        _fail(path, where, f"field 'workload' = {wl!r} must be a table")
    for key in WORKLOAD_INTS:
        v = wl.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _fail(path, where, f"field 'workload.{key}' = {v!r} must be a whole number >= 1")
    for key in ("block_q", "block_kv") + (("warps",) if r.get("warps") is not None else ()):
        v = r.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _fail(path, where, f"field '{key}' = {v!r} must be a whole number >= 1")
    if r.get("l2_start") not in (None, "cold", "warm"):
        _fail(path, where, f"field 'l2_start' = {r['l2_start']!r} must be 'cold' or 'warm'")
    for key in panels:
        if key not in r:
            _fail(path, where, f"field '{key}' is missing (runs[{first}] has it)")
        v = r[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            _fail(path, where, f"field '{key}' = {v!r} must be a finite number >= 0")


def hardware_of(doc: dict) -> str:
    """The preset for the GPU the file was measured on (the emulation: H100, whose shared-memory
    limit it applies); HbmsimError asking for --hardware otherwise."""
    if doc["source"] == "emulated":
        return "h100-sxm5-80gb"
    gpu = str((doc.get("provenance") or {}).get("gpu", ""))
    for part, preset in (("H100", "h100-sxm5-80gb"), ("H200", "h200-sxm-141gb")):
        if part in gpu:
            return preset
    if "A100" in gpu:
        return "a100-sxm4-80gb" if "80GB" in gpu.replace(" ", "") else "a100-sxm4-40gb"
    raise HbmsimError(f"blockmap --measured: measured on {gpu or 'an unnamed GPU'}, for which no preset is known: "
                      "give --hardware")


# ---- the prediction ----

def variant_for(kernel: str) -> tuple[str, str]:
    """(flash2 variant that predicts `kernel`, a note when it is not the kernel's own model)."""
    flash2 = registry.get("flash2")
    own = flash2.variant_modelling(kernel)          # the registry's variant_kernels
    if own is not None:
        return own, ""
    return flash2.variants[0], (f"no flash2 variant models {kernel}: predicted with the default variant "
                                f"{flash2.variants[0]!r} at the same blocks")


def _workload(r: dict):
    from hbmsim.algorithms.workload import Workload
    wl = r["workload"]
    return Workload(*(wl[k] for k in WORKLOAD_INTS), dtype=wl.get("dtype", "fp16"), causal=bool(wl.get("causal")))


def plan(gpu, points: list[Point]) -> tuple[list[Config | None], list[str]]:
    """A prepared Config per point (None, with the point's reason set, where the preset refuses
    it, e.g. the blocks do not fit its SRAM), and notes on how the points are predicted."""
    notes, configs = [], []
    for p in points:
        variant, note = variant_for(p.run.get("kernel", "flash_attention"))
        if note and note not in notes:
            notes.append(note)
        params = {"block_q": p.run["block_q"], "block_kv": p.run["block_kv"], "variant": variant}
        if p.run.get("warps") is not None:
            params["warps"] = p.run["warps"]
        try:
            wl = _workload(p.run)
            cfg = Config(gpu, wl, RunSpec("flash2", ("forward",), params), where=f"runs[{p.index}]",
                         l2_start=p.run.get("l2_start") or "cold")    # the L2 state it was measured from
            configs.append(prepare(Experiment("measured", "blockmap", gpu, [cfg])).configs[0])
        except HbmsimError as err:
            p.reason = str(err).removeprefix(f"runs[{p.index}]: ")
            configs.append(None)
    return configs, notes


def predict(points: list[Point], configs: list, fast: bool = True, progress=None) -> None:
    """Simulate each planned point count-only (fast mode unless fast=False) into p.predicted."""
    n = sum(c is not None for c in configs)
    i = 0
    for p, cfg in zip(points, configs):
        if cfg is None:
            continue
        on_block = progress.start(cfg) if progress is not None else None
        r = run_config(cfg, count_only=True, fast=fast, progress=on_block)[-1]
        i += 1
        if progress is not None:
            progress.done(i, n, cfg, r, 0.0)
        p.predicted = {f: r[f] for f, *_ in PANELS}


# ---- the comparison ----

def group_key(r: dict) -> tuple:
    wl = r["workload"]
    return (r.get("kernel", "flash_attention"), wl.get("dtype", "fp16"), wl["batch"], wl["heads"], wl["seq_len_q"],
            wl["seq_len_kv"], wl["head_dim"], bool(wl.get("causal")), r.get("l2_start"))


def group_label(key: tuple) -> str:
    kernel, dtype, b, h, nq, nk, d, causal, l2 = key
    n = f"N={nq}" if nq == nk else f"N={nq}x{nk}"
    return f"B={b} H={h} {n} d={d} {dtype}" + (" causal" if causal else "") + (f" L2 {l2}" if l2 else "")


def groups(points: list[Point]) -> dict:
    out: dict = {}
    for p in points:
        out.setdefault(group_key(p.run), []).append(p)
    return out


def stats(pts: list[Point], key: str) -> tuple[float, float, int]:
    """(Spearman, regret of the predicted best, points) over the predicted points of one workload."""
    done = [p for p in pts if p.predicted]
    pred = [p.predicted[key] for p in done]
    meas = [p.run[key] for p in done]
    return spearman(pred, meas), regret(pred, meas), len(done)


# A point whose SMs stored more than this times the predicted stores wrote to local memory:
# register spills, which no program models (the kernel's own stores are the output and lse: 50
# of h200-profile-grid-tc-4k.json's 96 points stored exactly the predicted bytes, the others 1.2x
# to 591x them)
SPILL_STORE_RATIO = 1.05


def spilled(points: list[Point]) -> list[Point]:
    """The predicted points whose measured stores from the SMs (`global_write_bytes_from_sm`,
    `hbmsim profile`'s l1tex count) exceed SPILL_STORE_RATIO x the predicted L2-side writes."""
    return [p for p in points if p.predicted and p.run.get("global_write_bytes_from_sm") is not None
            and p.predicted.get("global_write_bytes")
            and p.run["global_write_bytes_from_sm"] > SPILL_STORE_RATIO * p.predicted["global_write_bytes"]]


def spill_note(points: list[Point], panels: list[str]) -> str:
    """'' when no point spilled; else how many did (their worst store ratio) and the summary over
    the points that did not: the model counts no local-memory traffic, so those rank what it models."""
    spill = spilled(points)
    if not spill:
        return ""
    worst = max(p.run["global_write_bytes_from_sm"] / p.predicted["global_write_bytes"] for p in spill)
    spilled_ids = {id(p) for p in spill}
    rest = [p for p in points if id(p) not in spilled_ids]
    text = (f"register spills: {len(spill)} of {len(points)} point(s) stored more from the SMs than the kernel's "
            f"output (up to {worst:.0f}x the predicted stores: local memory, which hbmsim does not count)")
    if rest:
        text += "; over the other " + f"{len(rest)}:\n" + summary(rest, panels)
    return text


def fmt_rho(rho: float) -> str:
    return "n/a" if math.isnan(rho) else f"{rho:.3f}"


def fmt_regret(r: float) -> str:
    return "n/a" if math.isnan(r) else ("inf" if math.isinf(r) else f"{r:.1%}")


def table(points: list[Point], panels: list[str]) -> str:
    titles = {f: t for f, t, *_ in PANELS}
    lines = [f"{'workload':38s} {'panel':15s} {'points':>6s} {'Spearman':>8s} {'regret':>8s}  predicted best -> "
             "measured best"]
    for key, pts in groups(points).items():
        for f in panels:
            rho, reg, n = stats(pts, f)
            done = [p for p in pts if p.predicted]
            best = ""
            if done:
                pb = min(done, key=lambda p: (p.predicted[f], -p.run[f]))
                mb = min(done, key=lambda p: p.run[f])
                best = f"{pb.label} -> {mb.label}"
            lines.append(f"{group_label(key):38s} {titles[f]:15s} {n:6d} {fmt_rho(rho):>8s} {fmt_regret(reg):>8s}  "
                         f"{best}")
    return "\n".join(lines)


def summary(points: list[Point], panels: list[str]) -> str:
    """Per panel over the workloads: the lowest and median Spearman, the largest regret."""
    titles = {f: t for f, t, *_ in PANELS}
    lines = []
    for f in panels:
        per = [stats(pts, f) for pts in groups(points).values()]
        rhos = [r for r, _, n in per if not math.isnan(r)]
        regs = [g for _, g, n in per if not math.isnan(g)]
        rho_text = (f"Spearman min {min(rhos):.3f}, median {float(np.median(rhos)):.3f}" if rhos
                    else "Spearman n/a (constant or a single point)")
        lines.append(f"  {titles[f]:15s} {rho_text}; regret of the predicted best at most "
                     f"{fmt_regret(max(regs)) if regs else 'n/a'} (over {len(per)} workload(s))")
    return "\n".join(lines)


def plot(points: list[Point], panels: list[str], path, source_text: str, predicted_text: str) -> Path:
    """One row per workload (the first MAX_PLOTTED_WORKLOADS), one column per panel: each block's
    predicted and measured value side by side, with the panel's Spearman and regret."""
    from .outputs import pyplot, save_figure
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda v, _: f"{v:.3g}")
    gs = list(groups(points).items())[:MAX_PLOTTED_WORKLOADS]
    spec = {f: (t, u, s) for f, t, u, s in PANELS}
    fig, axes = plt.subplots(len(gs), len(panels), figsize=(4.2 * len(panels), 3.0 * len(gs) + 0.8), squeeze=False)
    for row, (key, pts) in zip(axes, gs):
        done = [p for p in pts if p.predicted]
        x = np.arange(len(done))
        for ax, f in zip(row, panels):
            title, unit, scale = spec[f]
            rho, reg, _ = stats(pts, f)
            ax.plot(x - 0.12, [p.predicted[f] * scale for p in done], "o", ms=4, label="predicted (hbmsim)")
            ax.plot(x + 0.12, [p.run[f] * scale for p in done], "x", ms=5, label=source_text)
            ax.set_xticks(x, [p.label for p in done], rotation=90, fontsize=6)
            ax.set_ylabel(f"{title} ({unit})")
            if all(p.predicted[f] > 0 and p.run[f] > 0 for p in done):
                ax.set_yscale("log")
                ax.yaxis.set_minor_formatter(plain)
            ax.yaxis.set_major_formatter(plain)
            ax.set_title(f"{group_label(key)}\n{title}: Spearman {fmt_rho(rho)}, regret {fmt_regret(reg)}",
                         fontsize=8)
    axes[0][0].legend(fontsize=7)
    more = len(groups(points)) - len(gs)
    fig.suptitle(f"{predicted_text} vs {source_text}" + (f" (first {len(gs)} workloads; {more} more in the "
                                                          "table)" if more > 0 else ""), fontsize=9)
    return save_figure(fig, path, dpi=90)
