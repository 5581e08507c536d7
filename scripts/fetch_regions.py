"""Which code each resident FA2 forward block runs, in the simulation's own schedule, against
Nsight's instruction-fetch waits: the check of a rule for the wait docs/validation.md leaves open
("FA2's short causal forwards wait for their instructions").

    python scripts/fetch_regions.py [N ...] [--head-dim D] [--unmasked]    (default: 128 256 512 1024, causal)

Each N is the Nsight run's configuration (scripts/ncu_dram_bytes.py's names: batch 16384 / N,
2048 / D heads, on the H200 at Nsight's locked clock, scripts/ncu_kernel_time.py's at_clock),
simulated whole with a trace of every compute call. A block's K/V steps are told apart by their
softmax (a call with exps); its first step runs the kernel's peeled code (the masking step under a
causal mask, the first step without), the others its loop (scripts/sass_regions.py gives both
regions' sizes). Printed per N:
- differing: the share of the time two blocks run on an SM during which they run different regions;
- cold: the share of steps whose region is not the one the last step started on the SM ran;
- Nsight's no_instruction wait (warp-cycles an issued instruction) for that run, where a shipped
  file has it (h200-ncu-short, -short-causal, -causal-long).
**Predicted** schedules against **measured** waits; nothing here changes the model.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ncu_kernel_time as nk  # noqa: E402

from hbmsim.scenarios.published import MEASURED_DIR  # noqa: E402
from hbmsim.scenarios.runner import build_program  # noqa: E402
from hbmsim.simulator import simulate  # noqa: E402

GPU = "h200-sxm-141gb"
NCU_CLOCK_HZ = 1.33e9            # Nsight's locked clock on the H200's FA2 runs (1.29-1.37 GHz)
NCU_FILES = ("h200-ncu-short", "h200-ncu-short-causal", "h200-ncu-causal-long")
NO_INSTRUCTION = "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio"
EXPS = re.compile(r"\((\d+) exp\)")


def file_name(seq_len: int, head_dim: int, causal: bool) -> str:
    return f"ncu-fa2-{head_dim}-{seq_len}-{'causal' if causal else 'false'}-forward.csv"


def step_starts(seq_len: int, head_dim: int, causal: bool) -> tuple:
    """([(time, sm, block)] of every K/V step (a compute call with exps) of the run's forward,
    {(sm, block): when its last call started})."""
    cfg = nk.config_at_clock(nk.run_of(file_name(seq_len, head_dim, causal), GPU), "fetch_regions", NCU_CLOCK_HZ)
    steps, ends = [], {}

    def trace(t, sm, kernel, block, what):
        ends[sm, block] = t
        m = EXPS.search(what)
        if what.startswith("compute") and m and int(m.group(1)) > 0:
            steps.append((t, sm, block))
    simulate(cfg.gpu, build_program(cfg, None, True), trace=trace, flush_launches=True)
    return steps, ends


def regions(steps: list, ends: dict) -> tuple:
    """(differing, cold) as the module's docstring says."""
    timed = []                                          # (start, end, sm, region)
    by_block = collections.defaultdict(list)            # (sm, block) -> [(start, region)]
    last_on_sm, cold = {}, 0
    for t, sm, b in sorted(steps):
        reg = "loop" if by_block[sm, b] else "peeled"     # a block's first step runs the peeled code
        by_block[sm, b].append((t, reg))
        cold += last_on_sm.get(sm, reg) != reg
        last_on_sm[sm] = reg
    for (sm, b), ts in by_block.items():
        for i, (t0, reg) in enumerate(ts):
            timed.append((t0, ts[i + 1][0] if i + 1 < len(ts) else ends[sm, b], sm, reg))
    # a sweep over each SM's step boundaries: how long two or more blocks run, and of that how long
    # in more than one region
    events = collections.defaultdict(list)
    for t0, t1, sm, reg in timed:
        events[sm] += [(t0, 1, reg), (t1, -1, reg)]
    both = differ = 0.0
    for evs in events.values():
        evs.sort(key=lambda e: (e[0], e[1]))
        running: collections.Counter = collections.Counter()
        prev = None
        for t, delta, reg in evs:
            if prev is not None and t > prev and sum(running.values()) >= 2:
                both += t - prev
                differ += (t - prev) if sum(1 for v in running.values() if v) > 1 else 0.0
            running[reg] += delta
            prev = t
    return (differ / both if both else 0.0), cold / len(steps)


def measured_waits() -> dict:
    out = {}
    for name in NCU_FILES:
        for r in json.loads((MEASURED_DIR / f"{name}.json").read_text())["runs"]:
            k = next((k for k in r["kernels"] if "flash_fwd" in k["name"]), None)
            if k is not None and NO_INSTRUCTION in k:
                out[r["file"]] = k[NO_INSTRUCTION]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seq_lens", nargs="*", type=int, default=[128, 256, 512, 1024])
    ap.add_argument("--head-dim", type=int, default=64, choices=(64, 128))
    ap.add_argument("--unmasked", action="store_true", help="the unmasked kernel (default: causal)")
    a = ap.parse_args(argv)
    if any(n < 1 for n in a.seq_lens):
        print("fetch_regions: every N must be >= 1", file=sys.stderr)
        return 2
    waits = measured_waits()
    causal = not a.unmasked
    print(f"FA2 forward, head dim {a.head_dim}, {'causal' if causal else 'unmasked'}, {GPU} at "
          f"{NCU_CLOCK_HZ / 1e9:.2f} GHz (predicted schedule; measured wait: Nsight)")
    for n in a.seq_lens:
        differ, cold = regions(*step_starts(n, a.head_dim, causal))
        wait = waits.get(file_name(n, a.head_dim, causal)) or waits.get(
            file_name(n, a.head_dim, causal).replace("-false-", "-"))
        shown = f"{wait:.2f}" if wait is not None else "not measured"
        print(f"  N = {n:5d}: differing {differ:.2f}, cold steps {cold:.2f}; no_instruction {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
