"""The host microbenchmarks (kernels/host_microbench.py) without a GPU: their arithmetic, the CuPy
measurements against a fake CuPy with a fake clock, the file `hbmsim microbench --host` writes, and
simulator/host.py's host_from_measured reading it back (and refusing bad files in one line)."""
import json
import math

import numpy as np
import pytest

from hbmsim.kernels import host_microbench as H
from hbmsim.kernels import microbench
from hbmsim.simulator import HbmsimError
from hbmsim.simulator.host import DEFAULT_HOST, HostSpec, host_from_measured

US = 1e-6


# ---- the arithmetic ----

def test_fit_line_recovers_intercept_and_slope():
    f = H.fit_line([1, 2, 3, 4], [13e-6 + k * 12e-6 for k in (1, 2, 3, 4)])
    assert f["intercept_s"] == pytest.approx(13e-6) and f["slope_s"] == pytest.approx(12e-6)
    assert f["r2"] == pytest.approx(1.0)


def test_first_blocked_is_the_first_slow_launch():
    assert H.first_blocked([5e-6] * 3 + [0.4, 5e-6], 0.1) == 3
    assert H.first_blocked([5e-6] * 3, 0.1) is None


def test_cpu_model_from_proc_cpuinfo():
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
    assert H.cpu_model(text) == "AMD EPYC 9654 96-Core Processor"
    assert isinstance(H.cpu_model(""), str)


RESULTS = {
    "host_launch": {"host_s_per_launch": 4 * US},
    "host_launch_gap": {"gap_s": 0.8 * US},
    "host_queue": {"queue_launches": 1022},
    "host_torch_dispatch": {"add_requires_grad_s": 11 * US},
    "host_autograd": {"slope_s": 10 * US, "intercept_s": 15 * US},
    "host_sdpa": {"runs": []},
}


def test_host_fields_from_the_entries():
    assert H.host_fields(RESULTS) == pytest.approx({"launch_s": 4 * US, "launch_gap_s": 0.8 * US, "eager_op_s": 7 * US,
                                                    "autograd_node_s": 6 * US, "backward_start_s": 15 * US,
                                                    "queue_launches": 1022})
    assert set(H.DERIVATION) == set(HostSpec.__dataclass_fields__)


def test_the_engines_start_and_end_split_by_the_first_kernel():
    # the first kernel starts 20 us after the call: start 10 us + one node with its launch (the slope,
    # 10 us); the chain's intercept (15 us) less that start leaves 5 us after the last node
    res = {**RESULTS, "host_autograd_first_kernel": {"pre_kernel_s": 20 * US}}
    fields = H.host_fields(res)
    assert fields["backward_start_s"] == pytest.approx(10 * US) and fields["backward_end_s"] == pytest.approx(5 * US)
    assert "backward_end_s" not in H.host_fields(RESULTS)      # without it: the whole before the first node


def test_sdpas_own_host_work_from_the_tiny_calls():
    # forward calls of 30 and 40 us (median 35) less the op (7) and the launch (4): 24 us; the backward
    # (70 and 80 us more, median 75) less the engine (15, not split), one node (6) and 3 launches (12): 42 us
    runs = [{"forward": {"host_s": 30 * US}, "forward+backward": {"host_s": 100 * US}},
            {"forward": {"host_s": 40 * US}, "forward+backward": {"host_s": 120 * US}}]
    fields = H.host_fields({**RESULTS, "host_sdpa": {"runs": runs}})
    assert fields["sdpa_forward_s"] == pytest.approx(24 * US) and fields["sdpa_backward_s"] == pytest.approx(42 * US)
    assert "sdpa_forward_s" not in H.host_fields({**RESULTS, "host_sdpa": {"skipped": "no PyTorch"}})


