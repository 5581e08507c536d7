"""Runs configurations: builds the program for a run, simulates it, checks numerics against the
float64 reference when the data fits in memory, and returns the result dicts (README, Results JSON reference).

A run whose passes include "backward" simulates a whole training step (the forward keeps what
the backward needs) and reports each requested pass, plus "forward+backward" when both are asked.
Every result is labelled `"source": "predicted"`: these numbers come from the simulator.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable

import numpy as np

from hbmsim.algorithms.reference import attention_backward, attention_forward
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.simulator import HbmsimError, TimeModel, check_program, simulate, slice_shared

from .experiment import HARDWARE_SWEEP_FIELDS, Config, Experiment

# Numerics hold float64 copies of every tensor (and the reference's N x N matrices): above this
# many bytes a run is simulated count-only (same counts and times) and says so.
NUMERICS_BUDGET_BYTES = 1 << 30


def resolved_mapping(cfg: Config):
    """The run's mapping (its program's mapping dataclass), every field resolved."""
    if cfg.mapping is not None:
        return cfg.mapping
    return resolve_mapping(cfg)[0]


def resolve_mapping(cfg: Config) -> tuple:
    """(mapping, notes): the program's own rule ("auto", clamping, SRAM fit of every pass)."""
    spec = cfg.run.spec
    return spec.resolved(cfg.gpu, cfg.workload, spec.mapping_from(cfg.run.params, cfg.where), cfg.run.training)


def mapping_text(mp) -> str:
    return ", ".join(f"{k} = {v}" for k, v in dataclasses.asdict(mp).items())


def prepare(exp: Experiment, progress: Callable | None = None) -> Experiment:
    """Resolve every configuration's mapping and check, without simulating, everything that
    could fail later: each kernel's block fits SRAM and the peak footprint fits HBM. An error
    names the file, the run, the sweep point and the mapping. Returns the experiment with the
    mappings filled in."""
    checked: dict = {}
    configs = []
    for i, cfg in enumerate(exp.configs):
        wl = cfg.workload
        # Q, K, V and O alone (every program keeps them in HBM): checked before building a
        # program whose tile lists could be as long as the sequence.
        # (K and V: one per K/V head, kv_heads of them, under grouped-query attention)
        qkvo_bytes = (wl.groups * 2 * wl.seq_len_q + wl.kv_groups * 2 * wl.seq_len_kv) * wl.head_dim * wl.itemsize
        if qkvo_bytes > cfg.gpu.hbm_capacity_bytes:
            raise HbmsimError(f"{cfg.where}: Q, K, V and O alone need {qkvo_bytes} bytes of HBM, more than "
                              f"hbm_capacity_bytes = {cfg.gpu.hbm_capacity_bytes} on {cfg.gpu.name}")
        try:
            mp, notes = resolve_mapping(cfg)
        except HbmsimError as err:                 # e.g. a variant that does not support the head dim
            raise HbmsimError(f"{cfg.where}: {err}") from None
        cfg = dataclasses.replace(cfg, mapping=mp, notes=notes)
        key = (cfg.gpu, cfg.workload, cfg.run.algorithm, cfg.run.passes, mp)
        if key not in checked:
            try:
                check_program(cfg.gpu, build_program(cfg))
            except HbmsimError as err:
                given = ", ".join(f"{k} = {v}" for k, v in cfg.run.params.items())    # what the user set
                raise HbmsimError(f"{cfg.where}: {given or mapping_text(mp)}: {err}") from None
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


def estimated_wall_s(cfg: Config, fast: bool = False) -> float:
    """A rough estimate of how long simulating `cfg` takes: the program's tile steps x
    WALL_S_PER_STEP; in fast mode its simulated steps (several tiles each), an upper bound since
    folding is decided while simulating."""
    spec = cfg.run.spec
    if spec.steps is None:
        return 0.0
    extra = {"fast": True} if fast and spec.coarsens else {}
    return spec.steps(cfg.workload, resolved_mapping(cfg), cfg.run.training, **extra) * WALL_S_PER_STEP


