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
    the pass's event time = end_n; its kernel time = sum(device_s_i).
A backward first pays `backward_start_s` (the autograd engine's start). Device work that no
launch starts (the L2's write-back of dirty lines at a pass's end) follows the last kernel.

The fields are public figures, cited in SOURCES; `hbmsim microbench` measures them on a GPU.
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
    backward_start_s: float = 13e-6   # the autograd engine's start of a backward
    queue_launches: int = 1000        # launches the host may queue ahead of the GPU before a launch blocks


SOURCES = {
    "launch_s": "NVIDIA TensorRT-RTX docs, 'Optimizing TensorRT-RTX Performance': 'most CUDA kernels take the CPU "
                "and the driver around 5-15 microseconds to launch per kernel' (the low end: a server CPU)",
    "launch_gap_s": "NVIDIA developer blog, 'Getting Started with CUDA Graphs' (A. Gray): a 2.9 us kernel takes "
                    "3.8 us per kernel launched back to back in a stream: 0.9 us between kernels",
    "eager_op_s": "pytorch/pytorch#41383: about 6.8 us per op with requires_grad=True (5 us without); "
                  "H. He, 'Making Deep Learning Go Brrrr': 280 thousand ops a second (3.6 us) without autograd",
    "autograd_node_s": "no published per-node figure; taken as one eager op with autograd (pytorch#41383)",
    "backward_start_s": "pytorch/pytorch#47592: torch.autograd.grad(a*b) on 2x2 tensors 26.6 us a call, which is "
                        "the forward op (6.8 us) + the engine's start + one node (6.8 us): 13 us for the start",
    "queue_launches": "NVIDIA developer forum (R. Crovella, threads 68937 and 199567): about 1000 launches queue "
                      "per stream before a launch becomes synchronous",
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
    host_s: float            # the host's busy time (ops and launches)
    starts_s: tuple          # each kernel's start, from the start marker
    host_issue_s: tuple      # when the host finished launching each kernel


def pass_times(steps: list, backward: bool, host: HostSpec = DEFAULT_HOST) -> PassTimes:
    """The stopwatch's view of one pass whose kernels are `steps` (HostStep, in program order)."""
    op_s = host.autograd_node_s if backward else host.eager_op_s
    h = host.backward_start_s if backward else 0.0
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
    busy = h
    return PassTimes(kernel_s, max(end, h), busy, tuple(starts), tuple(issues))
