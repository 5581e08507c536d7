"""A block grid for `hbmsim profile`: which points (block_q x block_kv x warps, over head dims,
sequence lengths and causal or not) one kernel is measured at, each point checked before
anything runs, and how a point's bytes are counted by a kernel's CPU emulation.

The grid's defaults are issue 24's: block_q and block_kv 16..128, warps 2/4/8 (for a kernel that
takes warps), head dim 64 and 128, N = 1k..16k, causal or not, fp16; batch and heads follow the
FlashAttention-2 paper's benchmark (batch x N = 16k tokens, hidden size 2048: heads = 2048 / d;
arXiv 2307.08691, section 4.1) unless given.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from hbmsim.simulator import HbmsimError

from .config import DTYPES, KernelConfig
from .profile import TC_KERNEL, RunSpec, smem_bytes
from .traits import kernel_traits

DEFAULT_BLOCKS = (16, 32, 64, 128)
DEFAULT_WARPS = (2, 4, 8)
# A kernel that takes warps gives each warp 16 query rows (mma.sync m16n8k16's M), so block_q
# = 16 has no 2-, 4- or 8-warp instantiation: its default query blocks start at 32.
DEFAULT_BLOCKS_Q_WARPS = (32, 64, 128)
DEFAULT_HEAD_DIMS = (64, 128)
DEFAULT_SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
DEFAULT_CAUSALS = (False, True)
PAPER_TOKENS = 16384          # FA2 paper, section 4.1: batch size set so that batch x seqlen = 16k
PAPER_HIDDEN = 2048           # FA2 paper, section 4.1: hidden dimension 2048, heads = 2048 / head dim
GRID_DTYPES = ("fp16", "fp32")      # the host builds the inputs as numpy fp16 / fp32 (no numpy bf16)


def takes_warps(kernel: str) -> bool:
    return kernel_traits(kernel).takes_warps


@dataclass(frozen=True)
class Grid:
    kernel: str = TC_KERNEL
    block_q: tuple = DEFAULT_BLOCKS
    block_kv: tuple = DEFAULT_BLOCKS
    warps: tuple = (None,)              # (None,): the kernel's default (the only choice without warps)
    head_dim: tuple = DEFAULT_HEAD_DIMS
    seq_len: tuple = DEFAULT_SEQ_LENS
    causal: tuple = DEFAULT_CAUSALS
    dtype: str = "fp16"
    batch: int | None = None            # None: PAPER_TOKENS // seq_len (at least 1)
    heads: int | None = None            # None: PAPER_HIDDEN // head_dim (at least 1)

    def batch_of(self, n: int) -> int:
        return self.batch if self.batch is not None else max(1, PAPER_TOKENS // n)

    def heads_of(self, d: int) -> int:
        return self.heads if self.heads is not None else max(1, PAPER_HIDDEN // d)

    def workloads(self) -> list[tuple]:
        """(head_dim, seq_len, causal) of every workload, in the order they run."""
        return list(itertools.product(self.head_dim, self.seq_len, self.causal))

    def specs(self, head_dim: int, seq_len: int, causal: bool) -> list[RunSpec]:
        """The points of one workload: every block_q x block_kv x warps."""
        return [RunSpec(self.kernel, self.batch_of(seq_len), self.heads_of(head_dim), seq_len, seq_len, head_dim,
                        self.dtype, causal, bq, bkv, warps=w)
                for bq, bkv, w in itertools.product(self.block_q, self.block_kv, self.warps)]

    def points(self) -> list[RunSpec]:
        return [s for wl in self.workloads() for s in self.specs(*wl)]

    def describe(self) -> dict:
        """The grid as given, for the measured file."""
        return {"kernel": self.kernel, "block_q": list(self.block_q), "block_kv": list(self.block_kv),
                "warps": list(self.warps), "head_dim": list(self.head_dim), "seq_len": list(self.seq_len),
                "causal": list(self.causal), "dtype": self.dtype,
                "batch": self.batch if self.batch is not None else f"{PAPER_TOKENS} // seq_len",
                "heads": self.heads if self.heads is not None else f"{PAPER_HIDDEN} // head_dim"}


def make_grid(kernel: str, block_q, block_kv, warps, head_dim, seq_len, causal, dtype: str = "fp16",
              batch: int | None = None, heads: int | None = None) -> Grid:
    """A Grid from the command's lists (None: the default), its kernel and warps checked:
    one line naming the flag for a kernel that does not take warps."""
    traits = kernel_traits(kernel)                     # an unknown kernel: one line naming the known ones
    if not traits.tiled:
        raise HbmsimError(f"profile: --kernel = {kernel!r} has no block sizes to sweep (an untiled kernel)")
    if takes_warps(kernel):
        warps = tuple(warps) if warps else DEFAULT_WARPS
    elif warps:
        raise HbmsimError(f"profile: --warps = {','.join(map(str, warps))}: kernel {kernel!r} takes no warps (one "
                          "thread per query row, block_q threads per block); leave --warps out")
    else:
        warps = (None,)
    if dtype not in GRID_DTYPES:
        raise HbmsimError(f"profile: --dtype = {dtype!r} must be one of {', '.join(GRID_DTYPES)} (the grid's inputs "
                          "are numpy arrays, and numpy has no bf16)")
    default_q = DEFAULT_BLOCKS_Q_WARPS if warps != (None,) else DEFAULT_BLOCKS
    return Grid(kernel, tuple(block_q or default_q), tuple(block_kv or DEFAULT_BLOCKS), warps,
                tuple(head_dim or DEFAULT_HEAD_DIMS), tuple(seq_len or DEFAULT_SEQ_LENS),
                tuple(DEFAULT_CAUSALS if causal is None else causal), dtype, batch, heads)


def _config_error(spec: RunSpec) -> str | None:
    """Why the kernel has no instantiation for spec (RunSpec.kernel_config), or None."""
    try:
        spec.kernel_config()
    except HbmsimError as err:
        return str(err)
    return None


def check_point(spec: RunSpec, smem_limit_bytes: int, limit_what: str) -> None:
    """One point, before anything runs: its configuration is one the kernel has
    (RunSpec.kernel_config: the tensor-core kernel's TcConfig or the teaching kernel's
    KernelConfig) and one block's shared memory fits `smem_limit_bytes`. HbmsimError in one line
    naming the point."""
    where = point_label(spec)
    why = _config_error(spec)
    if why is not None:
        raise HbmsimError(f"profile: point {where}: {why}")
    need = smem_bytes(spec)
    if need > smem_limit_bytes:
        raise HbmsimError(f"profile: point {where}: a block needs {need} bytes of shared memory, more than "
                          f"{limit_what} {smem_limit_bytes}: drop it from --block-q / --block-kv / --head-dim")


def check_grid(grid: Grid, smem_limit_bytes: int, limit_what: str) -> tuple[list[RunSpec], list[tuple]]:
    """Every point of the grid checked before anything runs: (points to run, [(point, why)] left
    out). Only a pairing is left out: a block_q x warps the kernel does not have (16 query rows per
    warp) while that block_q runs with another of the grid's warps and those warps with another
    of its block_q. Anything else (a value no point can use, a block over `smem_limit_bytes`) is
    HbmsimError in one line (check_point)."""
    points, left_out = [], []
    for spec in grid.points():
        why = _config_error(spec)
        if why is not None and spec.warps is not None and _pairing_only(grid, spec):
            left_out.append((spec, why))
            continue
        check_point(spec, smem_limit_bytes, limit_what)
        points.append(spec)
    return points, left_out


def _pairing_only(grid: Grid, spec: RunSpec) -> bool:
    other_warps = any(_config_error(replace(spec, warps=w)) is None for w in grid.warps if w != spec.warps)
    other_blocks = any(_config_error(replace(spec, block_q=b)) is None for b in grid.block_q if b != spec.block_q)
    return other_warps and other_blocks


def point_label(spec: RunSpec) -> str:
    w = f" warps={spec.warps}" if spec.warps is not None else ""
    return (f"{spec.kernel} {spec.dtype} N={spec.seq_len_q} d={spec.head_dim}{' causal' if spec.causal else ''} "
            f"{spec.block_q}x{spec.block_kv}{w}")


# ---- CPU emulation of a point (bytes only) ----

def _emulate_teaching(spec: RunSpec, q, k, v, configs) -> tuple:
    """flash_attention.cu under kernels/emulation.py: (O, {tensor: (read, write)}, smem bytes)."""
    from .emulation import emulator
    run = emulator(configs).flash_attention(q, k, v, block_q=spec.block_q, block_kv=spec.block_kv,
                                            causal=spec.causal, scale=spec.scale)
    return run.o, run.traffic, run.smem_bytes


def _emulate_tc(spec: RunSpec, q, k, v, configs) -> tuple:
    """flash_attention_tc.cu's tile schedule under kernels/emulation_tc.py (bytes in 32-byte sectors)."""
    from .emulation_tc import emulate_flash_attention_tc
    run = emulate_flash_attention_tc(q, k, v, dtype=spec.dtype, block_q=spec.block_q, block_kv=spec.block_kv,
                                     warps=spec.warps, causal=spec.causal, scale=spec.scale)
    return run.o, run.traffic, run.smem_bytes


