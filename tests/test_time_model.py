"""Each effect of the time model (simulator/time_model.py) on a tiny machine, with the time worked out
by hand, and switched off.

The tiny GPU (conftest.tiny_gpu): 4 SMs at 1 GHz; per SM 1e12 tensor FLOP/s, 1e11 FP32 FLOP/s
(an FMA counted as 2, so 5e10 operations/s), 1e11 B/s of SRAM reads; HBM 1e11 B/s with 1e-7 s latency.
"""
import dataclasses

import pytest

from hbmsim.simulator import BASELINE, HbmsimError, Launch, Program, Tensor, TimeModel, simulate
from hbmsim.simulator.time_model import MMA_SYNC

from conftest import tiny_gpu

ALL = TimeModel()


def one_block(tensor_op: str = "library", **work) -> Program:
    """One kernel of one block that does one compute call."""
    def block(ctx, _):
        yield from ctx.compute(**work)
    return Program("one", [Launch("k", 1, 0, block, tensor_op=tensor_op)])


def time_of(gpu, model, tensor_op="library", **work) -> float:
    return simulate(gpu, one_block(tensor_op, **work), model=model).time_s


def test_fp32_ops_run_at_one_per_lane_clock():
    gpu = tiny_gpu()
    # 1e5 softmax operations on one SM: 1e5 / 5e10 = 2 us, not 1e5 / 1e11 = 1 us
    assert time_of(gpu, ALL, vector_flops=100_000) == pytest.approx(2e-6, rel=1e-12)
    assert time_of(gpu, ALL.off("fp32_ops"), vector_flops=100_000) == pytest.approx(1e-6, rel=1e-12)


def instruction_block(vector_work: str, **work) -> Program:
    def block(ctx, _):
        yield from ctx.compute(**work)
    return Program("one", [Launch("k", 1, 0, block, vector_work=vector_work)])


def test_a_measured_instruction_count_is_issued_at_the_schedulers_rate():
    # 4 warp instructions per clock per SM at 1 GHz: 1.28e11 lane-instructions/s, against the FP32
    # lanes' 5e10 operations/s (an A100-like SM: issue twice the FP32 rate)
    gpu = tiny_gpu(warp_instructions_per_clk_per_sm=4)
    def t(vector_work, model=ALL, g=gpu, **work):
        return simulate(g, instruction_block(vector_work, **work), model=model).time_s
    # 1.28e5 lane-instructions: 1 us issued; as FP32 operations 1.28e5 / 5e10 = 2.56 us
    assert t("instructions", vector_flops=128_000) == pytest.approx(1e-6, rel=1e-12)
    assert t("fp32", vector_flops=128_000) == pytest.approx(2.56e-6, rel=1e-12)
    # off, or on a GPU whose preset does not give the rate: the FP32 rate
    assert t("instructions", ALL.off("instruction_issue"), vector_flops=128_000) == pytest.approx(2.56e-6, rel=1e-12)
    assert t("instructions", g=tiny_gpu(), vector_flops=128_000) == pytest.approx(2.56e-6, rel=1e-12)
    # the SFU still bounds the exps among them: 1.6e4 exps / 1.6e10 = 1 us against 1.12e5 / 1.28e11 = 0.875 us
    sfu = tiny_gpu(warp_instructions_per_clk_per_sm=4, sfu_ops_per_clk_per_sm=16)
    assert t("instructions", g=sfu, vector_flops=128_000, exp_ops=16_000) == pytest.approx(1e-6, rel=1e-12)
    with pytest.raises(HbmsimError, match="vector_work = 'int' must be one of fp32, instructions"):
        t("int", vector_flops=1)


