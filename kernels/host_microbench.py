"""The host's side of a pass, measured on this machine: the fields of simulator/host.py's HostSpec.

`hbmsim microbench` (all of it, or `--host` for this part only) measures, each entry with the
method it used in the output file:

- host_launch: host seconds per launch of `launches` back-to-back empty RawKernel launches
  (time.perf_counter around the launch loop, the synchronise after it not counted; the queue
  far from full): launch_s. CuPy launches from Python, so this holds CuPy's own call (about a
  microsecond) that PyTorch's C++ launch does not pay: an upper bound.
- host_launch_gap: `kernels` tiny kernels (hbmsim_stamp, no work) queued behind a spin kernel
  that holds the GPU, so that the GPU, not the host, sets their pace; two CUDA events around
  them give seconds per kernel, less the kernel's own device time (its %globaltimer at exit
  minus at entry): launch_gap_s. The same from the timestamps alone (the next kernel's entry
  minus this one's exit) is recorded beside it, with the timer's observed resolution.
- host_queue: one long spin kernel, then up to `max_launches` empty launches, each timed on the
  host: the first launch that waits (longer than a quarter of the spin) finds the queue full;
  the launches before it are queue_launches.
- host_torch_dispatch (PyTorch): host seconds per `x.add_(1)` on a 4-element CUDA tensor, without
  autograd and on a non-leaf that requires grad (each op records a node), the queue not full;
  and the same op on the meta device (dispatch without a kernel). eager_op_s = the
  requires-grad op less launch_s.
- host_autograd (PyTorch): host seconds of `.backward()` of a chain of k multiplications by a
  scalar (k MulBackward0 nodes, each launching one kernel, and the leaf's AccumulateGrad), for
  k = 1..max_nodes; a least-squares line through the medians: the intercept is the engine's
  whole fixed cost (the call, the hand-over to the device thread, the hand-back, the leaf's
  AccumulateGrad), autograd_node_s = the slope less launch_s.
- host_autograd_first_kernel (PyTorch): when a backward's first kernel starts. y = x * 1.5 on a
  large CUDA tensor, so that MulBackward0's one kernel (grad * 1.5) runs longer than the host's
  rest of the call; CUDA events around y.backward(g) less that kernel's own time (the same
  product timed alone) give pre_kernel_s = the engine's start + one node + its launch. Then
  backward_start_s = pre_kernel_s - host_autograd's slope, and backward_end_s = the intercept
  less backward_start_s (without this entry, or where that start falls outside [0, intercept], as
  a noisy slope can put it: backward_start_s = the intercept, backward_end_s 0).
- block_dispatch: one launch of `waves` x 2 blocks an SM (1024 threads a block, so an SM holds
  two), each block stamping %globaltimer and %smid at its entry and then spinning: the first
  wave's entries spread over the time the block scheduler takes to hand out a wave. Not a HostSpec
  field: its per_block_s is the GPU presets' block_dispatch_s, the stagger of a launch's first
  wave (time_model.py: block_dispatch; docs/validation.md, "Lock-step waves").
- host_sdpa (PyTorch): torch.nn.functional.scaled_dot_product_attention on tiny fp16 inputs,
  forward and forward+backward, one call at a time: CUDA-event seconds, host seconds of the call,
  and wall seconds to the synchronise. On such inputs the host's work is all a call costs:
  sdpa_forward_s = the forward's host seconds (median over the shapes) less the op and the launch
  the fields above charge for it; sdpa_backward_s = the backward's (forward+backward less forward)
  less the engine's start and end, one node and three launches (FA2's preprocess, main and
  dQ-conversion kernels). A third call, "forward, no grad", on inputs autograd does not record (an
  inference call's, as decode's): recorded, not yet a field (decode pays no SDPA host work).
- kernel_floor (PyTorch): torch.profiler's device time of one kernel row of a one-element in-place
  add, the least a kernel row shows. Not a HostSpec field: recorded for the small kernels' floor
  (the split-KV combine kernel's 4-10 us rows in h200-decode-sdpa-gqa.json, < 1 us predicted).

host_fields(results) turns the entries into HostSpec's fields (the file's "host_spec");
simulator/host.py's host_from_measured reads them back. An entry that could not be measured
(no PyTorch, an error) is recorded as {"skipped": why} and its fields are left out.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path
from time import perf_counter

import numpy as np

from .config import KERNEL_DIR

HOST_SOURCE = KERNEL_DIR / "host_microbench.cu"
SDPA_SHAPES = ((1, 1, 128, 64), (1, 1, 512, 64))      # batch, heads, seq_len, head_dim (fp16)
# an SDPA backward's kernels as the model launches them: FA2's preprocess, main and dQ conversion
SDPA_BACKWARD_LAUNCHES = 3

# How each HostSpec field is derived from the entries (the file records this beside the values).
DERIVATION = {
    "launch_s": "host_launch.host_s_per_launch",
    "launch_gap_s": "host_launch_gap.gap_s (CUDA events per queued kernel less its own %globaltimer time)",
    "eager_op_s": "host_torch_dispatch.add_requires_grad_s - launch_s",
    "autograd_node_s": "host_autograd.slope_s - launch_s",
    "backward_start_s": "host_autograd_first_kernel.pre_kernel_s - host_autograd.slope_s (without that entry: "
                        "host_autograd.intercept_s, the whole fixed cost)",
    "backward_end_s": "host_autograd.intercept_s - backward_start_s (without host_autograd_first_kernel: 0)",
    "queue_launches": "host_queue.queue_launches",
    "sdpa_forward_s": "median over host_sdpa.runs of forward.host_s, less eager_op_s and launch_s",
    "sdpa_backward_s": "median over host_sdpa.runs of (forward+backward).host_s - forward.host_s, less "
                       "backward_start_s, backward_end_s, autograd_node_s and 3 x launch_s",
}


def _module():
    from .gpu import cupy_module
    cp = cupy_module()
    mod = cp.RawModule(code=HOST_SOURCE.read_text(), options=("-std=c++17",))
    return cp, {name: mod.get_function(name)
                for name in ("hbmsim_empty", "hbmsim_spin", "hbmsim_stamp", "hbmsim_block_starts")}


# ---- pure pieces (tested without a GPU) ----

def fit_line(xs, ys) -> dict:
    """Least-squares y = intercept + slope * x, with R^2."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (intercept + slope * x)
    ss = float(np.sum((y - y.mean()) ** 2))
    return {"slope_s": float(slope), "intercept_s": float(intercept),
            "r2": 1.0 - float(np.sum(resid ** 2)) / ss if ss > 0 else 1.0}