_EMULATIONS = {"flash_attention": _emulate_teaching, TC_KERNEL: _emulate_tc}
_EMULATION_WHAT = {TC_KERNEL: "CPU emulation of kernels/flash_attention_tc.cu's tile schedule "
                              "(kernels/emulation_tc.py): each global load and store counted in the 32-byte "
                              "sectors its warp instruction touches"}


def emulation_what(kernel: str) -> str | None:
    """What the emulation of `kernel` is, for the provenance (None: emulation_provenance's own)."""
    return _EMULATION_WHAT.get(kernel)


def emulation_of(kernel: str):
    """(spec, q, k, v, configs) -> (O, traffic, smem bytes) for a kernel the CPU emulation runs:
    its traits' `emulate` when they give one, else this module's own; HbmsimError otherwise."""
    rule = getattr(kernel_traits(kernel), "emulate", None)
    if callable(rule):
        return lambda spec, q, k, v, configs: rule(spec, q, k, v)
    if kernel in _EMULATIONS:
        return _EMULATIONS[kernel]
    raise HbmsimError(f"profile --emulate: kernel {kernel!r} has no CPU emulation that profile can run "
                      f"(emulated: {', '.join(_EMULATIONS)})")


def emulation_configs(points: list[RunSpec]) -> frozenset:
    """The teaching kernel's instantiations a grid needs (one g++ build for all of them)."""
    return frozenset(KernelConfig(s.dtype, s.block_q, s.block_kv, s.head_dim) for s in points
                     if s.kernel != TC_KERNEL and s.dtype in DTYPES)
