"""The host model (simulator/host.py): hand-worked stopwatch times."""
import pytest

from hbmsim.simulator.host import DEFAULT_HOST, SOURCES, HostSpec, HostStep, pass_times

US = 1e-6


def test_every_field_has_a_source():
    assert set(SOURCES) == set(HostSpec.__dataclass_fields__)


def test_one_long_kernel_pays_one_op_and_one_launch():
    # host: 6.8 us (the op) + 5 us (the launch) = 11.8 us before the kernel starts; then 100 us
    t = pass_times([HostStep(100 * US)], backward=False)
    assert t.kernel_time_s == pytest.approx(100 * US)
    assert t.time_s == pytest.approx(111.8 * US)
    assert t.starts_s == pytest.approx((11.8 * US,))


def test_the_callers_own_ops_come_before_the_first_launch():
    # a harness's three transposes before SDPA: 3 x 6.8 us, then SDPA's op and its launch (11.8 us):
    # the kernel starts at 32.2 us; a backward pays them after the engine (95.7 + 20.4 + 11.8 = 127.9 us),
    # and its second kernel, queued by 132.9 us, starts 0.9 us after the first ends (228.8 us)
    t = pass_times([HostStep(100 * US)], backward=False, caller_ops=3)
    assert t.starts_s == pytest.approx((32.2 * US,)) and t.time_s == pytest.approx(132.2 * US)
    assert t.kernel_time_s == pytest.approx(100 * US)
    t = pass_times([HostStep(100 * US), HostStep(1 * US, ops=0)], backward=True, caller_ops=3)
    assert t.starts_s == pytest.approx((127.9 * US, 228.8 * US))


def test_an_sdpa_call_pays_its_own_host_work_before_its_first_launch():
    # forward: SDPA's own 84.7 us, then its op and launch (11.8 us): the kernel starts at 96.5 us
    t = pass_times([HostStep(100 * US)], backward=False, sdpa=True)
    assert t.starts_s == pytest.approx((96.5 * US,)) and t.time_s == pytest.approx(196.5 * US)
    # backward: the engine (95.7) and SDPA's 157.4 us, the node and the first launch (11.8): 264.9 us;
    # the next two kernels, launched by 269.9 and 274.9 us, wait for the one before (+ 0.9 us gaps)
    t = pass_times([HostStep(10 * US, 1), HostStep(50 * US, 0), HostStep(5 * US, 0)], backward=True, sdpa=True)
    assert t.starts_s == pytest.approx((264.9 * US, 275.8 * US, 326.7 * US)) and t.time_s == pytest.approx(331.7 * US)
    assert t.host_s == pytest.approx(274.9 * US)
    assert pass_times([HostStep(100 * US)], backward=False).time_s == pytest.approx(111.8 * US)   # not SDPA


def test_calls_back_to_back_take_the_slower_of_the_gpu_and_the_host():
    # a loop of calls: each call's host work (2 x 11.8 = 23.6 us) overlaps the kernels of the one before;
    # two 100 us kernels and their gaps take 201.8 us a call, two 1 us kernels wait for the host's 23.6 us
    assert pass_times([HostStep(100 * US), HostStep(100 * US)], backward=False).period_s == pytest.approx(201.8 * US)
    assert pass_times([HostStep(1 * US), HostStep(1 * US)], backward=False).period_s == pytest.approx(23.6 * US)


def test_tiny_kernels_are_host_bound():
    # each 1 us kernel waits for the host's 11.8 us: starts at 11.8 and 23.6 us, the pass ends at 24.6 us
    t = pass_times([HostStep(1 * US), HostStep(1 * US)], backward=False)
    assert t.starts_s == pytest.approx((11.8 * US, 23.6 * US))
    assert t.time_s == pytest.approx(24.6 * US)


def test_long_kernels_hide_the_host_behind_the_queue():
    # the second launch is queued at 11.8 + 11.8 = 23.6 us, long before the first kernel ends at 111.8 us:
    # it starts 0.9 us (the back-to-back gap) after, and the pass ends at 111.8 + 0.9 + 100 = 212.7 us
    t = pass_times([HostStep(100 * US), HostStep(100 * US)], backward=False)
    assert t.time_s == pytest.approx(212.7 * US)


def test_a_kernel_launched_by_the_same_op_pays_only_its_launch():
    # FlashAttention-2's backward: one autograd node launches three kernels. The engine 95.7 us, the node
    # 6.8 us, launch 5 us: the first starts at 107.5 us and ends at 117.5; the second, queued at 112.5 us,
    # starts 0.9 us after it (118.4) and ends at 168.4; the third starts at 169.3 and ends at 174.3 us
    t = pass_times([HostStep(10 * US, 1), HostStep(50 * US, 0), HostStep(5 * US, 0)], backward=True)
    assert t.starts_s == pytest.approx((107.5 * US, 118.4 * US, 169.3 * US))
    assert t.time_s == pytest.approx(174.3 * US)


