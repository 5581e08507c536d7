"""`hbmsim bench`: how fast the simulator itself is, against bare SimPy.

Runs a shipped experiment (default: sized like GPT-2 medium; count-only) twice: in fast mode,
as `hbmsim run` does (steady launches folded, several tiles a step), and in full, every block
and tile step simulated. Each is followed by a bare SimPy loop that schedules the same number of
events (processes that only yield timeouts): the ratio of the two wall times is the simulator's
overhead per event. The process's peak memory is reported too.
"""
from __future__ import annotations

import platform
import resource
import sys
import time

import simpy

from hbmsim.simulator.simpy_adapter import events_scheduled

from .experiment import load_experiment
from .runner import run_config

DEFAULT_EXPERIMENT = "gpt2-medium"
BARE_PROCESSES = 1000     # about as many block slots as a GPU has (SMs x resident blocks)


def bare_simpy_wall_s(n_events: int, n_processes: int = BARE_PROCESSES) -> float:
    env = simpy.Environment()
    per_process = max(1, n_events // n_processes)

    def proc(env, i):
        delay = 1e-9 * (1 + i % 7)
        for _ in range(per_process):
            yield env.timeout(delay)

    for i in range(n_processes):
        env.process(proc(env, i))
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    done = events_scheduled(env)   # events actually scheduled (timeouts, inits, process ends)
    return wall * n_events / done  # scaled to exactly n_events


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports kibibytes, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def time_mode(exp, fast: bool, progress: bool) -> dict:
    """Simulate every configuration of `exp` count-only, in fast mode or in full; wall time, events
    and the same number of bare SimPy events' wall time."""
    runs = []
    for cfg in exp.configs:
        t0 = time.perf_counter()
        rs = run_config(cfg, count_only=True, fast=fast)
        wall = time.perf_counter() - t0
        r = rs[-1]
        runs.append({"algorithm": r["algorithm"], "passes": list(cfg.run.passes), "wall_s": round(wall, 3),
                     "sim_events": r["sim_events"], "predicted_time_s": r["time_s"],
                     "simulated_fraction": r["simulated_fraction"], "peak_rss_bytes": peak_rss_bytes()})
        if progress:
            print(f"bench: {'fast' if fast else 'full'} {r['algorithm']} {'+'.join(runs[-1]['passes'])} simulated "
                  f"in {wall:.2f} s ({r['sim_events']} SimPy events, {r['simulated_fraction']:.1%} of the blocks)",
                  file=sys.stderr, flush=True)
    wall_s = sum(r["wall_s"] for r in runs)
    events = sum(r["sim_events"] for r in runs)
    bare_s = bare_simpy_wall_s(events)
    return {"runs": runs, "wall_s": round(wall_s, 3), "sim_events": events, "events_per_s": round(events / wall_s),
            "bare_simpy_wall_s": round(bare_s, 3), "ratio_to_bare_simpy": round(wall_s / bare_s, 2)}


MODES = ("both", "fast", "full")


def bench(experiment: str = DEFAULT_EXPERIMENT, progress=True, mode: str = "both") -> dict:
    """`mode` "fast": what `hbmsim run` does with a count-only run (fast mode); "full": every
    block and tile step simulated (the engine's speed per event); "both", one after the other."""
    exp = load_experiment(experiment)
    out = {"experiment": exp.name, "hardware": exp.gpu.name, "mode": "count-only"}
    for name in ("fast", "full"):
        if mode in (name, "both"):
            out[name] = time_mode(exp, name == "fast", progress)
    out.update({"peak_rss_bytes": peak_rss_bytes(), "python": platform.python_version(), "simpy": simpy.__version__,
                "machine": platform.machine()})
    return out