def first_blocked(times_s, threshold_s: float) -> int | None:
    """The index of the first launch that took longer than threshold_s (the launches before it
    did not wait), or None when none did."""
    for i, t in enumerate(times_s):
        if t > threshold_s:
            return i
    return None


def timer_steps(stamps_s) -> list:
    """The nonzero gaps between distinct %globaltimer stamps (up to 1000 of them): their smallest,
    over every repeat, is the timer's observed resolution."""
    d = np.diff(np.unique(np.ravel(stamps_s)))
    return d[d > 0].tolist()[:1000]


def first_wave(starts_s, smids, slots: int, spin_s: float) -> dict:
    """The first wave of a block_starts launch: the blocks that entered before the earliest entry
    plus half the spin (those after it waited for a slot to free), their spread, the spread over
    the blocks less one (seconds a block, in the order they entered), how many SMs they covered
    and how many SMs got `slots` of them."""
    starts, sm = np.asarray(starts_s, dtype=float), np.asarray(smids)
    first = starts < starts.min() + spin_s / 2
    t = np.sort(starts[first])
    per_sm = np.bincount(sm[first])
    spread = float(t[-1] - t[0])
    return {"first_wave_blocks": int(first.sum()), "first_wave_spread_s": spread,
            "per_block_s": spread / (len(t) - 1) if len(t) > 1 else 0.0,
            "sms_reached": int(np.count_nonzero(per_sm)), "sms_full": int(np.count_nonzero(per_sm == slots))}


def cpu_model(cpuinfo: str | None = None) -> str:
    """The host CPU's model name from /proc/cpuinfo (or the text given), else platform's guess."""
    import platform
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def host_provenance() -> dict:
    """What the GPU provenance (kernels/profile.py) does not say and the host's times depend on."""
    import os
    import platform
    try:
        import torch
        torch_version = torch.__version__
        torch_cuda = torch.version.cuda
    except ImportError:
        torch_version = torch_cuda = None
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch": torch_version, "torch_cuda": torch_cuda,
            "cuda_launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING")}


