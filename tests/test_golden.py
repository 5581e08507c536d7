"""Golden output, as SimPy's own examples have: the full trace of the worked 4 x 4 example through
flash2 on the A100 preset (2 x 2 blocks, fp32) must stay exactly as recorded in
tests/golden/seed_flash2_a100.txt. Checked by hand: each Q/K/V tile is 2 rows x 4 fp32 = 32 B.
The two query blocks run side by side on SM0 and SM1; whichever asks for a K/V tile first gets it
from HBM (after the preset's 330.7 ns latency, plus 96 B at the STREAM rate 1.36 TB/s: 330.771 ns),
the other hits in L2. The first compute step (time_model.py) is the tensor phase, 64 B of SRAM
reads at 180.48 GB/s = 0.355 ns (the 32 FLOPs take 0.011 ns under it), then the softmax, 34 FP32
operations at 19.5e12 / 2 / 108 = 90.3e9 per second = 0.377 ns (its 6 exps on the SFU, 16 x 1.41e9
per second, take 0.266 ns beside them): 0.731 ns, so SM1 moves on at 331.502 ns. So HBM reads are
Q 64 + K 64 + V 64 = 192 B, L2-side reads Q 64 + K 128 + V 128 = 320 B, and O (2 x 32 B) and lse
(2 x 8 B) reach HBM at the end-of-program write-back: 80 B. Regenerate after an intended model
change with HBMSIM_REGEN_GOLDEN=1 and review the diff.
"""
import os
from pathlib import Path

from hbmsim.algorithms.flash2 import flash2_forward
from hbmsim.simulator import simulate

from conftest import seed_case

GOLDEN = Path(__file__).parent / "golden" / "seed_flash2_a100.txt"


def trace_lines(gpu):
    lines = []
    wl, data = seed_case()
    r = simulate(gpu, flash2_forward(wl, 2, 2, data),
                 trace=lambda t, sm, k, b, what: lines.append(f"{t * 1e9:9.3f} ns  SM{sm} {k} block {b}: {what}"))
    lines.append(f"end {r.time_s * 1e9:.3f} ns = {r.cycles} cycles; HBM read {r.total('hbm_read')} B, "
                 f"written {r.total('hbm_write')} B; L2-side read {r.total('read')} B")
    return lines


def test_seed_flash2_trace_matches_golden(a100):
    lines = trace_lines(a100)
    if os.environ.get("HBMSIM_REGEN_GOLDEN"):
        GOLDEN.write_text("\n".join(lines) + "\n")
    assert lines == GOLDEN.read_text().splitlines()
    assert lines[-1].endswith("HBM read 192 B, written 80 B; L2-side read 320 B")
    assert lines[0].startswith("    0.000 ns") and "330.771 ns" in lines[4]     # one HBM latency
    assert lines[8].startswith("  331.502 ns  SM1")                              # one compute step
