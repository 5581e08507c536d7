"""`python -m hbmsim.kernels.library`: the command that times the attention implementations
others ship (PyTorch's FlashAttention-2 kernels and the FA2 paper's PyTorch baseline) on this
machine's GPU, and profiles them. `hbmsim profile-library` checks its input and calls main().

- `--out FILE` (the default action): time the FlashAttention-2 paper's grid, forward and backward
  pass by pass, into a measured file that `hbmsim validate FILE` reads (kernels/library_timing.py);
- `--ncu IMPL D N CAUSAL PASS`: run one pass of one configuration for Nsight Compute to profile
  (DRAM and L2 bytes per kernel), `--ops IMPL D N CAUSAL`: print which operator launched each
  kernel, `--summarise-ncu CSV...`: ncu raw pages -> `--out` JSON (kernels/library_nsight.py).

The implementations and the paper's head dimensions are IMPLEMENTATIONS and HEAD_DIMS here.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .library_nsight import ncu_one, op_table, summarise_ncu_raw
from .library_timing import HEAD_DIMS, IMPLEMENTATIONS, measure_grid

__all__ = ["HEAD_DIMS", "IMPLEMENTATIONS", "main"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hbmsim.kernels.library")
    p.add_argument("--out")
    p.add_argument("--impl", nargs="+", default=list(IMPLEMENTATIONS))
    p.add_argument("--head-dim", nargs="+", type=int, default=list(HEAD_DIMS))
    p.add_argument("--causal", nargs="+", default=["false", "true"])
    p.add_argument("--max-seq-len", type=int, default=1 << 20)
    p.add_argument("--seq-lens", nargs="+", type=int, help="other sequence lengths (batch = 16384 // N, >= 1)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--ncu", nargs=5, metavar=("IMPL", "D", "N", "CAUSAL", "PASS"))
    p.add_argument("--ops", nargs=4, metavar=("IMPL", "D", "N", "CAUSAL"))
    p.add_argument("--summarise-ncu", nargs="+", metavar="CSV", help="ncu raw-page CSVs -> --out JSON")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    if a.summarise_ncu:
        runs = [{"file": Path(f).name, "kernels": summarise_ncu_raw(Path(f).read_text())} for f in a.summarise_ncu]
        Path(a.out).write_text(json.dumps({"source": "measured", "runs": runs}, indent=1) + "\n")
        return 0
    if a.ops:
        impl, d, n, causal = a.ops
        return op_table(impl, int(d), int(n), causal == "true")
    if a.ncu:
        impl, d, n, causal, pass_name = a.ncu
        return ncu_one(impl, int(d), int(n), causal == "true", pass_name)
    command = ["python", "-m", "hbmsim.kernels.library"] + list(argv if argv is not None else sys.argv[1:])
    measure_grid(a.out, a.impl, a.head_dim, [c == "true" for c in a.causal], a.max_seq_len, a.warmup, a.repeats,
                 command, a.seq_lens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
