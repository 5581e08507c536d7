"""Fast mode: steady-state folding (simulator/fold.py) and several tiles per simulated step
(algorithms/common.tiles_per_step). A folded run's L2-side bytes and FLOPs equal the full run's
and the closed forms exactly; its predicted time is within 1% of the full simulation; a launch
of identical lock-step waves folds with no error at all (worked by hand)."""
import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hbmsim.algorithms.common as common
from hbmsim.algorithms.flash2_spec import SPEC, Flash2Blocks
from hbmsim.algorithms.flash2_backward import flash2_training
from hbmsim.algorithms.reference import attention_backward, attention_forward
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.scenarios.cli import main
from hbmsim.scenarios.experiment import HARDWARE_DIR, Config, RunSpec
from hbmsim.scenarios.runner import resolve_mapping, run_config
from hbmsim.simulator import HbmsimError, Launch, Program, Tensor, load_gpu, simulate
from hbmsim.simulator import fold
from hbmsim.simulator.fold import fold_unit_blocks
from hbmsim.simulator.timeline import Timeline

from conftest import tiny_gpu
from test_fuzz import closed_form, configs, counted, hard_limit, nonzero


# ---- a launch worked by hand ---------------------------------------------------------------------

def waves_program(grid: int, period: int = 1) -> tuple[Program, Tensor]:
    """`grid` blocks, each loading its own 1000-byte row of X and computing 3e6 tensor FLOPs."""
    X = Tensor("X", (1, grid, 500), "fp16")

    def block(ctx, b):
        yield from ctx.load(X[0], slice(b, b + 1), slice(0, 500))
        yield from ctx.compute(matmul_flops=3_000_000)

    return Program("waves", [Launch("k", grid, 0, block, period=period)], inputs=(X,)), X


def test_lock_step_waves_fold_exactly():
    # 4 SMs x 1 slot = 4 blocks a wave. A wave: 4 loads of 1000 B share 1e11 B/s (40 ns) plus
    # 100 ns of latency, then 3e6 FLOPs at 1e12 FLOP/s per SM (3 us): 3.14 us; 10 waves: 31.4 us.
    gpu = tiny_gpu(max_blocks_per_sm=1)
    full = simulate(gpu, waves_program(40)[0])
    assert full.time_s == pytest.approx(10 * 3.14e-6, rel=1e-12)
    # Folded: unit = lcm(1, 4) = 4 blocks. Unit 0 warms up, units 1-3 measure (3.14 us each, equal),
    # unit 4 confirms (units 2-4 equal too), so at unit 5 (block 20) it skips (40 - 20) // 4 - 1 =
    # 4 units = 16 blocks and simulates the last 4: 6 units simulated, 4 x 3.14 us extrapolated.
    fold = simulate(gpu, waves_program(40)[0], fold=True)
    k = fold.kernels[0]
    assert k.folded_blocks == 16 and k.folded_s == pytest.approx(4 * 3.14e-6, rel=1e-12)
    assert fold.time_s == pytest.approx(full.time_s, rel=1e-12)
    d, f = fold.to_dict(), full.to_dict()
    assert d["simulated_fraction"] == 0.6 and f["simulated_fraction"] == 1.0
    # every counter: 40 rows of 1000 B from DRAM, 40 x 3e6 FLOPs
    assert d["tensors"]["X"] == {"read": 40_000, "write": 0, "hbm_read": 40_000, "hbm_write": 0}
    assert d["matmul_flops"] == 120_000_000
    for key in ("hbm_read_bytes", "global_read_bytes", "matmul_flops", "hbm_busy_s", "compute_busy_s"):
        assert d[key] == pytest.approx(f[key], rel=1e-12), key


