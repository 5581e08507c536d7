"""`hbmsim validate`: predicted time against published and measured times.

For every run of a measured file (scenarios/measured/, or any file in the compare schema with
`"source": "published"` or `"measured"`), build the configuration that reproduces it (the run's
hardware preset, workload, program, variant and whatever mapping fields the run records, e.g.
block sizes), simulate it count-only, and compare at two levels:
- event level: the predicted time of the run's pass against the measured time (CUDA events
  around the pass, or a paper's figure), as the run's harness timed it: one synchronised call,
  the timed call's own framework ops before the pass's first kernel included (caller_ops_of: a
  harness's transposes around SDPA), or calls back to back, each the loop's period (calls_of);
- kernel level, where the run has kernel rows (torch.profiler's device time per kernel): the
  predicted kernels' device time against the rows, in sum and group by group
  (scenarios/kernel_rows.py), so that an off kernel shows as itself.
Nothing here is fitted: the numbers say how far the model is off, never what a constant should be.

Each distinct configuration is simulated once (a measured file's "forward", "backward" and
"forward+backward" runs of one workload are one training simulation: its forward with the L2
write-back a forward-only run ends with stands for the forward-only run), in fast mode unless
`full` (simulator/fold.py; within 1% of the full simulation where both were compared), on
`workers` local processes (scenarios/sweep.py's Dask path; by default every core once there are
AUTO_WORKERS_FROM configurations or more, `workers=1` to stay in this process). With `ablation`, every
configuration is also simulated with each effect of the time model switched off in turn.
"""
from __future__ import annotations

import dataclasses
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from hbmsim.kernels.implementations import IMPLEMENTATIONS
from hbmsim.simulator import BASELINE, HbmsimError, TimeModel
from hbmsim.simulator.host import DEFAULT_HOST, HostStep, call_time_s
from hbmsim.simulator.time_model import HOST_EFFECTS

from .compare import load, within
from .experiment import Config, Experiment, RunSpec, make_workload, resolve_hardware
from .kernel_rows import compare_kernels
from .published import resolve_measured
from .runner import prepare
from .sim_cache import validate_cache
from .sweep import config_key, run_sweep

LONG_N = 1024          # the targets are stated for N >= 1024 as well as for every N
AUTO_WORKERS_FROM = 16 # distinct configurations from which validate runs on every core unless told


