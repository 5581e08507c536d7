"""Timing decode attention as libraries ship it, on this machine's GPU (issue 25, item 7): one new
query row per sequence against a long KV cache, grouped-query heads (Llama 3 8B: 32 query heads
share 8 K/V heads, head dim 128, fp16), over a batch x KV-length grid, forward only.

Two implementations (kernels/implementations.py, grid "decode"), each written to its own file
(a measured file holds one measurement per configuration, and both time the same ones):
- "sdpa-gqa-decode": torch.nn.functional.scaled_dot_product_attention forced to its
  FLASH_ATTENTION backend with enable_gqa=True (torch >= 2.5): q (B, 32, 1, 128), k and v
  (B, 8, N, 128), not causal (one row sees the whole cache). The FA2 kernels vendored in torch
  choose split-KV (flash_fwd_splitkv_kernel + flash_fwd_splitkv_combine_kernel) and the GQA
  packing themselves; the kernel rows show which ran.
- "fa2-kvcache": flash_attn.flash_attn_with_kvcache of the flash-attn package when it imports,
  num_splits=0 (its heuristic), the cache contiguous (B, N, 8, 128) or paged (pages of
  PAGE_SIZE tokens, the pages of all sequences in one shuffled block table), cache_seqlens = N,
  no new tokens appended.

Each run records what `hbmsim validate` needs to reproduce it: algorithm flash2, variant
fa2-kernel, num_splits "auto" and pack_gqa "auto" (FA2's rules, algorithms/flash2_splitkv.py),
kv_append false, the workload (kv_heads 8, seq_len_q 1, seq_len_kv N, kv_page_size when paged)
and the hardware preset of the GPU. Times are CUDA events around each call (library_timing._time),
the L2 flushed before each timed call unless told not to (a decode step of a real model finds the
layer's KV cache cold: every other layer's has passed through L2 since); kernel rows from
torch.profiler, the flush's own rows taken out. A configuration whose tensors do not fit the free
GPU memory is recorded under "skipped" with the reason, as is one that fails.

The pure parts (the grid, the workloads, the memory estimate, the run records, the loop with its
skips) take no torch; TorchDecode holds everything that touches the GPU.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from .implementations import TIMED_DECODE

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128          # Llama-3-8B-like attention
BATCHES = (1, 8, 64)
KV_LENS = tuple(1024 << i for i in range(8))   # 1k .. 128k
PAGE_SIZE = 256                                # FA2's paged KV needs a multiple of 256 tokens per page
ELEMENT_BYTES = 2                              # fp16
SDPA, KVCACHE = "sdpa-gqa-decode", "fa2-kvcache"
IMPLEMENTATIONS = TIMED_DECODE
FREE_FRACTION = 0.9                            # what of the free GPU memory a configuration may plan to use
MAPPING = {"variant": "fa2-kernel", "num_splits": "auto", "pack_gqa": "auto", "kv_append": False}


def layouts(impl: str) -> tuple:
    """The KV-cache layouts an implementation is timed with: None = contiguous, else the page size."""
    return (None, PAGE_SIZE) if impl == KVCACHE else (None,)


def decode_plan(impls, batches, kv_lens) -> list[tuple]:
    """(implementation, batch, KV length, page size or None) in timing order: each implementation's
    whole grid, shortest caches first."""
    return [(impl, b, n, page) for impl in impls for page in layouts(impl) for b in batches for n in kv_lens]


def decode_workload(batch: int, kv_len: int, page: int | None = None) -> dict:
    w = {"batch": batch, "heads": HEADS, "kv_heads": KV_HEADS, "seq_len_q": 1, "seq_len_kv": kv_len,
         "head_dim": HEAD_DIM, "dtype": "fp16", "causal": False, "key_padding_mask": False, "dropout": 0.0}
    if page is not None:
        w["kv_page_size"] = page
    return w


def kv_bytes(batch: int, kv_len: int, page: int | None = None) -> int:
    """The bytes of K and V one call reads (whole pages when paged)."""
    n = kv_len if page is None else math.ceil(kv_len / page) * page
    return 2 * batch * n * KV_HEADS * HEAD_DIM * ELEMENT_BYTES


def needed_bytes(batch: int, kv_len: int, page: int | None = None) -> int:
    """GPU memory a configuration allocates, about: K and V, q and O, and the split-KV partials
    (fp32 O and log-sum-exp for up to 128 splits), plus 1% for the allocator's rounding."""
    q_o = 2 * batch * HEADS * HEAD_DIM * ELEMENT_BYTES
    partials = 128 * batch * HEADS * (HEAD_DIM + 1) * 4
    return int((kv_bytes(batch, kv_len, page) + q_o + partials) * 1.01)


def split_kernels(rows: list) -> dict:
    """Which FA2 kernels the rows show: the split-KV kernel, its combine, the one-pass kernel."""
    names = [r["name"] for r in rows]
    return {"splitkv_kernel": any("flash_fwd_splitkv_kernel" in n for n in names),
            "combine_kernel": any("splitkv_combine" in n for n in names),
            "one_pass_kernel": any("flash_fwd_kernel" in n for n in names)}


