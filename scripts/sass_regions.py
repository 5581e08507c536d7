"""A kernel's SASS as Nsight Compute's source page gives it: its size, its loops and where its warps
waited for instructions.

    python scripts/sass_regions.py [PAGE.csv[.gz] ...]     (default: scenarios/measured/sass/*.csv.gz)

Each page is `ncu --csv --page source --print-source sass --section SourceCounters --section
WarpStateStats` around one kernel (scripts/gpu_session.py, steps ncu-causal-long and icache): a row an
instruction with its address, how many times warps executed it and the warp-state samples taken
there. Printed per page: the code's bytes (last address - first + 16: sm70 and later encode every
instruction in 16 bytes), each loop (a taken backward branch: its first and last instruction, bytes),
the warp instructions executed, and the share of the stall samples a warp spent waiting for its
next instruction to be fetched (`stall_no_inst`: Nsight's no_instruction). A file that is not such a
page is one line, exit 2.
"""
from __future__ import annotations

import csv
import gzip
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "scenarios" / "measured" / "sass"
INSTRUCTION_BYTES = 16
SAMPLES, NO_INSTRUCTION, EXECUTED = "Warp Stall Sampling (All Samples)", "stall_no_inst", "Instructions Executed"


@dataclass(frozen=True)
class Sass:
    kernel: str
    code_bytes: int
    loops: tuple              # (first byte, end byte) of each loop, offsets in the code
    warp_instructions: float
    no_instruction_share: float   # of all warp-state samples


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text.strip() else 0.0


def read_page(path: str | Path) -> Sass:
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", newline="") as f:
            rows = list(csv.reader(f))
        start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    except (OSError, StopIteration, UnicodeDecodeError, EOFError) as err:
        raise ValueError(f"{path}: not an ncu source page ({type(err).__name__})") from None
    kernel = rows[start - 1][1] if start and len(rows[start - 1]) > 1 else ""
    header = rows[start]
    col = {c: i for i, c in enumerate(header)}
    if not {SAMPLES, NO_INSTRUCTION, EXECUTED, "Source"} <= col.keys():
        raise ValueError(f"{path}: the page lacks {SAMPLES!r}, {NO_INSTRUCTION!r} or {EXECUTED!r}")
    body = [r for r in rows[start + 1:] if len(r) == len(header)]
    base = int(body[0][0], 16)
    loops = []
    for r in body:
        source = r[col["Source"]]
        if " BRA " in f" {source} " and _number(r[col[EXECUTED]]) > 0:
            target = int(source.split("BRA")[1].split()[0].strip("`()"), 16) - base
            here = int(r[0], 16) - base
            if target < here:                                  # a backward branch taken: a loop
                loops.append((target, here + INSTRUCTION_BYTES))
    samples = sum(_number(r[col[SAMPLES]]) for r in body)
    return Sass(kernel, int(body[-1][0], 16) - base + INSTRUCTION_BYTES, tuple(loops),
                sum(_number(r[col[EXECUTED]]) for r in body),
                sum(_number(r[col[NO_INSTRUCTION]]) for r in body) / samples if samples else 0.0)


def main(argv=None) -> int:
    paths = (argv if argv is not None else sys.argv[1:]) or sorted(map(str, DEFAULT_DIR.glob("*.csv.gz")))
    try:
        for p in paths:
            s = read_page(p)
            loops = ", ".join(f"{b - a:,} B at +{a:#x}" for a, b in s.loops)
            print(f"{Path(p).name}: {s.code_bytes:,} bytes of code; loops: {loops}; "
                  f"{s.warp_instructions:,.0f} warp instructions; waiting for an instruction "
                  f"{s.no_instruction_share:.1%} of the stall samples")
    except ValueError as err:
        print(f"sass_regions: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