@dataclass(frozen=True)
class Point:
    family: tuple          # (implementation, hardware, pass)
    seq_len: int
    label: str             # one line naming the configuration
    predicted_s: float     # the pass's predicted time (what the measurement's stopwatch sees)
    measured_s: float
    ablation: dict | None = None     # {"without <effect>" | "all off": predicted time (s)}
    simulated_fraction: float = 1.0  # fast mode: the share of the run's blocks simulated (the rest folded)
    predicted_kernel_s: float | None = None    # the pass's kernels' device time, predicted
    measured_kernel_s: float | None = None     # the same from the run's kernel rows (None: it has none)
    kernels: tuple = ()    # ((group, predicted device s, measured device s), ...): kernel_rows.compare_kernels
    repeats: tuple | None = None   # (min, median, max) of the run's timed repeats ("times_s"), where it keeps them
    source: str = ""       # the measured file the run comes from (its name, without .json)

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: (predicted - measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def kernel_error(self) -> float | None:
        if self.measured_kernel_s is None or self.predicted_kernel_s is None:
            return None
        return (self.predicted_kernel_s - self.measured_kernel_s) / self.measured_kernel_s


@dataclass(frozen=True)
class Job:
    """One measured run to compare: the distinct configuration that reproduces it, and the run."""
    config: int            # index into the plan's configurations
    run: dict
    where: str
    caller_ops: tuple = () # ((pass, ops), ...): the timed call's own framework ops before the pass's first
                           # kernel (caller_ops_of)
    calls: str = "one"     # how the run's calls were timed: "one" (a stopwatch around one synchronised
                           # call) or "back-to-back" (a loop of calls between two synchronises: calls_of)
    repeats: tuple | None = None   # (min, median, max) of the run's repeats (repeats_of)
    sdpa: bool = False     # the timed call is torch's scaled_dot_product_attention (sdpa_of)
    source: str = ""       # the measured file the run comes from (its name, without .json)


def _passes(pass_name: str, where: str) -> tuple:
    passes = {"forward": ("forward",), "backward": ("forward", "backward"),
              "forward+backward": ("forward", "backward")}
    if pass_name not in passes:
        raise HbmsimError(f"{where}: field 'pass' = {pass_name!r} must be forward, backward or forward+backward")
    return passes[pass_name]


def _kept(r: dict, only: str | None, max_seq_len: int | None) -> bool:
    """Whether `only` (a substring of the run's implementation, program, variant, hardware or pass)
    and `max_seq_len` keep the run."""
    text = " ".join(str(x) for x in (r.get("implementation") or r.get("algorithm"), r.get("algorithm"),
                                     r.get("variant"), r.get("hardware"), r.get("pass")))
    if only and only not in text:
        return False
    w = r.get("workload") or {}
    n = w.get("seq_len") or w.get("seq_len_kv") or w.get("seq_len_q")     # decode: the KV length
    return not (max_seq_len and n and n > max_seq_len)


def config_of(path: str, i: int, r: dict) -> Config:
    """The configuration that reproduces run i of a measured file: its preset, workload, program
    and every mapping field the run records (variant, block sizes, tiles), not the defaults."""
    where = f"{path}: runs[{i}]"
    for key in ("hardware", "algorithm", "time_s"):
        if r.get(key) is None:
            raise HbmsimError(f"{where}: missing field '{key}' (validate needs the GPU preset, the program and "
                              "the measured time)")
    w = dict(r.get("workload") or {})
    if w.get("seq_len_q") is not None and w.get("seq_len_q") == w.get("seq_len_kv"):
        w.pop("seq_len_q")
        w.pop("seq_len_kv")
    gpu = resolve_hardware(r["hardware"])
    overrides = r.get("hardware_overrides")          # conditions the run was timed under (a locked clock)
    if overrides is not None:
        if not isinstance(overrides, dict):
            raise HbmsimError(f"{where}: field 'hardware_overrides' = {overrides!r} must be a table of hardware "
                              "fields")
        gpu = gpu.with_overrides(overrides, f"{where}: hardware_overrides")
    spec = RunSpec(r["algorithm"], _passes(r.get("pass", "forward"), where))
    params = {k: r[k] for k in spec.spec.mapping_fields if r.get(k) is not None}
    spec = dataclasses.replace(spec, params=params)
    spec.spec.mapping_from(params, where)          # each recorded field checked (the variant must exist)
    l2_start = r.get("l2_start") or "cold"           # the L2 state the run was measured from (hbmsim profile --l2)
    if l2_start not in ("cold", "warm"):
        raise HbmsimError(f"{where}: field 'l2_start' = {l2_start!r} must be cold or warm")
    return Config(gpu, make_workload(where, w), spec, where=where, l2_start=l2_start)


LIBRARY_COMMAND = re.compile(r"hbmsim\.kernels\.library(\s|$)")     # kernels/library.py's provenance


def caller_ops_of(where: str, r: dict, provenance: dict) -> tuple:
    """((pass, ops), ...): the framework ops the run's timed call dispatches around the
    implementation before each pass's first kernel. The run's "caller_ops" ({pass: whole number >= 0})
    where it records them; in a file `python -m hbmsim.kernels.library` wrote (its provenance's
    command) without them, that harness's (kernels/implementations.py: Implementation.caller_ops);
    else none (a paper's harness calls the library directly)."""
    ops = r.get("caller_ops")
    if ops is None:
        impl = IMPLEMENTATIONS.get(r.get("implementation"))
        return impl.caller_ops if impl and LIBRARY_COMMAND.search(str(provenance.get("command", ""))) else ()
    if not isinstance(ops, dict):
        raise HbmsimError(f"{where}: field 'caller_ops' = {ops!r} must be a table {{pass: framework ops}}")
    for name, n in ops.items():
        if name not in ("forward", "backward"):
            raise HbmsimError(f"{where}: field 'caller_ops.{name}': the pass must be forward or backward")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise HbmsimError(f"{where}: field 'caller_ops.{name}' = {n!r} must be a whole number >= 0")
    return tuple(sorted(ops.items()))


def sdpa_of(r: dict, provenance: dict) -> bool:
    """Whether the run's timed call is torch's scaled_dot_product_attention: an implementation that
    `python -m hbmsim.kernels.library` times through SDPA (Implementation.sdpa), in a file that
    harness wrote (its provenance's command), as caller_ops_of decides."""
    impl = IMPLEMENTATIONS.get(r.get("implementation"))
    return bool(impl and impl.sdpa and LIBRARY_COMMAND.search(str(provenance.get("command", ""))))


def repeats_of(where: str, r: dict) -> tuple | None:
    """(min, median, max) of the run's timed repeats ("times_s": this project's files keep the 30
    CUDA-event times whose mean is "time_s"), or None where it keeps fewer than two; a repeat that
    is not a finite number > 0 is one line."""
    times = r.get("times_s")
    if times is None:
        return None
    if not isinstance(times, list):
        raise HbmsimError(f"{where}: field 'times_s' = {times!r} must be a list of seconds")
    for k, t in enumerate(times):
        if not within(t, (False, ">", 0)):
            raise HbmsimError(f"{where}: field 'times_s[{k}]' = {t!r} must be a finite number > 0 (seconds)")
    return (min(times), statistics.median(times), max(times)) if len(times) >= 2 else None


def check_kernel_rows(where: str, r: dict) -> None:
    """A run's kernel rows ("kernels": torch.profiler's, one per kernel name) are each an object
    with a "name" (a non-empty string), a "time_s" (a finite number >= 0: the kernel's device
    seconds in the pass) and, where given, "launches" (a finite number > 0); anything else is one line."""
    rows = r.get("kernels")
    if rows is None:
        return
    if not isinstance(rows, list):
        raise HbmsimError(f"{where}: field 'kernels' = {rows!r} must be a list of kernel rows")
    for k, row in enumerate(rows):
        at = f"{where}: field 'kernels[{k}]"
        if not isinstance(row, dict):
            raise HbmsimError(f"{at}' = {row!r} must be an object with 'name' and 'time_s'")
        if not isinstance(row.get("name"), str) or not row["name"]:
            raise HbmsimError(f"{at}.name' = {row.get('name')!r} must be a non-empty string")
        for field, op, optional in (("time_s", ">=", False), ("launches", ">", True)):
            v = row.get(field)
            if not (v is None and optional) and not within(v, (False, op, 0)):
                raise HbmsimError(f"{at}.{field}' = {v!r} must be a finite number {op} 0")


CALLS = ("one", "back-to-back")


def calls_of(where: str, r: dict) -> str:
    """How the run's time was taken: its "calls" field, "one" (CUDA events or a wall clock around
    one call, synchronised after it: this project's harness) or "back-to-back" (a loop of calls
    between two synchronises, the time divided by the calls: torch.utils.benchmark's timeit, as the
    FlashAttention papers' benchmarks time); "one" where the run does not say."""
    calls = r.get("calls", "one")
    if calls not in CALLS:
        raise HbmsimError(f"{where}: field 'calls' = {calls!r} must be one of {', '.join(CALLS)}")
    return calls


def stopwatch_s(res: dict, caller_ops: tuple, model: TimeModel, calls: str = "one", sdpa: bool = False) -> float:
    """The predicted time of a result `res` (a pass, or forward+backward) as the run's harness
    timed it (host.call_time_s over its kernels): one call, its host's dispatch before the kernels
    (`caller_ops` of the harness's own first; with `sdpa` and the sdpa_call effect, SDPA's own host
    work), or calls back to back, each the period of the loop; the kernels' time alone (res's
    kernel_time_s) when the host effect is off."""
    if not model.host:
        return res.get("kernel_time_s", res["time_s"])
    steps: dict = {}
    for k in res["kernels"]:
        steps.setdefault(k["pass"], []).append(HostStep(k["time_s"], k["host_ops"], k["launched"]))
    return call_time_s(steps, model.host_spec or DEFAULT_HOST, dict(caller_ops), loop=calls == "back-to-back",
                       sdpa=sdpa and model.sdpa_call)


def configs_of(path: str, runs: list, only: str | None = None, max_seq_len: int | None = None) -> list:
    """(Config, run) for every run of a measured file that `only` and `max_seq_len` keep."""
    return [(config_of(path, i, r), r) for i, r in enumerate(runs) if _kept(r, only, max_seq_len)]


def plan(refs: list, only: str | None = None, max_seq_len: int | None = None) -> tuple:
    """(distinct configurations, jobs) for the measured files `refs`: each run's configuration,
    simulated once however many runs share it."""
    configs: list = []
    index: dict = {}
    jobs = []
    for ref in refs:
        path = resolve_measured(ref)
        measured = load(path)                      # every number checked, duplicates refused
        if measured.source == "predicted":
            raise HbmsimError(f"{path}: field 'source' = 'predicted': validate compares predictions with "
                              "published or measured times, and this file holds predictions")
        for cfg, r in configs_of(str(path), measured.runs, only, max_seq_len):
            check_kernel_rows(cfg.where, r)
            key = config_key(cfg, BASELINE)
            if key not in index:
                index[key] = len(configs)
                configs.append(cfg)
            jobs.append(Job(index[key], r, cfg.where, caller_ops_of(cfg.where, r, measured.provenance),
                            calls_of(cfg.where, r), repeats_of(cfg.where, r), sdpa_of(r, measured.provenance),
                            Path(path).stem))
    if not jobs:
        raise HbmsimError("validate: no run left to simulate (check --only and --max-seq-len)")
    return configs, jobs


def share_training_runs(configs: list, jobs: list) -> tuple:
    """(configs, jobs) with each forward-only configuration that has a training twin (the same
    GPU, workload, program and resolved mapping, with a backward) left out and its jobs moved to
    the twin: the twin's forward, with the L2 write-back a forward-only run ends with
    (run_config's forward_alone), is what the forward-only run predicts, field for field
    (tests/test_alone.py). `configs` are prepared (their mappings resolved)."""
    key = lambda cfg, passes: config_key(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, passes=passes)),
                                         BASELINE)
    training = {key(cfg, cfg.run.passes): i for i, cfg in enumerate(configs)
                if cfg.run.passes == ("forward", "backward")}
    twin = {i: training.get(key(cfg, ("forward", "backward"))) for i, cfg in enumerate(configs)
            if cfg.run.passes == ("forward",)}
    moved = [dataclasses.replace(j, config=twin.get(j.config) if twin.get(j.config) is not None else j.config)
             for j in jobs]
    kept = sorted({j.config for j in moved})
    new_index = {old: new for new, old in enumerate(kept)}
    return [configs[i] for i in kept], [dataclasses.replace(j, config=new_index[j.config]) for j in moved]