def test_a_backward_call_costs_the_host_what_pytorch_157407_measured():
    # out = a @ b, out.backward(grad) back to back (pytorch/pytorch#157407, A100 PCIe): MmBackward0 launches
    # two GEMMs, each leaf's AccumulateGrad an in-place add; the host is busy 95.7 + (6.8 + 5) + 5 +
    # 2 x (6.8 + 5) = 136.1 us a call, the figure the issue measured (136.07 us), which sets the engine's
    # part (backward_start_s), so this checks the arithmetic of the derivation, nothing more
    tiny = 2 * US
    t = pass_times([HostStep(tiny, 1), HostStep(tiny, 0), HostStep(tiny, 1), HostStep(tiny, 1)], backward=True)
    assert t.host_s == pytest.approx(136.1 * US)
    assert DEFAULT_HOST.backward_start_s == pytest.approx(136.07 * US - 3 * 6.8 * US - 4 * 5 * US, abs=0.05 * US)


def test_the_engines_hand_back_ends_a_short_backward():
    # start 50 us, the node 6.8 and its launch 5: a 1 us kernel ends at 62.8 us, but the host returns
    # (and records the end event) 40 us after its launch, at 101.8; a 200 us kernel hides it (261.8 us)
    host = HostSpec(backward_start_s=50 * US, backward_end_s=40 * US)
    assert pass_times([HostStep(1 * US)], backward=True, host=host).time_s == pytest.approx(101.8 * US)
    assert pass_times([HostStep(200 * US)], backward=True, host=host).time_s == pytest.approx(261.8 * US)
    assert pass_times([HostStep(1 * US)], backward=False, host=host).time_s == pytest.approx(12.8 * US)
    assert DEFAULT_HOST.backward_end_s == 0.0


def test_device_work_without_a_launch_follows_the_last_kernel():
    t = pass_times([HostStep(100 * US), HostStep(3 * US, ops=0, launched=False)], backward=False)
    assert t.time_s == pytest.approx(114.8 * US) and t.kernel_time_s == pytest.approx(103 * US)


def test_a_full_queue_blocks_the_host():
    # a queue of one launch: the host may launch kernel 2 only once kernel 1 has started (at 11.8 us),
    # so kernel 3's launch waits for kernel 2's start (111.8 + 0.9 = 112.7 us), then takes 11.8 us
    host = HostSpec(queue_launches=1)
    t = pass_times([HostStep(100 * US), HostStep(100 * US), HostStep(1 * US)], backward=False, host=host)
    assert t.host_issue_s == pytest.approx((11.8 * US, 23.6 * US, 124.5 * US))
    assert t.starts_s[2] == pytest.approx(213.6 * US)
    assert DEFAULT_HOST.queue_launches == 1000


def test_run_takes_measured_host_fields(tmp_path, capsys):
    """`--host-spec FILE` replaces the public figures by a measured file's host_spec (fields it
    lacks keep DEFAULT_HOST's). One flash2 forward kernel, launched by one op: the stopwatch sees
    the host's eager_op_s + launch_s before the kernel starts, so doubling launch_s from 5 us to
    10 us adds 5 us to the pass; its kernel time does not move."""
    import json

    from hbmsim.scenarios.cli import main
    exp = tmp_path / "e.toml"
    exp.write_text('name = "e"\nhardware = "h100-sxm5-80gb"\n[workload]\nbatch = 1\nheads = 2\nseq_len = 128\n'
                   'head_dim = 64\ndtype = "fp16"\n[[runs]]\nalgorithm = "flash2"\npasses = ["forward"]\n')
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"source": "measured", "host_spec": {"launch_s": 10e-6}}))
    runs = {}
    for name, extra in (("public", []), ("measured", ["--host-spec", str(host)])):
        out = tmp_path / f"{name}.json"
        assert main(["run", str(exp), "--count-only", "--json", str(out)] + extra) == 0
        runs[name] = json.loads(out.read_text())["runs"][0]
    assert runs["measured"]["kernel_time_s"] == runs["public"]["kernel_time_s"]
    assert runs["measured"]["time_s"] - runs["public"]["time_s"] == pytest.approx(5e-6, rel=1e-6)
    # a loop of calls: this tiny kernel (2 batch-heads, N = 128) waits for the host's op and launch each
    # call, 6.8 + 5 us (public figures) or 6.8 + 10 us (measured), whatever the kernel's few microseconds
    pub = runs["public"]
    assert pub["kernel_time_s"] < 11.8e-6 and pub["loop_time_s"] == pytest.approx(11.8e-6, rel=1e-9)
    assert runs["measured"]["loop_time_s"] == pytest.approx(16.8e-6, rel=1e-9)
    assert "host fields measured" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"source": "measured", "host_spec": {"launch_s": -1}}))
    assert main(["run", str(exp), "--count-only", "--host-spec", str(bad)]) == 2
    assert "field 'host_spec.launch_s' = -1 must be >= 0 (seconds)" in capsys.readouterr().err