def test_the_audit_notes_the_rule_and_skips_nothing(monkeypatch):
    # scripts/fold_audit.py: with fold.AUDIT a list, the lock-step launch above runs whole and notes
    # that the rule would skip 16 blocks at unit 5, extrapolating them exactly (4 x 3.14 us)
    gpu = tiny_gpu(max_blocks_per_sm=1)
    monkeypatch.setattr(fold, "AUDIT", [])
    res = simulate(gpu, waves_program(40)[0], fold=True)
    assert res.kernels[0].folded_blocks == 0 and res.time_s == pytest.approx(10 * 3.14e-6, rel=1e-12)
    (entry,) = fold.AUDIT
    assert entry["would_skip_blocks"] == 16 and entry["units"] == 10 and entry["unit_blocks"] == 4
    assert entry["error_s"] == pytest.approx(0.0, abs=1e-18)
    assert entry["kernel_s"] == pytest.approx(10 * 3.14e-6, rel=1e-12)


def test_a_launch_whose_stores_outrun_dram_is_not_folded():
    # Each block stores 100 kB (it does not wait for it) and computes 3 us; a wave of 4 stores 400 kB,
    # 4 us at 1e11 B/s. Every unit takes the same 3 us, but DRAM's queue grows by 1 us of bytes a
    # wave: the blocks run ahead of their stores, and the kernel ends when DRAM has drained all
    # 40 x 100 kB (40 us) plus the latency. Extrapolating the 3 us units would skip stores DRAM
    # never served (without the queue check it folds 16 blocks and ends at 36.1 us, 10% early):
    # it is not folded.
    gpu = tiny_gpu(max_blocks_per_sm=1)
    Y = Tensor("Y", (1, 40, 50_000), "fp16")

    def block(ctx, b):
        yield from ctx.store(Y[0], slice(b, b + 1), slice(0, 50_000), np.zeros((1, 50_000)))
        yield from ctx.compute(matmul_flops=3_000_000)

    program = Program("stores", [Launch("k", 40, 0, block, period=1)], outputs={"Y": Y})
    full, fold = simulate(gpu, program), simulate(gpu, program, fold=True)
    assert full.time_s == pytest.approx(40e-6 + 1e-7, rel=1e-9)
    assert fold.kernels[0].folded_blocks == 0 and fold.time_s == full.time_s


def test_what_is_never_folded():
    gpu = tiny_gpu(max_blocks_per_sm=1)
    # no period declared
    assert simulate(gpu, waves_program(40, period=0)[0], fold=True).kernels[0].folded_blocks == 0
    # too short: fewer than 7 units (warm-up, 3 measured, 1 confirming, one skipped, the tail)
    assert fold_unit_blocks(1, 4, 27) == 0 and fold_unit_blocks(1, 4, 28) == 4
    # period 3, waves of 4: whole waves (lcm = 12 blocks) when 24 such units fit, else the smallest
    # multiple of the period spanning a wave (6 blocks) when 6 fit, else nothing
    assert fold_unit_blocks(3, 4, 288) == 12 and fold_unit_blocks(3, 4, 287) == 6
    assert fold_unit_blocks(3, 4, 42) == 6 and fold_unit_blocks(3, 4, 41) == 0
    # whoever watches every step (trace, listener, timeline) sees every block
    for watch in ({"trace": lambda *a: None}, {"listener": lambda *a: None}, {"recorder": Timeline()}):
        assert simulate(gpu, waves_program(40)[0], fold=True, **watch).kernels[0].folded_blocks == 0


# ---- flash2 on a machine cut to 16 SMs: fast against full ---------------------------------------------

def part_of(preset: str, sms: int = 16):
    """A preset cut to `sms` SMs with its L2 and bandwidths cut alike (a small machine, so that
    the full simulation the fold is compared with runs in a second)."""
    g = load_gpu(HARDWARE_DIR / f"{preset}.toml")
    f = sms / g.sm_count
    return g.with_sms(sms).with_overrides({"l2_bytes": int(g.l2_bytes * f), "hbm_bytes_per_s": g.hbm_bytes_per_s * f,
                                           "l2_bytes_per_s": g.l2_bytes_per_s * f}, "test")


def flash2_config(gpu, wl: Workload, passes: tuple) -> Config:
    cfg = Config(gpu, wl, RunSpec("flash2", passes, {}))
    return dataclasses.replace(cfg, mapping=resolve_mapping(cfg)[0])


