"""FlashAttention-3's backward main kernel, counted in its own SASS: the warp instructions of one
main-loop iteration, by kind, and a score's share (what flash3_spec.FA3_BWD_INSTRUCTIONS_PER_SCORE
holds, the fa3-kernel variant's backward issuing them as cudnn-sm90 issues its measured count).

    python scripts/fa3_bwd_sass.py [LISTING.sass[.gz] ...]     (default: the four in scripts/fa3_sass/)

The listings (scripts/fa3_sass/bwd_h{64,128}_{noncausal,causal}.sass.gz) are **compiled**, not
measured: `nvdisasm -c` (CUDA 13.5's, from the nvidia-cuda-nvdisasm wheel) of the main kernel that
nvcc 13.0 builds for sm_90a from flash-attention's hopper/ at commit 0251105a2fb19d2957484b7f023cd8c115286ced
with its pinned CUTLASS (7127592069c2fe01b041e174ba4345ef9b279671), FA3's own flags (hopper/setup.py:
-gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 --use_fast_math -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
-DCUTLASS_ENABLE_GDC_FOR_SM90 -DNDEBUG, and torch's --expt-relaxed-constexpr -D__CUDA_NO_HALF*), each
from a one-line driver that instantiates run_flash_bwd<90, D, kBlockM, kBlockN, half_t, causal, ...>
with the template arguments of flash_bwd_launch_template.h's run_mha_bwd_hdim64 (line 320) and
hdim128 (lines 351 and 353), varlen, deterministic and GQA off. FA3's released wheels use ptxas
12.8: register allocation and scheduling may differ; the FP32, MUFU, HGMMA and shared-memory
instructions are the source's.

The kernel is warp-specialised (384 threads): two MMA warpgroups (8 warps) run the consumer loop, one
iteration an m_block (kBlockM query rows against the block's kBlockN keys); a producer warp issues
the TMA loads and another writes dQ (TMA reduce-add), each unrolled 2x (two iterations a pass).
Each loop is an address range of the listing (its backward branch found by hand); in the consumers',
the retry of each of the two pipeline waits (a TRYWAIT and its branch) runs only when the first wait
fails and is left out: the fast path. A score's share: (8 x the consumer's instructions + the
producer's and the dQ writer's an iteration) / (kBlockM x kBlockN). A listing that is not one of
these is one line, exit 2.
"""
from __future__ import annotations

import collections
import gzip
import re
import sys
from dataclasses import dataclass
from pathlib import Path

DIR = Path(__file__).resolve().parent / "fa3_sass"
CONSUMER_WARPS = 8          # two MMA warpgroups (NumMmaWarpGroups = 2 for head dims 64 and 128)
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


@dataclass(frozen=True)
class Loop:
    what: str              # "consumer", "consumer, masked", "producer", "dQ writer"
    first: int             # first and last instruction's address
    last: int
    slow_path: tuple = ()  # addresses run only when a wait fails (left out)
    iterations: int = 1    # m_block iterations a pass (the producer and the dQ writer: unrolled 2x)


@dataclass(frozen=True)
class Kernel:
    head_dim: int
    causal: bool
    block_m: int           # kBlockM x kBlockN (flash_bwd_launch_template.h)
    block_n: int
    loops: tuple           # the consumer loop first


KERNELS = {
    "bwd_h64_noncausal": Kernel(64, False, 128, 128, (
        Loop("consumer", 0x011b0, 0x03df0, (0x011f0, 0x01200, 0x01570, 0x01580)),
        Loop("producer", 0x05900, 0x05f80, (), 2), Loop("dQ writer", 0x04980, 0x04e70, (), 2))),
    "bwd_h64_causal": Kernel(64, True, 128, 128, (
        Loop("consumer", 0x04cc0, 0x076c0, (0x04d00, 0x04d10, 0x04fd0, 0x04fe0)),
        Loop("consumer, masked", 0x01570, 0x04620, (0x015b0, 0x015c0, 0x01930, 0x01940)),
        Loop("producer", 0x0a420, 0x0abc0, (), 2), Loop("dQ writer", 0x093d0, 0x098c0, (), 2))),
    "bwd_h128_noncausal": Kernel(128, False, 80, 128, (
        Loop("consumer", 0x012f0, 0x032c0, (0x01340, 0x01350, 0x01780, 0x01790)),
        Loop("producer", 0x05460, 0x05c90, (), 2), Loop("dQ writer", 0x043a0, 0x04890, (), 2))),
    "bwd_h128_causal": Kernel(128, True, 64, 128, (
        Loop("consumer", 0x015e0, 0x03430, (0x01630, 0x01640, 0x01a40, 0x01a50)),
        Loop("producer", 0x07180, 0x07ad0, (), 2), Loop("dQ writer", 0x05fd0, 0x064c0, (), 2))),
}

