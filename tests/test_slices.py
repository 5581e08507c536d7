"""Fast mode's slices (scenarios/runner.py: slice_factor, sliced; GPU.slice_of; SimResult.scaled): a
program with alike batch-heads that fold.py cannot fold (flash1) runs on 1/k of the GPU with 1/k of
its batch, its counts taken k times. Checked against the full simulation."""
import dataclasses
from pathlib import Path

import pytest

from hbmsim.algorithms.workload import Workload
from hbmsim.scenarios.experiment import Config, Experiment, RunSpec
from hbmsim.scenarios.runner import prepare, run_config, slice_factor
from hbmsim.simulator import load_gpu

HW = Path(__file__).resolve().parents[1] / "scenarios" / "hardware"
A100, H100 = load_gpu(HW / "a100-sxm4-80gb.toml"), load_gpu(HW / "h100-sxm5-80gb.toml")


def config(gpu, wl, passes=("forward",), algorithm="flash1", variant="fa1-kernel") -> Config:
    cfg = Config(gpu, wl, RunSpec(algorithm, passes, {"variant": variant}))
    return prepare(Experiment("slices", "test", gpu, [cfg])).configs[0]


def slice_against_full(cfg) -> tuple[dict, dict]:
    """cfg's last result in fast mode (a slice) and in full: L2-side bytes, FLOPs, exps and the
    footprint equal, time within 1%, DRAM bytes within 2%."""
    fast, full = run_config(cfg, count_only=True, fast=True)[-1], run_config(cfg, count_only=True)[-1]
    for f in ("global_read_bytes", "global_write_bytes", "matmul_flops", "vector_flops", "exp_ops", "hbm_peak_bytes"):
        assert fast[f] == full[f], f
    assert fast["time_s"] == pytest.approx(full["time_s"], rel=0.01)
    for f in ("hbm_read_bytes", "hbm_write_bytes"):
        assert fast[f] == pytest.approx(full[f], rel=0.02), f
    return fast, full