def test_on_the_presets_issue_is_the_fp32_rate_on_h100_and_twice_it_on_a100(a100, h100):
    """Four schedulers of 32 lanes a clock: H100's 128 FP32 lanes per SM issue as fast; A100's 64 do not."""
    from hbmsim.simulator.time_model import FP32, INSTRUCTIONS, SmRates
    for gpu, ratio in ((h100, 1.0), (a100, 2.0)):
        assert gpu.warp_instructions_per_clk_per_sm == 4 and len(gpu.source["warp_instructions_per_clk_per_sm"]) > 80
        r = SmRates(gpu, ALL)
        # (the spec sheets' 66.9 and 19.5 TFLOP/s are 127.98 and 64.03 lanes a clock: to 0.05%)
        assert r.s_per_vec_op[FP32] / r.s_per_vec_op[INSTRUCTIONS] == pytest.approx(ratio, rel=1e-3)


def test_an_exp_heavy_block_is_bound_by_the_sfu():
    gpu = tiny_gpu(sfu_ops_per_clk_per_sm=16)        # 16 exps per clock at 1 GHz = 1.6e10 exps/s per SM
    # 1e5 exps among 2e5 operations: the SFU takes 1e5 / 1.6e10 = 6.25 us; the other 1e5 FP32
    # operations 1e5 / 5e10 = 2 us beside it: 6.25 us
    assert time_of(gpu, ALL, vector_flops=200_000, exp_ops=100_000) == pytest.approx(6.25e-6, rel=1e-12)
    # off: an exp is one more FP32 operation, 2e5 / 5e10 = 4 us
    assert time_of(gpu, ALL.off("sfu_exp"), vector_flops=200_000, exp_ops=100_000) == pytest.approx(4e-6, rel=1e-12)
    # a GPU whose preset gives no SFU rate: the effect is off by itself
    assert time_of(tiny_gpu(), ALL, vector_flops=200_000, exp_ops=100_000) == pytest.approx(4e-6, rel=1e-12)
    # with few exps the FP32 work binds: 1.9e5 / 5e10 = 3.8 us > 1e4 / 1.6e10 = 0.625 us
    assert time_of(gpu, ALL, vector_flops=200_000, exp_ops=10_000) == pytest.approx(3.8e-6, rel=1e-12)


def test_a_blocks_gemm_and_softmax_add_up():
    gpu = tiny_gpu()
    work = dict(matmul_flops=3_000_000, vector_flops=100_000)    # 3 us of tensor cores, 2 us of FP32
    assert time_of(gpu, ALL, **work) == pytest.approx(5e-6, rel=1e-12)
    assert time_of(gpu, ALL.off("serial_softmax"), **work) == pytest.approx(3e-6, rel=1e-12)
    # SRAM reads are pipelined under the tensor cores: 4e5 B / 1e11 B/s = 4 us > 3 us binds that phase
    assert time_of(gpu, ALL, sram_bytes=400_000, **work) == pytest.approx(6e-6, rel=1e-12)


def test_tensor_cores_run_at_the_achievable_fraction():
    gpu = tiny_gpu(tensor_achievable_fraction=0.8, mma_sync_fraction=0.5)
    # 1e6 FLOPs at 0.8 x 1e12 = 1.25 us; mma.sync at its own 0.5 of the peak (both fractions are of
    # the peak, so the smaller one binds, they do not multiply): 2 us
    assert time_of(gpu, ALL, "library", matmul_flops=1_000_000) == pytest.approx(1.25e-6, rel=1e-12)
    assert time_of(gpu, ALL, MMA_SYNC, matmul_flops=1_000_000) == pytest.approx(2e-6, rel=1e-12)
    off = ALL.off("achievable_tensor")
    assert time_of(gpu, off, "library", matmul_flops=1_000_000) == pytest.approx(1e-6, rel=1e-12)
    # A100: mma.sync is sm80's own instruction (fraction 1), so the achievable GEMM rate binds it too
    a100_like = tiny_gpu(tensor_achievable_fraction=0.8, mma_sync_fraction=1.0)
    assert time_of(a100_like, ALL, MMA_SYNC, matmul_flops=1_000_000) == pytest.approx(1.25e-6, rel=1e-12)


