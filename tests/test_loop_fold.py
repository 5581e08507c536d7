"""Steady loops (simulator/loop_fold.py): in fast mode, a launch of one wave whose blocks loop over
alike iterations skips the same stretch of every block's loop once all are steady, counting the
skipped iterations and adding their time. Checked against the same launch simulated whole."""
import pytest

from hbmsim.simulator import Launch, Program, Tensor, simulate
from hbmsim.simulator.loop_fold import HALF_WINDOW, steady_window

from conftest import tiny_gpu

ITERATIONS = 120
ROWS = 8                     # a tile: 8 rows x 64 bytes = 512 B


def looping_program(grid: int) -> Program:
    """`grid` blocks, each loading tile i of its own rows, computing on it and storing it, for
    ITERATIONS alike iterations (iteration 0 loads nothing: it differs, as FA1's first key block)."""
    src = Tensor("src", (grid, ITERATIONS * ROWS, 64), "bool", count_only=True)
    dst = Tensor("dst", (grid, ITERATIONS * ROWS, 64), "bool", count_only=True)
    cols = slice(0, 64)

    def block(ctx, b):
        loop = ctx.steady_loop(1, ITERATIONS - 1)
        j = -1
        while j + 1 < ITERATIONS:
            j = loop.next(j + 1)
            rows = slice(j * ROWS, (j + 1) * ROWS)
            if j > 0:
                yield from ctx.load(src[b], rows, cols)
            yield from ctx.compute(matmul_flops=2_000_000 + 1000 * b, vector_flops=5000)
            ctx.store(dst[b], rows, cols)
    return Program("loops", [Launch("loops", grid, 0, block, allocs=(dst,))], inputs=(src,))


def by_kernel(result) -> dict:
    k = result.kernels[0]
    return {"time_s": k.time_s, "read": k.total("read"), "write": k.total("write"), "hbm_read": k.total("hbm_read"),
            "hbm_write": k.total("hbm_write"), "matmul_flops": k.matmul_flops, "vector_flops": k.vector_flops,
            "folded_blocks": k.folded_blocks}


def test_a_steady_wave_skips_its_loops_within_a_tenth_of_a_percent():
    """24 blocks on 4 SMs of 8 slots (one wave), their iterations 0.05% apart in compute: fast mode
    skips part of every loop; bytes and FLOPs equal the whole run's (no L2: DRAM bytes are the
    tiles', exact), the time within 0.1%, and the result says a part was not simulated."""
    gpu = tiny_gpu()
    whole = by_kernel(simulate(gpu, looping_program(24)))
    fast = by_kernel(simulate(gpu, looping_program(24), fold=True))
    for f in ("read", "write", "hbm_read", "hbm_write", "matmul_flops", "vector_flops"):
        assert fast[f] == whole[f], f
    assert whole["read"] == 24 * (ITERATIONS - 1) * ROWS * 64
    assert fast["time_s"] == pytest.approx(whole["time_s"], rel=1e-3)
    assert whole["folded_blocks"] == 0 and 0 < fast["folded_blocks"] < 24


def test_a_staggered_wave_still_skips_within_a_tenth_of_a_percent():
    """The same wave with the block scheduler's stagger (SM i starting i x 0.9 ns late, the H100's and
    H200's measured block_dispatch_s, and 1 us, a thousand times that): every block's loop is offset
    by its SM's start, and the skip is still taken, bytes and FLOPs equal, the time within 0.1% of
    the staggered wave simulated whole. (The presets' stagger used to keep loops from folding.)"""
    for stagger_s in (9.065e-10, 1e-6):
        gpu = tiny_gpu(block_dispatch_s=stagger_s)
        whole = by_kernel(simulate(gpu, looping_program(24)))
        fast = by_kernel(simulate(gpu, looping_program(24), fold=True))
        for f in ("read", "write", "hbm_read", "hbm_write", "matmul_flops", "vector_flops"):
            assert fast[f] == whole[f], (stagger_s, f)
        assert fast["time_s"] == pytest.approx(whole["time_s"], rel=1e-3), stagger_s
        assert whole["folded_blocks"] == 0 and 0 < fast["folded_blocks"] < 24, stagger_s
    # the stagger is in the time: the last SM starts 3 x 1 us late (4 SMs)
    unstaggered = by_kernel(simulate(tiny_gpu(), looping_program(24)))["time_s"]
    assert by_kernel(simulate(tiny_gpu(block_dispatch_s=1e-6), looping_program(24)))["time_s"] > unstaggered


def test_two_waves_never_skip():
    """40 blocks on 32 slots: a block waits for a slot, so no loop is skipped."""
    assert by_kernel(simulate(tiny_gpu(), looping_program(40), fold=True))["folded_blocks"] == 0


def test_the_steady_rule_by_hand():
    """Two means of HALF_WINDOW iterations within 0.5%: steady; a trend of 1% is not."""
    even = [10.0 * i for i in range(2 * HALF_WINDOW + 1)]
    assert steady_window(even) == 2 * HALF_WINDOW
    assert steady_window(even[:-1]) == 0                       # too few iterations yet
    slowing = [10.0 * i + 0.01 * i * i for i in range(2 * HALF_WINDOW + 1)]
    assert steady_window(slowing) == 0


def test_the_fa1_kernel_forward_skips_steady_key_blocks_within_a_percent():
    """FA1's forward (the v1 kernel: one block per batch-head and split, a loop over 64 key blocks
    of 128 keys at head dim 128) at N = 8192, batch 1, 4 heads, on an A100 cut to 16 SMs: one wave.
    Fast mode (no slice: 4 heads on 16 SMs do not split) skips part of every block's loop: FLOPs,
    exps, SRAM reads and L2-side bytes equal the whole run's, the time within 1%, DRAM bytes within
    2%, and the result says a part was not simulated."""
    from test_fold import part_of
    from hbmsim.algorithms.workload import Workload
    from hbmsim.scenarios.experiment import Config, Experiment, RunSpec
    from hbmsim.scenarios.runner import prepare, run_config
    gpu = part_of("a100-sxm4-80gb")
    cfg = prepare(Experiment("loops", "test", gpu, [Config(gpu, Workload(1, 4, 8192, 8192, 128),
                                                            RunSpec("flash1", ("forward",), {"variant": "fa1-kernel"}))]
                             )).configs[0]
    full, fast = run_config(cfg, count_only=True)[0], run_config(cfg, count_only=True, fast=True)[0]
    for f in ("global_read_bytes", "global_write_bytes", "matmul_flops", "vector_flops", "exp_ops"):
        assert fast[f] == full[f], f
    assert [k["sram_read_bytes"] for k in fast["kernels"]] == [k["sram_read_bytes"] for k in full["kernels"]]
    assert fast["time_s"] == pytest.approx(full["time_s"], rel=0.01)
    for f in ("hbm_read_bytes", "hbm_write_bytes"):
        assert fast[f] == pytest.approx(full[f], rel=0.02), f
    assert full["simulated_fraction"] == 1.0 and fast["simulated_fraction"] < 0.8