def host_fields(results: dict) -> dict:
    """HostSpec's fields from the measured entries (DERIVATION), those that were measured; the
    values as measured, even when negative (host_from_measured says so)."""
    def get(entry, key):
        v = results.get(entry, {})
        return v.get(key) if isinstance(v, dict) and "skipped" not in v else None

    out: dict = {}
    launch = get("host_launch", "host_s_per_launch")
    if launch is not None:
        out["launch_s"] = launch
    gap = get("host_launch_gap", "gap_s")
    if gap is not None:
        out["launch_gap_s"] = gap
    op = get("host_torch_dispatch", "add_requires_grad_s")
    if op is not None and launch is not None:
        out["eager_op_s"] = op - launch
    slope, intercept = get("host_autograd", "slope_s"), get("host_autograd", "intercept_s")
    if slope is not None and launch is not None:
        out["autograd_node_s"] = slope - launch
    pre = get("host_autograd_first_kernel", "pre_kernel_s")
    if intercept is not None and pre is not None and slope is not None and 0 <= pre - slope <= intercept:
        out["backward_start_s"] = pre - slope               # the engine's start: pre-kernel less one node
        out["backward_end_s"] = intercept - out["backward_start_s"]
    elif intercept is not None:                         # (or a start outside [0, intercept]: a noisy fit
        #                                                  does not resolve the split; H200, 2026-11-27)
        out["backward_start_s"] = intercept                 # the whole, as the public figures count it
    queue = get("host_queue", "queue_launches")
    if queue is not None:
        out["queue_launches"] = queue
    sdpa = results.get("host_sdpa")
    runs = sdpa.get("runs") if isinstance(sdpa, dict) and "skipped" not in sdpa else None
    if runs and "eager_op_s" in out:
        fwd = statistics.median(r["forward"]["host_s"] for r in runs)
        out["sdpa_forward_s"] = fwd - out["eager_op_s"] - launch
        if "backward_start_s" in out and "autograd_node_s" in out:      # (backward_end_s: 0 where not split)
            engine = out["backward_start_s"] + out.get("backward_end_s", 0.0) + out["autograd_node_s"]
            bwd = statistics.median(r["forward+backward"]["host_s"] - r["forward"]["host_s"] for r in runs)
            out["sdpa_backward_s"] = bwd - engine - SDPA_BACKWARD_LAUNCHES * launch
    return out


# ---- CuPy: launches, the gap, the queue ----

def launch_rate(cp, empty, launches: int = 200, repeats: int = 10) -> dict:
    dev = cp.cuda.Device()
    per, with_sync = [], []
    for r in range(repeats + 1):                   # the first batch warms up (module load, caches)
        dev.synchronize()
        t0 = perf_counter()
        for _ in range(launches):
            empty((1,), (1,), ())
        t1 = perf_counter()
        dev.synchronize()
        t2 = perf_counter()
        if r:
            per.append((t1 - t0) / launches)
            with_sync.append((t2 - t0) / launches)
    return {"launches": launches, "repeats": repeats, "host_s_per_launch": statistics.median(per),
            "host_s_per_launch_all": per, "host_s_per_launch_with_sync": statistics.median(with_sync),
            "method": f"time.perf_counter around {launches} back-to-back launches of an empty RawKernel "
                      "(1 block, 1 thread, no arguments) from Python through CuPy, the synchronise after them "
                      "not counted; median of the batches. Includes CuPy's Python call: an upper bound on "
                      "the driver launch PyTorch pays"}