def test_mma_sync_gets_its_fraction_of_the_tensor_peak():
    gpu = tiny_gpu(mma_sync_fraction=0.5)
    assert time_of(gpu, ALL, MMA_SYNC, matmul_flops=1_000_000) == pytest.approx(2e-6, rel=1e-12)
    assert time_of(gpu, ALL, "library", matmul_flops=1_000_000) == pytest.approx(1e-6, rel=1e-12)
    assert time_of(gpu, ALL.off("mma_sync"), MMA_SYNC, matmul_flops=1_000_000) == pytest.approx(1e-6, rel=1e-12)


def test_dram_serves_at_the_stream_fraction():
    def copy(ctx, _):
        yield from ctx.load(x[0], slice(0, 1000), slice(0, 100))     # 1000 x 100 fp32 = 4e5 B
    x = Tensor("x", (1, 1000, 100), "fp32")
    prog = lambda: Program("copy", [Launch("k", 1, 0, copy)], inputs=(x,))
    gpu = tiny_gpu(hbm_stream_fraction=0.8)
    # latency 1e-7 s, then 4e5 B at 0.8 x 1e11 B/s = 5 us
    assert simulate(gpu, prog()).time_s == pytest.approx(1e-7 + 5e-6, rel=1e-12)
    assert simulate(gpu, prog(), model=ALL.off("stream_dram")).time_s == pytest.approx(1e-7 + 4e-6, rel=1e-12)


def test_all_effects_off_is_the_spec_sheet_model():
    gpu = tiny_gpu(sfu_ops_per_clk_per_sm=16, mma_sync_fraction=0.5)
    # the longest of tensor (3 us), vector (1e5 / 1e11 = 1 us, exps included) and SRAM (2 us)
    t = time_of(gpu, BASELINE, MMA_SYNC, matmul_flops=3_000_000, vector_flops=100_000, exp_ops=50_000,
                sram_bytes=200_000)
    assert t == pytest.approx(3e-6, rel=1e-12)
    assert BASELINE.describe() == "off: " + ", ".join(TimeModel.effects())
    assert ALL.describe() == "all effects on"


def test_bad_names_and_numbers_are_refused():
    with pytest.raises(HbmsimError, match="unknown time-model effect 'sfu'"):
        ALL.off("sfu")
    with pytest.raises(HbmsimError, match="'hbm_stream_fraction' = 1.2 must be at most 1"):
        tiny_gpu(hbm_stream_fraction=1.2)
    with pytest.raises(HbmsimError, match=r"'mma_sync_fraction' = -0.5 must be >= 0 \(0: not given\)"):
        tiny_gpu(mma_sync_fraction=-0.5)
    with pytest.raises(HbmsimError, match="tensor_op = 'wmma' must be one of"):
        simulate(tiny_gpu(), one_block("wmma", matmul_flops=1))


def test_presets_give_every_number_with_a_source(a100, h100):
    for gpu in (a100, h100):
        for name in ("hbm_stream_fraction", "tensor_achievable_fraction", "mma_sync_fraction",
                     "sfu_ops_per_clk_per_sm"):
            assert len(gpu.source[name]) > 80, (gpu.name, name)
            assert getattr(gpu, name) > 0
        assert gpu.sfu_ops_per_clk_per_sm == 16                   # CUDA guide, cc 8.0 and 9.0
    # H100: measured here (scenarios/measured/h100-microbench.json, tests/test_measured_h100.py), about
    # the FlashAttention-3 paper's 2/3
    assert a100.mma_sync_fraction == 1.0 and h100.mma_sync_fraction == pytest.approx(2 / 3, abs=5e-3)
    assert a100.tensor_achievable_fraction == pytest.approx(286.9 / 312, abs=1e-4)     # LLMCompass cuBLAS
    assert h100.tensor_achievable_fraction == pytest.approx(715.0 / 989.4, abs=1e-4)  # cuBLAS measured here
    assert a100.hbm_stream_fraction == pytest.approx(1360 / 1555, abs=1e-4)
    assert h100.hbm_stream_fraction == pytest.approx(2.97 / 3.35, abs=1e-4)


