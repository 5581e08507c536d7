"""Predicted against measured: match the runs of two results files by configuration, tabulate
each field with its relative error, summarise (mean absolute percentage error), and plot
predicted against measured traffic on log axes with the y = x line.

Predicted files come from `hbmsim run ... --json`; measured files from `hbmsim emulate`
("source": "emulated", L2-side bytes per tensor) or `hbmsim profile` ("source": "measured",
times and, with ncu, DRAM and L2 bytes). A field is compared only where both files have it.
Both files are checked as strictly as experiments are (see `_check_run`): a bad value is one
line naming the file, the run, the field, the value and the limit.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from hbmsim.algorithms import registry
from hbmsim.simulator import HbmsimError

from .outputs import check_plot_path, pyplot, save_figure

FIELDS = ("global_read_bytes", "global_write_bytes", "hbm_read_bytes", "hbm_write_bytes", "time_s")
WORKLOAD_KEYS = ("batch", "heads", "seq_len_q", "seq_len_kv", "head_dim", "dtype", "causal", "key_padding_mask",
                 "dropout")
SOURCE_LABELS = {"emulated": "CPU emulation of the kernel", "measured": "GPU measurement",
                 "predicted": "hbmsim prediction"}


@dataclass
class ResultsFile:
    path: str
    source: str
    provenance: dict
    runs: list


@dataclass
class Row:
    run: str          # the configuration, one line
    field: str        # e.g. global_read_bytes, tensors.K.read
    predicted: float
    measured: float

    @property
    def rel_error(self) -> float:
        """|predicted - measured| / measured (0 when both are 0)."""
        if self.measured == 0:
            return 0.0 if self.predicted == 0 else math.inf
        return abs(self.predicted - self.measured) / abs(self.measured)


def load(path: str | Path) -> ResultsFile:
    """A results file, every run checked (_check_run); two runs of one configuration (run_key) are
    refused, since either could be matched. (So a predicted file that sweeps only mapping fields a
    measurement does not name, e.g. GEMM tiles, cannot be compared.)"""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise HbmsimError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise HbmsimError(f"{p}: cannot be read as a results file ({err})") from None
    except json.JSONDecodeError as err:
        raise HbmsimError(f"{p}: not valid JSON ({err})") from None
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise HbmsimError(f"{p}: field 'runs' must be a list of result objects (hbmsim run --json, emulate or profile)")
    source = data.get("source") or (runs[0].get("source") if runs else None) or "predicted"
    provenance = data.get("provenance") or {}
    if not isinstance(source, str):
        raise HbmsimError(f"{p}: field 'source' = {source!r} must be a string (predicted, emulated, measured)")
    if not isinstance(provenance, dict):
        raise HbmsimError(f"{p}: field 'provenance' = {provenance!r} must be an object")
    seen: dict = {}
    for i, r in enumerate(runs):
        _check_run(p, i, r, source)
        first = seen.setdefault((run_key(r), r.get("hardware")), i)     # one file may hold several GPUs
        if first != i:
            one = "one prediction" if source == "predicted" else "one measurement"
            raise HbmsimError(f"{p}: runs[{first}] and runs[{i}] are the same configuration ({describe(r)}): "
                              f"{one} per configuration")
    return ResultsFile(str(p), source, provenance, runs)


# Limits on numbers: (whole number?, ">" or ">=", bound).
BYTES, SOME_BYTES, TIME, COUNT = (True, ">=", 0), (True, ">", 0), (False, ">", 0), (True, ">=", 1)
WORKLOAD_COUNTS = ("batch", "heads", "seq_len", "seq_len_q", "seq_len_kv", "head_dim")


def field_limits(source: str) -> dict:
    """The limit on each of FIELDS in a file from `source` (see _check_run for the reasons)."""
    return {"global_read_bytes": SOME_BYTES, "global_write_bytes": SOME_BYTES,
            "hbm_read_bytes": BYTES if source == "measured" else SOME_BYTES, "hbm_write_bytes": BYTES,
            "time_s": TIME}


def within(v, limit: tuple) -> bool:
    """Whether v is a number (not a bool; NaN and infinities not) within `limit`: (whole number?,
    ">" or ">=", bound)."""
    whole, op, bound = limit
    if not _number(v) or (isinstance(v, float) and not math.isfinite(v)):     # JSON's NaN, Infinity
        return False
    if whole and isinstance(v, float) and not v.is_integer():
        return False
    return v > bound if op == ">" else v >= bound


def _check_run(p: Path, i: int, r: dict, source: str = "predicted") -> None:
    """The parts of a run that matching and tabulating rely on, and every number compared.

    null counts as absent (a file may omit fields: emulated runs have no times, no HBM bytes).
    - workload: an object of plain values; batch, heads, seq_len*, head_dim whole numbers >= 1.
    - algorithm, pass: strings; block_q, block_kv: whole numbers >= 1.
    - tensors.NAME.read / .write: whole numbers >= 0 (Q, K, V are never written).
    - global_read_bytes, global_write_bytes: whole numbers > 0. Every producer counts each pass's
      loads of its inputs and stores of its outputs (O, lse; dQ, dK, dV) at the L2 side, so zero
      is a broken file. time_s: a finite number > 0 (every kernel takes time).
    - hbm_read_bytes: > 0 in predicted files: the simulator starts every input cold in DRAM and
      each pass first touches one (Q, K, V; dO in the backward). >= 0 in measured files: profile
      runs ncu with --cache-control none right after copying the inputs to the GPU, so a small
      working set can be served by L2 without a DRAM read.
    - hbm_write_bytes: >= 0 everywhere. The simulator's L2 is write-back and DRAM writes are
      credited to the kernel running at eviction: with a small L2 (e.g. l2_bytes = 65536, flash2
      B=H=1 N=256 d=64 fp16 forward + backward) the forward's O stays dirty in L2 until the
      backward evicts it, and the forward's hbm_write_bytes is 0. On a GPU, outputs still dirty in
      L2 when the kernel ends likewise reach DRAM after ncu stops counting.
    """
    w = {} if r.get("workload") is None else r["workload"]
    if not isinstance(w, dict) or any(isinstance(v, (list, dict)) for v in w.values()):
        raise HbmsimError(f"{p}: runs[{i}].workload = {w!r} must be an object of plain values")
    for key, example in (("algorithm", registry.algorithms()[-1].name), ("pass", "forward")):
        if r.get(key) is not None and not isinstance(r[key], str):
            raise HbmsimError(f"{p}: runs[{i}].{key} = {r[key]!r} must be a plain value (a string, e.g. {example!r})")
    t = {} if r.get("tensors") is None else r["tensors"]
    if not isinstance(t, dict) or not all(isinstance(v, dict) for v in t.values()):
        raise HbmsimError(f"{p}: runs[{i}].tensors must map tensor names to {{\"read\": bytes, \"write\": bytes}}")
    checks = [(f, r.get(f), limit) for f, limit in field_limits(source).items()]
    checks += [(f"workload.{k}", w.get(k), COUNT) for k in WORKLOAD_COUNTS]
    checks += [(k, r.get(k), COUNT) for k in ("block_q", "block_kv")]
    checks += [(f"tensors.{name}.{side}", rw.get(side), BYTES) for name, rw in t.items() for side in ("read", "write")]
    for field, value, limit in checks:
        if value is not None and not within(value, limit):
            whole, op, bound = limit
            raise HbmsimError(f"{p}: runs[{i}] ({describe(r)}): field '{field}' = {value!r} must be a "
                              f"{'whole' if whole else 'finite'} number {op} {bound}")


def _match_fields(r: dict) -> tuple:
    """The mapping fields that identify a run of this program (its registry spec says which);
    for an algorithm hbmsim does not know, the flash block sizes when present."""
    names = [a.name for a in registry.algorithms(hopper=True)]
    if r.get("algorithm") in names:
        return registry.get(r["algorithm"]).match_fields
    return tuple(f for f in ("block_q", "block_kv") if f in r)


def run_key(r: dict) -> tuple:
    """What identifies a configuration: algorithm, pass, workload and (flash) block sizes."""
    w = dict(r.get("workload") or {})
    if "seq_len" in w:
        w.setdefault("seq_len_q", w["seq_len"])
        w.setdefault("seq_len_kv", w["seq_len"])
    # grouped-query heads (absent: as many K/V heads as query heads) and a paged KV cache (absent or
    # "contiguous": not paged) tell configurations apart too
    w["kv_heads"] = w.get("kv_heads") or w.get("heads")
    w["kv_page_size"] = None if w.get("kv_page_size") == "contiguous" else w.get("kv_page_size")
    workload = tuple((k, w.get(k)) for k in WORKLOAD_KEYS + ("kv_heads", "kv_page_size"))
    blocks = tuple(r.get(f) for f in _match_fields(r))
    return (r.get("algorithm"), r.get("pass", "forward"), workload, blocks)


def describe(r: dict) -> str:
    w = r.get("workload") or {}
    nq, nk = w.get("seq_len_q", w.get("seq_len")), w.get("seq_len_kv", w.get("seq_len"))
    text = (f"{r.get('algorithm')} {w.get('dtype')} B={w.get('batch')} H={w.get('heads')} N={nq}x{nk} "
            f"d={w.get('head_dim')}")
    if any(r.get(f) is not None for f in _match_fields(r)):
        text += " " + "x".join(str(r.get(f)) for f in _match_fields(r))
    return text + (" causal" if w.get("causal") else "")


def match(predicted: list, measured: list) -> tuple[list, list, list]:
    """(pairs, predicted runs without a measurement, measured runs without a prediction)."""
    by_key = {}
    for r in predicted:
        by_key.setdefault(run_key(r), r)
    pairs, unmatched_measured, used = [], [], set()
    for m in measured:
        k = run_key(m)
        if k in by_key:
            pairs.append((by_key[k], m))
            used.add(k)
        else:
            unmatched_measured.append(m)
    unmatched_predicted = [r for r in predicted if run_key(r) not in used]
    return pairs, unmatched_predicted, unmatched_measured


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def rows(pairs: list) -> list[Row]:
    out = []
    for pred, meas in pairs:
        label = describe(meas)
        for f in FIELDS:
            if _number(pred.get(f)) and _number(meas.get(f)):
                out.append(Row(label, f, pred[f], meas[f]))
        pt, mt = pred.get("tensors") or {}, meas.get("tensors") or {}
        for name in sorted(set(pt) & set(mt)):
            for side in ("read", "write"):     # sides that are zero in both files say nothing
                p, m = pt[name].get(side), mt[name].get(side)
                if _number(p) and _number(m) and (p or m):
                    out.append(Row(label, f"tensors.{name}.{side}", p, m))
    return out


def summary(table: list[Row]) -> dict:
    """Mean absolute percentage error per field (tensors.* pooled as "tensors")."""
    groups: dict = {}
    for row in table:
        groups.setdefault("tensors" if row.field.startswith("tensors.") else row.field, []).append(row.rel_error)
    return {f: (100.0 * sum(errs) / len(errs), len(errs)) for f, errs in groups.items()}


def _fmt(field: str, x: float) -> str:
    if field == "time_s":
        return f"{x * 1e6:,.2f} us"
    return f"{x:,.0f}"


def report(pred: ResultsFile, meas: ResultsFile, pairs: list, unmatched_pred: list, unmatched_meas: list) -> str:
    table = rows(pairs)
    label = SOURCE_LABELS.get(meas.source, meas.source)
    hw_pred = sorted({str(r.get("hardware")) for r, _ in pairs if r.get("hardware")})
    hw_meas = meas.provenance.get("gpu") or sorted({str(m.get("hardware")) for _, m in pairs if m.get("hardware")})
    lines = [f"predicted: {pred.path} ({pred.source}, hardware: {', '.join(hw_pred) or 'unknown'})",
             f"measured:  {meas.path} ({meas.source}: {label}, hardware: {hw_meas or 'none: not run on a GPU'})",
             f"matched {len(pairs)} run(s) by configuration (check that the hardware above is the same GPU)"]
    if table:
        width = max(len(r.run) for r in table)
        head = f"{'run':{width}s}  {'field':24s} {'predicted':>16s} {meas.source:>16s} {'error':>9s}"
        lines += ["", head, "-" * len(head)]
        last = None
        for r in table:
            err = "inf" if math.isinf(r.rel_error) else f"{100 * r.rel_error:.2f}%"
            lines.append(f"{r.run if r.run != last else '':{width}s}  {r.field:24s} {_fmt(r.field, r.predicted):>16s} "
                         f"{_fmt(r.field, r.measured):>16s} {err:>9s}")
            last = r.run
    lines += ["", "summary: mean absolute percentage error (|predicted - measured| / measured)"]
    for f, (mape, n) in summary(table).items():
        lines.append(f"  {f:24s} {mape:8.2f}%  over {n} value(s)")
    missing = [f for f in FIELDS if f not in {r.field for r in table}]
    if missing:
        lines.append(f"  not compared (absent from one file): {', '.join(missing)}")
    for what, runs in (("predicted without a measurement", unmatched_pred),
                       ("measured without a prediction", unmatched_meas)):
        if runs:
            lines.append(f"{what}: {len(runs)} run(s), e.g. {describe(runs[0])}")
    return "\n".join(lines)


def plot(pairs: list, path: str | Path, source: str) -> Path:
    """Predicted (x) against measured (y) bytes per run, log-log, with the y = x line."""
    plt = pyplot()
    path = check_plot_path(path)
    series = {"L2-side bytes, read + write": ("global_read_bytes", "global_write_bytes", "tab:blue", "o"),
              "HBM (DRAM) bytes, read + write": ("hbm_read_bytes", "hbm_write_bytes", "tab:red", "s")}
    fig, ax = plt.subplots(figsize=(6.5, 6))
    values = []
    for name, (rf, wf, color, marker) in series.items():
        pts = [(p[rf] + p[wf], m[rf] + m[wf]) for p, m in pairs
               if all(_number(x.get(f)) for x in (p, m) for f in (rf, wf))]
        pts = [(x, y) for x, y in pts if x > 0 and y > 0]
        if pts:
            ax.scatter(*zip(*pts), color=color, marker=marker, label=f"{name} ({len(pts)} runs)", alpha=0.8)
            values += [v for pt in pts for v in pt]
    if not values:
        plt.close(fig)
        raise HbmsimError("compare: no traffic field is present in both files, nothing to plot")
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="gray", ls="--", label="y = x (prediction exact)")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="predicted by hbmsim (bytes)",
           ylabel=f"{source}: {SOURCE_LABELS.get(source, source)} (bytes)",
           title=f"Traffic per run: predicted vs {source}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path)


def compare_files(predicted_path: str, measured_path: str, plot_path: str | None = None) -> str:
    plot_to = check_plot_path(plot_path) if plot_path else None     # before any work
    pred, meas = load(predicted_path), load(measured_path)
    pairs, up, um = match(pred.runs, meas.runs)
    if not pairs:
        raise HbmsimError(f"compare: no run of {measured_path} matches a run of {predicted_path} by configuration "
                          "(algorithm, pass, workload, block sizes)")
    text = report(pred, meas, pairs, up, um)
    if plot_to:
        text += f"\nwrote {plot(pairs, plot_to, meas.source)}"
    return text
