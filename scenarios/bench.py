"""`hbmsim bench`: how fast the simulator itself is, against bare SimPy.

Runs a shipped experiment (default: sized like GPT-2 medium; count-only) twice: in fast mode,
as `hbmsim run` does (steady launches folded, several tiles a step), and in full, every block
and tile step simulated. Each is followed by a bare SimPy loop that schedules the same number of
events (processes that only yield timeouts): the ratio of the two wall times is the simulator's
overhead per event. The process's peak memory is reported too.

`instructions=True` makes the same comparison in instructions instead of seconds: each part runs
in a child Python under valgrind's callgrind, which counts the instructions it executes. Unlike
this machine's wall clock (which varies by up to 50% between runs), the count repeats to within a
hundred instructions (`_callgrind`), so it can tell a 0.1% change from noise. Each figure is the child's count less
that of a child that only imports and loads the experiment. It takes minutes (callgrind runs
Python about 50 times slower) and needs valgrind (Debian's package of that name).
"""
from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time

import simpy

from hbmsim.simulator import HbmsimError
from hbmsim.simulator.simpy_adapter import events_scheduled

from .experiment import load_experiment
from .runner import run_config

DEFAULT_EXPERIMENT = "gpt2-medium"
BARE_PROCESSES = 1000     # about as many block slots as a GPU has (SMs x resident blocks)


def bare_simpy(n_events: int, n_processes: int = BARE_PROCESSES) -> tuple[float, int]:
    """Bare SimPy (`n_processes` processes that only yield timeouts) for `n_events` events: (its
    wall time scaled to exactly `n_events`, the events it scheduled)."""
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
    return wall * n_events / done, done  # scaled to exactly n_events


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
    bare_s = bare_simpy(events)[0]
    return {"runs": runs, "wall_s": round(wall_s, 3), "sim_events": events, "events_per_s": round(events / wall_s),
            "bare_simpy_wall_s": round(bare_s, 3), "ratio_to_bare_simpy": round(wall_s / bare_s, 2)}


CALLGRIND = ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")


def _callgrind(args: list, progress: bool) -> tuple[int, str]:
    """Instructions a child Python running this module with `args` executes (callgrind's
    'Collected' total), and what it printed. The hash seed is fixed, so that dicts and sets of
    strings are laid out the same in every run, and numpy's BLAS runs one thread: its idle
    threads spin for as long as the machine lets them (25 M instructions, more or less, per
    import of numpy). So a count repeats to within a hundred instructions."""
    cmd = [*CALLGRIND, sys.executable, "-m", "hbmsim.scenarios.bench", *args]
    if progress:
        print(f"bench: counting instructions of `{' '.join(args)}` under callgrind", file=sys.stderr, flush=True)
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    counted = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or counted is None:
        last = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise HbmsimError(f"bench --instructions: {' '.join(cmd)} exited with {done.returncode}: {last}")
    return int(counted.group(1)), done.stdout


def count_mode(exp_name: str, fast: bool, progress: bool, baseline: int) -> dict:
    """Instructions per event of the simulation (fast mode or full) and of bare SimPy running as
    many events, each less `baseline` (a child that only imports and loads)."""
    sim, out = _callgrind(["sim", exp_name, "fast" if fast else "full"], progress)
    events = int(out.split()[-1])
    bare, out = _callgrind(["bare", exp_name, str(events)], progress)
    bare_events = int(out.split()[-1])
    per_event, bare_per_event = (sim - baseline) / events, (bare - baseline) / bare_events
    return {"sim_events": events, "instructions": sim - baseline, "instructions_per_event": round(per_event),
            "bare_simpy_events": bare_events, "bare_simpy_instructions": bare - baseline,
            "bare_simpy_instructions_per_event": round(bare_per_event),
            "ratio_to_bare_simpy": round(per_event / bare_per_event, 2)}


def bench(experiment: str = DEFAULT_EXPERIMENT, progress=True, mode: str = "both", instructions: bool = False) -> dict:
    """`mode` "fast": what `hbmsim run` does with a count-only run (fast mode); "full": every
    block and tile step simulated (the engine's speed per event); "both", one after the other.
    `instructions`: count instructions under callgrind instead of timing (module docstring)."""
    exp = load_experiment(experiment)
    out = {"experiment": exp.name, "hardware": exp.gpu.name, "mode": "count-only"}
    if instructions:
        if shutil.which(CALLGRIND[0]) is None:
            raise HbmsimError("bench --instructions: valgrind not found on PATH (Debian's package valgrind "
                              "counts the instructions)")
        out["measure"] = "instructions (" + " ".join(CALLGRIND[:2]) + "), not time"
        baseline, _ = _callgrind(["none", experiment], progress)
        out["import_only_instructions"] = baseline     # what every count below is net of
    for name in ("fast", "full"):
        if mode in (name, "both"):
            out[name] = (count_mode(experiment, name == "fast", progress, baseline) if instructions
                         else time_mode(exp, name == "fast", progress))
    if not instructions:                      # (counted in children: this process's peak says nothing)
        out["peak_rss_bytes"] = peak_rss_bytes()
    out.update({"python": platform.python_version(), "simpy": simpy.__version__, "machine": platform.machine()})
    return out


def _child(what: str, experiment: str, arg: str = "") -> None:
    """What bench --instructions counts in a child: "none" (imports and loads only), "sim"
    (every configuration, `arg` fast or full; prints its events) or "bare" (bare SimPy for `arg`
    events; prints the events it scheduled)."""
    exp = load_experiment(experiment)
    if what == "sim":
        print(sum(run_config(cfg, count_only=True, fast=arg == "fast")[-1]["sim_events"] for cfg in exp.configs))
    elif what == "bare":
        print(bare_simpy(int(arg))[1])


if __name__ == "__main__":
    _child(*sys.argv[1:])
