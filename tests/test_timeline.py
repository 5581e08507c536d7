"""The timeline (simulator/timeline.py, `hbmsim run --timeline`): Chrome trace events whose per-SM
compute time equals the run's compute busy time, capped for big runs, free when not asked for."""
import json

import pytest

from hbmsim.algorithms.flash2 import flash2_forward
from hbmsim.algorithms.standard import standard_forward
from hbmsim.algorithms.workload import Workload
from hbmsim.scenarios.cli import main
from hbmsim.simulator import simulate
from hbmsim.simulator.timeline import Timeline

WL = Workload(1, 4, 256, 256, 64)


def check_schema(doc):
    assert set(doc) >= {"traceEvents", "displayTimeUnit", "otherData"}
    assert "predicted" in json.dumps(doc["otherData"])
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "C", "M") and isinstance(e["name"], str) and isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0 and isinstance(e["tid"], int)
        if e["ph"] == "C":
            assert e["args"]["GB/s"] >= 0


@pytest.mark.parametrize("build", [lambda: standard_forward(WL), lambda: flash2_forward(WL, 64, 64, warps=4)])
def test_per_sm_compute_equals_the_runs_compute_busy_time(a100, build):
    tl = Timeline()
    r = simulate(a100, build(), recorder=tl)
    doc = json.loads(json.dumps(tl.to_chrome(a100.sm_count, "t")))
    check_schema(doc)
    for k in r.kernels:
        per_sm = {}
        for e in doc["traceEvents"]:
            if e.get("cat") == "compute" and k.start_s * 1e6 - 1e-9 <= e["ts"] < k.end_s * 1e6:
                per_sm[e["tid"]] = per_sm.get(e["tid"], 0.0) + e["dur"] / 1e6
        assert max(per_sm.values(), default=0.0) == pytest.approx(k.compute_busy_s, rel=1e-9, abs=1e-15), k.name
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert [e["name"] for e in kernels] == [k.name for k in r.kernels if k.grid]
    # every DRAM byte of the run is in some recorded transfer
    assert sum(b for *_, b in tl.hbm) <= r.total("hbm_read") + r.total("hbm_write")


def test_big_runs_are_capped_and_say_so(a100):
    tl = Timeline(max_blocks=3)
    simulate(a100, flash2_forward(WL, 64, 64, warps=4), recorder=tl)
    doc = tl.to_chrome(a100.sm_count, "t")
    blocks = {e["args"]["block"] for e in doc["traceEvents"] if e.get("cat") == "block"}
    assert blocks == {0, 1, 2} and "only the first 3 blocks of each kernel" in doc["otherData"]["blocks_drawn"]


def test_no_recorder_costs_nothing(a100):
    a = simulate(a100, flash2_forward(WL, 64, 64, warps=4))
    b = simulate(a100, flash2_forward(WL, 64, 64, warps=4), recorder=Timeline())
    assert a.time_s == b.time_s and a.sim_events == b.sim_events


def test_run_timeline_writes_one_trace_for_the_experiment(tmp_path):
    out = tmp_path / "t.json"
    assert main(["run", "small-masked", "--count-only", "--timeline", str(out)]) == 0
    doc = json.loads(out.read_text())
    check_schema(doc)
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert any(n.startswith("config 3 (flash2 forward+backward N=100x77") for n in names)
    assert len(doc["otherData"]["configurations"]) == 3


def test_the_host_track_shows_each_launch_and_the_stopwatch(a100):
    """flash2 forward, one kernel: the host dispatches one op (6.8 us) and launches it (5 us) before
    it starts, so the track's launch span is 11.8 us and the stopwatch covers it plus the kernel."""
    from hbmsim.simulator.host import DEFAULT_HOST
    tl = Timeline()
    res = simulate(a100, flash2_forward(WL, 64, 64, warps=4), recorder=tl)
    tl.host(res)
    host = [e for e in tl.events if e["cat"] == "host"]
    launch, watch = host
    assert launch["name"] == "dispatch + launch flash2_fwd" and launch["tid"] == 0
    assert launch["dur"] == pytest.approx((DEFAULT_HOST.eager_op_s + DEFAULT_HOST.launch_s) * 1e6)
    assert watch["name"] == "forward: stopwatch" and watch["tid"] == 1
    assert watch["dur"] == pytest.approx(res.to_dict("forward")["time_s"] * 1e6)
    assert watch["args"]["kernel_time_us"] == pytest.approx(res.time("forward") * 1e6)
    check_schema(tl.to_chrome(a100.sm_count, "t"))


def test_the_host_track_shows_the_engines_hand_back(a100):
    """A measured split of the autograd engine (backward_end_s, host.py) puts its hand-back after the
    backward's last launch on the host track: 30 us here, and the stopwatch waits for it when the
    kernels end sooner (a tiny backward)."""
    import dataclasses

    from hbmsim.algorithms.flash2_backward import flash2_training
    from hbmsim.simulator import TimeModel
    from hbmsim.simulator.host import DEFAULT_HOST
    host = dataclasses.replace(DEFAULT_HOST, backward_start_s=50e-6, backward_end_s=30e-6)
    tl = Timeline()
    res = simulate(a100, flash2_training(Workload(1, 1, 64, 64, 64), 64, 64), recorder=tl,
                   model=TimeModel(host_spec=host))
    tl.host(res)
    (back,) = [e for e in tl.events if e["name"] == "autograd engine: hand-back"]
    assert back["dur"] == pytest.approx(30.0) and back["tid"] == 0
    # the host: the engine's start 50 us, the node 6.8 and three launches (5 us each), the hand-back 30:
    # 101.8 us, after the tiny kernels, so the stopwatch ends with it
    times = res.pass_times("backward")
    assert times.host_s == pytest.approx(101.8e-6) and times.time_s == pytest.approx(101.8e-6)
    check_schema(tl.to_chrome(a100.sm_count, "t"))
