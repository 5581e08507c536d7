"""How many of a kernel's stores the L2 still holds dirty when the kernel ends: a microbenchmark run
under Nsight Compute.

Why: the model's L2 (simulator/l2.py) writes a dirty line back only when it is evicted, so a kernel
that stores S bytes into a cold L2 ends with up to the whole L2 (50 MB on an H100) of them unwritten,
and its DRAM writes are S minus that. The shipped Nsight runs say the hardware keeps far fewer: 14-20
MB (validation.md, "Where the model is off"). This measures that bound directly, with nothing else in
the kernel: Nsight Compute flushes the L2 before each kernel it profiles (--cache-control all, its
default), so a kernel that stores S bytes and reads nothing else writes

    dram__bytes_write = S - (bytes still dirty in the L2 when the kernel ends)

Three kernels a size, each a grid-stride loop of 16-byte stores (every 32-byte sector written whole):
- `store_<M>MiB`: stores M MiB (no reads);
- `copy_<M>MiB`: reads M MiB and stores M MiB elsewhere (PyTorch's copies: reads competing for the
  L2 with the dirty lines);
- `paced_<M>MiB`: stores M MiB, each 16 bytes after PACE_FMAS dependent FMAs, so that the stores
  trickle (about a twentieth of DRAM's rate) and DRAM is idle most of the time: whether the L2
  writes dirty lines back while DRAM has time to spare (then little is left dirty at the end, as in
  FA2's compute-bound forward, whose Nsight writes are its whole output) or only past its bound.
  (Measured on 2026-11-27 without this mode: the files' 26 kernels are store and copy.)
The kernel's name carries its size, so the raw page reads without this script.

    ncu --csv --page raw --metrics METRICS --log-file x.csv python -m hbmsim.kernels.store_retention
    python -m hbmsim.kernels.store_retention --summarise x.csv --out GPU-l2-store-retention.json
"""
from __future__ import annotations

SIZES_MIB = (4, 8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 256)
MODES = ("store", "copy", "paced")
PACE_FMAS = 2048                      # dependent FMAs before each 16-byte store of a paced kernel
THREADS_PER_BLOCK = 256
BLOCKS_PER_SM = 8                     # 2,048 threads an SM: full occupancy on sm80/sm90
# what Nsight Compute needs to read: the kernel's time, its DRAM bytes, the L2 sectors the SMs
# wrote and read (each 32 B), the clock, and the GPU's name (the file's provenance)
METRICS = ",".join(("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
                    "lts__t_sectors_srcunit_tex_op_write.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
                    "sm__cycles_elapsed.avg.per_second", "device__attribute_display_name",
                    "device__attribute_multiprocessor_count"))

_BODY = r"""
extern "C" __global__ void {name}(float4* __restrict__ out, const float4* __restrict__ in, long long n) {{
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{
        {pre}out[i] = {value};
    }}
}}
"""
# the paced kernel's chain: x = x * a + b, PACE_FMAS times, a and b from the index so the compiler
# cannot fold it; its result is stored
_PACE = ("float x = (float)(i & 1023), a = 0.999f + 1e-7f * (float)(i & 7); "
         "for (int k = 0; k < {fmas}; ++k) x = fmaf(x, a, 1e-3f); ")


def kernel_name(mode: str, mib: int) -> str:
    return f"{mode}_{mib}MiB"


def source(sizes_mib=SIZES_MIB) -> str:
    """One kernel a mode and size (the same body; the name says the size)."""
    value = {"store": "make_float4(1.f, 2.f, 3.f, 4.f)", "copy": "in[i]", "paced": "make_float4(x, x, x, x)"}
    pre = {"store": "", "copy": "", "paced": _PACE.format(fmas=PACE_FMAS)}
    return "".join(_BODY.format(name=kernel_name(m, s), value=value[m], pre=pre[m]) for s in sizes_mib for m in MODES)


def parse_name(name: str) -> tuple[str, int] | None:
    """('store' | 'copy' | 'paced', MiB) from a kernel name this module made, else None."""
    mode, _, rest = name.partition("_")
    if mode not in MODES or not rest.endswith("MiB") or not rest[:-3].isdigit():
        return None
    return mode, int(rest[:-3])