# (preset, workload fields, passes, whether it must fold). The causal backward's units alternate
# 35 and 52 us, and their pairs wander by about 0.2%: two windows in a row never agree within
# 0.1%, so it is simulated whole (a single agreement, by chance, used to fold it). The H100 forward's
# units (warp_issue: each block's chain against the SM's issue) settle after about 29 of its 32 waves
# at batch 4, 14 of 64 at batch 8.
CASES = {
    "h100-fwd": ("h100-sxm5-80gb", dict(head_dim=128, dtype="bf16", batch=8), ("forward",), True),
    "a100-fwd+bwd": ("a100-sxm4-40gb", dict(head_dim=64, dtype="fp16"), ("forward", "backward"), True),
    "a100-causal-fwd+bwd": ("a100-sxm4-40gb", dict(head_dim=64, dtype="fp16", causal=True), ("forward", "backward"),
                            False),
}


def compare(cfg: Config, must_fold: bool) -> None:
    full = run_config(cfg, count_only=True)
    fast = run_config(cfg, count_only=True, fast=True)
    assert [r["fast"] for r in fast] == [True] * len(fast) and not full[0]["fast"]
    for a, s in zip(full, fast):
        assert s["pass"] == a["pass"]
        # exact: every tensor's L2-side bytes (the closed forms) and every FLOP, exp and SRAM read
        assert counted(s) == counted(a) == nonzero(closed_form(cfg, s, s["pass"]))
        for key in ("matmul_flops", "vector_flops", "exp_ops"):
            assert s[key] == a[key], key
        assert [k["sram_read_bytes"] for k in s["kernels"]] == [k["sram_read_bytes"] for k in a["kernels"]]
        # predicted time within 1% of the full simulation
        assert s["time_s"] == pytest.approx(a["time_s"], rel=0.01), s["pass"]
        assert a["simulated_fraction"] == 1.0
    if must_fold:
        assert fast[-1]["simulated_fraction"] < 0.9


@pytest.mark.parametrize("case", CASES)
def test_folded_flash2_is_within_1_percent_with_exact_counts(case):
    preset, wl_fields, passes, must_fold = CASES[case]
    wl = Workload(**{"batch": 4, "heads": 16, "seq_len_q": 2048, "seq_len_kv": 2048, **wl_fields})
    compare(flash2_config(part_of(preset), wl, passes), must_fold=must_fold)


@pytest.mark.parametrize("preset", ["h100-sxm5-80gb", "a100-sxm4-40gb"])
def test_several_tiles_a_step_are_within_1_percent_with_exact_counts(monkeypatch, preset):
    # N = 16384: 256 K/V tiles of 64 (forward) and 256 query tiles of 64 (backward); with the
    # threshold lowered to 128 tiles, 2 tiles a step and fast mode's 128 steps a block
    monkeypatch.setattr(common, "COARSE_ABOVE_TILES", 128)
    assert common.tiles_per_step(256) == 2
    wl = Workload(batch=1, heads=2, seq_len_q=16384, seq_len_kv=16384, head_dim=128, dtype="bf16")
    compare(flash2_config(part_of(preset), wl, ("forward", "backward")), must_fold=False)


