"""Runs configurations: builds the program for a run, simulates it, checks numerics against the
float64 reference when the data fits in memory, and returns DESIGN.md's result dicts.

Every result is labelled `"source": "predicted"`: these numbers come from the simulator.
"""
from __future__ import annotations

import sys
import time
from typing import Callable

import numpy as np

from hbmsim.algorithms.blocks import auto_blocks
from hbmsim.algorithms.flash1 import flash1_forward
from hbmsim.algorithms.flash2 import flash2_forward
from hbmsim.algorithms.reference import attention_forward
from hbmsim.algorithms.standard import GEMM_TILE, standard_forward
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.simulator import simulate

from .experiment import Config, Experiment

# Numerics hold float64 copies of every tensor (and the reference's N x N matrices): above this
# many bytes a run is simulated count-only (same counts and times) and says so.
NUMERICS_BUDGET_BYTES = 1 << 30


def mapping(cfg: Config) -> dict:
    """The run's block sizes with "auto" resolved (flash) or its GEMM tiles (standard)."""
    wl, p = cfg.workload, cfg.run.params
    if cfg.run.algorithm == "standard":
        return {"tile_m": p.get("tile_m", GEMM_TILE[0]), "tile_n": p.get("tile_n", GEMM_TILE[1]),
                "tile_k": p.get("tile_k", GEMM_TILE[2])}
    br, bc = auto_blocks(cfg.gpu.sram_bytes_per_sm, wl.itemsize, wl.head_dim, wl.seq_len_q, wl.seq_len_kv)
    bq, bkv = p.get("block_q", "auto"), p.get("block_kv", "auto")
    return {"block_q": br if bq == "auto" else bq, "block_kv": bc if bkv == "auto" else bkv}


def build_program(cfg: Config, data=None):
    wl, mp = cfg.workload, mapping(cfg)
    if cfg.run.algorithm == "standard":
        return standard_forward(wl, data, (mp["tile_m"], mp["tile_n"], mp["tile_k"]))
    build = flash2_forward if cfg.run.algorithm == "flash2" else flash1_forward
    return build(wl, mp["block_q"], mp["block_kv"], data)


def numerics_bytes(wl: Workload, algorithm: str) -> int:
    g = wl.groups
    inputs = g * (wl.seq_len_q + 2 * wl.seq_len_kv) * wl.head_dim * 2      # data + program copies
    nn = g * wl.seq_len_q * wl.seq_len_kv
    nn_copies = 4 + (2 if algorithm == "standard" else 0) + (2 if wl.dropout > 0 else 0)
    return 8 * (inputs + nn * nn_copies)


def workload_dict(wl: Workload) -> dict:
    d = wl.describe()
    if wl.seq_len_q == wl.seq_len_kv:
        d = {"seq_len": wl.seq_len_q, **d}
    return d


def run_config(cfg: Config, count_only: bool = False, seed: int = 0, trace: Callable | None = None) -> dict:
    wl = cfg.workload
    numeric = not count_only and numerics_bytes(wl, cfg.run.algorithm) <= NUMERICS_BUDGET_BYTES
    data = random_data(wl, seed) if numeric else None
    result = simulate(cfg.gpu, build_program(cfg, data), trace)
    out = {"algorithm": cfg.run.algorithm, "pass": "forward", "hardware": cfg.gpu.name,
           "source": "predicted", "workload": workload_dict(wl), **mapping(cfg), **result.to_dict(),
           "sim_events": result.sim_events}
    if numeric:
        o_ref, _ = attention_forward(wl, data)
        o = result.outputs["O"].reshape(o_ref.shape)
        out["max_abs_error"] = float(np.max(np.abs(o - o_ref)))
    else:
        out["max_abs_error"] = None     # count-only: no data was moved
    return out


def run_experiment(exp: Experiment, count_only: bool = False, progress: Callable | None = None) -> list[dict]:
    results = []
    n = len(exp.configs)
    for i, cfg in enumerate(exp.configs):
        t0 = time.perf_counter()
        results.append(run_config(cfg, count_only))
        if progress:
            progress(i + 1, n, cfg, results[-1], time.perf_counter() - t0)
    return results


def stderr_progress(i: int, n: int, cfg: Config, result: dict, wall_s: float) -> None:
    wl = cfg.workload
    mode = "count-only" if result["max_abs_error"] is None else f"max|O-ref| {result['max_abs_error']:.1e}"
    print(f"[{i}/{n}] {cfg.run.algorithm:8s} N={wl.seq_len_q}x{wl.seq_len_kv} d={wl.head_dim} "
          f"B*H={wl.groups}: {wall_s:.2f} s wall, {mode}", file=sys.stderr, flush=True)
