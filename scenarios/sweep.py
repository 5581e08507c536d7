"""Sweeps that lose nothing: configurations run in parallel on a Dask `distributed` cluster (an
embedded LocalCluster, or an existing one by address), results appended to a JSON-lines file as
each configuration finishes, and a rerun with `resume` skipping what the file already holds.

Results come back in the experiment's order and equal a serial run's (every configuration is
simulated by the same `run_config`, wherever it runs). A worker that dies is Dask's to retry:
its tasks are rescheduled on the workers left (`retries` covers errors raised by a task), and a
configuration is written to the file once, by this process, when its result arrives.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Callable

from hbmsim.simulator import HbmsimError, TimeModel

from .experiment import Experiment
from .runner import run_config, workload_dict

RETRIES = 3
CONNECT_TIMEOUT_S = 20      # how long to keep trying to reach a --scheduler


def config_key(cfg, model: TimeModel, fast: bool = False) -> str:
    """Everything that decides a configuration's results, as one canonical string."""
    return json.dumps({"algorithm": cfg.run.algorithm, "passes": list(cfg.run.passes), "params": cfg.run.params,
                       "mapping": dataclasses.asdict(cfg.mapping) if cfg.mapping is not None else None,
                       "workload": workload_dict(cfg.workload), "hardware": cfg.gpu.summary(),
                       "time_model": model.describe(), "fast": fast,
                       **({"l2_start": cfg.l2_start} if cfg.l2_start != "cold" else {})}, sort_keys=True, default=str)


class ResultsLog:
    """An append-only JSON-lines file: one line per finished configuration,
    {"index": i, "key": config_key, "results": [...]}, written whole and flushed to disk.
    `shared` (validate's cache, which several processes may append to): each line is written under
    an exclusive lock, and a line that is not a record is skipped instead of refused."""

    def __init__(self, path: str | Path, shared: bool = False):
        self.path = Path(path)
        self.shared = shared

    def done(self) -> dict:
        """{key: results} of the configurations the file holds. A last line cut short (the process
        was killed while writing it) is ignored; any other bad line is an error naming it."""
        if not self.path.exists():
            return {}
        text = self.path.read_text()
        lines = text.split("\n")
        out, good_chars = {}, 0
        for n, line in enumerate(lines, start=1):
            if not line:
                continue
            try:
                rec = json.loads(line)
                out[rec["key"]] = rec["results"]
                good_chars += len(line) + 1
            except (json.JSONDecodeError, KeyError, TypeError):
                if self.shared:
                    continue
                if n == len(lines):          # cut short: dropped, so the next record starts a line
                    with self.path.open("r+") as fh:
                        fh.truncate(len(text[:good_chars].encode()))
                    break
                raise HbmsimError(f"{self.path}: line {n} is not a results record (written by hbmsim run --results)")
        return out

    def append(self, index: int, key: str, results: list) -> None:
        line = json.dumps({"index": index, "key": key, "results": results}) + "\n"
        with self.path.open("a") as fh:
            if self.shared:
                import fcntl
                fcntl.flock(fh, fcntl.LOCK_EX)         # released when the file closes
                if fh.tell() and not self._ends_with_newline():
                    line = "\n" + line                  # after a line another process left cut short
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"


# A worker's own housekeeping takes the GIL from the task it runs: its statistical profiler
# walks the task's stack every 10 ms, the GIL monitor samples it, and the event loop ticks every
# 20 ms; the nanny polls memory every 100 ms on a core the workers need. A pure-Python simulation
# pays for all of it: on this 2-core machine tasks ran 9% slower in a worker than alone, and as
# fast with these settings (16 block-sweep-16k configurations, Dask's task stream).
WORKER_QUIET = {"distributed.worker.profile.enabled": False,
                "distributed.admin.system-monitor.gil.enabled": False,
                "distributed.admin.tick.interval": "1s",
                "distributed.admin.system-monitor.interval": "2s",
                "distributed.worker.memory.monitor-interval": "1s"}


def _task(cfg, count_only: bool, model: TimeModel, fast: bool, forward_alone: bool = False) -> list:
    return run_config(cfg, count_only, model=model, fast=fast, forward_alone=forward_alone)


def run_sweep(exp: Experiment, count_only: bool = False, model: TimeModel | None = None, workers: int | None = None,
              scheduler: str | None = None, log: ResultsLog | None = None, results: list | None = None,
              on_result: Callable | None = None, progress: Callable | None = None, fast: bool = False,
              on_config: Callable | None = None, forward_alone: bool = False) -> list[dict]:
    """Run the experiment's configurations, those in `log` skipped, on `workers` local processes
    (a LocalCluster), on the cluster at `scheduler`, or here one after the other (neither given).
    `results` (the caller's list) holds, in the experiment's order, every configuration finished
    so far, so that an error or Ctrl-C keeps them; `on_config(i, its results)` (first for each one
    `log` holds, in order), `on_result(results)`
    and `progress(done, n, cfg, result, None)` are called as each one arrives. `fast`,
    `forward_alone`: as run_config."""
    model = TimeModel() if model is None else model
    results = [] if results is None else results
    keys = [config_key(cfg, model, fast) for cfg in exp.configs]
    got: dict = {}
    if log is not None:
        done = log.done()
        got = {i: done[k] for i, k in enumerate(keys) if k in done}
    n = len(exp.configs)

    def arrived(i: int, rs: list) -> None:
        got[i] = rs
        if log is not None:
            log.append(i, keys[i], rs)
        results[:] = [r for j in sorted(got) for r in got[j]]
        if on_config:
            on_config(i, rs)
        if on_result:
            on_result(results)
        if progress:
            progress(len(got), n, exp.configs[i], rs[-1], None)

    results[:] = [r for j in sorted(got) for r in got[j]]
    if on_config:
        for i in sorted(got):                # those the log already holds, before any new one
            on_config(i, got[i])
    pending = [i for i in range(n) if i not in got]
    if not pending:
        return results
    if workers is None and scheduler is None:
        for i in pending:
            arrived(i, run_config(exp.configs[i], count_only, model=model, fast=fast, forward_alone=forward_alone))
        return results
    import dask
    from distributed import Client, LocalCluster, as_completed
    cluster = None
    if scheduler is None:
        # Quiet workers (WORKER_QUIET; the Nanny passes this config on to the worker processes).
        with dask.config.set(WORKER_QUIET):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        client = Client(cluster if cluster is not None else scheduler, timeout=f"{CONNECT_TIMEOUT_S}s")
    except OSError as err:
        if cluster is not None:
            cluster.close()
        raise HbmsimError(f"--scheduler {scheduler}: cannot connect ({err})") from None
    try:
        futures = {client.submit(_task, exp.configs[i], count_only, model, fast, forward_alone, pure=False,
                                 retries=RETRIES): i
                   for i in pending}
        for fut in as_completed(futures):
            arrived(futures[fut], fut.result())
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return results
