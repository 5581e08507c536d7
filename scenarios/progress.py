"""Progress of long work on stderr, with tqdm: configurations done and left, and inside a long
configuration the fraction of its blocks simulated, with tqdm's time estimate. Nothing goes to
stdout. Off with --quiet, and when stderr is not a terminal (logs and pipes stay clean).
"""
from __future__ import annotations

import sys

from tqdm import tqdm

INNER_S = 2.0        # a configuration estimated to take longer than this gets its own bar of blocks


def wanted(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


class RunProgress:
    """Passed to runner.run_experiment as `progress`: `start(cfg)` before each configuration (it
    returns the machine's per-block callback, or None), `done(...)` after it."""

    def __init__(self, n_configs: int, estimate, enabled: bool = True):
        self.enabled, self.estimate = enabled, estimate
        self.finished = 0                  # configurations done, bars or not
        self.outer = tqdm(total=n_configs, unit="config", desc="configurations", file=sys.stderr, disable=not enabled)
        self.inner = None

    def start(self, cfg):
        if not self.enabled or self.estimate(cfg) < INNER_S:
            return None
        wl = cfg.workload
        self.inner = tqdm(total=0, unit="block", desc=f"{cfg.run.algorithm} N={wl.seq_len_q} blocks simulated",
                          file=sys.stderr, leave=False, mininterval=0.5)
        inner = self.inner

        def on_block(done: int, total: int) -> None:
            if inner.total != total:
                inner.total = total
            inner.update(done - inner.n)
        return on_block

    def done(self, i, n, cfg, result, wall_s) -> None:
        self.finished = i
        if self.inner is not None:
            self.inner.close()
            self.inner = None
        self.outer.update(1)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
        self.outer.close()
