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
    names = [a.name for a in registry.algorithms(hopper=True)]
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
    """The workload's masks in a few characters: causal, key padding, dropout p; and a paged KV
    cache's page size (paged256), which is not a mask but tells two rows apart."""
    parts = (["causal"] if w.get("causal") else []) + (["pad"] if w.get("key_padding_mask") else []) + \
        ([f"drop{w['dropout']:g}"] if w.get("dropout") else []) + \
        ([f"paged{w['kv_page_size']}"] if w.get("kv_page_size") else [])
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
    how = "the steady state"
    sliced = [r for r in folded if r.get("slice_of", 1) > 1]
    if sliced:
        k = max(r["slice_of"] for r in sliced)
        how = f"a 1/{k} slice of the GPU" if len(sliced) == len(folded) else "the steady state or a slice of the GPU"
    return (f"fast mode: {len(folded)} of {len(results)} results simulated {share} of their blocks and "
            f"extrapolated the rest from {how} (L2-side bytes and FLOPs exact; DRAM bytes and time "
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
    """The figure of plot_sweep with its x-axis found from the results (N when N varies)."""
    return plot_sweep(results, path, title)


# Sweep keys that name a result's coordinate under another name, and how the x-axis says them.
_X_LABELS = {"seq_len": "sequence length N (tokens)", "seq_len_q": "query length N_q (tokens)",
             "seq_len_kv": "key/value length N_kv (tokens)"}
_X_NAMES = {"seq_len": "N", "seq_len_q": "N_q", "seq_len_kv": "N_kv"}


def _coord(r: dict, key: str):
    """A result's value of a sweep key (a workload, mapping or hardware field, the algorithm or
    the pass), or None where it has none (e.g. block_kv of a program without one)."""
    w = r["workload"]
    if key == "seq_len":
        return w["seq_len_q"] if w["seq_len_q"] == w["seq_len_kv"] else None
    if key in w:
        return w[key]
    if key == "algorithm":
        return r["algorithm"]
    if key == "passes":
        return r["pass"]
    if key == "hardware":
        return r.get("hardware")
    if key in r.get("hardware_sweep", {}):
        return r["hardware_sweep"][key]
    spec = _spec(r)
    return r.get(key) if spec is not None and key in spec.mapping_fields else None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _candidate_keys(results: list[dict]) -> list[str]:
    """Every coordinate a result has: N first, then the workload's, the mapping's and the hardware's."""
    keys = ["seq_len", "seq_len_q", "seq_len_kv"]
    for r in results:
        keys += [k for k in r["workload"] if k not in keys]
        spec = _spec(r)
        keys += [k for k in (spec.mapping_fields if spec else ()) if k not in keys]
        keys += [k for k in r.get("hardware_sweep", {}) if k not in keys]
    return keys + ["hardware"]


def _varies(results: list[dict], key: str) -> bool:
    values = {repr(_coord(r, key)) for r in results if _coord(r, key) is not None}
    return len(values) > 1


def x_field(results: list[dict], swept=()) -> str:
    """The field a figure's x-axis shows: of the swept fields (an experiment's [sweep] keys, in
    order; all of the results' coordinates when none are given), N when N varies, else the first
    numeric one that varies, else the first that varies at all (drawn as categories), else N."""
    keys = [k for k in (swept or _candidate_keys(results)) if k not in ("algorithm", "passes")]
    keys.sort(key=lambda k: k not in _X_LABELS)           # N first, else the given order
    varying = [k for k in keys if _varies(results, k)]
    numeric = [k for k in varying if all(_is_number(_coord(r, k)) for r in results if _coord(r, k) is not None)]
    if numeric:
        return numeric[0]
    if varying:
        return varying[0]
    return "seq_len" if all(_coord(r, "seq_len") is not None for r in results) else "seq_len_q"


def _block_text(r: dict, spec, skip: set) -> str:
    """The run's blocks or tiles that apply to its pass, less the fields in `skip`: "block 128x64",
    "tile 128x128x32", or "block_q=128" when only some are left."""
    if spec is None:
        return ""
    fields = [f for f in spec.mapping_fields if f.startswith(("block_", "tile_")) and f in r]
    bwd = [f for f in fields if f.endswith("_bwd")]
    if r["pass"] == "forward" or not bwd:
        fields = [f for f in fields if not f.endswith("_bwd")]
    elif r["pass"] == "backward":
        fields = bwd
    kept = [f for f in fields if f not in skip and f.removesuffix("_bwd") not in skip]
    if not kept:
        return ""
    if kept == fields:
        kind = "tile" if kept[0].startswith("tile_") else "block"
        text = f"{kind} {'x'.join(str(r[f]) for f in kept)}"
        return text + (" (bwd)" if r["pass"] == "backward" and bwd else "")
    return " ".join(f"{f}={r[f]}" for f in kept)


def _series(results: list[dict], x: str) -> dict:
    """{label: results} of the lines to draw: one per program and pass, split further by every
    field that differs between results at the same x (two runs that differ only in block size
    are two lines), each label naming the program, the pass, the variant and the blocks."""
    keys = [k for k in _candidate_keys(results) if k != x and not (x in _X_LABELS and k in _X_LABELS)]
    at_x = defaultdict(list)
    for r in results:
        at_x[(r["algorithm"], r["pass"], repr(_coord(r, x)))].append(r)
    split = defaultdict(list)          # per program and pass: the fields that tell its results apart at one x
    for (alg, p, _), group in at_x.items():
        split[(alg, p)] += [k for k in keys if k not in split[(alg, p)] and _varies(group, k)]
    groups = defaultdict(list)
    for r in results:
        own = split[(r["algorithm"], r["pass"])]
        groups[(r["algorithm"], r["pass"]) + tuple((k, repr(_coord(r, k))) for k in own)].append(r)
    out = {}
    for rs in groups.values():
        r, spec = rs[0], _spec(rs[0])
        parts = [r["algorithm"]] + ([r["pass"]] if r["pass"] != "forward" else [])
        if spec is not None and spec.variants and "variant" != x:
            parts.append(str(r.get("variant", spec.variants[0])))
        constant = {k for k in (spec.mapping_fields if spec else ()) if k != x and not _varies(rs, k)}
        skip = {k for k in (spec.mapping_fields if spec else ()) if k not in constant} | {x}
        block = _block_text(r, spec, skip)
        parts += [block] if block else []
        mapping = spec.mapping_fields if spec else ()
        parts += [f"{k}={_coord(r, k)}" for k in split[(r["algorithm"], r["pass"])]
                  if k not in mapping and _coord(r, k) is not None]
        label = " ".join(parts)
        while label in out:
            label += "'"
        out[label] = rs
    return out


def _log_axis(axis, values: list[float], fmt) -> None:
    """A log axis over `values` with labelled ticks however few decades it spans: 1-2-5 steps,
    or, within a factor of a few, evenly spaced ones; each label written by `fmt`."""
    import math

    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter, NullLocator
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if not vals:
        return
    lo, hi = min(vals), max(vals)
    if hi == lo:
        lo, hi = lo / 1.5, hi * 1.5
    pad = (hi / lo) ** 0.05
    lo_lim, hi_lim = lo / pad, hi * pad
    ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo_lim)), math.ceil(math.log10(hi_lim)) + 1)
             for m in (1, 2, 5) if lo_lim <= m * 10.0 ** e <= hi_lim]
    if len(ticks) > 8:
        ticks = [t for t in ticks if f"{t:.0e}".startswith("1")] or ticks
        step = math.ceil(len(ticks) / 8)
        ticks = ticks[::step]
    if len(ticks) < 3:
        ticks = [t for t in MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(lo_lim, hi_lim)
                 if lo_lim <= t <= hi_lim and t > 0]
    if len(ticks) < 2:
        ticks = [lo, hi]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())
    getattr(axis.axes, f"set_{axis.axis_name}lim")(lo_lim, hi_lim)