def run_record(impl: str, wl: dict, hardware: str | None, gpu: str, res: dict) -> dict:
    """One run in the compare schema from a configuration's measurement `res` (time_s,
    time_s_median, time_s_min, times_s, kernels, sm_clock_mhz, l2_flushed)."""
    kernels = res.get("kernels") or []
    page = wl.get("kv_page_size")
    return {"algorithm": IMPLEMENTATIONS[impl].algorithm, "implementation": impl, "pass": "forward",
            "hardware": hardware, "gpu": gpu, "source": "measured", "workload": wl,
            **{**MAPPING, "variant": IMPLEMENTATIONS[impl].variant}, **res, **split_kernels(kernels),
            "kv_gb_per_s": kv_bytes(wl["batch"], wl["seq_len_kv"], page) / res["time_s"] / 1e9}


def minus_rows(rows: list, other: list) -> list:
    """Kernel rows less another profile's rows (the L2 flush's), name by name."""
    sub = {r["name"]: r for r in other}
    out = []
    for r in rows:
        o = sub.get(r["name"])
        if o is not None:
            r = {**r, "launches": r["launches"] - o["launches"], "time_s": r["time_s"] - o["time_s"]}
            if r["launches"] <= 0.5:
                continue
        out.append(r)
    return out


def default_kvcache_path(out: str) -> str:
    p = Path(out)
    return str(p.with_name(f"{p.stem}-{KVCACHE}{p.suffix or '.json'}"))


def _write(path: str, doc: dict) -> None:
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def measure_decode(out_path: str, kvcache_path: str | None, impls, batches, kv_lens, warmup: int, repeats: int,
                   command: list, flush_l2: bool = True, gpu=None) -> dict:
    """Time the decode grid; write the SDPA runs to `out_path` and flash-attn's to `kvcache_path`
    (default: beside it, see default_kvcache_path). `gpu`: a TorchDecode (tests pass a fake).
    Returns {path: document} of the files written; each is rewritten after every configuration."""
    gpu = TorchDecode(flush_l2) if gpu is None else gpu
    kvcache_path = kvcache_path or default_kvcache_path(out_path)
    prov = gpu.provenance(command, warmup, repeats)
    hardware = gpu.hardware(prov)
    paths = {SDPA: out_path, KVCACHE: kvcache_path}
    docs = {p: {"source": "measured", "provenance": prov, "runs": [], "skipped": []}
            for p in dict.fromkeys([out_path] + [paths[i] for i in impls])}
    missing = {}
    for impl in impls:
        ok, why = gpu.available(impl)
        if not ok:
            missing[impl] = why
            docs[out_path]["skipped"].append({"implementation": impl, "workload": None, "reason": why})
            print(f"{impl}: not timed ({why})", file=sys.stderr)
    plan = [c for c in decode_plan(impls, batches, kv_lens) if c[0] not in missing]
    for i, (impl, b, n, page) in enumerate(plan):
        doc = docs[paths[impl]]
        wl = decode_workload(b, n, page)
        head = f"[{i + 1}/{len(plan)}] {impl} B={b} N={n}" + (f" paged {page}" if page else "")
        need, free = needed_bytes(b, n, page), gpu.free_bytes()
        if need > FREE_FRACTION * free:
            reason = f"does not fit: needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
            doc["skipped"].append({"implementation": impl, "workload": wl, "reason": reason})
            print(f"{head}: skipped, {reason}", file=sys.stderr)
            continue
        t = time.monotonic()
        try:
            res = gpu.measure(impl, b, n, page, warmup, repeats)
        except Exception as err:        # keep the others; the reason is in the file
            reason = ("out of memory: " + str(err)[:200]) if gpu.is_oom(err) else f"{type(err).__name__}: {err}"[:400]
            doc["skipped"].append({"implementation": impl, "workload": wl, "reason": reason})
            print(f"{head}: {reason}", file=sys.stderr)
            continue
        finally:
            gpu.release()
        doc["runs"].append(run_record(impl, wl, hardware, prov["gpu"], res))
        _write(paths[impl], doc)
        r = doc["runs"][-1]
        print(f"{head}: {r['time_s_median'] * 1e6:.1f} us median, {r['kv_gb_per_s']:.0f} GB/s of K/V, "
              f"split {r['splitkv_kernel']}, combine {r['combine_kernel']} ({time.monotonic() - t:.1f} s)",
              file=sys.stderr)
    gpu.stop()
    for path, doc in docs.items():
        if doc["runs"] or path == out_path:
            _write(path, doc)
    return {p: d for p, d in docs.items() if d["runs"] or p == out_path}


