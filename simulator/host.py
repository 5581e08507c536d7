"""The host: what a stopwatch around a pass sees beyond the kernels' own device time.

A CUDA-event stopwatch (or a wall clock with a synchronise) around a pass of eager PyTorch
measures the kernels, the idle gaps between them, and the host's own work whenever the GPU has
to wait for it: the framework dispatching each op (Python, the dispatcher, autograd's
recording), the driver launching each kernel, and in a backward the autograd engine starting and
walking its nodes. The host runs ahead of the GPU through the launch queue, so for long kernels
its work hides; for short passes (small N, many small kernels) it is the floor.

The model (one stream, kernels in program order), with the start marker at t = 0:
    host:  h_i = h_{i-1} + ops_i * op_s + launch_s          (op_s: eager_op_s forward, autograd_node_s backward)
           h_i >= start_{i - queue_launches}                 (a full launch queue blocks the host)
    GPU:   start_i = max(h_i, end_{i-1} + launch_gap_s)      (the first kernel: max(h_1, 0))
           end_i = start_i + device_s_i
    the pass's event time = max(end_n, h_n + (backward_end_s in a backward)); its kernel time = sum(device_s_i).
Calls run back to back (a benchmark loop between two synchronises: torch.utils.benchmark's
timeit, as the FlashAttention papers time) overlap one call's host work with the previous call's
kernels, so a call takes its period: max(sum(device_s_i) + launches x launch_gap_s, the host's
busy time a call); the GPU waits only when the host is the slower of the two.
A backward first pays `backward_start_s`, the autograd engine's fixed cost of a call on CUDA
tensors (the Python call, the graph walk, handing the graph to the device's worker thread and,
after the last node, back), and after its last launch `backward_end_s` (no public figure splits
the two hand-overs, so the public figures put the whole before the first node, an upper bound on
what the stopwatch of a long backward sees; `hbmsim microbench --host` measures the split). The
caller's own ops around the library call (`caller_ops`: a timing harness's transposes before
SDPA, say) are paid before the pass's first launch, and so is the host work of a call of torch's
scaled_dot_product_attention beyond its op and launches (sdpa_forward_s, sdpa_backward_s: checks,
backend selection, allocations) where the timed call is one. Device work that no launch starts (the L2's
write-back of dirty lines at a pass's end) follows the last kernel.

The fields are public figures (the SDPA call's, which none gives, this project's measurement), cited
in SOURCES; `hbmsim microbench` measures them on a GPU.
Nothing here is fitted to a measured pass time.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostSpec:
    launch_s: float = 5e-6            # host CPU + driver time of one kernel launch
    launch_gap_s: float = 0.9e-6      # GPU idle between two back-to-back kernels already queued
    eager_op_s: float = 6.8e-6        # one eager PyTorch op with autograd recording, its launch excluded
    autograd_node_s: float = 6.8e-6   # one node of autograd's backward (no direct figure: as an eager op)
    backward_start_s: float = 95.7e-6 # the autograd engine's fixed cost of a backward call on CUDA tensors
    backward_end_s: float = 0.0       # of which after the last node (the hand-back): 0, all of it counted before
    queue_launches: int = 1000        # launches the host may queue ahead of the GPU before a launch blocks
    # one call of torch's scaled_dot_product_attention: the host's time beyond what the fields above
    # charge for its op and launch (forward), its node, launches and the engine (backward): argument
    # checks, backend selection, allocations (measured on tiny calls: kernels/host_microbench.py)
    sdpa_forward_s: float = 84.7e-6
    sdpa_backward_s: float = 157.4e-6


SOURCES = {
    "launch_s": "NVIDIA TensorRT-RTX docs, 'Optimizing TensorRT-RTX Performance': 'most CUDA kernels take the CPU "
                "and the driver around 5-15 microseconds to launch per kernel' (the low end: a server CPU)",
    "launch_gap_s": "NVIDIA developer blog, 'Getting Started with CUDA Graphs' (A. Gray): a 2.9 us kernel takes "
                    "3.8 us per kernel launched back to back in a stream: 0.9 us between kernels",
    "eager_op_s": "pytorch/pytorch#41383: about 6.8 us per op with requires_grad=True (5 us without); "
                  "H. He, 'Making Deep Learning Go Brrrr': 280 thousand ops a second (3.6 us) without autograd",
    "autograd_node_s": "no published per-node figure; taken as one eager op with autograd (pytorch#41383)",
    "backward_start_s": "pytorch/pytorch#157407 (A100 PCIe, CUDA 12.8): out.backward(grad, retain_graph=True) "
                        "of out = a @ b (128 x 128 bf16 on CUDA, a and b leaves with .grad) back to back, 136.1 us "
                        "a call: three nodes (MmBackward0, two AccumulateGrad: 3 x 6.8 us) and four launches (two "
                        "GEMMs, two in-place adds: 4 x 5 us) leave 95.7 us for the engine. (On CPU tensors, "
                        "pytorch/pytorch#47592: autograd.grad(a*b) 26.6 us a call, 13 us for the engine: no "
                        "device thread to hand the graph to.)",
    "backward_end_s": "no public figure splits the engine's cost between the hand-over before the first node and "
                      "the hand-back after the last: 0 here, the whole in backward_start_s, until `hbmsim microbench "
                      "--host` measures the split (host_autograd_first_kernel)",
    "queue_launches": "NVIDIA developer forum (R. Crovella, threads 68937 and 199567): about 1000 launches queue "
                      "per stream before a launch becomes synchronous",
    "sdpa_forward_s": "no public figure; measured by this project on an H100 (scenarios/measured/h100-host.json, "
                      "host_sdpa: torch 2.11, one SDPA call on fp16 inputs of batch 1, 1 head, N = 128 and 512, "
                      "head dim 64): 96.5 us of host time a forward call (median of the two), less the op and the "
                      "launch the public fields above charge for it (6.8 + 5 us)",
    "sdpa_backward_s": "no public figure; the same measurement: a forward and backward call took 274.9 us more host "
                       "time than the forward alone, less the engine (95.7 us), one node (6.8 us) and three "
                       "launches (FA2's preprocess, main and dQ-conversion kernels: 3 x 5 us) the public fields "
                       "charge",
}

DEFAULT_HOST = HostSpec()


@dataclass(frozen=True)
class HostStep:
    """The host's part in one kernel: framework ops (or autograd nodes) dispatched before its
    launch, and whether a launch starts it at all (False: device work no launch starts)."""
    device_s: float
    ops: int = 1
    launched: bool = True


@dataclass(frozen=True)
class PassTimes:
    kernel_time_s: float     # the kernels' device time, summed (what a profiler's kernel rows see)
    time_s: float            # what a stopwatch around the pass sees
    host_s: float            # the host's busy time (ops and launches; in a backward the engine's start and end)
    starts_s: tuple          # each kernel's start, from the start marker
    host_issue_s: tuple      # when the host finished launching each kernel
    period_s: float = 0.0    # a call's time when calls run back to back: max(kernels and their gaps, host_s)


def pass_times(steps: list, backward: bool, host: HostSpec = DEFAULT_HOST, caller_ops: int = 0,
               sdpa: bool = False) -> PassTimes:
    """The stopwatch's view of one pass whose kernels are `steps` (HostStep, in program order), the
    caller dispatching `caller_ops` framework ops of its own before the first launch; `sdpa`: the
    pass is a call of torch's scaled_dot_product_attention, whose own host work (sdpa_forward_s,
    sdpa_backward_s) comes before its first launch."""
    op_s = host.autograd_node_s if backward else host.eager_op_s
    h = (host.backward_start_s if backward else 0.0) + caller_ops * op_s
    if sdpa:
        h += host.sdpa_backward_s if backward else host.sdpa_forward_s
    end = 0.0
    starts, issues = [], []
    launched = 0
    for step in steps:
        if not step.launched:                       # follows the last kernel, without a launch
            starts.append(end)
            issues.append(h)
            end += step.device_s
            continue
        if launched >= host.queue_launches:         # the queue is full: wait for the oldest launch to start
            h = max(h, starts[-host.queue_launches])
        h += step.ops * op_s + host.launch_s
        start = max(h, end + host.launch_gap_s) if launched else h
        starts.append(start)
        issues.append(h)
        end = start + step.device_s
        launched += 1
    kernel_s = sum(s.device_s for s in steps)
    busy = h + (host.backward_end_s if backward else 0.0)     # the engine hands back after the last node
    period = max(kernel_s + launched * host.launch_gap_s, busy)
    return PassTimes(kernel_s, max(end, busy), busy, tuple(starts), tuple(issues), period)


def call_time_s(passes: dict, host: HostSpec = DEFAULT_HOST, caller_ops: dict | None = None,
                loop: bool = False, sdpa: bool = False) -> float:
    """A call's time over its passes ({pass name: [HostStep, ...]}, each pass its own stopwatch,
    summed): one synchronised call (PassTimes.time_s), or with `loop` a call of a loop of calls
    (PassTimes.period_s); `caller_ops` ({pass: ops}) the caller's own ops before each pass; `sdpa`:
    each pass a call of torch's SDPA (pass_times)."""
    ops = caller_ops or {}
    times = (pass_times(steps, name == "backward", host, ops.get(name, 0), sdpa) for name, steps in passes.items())
    return sum(t.period_s if loop else t.time_s for t in times)


