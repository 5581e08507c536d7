"""Timing the attention implementations others ship, on this machine's GPU, over the
FlashAttention-2 paper's benchmark grid, forward and backward separately, kernel by kernel.

The implementations, named as the published file names them (kernels/implementations.py):
- "fa2": PyTorch's scaled_dot_product_attention forced to its FLASH_ATTENTION backend, which runs
  the FlashAttention-2 kernels PyTorch vendors (flash_fwd_kernel, flash_bwd_* ; the kernel names,
  recorded per run, carry their block sizes). q, k, v are separate (batch, seq, heads, d) leaves
  seen as (batch, heads, seq, d), as flash_attn_func reads them: no copy before or after.
- "pytorch": the paper's baseline, attention_pytorch of the flash-attention repository's
  benchmarks/benchmark_flash_attention.py, op for op: packed qkv (batch, seq, 3, heads, d) with
  requires_grad; q -> (b h) t d and k -> (b h) d s (copies); S = baddbmm(empty, q, k, beta=0,
  alpha=1/sqrt(d)); causal: S + triu(full(-10000), 1) cast to the dtype; P = softmax(S, -1);
  dropout(P, 0.0); O = einsum('bhts,bshd->bthd', P, v).
- "cudnn" (Hopper only): scaled_dot_product_attention forced to its CUDNN_ATTENTION backend, on
  the same (batch, seq, heads, d) leaves as "fa2": cuDNN's fused attention, a warp-specialised
  TMA + wgmma kernel on sm90, which the flash3 program stands for.
- "fa3" (Hopper only, where FlashAttention-3 is installed): flash_attn_interface.flash_attn_func.
  Elsewhere both are skipped, the reason written in the file's "skipped".

Timing follows that benchmark's benchmark_fwd_bwd: the forward is fn(inputs) with autograd
recording; the backward is y.backward(grad, retain_graph=True) on a saved y with the inputs'
.grad reset to None first; forward+backward is their sum. Each is timed with CUDA events
(`repeats` runs after `warmup`), mean and median kept. The kernels of each pass come from
torch.profiler (CUDA activity): name, calls and device time per pass. The SM clock is sampled
through NVML while each configuration is timed (kernels/sm_clock.py).

measure_grid writes a measured file in the published file's schema ("source": "measured"),
which `hbmsim validate FILE` reads; kernels/library.py is its command.
"""
from __future__ import annotations

import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

from .implementations import TIMED_HERE
from .sm_clock import ClockSampler

# The FlashAttention-2 paper's grid (benchmarks/benchmark_flash_attention.py): 16k tokens, hidden 2048.
HIDDEN = 2048
TOKENS = 16384
BATCH_SEQ = ((32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384))
HEAD_DIMS = (64, 128)
# The implementations timed here, by name, with their program and variant; those timed when the
# command names none (the FA2 paper's two; cudnn and fa3 need Hopper and are asked for by name).
IMPLEMENTATIONS = TIMED_HERE
DEFAULT_IMPLEMENTATIONS = ("fa2", "pytorch")
# FLOP convention of that benchmark: forward 4 N^2 d H B (halved when causal), backward 2.5x, both 3.5x
FLOP_FACTOR = {"forward": 1.0, "backward": 2.5, "forward+backward": 3.5}
# nvidia-smi / torch device names -> hbmsim hardware presets
PRESETS = {("H100", 132): "h100-sxm5-80gb", ("H200", 132): "h200-sxm-141gb", ("A100", 108): "a100-sxm4-80gb"}


def paper_flops(batch, heads, seq_len, head_dim, causal, pass_name) -> float:
    f = 4 * batch * seq_len ** 2 * heads * head_dim / (2 if causal else 1)
    return f * FLOP_FACTOR[pass_name]


def _torch():
    import torch
    return torch