# opcode prefixes by kind (the first that matches)
KINDS = (("HGMMA", ("HGMMA",)), ("WARPGROUP", ("WARPGROUP",)), ("MUFU", ("MUFU",)), ("FFMA", ("FFMA",)),
         ("FMUL", ("FMUL",)), ("FADD", ("FADD",)), ("FMNMX", ("FMNMX",)), ("FSEL/FSETP", ("FSEL", "FSET")),
         ("F2FP", ("F2FP", "F2F", "I2F", "F2I")), ("LDSM/STSM", ("LDSM", "STSM")), ("LDS/STS", ("LDS", "STS")),
         ("SHFL", ("SHFL",)), ("TMA/global", ("UBLK", "UTMA", "LDG", "STG", "RED", "ATOM")),
         ("barrier", ("BAR", "SYNCS", "MEMBAR", "FENCE", "DEPBAR", "ELECT", "WARPSYNC")),
         ("uniform", ("U", "R2UR", "S2UR", "S2R", "CS2R", "LDC")),
         ("integer", ("IMAD", "IADD", "VIADD", "LEA", "LOP", "ISETP", "SHF", "SEL", "PRMT", "IMNMX", "PLOP",
                      "P2R", "R2P", "VIMNMX", "IMUL", "LDL")),
         ("control", ("BRA", "BSSY", "BSYNC", "NOP", "EXIT", "YIELD")))
FP32_KINDS = ("MUFU", "FFMA", "FMUL", "FADD", "FMNMX")


def kind(opcode: str) -> str:
    return next((k for k, prefixes in KINDS if opcode.startswith(prefixes)), "other")


def read_listing(path: str | Path) -> dict:
    """{address: opcode} of an nvdisasm listing (predicates dropped)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise ValueError(f"{path}: not an nvdisasm listing ({type(err).__name__})") from None
    out = {}
    for line in text.splitlines():
        m = INSTRUCTION.match(line)
        if m:
            body = m.group(2).split()
            out[int(m.group(1), 16)] = body[1] if body[0].startswith("@") else body[0]
    if not out:
        raise ValueError(f"{path}: not an nvdisasm listing (no instructions)")
    return out


def loop_counts(listing: dict, loop: Loop) -> collections.Counter:
    """The loop's instructions by kind, an iteration (the slow path left out)."""
    c = collections.Counter(kind(op) for a, op in listing.items()
                            if loop.first <= a <= loop.last and a not in loop.slow_path)
    return collections.Counter({k: v / loop.iterations for k, v in c.items()})


def per_score(name: str, listing: dict) -> float:
    """Warp instructions a score of one backward main-loop iteration: the consumer warps' (the
    unmasked loop's), the producer's and the dQ writer's, over the kBlockM x kBlockN tile."""
    k = KERNELS[name]
    count = {loop.what: sum(loop_counts(listing, loop).values()) for loop in k.loops}
    return (CONSUMER_WARPS * count["consumer"] + count["producer"] + count["dQ writer"]) / (k.block_m * k.block_n)


def main(argv=None) -> int:
    paths = (argv if argv is not None else sys.argv[1:]) or sorted(DIR.glob("*.sass.gz"))
    for path in paths:
        name = Path(path).name.split(".")[0]
        if name not in KERNELS:
            print(f"fa3_bwd_sass: {path}: not one of the counted kernels ({', '.join(KERNELS)})", file=sys.stderr)
            return 2
        try:
            listing = read_listing(path)
        except ValueError as err:
            print(f"fa3_bwd_sass: {err}", file=sys.stderr)
            return 2
        k = KERNELS[name]
        print(f"{name}: head dim {k.head_dim}, {'causal' if k.causal else 'no mask'}, tile {k.block_m} x {k.block_n}")
        for loop in k.loops:
            c = loop_counts(listing, loop)
            fp32 = sum(c[x] for x in FP32_KINDS)
            print(f"  {loop.what:17s} [{loop.first:05x}, {loop.last:05x}] {sum(c.values()):6g} an iteration "
                  f"(FP32 {fp32:g}): " + ", ".join(f"{x} {c[x]:g}" for x, _ in KINDS if c[x]))
        print(f"  warp instructions a score: {per_score(name, listing):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
