"""How much code an SM runs from its instruction caches at full speed: a microbenchmark.

Why: FA2's causal forward at N = 256-1024 runs 14-26% longer than the model predicts where the
same lengths without a mask are within 3-9% (Nsight, h200-ncu-short-causal.json), and in those runs
its warps wait on instruction fetch (Nsight's no_instruction stall: 1.31-1.41 warp-cycles an
issued instruction, 0.05-0.23 elsewhere). Its kernel is 72 KB of SASS, two copies of the step among
it (the masking steps' 22 KB and the rest's 27 KB: ncu's source page). Whether code of that size
runs from the SM's instruction caches is a property of the GPU that no datasheet gives; this
measures it.

Each kernel `icache_<K>KiB` loops over a straight-line body of K KiB of SASS: K x 1024 / 16
independent FFMAs (16 bytes each on sm70 and later; eight accumulators, so a warp never waits on
its own last result), FFMA_CHAINS chains of distinct constants that ptxas cannot fold, the loop
not unrolled (its body is the only code that runs; nvcc 13.0 for sm_90 makes the kernel's .text the
body and 896 bytes of set-up, loop and store, by readelf on the cubin). One block an
SM of 1, 2 or 4 warps a scheduler runs the body ITERATIONS_OF(K) times; clock64 at the block's
start and end gives its cycles, and cycles / (instructions a warp x warps a scheduler) the cycles a
scheduler takes an instruction: 1 while the body runs from the caches at the issue rate, more once
each pass fetches its instructions from further away. The size at which it rises is the capacity.

Two streams (since 2026-11-27, second session): FA2's causal blocks are not in step, so the two
warps a scheduler holds (one of each resident block) run different code, where the unmasked
kernel's blocks, in step, run the same (and share what is fetched). Each kernel `icache2_<K>KiB`
holds two bodies of K KiB, alike but for their constants; warp w runs the second when (w / 4) is
odd (warps go to the schedulers by w mod 4, so with 2 warps a scheduler each scheduler has one warp
of each body: two streams of K KiB, 2K between them). Its cycles an instruction, against the one
body's at the same 2K and at K, say what a scheduler pays when its two warps fetch different code:
the cost a rule for FA2's causal waits needs (docs/validation.md: no rule yet fits them).

    python -m hbmsim.kernels.icache --out GPU-icache.json     (on a GPU with CuPy)
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

SIZES_KIB = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
TWO_STREAM_SIZES_KIB = (4, 8, 12, 16, 24, 32, 48, 64)       # each body's; the two together twice that
TWO_STREAM_WARPS = (2, 4)          # warps a scheduler of the two-body kernels: half of them on each body
FFMA_BYTES = 16                    # one SASS instruction on sm70 and later (Volta onwards: 128-bit encodings)
FFMA_CHAINS = 8                    # independent accumulators: a warp's next FFMA never waits on its last
WARPS_PER_SCHEDULER = (1, 2, 4)    # 4, 8, 16 warps a block, one block an SM
SCHEDULERS = 4                     # warp schedulers an SM (H100 whitepaper, SM diagram: four partitions)
INSTRUCTIONS_PER_WARP = 1 << 21    # about 2 M FFMAs a warp a launch (~1 ms at one a cycle)

_KERNEL = r"""
extern "C" __global__ void {name}(float* out, long long* cycles, float a, int iterations) {{
    float x0 = threadIdx.x, x1 = x0 + 1.f, x2 = x0 + 2.f, x3 = x0 + 3.f,
          x4 = x0 + 4.f, x5 = x0 + 5.f, x6 = x0 + 6.f, x7 = x0 + 7.f;
{setup}    __syncthreads();
    long long start = clock64();
{timed}
    __syncthreads();
    long long end = clock64();
    out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
    if (threadIdx.x == 0) cycles[blockIdx.x] = end - start;
}}
"""
# the timed loop over one body (`indent` before each of its lines)
_LOOP = """{indent}#pragma unroll 1
{indent}for (int it = 0; it < iterations; ++it) {{
{body}
{indent}}}"""
# the two-body kernels' set-up and timed part: warp w runs the second body when (w / 4) is odd
_SECOND = "    const bool second = ((threadIdx.x >> 5) / {schedulers}) & 1;     // warp w: (w / 4) odd\n"
_TWO = """    if (second) {{
{loop_b}
    }} else {{
{loop_a}
    }}"""


def kernel_name(kib: int, streams: int = 1) -> str:
    return f"icache_{kib}KiB" if streams == 1 else f"icache{streams}_{kib}KiB"


def ffmas(kib: int) -> int:
    """The body's FFMAs: its KiB of SASS at 16 bytes an instruction."""
    return kib * 1024 // FFMA_BYTES


