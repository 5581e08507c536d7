"""The fixed_chain effect: a kernel block's fixed instructions (FA2's forward: Nsight's count, once
a block) as a dependent chain, dependent_issue_cycles apart at clock_hz. The counts are read off
the shipped Nsight files; a lone block waits exactly the chain."""
import json

import pytest

from hbmsim.algorithms.flash2_spec import FA2_FWD_FIXED_INSTRUCTIONS, FA2_FWD_STEP_INSTRUCTIONS
from hbmsim.algorithms.workload import Workload
from hbmsim.scenarios.published import MEASURED_DIR
from hbmsim.scenarios.runner import run_config
from hbmsim.simulator import TimeModel

from test_alone import H100, config


def _per_warp(name: str, csv: str) -> float:
    """A warp's instructions in FA2's forward kernel of one shipped ncu run."""
    doc = json.loads((MEASURED_DIR / f"{name}.json").read_text())
    run = next(r for r in doc["runs"] if r["file"] == csv)
    k = next(k for k in run["kernels"] if "flash_fwd_kernel" in k["name"])
    return k["smsp__inst_executed.sum"] / k["launch__grid_size"] / 4        # 4 warps a block


def test_the_fixed_counts_are_nsights():
    """F + s x steps a warp: two step counts give F (the fixed part) and s."""
    one, two = _per_warp("h100-ncu-short", "ncu-fa2-64-128-forward.csv"), _per_warp("h100-ncu-short",
                                                                                      "ncu-fa2-64-256-forward.csv")
    assert (one, two) == (2201, 3883) and 2 * one - two == FA2_FWD_FIXED_INSTRUCTIONS[64] == 519
    # head dim 128: 128 x 64 tiles, 2 steps at N = 128, 64 at N = 4096
    a, b = _per_warp("h100-ncu-short", "ncu-fa2-128-128-forward.csv"), _per_warp("h100-ncu-kernels",
                                                                                   "ncu-fa2-128-forward.csv")
    s = (b - a) / 62
    assert s == 1220 and a - 2 * s == FA2_FWD_FIXED_INSTRUCTIONS[128] == 817
    # head dim 256: 64 x 64 tiles, 64 steps at N = 4096 (H200) and 66 at N = 4224 (H100, one wave)
    a, b = _per_warp("h200-ncu-pipes", "ncu-fa2-256-4096-forward.csv"), _per_warp("h100-ncu-one-wave",
                                                                                    "ncu-fa2-256-4224-k1.csv")
    s256 = (b - a) / 2
    assert s256 == 916 and a - 64 * s256 == FA2_FWD_FIXED_INSTRUCTIONS[256] == 912
    # the step parts, the warp_issue effect's counts, with the tiles they were counted at
    assert FA2_FWD_STEP_INSTRUCTIONS == {64: (128, 128, 4, two - one), 128: (128, 64, 4, s), 256: (64, 64, 4, s256)}
    # the same kernel on the H200 counts the same
    assert _per_warp("h200-ncu-short", "ncu-fa2-64-128-forward.csv") == one


@pytest.mark.parametrize("head_dim, fixed", [(64, 519), (128, 817), (32, 0)])
def test_a_lone_block_waits_its_chain(head_dim, fixed):
    """One FA2 forward block on an H100 (batch 1, one head, N = 128): with the effect its kernel
    ends fixed x 4 cycles / 1.98 GHz later (519: 1.0485 us); head dim 32 has no count: no change."""
    cfg = config(H100, Workload(1, 1, 128, 128, head_dim), ("forward",), "flash2", "fa2-kernel")
    on, off = (run_config(cfg, count_only=True, fast=False, model=m)[0] for m in (TimeModel(),
                                                                                   TimeModel().off("fixed_chain")))
    assert on["kernel_time_s"] - off["kernel_time_s"] == pytest.approx(fixed * 4 / 1.98e9, rel=1e-9, abs=1e-15)
    assert on["hbm_read_bytes"] == off["hbm_read_bytes"] and on["hbm_write_bytes"] == off["hbm_write_bytes"]


def test_decode_kernels_wait_their_chains():
    """A one-token decode split over 2 (batch 1, one head, 128 cached keys, head dim 128, H100): each
    split block ends 843 x 4 cycles later, the combine block 573 x 4 (h100-ncu-decode.json's counts)."""
    from hbmsim.scenarios.experiment import Config, Experiment, RunSpec
    from hbmsim.scenarios.runner import prepare
    cfg = Config(H100, Workload(1, 1, 1, 128, 128),
                 RunSpec("flash2", ("forward",), {"variant": "fa2-kernel", "num_splits": 2}))
    cfg = prepare(Experiment("chain", "test", H100, [cfg])).configs[0]
    on, off = (run_config(cfg, count_only=True, fast=False, model=m)[0] for m in (TimeModel(),
                                                                                   TimeModel().off("fixed_chain")))
    times = {r: [k["time_s"] for k in res["kernels"] if k["name"] in ("flash2_fwd_splitkv",
                                                                       "flash2_fwd_splitkv_combine")]
             for r, res in (("on", on), ("off", off))}
    assert len(times["on"]) == 2
    for fixed, t_on, t_off in zip((843, 573), times["on"], times["off"]):
        assert t_on - t_off == pytest.approx(fixed * 4 / 1.98e9, rel=1e-9)


def test_the_forward_s_instructions_split_by_shape_and_count():
    """warp_issue's instructions a unit of work, head dim 128 (128 x 64 tiles, 4 warps), by hand: a step's
    GEMMs 2 x 2 x 128 x 64 x 128 = 4,194,304 FLOPs, 1,024 mma.sync m16n8k16 (4,096 FLOPs each); its
    ldmatrix reads (128 + 4 x 64) x 128 x 2 + 4 x 64 x 128 x 2 = 163,840 B, 320 ldmatrix .x4 (512 B);
    the rest of Nsight's 4 x 1,220 = 4,880, 3,536, over the S call's 58,112 counted vector operations.
    Another tile (64 x 64 at head dim 128, or 3 warps) or element size has no count: ()."""
    from hbmsim.algorithms.flash2 import warp_instructions
    wl = Workload(1, 1, 4096, 4096, 128)
    count = FA2_FWD_STEP_INSTRUCTIONS[128]
    assert warp_instructions(wl, count, 128, 64, 4) == (1 / 4096, 1 / 512, 3536 / 58112)
    assert warp_instructions(wl, count, 64, 64, 4) == () and warp_instructions(wl, count, 128, 64, 3) == ()
    assert warp_instructions(wl, (), 128, 64, 4) == ()
    # the count is the fp16 and bf16 kernels' (FA2 has no fp32 kernel): an fp32 workload has none
    assert warp_instructions(Workload(1, 1, 4096, 4096, 128, dtype="bf16"), count, 128, 64, 4) != ()
    assert warp_instructions(Workload(1, 1, 4096, 4096, 128, dtype="fp32"), count, 128, 64, 4) == ()
