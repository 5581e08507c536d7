"""The GPUs lent on 2026-11-23: an NVIDIA H200 (scenarios/measured/h200-*.json) and an H100 run
again (scenarios/measured/repeats/h100-2026-11-23-*.json).

- The h200-sxm-141gb preset: the H100's GH100 numbers where the die is the same, the datasheet's
  HBM3e numbers, and measured fractions that equal the shipped H200 microbenchmark files exactly.
- The H200 timing set covers the FA2 paper's grid, and `hbmsim validate` reads it with the preset.
- The H100 repeat measured the same grid; how far the two H100 runs are apart is the measurement's
  own spread, which the README quotes beside the model's error.
"""
import dataclasses
import json
import statistics

import pytest

from hbmsim.kernels.library_timing import hardware_preset
from hbmsim.scenarios.published import MEASURED_DIR, measured_names
from hbmsim.scenarios.validate import configs_of
from hbmsim.simulator import GPU

TORCH_H200 = MEASURED_DIR / "h200-torch-fwd-bwd.json"
MICRO_H200 = MEASURED_DIR / "h200-microbench.json"
MICRO_H100 = MEASURED_DIR / "h100-microbench.json"
TORCH_H100 = MEASURED_DIR / "h100-torch-fwd-bwd.json"
REPEAT_H100 = MEASURED_DIR / "repeats" / "h100-2026-11-23-torch-fwd-bwd.json"

# The same GH100 die, clocks, compute-capability 9.0 limits and tensor-core rates as the H100 SXM5.
SAME_AS_H100 = ("sm_count", "clock_hz", "sram_bytes_per_sm", "sram_bytes_per_s_per_sm",
                "matmul_flops_per_s", "vector_flops_per_s", "l2_bytes_per_s", "max_blocks_per_sm",
                "registers_per_sm", "sfu_ops_per_clk_per_sm", "mma_sync_operands_serial", "fp8_matmul_flops_per_s",
                "has_wgmma", "warp_instructions_per_clk_per_sm", "dependent_issue_cycles")
# The HBM3e, and the L2 the driver reports (60 MiB, the full die's, against the H100's 50 MiB).
DIFFERENT_FROM_H100 = ("hbm_bytes_per_s", "hbm_capacity_bytes", "l2_bytes")
# Measured on the H200 itself by the microbenchmarks that measured the H100's.
MEASURED_ON_EACH = ("tensor_achievable_fraction", "hbm_stream_fraction", "mma_sync_fraction", "block_dispatch_s",
                    "l2_sector_request_bytes", "hbm_latency_s", "l2_hit_latency_s",
                    "l2_dirty_fraction")


def _load(path):
    return json.loads(path.read_text())


# (every field's source, and the preset being listed: tests/test_hardware.py, for every preset)


def test_fields_are_partitioned_and_the_die_is_the_h100s(h200, h100):
    names = {f.name for f in dataclasses.fields(GPU)} - {"name", "source"}
    assert set(SAME_AS_H100) | set(DIFFERENT_FROM_H100) | set(MEASURED_ON_EACH) == names
    for f in SAME_AS_H100:
        assert getattr(h200, f) == getattr(h100, f), f
    assert h200.hbm_bytes_per_s == 4.8e12                  # datasheet, 4.8 TB/s
    assert h200.hbm_capacity_bytes == 141_000_000_000      # datasheet, 141 GB (decimal)
    assert h200.l2_bytes == 60 * 1024 * 1024               # cudaDeviceProp.l2CacheSize on the lent H200


def test_measured_fractions_are_the_shipped_microbenchmarks(h200):
    micro = _load(MICRO_H200)
    assert micro["source"] == "measured" and micro["provenance"]["gpu"] == "NVIDIA H200"
    res = micro["results"]
    best_mma = max(v["flops_per_s"] for k, v in res.items() if k.startswith("mma_sync"))
    assert h200.mma_sync_fraction == pytest.approx(best_mma / h200.matmul_flops_per_s, abs=1e-4)
    assert h200.hbm_stream_fraction == pytest.approx(res["dram_copy"]["bytes_per_s"] / h200.hbm_bytes_per_s,
                                                     abs=1e-4)
    gemm = {g["n"]: g["flops_per_s"] for g in _load(TORCH_H200)["gemm"]}
    assert h200.tensor_achievable_fraction == pytest.approx(gemm[8192] / h200.matmul_flops_per_s, abs=1e-4)
    # the preset's L2 is what the lent part reported
    assert _load(TORCH_H200)["provenance"]["l2_bytes"] == h200.l2_bytes


def test_the_copy_is_the_stream_figure_on_the_h100():
    """The H200's DRAM fraction is this project's copy benchmark; on the H100 the same benchmark
    lands within 1% of the published STREAM triad fraction the H100 preset cites (2.97 / 3.35)."""
    copy_h100 = _load(MICRO_H100)["results"]["dram_copy"]["bytes_per_s"]
    assert copy_h100 / 3.35e12 == pytest.approx(2.97 / 3.35, abs=0.01)


def test_the_h200_timing_set_covers_the_paper_grid_and_validate_reads_it():
    doc = _load(TORCH_H200)
    assert doc["source"] == "measured" and doc["provenance"]["gpu"] == "NVIDIA H200"
    runs = doc["runs"]
    assert len(runs) == 2 * 2 * 2 * 6 * 3 and doc["skipped"] == []
    assert {r["hardware"] for r in runs} == {"h200-sxm-141gb"}
    assert hardware_preset("NVIDIA H200", 132) == "h200-sxm-141gb"    # what the tool writes from now on
    assert "h200-torch-fwd-bwd" in measured_names()
    cfgs = configs_of(str(TORCH_H200), runs, only="pytorch", max_seq_len=512)   # head dims x masks x passes
    assert len(cfgs) == 2 * 2 * 3 and cfgs[0][0].gpu.name == "h200-sxm-141gb"