def test_the_default_sdpa_fields_give_the_h100s_tiny_call():
    """By construction: with the public fields, a tiny SDPA call's host time is the H100's measured one
    (h100-host.json: 96.5 us a forward, 274.9 us more for its backward)."""
    import json
    import statistics
    from hbmsim.scenarios.published import resolve_measured
    runs = json.loads(resolve_measured("h100-host").read_text())["results"]["host_sdpa"]["runs"]
    fwd = statistics.median(r["forward"]["host_s"] for r in runs)
    bwd = statistics.median(r["forward+backward"]["host_s"] - r["forward"]["host_s"] for r in runs)
    h = DEFAULT_HOST
    assert h.sdpa_forward_s + h.eager_op_s + h.launch_s == pytest.approx(fwd, abs=0.1 * US)
    assert h.sdpa_backward_s + h.backward_start_s + h.backward_end_s + h.autograd_node_s + 3 * h.launch_s \
        == pytest.approx(bwd, abs=0.1 * US)


def test_host_fields_leave_out_what_was_not_measured():
    res = {**RESULTS, "host_torch_dispatch": {"skipped": "PyTorch is not installed"},
           "host_autograd": {"skipped": "PyTorch is not installed"}}
    assert set(H.host_fields(res)) == {"launch_s", "launch_gap_s", "queue_launches"}
    assert H.host_fields({}) == {}


# ---- the CuPy measurements against a fake CuPy and a fake clock ----