class TorchDecode:
    """The GPU side of measure_decode: inputs, calls, timings, kernel rows, provenance."""

    def __init__(self, flush_l2: bool = True):
        import torch
        from .sm_clock import ClockSampler
        self.torch = torch
        self.flush_l2 = flush_l2
        self.clocks = ClockSampler()
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 << 20
        self._flush_buf = torch.empty(4 * l2, dtype=torch.uint8, device="cuda") if flush_l2 else None

    # what measure_decode asks
    def available(self, impl: str) -> tuple[bool, str]:
        if impl == SDPA:
            try:
                from torch.nn.attention import sdpa_kernel  # noqa: F401
            except ImportError:
                return False, f"torch {self.torch.__version__} has no torch.nn.attention.sdpa_kernel"
            return True, ""
        try:
            import flash_attn  # noqa: F401
            from flash_attn import flash_attn_with_kvcache  # noqa: F401
        except Exception as err:
            return False, f"flash-attn does not import ({type(err).__name__}: {err})"[:300]
        return True, ""

    def free_bytes(self) -> int:
        return self.torch.cuda.mem_get_info()[0]

    def is_oom(self, err: Exception) -> bool:
        return isinstance(err, self.torch.cuda.OutOfMemoryError)

    def release(self) -> None:
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def stop(self) -> None:
        self.clocks.stop()

    def hardware(self, prov: dict) -> str | None:
        from .library_timing import hardware_preset
        return hardware_preset(prov["gpu"], prov["sm_count"])

    def provenance(self, command: list, warmup: int, repeats: int) -> dict:
        from .library_timing import provenance
        prov = provenance(command, warmup, repeats)
        try:
            import flash_attn
            prov["flash_attn"] = getattr(flash_attn, "__version__", "unknown")
        except Exception as err:
            prov["flash_attn"] = f"not importable ({type(err).__name__})"
        prov["timing"] = {"method": "CUDA events around each call, forward only, no autograd"
                                    + ("; the L2 flushed (a buffer of 4x the L2 zeroed) before each timed call, "
                                       "outside the events" if self.flush_l2 else "; the L2 not flushed"),
                          "warmup": warmup, "repeats": repeats, "statistic": "mean (time_s), median kept"}
        prov["kernels"] = "torch.profiler, CUDA activity, 3 calls averaged, the L2 flush's rows taken out"
        prov["sm_clock"] = "NVML clock samples every 20 ms while the configuration was timed"
        prov["implementations"] = {name: impl.describe(impl.timed_here.format(torch=self.torch.__version__))
                                   for name, impl in IMPLEMENTATIONS.items()}
        prov["setup"] = (f"decode: fp16, q heads {HEADS}, K/V heads {KV_HEADS} (enable_gqa), head dim {HEAD_DIM}, "
                         "one query row per sequence (seq_len_q 1), not causal, KV length N for every sequence; "
                         f"batch x N grid; paged: {PAGE_SIZE} tokens per page, a shuffled block table; "
                         "mapping recorded as FA2 decides it: num_splits auto, pack_gqa auto")
        prov["flop_convention"] = "none: decode is memory-bound; kv_gb_per_s = K and V bytes / time_s"
        return prov

    def _call(self, impl: str, b: int, n: int, page: int | None):
        torch = self.torch
        dt, dev = torch.float16, "cuda"
        if impl == SDPA:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            F = torch.nn.functional
            q = torch.randn(b, HEADS, 1, HEAD_DIM, device=dev, dtype=dt)
            k = torch.randn(b, KV_HEADS, n, HEAD_DIM, device=dev, dtype=dt)
            v = torch.randn(b, KV_HEADS, n, HEAD_DIM, device=dev, dtype=dt)

            def fn():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True)
            return fn
        from flash_attn import flash_attn_with_kvcache
        q = torch.randn(b, 1, HEADS, HEAD_DIM, device=dev, dtype=dt)
        seqlens = torch.full((b,), n, dtype=torch.int32, device=dev)
        if page is None:
            kc = torch.randn(b, n, KV_HEADS, HEAD_DIM, device=dev, dtype=dt)
            vc = torch.randn(b, n, KV_HEADS, HEAD_DIM, device=dev, dtype=dt)
            table = None
        else:
            per_seq = math.ceil(n / page)
            kc = torch.randn(b * per_seq, page, KV_HEADS, HEAD_DIM, device=dev, dtype=dt)
            vc = torch.randn(b * per_seq, page, KV_HEADS, HEAD_DIM, device=dev, dtype=dt)
            gen = torch.Generator().manual_seed(0)
            table = torch.randperm(b * per_seq, generator=gen).to(torch.int32).view(b, per_seq).to(dev)

        def fn():
            return flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=False,
                                           num_splits=0)
        return fn

    def _flush(self) -> None:
        if self._flush_buf is not None:
            self._flush_buf.zero_()

    def measure(self, impl: str, b: int, n: int, page: int | None, warmup: int, repeats: int) -> dict:
        from .library_timing import _stats, kernel_rows
        torch = self.torch
        with torch.no_grad():
            fn = self._call(impl, b, n, page)
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize()
            t0 = time.monotonic()
            times = []
            for _ in range(repeats):
                self._flush()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)          # ms -> s
            clock = self.clocks.window(t0)

            def flushed():
                self._flush()
                fn()
            rows = kernel_rows(flushed, 3)
            if self._flush_buf is not None:
                rows = minus_rows(rows, kernel_rows(self._flush, 3))
        return {**_stats(times), "kernels": rows, "sm_clock_mhz": clock, "l2_flushed": self.flush_l2}