def test_several_tiles_a_step_under_a_causal_mask_keep_the_l2_lines_of_single_tiles(monkeypatch):
    """Under a causal mask each block's loop sets its own step, so neighbouring blocks' coarse
    steps cover different tiles (a block of 5 K/V tiles: [0, 3) and [3, 5); of 4: [0, 3) and
    [3, 4)). The L2 keeps a step's tiles as the lines of single tiles (tensor.L2Lines): with an L2
    that holds everything, 3 tiles a step read every tile from DRAM once, as a step per tile does.
    (One line a step made the L2 miss what other blocks had loaded: at N = 32768 on H100, head dim
    128, the forward's DRAM bytes 2.2x and the backward's 1.17x a step per tile.)
    Batch 1, 2 heads, N = 256, head dim 16, fp16, tiles of 16 x 16: Q, K and V are 2 x 256 x 16 x 2
    B = 16,384 B each, and the forward reads each once."""
    monkeypatch.setattr(common, "COARSE_ABOVE_TILES", 2)       # every loop of 3 tiles or more coarsens
    monkeypatch.setattr(common, "STEPS_PER_BLOCK", 1)
    wl = Workload(batch=1, heads=2, seq_len_q=256, seq_len_kv=256, head_dim=16, causal=True)
    gpu = tiny_gpu(l2_bytes=10**8, l2_bytes_per_s=1e12)
    dram, events = {}, {}
    for step in (1, 3):
        res = simulate(gpu, flash2_training(wl, 16, 16, None, tiles_per_step=(step, step)))
        dram[step] = {p: {n: (t.hbm_read, t.hbm_write) for n, t in res.tensors(p).items()}
                      for p in ("forward", "backward")}
        events[step] = res.sim_events
    assert dram[3] == dram[1]
    assert {n: dram[3]["forward"][n][0] for n in "QKV"} == {"Q": 16384, "K": 16384, "V": 16384}
    assert events[3] < 0.8 * events[1]                         # the steps were coarse


@pytest.mark.parametrize("program", ["flash2", "flash3"])
def test_long_causal_loops_are_within_1_percent_with_exact_counts(monkeypatch, program):
    """A long causal launch (common.long_causal; its thresholds lowered from 512 tiles to 64 and from
    8192 blocks, 31 waves of an H100's 264 slots, to 1024, 32 waves of this machine's 32): every
    block in 32 steps, K and V kept as the L2's prefix lines. Against the full simulation (a step
    per tile) on an H100 cut to 16 SMs, N = 16384 (the longest loops: flash2's 256 K/V tiles of
    64, flash3's 128 of 128), batch 1, 8 heads, head dim 128, causal (32 and 64 waves): the time
    within 1%, every L2-side byte, FLOP, exp and SRAM read exact (the closed forms), and the steps
    coarse. DRAM reads: within 25% (a head's K and V, 8 MB, exceed this machine's 6 MB L2, and
    which tiles it keeps then depends on the steps: docs/speed.md, "Long causal contexts")."""
    monkeypatch.setattr(common, "LONG_CAUSAL_TILES", 64)
    monkeypatch.setattr(common, "LONG_CAUSAL_MIN_BLOCKS", 1024)
    wl = Workload(batch=1, heads=8, seq_len_q=16384, seq_len_kv=16384, head_dim=128, dtype="bf16", causal=True)
    cfg = Config(part_of("h100-sxm5-80gb"), wl, RunSpec(program, ("forward",), {}))
    cfg = dataclasses.replace(cfg, mapping=resolve_mapping(cfg)[0])
    assert common.long_causal(wl, cfg.mapping.block_q, cfg.mapping.block_kv)
    full = run_config(cfg, count_only=True)[0]
    fast = run_config(cfg, count_only=True, fast=True)[0]
    assert counted(fast) == counted(full) == nonzero(closed_form(cfg, fast, "forward"))
    for key in ("matmul_flops", "vector_flops", "exp_ops"):
        assert fast[key] == full[key], key
    assert [k["sram_read_bytes"] for k in fast["kernels"]] == [k["sram_read_bytes"] for k in full["kernels"]]
    assert fast["time_s"] == pytest.approx(full["time_s"], rel=0.01)
    assert fast["hbm_read_bytes"] == pytest.approx(full["hbm_read_bytes"], rel=0.25)
    assert fast["sim_events"] < 0.7 * full["sim_events"]


