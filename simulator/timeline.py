"""A run as Chrome trace events (Perfetto, chrome://tracing): a track per SM with its blocks, their
loads and their compute, a track of kernels, a counter of the DRAM bandwidth in use, and the host's
track (host.py): when it dispatched and launched each kernel, and each pass's stopwatch.

The machine calls the recorder only when one is attached (Machine(..., recorder=Timeline())), so a
run without a timeline pays nothing. Big runs are capped: only the first `max_blocks` blocks of
each kernel are recorded, and the file says so. Times in the file are microseconds (Chrome's unit)
of predicted time.
"""
from __future__ import annotations

import json
from collections import defaultdict

MAX_BLOCKS = 256        # blocks recorded per kernel, so a big run's file stays small

PID_SMS, PID_KERNELS, PID_HBM, PID_HOST = 1, 2, 3, 4
ROLE_TID_BASE = 1_000_000   # role tracks' tids, after every SM's own (tid = SM index)


class Timeline:
    def __init__(self, max_blocks: int = MAX_BLOCKS):
        self.max_blocks = max_blocks
        self.events: list = []
        self.hbm: list = []                # (start_s, end_s, bytes) of every DRAM transfer recorded
        self.compute_s: dict = defaultdict(float)   # (kernel, sm) -> recorded compute seconds
        self.skipped_blocks = 0
        self.kernels: list = []
        self.roles: dict = {}              # (sm, role) -> its track (tid), for blocks whose warps play roles

    def keeps(self, block: int) -> bool:
        return block < self.max_blocks

    # ---- what the machine calls ------------------------------------------------------------
    def block(self, sm: int, kernel: str, block: int, start_s: float, end_s: float) -> None:
        if not self.keeps(block):
            self.skipped_blocks += 1
            return
        self._x(f"{kernel} block {block}", "block", PID_SMS, sm, start_s, end_s, {"kernel": kernel, "block": block})

    def compute(self, sm: int, kernel: str, block: int, start_s: float, end_s: float, work: dict,
                role: str | None = None) -> None:
        """`role`: the warp role that issued it (flash3's "producer", "consumer 0", ...), drawn on a
        track of its own under the SM; None: on the SM's track."""
        self.compute_s[(kernel, sm)] += end_s - start_s
        if self.keeps(block):
            self._x("compute", "compute", PID_SMS, self._track(sm, role), start_s, end_s, dict(work, block=block))

    def transfer(self, sm: int, kernel: str, block: int, what: str, start_s: float, end_s: float,
                 hbm_bytes: int, l2_bytes: int, role: str | None = None) -> None:
        if hbm_bytes:
            self.hbm.append((start_s, end_s, hbm_bytes))
        if self.keeps(block):
            self._x(what, "memory", PID_SMS, self._track(sm, role), start_s, end_s,
                    {"block": block, "hbm_bytes": hbm_bytes, "l2_bytes": l2_bytes})

    def _track(self, sm: int, role: str | None) -> int:
        """The SM's track (tid = sm), or its role's: tids from ROLE_TID_BASE up, one per (SM, role)."""
        if role is None:
            return sm
        key = (sm, role)
        if key not in self.roles:
            self.roles[key] = ROLE_TID_BASE + len(self.roles)
        return self.roles[key]

    def kernel(self, name: str, start_s: float, end_s: float, grid: int) -> None:
        self.kernels.append(name)
        self._x(name, "kernel", PID_KERNELS, 0, start_s, end_s, {"grid": grid})

    def host(self, result) -> None:
        """The host's track, after the run: for each pass, drawn from its first kernel's start (the
        stopwatch's start marker), the span in which the host dispatched the ops before each
        launch and launched it (thread 0), and the pass's stopwatch time (thread 1). The device
        tracks show the kernels back to back; the stopwatch adds what the host made them wait."""
        if result.host is None:
            return
        for p in dict.fromkeys(k.pass_name for k in result.kernels):
            ks, times = result.select(p), result.pass_times(p)
            t0, before = ks[0].start_s, 0.0
            for k, issued in zip(ks, times.host_issue_s):
                if k.launched:
                    self._x(f"dispatch + launch {k.name}", "host", PID_HOST, 0, t0 + before, t0 + issued,
                            {"framework_ops": k.host_ops})
                    before = issued
            if times.host_s > before:                 # a backward's engine hands back after its last node
                self._x("autograd engine: hand-back", "host", PID_HOST, 0, t0 + before, t0 + times.host_s, {})
            self._x(f"{p}: stopwatch", "host", PID_HOST, 1, t0, t0 + times.time_s,
                    {"time_us": times.time_s * 1e6, "kernel_time_us": times.kernel_time_s * 1e6})

    # ---- the file --------------------------------------------------------------------------
    def _x(self, name, cat, pid, tid, start_s, end_s, args) -> None:
        self.events.append({"name": name, "cat": cat, "ph": "X", "ts": start_s * 1e6,
                            "dur": max(0.0, end_s - start_s) * 1e6, "pid": pid, "tid": tid, "args": args})

    def bandwidth_counter(self) -> list:
        """DRAM bandwidth in use (GB/s), each transfer counted at its average rate over its own
        interval: "C" events at every change."""
        edges = defaultdict(float)
        for t0, t1, nbytes in self.hbm:
            if t1 > t0:
                rate = nbytes / (t1 - t0)
                edges[t0] += rate
                edges[t1] -= rate
        out, level = [], 0.0
        for t in sorted(edges):
            level += edges[t]
            out.append({"name": "DRAM bandwidth in use", "ph": "C", "ts": t * 1e6, "pid": PID_HBM, "tid": 0,
                        "args": {"GB/s": max(0.0, level) / 1e9}})
        return out

    def to_chrome(self, sm_count: int, title: str) -> dict:
        names = [{"name": "process_name", "ph": "M", "pid": PID_SMS, "tid": 0, "args": {"name": "SMs"}},
                 {"name": "process_name", "ph": "M", "pid": PID_KERNELS, "tid": 0, "args": {"name": "kernels"}},
                 {"name": "process_name", "ph": "M", "pid": PID_HBM, "tid": 0, "args": {"name": "HBM"}},
                 {"name": "process_name", "ph": "M", "pid": PID_HOST, "tid": 0, "args": {"name": "host"}}]
        used = sorted({e["tid"] for e in self.events if e["pid"] == PID_SMS})
        names += [{"name": "thread_name", "ph": "M", "pid": PID_SMS, "tid": sm, "args": {"name": f"SM {sm}"}}
                  for sm in used if sm < ROLE_TID_BASE]
        names += [{"name": "thread_name", "ph": "M", "pid": PID_SMS, "tid": tid, "args": {"name": f"SM {sm} {role}"}}
                  for (sm, role), tid in self.roles.items()]
        if self.roles:        # each SM's role tracks right under it
            names += [{"name": "thread_sort_index", "ph": "M", "pid": PID_SMS, "tid": sm,
                       "args": {"sort_index": sm * 100}} for sm in used if sm < ROLE_TID_BASE]
            names += [{"name": "thread_sort_index", "ph": "M", "pid": PID_SMS, "tid": tid,
                       "args": {"sort_index": sm * 100 + 1 + i}} for i, ((sm, _), tid) in enumerate(self.roles.items())]
        cap = (f"only the first {self.max_blocks} blocks of each kernel are drawn ({self.skipped_blocks} blocks "
               "left out); the kernels track and the DRAM counter cover the whole run" if self.skipped_blocks
               else "every block is drawn")
        return {"traceEvents": names + self.events + self.bandwidth_counter(), "displayTimeUnit": "ns",
                "otherData": {"title": title, "source": "predicted by hbmsim (simulated, not measured)",
                              "time_unit": "microseconds of predicted time", "sm_count": sm_count,
                              "blocks_drawn": cap}}

    def dumps(self, sm_count: int, title: str) -> str:
        return json.dumps(self.to_chrome(sm_count, title)) + "\n"
