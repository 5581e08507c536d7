"""Readable output: the results table, the standard/flash ratios, and the demo's figure."""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path

from hbmsim.algorithms import registry

from .outputs import pyplot, save_figure


# A figure is printed with 3 significant digits in the smallest unit that keeps it under 1000:
# 1.95 TB, not 1.95e+03 GB; 150 s, not 1.5e+05 ms.
BYTE_UNITS = (("B", 1.0), ("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12), ("PB", 1e15), ("EB", 1e18))
TIME_UNITS = (("us", 1e-6), ("ms", 1e-3), ("s", 1.0), ("min", 60.0), ("h", 3600.0))


def _in_units(x: float, units: tuple, first: int = 0) -> tuple[int, str]:
    """(index of the unit, x in it to 3 significant digits): from units[first] up, the first unit
    whose figure, once rounded, is under 1000 (the last unit takes any figure)."""
    i = first
    while i + 1 < len(units) and abs(float(f"{x / units[i][1]:.3g}")) >= 1000:
        i += 1
    return i, f"{x / units[i][1]:.3g}"


def fmt_bytes(n: float) -> str:
    i, figure = _in_units(n, BYTE_UNITS)
    return f"{n:.0f} B" if i == 0 else f"{figure} {BYTE_UNITS[i][0]}"


def fmt_time(s: float) -> str:
    i, figure = _in_units(s, TIME_UNITS, first=0 if abs(s) < 1e-3 else 1)
    return f"{figure} {TIME_UNITS[i][0]}"


def _spec(r: dict):
    names = [a.name for a in registry.algorithms()]
    return registry.get(r["algorithm"]) if r.get("algorithm") in names else None


def _mapping(r: dict) -> str:
    """The run's mapping as its program writes it (e.g. 128x64, gemm 128x128x128); a forward
    row's without the backward's choices (they do not apply to it)."""
    spec = _spec(r)
    if spec is None:
        return "?"
    fields = {f: r[f] for f in spec.mapping_fields if f in r}
    if r.get("pass") == "forward":
        fields = forward_fields(spec, fields)
    try:
        return spec.describe(spec.mapping_type(**fields))
    except (TypeError, KeyError):
        return "?"


def forward_fields(spec, fields: dict) -> dict:
    """The mapping fields as the forward pass sees them: each backward block or tile (a field
    named X_bwd beside an X) equal to the forward's, each backward-only choice (bwd_*) at its
    default, so that the program's `describe` says nothing of the backward."""
    defaults = {f.name: f.default for f in dataclasses.fields(spec.mapping_type)}
    out = dict(fields)
    for name in fields:
        if name.endswith("_bwd") and name[:-len("_bwd")] in fields:
            out[name] = fields[name[:-len("_bwd")]]
        elif name.startswith("bwd_") and defaults.get(name, dataclasses.MISSING) is not dataclasses.MISSING:
            out[name] = defaults[name]
    return out


def _key(r: dict) -> tuple:
    """Results with equal keys differ only in the algorithm (and its mapping)."""
    w = r["workload"]
    return (_hardware(r), r["pass"], tuple(sorted((k, v) for k, v in w.items())))


def _masks(w: dict) -> str:
    """The workload's masks in a few characters: causal, key padding, dropout p."""
    parts = (["causal"] if w.get("causal") else []) + (["pad"] if w.get("key_padding_mask") else []) + \
        ([f"drop{w['dropout']:g}"] if w.get("dropout") else [])
    return "+".join(parts) or "-"


def _hardware(r: dict) -> str:
    swept = r.get("hardware_sweep") or {}
    extra = " ".join(f"{k}={v}" for k, v in swept.items() if k != "hardware")
    return f"{r['hardware']} {extra}".strip()


def table(results: list[dict]) -> str:
    """One row per result; a hardware column only when the results span several machines."""
    with_hw = len({_hardware(r) for r in results}) > 1
    head = (("hardware",) if with_hw else ()) + (
        "algorithm", "pass", "N_q x N_kv", "B*H", "d", "dtype", "masks", "mapping", "HBM read", "HBM write",
        "L2-side R+W", "HBM peak", "time (pred.)", "bound")
    first_number = head.index("HBM read")
    rows = [head]
    for r in results:
        w = r["workload"]
        rows.append((((_hardware(r),) if with_hw else ()) + (
            r["algorithm"], r["pass"], f"{w['seq_len_q']}x{w['seq_len_kv']}", str(w["batch"] * w["heads"]),
            str(w["head_dim"]), w["dtype"], _masks(w), _mapping(r), fmt_bytes(r["hbm_read_bytes"]),
            fmt_bytes(r["hbm_write_bytes"]), fmt_bytes(r["global_read_bytes"] + r["global_write_bytes"]),
            fmt_bytes(r["hbm_peak_bytes"]), fmt_time(r["time_s"]), r["bound"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(wd) if i >= first_number else c.ljust(wd) for i, (c, wd) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * wd for wd in widths))
    return "\n".join(lines)


def fast_note(results: list[dict]) -> str:
    """A line for the results that fast mode folded (simulated_fraction < 1), or ""."""
    folded = [r for r in results if r.get("simulated_fraction", 1.0) < 1.0]
    if not folded:
        return ""
    lo, hi = min(r["simulated_fraction"] for r in folded), max(r["simulated_fraction"] for r in folded)
    share = f"{lo:.1%}" if lo == hi else f"{lo:.1%}-{hi:.1%}"
    return (f"fast mode: {len(folded)} of {len(results)} results simulated {share} of their blocks and "
            "extrapolated the rest from the steady state (L2-side bytes and FLOPs exact; DRAM bytes and time "
            "extrapolated; --full simulates everything)")


def ratios(results: list[dict]) -> str:
    """baseline / other ratios of HBM bytes and predicted time, per workload: the baseline is
    the program that keeps the N x N matrices in HBM (the first registered one with nn_arrays)."""
    groups = defaultdict(dict)
    for r in results:
        groups[_key(r)].setdefault(r["algorithm"], r)
    lines = []
    for key, by_alg in groups.items():
        base = next((a for a in registry.algorithms() if a.nn_arrays[0] and a.name in by_alg), None)
        if base is None:
            continue
        std = by_alg[base.name]
        w = std["workload"]
        for other in registry.algorithms():
            f = by_alg.get(other.name)
            if f is None or other is base:
                continue
            hb = lambda x: x["hbm_read_bytes"] + x["hbm_write_bytes"]
            lines.append(f"N={w['seq_len_q']}x{w['seq_len_kv']} {std['pass']}: {base.name}/{other.name}: HBM bytes "
                         f"{hb(std) / hb(f):.1f}x, predicted time {std['time_s'] / f['time_s']:.2f}x")
    return "\n".join(lines)


def plot_vs_seq_len(results: list[dict], path: str | Path, title: str) -> Path:
    """Log-log HBM traffic, HBM footprint and predicted time against sequence length."""
    plt = pyplot()
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(".png")
    series = defaultdict(list)
    for r in results:
        series[r["algorithm"] if r["pass"] == "forward" else f"{r['algorithm']} {r['pass']}"].append(r)
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    colours = ("tab:red", "tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:gray")
    markers = ("o", "s", "^", "D", "v", "P", "X", "*")
    styles = {a.name: (colours[i % len(colours)], markers[i % len(markers)])
              for i, a in enumerate(registry.algorithms())}
    for alg, rs in sorted(series.items()):
        rs.sort(key=lambda r: r["workload"]["seq_len_q"])
        n = [r["workload"]["seq_len_q"] for r in rs]
        color, marker = styles.get(alg, ("k", "x"))
        axes[0].loglog(n, [r["hbm_read_bytes"] + r["hbm_write_bytes"] for r in rs], marker=marker, color=color,
                       label=f"{alg}: HBM (DRAM) bytes")
        axes[0].loglog(n, [r["global_read_bytes"] + r["global_write_bytes"] for r in rs], ls="--", marker=marker,
                       color=color, alpha=0.5, label=f"{alg}: L2-side bytes (requested)")
        axes[1].loglog(n, [r["hbm_peak_bytes"] for r in rs], marker=marker, color=color, label=alg)
        axes[2].loglog(n, [r["time_s"] * 1e3 for r in rs], marker=marker, color=color, label=alg)
    all_n = sorted({r["workload"]["seq_len_q"] for r in results})
    if len(all_n) >= 2:   # growth-law guides through the first standard point
        ref = next((r for r in results if r["workload"]["seq_len_q"] == all_n[0] and _spec(r) is not None
                    and _spec(r).nn_arrays[0]), None)
        if ref is not None:
            y0 = ref["hbm_read_bytes"] + ref["hbm_write_bytes"]
            axes[0].loglog(all_n, [y0 * (x / all_n[0]) ** 2 for x in all_n], color="gray", ls=":", label="~ N^2 guide")
            axes[0].loglog(all_n, [y0 * (x / all_n[0]) for x in all_n], color="gray", ls="-.", label="~ N guide")
    axes[0].set(xlabel="sequence length N (tokens)", ylabel="HBM traffic, read + write (bytes)",
                title="HBM traffic vs N")
    axes[1].set(xlabel="sequence length N (tokens)", ylabel="peak HBM footprint (bytes)",
                title="HBM footprint vs N (inputs + intermediates + outputs)")
    axes[2].set(xlabel="sequence length N (tokens)", ylabel="predicted time (ms)", title="Predicted runtime vs N")
    for ax in axes:
        ax.set_xticks(all_n, [str(x) for x in all_n])
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path)
