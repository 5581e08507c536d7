"""A pass as if run alone (SimResult.run_alone, Machine._note_writeback_alone): the forward of a
training simulation plus the L2 write-back a forward-only run ends with is that forward-only run,
field for field. validate relies on it to simulate one training run for a workload's forward-only
and training measurements (validate.share_training_runs)."""
import json
from pathlib import Path

import pytest

from hbmsim.algorithms.workload import Workload
from hbmsim.scenarios import validate as V
from hbmsim.scenarios.experiment import Config, Experiment, RunSpec
from hbmsim.scenarios.runner import prepare, run_config
from hbmsim.simulator import load_gpu

HW = Path(__file__).resolve().parents[1] / "scenarios" / "hardware"
A100, H100 = load_gpu(HW / "a100-sxm4-80gb.toml"), load_gpu(HW / "h100-sxm5-80gb.toml")
SKIP = {"sim_events", "alone", "max_abs_error"}     # what the simulation did, not what it predicts


def config(gpu, wl, passes, algorithm, variant) -> Config:
    cfg = Config(gpu, wl, RunSpec(algorithm, passes, {"variant": variant} if variant else {}))
    return prepare(Experiment("alone", "test", gpu, [cfg])).configs[0]


def differences(a, b, path="") -> list:
    """Where two result dicts differ: floats beyond 1e-12 relative, anything else at all."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted((set(a) | set(b)) - SKIP) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if a == pytest.approx(b, rel=1e-12) else [(path, a, b)]
    return [] if a == b else [(path, a, b)]


CASES = [  # (gpu, workload, program, variant, fast): folded, sliced, causal, GQA, the standard kernels, FA3
    (H100, Workload(4, 8, 512, 512, 64, causal=True), "flash2", "fa2-kernel", True),
    (A100, Workload(2, 8, 384, 384, 128), "flash2", None, False),
    (H100, Workload(2, 8, 256, 256, 64, kv_heads=2), "flash2", None, True),
    (A100, Workload(4, 8, 512, 512, 64), "flash1", "fa1-kernel", True),
    (H100, Workload(4, 4, 512, 512, 64, causal=True), "standard", "pytorch-bench", True),
    (H100, Workload(2, 4, 512, 512, 128), "flash3", None, True),
]


@pytest.mark.parametrize("gpu, wl, algorithm, variant, fast", CASES)
def test_a_training_runs_forward_alone_is_the_forward_only_run(gpu, wl, algorithm, variant, fast):
    alone_run = config(gpu, wl, ("forward",), algorithm, variant)
    training = config(gpu, wl, ("forward", "backward"), algorithm, variant)
    assert alone_run.mapping == training.mapping
    forward = run_config(alone_run, count_only=True, fast=fast)
    results = run_config(training, count_only=True, fast=fast, forward_alone=True)
    assert [(r["pass"], r.get("alone", False)) for r in results] == [
        ("forward", False), ("backward", False), ("forward+backward", False), ("forward", True)]
    assert differences(forward[0], results[-1]) == []
    # what differs from the training run's own forward: the write-back at the forward's end (the
    # training run writes the forward's dirty lines back at the program's end, if still there)
    inside = results[0]
    launched = [k["name"] for k in inside["kernels"] if k["name"] != "l2_writeback"]
    assert [k["name"] for k in forward[0]["kernels"]] == launched + ["l2_writeback"]
    assert forward[0]["hbm_read_bytes"] == inside["hbm_read_bytes"]
    assert sum(t["hbm_write"] for t in forward[0]["kernels"][-1]["tensors"].values()) > 0


def test_run_without_forward_alone_gives_the_passes_only():
    cfg = config(H100, Workload(2, 4, 256, 256, 64), ("forward", "backward"), "flash2", None)
    passes = [r["pass"] for r in run_config(cfg, count_only=True, fast=True)]
    assert passes == ["forward", "backward", "forward+backward"]
    fwd = config(H100, Workload(2, 4, 256, 256, 64), ("forward",), "flash2", None)
    assert [r["pass"] for r in run_config(fwd, count_only=True, forward_alone=True)] == ["forward"]


def test_validate_simulates_one_training_run_for_forward_and_training_measurements(tmp_path):
    """A measured file with the forward, backward and forward+backward runs of one workload, and a
    forward-only run of another: two simulations, and the points as if each were simulated alone."""
    wl = {"batch": 2, "heads": 4, "seq_len": 256, "head_dim": 64, "causal": True, "dtype": "fp16"}
    other = dict(wl, seq_len=512)
    runs = [{"hardware": "h100-sxm5-80gb", "algorithm": "flash2", "variant": "fa2-kernel", "workload": w,
             "pass": p, "time_s": t, "global_read_bytes": 1, "global_write_bytes": 1, "hbm_read_bytes": 1,
             "hbm_write_bytes": 1}
            for w, p, t in ((wl, "forward", 1e-5), (wl, "backward", 3e-5), (wl, "forward+backward", 4e-5),
                            (other, "forward", 2e-5))]
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"source": "measured", "provenance": {"note": "test"}, "runs": runs}))
    configs, jobs = V.plan([str(path)])
    assert len(configs) == 3                               # (wl forward), (wl training), (other forward)
    shared, shared_jobs = V.share_training_runs(prepare(Experiment("v", "v", configs[0].gpu, configs)).configs, jobs)
    assert [c.run.passes for c in shared] == [("forward", "backward"), ("forward",)]
    assert [j.config for j in shared_jobs] == [0, 0, 0, 1]
    points = V.validate([str(path)], workers=1)
    for p, r in zip(points, runs):
        cfg = config(H100, Workload(2, 4, r["workload"]["seq_len"], r["workload"]["seq_len"], 64, causal=True),
                     ("forward",) if r["pass"] == "forward" else ("forward", "backward"), "flash2", "fa2-kernel")
        alone = next(x for x in run_config(cfg, count_only=True, fast=True) if x["pass"] == r["pass"])
        assert p.predicted_s == pytest.approx(alone["time_s"], rel=1e-12), r["pass"]
        assert p.predicted_kernel_s == pytest.approx(alone["kernel_time_s"], rel=1e-12), r["pass"]