def _by_config(path):
    return {(r["implementation"], r["pass"], r["workload"]["head_dim"], r["workload"]["seq_len"],
             r["workload"]["causal"]): r["time_s"] for r in _load(path)["runs"]}


def test_the_h100_repeat_measured_the_same_grid_within_its_spread():
    first, again = _by_config(TORCH_H100), _by_config(REPEAT_H100)
    assert set(first) == set(again) and len(first) == 144
    change = [again[k] / first[k] - 1 for k in first if k[3] >= 1024]
    # the figures the README quotes (N >= 1024, 120 runs): median +1.0%, median size 1.7%,
    # from -22.7% to +16.6%
    assert statistics.median(change) == pytest.approx(0.010, abs=0.001)
    assert statistics.median(abs(c) for c in change) == pytest.approx(0.017, abs=0.001)
    assert min(change) == pytest.approx(-0.227, abs=0.001) and max(change) == pytest.approx(0.166, abs=0.001)


def test_the_h200_is_the_h100_where_attention_is_compute_bound():
    """FA2 (tensor-bound) runs as fast on the H200 as on the H100; the PyTorch baseline, which moves
    the N x N matrix through HBM, runs faster on the H200's HBM3e. Medians over N >= 1024."""
    h100, h200 = _by_config(TORCH_H100), _by_config(TORCH_H200)

    def ratio(impl, p):
        return statistics.median(h200[k] / h100[k] for k in h100 if k[0] == impl and k[1] == p and k[3] >= 1024)
    assert ratio("fa2", "forward+backward") == pytest.approx(1.0, abs=0.02)
    assert ratio("pytorch", "forward+backward") < 0.85


def _simulated_and_measured(path, impl, p, d, n):
    """(predicted time, measured time) of one non-causal run of a shipped timing set, simulated
    whole as `hbmsim validate` does."""
    from hbmsim.scenarios.runner import run_config
    doc = _load(path)
    runs = [r for r in doc["runs"] if r["implementation"] == impl and r["pass"] == p
            and r["workload"]["head_dim"] == d and r["workload"]["seq_len"] == n and not r["workload"]["causal"]]
    (cfg, run), = configs_of(str(path), runs, only=None, max_seq_len=None)
    predicted = next(res["time_s"] for res in run_config(cfg, count_only=True) if res["pass"] == p)
    return predicted, run["time_s"]


def test_the_model_predicts_the_h200_against_the_h100_from_the_datasheets():
    """Out of sample: the H200 preset saw no attention time. Its HBM3e speeds up PyTorch's
    memory-bound forward (d 128, N = 1024) by what the GPUs measured within 5 points (predicted
    0.840x with the host's dispatch, the block scheduler's measured stagger and each GPU's measured
    lone-sector rate at the L2 on both, measured 0.805x against the H100 the same day; 0.847x with
    32 bytes of the L2 pipe a lone sector on both, 0.844x with that and every SM starting at once,
    0.848x before each GPU's own measured load latencies), and
    leaves FA2's forward, which the
    tensor pipe and the warps' issue bound, where it was (predicted 1.004x: the H200's mma.sync
    measured 0.9% slower, 0.6586 of the peak against 0.6643; 1.000x before warp_issue, when the
    softmax hid some of it). (0.838x before the
    transposing copy's sector requests were counted at the L2, tensor.GATHER: that copy is now
    bound by the L2, which is the same on both GPUs, where the measured copies ran 0.90x; 0.847x
    before the benchmark's 12 forward ops were counted one by one, FORWARD_HOST_OPS.)"""
    p200, m200 = _simulated_and_measured(TORCH_H200, "pytorch", "forward", 128, 1024)
    p100, m100 = _simulated_and_measured(REPEAT_H100, "pytorch", "forward", 128, 1024)
    assert p200 / p100 == pytest.approx(0.840, abs=0.001)
    assert m200 / m100 == pytest.approx(0.805, abs=0.001)
    assert abs(p200 / p100 - m200 / m100) < 0.05
    f200, _ = _simulated_and_measured(TORCH_H200, "fa2", "forward", 128, 1024)
    f100, _ = _simulated_and_measured(REPEAT_H100, "fa2", "forward", 128, 1024)
    assert f200 / f100 == pytest.approx(1.004, abs=0.001)


def test_nsight_on_the_h200_shows_the_operand_reads_and_the_mma_adding_up(h200):
    """mma_sync_operands_serial = 1 on the H200 rests on its own Nsight run: in FA2's forward
    (d 128, N = 4096) the tensor pipe and the shared-memory pipe are busy 105% of the cycles
    together, so they cannot have overlapped much, as on the H100 (56.7% + 48.2%)."""
    (run,) = _load(MEASURED_DIR / "h200-ncu-kernels.json")["runs"]
    (k,) = [k for k in run["kernels"] if "flash_fwd_kernel" in k["name"]]
    tensor = k["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"]
    shared = k["shared_pipe_busy_pct"]
    assert tensor == pytest.approx(56.68, abs=0.01) and shared == pytest.approx(48.30, abs=0.01)
    assert tensor + shared > 100 and h200.mma_sync_operands_serial == 1
    assert k["launch__registers_per_thread"] == 255        # FA2_KERNEL_REGISTERS_PER_THREAD, as on the H100