def test_more_sms_never_slows_an_exp_heavy_flash_run(a100):
    from hbmsim.algorithms.flash2 import flash2_forward
    from hbmsim.algorithms.workload import Workload
    wl = Workload(1, 8, 512, 512, 64)
    base = simulate(a100, flash2_forward(wl, 128, 64, warps=4)).time_s
    assert simulate(a100.with_sms(2 * a100.sm_count), flash2_forward(wl, 128, 64, warps=4)).time_s <= base
    # and the effects only ever add time to the spec-sheet model here
    assert simulate(a100, flash2_forward(wl, 128, 64, warps=4), model=BASELINE).time_s < base


def test_gpu_with_sms_scales_whole_gpu_rates_only(a100):
    big = a100.with_sms(216)
    assert big.matmul_flops_per_s == 2 * a100.matmul_flops_per_s
    assert big.vector_flops_per_s == 2 * a100.vector_flops_per_s
    assert dataclasses.replace(big, sm_count=108, matmul_flops_per_s=a100.matmul_flops_per_s,
                               vector_flops_per_s=a100.vector_flops_per_s) == a100


def test_fa2_backward_shared_memory_reads_by_warp_layout():
    from hbmsim.algorithms.flash2_backward import bwd_sram_read_elements, fa2_bwd_atoms
    from hbmsim.algorithms.workload import Workload
    # head dim 64: Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 4, 4, false, false>. Per step (128 x 128):
    # S and dP: Q, dO (8192 elements) read by 2 warp columns, K, V (8192) by 4 warp rows: 2 x 49152;
    # dV, dK, dQ: P or dS (16384) x 2 + dO, Q or K (8192) x 4: 3 x 65536; P and dS written: 32768.
    atoms = fa2_bwd_atoms(Workload(1, 1, 256, 256, 64), 8)
    assert atoms == (4, 4, 4, False)
    assert bwd_sram_read_elements(128, 128, 64, 8, atoms) == 2 * 49152 + 3 * 65536 + 32768 == 327680
    # head dim 128: <128, 64, 128, 8, 2, 4, 2, false, false>. Q, dO: 8192; K, V: 16384; P, dS: 8192.
    # S, dP: 8192 x 4 + 16384 x 2; dV, dK: 8192 x 2 + 8192 x 4; dQ: 8192 x 4 + 16384 x 2; writes 16384.
    atoms = fa2_bwd_atoms(Workload(1, 1, 256, 256, 128), 8)
    assert atoms == (2, 4, 2, False)
    assert bwd_sram_read_elements(64, 128, 128, 8, atoms) == 3 * 65536 + 2 * 49152 + 16384 == 311296
    # one warp reads every operand once: 2 x (8192 + 8192) + 3 x (16384 + 8192) + 32768 at head dim 64
    assert bwd_sram_read_elements(128, 128, 64, 1, fa2_bwd_atoms(Workload(1, 1, 256, 256, 64), 1)) == 139264


def test_run_without_an_effect_says_so_and_changes_only_times(tmp_path, capsys):
    import json

    from hbmsim.scenarios.cli import main
    full, without = tmp_path / "full.json", tmp_path / "without.json"
    assert main(["run", "small-masked", "--count-only", "--json", str(full)]) == 0
    assert main(["run", "small-masked", "--count-only", "--json", str(without), "--without", "serial_softmax"]) == 0
    assert "time model: off: serial_softmax" in capsys.readouterr().out
    a, b = (json.loads(p.read_text())["runs"] for p in (full, without))
    assert {r["time_model"] for r in a} == {"all effects on"}
    assert {r["time_model"] for r in b} == {"off: serial_softmax"}
    for ra, rb in zip(a, b):
        assert ra["tensors"] == rb["tensors"] and ra["matmul_flops"] == rb["matmul_flops"]
        assert ra["exp_ops"] == rb["exp_ops"]
        assert rb["time_s"] <= ra["time_s"]
    flash2 = [r for r in a if r["algorithm"] == "flash2" and r["pass"] == "forward"][0]
    # one exp per score of every visited tile plus one per row per tile: at least N_q x (visible keys)
    assert flash2["exp_ops"] > 0