def test_tiles_per_step_rule():
    assert common.tiles_per_step(256) == 1              # at most COARSE_ABOVE_TILES: a step a tile
    assert common.tiles_per_step(257) == 2               # then at least STEPS_PER_BLOCK steps
    assert common.tiles_per_step(2048) == 16             # N = 131072 at 64-wide tiles: 128 steps
    # a causal forward's longest loop of more than LONG_CAUSAL_TILES tiles: 32 steps (fwd_tiles_per_step)
    wl = Workload(batch=1, heads=1, seq_len_q=131072, seq_len_kv=131072, head_dim=128, causal=True)
    wl = dataclasses.replace(wl, heads=8)                # 8 x 1024 blocks of 128 rows
    assert common.fwd_tiles_per_step(wl, 128, 64) == 64 and common.long_causal(wl, 128, 64)
    assert common.fwd_tiles_per_step(dataclasses.replace(wl, causal=False), 128, 64) == 16
    short = dataclasses.replace(wl, seq_len_q=32768, seq_len_kv=32768, heads=8)      # 512 tiles: the rules above
    assert common.fwd_tiles_per_step(short, 128, 64) == 4 and not common.long_causal(short, 128, 64)
    few = dataclasses.replace(wl, heads=4)               # 4096 blocks: too few
    assert common.fwd_tiles_per_step(few, 128, 64) == 16 and not common.long_causal(few, 128, 64)


# ---- the command line ------------------------------------------------------------------------------

SMALL_H100 = """name = "fold"
hardware = "h100-sxm5-80gb"

[hardware_overrides]
sm_count = 16
l2_bytes = 6_000_000

[workload]
batch = 4
heads = 16
seq_len = 2048
head_dim = 128
dtype = "bf16"

[[runs]]
algorithm = "flash2"
"""


def test_run_is_fast_when_count_only_unless_full(tmp_path, capsys):
    exp = tmp_path / "fold.toml"
    exp.write_text(SMALL_H100)
    results = {}
    for flag in ("", "--full"):
        out_json = tmp_path / f"r{flag}.json"
        argv = ["run", str(exp), "--count-only", "--json", str(out_json), "--quiet"] + ([flag] if flag else [])
        assert main(argv) == 0
        out, _ = capsys.readouterr()
        results[flag] = json.loads(out_json.read_text())["runs"][0]
        # the table says what was folded, only when something was
        assert ("fast mode: 1 of 1 results simulated" in out) == (flag == "")
    fast, full = results[""], results["--full"]
    assert fast["fast"] and not full["fast"]
    assert fast["simulated_fraction"] < 1.0 == full["simulated_fraction"]
    assert sum(k["folded_blocks"] for k in fast["kernels"]) > 0
    assert fast["tensors"]["K"]["read"] == full["tensors"]["K"]["read"]
    assert fast["time_s"] == pytest.approx(full["time_s"], rel=0.01)


# ---- several tiles a step, with data: exact numerics and counts ---------------------------------------

@settings(max_examples=30, deadline=None)
@given(st.fixed_dictionaries({
    "batch": st.integers(1, 2), "heads": st.integers(1, 2), "seq_len_q": st.integers(1, 40),
    "seq_len_kv": st.integers(1, 40), "head_dim": st.integers(1, 8), "dtype": st.sampled_from(["fp16", "fp32"]),
    "causal": st.booleans(), "key_padding_mask": st.booleans(), "dropout": st.sampled_from([0.0, 0.3])}),
    st.integers(1, 9), st.integers(1, 9), st.integers(2, 5), st.integers(2, 5), st.integers(0, 2**31 - 1))
def test_several_tiles_a_step_keep_numerics_and_counts(fields, bq, bkv, kv_step, q_step, seed):
    """The forward with kv_step K/V tiles a step and the backward with q_step query tiles a step
    (any mask, ragged last tiles) give the float64 reference's O, dQ, dK, dV to 1e-12, and the
    closed forms' bytes, which are written for one tile a step."""
    wl = Workload(**fields)
    data = random_data(wl, seed)
    prog = flash2_training(wl, bq, bkv, data, tiles_per_step=(kv_step, q_step))
    res = simulate(tiny_gpu(), prog)
    o_ref, _ = attention_forward(wl, data)
    grads = attention_backward(wl, data, data.d_o)
    np.testing.assert_allclose(res.outputs["O"].reshape(o_ref.shape), o_ref, rtol=0, atol=1e-12)
    for name in ("dQ", "dK", "dV"):
        np.testing.assert_allclose(res.outputs[name].reshape(grads[name].shape), grads[name], rtol=0, atol=1e-12)
    mapping = Flash2Blocks(block_q=bq, block_kv=bkv, block_q_bwd=bq, block_kv_bwd=bkv)
    for pass_name in ("forward", "backward"):
        got = {n: (t.read, t.write) for n, t in res.tensors(pass_name).items() if (t.read, t.write) != (0, 0)}
        want = {n: tuple(rw) for n, rw in SPEC.io(wl, mapping, pass_name).items() if tuple(rw) != (0, 0)}
        assert got == want, pass_name