def iterations(kib: int) -> int:
    """Passes over the body: about INSTRUCTIONS_PER_WARP FFMAs a warp whatever the size."""
    return max(1, INSTRUCTIONS_PER_WARP // ffmas(kib))


def body(kib: int, first: int = 1, indent: str = "        ") -> str:
    """x_c = fmaf(x_c, a, constant) in turn over the FFMA_CHAINS accumulators, each constant its own
    (a runtime multiplier and distinct addends from `first` on: nothing to fold or hoist),
    ffmas(kib) statements."""
    return "\n".join(f"{indent}x{i % FFMA_CHAINS} = fmaf(x{i % FFMA_CHAINS}, a, {first + i}e-7f);"
                      for i in range(ffmas(kib)))


def source(sizes_kib=SIZES_KIB) -> str:
    return "".join(_KERNEL.format(name=kernel_name(k), setup="", timed=_LOOP.format(indent="    ", body=body(k)))
                   for k in sizes_kib)


def source_two(sizes_kib=TWO_STREAM_SIZES_KIB) -> str:
    """The two-body kernels: the second body's addends follow the first's, so the two differ
    (ptxas cannot merge them) and each is ffmas(K) FFMAs."""
    def loop(k: int, first: int) -> str:
        return _LOOP.format(indent=" " * 8, body=body(k, first, " " * 12))
    return "".join(_KERNEL.format(name=kernel_name(k, 2), setup=_SECOND.format(schedulers=SCHEDULERS),
                                  timed=_TWO.format(loop_a=loop(k, 1), loop_b=loop(k, 1 + ffmas(k))))
                   for k in sizes_kib)


def cycles_per_instruction(block_cycles: list, kib: int, warps_per_scheduler: int) -> float:
    """A scheduler's cycles an issued instruction: the blocks' median cycles over the instructions
    each scheduler issues (the body's FFMAs x passes x its warps; the loop's own few not counted)."""
    return statistics.median(block_cycles) / (ffmas(kib) * iterations(kib) * warps_per_scheduler)


def measure(sizes_kib=SIZES_KIB, repeats: int = 3, two_stream_sizes_kib=TWO_STREAM_SIZES_KIB) -> list[dict]:
    """One row per kernel and warps a scheduler: the one-body kernels over `sizes_kib`, then the
    two-body kernels over `two_stream_sizes_kib` ("streams": 2, "code_kib" each body's,
    "union_kib" both)."""
    import cupy as cp
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    rows = []
    plan = [(k, 1, WARPS_PER_SCHEDULER) for k in sizes_kib] + [(k, 2, TWO_STREAM_WARPS) for k in two_stream_sizes_kib]
    for kib, streams, warps in plan:          # a module a kernel: each compiled (seconds) just before it runs
        code = source((kib,)) if streams == 1 else source_two((kib,))
        fn = cp.RawModule(code=code).get_function(kernel_name(kib, streams))
        for wps in warps:
            threads = 32 * SCHEDULERS * wps
            out = cp.zeros(sms * threads, dtype=cp.float32)
            cycles = cp.zeros(sms, dtype=cp.int64)
            args = (out, cycles, cp.float32(0.9999), cp.int32(iterations(kib)))
            fn((sms,), (threads,), args)                      # warm: the module loaded, the clocks up
            runs = []
            for _ in range(repeats):
                fn((sms,), (threads,), args)
                cp.cuda.runtime.deviceSynchronize()
                runs.append(cycles_per_instruction(cycles.get().tolist(), kib, wps))
            rows.append({"kernel": kernel_name(kib, streams), "code_kib": kib, "streams": streams,
                         "union_kib": streams * kib, "ffmas": ffmas(kib), "iterations": iterations(kib),
                         "warps_per_scheduler": wps, "cycles_per_instruction": statistics.median(runs),
                         "repeats": runs})
            print(f"{kib:4d} KiB x {streams} bodies, {wps} warps a scheduler: "
                  f"{rows[-1]['cycles_per_instruction']:.3f} cycles an instruction", flush=True)
    return rows


def parser():
    import argparse
    p = argparse.ArgumentParser(prog="python -m hbmsim.kernels.icache", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the measured file to write")
    p.add_argument("--repeats", type=int, default=3)
    return p


def main(argv=None) -> int:
    from .profile import gpu_provenance
    p = parser()
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error(f"--repeats {a.repeats}: must be at least 1")        # one line, exit 2
    command = ["python", "-m", "hbmsim.kernels.icache", "--out", a.out, "--repeats", str(a.repeats)]
    prov = gpu_provenance(command, 1, a.repeats, None)
    prov["timing"] = {"method": "clock64 at each block's start and end (after a __syncthreads), one block an SM; "
                                "cycles an instruction = the blocks' median cycles / (FFMAs a warp x warps a "
                                "scheduler); the median of the repeats", "warmup": 1, "repeats": a.repeats}
    doc = {"source": "measured", "what": "instruction-cache capacity microbenchmark (kernels/icache.py): a "
                                         "scheduler's cycles an FFMA over straight-line bodies of 4-256 KiB, "
                                         "and with its two warps on two different bodies of 4-64 KiB each",
           "provenance": prov, "results": measure(repeats=a.repeats)}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