def result_of(results: list, pass_name: str) -> dict:
    """A measured run's pass among its configuration's results: a forward-only run's from a
    training configuration is the forward as run alone (run_config's forward_alone)."""
    alone = [x for x in results if x.get("alone")]
    if pass_name == "forward" and alone:
        return alone[0]
    return next(x for x in results if x["pass"] == pass_name and not x.get("alone"))


def ablation_models(model: TimeModel) -> dict:
    """{label: model} for an ablation: `model` with each of its effects that is on switched off in
    turn, then with every effect off ("all off": spec-sheet rates, a compute call as long as its
    slowest part; the programs' own dependent phases, e.g. FA1's split-K reduction, stay)."""
    out = {f"without {name}": model.off(name) for name in TimeModel.effects() if getattr(model, name)}
    out["all off"] = BASELINE
    return out


def point_of(job: Job, cfg: Config, results: list, ablation: dict | None = None,
             model: TimeModel | None = None) -> Point:
    """The point of one measured run from its configuration's results (one per pass), simulated
    with `model` (default: every effect on)."""
    r = job.run
    pass_name = r.get("pass", "forward")
    res = result_of(results, pass_name)
    wl = cfg.workload
    impl = r.get("implementation") or f"{cfg.run.algorithm} {r.get('variant', '')}".strip()
    n = wl.seq_len_q if wl.seq_len_q == wl.seq_len_kv else f"{wl.seq_len_q}x{wl.seq_len_kv}"   # decode: 1xN
    label = (f"{impl} {r['hardware']} {pass_name} d={wl.head_dim} B={wl.batch} H={wl.heads}"
             + (f"/{wl.kv_heads}" if wl.kv_heads != wl.heads else "") + f" N={n}"
             + (f" paged {wl.kv_page_size}" if wl.kv_page_size else "") + (" causal" if wl.causal else ""))
    rows = r.get("kernels")
    groups = compare_kernels(cfg.run.algorithm, res.get("variant", ""), res["kernels"], rows or [])
    measured_kernel_s = sum(k["time_s"] for k in rows) if rows else None
    predicted_s = stopwatch_s(res, job.caller_ops, TimeModel() if model is None else model, job.calls, job.sdpa)
    return Point((impl, r["hardware"], pass_name), wl.seq_len_kv, label, predicted_s, r["time_s"], ablation,
                 res["simulated_fraction"], res.get("kernel_time_s", res["time_s"]), measured_kernel_s,
                 tuple(groups or ()), job.repeats, job.source)


