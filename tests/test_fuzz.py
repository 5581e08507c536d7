"""Fuzz: random small configurations through every program, pass set and mask mode, on the two
hardware presets with rates overridden across 32 orders of magnitude.

Every valid run must finish (a hard wall-clock limit per run turns a hang into a failure), its
per-tensor read/write bytes must equal the closed forms of algorithms/io_formulas.py for every
pass, its times must be finite, positive and no shorter than its HBM (and compute) traffic at
full rate, and its event count must stay linear in the work issued (the HBM pool's wake-ups at
most two per request). An invalid one (a block larger than SRAM, a footprint larger than HBM)
must be one HbmsimError of one line naming SRAM or HBM.

Also the two configurations that used to hang at 100% CPU (float time arithmetic in the HBM
pool): flash1 with a key-padding mask on the H100 preset, and extreme but finite rates.
"""
import contextlib
import math
import signal

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings, strategies as st

from hbmsim.algorithms.workload import Workload
from hbmsim.scenarios import runner
from hbmsim.scenarios.experiment import Config, RunSpec, preset_names, resolve_hardware
from hbmsim.simulator.time_model import TimeModel, hbm_rate
from hbmsim.simulator import HbmsimError, Machine

PRESETS = {name: resolve_hardware(name) for name in preset_names()}
RATE_FIELDS = ("hbm_bytes_per_s", "l2_bytes_per_s", "matmul_flops_per_s", "vector_flops_per_s",
               "sram_bytes_per_s_per_sm")
LIMIT_S = 20           # wall-clock seconds one simulation may take before it counts as a hang
MAX_BLOCKS = 16        # blocks (tiles) per sequence dimension, so every example stays small


class Hang(Exception):
    pass


@contextlib.contextmanager
def hard_limit(seconds: float = LIMIT_S):
    """Fail (raise Hang) instead of hanging: SIGALRM after `seconds` of wall time."""
    def on_alarm(signum, frame):
        raise Hang(f"simulation still running after {seconds} s: a hang")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Observed:
    """run_config with the Machine kept (for the HBM pool's counters) and every tile transfer
    and compute call counted (through the trace hook)."""

    def __init__(self):
        self.machine = None
        self.calls = 0

    def trace(self, *args):
        self.calls += 1

    def run(self, cfg: Config, count_only: bool) -> list:
        def simulate(gpu, program, trace=None, *args, **kwargs):
            self.machine = Machine(gpu, trace)
            return self.machine.run(program)
        real = runner.simulate
        runner.simulate = simulate
        try:
            with hard_limit():
                return runner.run_config(cfg, count_only=count_only, trace=self.trace)
        finally:
            runner.simulate = real


# ---- the closed forms ----------------------------------------------------------------------------

def closed_form(cfg: Config, r: dict, pass_name: str) -> dict:
    """The program's closed forms (through the registry) for the mapping the run reports."""
    wl, spec = cfg.workload, cfg.run.spec
    mp = spec.mapping_type(**{f: r[f] for f in spec.mapping_fields})
    if pass_name != "forward+backward":
        return spec.io(wl, mp, pass_name)
    total = dict(spec.io(wl, mp, "forward"))
    for name, (rd, wr) in spec.io(wl, mp, "backward").items():
        r0, w0 = total.get(name, (0, 0))
        total[name] = (r0 + rd, w0 + wr)
    return total


def nonzero(io: dict) -> dict:
    # The end-of-program L2 write-back adds entries with DRAM bytes only (read = write = 0).
    return {name: tuple(rw) for name, rw in io.items() if tuple(rw) != (0, 0)}


def counted(r: dict) -> dict:
    return nonzero({name: (t["read"], t["write"]) for name, t in r["tensors"].items()})