def test_exp_counts_by_hand(gpu):
    from hbmsim.algorithms.flash2 import flash2_forward
    from hbmsim.algorithms.standard import standard_forward
    from hbmsim.algorithms.workload import Workload
    wl = Workload(1, 2, 256, 256, 64)
    # flash2, 128 x 64 blocks: an exp per score (2 x 256 x 256) and per row per K/V tile (2 x 256 x 4)
    r = simulate(gpu, flash2_forward(wl, 128, 64))
    assert sum(k.exp_ops for k in r.kernels) == 2 * 256 * 256 + 2 * 256 * 4 == 133120
    # standard: one exp per element of P, in the softmax kernel only
    r = simulate(gpu, standard_forward(wl))
    assert {k.name: k.exp_ops for k in r.kernels if k.exp_ops} == {"softmax": 2 * 256 * 256}


def test_a_compute_chain_is_its_phases_back_to_back_in_one_event():
    gpu = tiny_gpu(sfu_ops_per_clk_per_sm=16)
    phases = (dict(matmul_flops=3_000_000, vector_flops=100_000, exp_ops=10_000), dict(matmul_flops=1_000_000),
              dict(vector_flops=50_000, sram_bytes=200_000))

    def chained(ctx, _):
        yield from ctx.compute_chain(*phases)

    def separate(ctx, _):
        for ph in phases:
            yield from ctx.compute(**ph)
    a = simulate(gpu, Program("a", [Launch("k", 1, 0, chained)]))
    b = simulate(gpu, Program("b", [Launch("k", 1, 0, separate)]))
    # each phase is its tensor phase (SRAM reads under it), then its softmax phase: (3 + 9e4 / 5e10 = 1.8,
    # the 1e4 exps taking 0.625 beside it) + 1 + (2e5 B / 1e11 = 2, then 5e4 / 5e10 = 1) = 8.8 us
    assert a.time_s == pytest.approx(8.8e-6, rel=1e-12) and b.time_s == pytest.approx(a.time_s, rel=1e-12)
    assert (a.kernels[0].matmul_flops, a.kernels[0].vector_flops, a.kernels[0].exp_ops) == (4_000_000, 150_000, 10_000)
    assert a.sim_events < b.sim_events


def test_block_dispatch_hands_the_first_wave_out_round_robin():
    # 8 blocks on 4 SMs of 2 slots (one wave), handed out 100 ns apart round robin over the SMs, as
    # the measured dispatcher does (264 blocks, 2 an SM, within one 0.24 us timer tick): block b runs
    # on SM b % 4 from b x 100 ns, so an SM's second slot starts 400 ns after its first (not with it).
    starts, sms = {}, {}

    def trace(t, sm, kernel, block, text):
        starts.setdefault(block, t)
        sms.setdefault(block, sm)

    def block(ctx, b):
        yield from ctx.compute(matmul_flops=3_000_000)
    simulate(tiny_gpu(max_blocks_per_sm=2, block_dispatch_s=1e-7), Program("wave", [Launch("k", 8, 0, block)]),
             trace=trace)
    assert sms == {b: b % 4 for b in range(8)}
    assert starts == pytest.approx({b: b * 1e-7 for b in range(8)}, rel=1e-12)


