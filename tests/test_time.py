"""Predicted time obeys the physics: bandwidth bounds, monotonicity, flash beats standard."""
import dataclasses

import pytest

from hbmsim.algorithms.flash1 import flash1_forward
from hbmsim.algorithms.flash2 import flash2_forward
from hbmsim.algorithms.standard import standard_forward
from hbmsim.algorithms.workload import Workload
from hbmsim.simulator import simulate

CASES = [Workload(2, 8, 512, 512, 64), Workload(1, 4, 1000, 700, 128, causal=True),
         Workload(2, 4, 256, 256, 32, dtype="fp32", key_padding_mask=True, dropout=0.1)]


def progs(wl):
    return [standard_forward(wl), flash1_forward(wl, 64, 64), flash2_forward(wl, 128, 64)]


@pytest.mark.parametrize("wl", CASES)
def test_no_run_beats_its_bytes_over_bandwidth_or_its_flops_over_peak(a100, wl):
    for prog in progs(wl):
        r = simulate(a100, prog)
        hbm = r.total("hbm_read") + r.total("hbm_write")
        assert r.time_s >= hbm / a100.hbm_bytes_per_s
        flops = sum(k.matmul_flops for k in r.kernels)
        assert r.time_s >= flops / a100.matmul_flops_per_s
        assert r.cycles == round(r.time_s * a100.clock_hz)
        assert sum(k.time_s for k in r.kernels) == pytest.approx(r.time_s)


@pytest.mark.parametrize("wl", CASES)
def test_more_sms_or_more_bandwidth_is_never_slower(a100, wl):
    for prog_fn in (standard_forward, lambda w: flash2_forward(w, 128, 64), lambda w: flash1_forward(w, 64, 64)):
        base = simulate(a100, prog_fn(wl)).time_s
        more_bw = simulate(dataclasses.replace(a100, hbm_bytes_per_s=2 * a100.hbm_bytes_per_s), prog_fn(wl)).time_s
        # More SMs of the same kind: whole-GPU compute rates grow with them.
        bigger = dataclasses.replace(a100, sm_count=2 * a100.sm_count, matmul_flops_per_s=2 * a100.matmul_flops_per_s,
                                     vector_flops_per_s=2 * a100.vector_flops_per_s)
        more_sm = simulate(bigger, prog_fn(wl)).time_s
        assert more_bw <= base * (1 + 1e-9)
        assert more_sm <= base * (1 + 1e-9)


@pytest.mark.parametrize("n", [1024, 2048])
def test_flash2_predicted_faster_than_standard_on_a100(a100, n):
    wl = Workload(2, 16, n, n, 64)
    std = simulate(a100, standard_forward(wl))
    fl = simulate(a100, flash2_forward(wl, 128, 128))
    assert fl.time_s < std.time_s
    assert std.bound() == "memory"


def test_standard_is_memory_bound_with_time_near_traffic_over_bandwidth(a100):
    # With no L2 modelled, standard attention's time is its DRAM traffic at full bandwidth, within
    # the latency and ramp-up/tail of each of its kernels.
    gpu = dataclasses.replace(a100, l2_bytes=0, l2_bytes_per_s=0.0)
    r = simulate(gpu, standard_forward(Workload(4, 16, 1024, 1024, 64)))
    floor = (r.total("hbm_read") + r.total("hbm_write")) / gpu.hbm_bytes_per_s
    assert floor <= r.time_s <= 1.25 * floor


def test_anomaly_measurement_runs_and_counts_every_change(a100):
    from hbmsim.scenarios.anomalies import measure, programs
    r = measure(a100, trials=2, seed=3, progress=False)
    # standard, flash1, flash2 forward and the flash1 and flash2 training steps: 2 changes each
    assert len(programs(16, 16)) == 5 and r["changes"] == 2 * 5 * 2
    assert 0 <= r["slower"] <= r["changes"] and len(r["worst"]) == min(5, r["slower"])
    assert r["max_slowdown"] == (r["worst"][0]["slowdown"] if r["worst"] else 0.0)