def launch_gap(cp, stamp, spin, kernels: int = 200, repeats: int = 10, spin_s: float = 0.02) -> dict:
    dev = cp.cuda.Device()
    stamps = cp.zeros(2 * kernels, dtype=cp.uint64)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    per, own, stamp_gaps, host_s, diffs = [], [], [], [], []
    for r in range(repeats + 1):
        dev.synchronize()
        spin((1,), (1,), (np.uint64(int(spin_s * 1e9)),))
        t0 = perf_counter()
        start.record()
        for i in range(kernels):
            stamp((1,), (1,), (stamps, np.int32(i), np.uint64(0)))
        end.record()
        t1 = perf_counter()
        end.synchronize()
        if not r:
            continue
        s = cp.asnumpy(stamps).astype(np.int64).reshape(kernels, 2) * 1e-9
        per.append(cp.cuda.get_elapsed_time(start, end) * 1e-3 / kernels)
        own.append(float(np.median(s[:, 1] - s[:, 0])))
        stamp_gaps.append(float(np.median(s[1:, 0] - s[:-1, 1])))
        host_s.append(t1 - t0)
        diffs.extend(timer_steps(s))
    per_s, own_s = statistics.median(per), statistics.median(own)
    hidden = max(host_s) < spin_s
    return {"kernels": kernels, "repeats": repeats, "spin_s": spin_s,
            "event_s_per_kernel": per_s, "own_device_s": own_s, "gap_s": per_s - own_s,
            "stamp_gap_s": statistics.median(stamp_gaps), "globaltimer_resolution_s": min(diffs) if diffs else None,
            "host_s_launching": max(host_s), "queued_behind_spin": hidden,
            "event_s_per_kernel_all": per,
            "method": f"a {spin_s * 1e3:g} ms spin kernel holds the GPU while the host queues {kernels} tiny "
                      "kernels (1 thread, no work) between two CUDA events; gap_s = event seconds / kernels - "
                      "the kernel's own device time (%globaltimer at exit - at entry, median); stamp_gap_s = "
                      "the next kernel's entry - this one's exit (%globaltimer, median). Medians over repeats"}


def block_dispatch(cp, block_starts, waves: int = 2, spin_s: float = 0.001, repeats: int = 10) -> dict:
    dev = cp.cuda.Device()
    sms = int(dev.attributes["MultiProcessorCount"])
    slots = 2                                          # 1024-thread blocks: 2048 threads an SM on sm80 and sm90
    blocks = waves * slots * sms
    starts = cp.zeros(blocks, dtype=cp.uint64)
    smids = cp.zeros(blocks, dtype=cp.uint32)
    runs, diffs = [], []
    for r in range(repeats + 1):                       # the first launch warms up
        dev.synchronize()
        block_starts((blocks,), (1024,), (starts, smids, np.uint64(int(spin_s * 1e9))))
        dev.synchronize()
        if not r:
            continue
        t = cp.asnumpy(starts).astype(np.int64) * 1e-9
        runs.append(first_wave(t, cp.asnumpy(smids), slots, spin_s))
        diffs.extend(timer_steps(t))
    med = {key: statistics.median(r[key] for r in runs) for key in ("first_wave_spread_s", "per_block_s")}
    return {"sms": sms, "slots_per_sm": slots, "blocks": blocks, "spin_s": spin_s, "repeats": repeats, **med,
            "runs": runs, "globaltimer_resolution_s": min(diffs) if diffs else None,
            "method": f"one launch of {blocks} blocks of 1024 threads ({waves} waves of 2 a SM), each block's "
                      f"first thread writing %globaltimer and %smid at its entry, then spinning {spin_s * 1e3:g} ms; "
                      "the first wave = the blocks entering within half the spin of the first; its spread "
                      "(last entry - first) and spread / (blocks - 1), medians over repeats. Read it beside "
                      "globaltimer_resolution_s: a spread below it is not resolved"}


def queue_depth(cp, empty, spin, max_launches: int = 8192, spin_s: float = 0.5, repeats: int = 3) -> dict:
    dev = cp.cuda.Device()
    found, slowest_unblocked = [], []
    threshold = spin_s / 4
    times = np.empty(max_launches)
    for _ in range(repeats):
        dev.synchronize()
        spin((1,), (1,), (np.uint64(int(spin_s * 1e9)),))
        t = perf_counter()
        for i in range(max_launches):
            empty((1,), (1,), ())
            t2 = perf_counter()
            times[i] = t2 - t
            t = t2
        dev.synchronize()
        i = first_blocked(times, threshold)
        found.append(i)
        unblocked = times if i is None else times[:i]
        slowest_unblocked.append(float(np.max(unblocked)) if len(unblocked) else 0.0)
    depths = [i for i in found if i is not None]
    return {"max_launches": max_launches, "spin_s": spin_s, "repeats": repeats, "block_threshold_s": threshold,
            "launches_before_block": found,
            "queue_launches": int(statistics.median(depths)) if len(depths) == len(found) else None,
            "slowest_unblocked_launch_s": max(slowest_unblocked),
            "method": f"a {spin_s:g} s spin kernel, then up to {max_launches} empty launches each timed with "
                      f"time.perf_counter; the first that takes longer than {threshold:g} s waited for the queue: "
                      "the launches before it (median over repeats; null when a repeat never blocked)"}


# ---- PyTorch: dispatch, autograd, SDPA ----

