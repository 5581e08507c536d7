"""The files two lent GPUs measured on 2026-11-26 (scenarios/measured/h100-*, h200-*; provenance in
each, docs/measured-data.md): what the time model's new effects and the presets cite from them
holds in the files, worked out from the raw counters.

- Nsight Compute on cuDNN's sm90 attention forward, N = 4096 (batch 4, hidden 2048): the wgmma
  FLOPs it counts are 4 B H N^2 d exactly, they fill 95-99% of the tensor pipe's active cycles at
  4096 FLOPs a clock an SM (wgmma_full_rate), and the tensor and XU pipes are busy 100-116% of the
  cycles together (xu_tensor_serial).
- The host files: their host_spec is host_fields of their own entries; the block scheduler's first
  wave lands within two timer ticks, and the presets' block_dispatch_s is the file's per_block_s
  (the timer's tick over the wave's blocks, under 1.8 ns); a lone L2 sector costs at most the 32
  bytes the presets charge.
"""
import json

import pytest

from hbmsim.kernels.host_microbench import host_fields
from hbmsim.scenarios.experiment import resolve_hardware
from hbmsim.scenarios.published import MEASURED_DIR
from hbmsim.simulator.host import DEFAULT_HOST, host_from_measured

GPUS = ("h100", "h200")
N, TOKENS, HIDDEN = 4096, 16384, 2048
PEAK_PER_CLK_PER_SM = 4096           # fp16 dense wgmma FLOPs a clock an SM (989.4e12 / 132 / 1.83e9)


def _kernels(gpu: str) -> dict:
    """(pass, head dim) -> cuDNN's fused kernel's summary, from the two Hopper ncu files."""
    out = {}
    for name in (f"{gpu}-ncu-hopper.json", f"{gpu}-ncu-pipes.json"):
        doc = json.loads((MEASURED_DIR / name).read_text())
        assert doc["source"] == "measured" and doc["provenance"]["gpu"]
        for run in doc["runs"]:
            _, impl, d, n, pass_name = run["file"].removesuffix(".csv").split("-")
            if impl != "cudnn":
                continue
            (k,) = [k for k in run["kernels"] if "sdpa" in k["name"]]
            out[(pass_name, int(d))] = k
    return out


@pytest.mark.parametrize("gpu", GPUS)
def test_cudnn_runs_its_exps_after_its_gemms_at_the_full_rate(gpu):
    ks = _kernels(gpu)
    assert {(p, d) for p, d in ks} == {("forward", 64), ("forward", 128), ("forward", 256), ("backward", 64),
                                        ("backward", 128)}
    for (pass_name, d), k in ks.items():
        batch, heads = TOKENS // N, HIDDEN // d
        flops = 4 * batch * heads * N * N * d * (2.5 if pass_name == "backward" else 1)   # S, P V (+ 3 more)
        assert k["sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum"] == flops
        cycles = k["gpu__time_duration.sum"] * 1e-9 * k["sm__cycles_elapsed.avg.per_second"]
        at_peak = 100 * flops / (132 * PEAK_PER_CLK_PER_SM * cycles)          # % of cycles at the full rate
        tensor = k["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"]
        assert k["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"] == tensor
        assert 0.95 <= at_peak / tensor <= 0.99, (pass_name, d)               # wgmma_full_rate
        xu = k["sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"]
        if pass_name == "forward":                                            # xu_tensor_serial
            assert 100 <= tensor + xu <= 116, d
    # the forward's three head dims, as time_model.py quotes them
    both = {d: round(ks[("forward", d)]["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"]
                     + ks[("forward", d)]["sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"], 1)
            for d in (64, 128, 256)}
    assert both == {"h200": {64: 102.8, 128: 114.2, 256: 102.2}, "h100": {64: 102.7, 128: 114.2, 256: 101.9}}[gpu]