def make_fn(impl: str, batch: int, seq_len: int, heads: int, head_dim: int, causal: bool, dtype):
    """(inputs, fn): fn(*inputs) -> O, inputs the leaves whose .grad the backward fills."""
    torch = _torch()
    F = torch.nn.functional
    dev = "cuda"

    def separate_qkv():
        """q, k, v as separate (batch, seq, heads, d) leaves, as flash_attn_func reads them."""
        return tuple(torch.randn(batch, seq_len, heads, head_dim, device=dev, dtype=dtype, requires_grad=True)
                     for _ in range(3))

    def sdpa(backend):
        """scaled_dot_product_attention forced to `backend`, on the leaves seen as (batch, heads, seq, d)."""
        from torch.nn.attention import sdpa_kernel

        def fn(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=causal)
        return fn

    if impl == "fa2":
        from torch.nn.attention import SDPBackend
        return separate_qkv(), sdpa(SDPBackend.FLASH_ATTENTION)
    if impl == "pytorch":
        qkv = torch.randn(batch, seq_len, 3, heads, head_dim, device=dev, dtype=dtype, requires_grad=True)

        def fn(qkv):
            b, n, _, h, d = qkv.shape
            q, k, v = qkv.unbind(dim=2)
            q = q.permute(0, 2, 1, 3).reshape(b * h, n, d)          # b t h d -> (b h) t d
            k = k.permute(0, 2, 3, 1).reshape(b * h, d, n)          # b s h d -> (b h) d s
            s = torch.empty(b * h, n, n, dtype=qkv.dtype, device=qkv.device)
            s = torch.baddbmm(s, q, k, beta=0, alpha=1.0 / math.sqrt(d)).view(b, h, n, n)
            if causal:
                mask = torch.triu(torch.full((n, n), -10000.0, device=s.device), 1)
                s = s + mask.to(dtype=s.dtype)
            p = F.dropout(torch.softmax(s, dim=-1), 0.0)
            return torch.einsum("bhts,bshd->bthd", p, v).to(dtype=qkv.dtype)
        return (qkv,), fn
    if impl in ("cudnn", "fa3"):
        major, minor = torch.cuda.get_device_capability()
        if major < 9:
            raise RuntimeError(f"{impl} runs a Hopper kernel that hbmsim's flash3 program models, and this GPU is "
                               f"sm{major}{minor}: not timed")
        if impl == "cudnn":
            from torch.nn.attention import SDPBackend
            return separate_qkv(), sdpa(SDPBackend.CUDNN_ATTENTION)
        try:
            from flash_attn_interface import flash_attn_func      # FlashAttention-3 (hopper/)
        except ImportError:
            raise RuntimeError("fa3: flash_attn_interface (FlashAttention-3, the hopper/ directory of "
                               "Dao-AILab/flash-attention) is not installed: not timed") from None

        def fn(q, k, v):
            out = flash_attn_func(q, k, v, causal=causal)
            return out[0] if isinstance(out, tuple) else out      # older versions return (out, lse)
        return separate_qkv(), fn
    raise ValueError(f"implementation {impl!r} must be one of {', '.join(IMPLEMENTATIONS)}")


def _time(fn, warmup: int, repeats: int) -> list[float]:
    torch = _torch()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e-3)          # ms -> s
    return out


def kernel_rows(fn, calls: int) -> list[dict]:
    """The CUDA kernels (and copies) one call of fn launches: name, launches and device seconds per call."""
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t_us = getattr(e, "self_device_time_total", None)
        if t_us is None:
            t_us = getattr(e, "self_cuda_time_total", 0.0)
        if not t_us:
            continue
        rows.append({"name": e.key[:400], "launches": e.count / calls, "time_s": t_us * 1e-6 / calls})
    return sorted(rows, key=lambda r: -r["time_s"])


def _stats(times: list[float]) -> dict:
    return {"time_s": statistics.fmean(times), "time_s_median": statistics.median(times),
            "time_s_min": min(times), "times_s": times}


def measure_config(impl, batch, seq_len, heads, head_dim, causal, dtype, warmup, repeats, clocks) -> dict:
    """{pass: {...}} for one configuration: forward, backward and their sum."""
    torch = _torch()
    inputs, fn = make_fn(impl, batch, seq_len, heads, head_dim, causal, dtype)
    t0 = time.monotonic()
    fwd = _time(lambda: fn(*inputs), warmup, repeats)
    clock_fwd = clocks.window(t0)
    y = fn(*inputs)
    grad = torch.randn_like(y)

    def bwd():
        for x in inputs:
            x.grad = None
        y.backward(grad, retain_graph=True)
    t1 = time.monotonic()
    bwdt = _time(bwd, warmup, repeats)
    clock_bwd = clocks.window(t1)
    out = {"forward": {**_stats(fwd), "kernels": kernel_rows(lambda: fn(*inputs), 3), "sm_clock_mhz": clock_fwd},
           "backward": {**_stats(bwdt), "kernels": kernel_rows(bwd, 3), "sm_clock_mhz": clock_bwd}}
    out["forward+backward"] = {"time_s": out["forward"]["time_s"] + out["backward"]["time_s"],
                               "time_s_median": out["forward"]["time_s_median"] + out["backward"]["time_s_median"]}
    return out