def test_block_dispatch_staggers_the_first_wave_by_sm():
    # 8 blocks of 3e6 tensor FLOPs (3 us at 1e12 FLOP/s per SM) on 4 SMs, 1 slot each. Handed out
    # 100 ns apart, SM i starts at i x 100 ns: the first wave ends at 3.0, 3.1, 3.2, 3.3 us, each SM
    # takes the next block as it frees, and the last ends at 3.3 + 3 = 6.3 us (6 us at once).
    def block(ctx, b):
        yield from ctx.compute(matmul_flops=3_000_000)

    def program():
        return Program("waves", [Launch("k", 8, 0, block)])
    staggered = tiny_gpu(max_blocks_per_sm=1, block_dispatch_s=1e-7)
    assert simulate(staggered, program()).time_s == pytest.approx(6.3e-6, rel=1e-12)
    assert simulate(staggered, program(), model=ALL.off("block_dispatch")).time_s == pytest.approx(6e-6, rel=1e-12)
    assert simulate(tiny_gpu(max_blocks_per_sm=1), program()).time_s == pytest.approx(6e-6, rel=1e-12)
    with pytest.raises(HbmsimError, match=r"field 'block_dispatch_s' = -1e-09 must be >= 0 \(0: not given\)"):
        tiny_gpu(block_dispatch_s=-1e-9)


def test_registers_cap_the_blocks_an_sm_holds():
    from hbmsim.simulator.machine import Machine, block_registers
    gpu = tiny_gpu(registers_per_sm=65_536, sram_bytes_per_sm=1 << 20)

    def launch(threads, regs, sram=0):
        return Launch("k", 8, sram, lambda ctx, _: iter(()), threads_per_block=threads, registers_per_thread=regs)
    # 255 registers round up to 256 a thread: 8,192 a warp (allocation unit 256 per warp)
    assert block_registers(launch(128, 255)) == 4 * 8192
    assert block_registers(launch(96, 40)) == 3 * 1280          # 40 x 32 = 1,280, already a multiple of 256
    assert block_registers(launch(100, 33)) == 4 * 1280         # 4 warps; 33 x 32 = 1,056 -> 1,280
    # FlashAttention-2's forward (4 warps x 255): 2 blocks; its backward (8 warps): 1; off: max_blocks_per_sm
    assert Machine.slots_per_sm_of(gpu, launch(128, 255)) == 2
    assert Machine.slots_per_sm_of(gpu, launch(256, 255)) == 1
    assert Machine.slots_per_sm_of(gpu, launch(256, 255), registers=False) == 8
    # shared memory still limits when it is the tighter bound; unknown registers limit nothing
    assert Machine.slots_per_sm_of(gpu, launch(128, 255, sram=600_000)) == 1
    assert Machine.slots_per_sm_of(gpu, launch(0, 0)) == 8
    assert Machine.slots_per_sm_of(tiny_gpu(), launch(256, 255)) == 8      # preset without a register file size
    with pytest.raises(HbmsimError, match=r"kernel k: a block needs 131072 registers \(512 threads x 255\), "
                                          r"more than registers_per_sm = 65536 on tiny"):
        Machine.slots_per_sm_of(gpu, launch(512, 255))


def test_registers_reach_the_results_of_the_fa2_kernels(h100):
    from hbmsim.algorithms.workload import Workload
    from hbmsim.scenarios.experiment import Config, RunSpec
    from hbmsim.scenarios.runner import resolve_mapping, run_config
    wl = Workload(1, 2, 512, 512, 128, dtype="fp16")
    cfg = Config(h100, wl, RunSpec("flash2", ("forward", "backward"), {}))
    cfg = dataclasses.replace(cfg, mapping=resolve_mapping(cfg)[0])
    blocks = {k["name"]: k["blocks_per_sm"] for r in run_config(cfg, count_only=True) for k in r["kernels"]}
    # forward 128 x 64 tiles: 64 KB of shared memory allows 3 blocks, 4 warps x 255 registers allow 2;
    # backward: 8 warps x 255 registers fill the register file
    assert blocks["flash2_fwd"] == 2 and blocks["flash2_bwd"] == 1
    off = {k["name"]: k["blocks_per_sm"] for r in run_config(cfg, count_only=True, model=ALL.off("registers"))
           for k in r["kernels"]}
    assert off["flash2_fwd"] == 3 and off["flash2_bwd"] == 2