def check_run(cfg: Config, results: list, obs: Observed, count_only: bool) -> None:
    gpu, passes = cfg.gpu, cfg.run.passes
    clock_ulp = math.ulp(obs.machine.env.now)
    expected_passes = list(passes) + (["forward+backward"] if len(passes) == 2 else [])
    assert [r["pass"] for r in results] == expected_passes
    for r in results:
        # (b) per-tensor bytes equal the closed forms
        assert counted(r) == nonzero(closed_form(cfg, r, r["pass"])), r["pass"]
        # (c) finite positive times, none shorter than its own traffic at full rate
        t = r["time_s"]
        assert math.isfinite(t) and t > 0, (r["pass"], t)
        # Simulated time is one absolute float clock: a duration is exact only to a few units in
        # the last place of the clock (a 1e-14 s kernel that starts at 1e5 s lasts 0 s), and one
        # built of many transfers, each started on the rounded clock, to one unit per event (a
        # 23,000 s GEMM at 1 B/s of DRAM, its clock near 5e12 s, came 4.4 units short of its
        # bytes' time), so each kernel gets that much slack on top of a relative 1e-9. With an L2 this holds
        # because a kernel ends only when the write-backs it caused have drained (see
        # test_reported_time_covers_l2_write_backs).
        # (vector work is at most as fast as the FP32 peak, or as the schedulers issue instructions, for
        # a kernel whose vector work is a measured instruction count: time_model's instruction_issue)
        issue_peak = gpu.warp_instructions_per_clk_per_sm * 32 * gpu.clock_hz * gpu.sm_count
        vector_peak = max(gpu.vector_flops_per_s, issue_peak)
        for k in r["kernels"] + [r]:
            bound = max(k["matmul_flops"] / gpu.matmul_flops_per_s, k["vector_flops"] / vector_peak,
                        (k["hbm_read_bytes"] + k["hbm_write_bytes"]) / hbm_rate(gpu, TimeModel()))
            slack = clock_ulp * max(2 * (len(r["kernels"]) if k is r else 1), r["sim_events"])
            assert k["time_s"] >= bound * (1 - 1e-9) - slack, (r["pass"], k.get("name"), k["time_s"], bound)
        # numerics against the float64 reference (the programs compute in float64 whatever the
        # storage dtype, so the error is rounding only)
        if count_only:
            assert r["max_abs_error"] is None
        else:         # these workloads are far below runner.NUMERICS_BUDGET_BYTES
            assert r["max_abs_error"] is not None and r["max_abs_error"] <= 1e-12, (r["pass"], r["max_abs_error"])
    if len(results) == 3:
        fwd, bwd, both = results
        assert both["time_s"] == pytest.approx(fwd["time_s"] + bwd["time_s"], rel=1e-9)
    # The whole run: the machine's clock has served every HBM byte at no more than full rate,
    # and the reported kernel time is that clock (nothing is still in flight when the last kernel ends);
    # the stopwatch's time adds the host's dispatch and launches on top (simulator/host.py).
    whole = results[-1]
    end_s = obs.machine.env.now
    assert end_s >= (whole["hbm_read_bytes"] + whole["hbm_write_bytes"]) / gpu.hbm_bytes_per_s * (1 - 1e-9)
    assert whole["kernel_time_s"] == pytest.approx(end_s, rel=1e-9, abs=4 * len(whole["kernels"]) * clock_ulp)
    assert whole["time_s"] >= whole["kernel_time_s"] * (1 - 1e-12)
    # (d) bounded events. The HBM pool wakes at most twice per request (+ one). Every SimPy event
    # is one of: a wait for a tile's L2 part or a compute step (at most one per traced tile or
    # compute call); per HBM request its completion and at most one wake-up armed by the request
    # and one by each wake; a block slot's process start, its wait for the block scheduler
    # (block_dispatch's stagger) and end (at most one slot per block);
    # a kernel's done / drained events and drain wait; the main process.
    hbm = obs.machine.hbm
    assert hbm.wakes <= 2 * hbm.requests + 1, (hbm.wakes, hbm.requests)
    blocks = sum(k["grid"] for k in whole["kernels"])
    kernels = len(whole["kernels"])
    bound = obs.calls + 2 * hbm.requests + hbm.wakes + 3 * blocks + 3 * kernels + 4
    assert whole["sim_events"] <= bound, (whole["sim_events"], obs.calls, hbm.requests, hbm.wakes, blocks, kernels)


def note(what: str) -> None:
    if currently_in_test_context():       # hypothesis statistics (--hypothesis-show-statistics)
        event(what)


def run_and_check(cfg: Config, count_only: bool = True) -> list:
    obs = Observed()
    try:
        results = obs.run(cfg, count_only)
    except HbmsimError as err:
        msg = str(err)
        assert "\n" not in msg, msg
        assert "too long for simulated time" not in msg, msg
        assert "SRAM" in msg or "HBM" in msg, msg
        note("rejected: " + ("SRAM" if "SRAM" in msg else "HBM"))
        return []
    note(f"ran {cfg.run.algorithm} {'+'.join(cfg.run.passes)}" + ("" if count_only else " with numerics"))
    check_run(cfg, results, obs, count_only)
    return results


