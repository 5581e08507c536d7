"""The A100 SXM4 80GB preset: its HBM numbers, a source for every field, and the same numbers as the
40GB preset wherever the hardware is the same."""
import dataclasses

import pytest

from hbmsim.scenarios.cli import main
from hbmsim.scenarios.experiment import HARDWARE_DIR, preset_names
from hbmsim.simulator import GPU, load_gpu

# Same GA100 die, clocks, caches and compute-capability limits as the 40GB part (and the same latency source).
SAME_AS_40GB = ("sm_count", "clock_hz", "hbm_latency_s", "sram_bytes_per_sm", "sram_bytes_per_s_per_sm",
                "matmul_flops_per_s", "vector_flops_per_s", "l2_bytes", "l2_bytes_per_s", "max_blocks_per_sm",
                "mma_sync_fraction", "sfu_ops_per_clk_per_sm", "tensor_achievable_fraction", "registers_per_sm",
                "mma_sync_operands_serial", "fp8_matmul_flops_per_s", "has_wgmma",
                "warp_instructions_per_clk_per_sm", "dependent_issue_cycles")
# Only the HBM2e differs.
DIFFERENT_FROM_40GB = ("hbm_bytes_per_s", "hbm_capacity_bytes")
# Measured on each part by the same microbenchmark (gpu-benches' STREAM triad): 1759 / 2039 and 1360 / 1555;
# block_dispatch_s, l2_sector_request_bytes and l2_hit_latency_s: by `hbmsim microbench` on each part,
# when one is lent; l2_dirty_fraction by kernels/store_retention.py.
MEASURED_ON_EACH = ("hbm_stream_fraction", "block_dispatch_s", "l2_sector_request_bytes", "l2_hit_latency_s",
                    "l2_dirty_fraction")


@pytest.fixture(scope="module")
def a100_80():
    return load_gpu(HARDWARE_DIR / "a100-sxm4-80gb.toml")


@pytest.fixture(scope="module")
def a100_40():
    return load_gpu(HARDWARE_DIR / "a100-sxm4-40gb.toml")


def test_name_and_listed(a100_80):
    assert a100_80.name == "a100-sxm4-80gb"
    assert "a100-sxm4-80gb" in preset_names()


def test_distinguishing_numbers(a100_80):
    assert a100_80.hbm_bytes_per_s == 2039e9          # datasheet, A100 80GB SXM, 2,039 GB/s (spec-sheet peak)
    assert a100_80.hbm_capacity_bytes == 80_000_000_000  # datasheet 80 GB, decimal like the 40GB preset's 40e9
    assert isinstance(a100_80.hbm_capacity_bytes, int)


def test_fields_are_partitioned():
    names = {f.name for f in dataclasses.fields(GPU)} - {"name", "source"}
    assert set(SAME_AS_40GB) | set(DIFFERENT_FROM_40GB) | set(MEASURED_ON_EACH) == names
    assert not set(SAME_AS_40GB) & set(DIFFERENT_FROM_40GB)


def test_stream_fractions(a100_80, a100_40):
    assert a100_80.hbm_stream_fraction == pytest.approx(1759 / 2039, abs=1e-4)
    assert a100_40.hbm_stream_fraction == pytest.approx(1360 / 1555, abs=1e-4)


@pytest.mark.parametrize("field", SAME_AS_40GB)
def test_same_as_40gb_where_hardware_is_same(a100_80, a100_40, field):
    assert getattr(a100_80, field) == getattr(a100_40, field)


@pytest.mark.parametrize("field", DIFFERENT_FROM_40GB)
def test_hbm_differs_from_40gb(a100_80, a100_40, field):
    assert getattr(a100_80, field) > getattr(a100_40, field)


def test_values(a100_80):
    assert (a100_80.sm_count, a100_80.clock_hz) == (108, 1.41e9)
    assert a100_80.matmul_flops_per_s == 312e12 and a100_80.vector_flops_per_s == 19.5e12
    assert a100_80.l2_bytes == 40 * 1024 * 1024 and a100_80.sram_bytes_per_sm == 163 * 1024
    assert a100_80.max_blocks_per_sm == 32


def test_cli_prints_it(capsys):
    assert main(["hardware", "a100-sxm4-80gb"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert lines["name"].split()[1] == "a100-sxm4-80gb"
    assert float(lines["hbm_bytes_per_s"].split()[1]) == 2039e9
    assert lines["hbm_capacity_bytes"].split()[1] == "80000000000"
    assert "2,039 GB/s" in lines["hbm_bytes_per_s"]
    for f in dataclasses.fields(GPU):
        if f.name not in ("name", "source"):   # `name` is the preset's own name, not a number with a source
            assert "(no source given)" not in lines[f.name], f.name


def test_cli_lists_it(capsys):
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert "a100-sxm4-80gb" in out and "2.039 TB/s" in out
