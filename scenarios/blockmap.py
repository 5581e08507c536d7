"""Block-size maps: one workload simulated over a grid of block_q x block_kv, with the DRAM bytes,
the L2-side bytes and the predicted time of each cell, and the cells whose blocks do not fit SRAM
marked (with the reason) instead of simulated. "Simulate IO for new block sizes", as a picture.

Inputs are checked before any simulation (`mappable`, `plan`): a program without block_q and
block_kv (standard attention's mapping is GEMM tiles), a workload whose tensors do not fit HBM,
and a grid where no cell fits are refused with one line. The cells are simulated in the runner's
fast mode unless asked otherwise (`fast=False`), and `estimated_wall_s` says how long that may take.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from hbmsim.algorithms import registry
from hbmsim.simulator import HbmsimError

from .experiment import Config, Experiment, RunSpec
from .outputs import pyplot, save_figure
from .report import fmt_time
from .runner import estimated_wall_s, prepare, run_config

DEFAULT_SIZES = (16, 32, 64, 128, 256)
AXES = ("block_q", "block_kv")      # the mapping fields a program needs for a block map


@dataclass(frozen=True)
class Cell:
    block_q: int
    block_kv: int
    dram_bytes: int | None = None       # None: not simulated (see `reason`)
    l2_side_bytes: int | None = None
    time_s: float | None = None
    reason: str = ""                    # why the cell was not simulated (the SRAM check's message)
    simulated_fraction: float | None = None   # < 1: fast mode simulated this share of the blocks


def mapped_programs() -> list[str]:
    """The registered programs a block map can sweep: those with block_q and block_kv."""
    return [a.name for a in registry.algorithms() if all(f in a.mapping_fields for f in AXES)]


def mappable(algorithm: str, option: str = "--algorithm") -> registry.AlgorithmSpec:
    """The program's spec, or one line saying why it has no block_q x block_kv map."""
    names = mapped_programs()
    known = [a.name for a in registry.algorithms()]
    if algorithm not in known:
        raise HbmsimError(f"blockmap: {option} = {algorithm!r} must be one of {', '.join(names)} "
                          "(the programs with block_q x block_kv)")
    spec = registry.get(algorithm)
    if algorithm not in names:
        raise HbmsimError(f"blockmap: {option} = {algorithm!r} has no block_q x block_kv to map (its mapping is "
                          f"{', '.join(spec.mapping_fields)}): give one of {', '.join(names)}, or sweep its fields "
                          "in an experiment's [sweep] and plot it with `hbmsim run FILE --plot`")
    return spec


def _cell_config(gpu, wl, algorithm: str, passes, bq: int, bkv: int) -> Config:
    return Config(gpu, wl, RunSpec(algorithm, tuple(passes), {"block_q": bq, "block_kv": bkv}), where="cell")


def check_workload(gpu, wl, where: str = "blockmap") -> None:
    """Q, K, V and O alone must fit HBM whatever the blocks (the runner's first check, said for
    the whole map instead of once per cell)."""
    need = wl.groups * (2 * wl.seq_len_q + 2 * wl.seq_len_kv) * wl.head_dim * wl.itemsize
    if need > gpu.hbm_capacity_bytes:
        raise HbmsimError(f"{where}: Q, K, V and O alone need {need:,} bytes of HBM, more than "
                          f"hbm_capacity_bytes = {gpu.hbm_capacity_bytes:,} on {gpu.name}")


def plan(gpu, wl, algorithm: str = "flash2", sizes=DEFAULT_SIZES, passes=("forward",),
         where: str = "blockmap") -> list:
    """Every (block_q, block_kv) of `sizes` x `sizes`, checked without simulating: a prepared
    Config for each cell that fits, a Cell with the reason for each that does not. Refused (one
    line) when the program has no block map, the workload does not fit HBM, or no cell fits."""
    mappable(algorithm)
    check_workload(gpu, wl, where)
    out: list = []
    for bq, bkv in ((a, b) for a in sizes for b in sizes):
        cfg = _cell_config(gpu, wl, algorithm, passes, bq, bkv)
        try:
            out.append(prepare(Experiment("blockmap", "blockmap", gpu, [cfg])).configs[0])
        except HbmsimError as err:           # the blocks do not fit SRAM (or another limit): marked
            # "cell: block_q = 16, block_kv = 16: kernel flash2_fwd: a block needs ..."
            out.append(Cell(bq, bkv, reason=str(err).removeprefix(f"{cfg.where}: ")))
    if not any(isinstance(c, Config) for c in out):
        smallest = min(out, key=lambda c: (c.block_q * c.block_kv, c.block_q))
        raise HbmsimError(f"{where}: no cell of --sizes {','.join(map(str, sizes))} fits, the smallest neither: "
                          f"{smallest.reason}")
    return out