# Fast mode's slices: a program whose batch-heads are alike (AlgorithmSpec.slices: flash1, whose
# long blocks fold.py cannot fold; standard attention, whose many launches fold.py folds a wave at a
# time) runs on 1/k of the GPU with 1/k of its batch-heads, and its counts are taken k times
# (GPU.slice_of, SimResult.scaled). Each SM then sees what it sees in the whole GPU: the same
# blocks, the same share of DRAM and L2. What every batch-head shares (a causal mask: Tensor.shared)
# the slice holds whole, and the launches that build it run one block in k (sliced_program,
# program.slice_shared). Against the unsliced simulation (FA1's kernel, A100 and H100, N =
# 2048-8192, causal or not, forward and training; PyTorch's attention at N = 1024-16384, training,
# unmasked and causal): time within 0.7%, DRAM bytes within 1.3%, L2-side bytes and FLOPs exact
# (tests/test_slices.py). flash2 stays whole: on a slice its DRAM writes moved 2-10%, and causal
# runs' time 1-5%.
SLICES = (4, 2)           # slice factors tried, largest first
MIN_SLICE_SMS = 16        # a slice keeps at least this many SMs


def slice_factor(cfg: Config) -> int:
    """The k of fast mode's slice for cfg (1: the whole GPU): k divides the SMs and the batch (or
    the heads and KV heads) and leaves at least MIN_SLICE_SMS SMs; batch-heads that differ (key
    padding's lengths, a paged KV cache's block table) are never sliced."""
    wl, gpu = cfg.workload, cfg.gpu
    slices = cfg.run.spec.slices
    if slices is None or wl.key_padding_mask or wl.kv_page_size:
        return 1
    for k in SLICES:
        if gpu.sm_count % k == 0 and gpu.sm_count // k >= MIN_SLICE_SMS and slices(wl, gpu.l2_bytes, k) and (
                wl.batch % k == 0 or (wl.heads % k == 0 and wl.kv_heads % k == 0)):
            return k
    return 1