# ---- random configurations ------------------------------------------------------------------------

exponents = st.floats(-12, 20, allow_nan=False)


def chance(k: int, n: int):
    """True with probability k/n (st.integers would favour its bounds)."""
    return st.sampled_from([True] * k + [False] * (n - k))


@st.composite
def hardware(draw, small_sram_ok: bool = True):
    """A preset with random overrides. SRAM is mostly large (every explicit block fits), else
    the preset's, else (only where no block size is "auto", which would shrink to tiny blocks
    and a long run) 1..128 KiB, where many blocks do not fit."""
    gpu = PRESETS[draw(st.sampled_from(sorted(PRESETS)))]
    over = {}
    for name in RATE_FIELDS:
        if draw(chance(3, 4)):                         # most of the time: override
            over[name] = 10.0 ** draw(exponents)
    if draw(st.booleans()):
        over["hbm_latency_s"] = 10.0 ** draw(st.floats(-15, 0))
    if draw(st.booleans()):                           # the time model's numbers (0: effect off)
        over["hbm_stream_fraction"] = draw(st.sampled_from([0.0, 1e-3, 0.5, 1.0]))
        over["mma_sync_fraction"] = draw(st.sampled_from([0.0, 1e-3, 0.6667, 1.0]))
        over["sfu_ops_per_clk_per_sm"] = draw(st.sampled_from([0.0, 1e-3, 16.0, 1e6]))
    l2 = draw(st.sampled_from(["preset", "none", "tiny"]))
    if l2 == "none":
        over["l2_bytes"] = 0
        if draw(st.booleans()):
            over["l2_bytes_per_s"] = 0.0
    elif l2 == "tiny":
        over["l2_bytes"] = draw(st.integers(4096, 10**6))
    sram = draw(st.sampled_from(["large"] * 6 + ["preset"] * 3 + (["small"] if small_sram_ok else [])))
    if sram == "large":
        over["sram_bytes_per_sm"] = 1 << 24            # every explicit block below fits
    elif sram == "small":
        over["sram_bytes_per_sm"] = int(2 ** draw(st.floats(10, 17)))
    if draw(chance(1, 16)):
        over["hbm_capacity_bytes"] = int(10 ** draw(st.floats(3, 6)))    # footprint may not fit
    return gpu.with_overrides(over, "fuzz")


def blocks(seq_len: int):
    """An explicit block size (at most MAX_BLOCKS blocks over the sequence, possibly larger than
    the whole sequence) or "auto"."""
    return st.just("auto") | st.integers(math.ceil(seq_len / MAX_BLOCKS), 256)


def cfg_spec(alg: str):
    return RunSpec(alg).spec


def explicit(spec, params: dict):
    """The spec's mapping with the given flash blocks, used as they are (not resolved); a
    backward's own blocks, where the program has them, equal the forward's; warp counts (flash2:
    they set shared-memory reads only) are the FA2 kernel's 4 and 8."""
    extra = {f"{k}_bwd": v for k, v in params.items() if f"{k}_bwd" in spec.mapping_fields}
    warps = {k: v for k, v in (("warps", 4), ("warps_bwd", 8)) if k in spec.mapping_fields}
    return spec.mapping_type(**params, **extra, **warps)


