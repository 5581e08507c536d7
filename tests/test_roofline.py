"""The roofline: kernels placed from a run's own counters; standard attention's elementwise kernels
on the DRAM slope, flash2 near the compute roofs."""
import pytest

from hbmsim.algorithms.workload import Workload
from hbmsim.scenarios import roofline
from hbmsim.scenarios.cli import main
from hbmsim.scenarios.experiment import Config, RunSpec
from hbmsim.scenarios.runner import run_config


@pytest.fixture(scope="module")
def results(a100):
    wl = Workload(2, 16, 1024, 1024, 64)
    return [r for alg in ("standard", "flash2") for r in run_config(Config(a100, wl, RunSpec(alg)), count_only=True)]


def test_points_come_from_the_counters(results):
    pts = roofline.kernel_points(results)
    k = next(k for r in results if r["algorithm"] == "standard" for k in r["kernels"] if k["name"] == "softmax")
    p = next(p for p in pts if p.label.startswith("standard forward softmax"))
    assert p.flops == k["matmul_flops"] + k["vector_flops"]
    assert p.dram_bytes == k["hbm_read_bytes"] + k["hbm_write_bytes"]
    assert p.flops_per_s == pytest.approx(p.flops / k["time_s"])


def test_memory_bound_kernels_sit_on_the_slope_and_flash_under_the_roofs(results, a100):
    pts = {p.label.split(" (N=")[0]: p for p in roofline.kernel_points(results)}
    stream = a100.hbm_bytes_per_s * a100.hbm_stream_fraction
    softmax = pts["standard forward softmax"]
    # memory-bound: its FLOP/s is its intensity times the DRAM rate it gets, no more, and not far less
    assert 0.7 * stream * softmax.intensity <= softmax.flops_per_s <= stream * softmax.intensity * 1.001
    flash = pts["flash2 forward flash2_fwd"]
    assert flash.intensity > 100 and 0.3 * a100.matmul_flops_per_s < flash.flops_per_s < a100.matmul_flops_per_s
    r = roofline.roofs(a100)
    assert r["flat"]["tensor cores (peak)"] == 312e12 and r["flat"]["FP32 (peak)"] == 19.5e12
    assert r["flat"]["exp on the SFU (exps/s)"] == pytest.approx(16 * 108 * 1.41e9)
    assert r["slopes"]["DRAM (STREAM)"] == pytest.approx(1360e9, rel=1e-4)


def test_run_roofline_writes_a_figure_and_checks_its_path_first(tmp_path, capsys):
    png = tmp_path / "roof.png"
    assert main(["run", "small-masked", "--count-only", "--roofline", str(png)]) == 0
    assert png.stat().st_size > 10000
    capsys.readouterr()
    assert main(["run", "small-masked", "--count-only", "--roofline", str(tmp_path / "x.unknownfmt")]) == 2
    err = capsys.readouterr().err
    assert "x.unknownfmt" in err and "[1/3]" not in err and len(err.strip().splitlines()) == 1   # before any work
