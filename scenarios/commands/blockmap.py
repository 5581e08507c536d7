"""`hbmsim blockmap`: one workload over a grid of block_q x block_kv (scenarios/blockmap.py)."""
from __future__ import annotations

import json
import sys

from hbmsim.simulator import HbmsimError

from ..experiment import resolve_hardware
from ..outputs import write_text_atomic
from .common import check_plot_and_json, count


def add_parser(sub) -> None:
    m = sub.add_parser("blockmap", help="DRAM bytes, L2-side bytes and predicted time over block_q x block_kv")
    m.add_argument("--algorithm", default="flash2", help="a flash program (default flash2)")
    m.add_argument("--hardware", default="a100-sxm4-40gb", help="preset or hardware TOML (default a100-sxm4-40gb)")
    m.add_argument("--batch", type=count(1), default=1, help="batch (default 1)")
    m.add_argument("--heads", type=count(1), default=16, help="heads (default 16)")
    m.add_argument("--seq-len", type=count(1), default=4096, help="sequence length, queries and keys (default 4096)")
    m.add_argument("--head-dim", type=count(1), default=64, help="head dim (default 64)")
    m.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"), help="storage dtype (default fp16)")
    m.add_argument("--causal", action="store_true", help="causal mask")
    m.add_argument("--training", action="store_true", help="forward and backward (default: forward)")
    m.add_argument("--sizes", default="16,32,64,128,256", help="block sizes to try for both axes")
    m.add_argument("--plot", metavar="PNG", help="three heatmaps: DRAM bytes, L2-side bytes, predicted time")
    m.add_argument("--json", metavar="PATH", help="write every cell to PATH")
    m.add_argument("--quiet", action="store_true", help="no progress on stderr")
    m.set_defaults(func=cmd_blockmap)


def parse_sizes(text: str) -> tuple[int, ...]:
    """--sizes: whole numbers >= 1 separated by commas."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise HbmsimError(f"blockmap: --sizes = {text!r} must be whole numbers separated by commas") from None
    if not sizes or min(sizes) < 1:
        raise HbmsimError(f"blockmap: --sizes = {text!r} must be whole numbers >= 1")
    return sizes


def cmd_blockmap(args) -> int:
    from .. import blockmap
    from ..experiment import make_workload
    check_plot_and_json(args)
    sizes = parse_sizes(args.sizes)
    gpu = resolve_hardware(args.hardware)
    wl = make_workload("blockmap", {"batch": args.batch, "heads": args.heads, "seq_len": args.seq_len,
                                    "head_dim": args.head_dim, "dtype": args.dtype, "causal": args.causal})
    passes = ("forward", "backward") if args.training else ("forward",)
    cells = blockmap.block_map(gpu, wl, args.algorithm, sizes, passes, progress=not args.quiet)
    what = f"{args.algorithm} {'+'.join(passes)}, B={args.batch} H={args.heads} N={args.seq_len} d={args.head_dim}"
    print(f"{what} on {gpu.name} (predicted by hbmsim, not measured)")
    print(blockmap.table(cells))
    if args.json:
        write_text_atomic(args.json, json.dumps({"source": "predicted", "hardware": gpu.name, "workload": what,
                                                 "cells": [vars(c) for c in cells]}, indent=1) + "\n")
    if args.plot:
        print(f"wrote {blockmap.plot(cells, args.plot, f'Block sizes: {what} on {gpu.name}')}", file=sys.stderr)
    return 0