def test_mma_sync_operands_from_shared_memory_add_to_the_mma():
    gpu = tiny_gpu(mma_sync_fraction=0.5, mma_sync_operands_serial=1)
    # 1e6 FLOPs of mma.sync at 0.5 x 1e12 per SM = 2 us; 4e5 B of ldmatrix at 1e11 B/s = 4 us: 6 us
    work = dict(matmul_flops=1_000_000, sram_bytes=400_000)
    assert time_of(gpu, ALL, MMA_SYNC, **work) == pytest.approx(6e-6, rel=1e-12)
    # off, or a library GEMM (wgmma / cuBLAS read their operands while the tensor cores run): the larger, 4 us
    assert time_of(gpu, ALL.off("mma_operands"), MMA_SYNC, **work) == pytest.approx(4e-6, rel=1e-12)
    assert time_of(gpu, ALL, "library", **work) == pytest.approx(4e-6, rel=1e-12)
    # a GPU whose preset does not say so (A100), or gives no mma.sync rate, or the mma_sync effect off
    assert time_of(tiny_gpu(mma_sync_fraction=0.5), ALL, MMA_SYNC, **work) == pytest.approx(4e-6, rel=1e-12)
    assert time_of(tiny_gpu(mma_sync_operands_serial=1), ALL, MMA_SYNC, **work) == pytest.approx(4e-6, rel=1e-12)
    assert time_of(gpu, ALL.off("mma_sync"), MMA_SYNC, **work) == pytest.approx(4e-6, rel=1e-12)


def test_two_resident_mma_sync_blocks_overlap_one_softmax_with_the_other_gemm():
    """mma_sync_pipes: on one SM, block A's softmax runs while block B's mma.sync and ldmatrix do."""
    one_sm = dict(sm_count=1, matmul_flops_per_s=1e12, vector_flops_per_s=1e11)      # the tiny GPU's SM alone
    gpu = tiny_gpu(**one_sm, mma_sync_fraction=0.5, mma_sync_operands_serial=1)
    # per block: 1e6 FLOPs at 0.5 x 1e12 = 2 us + 2e5 B of ldmatrix at 1e11 B/s = 2 us on the tensor
    # pipe; then 1e5 softmax operations at 5e10/s = 2 us on the vector pipe
    work = dict(matmul_flops=1_000_000, sram_bytes=200_000, vector_flops=100_000)

    def blocks(n):
        def block(ctx, _):
            yield from ctx.compute(**work)
        return Program("two", [Launch("k", n, 0, block, tensor_op=MMA_SYNC)])
    def t(n, model=ALL, g=gpu):
        return simulate(g, blocks(n), model=model).time_s
    # one block: its softmax needs its GEMM, 4 + 2 = 6 us either way
    assert t(1) == pytest.approx(6e-6, rel=1e-12)
    assert t(1, ALL.off("mma_sync_pipes")) == pytest.approx(6e-6, rel=1e-12)
    # two: A's tensor 0-4, B's tensor 4-8 (A's softmax 4-6 beside it), B's softmax 8-10: 10 us, not 12
    assert t(2) == pytest.approx(10e-6, rel=1e-12)
    assert t(2, ALL.off("mma_sync_pipes")) == pytest.approx(12e-6, rel=1e-12)
    # a GPU whose preset did not measure mma.sync's operand reads serial (A100): one pipe, the reads
    # under the mma (max(2, 2) us) and the softmax after: 2 x (2 + 2) us
    a100_like = tiny_gpu(**one_sm, mma_sync_fraction=0.5)
    assert t(2, g=a100_like) == pytest.approx(2 * (2e-6 + 2e-6), rel=1e-12)


