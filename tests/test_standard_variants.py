"""Every kernel list registered for standard attention (eager, and the variants of spec8: PyTorch
benchmark baseline, the tests' attention_ref, Megatron's fused scale-mask-softmax): counters equal
the closed forms (algorithms/io_formulas.py, io_standard_variants.py) exactly, and O, dQ, dK, dV
equal the float64 reference."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hbmsim.algorithms import io_standard_variants as F
from hbmsim.algorithms import registry
from hbmsim.algorithms.standard_attention_ref import attention_ref_forward
from hbmsim.algorithms.standard_megatron import megatron_fused_applies, megatron_training
from hbmsim.algorithms.standard_pytorch_bench import pytorch_bench_forward
from hbmsim.algorithms.reference import attention_backward, attention_forward
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.simulator import simulate

from conftest import grouped, tiny_gpu

GPU = tiny_gpu(sram_bytes_per_sm=1 << 22, sm_count=8)
STANDARD = registry.get("standard")
VARIANTS = STANDARD.variants      # a kernel list registered for standard attention is tested here


def build(variant, wl, data, tile, training):
    return STANDARD.build(wl, STANDARD.mapping_type(*tile, variant=variant), data, training)


def counted(prog, pass_name):
    return {n: (t.read, t.write) for n, t in simulate(GPU, prog).tensors(pass_name).items() if t.read or t.write}


def closed(variant, pass_name, wl, tile):
    io = STANDARD.io(wl, STANDARD.mapping_type(*tile, variant=variant), pass_name)
    return {n: rw for n, rw in io.items() if rw != (0, 0)}


workloads = grouped(st.builds(
    Workload, batch=st.integers(1, 2), heads=st.sampled_from([1, 2, 4]), seq_len_q=st.integers(1, 200),
    seq_len_kv=st.integers(1, 200), head_dim=st.sampled_from([8, 32, 64]),
    dtype=st.sampled_from(["fp16", "bf16", "fp32"]), causal=st.booleans(), key_padding_mask=st.booleans(),
    dropout=st.sampled_from([0.0, 0.1])))
tiles = st.tuples(st.integers(9, 130), st.integers(9, 130), st.integers(5, 70))   # small enough to clip, not tiny


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(VARIANTS), workloads, tiles)
def test_counts_equal_closed_forms(variant, wl, tile):
    prog = build(variant, wl, None, tile, True)
    assert counted(prog, "forward") == closed(variant, "forward", wl, tile)
    assert counted(prog, "backward") == closed(variant, "backward", wl, tile)
    fwd = build(variant, wl, None, tile, False)
    assert counted(fwd, "forward") == closed(variant, "forward", wl, tile)
    # fast mode: k-loops of 64+ k-steps take several a step (standard_kernels.GEMM_FAST_MAX_K_STEPS)
    fast = STANDARD.build(wl, STANDARD.mapping_type(*tile, variant=variant), None, True, fast=True)
    assert counted(fast, "forward") == closed(variant, "forward", wl, tile)
    assert counted(fast, "backward") == closed(variant, "backward", wl, tile)


# Shapes on which Megatron's fused kernels apply (multiples of 4/8, sk in 17..4096), so hypothesis
# exercises the upper-triangular (causal) and masked kernels, not only the fallback.
fused_workloads = st.builds(
    Workload, batch=st.sampled_from([2, 4]), heads=st.sampled_from([2, 4]),
    seq_len_q=st.sampled_from([24, 32, 136, 200]), seq_len_kv=st.sampled_from([24, 32, 136, 200]),
    head_dim=st.sampled_from([8, 32]), dtype=st.sampled_from(["fp16", "bf16"]), causal=st.booleans(),
    key_padding_mask=st.booleans(), dropout=st.sampled_from([0.0, 0.1]))


@settings(max_examples=10, deadline=None)
@given(fused_workloads, tiles)
def test_megatron_fused_counts(wl, tile):
    wl = Workload(**{**wl.describe(), "seq_len_kv": wl.seq_len_q if wl.causal else wl.seq_len_kv})
    assert megatron_fused_applies(wl) == F.megatron_kernel_available(wl)
    prog = megatron_training(wl, None, tile)
    assert counted(prog, "forward") == closed("megatron", "forward", wl, tile)
    assert counted(prog, "backward") == closed("megatron", "backward", wl, tile)


small = st.fixed_dictionaries({
    "batch": st.integers(1, 2), "heads": st.sampled_from([1, 2, 4]), "seq_len_q": st.sampled_from([3, 8, 20, 24]),
    "seq_len_kv": st.sampled_from([5, 8, 20, 24]), "head_dim": st.sampled_from([1, 4, 8]),
    "dtype": st.sampled_from(["fp16", "bf16", "fp32"]), "causal": st.booleans(),
    "key_padding_mask": st.booleans(), "dropout": st.sampled_from([0.0, 0.1])})


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(VARIANTS), small, tiles, st.integers(0, 2**31 - 1))
def test_outputs_and_gradients_equal_reference(variant, fields, tile, seed):
    wl = Workload(**fields)
    if variant == "megatron" and wl.causal and wl.dtype != "fp32" and seed % 2:
        # make the fused upper-triangular kernel apply: sq == sk, b*np a multiple of 8
        wl = Workload(**{**fields, "batch": 2, "heads": 4, "seq_len_q": 24, "seq_len_kv": 24,
                         "key_padding_mask": False})
    data = random_data(wl, seed)
    out = simulate(GPU, build(variant, wl, data, tile, True)).outputs
    o, _ = attention_forward(wl, data)
    ref = attention_backward(wl, data, data.d_o)
    np.testing.assert_allclose(out["O"].reshape(o.shape), o, rtol=0, atol=1e-12)
    for name in ("dQ", "dK", "dV"):
        np.testing.assert_allclose(out[name].reshape(ref[name].shape), ref[name], rtol=0, atol=1e-12, err_msg=name)
    fwd = simulate(GPU, build(variant, wl, data, tile, False)).outputs
    np.testing.assert_allclose(fwd["O"].reshape(o.shape), o, rtol=0, atol=1e-12)


def test_pytorch_bench_by_hand():
    # G = 1, N = 256, d = 64, fp16, causal, tiles 128x128x64. Q_r, K_T: one 32768 B copy each;
    # K's is a transpose, read one 32-byte sector request an element at the L2: 16384 x 32 = 524288.
    # baddbmm: Q_r read per column tile (2): 65536; K_T per row tile (2): 65536; S written 131072.
    # causal mask: full fp32 written 262144; triu reads it, writes mask_triu 262144; .to(fp16)
    # reads mask_triu 262144, writes causal_mask 131072; the add reads S 131072 and the mask
    # 131072 (one head), writes S_masked 131072; softmax reads it, writes P 131072.
    # einsum copies V (32768 each way); bmm: P read once (d = 64 is one tile), V_r per row tile.
    wl = Workload(1, 1, 256, 256, 64, causal=True)
    io = counted(pytorch_bench_forward(wl, None, (128, 128, 64)), "forward")
    assert io == {"Q": (32768, 0), "Q_r": (65536, 32768), "K": (524288, 0), "K_T": (65536, 32768),
                  "S": (131072, 131072), "mask_full": (262144, 262144), "mask_triu": (262144, 262144),
                  "causal_mask": (131072, 131072), "S_masked": (131072, 131072), "P": (131072, 131072),
                  "V": (32768, 0), "V_r": (65536, 32768), "O": (0, 32768)}
    assert io == closed("pytorch-bench", "forward", wl, (128, 128, 64))


@pytest.mark.parametrize("causal, ops", [
    # unbind permute reshape | permute reshape | empty baddbmm | view softmax | dropout einsum | bmm: 12 ops
    (False, [("rearrange_q", 3), ("rearrange_k", 2), ("baddbmm", 2), ("softmax", 2), ("einsum_copy_v", 2),
             ("bmm_pv", 1)]),
    # ... | view full | triu | .to | add | softmax | ...: 16 ops
    (True, [("rearrange_q", 3), ("rearrange_k", 2), ("baddbmm", 2), ("causal_full", 2), ("causal_triu", 1),
            ("causal_to_dtype", 1), ("causal_add", 1), ("softmax", 1), ("einsum_copy_v", 2), ("bmm_pv", 1)]),
])
def test_pytorch_bench_pays_the_benchmarks_ops_before_each_launch(causal, ops):
    """attention_pytorch's forward, op by op (the host's part of its stopwatch time, simulator/host.py)."""
    program = pytorch_bench_forward(Workload(1, 1, 256, 256, 64, causal=causal), None, (128, 128, 64))
    assert [(launch.name, launch.host_ops) for launch in program.launches] == ops


def test_attention_ref_by_hand():
    # G = 1, N = 4, d = 2, fp16, no mask, one tile. Upcasts: Q, K, V read 16 B each, 32 B fp32
    # copies written; repeats and q*scale copy 32 B fp32 tensors; S = 4x4 fp32 = 64 B written,
    # (one GEMM tile: Q_scaled and K_rep read once by the einsum); softmax reads 64, writes P 64;
    # v*1/(1-p) reads V_rep 32; einsum reads P 64 and V 32,
    # writes O32 32; downcasts read O32 32 -> O 16 and P 64 -> attention 32.
    wl = Workload(1, 1, 4, 4, 2)
    io = counted(attention_ref_forward(wl, None, (8, 8, 8)), "forward")
    assert io == {"Q": (16, 0), "K": (16, 0), "V": (16, 0), "Q32": (32, 32), "K32": (32, 32), "V32": (32, 32),
                  "K_rep": (32, 32), "V_rep": (32, 32), "Q_scaled": (32, 32), "S": (64, 64), "P": (128, 64),
                  "V_dropscaled": (32, 32), "O32": (32, 32), "O": (0, 16), "attention": (0, 32)}
    assert io == closed("attention-ref", "forward", wl, (8, 8, 8))


def test_megatron_causal_by_hand():
    # G = 8, N = 32, d = 8, fp16, causal: fused upper-triangular kernel applies (b*np % 8 == 0).
    # It reads only j <= i: 8 * 32*33/2 = 4224 elements = 8448 B of S; writes P in full 16384 B.
    # Backward: the softmax kernel reads the lower triangles of dP and P (8448 B each) and writes dS
    # in place into dP (16384 B), after gemm_dp wrote dP (16384 B); gemm_dv reads P once more
    # (16384 B: d = 8 is one tile), gemm_dq and gemm_dk read dS = dP once each (16384 B each).
    wl = Workload(2, 4, 32, 32, 8, causal=True)
    assert megatron_fused_applies(wl)
    prog = megatron_training(wl, None, (32, 32, 8))
    fwd, bwd = counted(prog, "forward"), counted(prog, "backward")
    assert fwd["S"] == (8448, 16384) and fwd["P"] == (16384, 16384)
    assert bwd["P"] == (8448 + 16384, 0) and bwd["dP"] == (8448 + 2 * 16384, 16384 + 16384)
    assert fwd == closed("megatron", "forward", wl, (32, 32, 8))
    assert bwd == closed("megatron", "backward", wl, (32, 32, 8))


@pytest.mark.parametrize("fields, fused", [
    (dict(seq_len_q=32, seq_len_kv=32), True),
    (dict(seq_len_q=32, seq_len_kv=4100), False),       # sk > 4096
    (dict(seq_len_q=32, seq_len_kv=16), False),         # sk must exceed 16
    (dict(seq_len_q=30, seq_len_kv=32), False),         # sq % 4
    (dict(seq_len_q=32, seq_len_kv=32, dtype="fp32"), False),
    (dict(seq_len_q=32, seq_len_kv=32, causal=True, batch=1), False),   # b*np = 4, bpb = 8
    (dict(seq_len_q=32, seq_len_kv=36, causal=True), False),            # causal kernel: sq == sk
    (dict(seq_len_q=36, seq_len_kv=32), False),         # sq % batch_per_block (8)
    (dict(seq_len_q=36, seq_len_kv=132), True),         # sk > 128: bpb 4
])
def test_megatron_gate(fields, fused):
    wl = Workload(**{"batch": 2, "heads": 4, "head_dim": 8, **fields})
    assert megatron_fused_applies(wl) is fused and F.megatron_kernel_available(wl) is fused


@pytest.mark.parametrize("variant", VARIANTS)
def test_fast_mode_gemm_steps_keep_counts_and_numerics(variant):
    """Fast mode's GEMMs take several k-steps a simulated step: batch 1, 2 heads, N = 256, head dim
    16, tiles 32 x 32 x 4 (the P V and backward GEMMs' k-loops have 64 k-steps: 2 a step, 32
    steps). The outputs and gradients equal the float64 reference, the counts the closed forms,
    and fewer events are simulated."""
    wl, tile = Workload(1, 2, 256, 256, 16, causal=True), (32, 32, 4)
    data = random_data(wl, 3)
    mapping = STANDARD.mapping_type(*tile, variant=variant)
    fast = simulate(GPU, STANDARD.build(wl, mapping, data, True, fast=True))
    o, _ = attention_forward(wl, data)
    ref = attention_backward(wl, data, data.d_o)
    np.testing.assert_allclose(fast.outputs["O"].reshape(o.shape), o, rtol=0, atol=1e-12)
    for name in ("dQ", "dK", "dV"):
        np.testing.assert_allclose(fast.outputs[name].reshape(ref[name].shape), ref[name], rtol=0, atol=1e-12)
    whole = simulate(GPU, STANDARD.build(wl, mapping, None, True))
    for pass_name in ("forward", "backward"):
        assert {n: (t.read, t.write) for n, t in fast.tensors(pass_name).items() if t.read or t.write} == \
            closed(variant, pass_name, wl, tile)
    assert fast.sim_events < 0.8 * whole.sim_events


def test_a_wide_tensor_is_copied_in_square_tiles():
    """K^T-shaped (d, N) sources are copied in square tiles of the panel's rows (a few N-long row
    panels would leave most SMs idle while the real elementwise kernel fills them all): d = 64,
    N = 1024, panels of 64 rows -> 16 tiles of 64 x 64 for one batch-head; a (N, d) source keeps its
    row panels. The bytes and the transposed values are the same either way; the transposed
    source is read one 32-byte sector request an element at the L2 (65536 x 32 B), from DRAM once."""
    from hbmsim.algorithms.standard_torch_kernels import copy_launch
    from hbmsim.simulator import Program, Tensor
    src = Tensor("dK_T", (1, 64, 1024), "fp16", count_only=False)
    src.data[...] = np.arange(64 * 1024).reshape(1, 64, 1024)
    dst = Tensor("dK", (1, 1024, 64), "fp16", count_only=False)
    tall = Tensor("dQ_r", (1, 1024, 64), "fp16", count_only=True)
    tall_dst = Tensor("dQ", (1, 1024, 64), "fp16", count_only=True)
    launch = copy_launch("stack", [(src, dst, True, None), (tall, tall_dst, False, None)], 64, allocs=(dst, tall_dst))
    assert launch.grid == 16 + 16           # wide: 1 x 16 square tiles; tall: 16 row panels of 64 x 64
    r = simulate(GPU, Program("copy", [launch], inputs=(src, tall)))
    assert {n: (t.read, t.write) for n, t in r.tensors("forward").items()} == {
        "dK_T": (2097152, 0), "dK": (0, 131072), "dQ_r": (131072, 0), "dQ": (0, 131072)}
    assert np.array_equal(dst.data[0], src.data[0].T)


def test_a_gathered_read_is_a_sector_an_element_at_the_l2_and_its_bytes_once_from_dram():
    """tensor.GATHER by hand: one 64 x 64 fp16 tile (8192 B) read one element a request, on a GPU
    with a 1 MiB L2 at 1e11 B/s: 4096 requests x 32 B = 131072 B at the L2; the first touch misses,
    so DRAM fetches the tile's 8192 B once (at 1e11 B/s, 82 ns + 100 ns latency); the other
    131072 - 8192 = 122880 B are hits through the L2's pipe, 1.2288 us, which ends last. Without
    an L2 every request is DRAM's."""
    from hbmsim.simulator import Launch, Program, Tensor
    from hbmsim.simulator.tensor import GATHER, tile_sectors
    assert tile_sectors((1, 64, 64), 2, 0, 0, 64, 0, 64, GATHER) == 4096
    assert tile_sectors((1, 64, 64), 2, 0, 0, 64, 0, 64) == 256            # the same tile coalesced
    src = Tensor("K", (1, 64, 64), "fp16", count_only=True)

    def block(ctx, i):
        yield from ctx.load(src[0], slice(0, 64), slice(0, 64), GATHER)
    program = Program("gather", [Launch("gather", 1, 0, block, (), (), "forward")], inputs=(src,))
    r = simulate(tiny_gpu(l2_bytes=1 << 20, l2_bytes_per_s=1e11), program)
    t = r.tensors("forward")["K"]
    assert (t.read, t.hbm_read) == (131072, 8192)
    assert r.time_s == pytest.approx(122880 / 1e11, rel=1e-12)
    t = simulate(tiny_gpu(), program).tensors("forward")["K"]
    assert (t.read, t.hbm_read) == (131072, 131072)