@st.composite
def configs(draw):
    nq, nk = draw(st.integers(1, 200)), draw(st.integers(1, 200))
    if draw(chance(1, 4)):
        nk = nq
    d = draw(st.sampled_from([8, 16, 32, 64, 128, 24, 40, 3]))
    mask = draw(st.sampled_from(["none", "causal", "key_padding_mask", "both"]))
    wl = Workload(batch=draw(st.integers(1, 3)), heads=draw(st.integers(1, 3)), seq_len_q=nq, seq_len_kv=nk,
                  head_dim=d, dtype=draw(st.sampled_from(["fp16", "bf16", "fp32"])),
                  causal=mask in ("causal", "both"), key_padding_mask=mask in ("key_padding_mask", "both"),
                  dropout=draw(st.sampled_from([0.0, 0.1])))
    alg = draw(st.sampled_from(["standard", "flash1", "flash2"]))
    passes = draw(st.sampled_from([("forward",), ("forward", "backward")]))
    params = {}
    if alg == "standard":
        longest = max(nq, nk, d)
        for key in ("tile_m", "tile_n", "tile_k"):
            if draw(st.booleans()):
                params[key] = draw(st.integers(math.ceil(longest / MAX_BLOCKS), 256))
    else:
        params = {"block_q": draw(blocks(nq)), "block_kv": draw(blocks(nk))}
    gpu = draw(hardware(small_sram_ok="auto" not in params.values()))
    if alg != "standard" and "auto" not in params.values() and draw(st.booleans()):
        # The given blocks as they are, even longer than the sequence (the experiment loader
        # clamps those; the programs must clip their tiles themselves).
        return Config(gpu, wl, RunSpec(alg, passes, params), mapping=explicit(cfg_spec(alg), params))
    variants = cfg_spec(alg).variants
    if variants and wl.head_dim <= 128:               # every named organisation (fa1-kernel: d <= 128)
        params["variant"] = draw(st.sampled_from(variants))
    return Config(gpu, wl, RunSpec(alg, passes, params))


@settings(max_examples=600, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(configs(), chance(4, 5))
def test_random_configs_finish_with_closed_form_counts(cfg, count_only):
    run_and_check(cfg, count_only)


# ---- the configurations that used to hang ------------------------------------------------------------

HUNG = Workload(batch=1, heads=1, seq_len_q=512, seq_len_kv=512, head_dim=128, dtype="fp16", key_padding_mask=True)


@pytest.mark.parametrize("gpu", [
    PRESETS["h100-sxm5-80gb"],
    PRESETS["h100-sxm5-80gb"].with_overrides(
        {"hbm_bytes_per_s": 1e15, "matmul_flops_per_s": 1e-30, "l2_bytes_per_s": 1e-30}, "extreme"),
], ids=["h100-key-padding", "extreme-rates"])
@pytest.mark.parametrize("passes", [("forward",), ("forward", "backward")], ids=["fwd", "fwd+bwd"])
def test_formerly_hanging_flash1_configs(gpu, passes):
    cfg = Config(gpu, HUNG, RunSpec("flash1", passes, {"block_q": "auto", "block_kv": "auto"}))
    results = run_and_check(cfg)
    assert results, "rejected"
    assert [r["pass"] for r in results][:len(passes)] == list(passes)
    for r in results:
        assert counted(r) == nonzero(closed_form(cfg, r, r["pass"]))
        assert math.isfinite(r["time_s"]) and r["time_s"] > 0


def test_formerly_hanging_a100_causal_padding_config():
    """The issue's second hang: A100, B=4, H=1, Nq=1000, Nkv=128, d=64, fp32, causal + key padding."""
    wl = Workload(batch=4, heads=1, seq_len_q=1000, seq_len_kv=128, head_dim=64, dtype="fp32", causal=True,
                  key_padding_mask=True)
    cfg = Config(PRESETS["a100-sxm4-40gb"], wl, RunSpec("flash1", ("forward", "backward"), {}))
    results = run_and_check(cfg)
    assert [r["pass"] for r in results] == ["forward", "backward", "forward+backward"]
    for r in results[:2]:
        assert counted(r) == nonzero(closed_form(cfg, r, r["pass"]))


# ---- found by this fuzz test ---------------------------------------------------------------------

def test_reported_time_covers_l2_write_backs():
    """Found by this fuzz test: write-backs of evicted dirty lines were issued without anyone
    waiting, so the reported time (the sum of kernel times) ended before they were served. A
    kernel now ends only when its write-backs have drained, as with its stores."""
    # A 4 KiB L2 evicts dirty O and lse tiles; each write-back is one HBM request credited to the
    # kernel that evicted it. At 1 B/s the 49408 HBM bytes need 49408 s (the machine's clock
    # does end there); the reported time used to be about 41344 s.
    gpu = PRESETS["a100-sxm4-40gb"].with_overrides({"hbm_bytes_per_s": 1.0, "l2_bytes": 4096}, "tiny L2")
    cfg = Config(gpu, Workload(1, 1, 64, 64, 32, dtype="fp32"), RunSpec("flash2", ("forward",), {}))
    (r,) = run_and_check(cfg)
    assert r["time_s"] >= (r["hbm_read_bytes"] + r["hbm_write_bytes"]) / gpu.hbm_bytes_per_s
