"""`hbmsim explain`: standard and flash attention walked through on a small example, tile by tile
(scenarios/explain.py prints it)."""
from __future__ import annotations

from dataclasses import replace

from hbmsim.simulator import HbmsimError

from ..experiment import resolve_hardware
from .common import count


def add_parser(sub) -> None:
    x = sub.add_parser("explain", help="walk through standard and flash attention on a small example, "
                       "tile by tile, with the numbers the programs compute")
    x.add_argument("--inputs", metavar="FILE", help="JSON (nested lists) or .npz with Q, K, V and optionally dO")
    x.add_argument("--random", nargs=3, type=count(1), metavar=("NQ", "NKV", "D"),
                   help="a random example of this size (values rounded to 2 decimals)")
    x.add_argument("--seed", type=count(0), default=0, help="seed of --random (default 0)")
    x.add_argument("--block-q", type=count(1), default=2, help="query block (default 2)")
    x.add_argument("--block-kv", type=count(1), default=2, help="key/value block (default 2)")
    x.add_argument("--scale", type=float, default=1.0, help="softmax scale (default 1)")
    x.add_argument("--causal", action="store_true", help="causal mask")
    x.add_argument("--dtype", default="fp32", choices=("fp16", "bf16", "fp32"), help="storage dtype (bytes only)")
    x.add_argument("--decode", action="store_true",
                   help="a decode step instead: 1 query row against 8 keys (or --random's), split over the KV "
                   "length (FA2's split-KV kernel) and combined")
    x.add_argument("--splits", type=count(1), default=2, help="splits of --decode (default 2, at most 128)")
    x.add_argument("--hopper", action="store_true",
                   help="FlashAttention-3 against FlashAttention-2 on an H100 instead: the same bytes, "
                   "the warp roles of one FA3 block and the pipes they keep busy (--hardware: a GPU with wgmma)")
    x.add_argument("--gqa", action="store_true",
                   help="FlashAttention-3's PackGQA instead: 4 query heads on 1 K/V head, a 3-token speculative step, "
                   "packed into one tile and not (--hardware: a GPU with wgmma)")
    x.add_argument("--hardware", help="preset or hardware TOML (default a100-sxm4-40gb; h100-sxm5-80gb with --hopper "
                   "and --gqa)")
    x.set_defaults(func=cmd_explain)


def cmd_explain(args) -> int:
    from .. import explain as X
    if args.hopper or args.gqa:
        from ..explain_gqa import explain_gqa
        from ..explain_hopper import HARDWARE, explain_hopper
        flag = "--hopper" if args.hopper else "--gqa"
        given = [f for f, v in (("--inputs", args.inputs), ("--random", args.random), ("--decode", args.decode),
                                ("--causal", args.causal), ("--gqa", args.hopper and args.gqa)) if v]
        if given:
            raise HbmsimError(f"explain: {flag} walks through its own example: drop {', '.join(given)}")
        gpu = resolve_hardware(args.hardware or HARDWARE)
        if not getattr(gpu, "has_wgmma", 0):
            raise HbmsimError(f"explain {flag}: {gpu.name} has no wgmma/TMA (has_wgmma = 0): FlashAttention-3 "
                              "needs a Hopper GPU such as h100-sxm5-80gb")
        print(explain_hopper(gpu) if args.hopper else explain_gqa(gpu))
        return 0
    hardware = args.hardware or "a100-sxm4-40gb"
    opts = dict(scale=args.scale, causal=args.causal, block_q=args.block_q, block_kv=args.block_kv,
                dtype=args.dtype)
    if args.inputs and args.random:
        raise HbmsimError("explain: give --inputs FILE or --random NQ NKV D, not both")
    if args.splits > 128:
        raise HbmsimError(f"explain: --splits {args.splits} is more than FA2's split-KV kernel allows (128)")
    if args.splits != 2 and not args.decode:
        raise HbmsimError("explain: --splits goes with --decode")
    if args.inputs:
        ex = X.load_example(args.inputs, **opts)
    elif args.random:
        ex = X.random_example(*args.random, args.seed, **opts)
    elif args.decode:
        ex = X.decode_example(**opts)
    else:
        ex = X.default_example(**opts)
    nq, nkv, d = ex.q.shape[0], ex.k.shape[0], ex.q.shape[1]
    if args.decode and args.block_q == 2 and nq < 2:      # the default query block, cut to a decode step's row
        ex = replace(ex, block_q=nq)
    if max(nq, nkv) > X.MAX_ROWS or d > X.MAX_HEAD_DIM:
        raise HbmsimError(f"explain: {nq} x {nkv} with head dim {d} is too big to print (at most {X.MAX_ROWS} rows "
                          f"and head dim {X.MAX_HEAD_DIM}); `hbmsim run` simulates big workloads")
    for name, value, n in (("--block-q", ex.block_q, ex.q.shape[0]), ("--block-kv", ex.block_kv, ex.k.shape[0])):
        if value > n:
            raise HbmsimError(f"explain: {name} = {value} is longer than the sequence ({n} rows)")
    if args.decode:
        print(X.explain_decode(ex, resolve_hardware(hardware), args.splits))
        return 0
    print(X.explain(ex, resolve_hardware(hardware)))
    return 0