# ---- random configurations in fast mode ------------------------------------------------------------

@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(configs(), st.integers(1, 4), st.integers(4, 12), st.integers(4, 12))
def test_random_configs_in_fast_mode_finish_with_closed_form_counts(cfg, sms, batch, heads):
    """The fuzz test's configurations (any program, mask, mapping and rates) on a GPU cut to 1-4
    SMs of one block slot each and at most 64 KiB of L2, with 16-144 batch-heads, so that launches fold, with several
    tiles a step from 3 tiles on: they finish, with finite times and L2-side bytes equal to the
    closed forms."""
    gpu = cfg.gpu.with_sms(sms)
    gpu = gpu.with_overrides({"max_blocks_per_sm": 1, "l2_bytes": min(gpu.l2_bytes, 65536)}, "fuzz")
    wl = dataclasses.replace(cfg.workload, batch=batch, heads=heads, kv_heads=None)
    cfg = dataclasses.replace(cfg, gpu=gpu, workload=wl)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "COARSE_ABOVE_TILES", 2)
        mp.setattr(common, "STEPS_PER_BLOCK", 1)
        try:
            with hard_limit():
                results = run_config(cfg, count_only=True, fast=True)
        except HbmsimError as err:
            msg = str(err)
            assert "\n" not in msg and ("SRAM" in msg or "HBM" in msg or "too long" in msg), msg
            return
    for r in results:
        assert r["fast"] and 0 < r["simulated_fraction"] <= 1
        assert counted(r) == nonzero(closed_form(cfg, r, r["pass"])), r["pass"]
        assert math.isfinite(r["time_s"]) and r["time_s"] > 0


def test_the_fa1_kernel_in_fast_mode_is_within_1_percent_with_exact_counts():
    """The FA1 kernel (fa1-kernel) in fast mode: its key-parallel backward, every block alike
    without a mask, folds; its 16-row steps are simulated one by one; its counts stay exact."""
    wl = Workload(batch=4, heads=16, seq_len_q=1024, seq_len_kv=1024, head_dim=64)
    cfg = Config(part_of("a100-sxm4-40gb"), wl, RunSpec("flash1", ("forward", "backward"),
                                                          {"variant": "fa1-kernel", "num_splits": 1,
                                                           "bwd_parallel": True}))
    cfg = dataclasses.replace(cfg, mapping=resolve_mapping(cfg)[0])
    compare(cfg, must_fold=False)
    kernels = run_config(cfg, count_only=True, fast=True)[1]["kernels"]
    (bwd,) = [k for k in kernels if k["name"] == "fa1_bwd_seqparallel"]
    assert 0 < bwd["folded_blocks"] < bwd["grid"]


def test_the_audit_script_refuses_what_it_cannot_run_in_one_line(capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "scripts" / "fold_audit.py"
    spec = importlib.util.spec_from_file_location("fold_audit", path)
    audit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(audit)
    assert audit.main(["--only", "no-such-thing"]) == 2
    assert capsys.readouterr().err.strip() == ("fold_audit: validate: no run left to simulate "
                                               "(check --only and --max-seq-len)")
    for bad in (["--workers", "0"], ["--max-seq-len", "-3"]):
        with pytest.raises(SystemExit) as stop:
            audit.main(bad)
        assert stop.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err