def validate(refs: list, only: str | None = None, max_seq_len: int | None = None,
             progress=None, points: list | None = None, model: TimeModel | None = None,
             ablation: bool = False, full: bool = False, workers: int | None = None,
             cache: bool = True) -> list[Point]:
    """Simulate every distinct configuration behind the kept runs of the measured files `refs` with
    `model` (default: every effect on), in fast mode unless `full`, on `workers` processes when
    given; with `ablation` also without each effect; with `cache`, those the cache holds for this
    code are taken from it (validate_cache). Returns the points, in the files' order (appended to
    `points` as their configuration finishes, so that a caller keeps them through an error, Ctrl-C
    or SIGTERM). `progress(done, n)` is called as each simulation finishes (or comes from the cache)."""
    model = TimeModel() if model is None else model
    points = [] if points is None else points
    configs, jobs = plan(refs, only, max_seq_len)
    exp = prepare(Experiment("validate", "validate", configs[0].gpu, configs))
    configs, jobs = share_training_runs(exp.configs, jobs)
    exp = dataclasses.replace(exp, configs=configs)
    models = {"": model, **(ablation_models(model) if ablation else {})}
    # a model that differs from `model` only in the host's effects times the same simulation differently
    # (stopwatch_s): its results are the main run's
    same_sim = {label for label, m in models.items()
                if label and dataclasses.replace(m, **{e: getattr(model, e) for e in HOST_EFFECTS}) == model}
    n = (len(models) - len(same_sim)) * len(exp.configs)
    done: dict = {label: {} for label in models}
    finished = 0

    def arrived(label: str, i: int, rs: list) -> None:
        nonlocal finished
        done[label][i] = rs
        finished += 1
        if not ablation and label == "":      # kept before anything is said of it
            points.extend(point_of(j, exp.configs[i], rs, model=model) for j in jobs if j.config == i)
        if progress:
            progress(finished, n)

    log = validate_cache() if cache else None
    if workers is None and len(exp.configs) >= AUTO_WORKERS_FROM:
        workers = os.cpu_count() or 1          # a long validation uses every core by default
    for label, m in models.items():
        if label in same_sim:
            continue
        run_sweep(exp, count_only=True, model=m, workers=workers if workers and workers > 1 else None, fast=not full,
                  on_config=lambda i, rs, label=label: arrived(label, i, rs), forward_alone=True, log=log)
    for label in same_sim:
        done[label] = done[""]

    def pass_time(label: str, j: Job) -> float:
        return stopwatch_s(result_of(done[label][j.config], j.run.get("pass", "forward")), j.caller_ops, models[label],
                           j.calls, j.sdpa)
    points[:] = [point_of(j, exp.configs[j.config], done[""][j.config],
                          {label: pass_time(label, j) for label in models if label} if ablation else None, model)
                 for j in jobs]        # whole: in the files' order
    return points


def stderr_lines(done: int, n: int) -> None:
    """Progress for logs (stderr not a terminal): a line per finished simulation."""
    print(f"validate: {done}/{n} simulations done", file=sys.stderr, flush=True)