def sliced(cfg: Config, k: int) -> Config:
    """cfg on 1/k of its GPU with 1/k of its batch (or heads), its resolved mapping kept."""
    wl = cfg.workload
    wl = dataclasses.replace(wl, batch=wl.batch // k) if wl.batch % k == 0 else \
        dataclasses.replace(wl, heads=wl.heads // k, kv_heads=wl.kv_heads // k)
    return dataclasses.replace(cfg, gpu=cfg.gpu.slice_of(k), workload=wl, mapping=resolved_mapping(cfg))


def sliced_program(cfg: Config, k: int) -> tuple:
    """(the slice's config, its fast count-only program), the launches every batch-head shares
    running one in k of their blocks (program.slice_shared); (cfg, None) when that does not split
    evenly, or when the slice's k-th of HBM cannot hold the shared tensors whole beside its share."""
    run = sliced(cfg, k)
    program = slice_shared(build_program(run, None, True), k)
    if program is None:
        return cfg, None
    try:
        check_program(run.gpu, program)
    except HbmsimError:
        return cfg, None
    return run, program


def build_program(cfg: Config, data=None, fast: bool = False):
    spec = cfg.run.spec
    extra = {"fast": True} if fast and spec.coarsens else {}
    return spec.build(cfg.workload, resolved_mapping(cfg), data, cfg.run.training, **extra)


def numerics_bytes(wl: Workload, spec, training: bool) -> int:
    """float64 bytes a run with data holds: the inputs (and gradients), and the N x N arrays of
    the reference (4, +2 with dropout; +6 for its backward) and of the program itself."""
    g = wl.groups
    inputs = g * (wl.seq_len_q + 2 * wl.seq_len_kv) * wl.head_dim * (4 if training else 2)
    nn = g * wl.seq_len_q * wl.seq_len_kv
    nn_copies = 4 + spec.nn_arrays[0] + (2 if wl.dropout > 0 else 0)
    nn_copies += (6 + spec.nn_arrays[1]) if training else 0
    return 8 * (inputs + nn * nn_copies)


def workload_dict(wl: Workload) -> dict:
    d = wl.describe()
    if wl.seq_len_q == wl.seq_len_kv:
        d = {"seq_len": wl.seq_len_q, **d}
    return d


def with_data(cfg: Config, count_only: bool) -> bool:
    """Whether run_config simulates `cfg` with data (numerics checked): unless count-only was
    asked or the data would not fit NUMERICS_BUDGET_BYTES."""
    return not count_only and numerics_bytes(cfg.workload, cfg.run.spec, cfg.run.training) <= NUMERICS_BUDGET_BYTES


def run_config(cfg: Config, count_only: bool = False, seed: int = 0, trace: Callable | None = None,
               model: TimeModel | None = None, recorder=None, progress: Callable | None = None,
               fast: bool = False, forward_alone: bool = False) -> list[dict]:
    """Simulate one configuration, timed by `model` (default: every effect on); one result per
    requested pass (+ the total of a training step). `fast` (count-only runs without a trace or
    timeline): long inner loops run several tiles a step and steady launches are folded
    (simulator/fold.py); the result says so in "fast" and "simulated_fraction". `forward_alone`
    (a training run): one more result, the forward as a forward-only run of the same
    configuration predicts it ("alone": true; SimResult.run_alone), so that validate simulates
    one training run for a workload's forward-only and training measurements."""
    model = TimeModel() if model is None else model
    wl = cfg.workload
    training = "backward" in cfg.run.passes
    numeric = with_data(cfg, count_only)
    data = random_data(wl, seed) if numeric else None
    fast = fast and not numeric and trace is None and recorder is None
    k = slice_factor(cfg) if fast else 1
    run, program = sliced_program(cfg, k) if k > 1 else (cfg, None)
    if program is None:                        # whole (not fast, or a slice that does not split evenly)
        k, run, program = 1, cfg, build_program(cfg, data, fast)
    result = simulate(run.gpu, program, trace, model=model, recorder=recorder,
                      progress=progress, fold=fast, l2_start=cfg.l2_start)
    if k > 1:
        result.scaled(k)
    if recorder is not None:
        recorder.host(result)                  # the host's track, from the finished run
    errors = {}
    if numeric:
        o_ref, _ = attention_forward(wl, data)
        errors["forward"] = float(np.max(np.abs(result.outputs["O"].reshape(o_ref.shape) - o_ref)))
        if training:
            grads = attention_backward(wl, data, data.d_o)
            errors["backward"] = max(float(np.max(np.abs(result.outputs[n].reshape(grads[n].shape) - grads[n])))
                                     for n in ("dQ", "dK", "dV"))
    # (pass, run alone?): each requested pass, a training step's total, and the forward as a
    # forward-only run would predict it (forward_alone)
    passes = [(p, False) for p in cfg.run.passes]
    passes += [("forward+backward", False)] if len(cfg.run.passes) == 2 else []
    passes += [("forward", True)] if forward_alone and training else []
    out = []
    for p, alone in passes:
        select = None if p == "forward+backward" else p
        of = result.run_alone(p) if alone else result
        r = {"algorithm": cfg.run.algorithm, "pass": p, "hardware": cfg.gpu.name, "source": "predicted",
             "workload": workload_dict(wl), **dataclasses.asdict(resolved_mapping(cfg)), **of.to_dict(select),
             "sim_events": result.sim_events, "time_model": model.describe(), "fast": fast,
             **({"alone": True} if alone else {})}
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
                   results: list | None = None, on_result: Callable | None = None,
                   model: TimeModel | None = None, timelines: list | None = None, fast: bool = False) -> list[dict]:
    """Run every configuration in order. Results are appended to `results` (a list the caller
    may keep, so that what finished survives an error or Ctrl-C) and `on_result(results)` is
    called after each configuration (e.g. to write the file so far). `progress` is a function
    progress(i, n, cfg, result, wall_s) called after each configuration, or an object with
    `start(cfg)` (returning a per-block callback or None) and `done(i, n, cfg, result, wall_s)`."""
    results = [] if results is None else results
    n = len(exp.configs)
    for i, cfg in enumerate(exp.configs):
        t0 = time.perf_counter()
        recorder = None
        if timelines is not None:
            from hbmsim.simulator.timeline import Timeline
            recorder = Timeline()
            timelines.append((cfg, recorder))
        on_block = progress.start(cfg) if hasattr(progress, "start") else None
        rs = run_config(cfg, count_only, model=model, recorder=recorder, progress=on_block, fast=fast)
        results.extend(rs)
        if on_result:
            on_result(results)
        if hasattr(progress, "done"):
            progress.done(i + 1, n, cfg, rs[-1], time.perf_counter() - t0)
        elif progress:
            progress(i + 1, n, cfg, rs[-1], time.perf_counter() - t0)
    return results


def stderr_progress(i: int, n: int, cfg: Config, result: dict, wall_s: float) -> None:
    wl = cfg.workload
    mode = "count-only" if result["max_abs_error"] is None else f"max|O-ref| {result['max_abs_error']:.1e}"
    print(f"[{i}/{n}] {cfg.run.algorithm:8s} {'+'.join(cfg.run.passes):16s} N={wl.seq_len_q}x{wl.seq_len_kv} "
          f"d={wl.head_dim} "
          f"B*H={wl.groups}: {wall_s:.2f} s wall, {mode}", file=sys.stderr, flush=True)