def estimate_s(planned: list, fast: bool = True) -> float:
    """Rough wall seconds to simulate the planned cells (in fast mode an upper bound: folding
    steady launches is decided while simulating)."""
    return sum(estimated_wall_s(c, fast=fast) for c in planned if isinstance(c, Config))


def simulate(planned: list, fast: bool = True, progress=None) -> list[Cell]:
    """Simulate each planned cell count-only (in fast mode unless fast=False). `progress` is a
    progress.RunProgress (start(cfg) -> per-block callback, done(i, n, cfg, result, wall_s)) or None."""
    cells = []
    n = sum(isinstance(c, Config) for c in planned)
    i = 0
    for cfg in planned:
        if isinstance(cfg, Cell):
            cells.append(cfg)
            continue
        t0 = time.perf_counter()
        on_block = progress.start(cfg) if progress is not None else None
        r = run_config(cfg, count_only=True, fast=fast, progress=on_block)[-1]
        i += 1
        if progress is not None:
            progress.done(i, n, cfg, r, time.perf_counter() - t0)
        p = cfg.run.params
        cells.append(Cell(p["block_q"], p["block_kv"], r["hbm_read_bytes"] + r["hbm_write_bytes"],
                          r["global_read_bytes"] + r["global_write_bytes"], r["time_s"],
                          simulated_fraction=r.get("simulated_fraction", 1.0)))
    return cells


def block_map(gpu, wl, algorithm: str = "flash2", sizes=DEFAULT_SIZES, passes=("forward",),
              progress=None, fast: bool = True) -> list[Cell]:
    """Every (block_q, block_kv) of `sizes` x `sizes` for `algorithm` on `gpu`, count-only, in
    fast mode unless fast=False (see `plan` for what is refused)."""
    return simulate(plan(gpu, wl, algorithm, sizes, passes), fast, progress)


def table(cells: list[Cell]) -> str:
    lines = [f"{'block_q':>7s} {'block_kv':>8s} {'DRAM bytes':>14s} {'L2-side bytes':>14s} {'time (pred.)':>13s}"]
    for c in cells:
        if c.time_s is None:
            lines.append(f"{c.block_q:7d} {c.block_kv:8d}   does not fit: {c.reason.split(': ')[-1]}")
        else:
            lines.append(f"{c.block_q:7d} {c.block_kv:8d} {c.dram_bytes:14,d} {c.l2_side_bytes:14,d} "
                         f"{fmt_time(c.time_s):>13s}")
    return "\n".join(lines)


def fast_note(cells: list[Cell]) -> str:
    """A line for the cells fast mode folded (simulated_fraction < 1), or ""."""
    folded = [c for c in cells if c.simulated_fraction is not None and c.simulated_fraction < 1.0]
    if not folded:
        return ""
    lo, hi = min(c.simulated_fraction for c in folded), max(c.simulated_fraction for c in folded)
    share = f"{lo:.1%}" if lo == hi else f"{lo:.1%}-{hi:.1%}"
    simulated = sum(c.time_s is not None for c in cells)
    return (f"fast mode: {len(folded)} of {simulated} cells simulated {share} of their blocks and extrapolated the "
            "rest from the steady state (L2-side bytes exact; DRAM bytes and time extrapolated; --full simulates "
            "everything)")


def plot(cells: list[Cell], path: str | Path, title: str) -> Path:
    import numpy as np

    plt = pyplot()
    import matplotlib.colors
    qs = sorted({c.block_q for c in cells})
    ks = sorted({c.block_kv for c in cells})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    panels = (("dram_bytes", "DRAM bytes (MB)", 1e-6), ("l2_side_bytes", "L2-side bytes (MB)", 1e-6),
              ("time_s", "predicted time (us)", 1e6))
    for ax, (field, label, unit) in zip(axes, panels):
        grid = np.full((len(qs), len(ks)), np.nan)
        for c in cells:
            v = getattr(c, field)
            if v is not None:
                grid[qs.index(c.block_q), ks.index(c.block_kv)] = v * unit
        finite = grid[np.isfinite(grid)]
        norm = (matplotlib.colors.LogNorm(vmin=finite.min(), vmax=finite.max())
                if finite.size and finite.min() > 0 and finite.max() > finite.min() else None)
        im = ax.imshow(grid, origin="lower", cmap="viridis", norm=norm)
        for i in range(len(qs)):
            for j in range(len(ks)):
                v = grid[i, j]
                text = "does not\nfit SRAM" if math.isnan(v) else f"{v:.3g}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="red" if math.isnan(v) else "white")
        ax.set(xticks=range(len(ks)), xticklabels=ks, yticks=range(len(qs)), yticklabels=qs,
               xlabel="block_kv", ylabel="block_q", title=label)
        fig.colorbar(im, ax=ax, shrink=0.8, label=label)
    fig.suptitle(title + " (predicted by hbmsim, simulated, not measured)", fontsize=10)
    return save_figure(fig, path, dpi=100)
