"""`python -m hbmsim.kernels.library`: the command that times the attention implementations
others ship (PyTorch's FlashAttention-2 kernels and the FA2 paper's PyTorch baseline by default;
on Hopper, `--impl cudnn fa3`: torch's cuDNN attention and FlashAttention-3) on this machine's
GPU, and profiles them. `hbmsim profile-library` checks its input and calls main().

- `--out FILE` (the default action): time the FlashAttention-2 paper's grid, forward and backward
  pass by pass, into a measured file that `hbmsim validate FILE` reads (kernels/library_timing.py);
- `--ncu IMPL D N CAUSAL PASS`: run one pass of one configuration for Nsight Compute to profile
  (DRAM and L2 bytes per kernel), `--ops IMPL D N CAUSAL`: print which operator launched each
  kernel, `--ncu-decode B N`: one decode call (the --decode grid's SDPA set-up) for Nsight Compute,
  `--summarise-ncu CSV...`: ncu raw pages -> `--out` JSON (kernels/library_nsight.py);
- `--decode --out FILE [--out-kvcache FILE2]`: time decode (one query row, grouped-query heads,
  long KV) over a batch x KV-length grid, forward only: torch SDPA's FLASH backend with enable_gqa
  into FILE, flash-attn's flash_attn_with_kvcache (contiguous and paged) into FILE2 when the
  package imports (kernels/library_decode.py).

The implementations (those timed by default) and the paper's head dimensions are IMPLEMENTATIONS
(DEFAULT_IMPLEMENTATIONS) and HEAD_DIMS here.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .library_nsight import ncu_decode, ncu_one, op_table, summarise_ncu_raw, summary_provenance
from . import library_decode
from .library_timing import DEFAULT_IMPLEMENTATIONS, HEAD_DIMS, IMPLEMENTATIONS, measure_grid

__all__ = ["DEFAULT_IMPLEMENTATIONS", "HEAD_DIMS", "IMPLEMENTATIONS", "main"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hbmsim.kernels.library")
    p.add_argument("--out")
    p.add_argument("--impl", nargs="+", help=f"of {' '.join(IMPLEMENTATIONS)}; default: "
                   f"{' '.join(DEFAULT_IMPLEMENTATIONS)} (with --decode: "
                   f"{' '.join(library_decode.IMPLEMENTATIONS)})")
    p.add_argument("--head-dim", nargs="+", type=int, default=list(HEAD_DIMS))
    p.add_argument("--causal", nargs="+", default=["false", "true"])
    p.add_argument("--max-seq-len", type=int, default=1 << 20)
    p.add_argument("--seq-lens", nargs="+", type=int, help="other sequence lengths (batch = 16384 // N, >= 1)")
    p.add_argument("--tiles-per-sm", nargs="+", type=positive_int, metavar="K",
                   help="batch 1 and heads = K x SMs x 128 / N (N from --seq-lens, default 512 1536 4224 8448 "
                        "16896): K 128-row tiles per SM, one wave")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--ncu", nargs=5, metavar=("IMPL", "D", "N", "CAUSAL", "PASS"))
    p.add_argument("--ncu-decode", nargs=2, type=positive_int, metavar=("B", "N"),
                   help="run one decode call (the --decode grid's SDPA set-up, batch B, KV length N) for ncu")
    p.add_argument("--ops", nargs=4, metavar=("IMPL", "D", "N", "CAUSAL"))
    p.add_argument("--summarise-ncu", nargs="+", metavar="CSV", help="ncu raw-page CSVs -> --out JSON")
    p.add_argument("--decode", action="store_true", help="the decode grid (kernels/library_decode.py)")
    p.add_argument("--out-kvcache", help="with --decode: the file for flash-attn's runs (default: beside --out, "
                   f"named <stem>-{library_decode.KVCACHE}.json)")
    p.add_argument("--batches", nargs="+", type=positive_int, default=list(library_decode.BATCHES),
                   help="with --decode: batch sizes")
    p.add_argument("--kv-lens", nargs="+", type=positive_int, default=list(library_decode.KV_LENS),
                   help="with --decode: KV-cache lengths (tokens per sequence)")
    p.add_argument("--no-flush-l2", action="store_true", help="with --decode: leave the L2 warm between calls")
    return p


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (also scripts/fold_audit.py's)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def decode_main(p: argparse.ArgumentParser, a, command: list) -> int:
    impls = a.impl or list(library_decode.IMPLEMENTATIONS)
    bad = [i for i in impls if i not in library_decode.IMPLEMENTATIONS]
    if bad:
        p.error(f"--decode: --impl {bad[0]!r} must be one of {', '.join(library_decode.IMPLEMENTATIONS)}")
    if not a.out:
        p.error("--decode needs --out FILE")
    kvcache = a.out_kvcache or library_decode.default_kvcache_path(a.out)
    if Path(kvcache).resolve() == Path(a.out).resolve():
        p.error("--out-kvcache must name another file than --out (one measurement per configuration and file)")
    library_decode.measure_decode(a.out, kvcache, impls, a.batches, a.kv_lens, a.warmup, a.repeats, command,
                                  flush_l2=not a.no_flush_l2)
    return 0


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    command = ["python", "-m", "hbmsim.kernels.library"] + list(argv if argv is not None else sys.argv[1:])
    if a.decode:
        return decode_main(p, a, command)
    if a.summarise_ncu:
        if not a.out:
            p.error("--summarise-ncu needs --out FILE")
        try:
            texts = [Path(f).read_text() for f in a.summarise_ncu]
        except OSError as err:
            p.error(f"--summarise-ncu: {err.filename!r}: {err.strerror}")
        runs = [{"file": Path(f).name, "kernels": summarise_ncu_raw(t)} for f, t in zip(a.summarise_ncu, texts)]
        prov = summary_provenance(a.summarise_ncu, texts, command)
        Path(a.out).write_text(json.dumps({"source": "measured", "provenance": prov, "runs": runs}, indent=1) + "\n")
        return 0
    if a.ncu_decode:
        return ncu_decode(*a.ncu_decode)
    if a.ops:
        impl, d, n, causal = a.ops
        return op_table(impl, int(d), int(n), causal == "true")
    if a.ncu:
        impl, d, n, causal, pass_name = a.ncu
        if a.tiles_per_sm and len(a.tiles_per_sm) != 1:
            p.error("--ncu profiles one configuration: give --tiles-per-sm one K")
        return ncu_one(impl, int(d), int(n), causal == "true", pass_name, a.tiles_per_sm[0] if a.tiles_per_sm else None)
    bad = [i for i in a.impl or () if i not in IMPLEMENTATIONS]
    if bad:
        p.error(f"--impl {bad[0]!r} must be one of {', '.join(IMPLEMENTATIONS)}")
    measure_grid(a.out, a.impl or list(DEFAULT_IMPLEMENTATIONS), a.head_dim, [c == "true" for c in a.causal],
                 a.max_seq_len, a.warmup, a.repeats, command, a.seq_lens, a.tiles_per_sm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