def test_warp_issue_puts_the_blocks_issue_after_their_gemms_one_block_after_another():
    """warp_issue: a call takes the SM's pipe for max(mma.sync, ldmatrix) + its warps' instructions
    at 4 a clock; its block waits at least its own chain (GEMM and ldmatrix, then the softmax)."""
    one_sm = dict(sm_count=1, matmul_flops_per_s=1e12, vector_flops_per_s=1e11)
    gpu = tiny_gpu(**one_sm, mma_sync_fraction=0.5, mma_sync_operands_serial=1, warp_instructions_per_clk_per_sm=4)
    # per call: 1e6 FLOPs at 0.5 x 1e12 = 2 us of mma.sync, 2e5 B of ldmatrix at 1e11 B/s = 2 us, 1e5
    # softmax operations at 5e10/s = 2 us; 1e6 x 0.004 = 4,000 warp instructions at 4 x 1 GHz = 1 us
    work = dict(matmul_flops=1_000_000, sram_bytes=200_000, vector_flops=100_000)

    def blocks(n, calls=1, per_flop=0.004):
        def block(ctx, _):
            for _ in range(calls):
                yield from ctx.compute(**work)
        return Program("k", [Launch("k", n, 0, block, tensor_op=MMA_SYNC,
                                    warp_instructions=(per_flop, 0.0, 0.0) if per_flop else ())])

    def t(n, calls=1, model=ALL, g=gpu, per_flop=0.004):
        return simulate(g, blocks(n, calls, per_flop), model=model).time_s
    # one block: its chain, 2 + 2 + 2 = 6 us, is longer than its issue, max(2, 2) + 1 = 3 us
    assert t(1) == pytest.approx(6e-6, rel=1e-12)
    # two blocks: issue 0-3 and 3-6, both chains end at 6: 6 us (mma_sync_pipes: 10 us)
    assert t(2) == pytest.approx(6e-6, rel=1e-12)
    assert t(2, model=ALL.off("warp_issue")) == pytest.approx(10e-6, rel=1e-12)
    # three blocks: the SM's issue, 3 x 3 us, is the longer
    assert t(3) == pytest.approx(9e-6, rel=1e-12)
    # two calls each: second calls start at 6 us, issue 6-9 and 9-12, chains end at 12
    assert t(2, calls=2) == pytest.approx(12e-6, rel=1e-12)
    # no count (0), or a GPU without mma.sync's measured serial operand reads: as before
    assert t(2, per_flop=0.0) == pytest.approx(10e-6, rel=1e-12)
    a100_like = tiny_gpu(**one_sm, mma_sync_fraction=0.5, warp_instructions_per_clk_per_sm=4)
    assert t(2, g=a100_like) == pytest.approx(2 * (2e-6 + 2e-6), rel=1e-12)


def test_l2_hit_latency_hides_under_prefetching_kernels_and_not_under_a_dependent_loop(h100):
    """l2_hit_latency adds the measured 148.8 ns (h100-latency.json) to every L2 hit. A kernel that
    loads ahead, as its source does, pays it at a block's start and end only: FA3's forward (K's
    ring slot released once the QK GEMM has read it: pipeline_k, so K_{j+2} loads while P_j V_j
    runs) and FA2's backward (the next step's Q and dO loaded during this one: its double-buffered
    sQ). 32 K/V steps a block each here; a latency a step would be 32 x 148.8 ns = 4.8 us a block.
    The split-KV combine kernel's dependent loop pays it a split (test_splitkv.py)."""
    from hbmsim.algorithms import registry
    from hbmsim.algorithms.workload import Workload
    from hbmsim.simulator import TimeModel, simulate
    lat_s = h100.l2_hit_latency_s
    wl = Workload(1, 4, 2048, 2048, 128)
    for name, passes, kernel in (("flash3", False, "flash3_fwd"), ("flash2", True, "flash2_bwd")):
        spec = registry.get(name)
        m, _ = spec.resolved(h100, wl, spec.mapping_type(), passes)
        times = []
        for model in (TimeModel(), TimeModel().off("l2_hit_latency")):
            result = simulate(h100, spec.build(wl, m, None, passes), model=model)
            k = next(k for k in result.kernels if k.name == kernel)
            times.append(k.end_s - k.start_s)
        assert 0 < times[0] - times[1] <= 2 * lat_s + 1e-12, (name, times)
