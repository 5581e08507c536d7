"""`hbmsim bench`: how fast the simulator itself is, against bare SimPy.

Runs a shipped experiment sized like GPT-2 medium (count-only: the same counts and times as
with data), then a bare SimPy loop that schedules the same number of events (processes that
only yield timeouts). The ratio of the two wall times is the simulator's overhead per event.
"""
from __future__ import annotations

import platform
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


def bench(experiment: str = DEFAULT_EXPERIMENT, progress=True) -> dict:
    exp = load_experiment(experiment)
    runs = []
    for cfg in exp.configs:
        t0 = time.perf_counter()
        r = run_config(cfg, count_only=True)[-1]
        wall = time.perf_counter() - t0
        runs.append({"algorithm": r["algorithm"], "pass": r["pass"], "wall_s": round(wall, 3),
                     "sim_events": r["sim_events"], "predicted_time_s": r["time_s"]})
        if progress:
            print(f"bench: {r['algorithm']} simulated in {wall:.2f} s ({r['sim_events']} SimPy events)",
                  file=sys.stderr, flush=True)
    wall_s = sum(r["wall_s"] for r in runs)
    events = sum(r["sim_events"] for r in runs)
    bare_s = bare_simpy_wall_s(events)
    return {
        "experiment": exp.name, "hardware": exp.gpu.name, "mode": "count-only",
        "runs": runs, "wall_s": round(wall_s, 3), "sim_events": events,
        "events_per_s": round(events / wall_s), "bare_simpy_wall_s": round(bare_s, 3),
        "bare_simpy_events_per_s": round(events / bare_s), "ratio_to_bare_simpy": round(wall_s / bare_s, 2),
        "python": platform.python_version(), "simpy": simpy.__version__, "machine": platform.machine(),
    }
