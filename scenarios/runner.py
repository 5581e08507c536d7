"""Runs configurations: builds the program for a run, simulates it, checks numerics against the
float64 reference when the data fits in memory, and returns DESIGN.md's result dicts.

A run whose passes include "backward" simulates a whole training step (the forward keeps what
the backward needs) and reports each requested pass, plus "forward+backward" when both are asked.
Every result is labelled `"source": "predicted"`: these numbers come from the simulator.
"""
from __future__ import annotations

import sys
import time
from typing import Callable

import numpy as np

from hbmsim.algorithms.blocks import auto_blocks
from hbmsim.algorithms.flash1 import flash1_forward, flash1_sram_bytes
from hbmsim.algorithms.flash1_backward import flash1_bwd_sram_bytes, flash1_training
from hbmsim.algorithms.flash2 import flash2_forward, flash2_sram_bytes
from hbmsim.algorithms.flash2_backward import flash2_bwd_sram_bytes, flash2_training
from hbmsim.algorithms.reference import attention_backward, attention_forward
from hbmsim.algorithms.standard import GEMM_TILE, standard_forward
from hbmsim.algorithms.standard_backward import standard_training
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
    needs = {"flash1": (flash1_sram_bytes, flash1_bwd_sram_bytes), "flash2": (flash2_sram_bytes, flash2_bwd_sram_bytes)}
    fwd_need, bwd_need = needs[cfg.run.algorithm]
    backward = "backward" in cfg.run.passes

    def fits(br, bc):
        need = max(fwd_need(wl, br, bc), bwd_need(wl, br, bc) if backward else 0)
        return need <= cfg.gpu.sram_bytes_per_sm
    br, bc = auto_blocks(cfg.gpu.sram_bytes_per_sm, wl.itemsize, wl.head_dim, wl.seq_len_q, wl.seq_len_kv, fits)
    bq, bkv = p.get("block_q", "auto"), p.get("block_kv", "auto")
    return {"block_q": br if bq == "auto" else bq, "block_kv": bc if bkv == "auto" else bkv}


def build_program(cfg: Config, data=None):
    wl, mp = cfg.workload, mapping(cfg)
    training = "backward" in cfg.run.passes
    if cfg.run.algorithm == "standard":
        tile = (mp["tile_m"], mp["tile_n"], mp["tile_k"])
        return standard_training(wl, data, tile) if training else standard_forward(wl, data, tile)
    build = {("flash1", False): flash1_forward, ("flash1", True): flash1_training,
             ("flash2", False): flash2_forward, ("flash2", True): flash2_training}[cfg.run.algorithm, training]
    return build(wl, mp["block_q"], mp["block_kv"], data)


def numerics_bytes(wl: Workload, algorithm: str, training: bool) -> int:
    g = wl.groups
    inputs = g * (wl.seq_len_q + 2 * wl.seq_len_kv) * wl.head_dim * (4 if training else 2)
    nn = g * wl.seq_len_q * wl.seq_len_kv
    nn_copies = 4 + (2 if algorithm == "standard" else 0) + (2 if wl.dropout > 0 else 0)
    nn_copies += (6 + (4 if algorithm == "standard" else 0)) if training else 0
    return 8 * (inputs + nn * nn_copies)


def workload_dict(wl: Workload) -> dict:
    d = wl.describe()
    if wl.seq_len_q == wl.seq_len_kv:
        d = {"seq_len": wl.seq_len_q, **d}
    return d


def run_config(cfg: Config, count_only: bool = False, seed: int = 0, trace: Callable | None = None) -> list[dict]:
    """Simulate one configuration; one result per requested pass (+ the total of a training step)."""
    wl = cfg.workload
    training = "backward" in cfg.run.passes
    numeric = not count_only and numerics_bytes(wl, cfg.run.algorithm, training) <= NUMERICS_BUDGET_BYTES
    data = random_data(wl, seed) if numeric else None
    result = simulate(cfg.gpu, build_program(cfg, data), trace)
    errors = {}
    if numeric:
        o_ref, _ = attention_forward(wl, data)
        errors["forward"] = float(np.max(np.abs(result.outputs["O"].reshape(o_ref.shape) - o_ref)))
        if training:
            grads = attention_backward(wl, data, data.d_o)
            errors["backward"] = max(float(np.max(np.abs(result.outputs[n].reshape(grads[n].shape) - grads[n])))
                                     for n in ("dQ", "dK", "dV"))
    passes = list(cfg.run.passes) + (["forward+backward"] if len(cfg.run.passes) == 2 else [])
    out = []
    for p in passes:
        select = None if p == "forward+backward" else p
        r = {"algorithm": cfg.run.algorithm, "pass": p, "hardware": cfg.gpu.name, "source": "predicted",
             "workload": workload_dict(wl), **mapping(cfg), **result.to_dict(select), "sim_events": result.sim_events}
        # max |simulated - float64 reference| over the pass's outputs (O; dQ, dK, dV); None: count-only
        r["max_abs_error"] = (max(errors.values()) if select is None else errors[select]) if numeric else None
        out.append(r)
    return out


def run_experiment(exp: Experiment, count_only: bool = False, progress: Callable | None = None) -> list[dict]:
    results = []
    n = len(exp.configs)
    for i, cfg in enumerate(exp.configs):
        t0 = time.perf_counter()
        rs = run_config(cfg, count_only)
        results.extend(rs)
        if progress:
            progress(i + 1, n, cfg, rs[-1], time.perf_counter() - t0)
    return results


def stderr_progress(i: int, n: int, cfg: Config, result: dict, wall_s: float) -> None:
    wl = cfg.workload
    mode = "count-only" if result["max_abs_error"] is None else f"max|O-ref| {result['max_abs_error']:.1e}"
    print(f"[{i}/{n}] {cfg.run.algorithm:8s} {'+'.join(cfg.run.passes):16s} N={wl.seq_len_q}x{wl.seq_len_kv} d={wl.head_dim} "
          f"B*H={wl.groups}: {wall_s:.2f} s wall, {mode}", file=sys.stderr, flush=True)
