"""Block-size maps: one workload simulated over a grid of block_q x block_kv, with the DRAM bytes,
the L2-side bytes and the predicted time of each cell, and the cells whose blocks do not fit SRAM
marked (with the reason) instead of simulated. "Simulate IO for new block sizes", as a picture.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from hbmsim.simulator import HbmsimError

from .experiment import Config, Experiment, RunSpec
from .outputs import pyplot, save_figure
from .runner import prepare, run_config

DEFAULT_SIZES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Cell:
    block_q: int
    block_kv: int
    dram_bytes: int | None = None       # None: not simulated (see `reason`)
    l2_side_bytes: int | None = None
    time_s: float | None = None
    reason: str = ""                    # why the cell was not simulated (the SRAM check's message)


def block_map(gpu, wl, algorithm: str = "flash2", sizes=DEFAULT_SIZES, passes=("forward",),
              progress: bool = False) -> list[Cell]:
    """Every (block_q, block_kv) of `sizes` x `sizes` for `algorithm` on `gpu`, count-only."""
    cells = []
    n = len(sizes) ** 2
    for i, (bq, bkv) in enumerate((a, b) for a in sizes for b in sizes):
        cfg = Config(gpu, wl, RunSpec(algorithm, tuple(passes), {"block_q": bq, "block_kv": bkv}),
                     where=f"block_q = {bq}, block_kv = {bkv}")
        try:
            cfg = prepare(Experiment("blockmap", "blockmap", gpu, [cfg])).configs[0]
        except HbmsimError as err:           # the blocks do not fit SRAM (or another limit): marked
            cells.append(Cell(bq, bkv, reason=str(err)))
            continue
        r = run_config(cfg, count_only=True)[-1]
        cells.append(Cell(bq, bkv, r["hbm_read_bytes"] + r["hbm_write_bytes"],
                          r["global_read_bytes"] + r["global_write_bytes"], r["time_s"]))
        if progress:
            print(f"blockmap: {i + 1}/{n} cells ({bq} x {bkv})", file=sys.stderr, flush=True)
    return cells


def table(cells: list[Cell]) -> str:
    lines = [f"{'block_q':>7s} {'block_kv':>8s} {'DRAM bytes':>14s} {'L2-side bytes':>14s} {'time (pred.)':>13s}"]
    for c in cells:
        if c.time_s is None:
            lines.append(f"{c.block_q:7d} {c.block_kv:8d}   does not fit: {c.reason.split(': ')[-1]}")
        else:
            lines.append(f"{c.block_q:7d} {c.block_kv:8d} {c.dram_bytes:14,d} {c.l2_side_bytes:14,d} "
                         f"{c.time_s * 1e6:10.2f} us")
    return "\n".join(lines)


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
