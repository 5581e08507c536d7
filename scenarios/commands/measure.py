"""The commands that run the real kernels: `hbmsim emulate`, `profile`, `profile-library` and
`microbench` (their bodies are in scenarios/measure.py and, for profile's block grid,
scenarios/profile_grid.py; both check --out before any work)."""
from __future__ import annotations

import argparse

from hbmsim.simulator import HbmsimError

from ..measure import cmd_emulate, cmd_microbench, cmd_profile, cmd_profile_library
from .common import Interrupted, count

GRID_FLAGS = ("kernel", "block_q", "block_kv", "warps", "head_dim", "seq_len", "causal", "batch", "heads", "emulate")


def add_parser(sub) -> None:
    add_emulate(sub)
    add_profile(sub)
    add_profile_library(sub)
    add_microbench(sub)


def add_emulate(sub) -> None:
    e = sub.add_parser("emulate", help="run the CUDA kernel's CPU emulation over an experiment: bytes per tensor")
    e.add_argument("experiment", help="experiment TOML (a path or a shipped experiment's name)")
    e.add_argument("--out", default="emulated.json", help="measurement file to write (default: emulated.json)")
    e.add_argument("--seed", type=count(0), default=0, help="seed of the random inputs")
    e.set_defaults(func=cmd_emulate)


