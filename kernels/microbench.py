"""Microbenchmarks on this machine's GPU, for the hardware presets' achievable rates.

`hbmsim microbench --out FILE` measures, each as the median of `repeats` timed runs after a
warm-up, with CUDA events:

- the mma.sync tensor-core rate (the instruction FlashAttention-1/2 issue; FLOPs per second and
  per SM per clock), and the SM clock it ran at (clock64 cycles / event seconds);
- the special-function unit's exp2 rate (results per SM per clock), and its clock;
- DRAM bandwidth: a device-to-device copy (bytes read + written) and a STREAM triad
  a = b + s * c (two reads, one write), on arrays far larger than the L2;
- the L2's read rate for whole 128-byte lines (a warp's 32 consecutive words) against
  single-sector requests (each lane a word of its own line: a transposing copy's reads,
  simulator/tensor.py's GATHER), from an L2-resident buffer: `l2_sector_cost_bytes` says how many
  bytes of the L2's line bandwidth a lone 32-byte sector costs (32: sector-exact, as the
  simulator counts it; 64: a slot of two sectors).

- load-to-use latency (pointer_chase: one thread, each load's address the last load's value):
  an L2 hit (a 4 MiB buffer walked once untimed) and a DRAM access (256 MiB and 2 GiB buffers, each
  walk on from where the last stopped: every line new), in SM
  cycles (clock64) and in seconds (CUDA events over the whole walk); `--latency`: these only.

With the host's launch and dispatch times (kernels/host_microbench.py; `--host`: those only),
and the HostSpec fields they give (the file's "host_spec", read by simulator/host.py).

Every figure is labelled "measured" with the GPU, driver, clocks and command in the file's
provenance. The presets cite such a file by name; nothing here is fitted to a published time.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from .config import KERNEL_DIR

MICROBENCH_SOURCE = KERNEL_DIR / "microbench.cu"
MMA_FLOPS_PER_WARP_INSTR = 2 * 16 * 8 * 16     # m16n8k16: M*N*K multiply-adds, 2 FLOPs each
CHAINS = 8                                       # independent instructions per loop trip (microbench.cu)
THREADS = 256


def _module():
    from .gpu import cupy_module
    cp = cupy_module()
    return cp, cp.RawModule(code=MICROBENCH_SOURCE.read_text(), options=("-std=c++17",))


def _timed(cp, launch, warmup: int, repeats: int) -> list[float]:
    """Seconds of each of `repeats` runs of launch(), after `warmup` untimed ones."""
    for _ in range(warmup):
        launch()
    cp.cuda.Device().synchronize()
    start, end, out = cp.cuda.Event(), cp.cuda.Event(), []
    for _ in range(repeats):
        start.record()
        launch()
        end.record()
        end.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)     # ms -> s
    return out


WARM_S = 1.0          # load before timing, so that the clocks have left idle (345 MHz on an idle H100)


def _loop_kernel(cp, fn, sms: int, blocks_per_sm: int, iters: int, warmup: int, repeats: int,
                 threads: int = THREADS) -> dict:
    """One wave of fn(out, cycles, iters) in blocks of `threads`: seconds, and the SM clock from
    clock64 deltas."""
    import time
    from .sm_clock import ClockSampler
    blocks = sms * blocks_per_sm
    out = cp.empty(blocks * threads, dtype=cp.float32)
    cycles = cp.zeros(blocks, dtype=cp.int64)
    launch = lambda: fn((blocks,), (threads,), (out, cycles, np.int32(iters)))
    t_end = time.monotonic() + WARM_S
    while time.monotonic() < t_end:
        launch()
        cp.cuda.Device().synchronize()
    clocks = ClockSampler(0.005)
    t0 = time.monotonic()
    times_s = _timed(cp, launch, warmup, repeats)
    nvml = clocks.window(t0)
    clocks.stop()
    t_s = statistics.median(times_s)
    cyc = float(np.median(cp.asnumpy(cycles)))          # the last run's per-block cycles
    return {"blocks": blocks, "blocks_per_sm": blocks_per_sm, "threads_per_block": threads, "iters": iters,
            "time_s": t_s, "times_s": times_s, "block_cycles_median": cyc,
            # cycles one block ran / kernel seconds: the SM clock only when every block runs for the
            # whole kernel (one block per SM); with several, the warp scheduler finishes some early
            "sm_clock_hz": cyc / t_s, "nvml_sm_clock_mhz": nvml}


def _clock_hz(r: dict) -> float:
    """The clock per-clock rates are given at: NVML's median SM clock while timing, else clock64's."""
    nvml = r.get("nvml_sm_clock_mhz")
    return nvml["median"] * 1e6 if nvml else r["sm_clock_hz"]


L2_BUFFER_BYTES = 8 << 20     # L2-resident on every preset's GPU (A100 40 MB, H100 50 MB, H200 50 MB)
L2_LINE_BYTES = 128
SECTOR_BYTES = 32
L2_ITERS = 2048               # trips of CHAINS loads per thread (about 1-2 ms coalesced on an H100)


def l2_rates(warps: int, iters: int, line_s: float, sector_s: float) -> dict:
    """What l2_read_loop's two runs give. A coalesced warp load is one 128-byte line (4 sectors);
    a spread one, 32 single-sector requests. `l2_sector_cost_bytes`: the line bandwidth's bytes each
    lone sector request takes, line bytes/s x (sector run's seconds / its requested sectors)."""
    loads = warps * iters * CHAINS                          # warp load instructions of each run
    line_bytes_per_s = loads * L2_LINE_BYTES / line_s
    sector_requests_per_s = loads * 32 / sector_s
    return {"warp_loads": loads, "line_bytes_per_s": line_bytes_per_s,
            "sector_requests_per_s": sector_requests_per_s,
            "sector_bytes_per_s": sector_requests_per_s * SECTOR_BYTES,
            "l2_sector_cost_bytes": line_bytes_per_s / sector_requests_per_s}


CHASE_LINE_BYTES = 128                               # a step a line: no two steps share an L2 line
# bytes: well inside every preset's L2; 5x and 40x H100's (the larger walk meets more TLB misses)
CHASE_BUFFERS = {"l2_hit": 4 << 20, "dram_256mib": 256 << 20, "dram": 2 << 30}
CHASE_STEPS = 1 << 16                                # loads a walk (~10-30 ms)


def chase_cycle(n_lines: int, seed: int = 0) -> np.ndarray:
    """The buffer (uint32 words) of one random cycle through n_lines lines: the first word of line
    j holds the word index of the line after j, so idx = buf[idx] visits every line once per lap."""
    order = np.random.default_rng(seed).permutation(n_lines).astype(np.int64)
    stride = CHASE_LINE_BYTES // 4
    buf = np.zeros(n_lines * stride, dtype=np.uint32)
    buf[order * stride] = np.roll(order, -1) * stride
    return buf


def measure_latency(warmup: int = 1, repeats: int = 5, module=None) -> dict:
    """pointer_chase over each of CHASE_BUFFERS: seconds and cycles a load (medians of the repeats);
    `module`: measure's (cp, compiled microbench.cu), else compiled here."""
    cp, mod = module or _module()
    fn = mod.get_function("pointer_chase")
    out, cycles, res = cp.zeros(1, dtype=cp.uint32), cp.zeros(1, dtype=cp.int64), {}
    for name, nbytes in CHASE_BUFFERS.items():
        out[0] = 0                       # each walk goes on from the last one's line (pointer_chase)
        buf = cp.asarray(chase_cycle(nbytes // CHASE_LINE_BYTES))
        steps = min(CHASE_STEPS, nbytes // CHASE_LINE_BYTES) if name == "l2_hit" else CHASE_STEPS
        per_load_cycles = []

        def run():
            fn((1,), (1,), (buf, out, cycles, np.int32(steps)))
            cp.cuda.Device().synchronize()
            per_load_cycles.append(int(cycles.get()[0]) / steps)
        times = _timed(cp, run, warmup, repeats)
        cyc = statistics.median(per_load_cycles[warmup:])
        t_s = statistics.median(times) / steps
        res[f"load_latency_{name}"] = {"buffer_bytes": nbytes, "steps": steps, "threads": 1,
                                       "cycles_per_load": cyc, "seconds_per_load": t_s,
                                       "sm_clock_hz": cyc / t_s, "time_s": statistics.median(times),
                                       "times_s": times,
                                       "method": "CUDA events around one walk of `steps` dependent loads "
                                                 "(the launch's microseconds included, under 1% of a walk)"}
    return res


def measure(warmup: int = 3, repeats: int = 10) -> dict:
    cp, mod = _module()
    dev = cp.cuda.Device()
    sms = cp.cuda.runtime.getDeviceProperties(dev.id)["multiProcessorCount"]
    res: dict = {}

    # mma.sync: warps * iters * CHAINS instructions, MMA_FLOPS_PER_WARP_INSTR FLOPs each;
    # 4 (one block of 128 threads: one warp a scheduler, as a lone FA2 forward block), 8, 16 and
    # 32 warps per SM (1, 2, 4 blocks of 256 threads)
    for bps, threads in ((1, 128), (1, THREADS), (2, THREADS), (4, THREADS)):
        r = _loop_kernel(cp, mod.get_function("mma_sync_loop"), sms, bps, 32768, warmup, repeats, threads)
        flops = r["blocks"] * (threads // 32) * r["iters"] * CHAINS * MMA_FLOPS_PER_WARP_INSTR
        r.update(flops=flops, flops_per_s=flops / r["time_s"],
                 flops_per_clk_per_sm=flops / (r["time_s"] * _clock_hz(r) * sms))
        res[f"mma_sync_m16n8k16_f16_f32_{bps * threads // 32}warps"] = r

    # exp2 on the SFU: threads * iters * CHAINS results; 16 and 32 warps per SM
    for bps in (2, 4):
        r = _loop_kernel(cp, mod.get_function("ex2_loop"), sms, bps, 16384, warmup, repeats)
        n = r["blocks"] * THREADS * r["iters"] * CHAINS
        r.update(results=n, results_per_s=n / r["time_s"],
                 results_per_clk_per_sm=n / (r["time_s"] * _clock_hz(r) * sms))
        res[f"ex2_approx_f32_{bps * THREADS // 32}warps"] = r

    # L2: one wave of 4 blocks of 256 threads an SM reading an 8 MiB buffer, lines then lone sectors
    lines = L2_BUFFER_BYTES // L2_LINE_BYTES
    buf = cp.arange(L2_BUFFER_BYTES // 4, dtype=cp.uint32)
    blocks = 4 * sms
    out = cp.empty(blocks * THREADS, dtype=cp.float32)
    cycles = cp.zeros(blocks, dtype=cp.int64)
    fn = mod.get_function("l2_read_loop")
    runs = {}
    for spread in (0, 1):
        times = _timed(cp, lambda: fn((blocks,), (THREADS,), (buf, out, cycles, np.int32(lines), np.int32(L2_ITERS),
                                                              np.int32(spread))), warmup, repeats)
        # (and the last run's per-block clock64 cycles: with 4 blocks an SM, not the SM clock)
        runs[spread] = (statistics.median(times), times, float(np.median(cp.asnumpy(cycles))))
    r = l2_rates(blocks * THREADS // 32, L2_ITERS, runs[0][0], runs[1][0])
    r.update(buffer_bytes=L2_BUFFER_BYTES, blocks=blocks, threads_per_block=THREADS, iters=L2_ITERS,
             time_s=runs[0][0] + runs[1][0],           # the two runs' medians together
             line_time_s=runs[0][0], line_times_s=runs[0][1], line_block_cycles_median=runs[0][2],
             sector_time_s=runs[1][0], sector_times_s=runs[1][1], sector_block_cycles_median=runs[1][2])
    res["l2_read_lines_vs_sectors"] = r

    # DRAM: 2 GiB arrays (40x H100's L2), copy = read + write, triad = 2 reads + 1 write
    n = 2 ** 31 // 4
    a, b, c = (cp.ones(n, dtype=cp.float32) for _ in range(3))
    times = _timed(cp, lambda: cp.copyto(a, b), warmup, repeats)
    t_s = statistics.median(times)
    res["dram_copy"] = {"bytes": 2 * 4 * n, "time_s": t_s, "times_s": times, "bytes_per_s": 2 * 4 * n / t_s}
    triad = cp.ElementwiseKernel("float32 b, float32 c, float32 s", "float32 a", "a = b + s * c", "hbmsim_triad")
    s = np.float32(3.0)
    times = _timed(cp, lambda: triad(b, c, s, a), warmup, repeats)
    t_s = statistics.median(times)
    res["dram_triad"] = {"bytes": 3 * 4 * n, "time_s": t_s, "times_s": times, "bytes_per_s": 3 * 4 * n / t_s}
    res.update(measure_latency(module=(cp, mod)))
    return res


def parser():
    import argparse
    p = argparse.ArgumentParser(prog="python -m hbmsim.kernels.microbench")
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--host", action="store_true", help="the host's launch and dispatch fields only (no rates)")
    p.add_argument("--latency", action="store_true", help="the load-to-use latencies only (pointer_chase)")
    return p


def main(argv=None) -> int:
    import sys
    from . import host_microbench
    from .profile import gpu_provenance
    a = parser().parse_args(argv)
    command = ["python", "-m", "hbmsim.kernels.microbench", "--out", a.out, "--repeats", str(a.repeats)]
    command += ["--host"] if a.host else []
    command += ["--latency"] if a.latency else []
    prov = gpu_provenance(command, 3, a.repeats, None)
    prov.update(host_microbench.host_provenance())
    prov["timing"] = {"method": "CUDA events around each launch; clock64 cycles per block; the host entries: "
                                "time.perf_counter and CUDA events, each entry's method", "warmup": 3,
                      "repeats": a.repeats, "statistic": "median"}
    if a.latency:            # the latencies only: no host entries, no host_spec
        doc = {"source": "measured", "what": "load-to-use latency microbenchmark (kernels/microbench.cu: "
                                             "pointer_chase; kernels/microbench.py: measure_latency)",
               "provenance": prov, "results": measure_latency()}
    else:
        results = {} if a.host else measure(repeats=a.repeats)
        host = host_microbench.measure(repeats=a.repeats)
        results.update(host)
        doc = {"source": "measured", "what": "microbenchmarks (kernels/microbench.cu, kernels/microbench.py; the "
                                             "host: kernels/host_microbench.cu, kernels/host_microbench.py)",
               "provenance": prov, "results": results, "host_spec": host_microbench.host_fields(host),
               "host_spec_derivation": host_microbench.DERIVATION}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    for k, v in doc["results"].items():
        print(k, {x: y for x, y in v.items() if not isinstance(y, (list, dict)) and x != "method"}, file=sys.stderr)
    if "host_spec" in doc:
        print("host_spec", doc["host_spec"], file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