def test_without_l2_sectors_a_gathered_tile_takes_the_l2_its_bytes_only():
    """The l2_sectors effect off: the same counts, but the L2's pipe serves a GATHER tile's bytes,
    not its sector requests. Two reads of one 64 x 64 fp16 tile (8192 B, 4096 requests) on a GPU
    with a 1 MiB L2 at 1e11 B/s and DRAM at 1e11 B/s, 100 ns latency: on, 122880 B then 131072 B
    through the L2 (1.22880 + 1.31072 us); off, the miss from DRAM (81.92 + 100 ns), then the
    hit's 8192 B through the L2 (81.92 ns)."""
    from hbmsim.simulator import Launch, Program, Tensor, TimeModel
    from hbmsim.simulator.tensor import GATHER
    src = Tensor("K", (1, 64, 64), "fp16", count_only=True)

    def block(ctx, i):
        for _ in range(2):
            yield from ctx.load(src[0], slice(0, 64), slice(0, 64), GATHER)
    program = Program("gather", [Launch("gather", 1, 0, block, (), (), "forward")], inputs=(src,))
    gpu = tiny_gpu(l2_bytes=1 << 20, l2_bytes_per_s=1e11)
    for model, time_s in ((TimeModel(), (122880 + 131072) / 1e11),
                          (TimeModel().off("l2_sectors"), 8192 / 1e11 + 1e-7 + 8192 / 1e11)):
        r = simulate(gpu, program, model=model)
        t = r.tensors("forward")["K"]
        assert (t.read, t.hbm_read) == (262144, 8192)
        assert r.time_s == pytest.approx(time_s, rel=1e-12)
    # each request a 64-byte slot of the L2's bandwidth (l2_sector_request_bytes): the L2's part
    # twice as long, the counts the same
    r = simulate(dataclasses.replace(gpu, l2_sector_request_bytes=64), program)
    assert r.time_s == pytest.approx(2 * (122880 + 131072) / 1e11, rel=1e-12)
    assert r.tensors("forward")["K"].read == 262144