def retention(kernels: list[dict]) -> list[dict]:
    """From --summarise-ncu's kernels: per kernel, the bytes it stored, the DRAM bytes written and read
    during it, and the bytes left dirty in the L2 at its end (stored - DRAM written)."""
    rows = []
    for k in kernels:
        parsed = parse_name(k.get("name", ""))
        if parsed is None or "dram__bytes_write.sum" not in k:
            continue
        mode, mib = parsed
        stored = mib * 2**20
        rows.append({"mode": mode, "stored_bytes": stored, "dram_write_bytes": k["dram__bytes_write.sum"],
                     "dram_read_bytes": k.get("dram__bytes_read.sum"), "time_ns": k.get("gpu__time_duration.sum"),
                     "dirty_at_end_bytes": stored - k["dram__bytes_write.sum"]})
    return rows


COLLECTED = ("ncu --csv --page raw --metrics METRICS (kernels/store_retention.py) around one launch of each "
             "kernel, Nsight Compute's default cache control (the L2 flushed and invalidated before each kernel) "
             "and clock control (the SM clock locked to base: times are at sm__cycles_elapsed.avg.per_second); "
             f"{BLOCKS_PER_SM} blocks of {THREADS_PER_BLOCK} threads an SM, a grid-stride loop of 16-byte stores")


def document(kernels: list[dict], raw_page: str, gpu: list, command: str) -> dict:
    """The shipped file: the kernels as --summarise-ncu keeps them, and retention()'s rows."""
    from .profile import now_utc
    return {"source": "measured",
            "what": "bytes a kernel's stores leave dirty in the L2 at its end (kernels/store_retention.py)",
            "provenance": {"gpu": gpu, "raw_pages": [raw_page], "collected": COLLECTED, "summarised": now_utc(),
                           "command": command},
            "retention": retention(kernels), "runs": [{"file": raw_page, "kernels": kernels}]}


def parser():
    import argparse
    p = argparse.ArgumentParser(prog="python -m hbmsim.kernels.store_retention",
                                description="launch the store and copy kernels once each (run under ncu), or "
                                            "--summarise the raw page ncu wrote")
    p.add_argument("--sizes-mib", type=int, nargs="+", default=list(SIZES_MIB))
    p.add_argument("--summarise", metavar="CSV", help="ncu's raw page of these kernels -> --out JSON")
    p.add_argument("--out", help="the JSON --summarise writes")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    if any(m < 1 for m in a.sizes_mib):
        parser().error(f"--sizes-mib: {min(a.sizes_mib)} MiB; each size must be at least 1 MiB")
    if a.summarise:
        import json
        import sys
        from pathlib import Path
        from .library_nsight import ncu_device, summarise_ncu_raw
        if not a.out:
            parser().error("--summarise needs --out FILE")
        try:
            text = Path(a.summarise).read_text()
        except OSError as err:
            parser().error(f"--summarise: {a.summarise!r}: {err.strerror}")
        doc = document(summarise_ncu_raw(text), Path(a.summarise).name, [g for g in [ncu_device(text)] if g],
                       " ".join(["python -m hbmsim.kernels.store_retention", *(argv or sys.argv[1:])]))
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {a.out}: {len(doc['retention'])} kernels")
        return 0
    import cupy as cp
    mod = cp.RawModule(code=source(a.sizes_mib))
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    for mib in a.sizes_mib:
        n = mib * 2**20 // 16                          # float4 elements: 16 B each
        out, src = cp.empty(n * 4, cp.float32), cp.empty(n * 4, cp.float32)
        for mode in MODES:
            mod.get_function(kernel_name(mode, mib))((sms * BLOCKS_PER_SM,), (THREADS_PER_BLOCK,),
                                                     (out, src, cp.int64(n)))
        cp.cuda.runtime.deviceSynchronize()
        del out, src
    print(f"launched {len(MODES) * len(a.sizes_mib)} kernels: {', '.join(map(str, a.sizes_mib))} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