def _per_op(torch, fn, ops: int, repeats: int) -> list:
    out = []
    for r in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = perf_counter()
        keep = fn(ops)                # freed after the clock stops (a recorded chain's nodes)
        t1 = perf_counter()
        torch.cuda.synchronize()
        del keep
        if r:
            out.append((t1 - t0) / ops)
    return out


def torch_dispatch(torch, ops: int = 500, repeats: int = 10) -> dict:
    x = torch.zeros(4, device="cuda")
    leaf = torch.zeros(4, device="cuda", requires_grad=True)
    meta = torch.zeros(4, device="meta")

    def plain(n):
        for _ in range(n):
            x.add_(1)

    def recorded(n):                  # in place on a leaf that requires grad is refused: on a non-leaf
        y = leaf.clone()
        for _ in range(n):
            y.add_(1)
        return y

    def on_meta(n):
        for _ in range(n):
            meta.add_(1)

    res = {"ops": ops, "repeats": repeats}
    for name, fn in (("add_no_grad_s", plain), ("add_requires_grad_s", recorded), ("add_meta_s", on_meta)):
        per = _per_op(torch, fn, ops, repeats)
        res[name], res[name[:-2] + "_all_s"] = statistics.median(per), per
    res["method"] = (f"time.perf_counter around {ops} x.add_(1) on a 4-element float32 CUDA tensor, the synchronise "
                     "after them not counted (queue not full), median of batches: without autograd; on a non-leaf "
                     "clone of a leaf with requires_grad=True (one AddBackward0 recorded per op); on the meta device "
                     "(the dispatcher without a kernel). Each CUDA op includes its launch")
    return res


def autograd_fit(torch, max_nodes: int = 32, repeats: int = 20) -> dict:
    leaf = torch.zeros(4, device="cuda", requires_grad=True)
    grad = torch.ones(4, device="cuda")
    nodes = list(range(1, max_nodes + 1))
    medians = []
    for k in nodes:
        ts = []
        for r in range(repeats + 1):
            y = leaf
            for _ in range(k):
                y = y * 1.5
            leaf.grad = None
            torch.cuda.synchronize()
            t0 = perf_counter()
            y.backward(grad)
            t1 = perf_counter()
            if r:
                ts.append(t1 - t0)
        medians.append(statistics.median(ts))
    torch.cuda.synchronize()
    fit = fit_line(nodes, medians)
    return {"nodes": nodes, "repeats": repeats, "host_s": medians, **fit,
            "method": "time.perf_counter around y.backward(g) where y = leaf * 1.5 * ... (k MulBackward0 nodes, one "
                      "kernel each, then the leaf's AccumulateGrad), 4-element CUDA tensors, k = 1.."
                      f"{max_nodes}, median of {repeats} per k; least-squares line: intercept_s (the engine's "
                      "start, the call and AccumulateGrad) and slope_s (one node with its launch)"}


def autograd_first_kernel(torch, numel: int = 1 << 26, repeats: int = 20) -> dict:
    """pre_kernel_s: from y.backward(g)'s call to its first kernel's start (module docstring)."""
    x = torch.zeros(numel, device="cuda", requires_grad=True)
    g = torch.ones(numel, device="cuda")
    y = x * 1.5

    def events(call) -> list:
        out = []
        for r in range(repeats + 1):
            x.grad = None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            call()
            end.record()
            end.synchronize()
            if r:
                out.append(start.elapsed_time(end) * 1e-3)
        return out
    kernel = events(lambda: g * 1.5)                        # MulBackward0's kernel, alone
    backward = events(lambda: y.backward(g, retain_graph=True))
    kernel_s, backward_s = statistics.median(kernel), statistics.median(backward)
    return {"numel": numel, "repeats": repeats, "kernel_s": kernel_s, "backward_s": backward_s,
            "pre_kernel_s": backward_s - kernel_s,
            "method": "CUDA events around y.backward(g, retain_graph=True), y = x * 1.5 on a float32 CUDA tensor "
                      f"of {numel} elements (x.grad reset to None), less the events around g * 1.5 alone (the "
                      "backward's one kernel); medians: the engine's start, one node and its launch, the kernel "
                      "long enough that the host's hand-back ends before it does"}