def hardware_preset(name: str, sms: int) -> str | None:
    return next((p for (key, n), p in PRESETS.items() if key in name and n == sms), None)


def provenance(command: list[str], warmup: int, repeats: int, impls=DEFAULT_IMPLEMENTATIONS) -> dict:
    """The file's provenance: the machine, the software, how it was timed, and a line for each
    implementation `impls` names."""
    torch = _torch()
    props = torch.cuda.get_device_properties(0)
    prov = {"source": "measured", "gpu": props.name, "sm_count": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", None), "memory_bytes": props.total_memory,
            "compute_capability": f"{props.major}{props.minor}", "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "timing": {"method": "CUDA events around each pass (the forward with autograd recording; the "
                                 "backward as y.backward(grad, retain_graph=True) with .grad reset to None), as "
                                 "flash-attention's benchmark_fwd_bwd times them",
                       "warmup": warmup, "repeats": repeats, "statistic": "mean (time_s), median kept"},
            "kernels": "torch.profiler, CUDA activity, 3 calls per pass averaged",
            "sm_clock": "NVML clock samples every 20 ms while the pass was timed",
            "implementations": {name: impl.describe(impl.timed_here.format(torch=torch.__version__,
                                                                          cudnn=torch.backends.cudnn.version()))
                                for name, impl in IMPLEMENTATIONS.items() if name in impls},
            "fa3": _fa3_version(),
            "setup": "fp16, no dropout, 16k tokens (batch = 16384 / seq_len, at least 1: longer sequences run "
                     "batch 1), "
                     "hidden 2048 (head dim 64: 32 heads; 128: 16 heads), the FlashAttention-2 paper's grid "
                     "unless the command names other sequence lengths",
            "flop_convention": "forward = 4 N^2 d heads batch (halved when causal); backward 2.5x; forward + "
                               "backward 3.5x (benchmark_flash_attention.py)",
            "host": platform.platform(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(command)}
    try:
        import subprocess
        prov["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        pass
    return prov


def _fa3_version() -> str | None:
    """FlashAttention-3's version where it is installed (flash_attn_interface), else None."""
    try:
        import flash_attn_interface
    except ImportError:
        return None
    return str(getattr(flash_attn_interface, "__version__", "installed, version not given"))


# --tiles-per-sm: the query tile the count is in (FA2's forward at head dims 64-256 and its backward's
# key tile are 128 rows: flash_fwd_launch_template.h, flash_bwd_launch_template.h)
TILE_ROWS = 128


def one_wave_grid(seq_lens, tiles_per_sm, sm_count: int) -> tuple[list, list]:
    """([(batch, heads, N)], [reasons skipped]): batch 1 and heads = K x SMs x 128 / N, so that the
    grid holds exactly K 128-row tiles per SM (one wave where K blocks fit an SM at once): the time
    of K = 2 against K = 1 says how much two resident blocks overlap, and time against N at K = 1
    the fixed cost of a tile (its intercept)."""
    grid, skipped = [], []
    for k in tiles_per_sm:
        for n in seq_lens:
            tiles = k * sm_count * TILE_ROWS
            if n % TILE_ROWS or tiles % n:
                skipped.append(f"N = {n}: {k} x {sm_count} SMs x {TILE_ROWS} rows is not a whole number of heads "
                               f"of {n} rows")
            else:
                grid.append((1, tiles // n, n))
    return grid, skipped


def measure_grid(out_path: str, impls, head_dims, causals, max_seq_len: int, warmup: int, repeats: int,
                 command: list[str], seq_lens=None, tiles_per_sm=None) -> dict:
    """`seq_lens`: other sequence lengths than the paper's, at its 16k tokens (batch = 16384 // N, at
    least 1). `tiles_per_sm`: instead, batch 1 and as many heads as make that many 128-row tiles per
    SM (one_wave_grid), whatever the head dim."""
    torch = _torch()
    prov = provenance(command, warmup, repeats, impls)
    hardware = hardware_preset(prov["gpu"], prov["sm_count"])
    doc = {"source": "measured", "provenance": prov, "runs": [], "skipped": []}
    clocks = ClockSampler()
    if tiles_per_sm:
        grid, reasons = one_wave_grid(seq_lens or [512, 1536, 4224, 8448, 16896], tiles_per_sm, prov["sm_count"])
        doc["skipped"] += [{"reason": r} for r in reasons]
        prov["setup"] = (f"fp16, no dropout, batch 1, heads = K x {prov['sm_count']} SMs x {TILE_ROWS} / N for K in "
                         f"{list(tiles_per_sm)} (K {TILE_ROWS}-row tiles per SM: one wave where K blocks fit)")
        shapes = {d: grid for d in head_dims}
    else:
        batch_seq = BATCH_SEQ if not seq_lens else tuple((max(1, TOKENS // n), n) for n in seq_lens)
        shapes = {d: [(b, HIDDEN // d, n) for b, n in batch_seq] for d in head_dims}
    configs = [(impl, causal, d, b, h, n) for causal in causals for d in head_dims for b, h, n in shapes[d]
               for impl in impls if n <= max_seq_len]
    for i, (impl, causal, d, b, h, n) in enumerate(configs):
        wl = {"batch": b, "heads": h, "seq_len": n, "seq_len_q": n, "seq_len_kv": n, "head_dim": d, "dtype": "fp16",
              "causal": causal, "key_padding_mask": False, "dropout": 0.0}
        t = time.monotonic()
        try:
            res = measure_config(impl, b, n, h, d, causal, torch.float16, warmup, repeats, clocks)
            torch.cuda.empty_cache()
        except torch.cuda.OutOfMemoryError as err:
            doc["skipped"].append({"implementation": impl, "workload": wl,
                                   "reason": f"out of memory: {str(err)[:200]}"})
            torch.cuda.empty_cache()
            print(f"[{i + 1}/{len(configs)}] {impl} d={d} N={n} causal={causal}: out of memory", file=sys.stderr)
            continue
        except Exception as err:        # keep the others; the reason is in the file
            doc["skipped"].append({"implementation": impl, "workload": wl,
                                   "reason": f"{type(err).__name__}: {err}"[:400]})
            torch.cuda.empty_cache()
            print(f"[{i + 1}/{len(configs)}] {impl} d={d} N={n} causal={causal}: {type(err).__name__}: {err}",
                  file=sys.stderr)
            continue
        algorithm, variant = IMPLEMENTATIONS[impl].algorithm, IMPLEMENTATIONS[impl].variant
        for pass_name, r in res.items():
            flops = paper_flops(b, h, n, d, causal, pass_name)
            doc["runs"].append({"algorithm": algorithm, "variant": variant, "implementation": impl, "pass": pass_name,
                                "hardware": hardware, "gpu": prov["gpu"], "source": "measured", "workload": wl,
                                # make_fn's own framework ops before each pass's first kernel (validate's
                                # stopwatch pays them)
                                "caller_ops": dict(IMPLEMENTATIONS[impl].caller_ops), "calls": "one",
                                **r, "tflops_per_s": flops / r["time_s"] / 1e12})
        Path(out_path).write_text(json.dumps(doc, indent=1) + "\n")       # after each configuration
        f, bw = res["forward"]["time_s"], res["backward"]["time_s"]
        print(f"[{i + 1}/{len(configs)}] {impl} d={d} B={b} H={h} N={n} causal={causal}: fwd {f * 1e3:.3f} ms, "
              f"bwd {bw * 1e3:.3f} ms ({time.monotonic() - t:.1f} s)", file=sys.stderr)
    doc["gemm"] = gemm_rates(warmup, repeats, clocks)
    clocks.stop()
    Path(out_path).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def gemm_rates(warmup: int, repeats: int, clocks: ClockSampler | None = None) -> list[dict]:
    """cuBLAS through torch.matmul, fp16 in, fp32 accumulate: the achievable dense tensor rate, with
    the SM clock, power draw and clock reasons NVML gave while it ran (`clocks`: a ClockSampler)."""
    torch = _torch()
    out = []
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda", dtype=torch.float16)
        b = torch.randn(n, n, device="cuda", dtype=torch.float16)
        t0 = time.monotonic()
        times = _time(lambda: torch.matmul(a, b), warmup, repeats)
        out.append({"m": n, "n": n, "k": n, "dtype": "fp16", **_stats(times),
                    "flops_per_s": 2 * n ** 3 / statistics.median(times),
                    "sm_clock_mhz": clocks.window(t0) if clocks is not None else None})
    return out