def test_a_slice_is_a_kth_of_the_gpu():
    """A100: 108 SMs; a quarter has 27, with a quarter of the DRAM bandwidth and capacity, the L2
    and its bandwidth, and the whole-GPU compute rates; per-SM figures unchanged."""
    q = A100.slice_of(4)
    assert (q.sm_count, q.hbm_bytes_per_s, q.hbm_capacity_bytes) == (27, 2039e9 / 4, 20_000_000_000)
    assert (q.l2_bytes, q.l2_bytes_per_s) == (40 * 1024 * 1024 // 4, A100.l2_bytes_per_s / 4)
    assert q.matmul_flops_per_s == pytest.approx(312e12 / 4) and q.vector_flops_per_s == pytest.approx(19.5e12 / 4)
    assert (q.sram_bytes_per_sm, q.sram_bytes_per_s_per_sm, q.clock_hz) == (A100.sram_bytes_per_sm,
                                                                             A100.sram_bytes_per_s_per_sm, 1.41e9)


def test_which_runs_are_sliced():
    wl = Workload(4, 32, 1024, 1024, 64)
    assert slice_factor(config(A100, wl)) == 4                                  # 108 = 4 x 27, batch 4
    assert slice_factor(config(H100, dataclasses.replace(wl, batch=1))) == 4   # 132 = 4 x 33, heads 32
    assert slice_factor(config(A100, dataclasses.replace(wl, batch=2, heads=2, kv_heads=2))) == 2
    assert slice_factor(config(A100, dataclasses.replace(wl, batch=3, heads=3, kv_heads=3))) == 1
    assert slice_factor(config(A100, dataclasses.replace(wl, key_padding_mask=True))) == 1   # lengths differ
    assert slice_factor(config(A100, wl, algorithm="flash2", variant="fa2-kernel")) == 1      # fold.py's
    assert slice_factor(config(A100, wl, algorithm="standard", variant="pytorch-bench")) == 4
    # its causal mask, shared by every batch-head, is reused through the L2 alike in a slice and the
    # whole GPU when a batch-head's mask pass (S, mask and output panels: 3 x N x N x 2 bytes) fits a
    # quarter of the L2 (N = 1024: 6 MiB <= 10 MiB) or exceeds the whole L2 (N = 4096: 96 MiB > 40 MiB)
    for n, k in ((1024, 4), (2048, 1), (4096, 4)):
        causal = dataclasses.replace(wl, seq_len_q=n, seq_len_kv=n, causal=True)
        assert slice_factor(config(A100, causal, algorithm="standard", variant="pytorch-bench")) == k, n


@pytest.mark.parametrize("gpu, passes, causal", [(A100, ("forward",), False), (A100, ("forward",), True),
                                                 (H100, ("forward", "backward"), False)])
def test_a_slice_counts_exactly_and_times_within_a_percent(gpu, passes, causal):
    """FA1's kernel, batch 4 x 16 heads, N = 1024, head dim 64: fast mode (a quarter of the GPU)
    against the full simulation: L2-side bytes, FLOPs and the footprint exact, time within 1%,
    DRAM bytes within 2%, and the result says a quarter of the blocks was simulated."""
    fast, full = slice_against_full(config(gpu, Workload(4, 16, 1024, 1024, 64, causal=causal), passes))
    assert fast["simulated_fraction"] == pytest.approx(full["simulated_fraction"] / 4)


def test_pytorch_attention_on_a_slice_against_the_full_simulation():
    """The FA2 paper's PyTorch baseline, training, batch 4 x 8 heads, N = 512, head dim 64, H100:
    a quarter of the GPU against the full simulation, the same checks."""
    fast, full = slice_against_full(config(H100, Workload(4, 8, 512, 512, 64), ("forward", "backward"), "standard",
                                           "pytorch-bench"))
    assert fast["slice_of"] == 4 and full["slice_of"] == 1


def test_causal_pytorch_attention_on_a_slice_builds_its_shared_mask_once():
    """PyTorch's causal attention builds one N x N mask for every batch-head (causal_full,
    causal_triu, causal_to_dtype). On a quarter of the GPU those launches run one block in four
    (program.slice_shared), so four times their counts are the whole launch's (their times, about
    2 us each here, within 12%; the passes' within 1%: slice_against_full); the mask is held once
    in the footprint (Tensor.shared). Training, batch 4 x 16 heads, N = 1024, head dim 64, H100,
    against the full simulation."""
    cfg = config(H100, Workload(4, 16, 1024, 1024, 64, causal=True), ("forward", "backward"), "standard",
                 "pytorch-bench")
    fast, full = slice_against_full(cfg)
    assert fast["slice_of"] == 4
    kernels = {k["name"]: k for k in run_config(cfg, count_only=True, fast=True)[0]["kernels"]}
    whole = {k["name"]: k for k in run_config(cfg, count_only=True)[0]["kernels"]}
    for name in ("causal_full", "causal_triu", "causal_to_dtype"):
        # 1024 rows in panels of 128: 8 blocks, two of which ran on the slice
        assert kernels[name]["grid"] == whole[name]["grid"] == 8
        for f in ("global_read_bytes", "global_write_bytes", "hbm_peak_bytes"):
            assert kernels[name][f] == whole[name][f], (name, f)
    # the fp32 mask written once: 1024 x 1024 x 4 bytes
    assert kernels["causal_full"]["global_write_bytes"] == 1024 * 1024 * 4


def test_a_shared_launch_that_does_not_split_evenly_is_not_sliced():
    """slice_shared runs blocks 0, k, 2k, ... of a shared launch; with a grid that k does not
    divide there is no such even split, and the program is refused (runner: the run stays whole)."""
    from hbmsim.simulator import Launch, Program, slice_shared

    def block(ctx, index):
        yield from ()
    program = Program("p", [Launch("mask", 6, 0, block, shared=True), Launch("gemm", 7, 0, block)])
    halves = slice_shared(program, 2)
    assert [launch.grid for launch in halves.launches] == [3, 7]
    assert slice_shared(program, 4) is None