def sdpa_tiny(torch, shapes=SDPA_SHAPES, repeats: int = 20) -> dict:
    sdpa = torch.nn.functional.scaled_dot_product_attention
    runs = []
    for b, h, n, d in shapes:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        q0, k0, v0 = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        go = torch.randn(b, h, n, d, device="cuda", dtype=torch.float16)
        rec = {"batch": b, "heads": h, "seq_len": n, "head_dim": d, "dtype": "fp16"}
        # "forward, no grad": inputs autograd does not record, as an inference call's (decode)
        calls = (("forward", lambda: sdpa(q, k, v)), ("forward+backward", lambda: sdpa(q, k, v).backward(go)),
                 ("forward, no grad", lambda: sdpa(q0, k0, v0)))
        for name, call in calls:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev, host, wall = [], [], []
            for r in range(repeats + 1):
                for t in (q, k, v):
                    t.grad = None
                torch.cuda.synchronize()
                t0 = perf_counter()
                start.record()
                call()
                end.record()
                t1 = perf_counter()
                end.synchronize()
                t2 = perf_counter()
                if r:
                    ev.append(start.elapsed_time(end) * 1e-3)
                    host.append(t1 - t0)
                    wall.append(t2 - t0)
            rec[name] = {"event_s": statistics.median(ev), "host_s": statistics.median(host),
                         "wall_s": statistics.median(wall)}
        runs.append(rec)
    return {"runs": runs, "repeats": repeats,
            "method": "torch.nn.functional.scaled_dot_product_attention (PyTorch picks the backend), one call at a "
                      "time after a synchronise: event_s between CUDA events recorded around it, host_s the host's "
                      "time to return from the call, wall_s to the end event's synchronise; medians. 'forward' and "
                      "'forward+backward' on inputs with requires_grad, 'forward, no grad' on inputs without"}


def kernel_floor(torch, repeats: int = 10, calls: int = 200, rows_of=None) -> dict:
    """The shortest device time a kernel row can show: torch.profiler's CUDA rows of a one-element
    in-place add (one tiny kernel a call), per launch, median over `repeats` profiles of `calls`
    calls. `rows_of(fn, calls)`: the profiler's rows (library_timing.kernel_rows)."""
    if rows_of is None:
        from .library_timing import kernel_rows as rows_of
    x = torch.zeros(1, device="cuda", dtype=torch.float32)

    def fn():
        x.add_(1.0)
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    per, rows = [], []
    for _ in range(repeats):
        rows = rows_of(fn, calls)
        launches = sum(r["launches"] for r in rows)
        per.append(sum(r["time_s"] for r in rows) / launches if launches else 0.0)
    return {"calls": calls, "repeats": repeats, "kernel_s": statistics.median(per), "kernel_s_all": per,
            "rows": rows,
            "method": f"torch.profiler (CUDA activity) around {calls} calls of x.add_(1.0) on a one-element float32 "
                      "CUDA tensor: the device time of one kernel row, per launch; median over the repeats"}


def _guarded(name: str, fn, *args, **kw) -> dict:
    """fn's entry, or {"skipped": why} when it fails, so that one failure keeps the others."""
    try:
        return fn(*args, **kw)
    except Exception as err:
        print(f"{name}: failed: {type(err).__name__}: {err}", file=sys.stderr)
        return {"skipped": f"{type(err).__name__}: {err}"}


def _torch():
    """(torch, None) when PyTorch sees a CUDA GPU, else (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA GPU"
    return torch, None


def measure(repeats: int = 10) -> dict:
    """Every host entry (module docstring), keyed as in the output file's results."""
    cp, fn = _module()
    res = {"host_launch": _guarded("host_launch", launch_rate, cp, fn["hbmsim_empty"], repeats=repeats),
           "host_launch_gap": _guarded("host_launch_gap", launch_gap, cp, fn["hbmsim_stamp"], fn["hbmsim_spin"],
                                       repeats=repeats),
           "host_queue": _guarded("host_queue", queue_depth, cp, fn["hbmsim_empty"], fn["hbmsim_spin"]),
           "block_dispatch": _guarded("block_dispatch", block_dispatch, cp, fn["hbmsim_block_starts"],
                                      repeats=repeats)}
    torch, why = _torch()
    for name, f in (("host_torch_dispatch", torch_dispatch), ("host_autograd", autograd_fit),
                    ("host_autograd_first_kernel", autograd_first_kernel), ("host_sdpa", sdpa_tiny),
                    ("kernel_floor", kernel_floor)):
        res[name] = {"skipped": why} if torch is None else _guarded(name, f, torch, repeats=repeats)
    return res