def host_from_measured(path, defaults: HostSpec | None = None) -> HostSpec:
    """A HostSpec from a measured file's "host_spec" (`hbmsim microbench`, kernels/host_microbench.py).
    Each field must be there (or, with `defaults`, is taken from it), a finite number >= 0, and
    queue_launches a whole number >= 1; else an HbmsimError of one line naming file, field, value, limit."""
    import json
    import math
    from pathlib import Path
    from .errors import HbmsimError

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as err:
        raise HbmsimError(f"host: {str(p)!r}: cannot read a JSON file ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''})") from None
    if not isinstance(doc, dict) or doc.get("source") != "measured":
        got = doc.get("source") if isinstance(doc, dict) else None
        raise HbmsimError(f"host: {str(p)!r}: field 'source' = {got!r} must be 'measured'")
    spec = doc.get("host_spec")
    if not isinstance(spec, dict):
        raise HbmsimError(f"host: {str(p)!r}: no 'host_spec' table (write one with `hbmsim microbench --host` "
                          "on a GPU)")
    values = {}
    for name in HostSpec.__dataclass_fields__:
        where = f"host: {str(p)!r}: field 'host_spec.{name}'"
        if name == "backward_end_s" and spec.get(name) is None:
            values[name] = 0.0            # not split (host_microbench.host_fields): the whole is backward_start_s
            continue
        if name not in spec or spec[name] is None:
            if defaults is None:
                raise HbmsimError(f"{where} is missing (not measured: see the file's results for why)")
            values[name] = getattr(defaults, name)
            continue
        v = spec[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise HbmsimError(f"{where} = {v!r} must be a number")
        if not math.isfinite(v):
            raise HbmsimError(f"{where} = {v!r} must be a finite number")
        if name == "queue_launches":
            if v != int(v) or v < 1:
                raise HbmsimError(f"{where} = {v!r} must be a whole number >= 1")
            v = int(v)
        elif v < 0:
            raise HbmsimError(f"{where} = {v!r} must be >= 0 (seconds)")
        values[name] = v
    return HostSpec(**values)