def plot_sweep(results: list[dict], path: str | Path, title: str, swept=()) -> Path:
    """HBM traffic (DRAM and L2-side), peak HBM footprint and predicted time against the swept
    field (`x_field`: N when N is swept, else e.g. block_kv), one line per program, pass, variant
    and block (`_series`), each panel's ticks labelled. A result without the swept field (standard
    attention in a block sweep) is a flat dashed line: the same at every x."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    plt = pyplot()
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(".png")
    x = x_field(results, swept)
    xs = list({_coord(r, x): None for r in results if _coord(r, x) is not None})
    numeric = bool(xs) and all(_is_number(v) for v in xs)
    xs.sort(key=lambda v: v if numeric else str(v))
    pos = (lambda v: v) if numeric else (lambda v: xs.index(v))
    series = _series(results, x)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    colours = ("tab:red", "tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
               "tab:olive", "tab:cyan")
    markers = ("o", "s", "^", "D", "v", "P", "X", "*")
    programs = [a.name for a in registry.algorithms(hopper=True)]
    panels = ((lambda r: r["hbm_read_bytes"] + r["hbm_write_bytes"]), (lambda r: r["hbm_peak_bytes"]),
              (lambda r: r["time_s"]))
    lo_x, hi_x = (pos(xs[0]), pos(xs[-1])) if xs else (0, 1)
    ys: list[list[float]] = [[], [], []]
    for i, (label, rs) in enumerate(series.items()):
        color = colours[i % len(colours)]
        alg = rs[0]["algorithm"]
        marker = markers[(programs.index(alg) if alg in programs else len(programs) + i) % len(markers)]
        placed = sorted((r for r in rs if _coord(r, x) is not None), key=lambda r: xs.index(_coord(r, x)))
        flat = [r for r in rs if _coord(r, x) is None]
        for k, value in enumerate(panels):
            lines = [(value, {}, label)] + ([((lambda r: r["global_read_bytes"] + r["global_write_bytes"]),
                                              {"ls": "--", "alpha": 0.5}, None)] if k == 0 else [])
            for get, style, lab in lines:
                if placed:
                    yv = [get(r) for r in placed]
                    axes[k].plot([pos(_coord(r, x)) for r in placed], yv, marker=marker, color=color, label=lab,
                                 **style)
                    ys[k] += yv
                for r in flat[:1]:              # the same at every x: a flat line across the axis
                    flat_label = f"{lab} (no {x}: flat)" if lab and not placed else None
                    axes[k].plot([lo_x, hi_x], [get(r)] * 2, color=color, ls=style.get("ls", "-."),
                                 alpha=style.get("alpha", 1.0), label=flat_label)
                    ys[k].append(get(r))
    if x in _X_LABELS and numeric and len(xs) >= 2:   # growth-law guides through the first baseline point
        ref = next((r for r in results if _coord(r, x) == xs[0] and _spec(r) is not None and _spec(r).nn_arrays[0]),
                   None)
        if ref is not None:
            y0 = ref["hbm_read_bytes"] + ref["hbm_write_bytes"]
            axes[0].plot(xs, [y0 * (v / xs[0]) ** 2 for v in xs], color="gray", ls=":", label="~ N^2 guide")
            axes[0].plot(xs, [y0 * (v / xs[0]) for v in xs], color="gray", ls="-.", label="~ N guide")
            ys[0] += [y0 * (v / xs[0]) ** 2 for v in xs] + [y0 * (v / xs[0]) for v in xs]
    xname, short = _X_LABELS.get(x, x), _X_NAMES.get(x, x)
    axes[0].set(xlabel=xname, ylabel="HBM traffic, read + write", title=f"HBM traffic vs {short}")
    axes[1].set(xlabel=xname, ylabel="peak HBM footprint", title=f"HBM footprint vs {short} (inputs + intermediates "
                "+ outputs)")
    axes[2].set(xlabel=xname, ylabel="predicted time", title=f"Predicted runtime vs {short}")
    for k, ax in enumerate(axes):
        if numeric and xs and min(xs) > 0 and max(xs) / min(xs) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks([pos(v) for v in xs], [str(v) for v in xs])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_yscale("log")
        _log_axis(ax.yaxis, ys[k], fmt_time if k == 2 else fmt_bytes)
        ax.grid(True, which="major", alpha=0.3)
    style = [Line2D([], [], color="k", label="solid: DRAM (HBM) bytes"),
             Line2D([], [], color="k", ls="--", alpha=0.5, label="dashed: L2-side bytes (requested)")]
    handles, labels = axes[0].get_legend_handles_labels()
    guides = [(h, la) for h, la in zip(handles, labels) if "guide" in la]
    axes[0].legend(handles=style + [h for h, _ in guides], fontsize=8)
    axes[2].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), title="series", title_fontsize=8)
    fig.suptitle(title + " (predicted by hbmsim, not measured)" if "predicted" not in title else title)
    return save_figure(fig, path)