def numbers(text: str) -> tuple[int, ...]:
    """An argparse type: whole numbers >= 1 separated by commas."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be whole numbers separated by commas") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be whole numbers >= 1")
    return tuple(dict.fromkeys(values))


def booleans(text: str) -> tuple[str, ...]:
    values = tuple(dict.fromkeys(text.split(",")))
    if not set(values) <= {"false", "true"}:
        raise argparse.ArgumentTypeError(f"{text!r} must be false, true or false,true")
    return values


def add_profile(sub) -> None:
    pr = sub.add_parser("profile", help="time the CUDA kernels on this machine's GPU (and count bytes with ncu): an "
                        "experiment's configurations, or a block grid (no experiment; --emulate: on the CPU)")
    pr.add_argument("experiment", nargs="?",
                    help="experiment TOML (a path or a shipped experiment's name); leave out to sweep a block grid")
    pr.add_argument("--out", default="measured.json", help="measurement file to write (default: measured.json)")
    pr.add_argument("--l2", choices=("cold", "warm"), default="cold",
                    help="L2 state each timed pass starts from: cold (flushed before each timed pass; ncu "
                         "--cache-control all) or warm (inputs left resident; ncu --cache-control none). Default cold")
    pr.add_argument("--warmup", type=count(0), default=3, help="untimed runs before timing (default 3)")
    pr.add_argument("--repeats", type=count(1), default=20, help="timed runs; the median is kept (default 20)")
    pr.add_argument("--no-ncu", action="store_true", help="do not run Nsight Compute even if ncu is on the PATH")
    pr.add_argument("--seed", type=count(0), default=0, help="seed of the random inputs")
    g = pr.add_argument_group("block grid (without an experiment)")
    g.add_argument("--kernel", default="flash_attention_tc",
                   help="the kernel to sweep: flash_attention_tc (the tensor-core kernel, takes warps; the default) "
                        "or flash_attention (the teaching kernel, no warps)")
    g.add_argument("--block-q", type=numbers, help="query blocks (default 16,32,64,128; 32,64,128 for a kernel "
                   "with warps: a warp takes 16 query rows)")
    g.add_argument("--block-kv", type=numbers, help="key/value blocks (default 16,32,64,128)")
    g.add_argument("--warps", type=numbers, help="warps per block, for a kernel that takes them (default 2,4,8)")
    g.add_argument("--head-dim", type=numbers, help="head dims (default 64,128)")
    g.add_argument("--seq-len", type=numbers, help="sequence lengths (default 1024,2048,4096,8192,16384)")
    g.add_argument("--causal", type=booleans, help="false, true or false,true (default false,true)")
    g.add_argument("--dtype", default="fp16", help="storage dtype (default fp16)")
    g.add_argument("--batch", type=count(1), help="batch (default 16384 // seq_len, as the FA2 paper's benchmark)")
    g.add_argument("--heads", type=count(1), help="heads (default 2048 // head_dim, as the FA2 paper's benchmark)")
    g.add_argument("--emulate", action="store_true",
                   help="count the grid's bytes with the CPU emulation instead (no GPU; no times; source emulated)")
    g.add_argument("--quiet", action="store_true", help="no progress on stderr")
    pr.set_defaults(func=cmd_profile_any)


def cmd_profile_any(args) -> int:
    """profile EXPERIMENT (scenarios/measure.py), or the block grid (scenarios/profile_grid.py)."""
    if args.experiment is not None:
        given = [f for f in GRID_FLAGS if getattr(args, f) not in (None, False, "flash_attention_tc")]
        if given:
            raise HbmsimError(f"profile: --{given[0].replace('_', '-')} sweeps a block grid: give it without an "
                              f"experiment, or leave it out to profile {args.experiment!r}")
        return cmd_profile(args)
    from .. import profile_grid as P
    grid, points, emulate, doc = P.plan(args)
    progress = P.Progress(len(points), args.quiet)
    try:
        with _sigterm():
            P.run(args, grid, points, emulate, doc, progress)
    except KeyboardInterrupt:
        progress.close()
        kept = P.keep_partial(args, doc, len(points))
        raise Interrupted(f"profile interrupted after {len(doc['runs'])} of {len(points)} point(s): {kept}") from None
    progress.close()
    print(f"wrote {args.out} ({len(doc['runs'])} point(s), source: {doc['source']})")
    return 0


def _sigterm():
    from ..signals import sigterm_as_interrupt
    return sigterm_as_interrupt()


def add_profile_library(sub) -> None:
    pl = sub.add_parser("profile-library", help="time PyTorch's FA2 kernels and the FA2 paper's PyTorch baseline "
                        "(on Hopper also torch's cuDNN attention and FlashAttention-3) on this GPU, forward and "
                        "backward, kernel by kernel (a measured file for validate)")
    pl.add_argument("--out", default="library.json", help="measured file to write (default: library.json)")
    pl.add_argument("--impl", nargs="+", default=["fa2", "pytorch"],
                    help="of fa2, pytorch, cudnn and fa3 (the last two: Hopper only; default fa2 pytorch)")
    pl.add_argument("--head-dim", nargs="+", type=count(1), default=[64, 128], help="64 and/or 128 (default both)")
    pl.add_argument("--causal", nargs="+", choices=("false", "true"), default=["false", "true"],
                    help="without and/or with the causal mask (default both)")
    pl.add_argument("--max-seq-len", type=count(1), default=16384, help="skip the grid's longer sequences")
    pl.add_argument("--warmup", type=count(0), default=3, help="untimed runs before timing (default 3)")
    pl.add_argument("--repeats", type=count(1), default=30, help="timed runs; the mean is kept (default 30)")
    pl.add_argument("--decode", action="store_true", help="instead: decode (1 query row, 32/8 heads, KV 1k-128k, "
                    "batch 1-64), torch SDPA with enable_gqa, and flash-attn's kvcache kernel when it imports")
    pl.set_defaults(func=cmd_profile_library)


def add_microbench(sub) -> None:
    mb = sub.add_parser("microbench", help="measure mma.sync, exp2 (SFU) and DRAM rates, and the host's launch "
                        "and dispatch times, on this GPU")
    mb.add_argument("--out", default="microbench.json", help="file to write (default: microbench.json)")
    mb.add_argument("--repeats", type=count(1), default=10, help="timed launches; the median is kept (default 10)")
    mb.add_argument("--host", action="store_true", help="only the host's launch, gap, queue and PyTorch dispatch "
                    "times (the HostSpec fields; seconds, not minutes)")
    mb.add_argument("--latency", action="store_true", help="only the load-to-use latencies of an L2 hit and a DRAM "
                    "access (a pointer chase: the presets' l2_hit_latency_s and hbm_latency_s)")
    mb.set_defaults(func=cmd_microbench)