@pytest.mark.parametrize("gpu", GPUS)
def test_the_host_files(gpu):
    path = MEASURED_DIR / f"{gpu}-host.json"
    doc = json.loads(path.read_text())
    assert doc["source"] == "measured" and doc["provenance"]["gpu"].startswith("NVIDIA H")
    assert doc["host_spec"] == host_fields(doc["results"])
    h = host_from_measured(path, DEFAULT_HOST)
    assert 5e-6 < h.launch_s < 8e-6 and 1e-6 < h.launch_gap_s < 2e-6 and h.queue_launches == 1021
    preset = resolve_hardware({"h100": "h100-sxm5-80gb", "h200": "h200-sxm-141gb"}[gpu])
    bd = doc["results"]["block_dispatch"]
    assert all(r["sms_reached"] == 132 for r in bd["runs"])
    assert bd["first_wave_spread_s"] <= 2 * bd["globaltimer_resolution_s"]
    # the reading: one tick (0.24 us) over the wave's 264 blocks less one, 0.9 ns a block
    assert bd["per_block_s"] == pytest.approx(bd["globaltimer_resolution_s"] / 263, rel=1e-12)
    assert preset.block_dispatch_s == pytest.approx(bd["per_block_s"], rel=1e-3) and preset.block_dispatch_s < 1.8e-9
    # a lone sector's share of the L2 pipe: the pipe's rate over the measured lone-sector request rate
    # (66 B on the H100, 58 on the H200), not the bytes of the same run's own coalesced rate (23.7-27.0)
    lone = doc["results"]["l2_read_lines_vs_sectors"]
    assert preset.l2_sector_request_bytes == round(preset.l2_bytes_per_s / lone["sector_requests_per_s"])
    assert preset.l2_sector_request_bytes == {"h100": 66, "h200": 58}[gpu]
    assert 16 < lone["l2_sector_cost_bytes"] < 32 and lone["line_bytes_per_s"] < 0.42 * preset.l2_bytes_per_s


@pytest.mark.parametrize("gpu", GPUS)
def test_the_l2_store_retention_files(gpu):
    """kernels/store_retention.py under Nsight Compute (2026-11-27): a store-only kernel that stores
    S bytes into an L2 flushed before it writes S less what it leaves dirty to DRAM. Up to 16 MiB
    nothing reaches DRAM; past the L2's size the residue is flat (within 3%); the preset's
    l2_dirty_fraction is the median residue of the 64-256 MiB kernels over the L2's bytes: 0.4706
    of the H100's 50 MiB, 0.4638 of the H200's 60 MiB. A copy kernel's reads leave it less room."""
    import statistics
    doc = json.loads((MEASURED_DIR / f"{gpu}-l2-store-retention.json").read_text())
    assert doc["source"] == "measured" and doc["provenance"]["gpu"][0].startswith("NVIDIA H")
    preset = resolve_hardware({"h100": "h100-sxm5-80gb", "h200": "h200-sxm-141gb"}[gpu])
    rows = {(r["mode"], r["stored_bytes"] >> 20): r for r in doc["retention"]}
    assert len(rows) == 26
    for (mode, mib), r in rows.items():
        assert r["dirty_at_end_bytes"] == r["stored_bytes"] - r["dram_write_bytes"]
        if mib <= 16:
            assert r["dram_write_bytes"] < 2**20
        if mode == "store":
            assert r["dram_read_bytes"] < 2**20 <= r["stored_bytes"] <= r["dram_read_bytes"] + r["stored_bytes"]
    big = [rows["store", m]["dirty_at_end_bytes"] for m in (64, 96, 128, 256)]
    assert max(big) < 1.03 * min(big)
    assert preset.l2_dirty_fraction == pytest.approx(statistics.median(big) / preset.l2_bytes, abs=1e-4)
    assert preset.l2_dirty_fraction == {"h100": 0.4706, "h200": 0.4638}[gpu]
    for m in (64, 96, 128, 256):
        assert rows["copy", m]["dirty_at_end_bytes"] < rows["store", m]["dirty_at_end_bytes"]
