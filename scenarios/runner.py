"""Runs configurations: builds the program for a run, simulates it, checks numerics against the
float64 reference when the data fits in memory, and returns DESIGN.md's result dicts.

A run whose passes include "backward" simulates a whole training step (the forward keeps what
the backward needs) and reports each requested pass, plus "forward+backward" when both are asked.
Every result is labelled `"source": "predicted"`: these numbers come from the simulator.
"""
from __future__ import annotations

import dataclasses
import math
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
from hbmsim.simulator import HbmsimError, check_program, simulate

from .experiment import HARDWARE_SWEEP_FIELDS, Config, Experiment

# Numerics hold float64 copies of every tensor (and the reference's N x N matrices): above this
# many bytes a run is simulated count-only (same counts and times) and says so.
NUMERICS_BUDGET_BYTES = 1 << 30


def mapping(cfg: Config) -> dict:
    """The run's block sizes with "auto" resolved (flash) or its GEMM tiles (standard)."""
    if cfg.mapping is not None:
        return cfg.mapping
    return resolve_mapping(cfg)[0]


def resolve_mapping(cfg: Config) -> tuple[dict, tuple]:
    """(mapping, notes): "auto" resolved by the paper's rule; a flash block longer than its
    sequence clamped to it (it would only reserve SRAM for rows that do not exist), and said so."""
    wl, p = cfg.workload, cfg.run.params
    if cfg.run.algorithm == "standard":
        return {"tile_m": p.get("tile_m", GEMM_TILE[0]), "tile_n": p.get("tile_n", GEMM_TILE[1]),
                "tile_k": p.get("tile_k", GEMM_TILE[2])}, ()
    needs = {"flash1": (flash1_sram_bytes, flash1_bwd_sram_bytes), "flash2": (flash2_sram_bytes, flash2_bwd_sram_bytes)}
    fwd_need, bwd_need = needs[cfg.run.algorithm]
    backward = "backward" in cfg.run.passes

    def fits(br, bc):
        need = max(fwd_need(wl, br, bc), bwd_need(wl, br, bc) if backward else 0)
        return need <= cfg.gpu.sram_bytes_per_sm
    br, bc = auto_blocks(cfg.gpu.sram_bytes_per_sm, wl.itemsize, wl.head_dim, wl.seq_len_q, wl.seq_len_kv, fits)
    out, notes = {}, []
    for key, auto, seq_field in (("block_q", br, "seq_len_q"), ("block_kv", bc, "seq_len_kv")):
        value, seq = p.get(key, "auto"), getattr(wl, seq_field)
        if value == "auto":
            value = auto
        elif value > seq:
            notes.append(f"{key} = {value} is longer than {seq_field} = {seq}: clamped to {seq}")
            value = seq
        out[key] = value
    return out, tuple(notes)


def prepare(exp: Experiment, progress: Callable | None = None) -> Experiment:
    """Resolve every configuration's mapping and check, without simulating, everything that
    could fail later: each kernel's block fits SRAM and the peak footprint fits HBM. An error
    names the file, the run, the sweep point and the mapping. Returns the experiment with the
    mappings filled in."""
    checked: dict = {}
    configs = []
    for i, cfg in enumerate(exp.configs):
        mp, notes = resolve_mapping(cfg)
        cfg = dataclasses.replace(cfg, mapping=mp, notes=notes)
        key = (cfg.gpu, cfg.workload, cfg.run.algorithm, cfg.run.passes, tuple(mp.items()))
        if key not in checked:
            try:
                check_program(cfg.gpu, build_program(cfg))
            except HbmsimError as err:
                raise HbmsimError(f"{cfg.where}: {', '.join(f'{k} = {v}' for k, v in mp.items())}: {err}") from None
            checked[key] = True
        configs.append(cfg)
        if progress:
            progress(i + 1, len(exp.configs))
    return dataclasses.replace(exp, configs=configs)


# Wall time of the simulator per tile step (one block's load + compute of one tile pair) on the
# 2-core machine the project is developed on, count-only: 11-17 us for flash2 forward at N = 1024
# to 2048 (gpt2-medium, block-sweep; this machine's speed varies by up to 50%). A rough figure
# for "this sweep will take about ...", nothing else.
WALL_S_PER_STEP = 15e-6


def estimated_wall_s(cfg: Config) -> float:
    """A rough estimate of how long simulating `cfg` takes: tile steps x WALL_S_PER_STEP."""
    wl, mp = cfg.workload, mapping(cfg)
    g, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    if cfg.run.algorithm == "standard":
        tm, tn, tk = mp["tile_m"], mp["tile_n"], mp["tile_k"]
        c = math.ceil
        # two GEMMs (S = QK^T: N x N outputs, k = d; O = PV: N x d outputs, k = N) and the
        # elementwise passes over S/P in tm x tn tiles (cheaper per tile: counted as two)
        steps = g * (c(nq / tm) * c(nk / tn) * (c(d / tk) + 2) + c(nq / tm) * c(d / tn) * c(nk / tk))
    else:
        steps = g * math.ceil(nq / mp["block_q"]) * math.ceil(nk / mp["block_kv"])
    if "backward" in cfg.run.passes:
        steps *= 3          # the backward does about twice the forward's tile steps
    return steps * WALL_S_PER_STEP


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
        hw_point = {k: v for k, v in cfg.point.items() if k in HARDWARE_SWEEP_FIELDS}
        if hw_point:
            r["hardware_sweep"] = hw_point       # the swept hardware fields of this point
        if cfg.notes:
            r["notes"] = list(cfg.notes)
        out.append(r)
    return out


def run_experiment(exp: Experiment, count_only: bool = False, progress: Callable | None = None,
                   results: list | None = None, on_result: Callable | None = None) -> list[dict]:
    """Run every configuration in order. Results are appended to `results` (a list the caller
    may keep, so that what finished survives an error or Ctrl-C) and `on_result(results)` is
    called after each configuration (e.g. to write the file so far)."""
    results = [] if results is None else results
    n = len(exp.configs)
    for i, cfg in enumerate(exp.configs):
        t0 = time.perf_counter()
        rs = run_config(cfg, count_only)
        results.extend(rs)
        if on_result:
            on_result(results)
        if progress:
            progress(i + 1, n, cfg, rs[-1], time.perf_counter() - t0)
    return results


def stderr_progress(i: int, n: int, cfg: Config, result: dict, wall_s: float) -> None:
    wl = cfg.workload
    mode = "count-only" if result["max_abs_error"] is None else f"max|O-ref| {result['max_abs_error']:.1e}"
    print(f"[{i}/{n}] {cfg.run.algorithm:8s} {'+'.join(cfg.run.passes):16s} N={wl.seq_len_q}x{wl.seq_len_kv} d={wl.head_dim} "
          f"B*H={wl.groups}: {wall_s:.2f} s wall, {mode}", file=sys.stderr, flush=True)
