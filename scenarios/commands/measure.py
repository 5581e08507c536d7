"""The commands that run the real kernels: `hbmsim emulate`, `profile`, `profile-library` and
`microbench` (their bodies are in scenarios/measure.py, which checks --out before any work)."""
from __future__ import annotations

from ..measure import cmd_emulate, cmd_microbench, cmd_profile, cmd_profile_library
from .common import count


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


def add_profile(sub) -> None:
    pr = sub.add_parser("profile", help="time the CUDA kernels on this machine's GPU (and count bytes with ncu)")
    pr.add_argument("experiment", help="experiment TOML (a path or a shipped experiment's name)")
    pr.add_argument("--out", default="measured.json", help="measurement file to write (default: measured.json)")
    pr.add_argument("--warmup", type=count(0), default=3, help="untimed runs before timing (default 3)")
    pr.add_argument("--repeats", type=count(1), default=20, help="timed runs; the median is kept (default 20)")
    pr.add_argument("--no-ncu", action="store_true", help="do not run Nsight Compute even if ncu is on the PATH")
    pr.add_argument("--seed", type=count(0), default=0, help="seed of the random inputs")
    pr.set_defaults(func=cmd_profile)


def add_profile_library(sub) -> None:
    pl = sub.add_parser("profile-library", help="time PyTorch's FA2 kernels and the FA2 paper's PyTorch baseline "
                        "on this GPU, forward and backward, kernel by kernel (a measured file for validate)")
    pl.add_argument("--out", default="library.json", help="measured file to write (default: library.json)")
    pl.add_argument("--impl", nargs="+", default=["fa2", "pytorch"], help="fa2 and/or pytorch (default both)")
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
    mb.set_defaults(func=cmd_microbench)