def test_the_l2_lone_sectors_what_if(capsys):
    """`hbmsim run l2-lone-sectors` (PyTorch's attention on H100, B 32, H 32, N 512, head dim 64):
    with each lone sector request a 64-byte slot of the L2 instead of 32 bytes, the k rearrange's
    L2 part (1.07 GB of requests, 15/16 of them hits) takes twice as long, 121.4 -> 235.1 us
    predicted (about 250 measured); every other kernel, the stack included (its L2 part under its
    instruction issue), is unchanged, and so are the L2-side counts and FLOPs."""
    import json
    from hbmsim.scenarios.cli import main
    assert main(["run", "l2-lone-sectors", "--count-only", "--json", "-", "--quiet"]) == 0
    runs = [r for r in json.loads(capsys.readouterr().out)["runs"] if r["pass"] == "forward+backward"]
    (k32, k64) = ({k["name"]: k for k in r["kernels"]} for r in runs)
    assert k32["rearrange_k"]["time_s"] == pytest.approx(121.4e-6, abs=0.1e-6)
    assert k64["rearrange_k"]["time_s"] == pytest.approx(235.1e-6, abs=0.1e-6)
    for name in set(k32) - {"rearrange_k", "l2_writeback"}:    # (the pass-end write-back: what is dirty then)
        assert k64[name]["time_s"] == pytest.approx(k32[name]["time_s"], rel=2e-3), name
    for key in ("global_read_bytes", "global_write_bytes", "matmul_flops"):
        assert runs[0][key] == runs[1][key], key