class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class FakeCuPy:
    """Enough of CuPy for kernels/host_microbench.py: each launch costs the host 5 us on `clock`;
    after a spin, the queue holds `queue` launches and the next one waits 0.3 s. A GPU of 4 SMs."""
    uint64, uint32 = np.uint64, np.uint32

    def __init__(self, clock, queue=1022):
        self.clock, self.queue, self.queued = clock, queue, None
        cp = self

        class Device:
            attributes = {"MultiProcessorCount": 4}

            def synchronize(self):
                cp.queued = None

        class Event:
            def record(self):
                pass

            def synchronize(self):
                cp.queued = None

        class Cuda:
            pass
        self.cuda = Cuda()
        self.cuda.Device, self.cuda.Event = Device, Event
        self.cuda.get_elapsed_time = lambda start, end: 200 * 1e-3      # ms: 1 us per kernel of 200

    def zeros(self, n, dtype):
        return np.zeros(n, dtype=dtype)

    def asnumpy(self, a):
        return np.asarray(a)

    def empty(self, grid, block, args):
        self.clock.t += 5 * US
        if self.queued is not None:
            self.queued += 1
            if self.queued > self.queue:
                self.clock.t += 0.3
                self.queued = None

    def spin(self, grid, block, args):
        self.clock.t += 5 * US
        self.queued = 0

    def block_starts(self, grid, block, args):
        # 2 blocks an SM on 4 SMs: block i of each wave of 8 enters 10 ns after block i - 1, the
        # next wave a spin later; block i runs on SM i % 4
        starts, smids, ns = args
        for i in range(grid[0]):
            starts[i] = 1000 + 10 * (i % 8) + int(ns) * (i // 8)
            smids[i] = i % 4

    def stamp(self, grid, block, args):     # entry at i us, exit 100 ns later
        stamps, i, _ = args
        self.clock.t += 5 * US
        stamps[2 * i], stamps[2 * i + 1] = 1000 * int(i), 1000 * int(i) + 100


@pytest.fixture
def fake(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(H, "perf_counter", clock)
    return FakeCuPy(clock)


def test_launch_rate_is_host_seconds_per_launch(fake):
    r = H.launch_rate(fake, fake.empty, launches=100, repeats=3)
    assert r["host_s_per_launch"] == pytest.approx(5 * US) and len(r["host_s_per_launch_all"]) == 3
    assert "method" in r


def test_launch_gap_subtracts_the_kernels_own_time(fake):
    r = H.launch_gap(fake, fake.stamp, fake.spin, kernels=200, repeats=2)
    assert r["event_s_per_kernel"] == pytest.approx(1 * US)
    assert r["own_device_s"] == pytest.approx(0.1 * US)
    assert r["gap_s"] == pytest.approx(0.9 * US) and r["stamp_gap_s"] == pytest.approx(0.9 * US)
    assert r["globaltimer_resolution_s"] == pytest.approx(0.1 * US)
    assert r["queued_behind_spin"] is True          # 200 launches x 5 us = 1 ms < the 20 ms spin


def test_queue_depth_is_the_launches_before_the_first_wait(fake):
    r = H.queue_depth(fake, fake.empty, fake.spin, max_launches=2000, repeats=2)
    assert r["queue_launches"] == 1022 and r["launches_before_block"] == [1022, 1022]
    assert r["slowest_unblocked_launch_s"] == pytest.approx(5 * US)
    r = H.queue_depth(fake, fake.empty, fake.spin, max_launches=500, repeats=1)
    assert r["queue_launches"] is None and r["launches_before_block"] == [None]


def test_first_wave_is_the_blocks_before_half_the_spin():
    # 6 blocks on 3 SMs, 2 slots each: entries 0-50 ns apart by 10 ns; then a second wave at 1 ms
    starts = [0, 10e-9, 20e-9, 30e-9, 40e-9, 50e-9, 1e-3, 1e-3 + 10e-9]
    smids = [0, 1, 2, 0, 1, 2, 0, 1]
    w = H.first_wave(starts, smids, slots=2, spin_s=1e-3)
    assert w["first_wave_blocks"] == 6 and w["first_wave_spread_s"] == pytest.approx(50e-9)
    assert w["per_block_s"] == pytest.approx(10e-9) and w["sms_reached"] == 3 and w["sms_full"] == 3
    # one SM not reached in the first wave: its block came only after half the spin
    w = H.first_wave([0, 10e-9, 0.7e-3], [0, 1, 2], slots=1, spin_s=1e-3)
    assert w["first_wave_blocks"] == 2 and w["sms_reached"] == 2 and w["sms_full"] == 2


def test_block_dispatch_reads_the_first_waves_spread(fake):
    r = H.block_dispatch(fake, fake.block_starts, waves=2, spin_s=0.001, repeats=2)
    assert r["sms"] == 4 and r["blocks"] == 16 and len(r["runs"]) == 2
    assert r["first_wave_spread_s"] == pytest.approx(70e-9) and r["per_block_s"] == pytest.approx(10e-9)
    assert r["runs"][0]["sms_full"] == 4 and r["globaltimer_resolution_s"] == pytest.approx(10e-9)


def _fake_module(fake):
    return lambda: (fake, {"hbmsim_empty": fake.empty, "hbmsim_spin": fake.spin, "hbmsim_stamp": fake.stamp,
                           "hbmsim_block_starts": fake.block_starts})


def test_measure_without_torch_keeps_the_cupy_entries(fake, monkeypatch):
    monkeypatch.setattr(H, "_module", _fake_module(fake))
    monkeypatch.setattr(H, "_torch", lambda: (None, "PyTorch is not installed"))
    res = H.measure(repeats=2)
    assert res["host_launch"]["host_s_per_launch"] == pytest.approx(5 * US)
    for name in ("host_torch_dispatch", "host_autograd", "host_autograd_first_kernel", "host_sdpa"):
        assert res[name] == {"skipped": "PyTorch is not installed"}


def test_a_failing_entry_is_recorded_not_fatal(fake, monkeypatch, capsys):
    monkeypatch.setattr(H, "_module", _fake_module(fake))
    monkeypatch.setattr(H, "_torch", lambda: (None, "torch sees no CUDA GPU"))

    def broken(*a, **kw):
        raise RuntimeError("CUDA error: launch timed out")
    monkeypatch.setattr(H, "queue_depth", broken)
    res = H.measure(repeats=1)
    assert res["host_queue"] == {"skipped": "RuntimeError: CUDA error: launch timed out"}
    assert "host_queue: failed" in capsys.readouterr().err
    assert "queue_launches" not in H.host_fields(res)


# ---- the file `hbmsim microbench --host` writes ----

PROVENANCE = {"source": "measured", "gpu": "Fake GPU", "driver_version": 13000, "cupy": "14.2.0",
              "date": "2026-01-01T00:00:00+00:00", "command": "x"}


def test_microbench_host_writes_the_host_file(tmp_path, monkeypatch, fake, capsys):
    from hbmsim.kernels import profile
    monkeypatch.setattr(H, "_module", _fake_module(fake))
    monkeypatch.setattr(H, "_torch", lambda: (None, "PyTorch is not installed"))
    monkeypatch.setattr(profile, "gpu_provenance", lambda command, w, r, ncu: {**PROVENANCE,
                                                                                 "command": " ".join(command)})
    monkeypatch.setattr(microbench, "measure", lambda **kw: pytest.fail("--host measures no rates"))
    out = tmp_path / "host.json"
    assert microbench.main(["--out", str(out), "--repeats", "2", "--host"]) == 0
    doc = json.loads(out.read_text())
    assert doc["source"] == "measured"
    prov = doc["provenance"]
    assert prov["command"].endswith("--repeats 2 --host") and prov["gpu"] == "Fake GPU"
    assert {"cpu_model", "torch", "python", "date", "driver_version", "cupy"} <= set(prov)
    assert set(doc["results"]) == {"host_launch", "host_launch_gap", "host_queue", "block_dispatch",
                                   "host_torch_dispatch", "host_autograd", "host_autograd_first_kernel",
                                   "host_sdpa", "kernel_floor"}
    assert all("method" in v for v in doc["results"].values() if "skipped" not in v)
    assert doc["host_spec_derivation"] == H.DERIVATION
    assert doc["host_spec"] == pytest.approx({"launch_s": 5 * US, "launch_gap_s": 0.9 * US, "queue_launches": 1022})
    # without PyTorch the dispatch fields are missing: said in one line, or taken from the defaults
    with pytest.raises(HbmsimError, match=r"field 'host_spec.eager_op_s' is missing"):
        host_from_measured(out)
    h = host_from_measured(out, defaults=DEFAULT_HOST)
    assert h.launch_s == pytest.approx(5 * US) and h.queue_launches == 1022
    assert h.eager_op_s == DEFAULT_HOST.eager_op_s
    assert "host_spec" in capsys.readouterr().err


def test_hbmsim_microbench_passes_host_on(tmp_path, monkeypatch):
    from hbmsim.kernels import gpu
    from hbmsim.scenarios.cli import main
    seen = []
    monkeypatch.setattr(gpu, "gpu_available", lambda: (True, "Fake GPU"))
    monkeypatch.setattr(microbench, "main", lambda argv: seen.append(argv) or 0)
    out = str(tmp_path / "h.json")
    assert main(["microbench", "--host", "--out", out, "--repeats", "4"]) == 0
    assert main(["microbench", "--out", out]) == 0
    assert main(["microbench", "--latency", "--out", out]) == 0
    assert seen == [["--out", out, "--repeats", "4", "--host"], ["--out", out, "--repeats", "10"],
                    ["--out", out, "--repeats", "10", "--latency"]]


def test_hbmsim_microbench_without_gpu_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    from hbmsim.kernels import gpu
    from hbmsim.scenarios.cli import main
    monkeypatch.setattr(gpu, "gpu_available", lambda: (False, "no CUDA device"))
    out = tmp_path / "h.json"
    assert main(["microbench", "--host", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("hbmsim: error: microbench: no GPU to measure on (no CUDA device); "
                           "nothing was measured or written")
    assert not out.exists()


# ---- host_from_measured on a hand-written file ----

HAND = {"launch_s": 4.2e-6, "launch_gap_s": 1.1e-6, "eager_op_s": 7.5e-6, "autograd_node_s": 8e-6,
        "backward_start_s": 20e-6, "queue_launches": 1022, "sdpa_forward_s": 80e-6, "sdpa_backward_s": 150e-6}


def _write(tmp_path, spec=HAND, source="measured", name="host.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"source": source, "provenance": {}, "results": {}, "host_spec": spec}))
    return p


def test_host_from_a_hand_written_file(tmp_path):
    assert host_from_measured(_write(tmp_path)) == HostSpec(**HAND)      # no backward_end_s: 0, the whole before
    assert host_from_measured(_write(tmp_path, {**HAND, "backward_end_s": 5e-6})).backward_end_s == 5e-6
    assert host_from_measured(str(_write(tmp_path, {**HAND, "queue_launches": 1022.0}))).queue_launches == 1022


@pytest.mark.parametrize("field,value,message", [
    ("eager_op_s", None, "field 'host_spec.eager_op_s' is missing (not measured: see the file's results for why)"),
    ("launch_s", math.nan, "field 'host_spec.launch_s' = nan must be a finite number"),
    ("launch_gap_s", math.inf, "field 'host_spec.launch_gap_s' = inf must be a finite number"),
    ("autograd_node_s", -1.5e-06, "field 'host_spec.autograd_node_s' = -1.5e-06 must be >= 0 (seconds)"),
    ("backward_start_s", "13us", "field 'host_spec.backward_start_s' = '13us' must be a number"),
    ("queue_launches", 0, "field 'host_spec.queue_launches' = 0 must be a whole number >= 1"),
    ("queue_launches", 10.5, "field 'host_spec.queue_launches' = 10.5 must be a whole number >= 1"),
    ("launch_s", True, "field 'host_spec.launch_s' = True must be a number"),
])
def test_bad_host_fields_are_refused_in_one_line(tmp_path, field, value, message):
    spec = {**HAND, field: value}
    if value is None:
        del spec[field]
    p = _write(tmp_path, spec)
    with pytest.raises(HbmsimError) as err:
        host_from_measured(p)
    text = str(err.value)
    assert text == f"host: {str(p)!r}: {message}" and "\n" not in text


def test_bad_host_files_are_refused_in_one_line(tmp_path):
    p = _write(tmp_path, source="predicted")
    with pytest.raises(HbmsimError, match=r"field 'source' = 'predicted' must be 'measured'"):
        host_from_measured(p)
    p = tmp_path / "rates.json"
    p.write_text(json.dumps({"source": "measured", "results": {}}))
    with pytest.raises(HbmsimError, match=r"rates.json': no 'host_spec' table \(write one with `hbmsim microbench"):
        host_from_measured(p)
    p = tmp_path / "broken.json"
    p.write_text("{not json")
    with pytest.raises(HbmsimError, match=r"broken.json': cannot read a JSON file \(JSONDecodeError"):
        host_from_measured(p)
    with pytest.raises(HbmsimError, match=r"missing.json': cannot read a JSON file \(FileNotFoundError"):
        host_from_measured(tmp_path / "missing.json")


def test_shipped_measured_host_files_convert(tmp_path):
    """Every shipped file with a host_spec agrees with its own entries and gives a HostSpec."""
    from hbmsim.scenarios.published import MEASURED_DIR
    for p in sorted(MEASURED_DIR.glob("*.json")):
        doc = json.loads(p.read_text())
        if "host_spec" in doc:
            assert doc["host_spec"] == H.host_fields(doc["results"]), p.name
            host_from_measured(p, defaults=DEFAULT_HOST)


# ---- the PyTorch measurements against a fake PyTorch on the fake clock ----

class FakeTensor:
    """x.add_ costs 6 us (10 us recording autograd, 2 us on meta); backward 15 us + 12 us a node."""

    def __init__(self, clock, device="cuda", grad=False, depth=0):
        self.clock, self.device, self.requires_grad, self.depth, self.grad = clock, device, grad, depth, None

    def add_(self, x):
        self.clock.t += 2 * US if self.device == "meta" else (10 * US if self.requires_grad else 6 * US)
        return self

    def clone(self):
        return FakeTensor(self.clock, self.device, self.requires_grad, self.depth)

    def __mul__(self, x):
        return FakeTensor(self.clock, self.device, self.requires_grad, self.depth + 1)

    def backward(self, grad=None, retain_graph=False):
        self.clock.t += 15 * US + 12 * US * self.depth


class FakeTorch:
    float16, float32 = "float16", "float32"

    def __init__(self, clock):
        tensor = lambda *shape, device="cuda", dtype=None, requires_grad=False: FakeTensor(clock, device,
                                                                                             requires_grad)
        self.zeros = self.ones = self.randn = tensor

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                pass

            def synchronize(self):
                clock.t += 30 * US

            def elapsed_time(self, end):
                return 0.02                     # ms

        class Cuda:
            synchronize = staticmethod(lambda: None)
        self.cuda = Cuda()
        self.cuda.Event = Event

        class F:
            @staticmethod
            def scaled_dot_product_attention(q, k, v):
                clock.t += 25 * US
                return FakeTensor(clock, grad=True)

        class NN:
            functional = F
        self.nn = NN()


def test_torch_entries_and_their_host_fields(fake):
    torch = FakeTorch(fake.clock)
    d = H.torch_dispatch(torch, ops=50, repeats=2)
    assert (d["add_no_grad_s"], d["add_requires_grad_s"], d["add_meta_s"]) == pytest.approx((6 * US, 10 * US, 2 * US))
    assert len(d["add_requires_grad_all_s"]) == 2 and "method" in d
    a = H.autograd_fit(torch, max_nodes=8, repeats=2)
    assert a["nodes"] == list(range(1, 9)) and len(a["host_s"]) == 8
    assert (a["intercept_s"], a["slope_s"]) == pytest.approx((15 * US, 12 * US))
    s = H.sdpa_tiny(torch, repeats=2)
    assert [(r["seq_len"], r["head_dim"]) for r in s["runs"]] == [(128, 64), (512, 64)]
    fwd = s["runs"][0]["forward"]
    assert fwd["event_s"] == pytest.approx(20 * US) and fwd["host_s"] == pytest.approx(25 * US)
    assert fwd["wall_s"] == pytest.approx(55 * US)
    assert set(s["runs"][0]) >= {"forward", "forward+backward", "forward, no grad"}
    # the kernel-row floor: rows of 200 calls, 2.5 us a launch (one kernel a call)
    f = H.kernel_floor(torch, repeats=3, calls=200,
                       rows_of=lambda fn, calls: [{"name": "add", "launches": 1.0, "time_s": 2.5 * US}])
    assert f["kernel_s"] == pytest.approx(2.5 * US) and len(f["kernel_s_all"]) == 3 and "method" in f
    fields = H.host_fields({"host_launch": {"host_s_per_launch": 4 * US}, "host_torch_dispatch": d,
                            "host_autograd": a})
    assert fields == pytest.approx({"launch_s": 4 * US, "eager_op_s": 6 * US, "autograd_node_s": 8 * US,
                                    "backward_start_s": 15 * US})


def test_the_first_kernel_of_a_backward_by_hand():
    """Events read a fake clock: g * 1.5 alone takes 170 us, the backward 198 us: its kernel started 28 us
    after the call (the engine's start, MulBackward0 and its launch)."""
    clock = FakeClock()

    class FakeEvent:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock.t

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3

    class Tensor:
        grad = None

        def __mul__(self, x):
            clock.t += 170 * US
            return Tensor()

        def backward(self, g, retain_graph=False):
            clock.t += 198 * US

    class Torch:
        zeros = ones = staticmethod(lambda *a, **kw: Tensor())

        class cuda:
            Event = FakeEvent
            synchronize = staticmethod(lambda: None)

    r = H.autograd_first_kernel(Torch(), numel=8, repeats=3)
    assert r["kernel_s"] == pytest.approx(170 * US) and r["backward_s"] == pytest.approx(198 * US)
    assert r["pre_kernel_s"] == pytest.approx(28 * US) and "method" in r


def _ptx(tmp_path, source, arch: str) -> str:
    """`source` compiled to PTX for `arch` by nvcc (where the CUDA toolkit is installed)."""
    import subprocess
    from hbmsim.kernels.compile_check import find_nvcc
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    ptx = tmp_path / f"{source.stem}_{arch}.ptx"
    proc = subprocess.run([nvcc, "-std=c++17", f"-arch={arch}", "-ptx", str(source), "-o", str(ptx)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return ptx.read_text()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_host_kernels_compile_for_sm80_and_sm90(tmp_path, arch):
    # every kernel the host entries launch
    text = _ptx(tmp_path, H.HOST_SOURCE, arch)
    for name in ("hbmsim_empty", "hbmsim_spin", "hbmsim_stamp", "hbmsim_block_starts"):
        assert f".entry {name}(" in text, name
    assert "%smid" in text and "%globaltimer" in text


def test_the_clock_sampler_records_power_and_the_clock_reasons(monkeypatch):
    # a fake NVML: the SM clock reads 1980 MHz every time, while the power limit holds it down
    # between samples (sw_power_cap) at 690-700 W, once also hw_slowdown
    import sys
    import types
    from hbmsim.kernels.sm_clock import ClockSampler, throttle_names
    script = iter([(1980, 690_000, 0x4), (1980, 700_000, 0x4 | 0x8), (1965, 695_000, 0x4)])
    current = {}

    def step(*_):
        current.update(zip(("clock", "power", "reasons"), next(script)))
        return current["clock"]
    fake = types.SimpleNamespace(NVML_CLOCK_SM=1, nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: "h",
                                 nvmlDeviceGetClockInfo=step, nvmlDeviceGetPowerUsage=lambda h: current["power"],
                                 nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: current["reasons"])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(ClockSampler, "_run", lambda self, period_s: None)     # no thread: samples by hand
    s = ClockSampler()
    for _ in range(3):
        s.sample()
    w = s.window(0.0)
    assert (w["samples"], w["median"], w["min"], w["max"]) == (3, 1980, 1965, 1980)
    assert (w["power_w_median"], w["power_w_max"]) == (695.0, 700.0)
    assert w["clock_reasons"] == ["sw_power_cap", "hw_slowdown"]
    assert throttle_names(0x1 | 0x400) == ["gpu_idle", "0x400"]
    s.stop()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_rate_kernels_compile_for_sm80_and_sm90(tmp_path, arch):
    # microbench.cu: mma.sync, ex2, the L2's lines against lone sectors, whose CHAINS loads a trip
    # are ld.global.cg (at the L2, not L1)
    text = _ptx(tmp_path, microbench.MICROBENCH_SOURCE, arch)
    for name in ("mma_sync_loop", "ex2_loop", "l2_read_loop", "pointer_chase"):
        assert f".entry {name}(" in text, name
    entries = {e.split("(")[0]: e for e in text.split(".entry ")[1:]}
    assert entries["l2_read_loop"].count("ld.global.cg") == microbench.CHAINS
    assert entries["pointer_chase"].count("ld.global.cg") >= 1       # (the loop unrolled: several, each dependent)


def test_l2_rates_by_hand():
    # 10 warps x 2 trips x 8 loads = 160 warp loads. Lines: 160 x 128 B in 1 us = 20.48 GB/s.
    # Lone sectors: 160 x 32 = 5120 requests; in 8 us each costs 32 B of the line rate
    # (sector-exact, the simulator's count), in 16 us 64 B (a two-sector slot).
    r = microbench.l2_rates(10, 2, 1e-6, 8e-6)
    assert r["warp_loads"] == 160 and r["line_bytes_per_s"] == pytest.approx(2.048e10)
    assert r["sector_requests_per_s"] == pytest.approx(6.4e8)
    assert r["sector_bytes_per_s"] == pytest.approx(2.048e10)
    assert r["l2_sector_cost_bytes"] == pytest.approx(32)
    assert microbench.l2_rates(10, 2, 1e-6, 16e-6)["l2_sector_cost_bytes"] == pytest.approx(64)
