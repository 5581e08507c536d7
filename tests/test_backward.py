"""Backward passes: every registered program's gradients equal the float64 reference (and finite
differences), and its backward counters equal the closed forms in every mask mode."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hbmsim.algorithms import io_formulas as F
from hbmsim.algorithms import registry
from hbmsim.algorithms.flash2_backward import flash2_training
from hbmsim.algorithms.reference import attention_backward, attention_forward
from hbmsim.algorithms.standard_backward import standard_training
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.simulator import HbmsimError, simulate

from conftest import grouped, grouped_fields, seed_case, tiny_gpu

GPU = tiny_gpu(sram_bytes_per_sm=1 << 22)
SEED_DO = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], float)


# Every registered program that has a backward, in each of its variants: registering a program puts
# it under these tests.
VARIANTS = [(spec, v) for spec, v in registry.algorithm_variants() if "backward" in spec.passes]
IDS = [f"{spec.name}-{variant}" for spec, variant in VARIANTS]


def mapping(spec, variant, wl, bq, bkv):
    """The program's mapping with blocks (or GEMM tiles) bq tall and bkv wide, resolved for GPU."""
    m = spec.rectangular(bq, bkv, **({"variant": variant} if variant else {}))
    return spec.resolved(GPU, wl, m, True)[0]


def training(spec, variant, wl, data, bq, bkv):
    return spec.build(wl, mapping(spec, variant, wl, bq, bkv), data, True)


def trainings(wl, data, bq, bkv):
    return [training(spec, variant, wl, data, bq, bkv) for spec, variant in VARIANTS]


def grads(prog, shape_q, shape_k):
    out = simulate(GPU, prog).outputs
    return {"dQ": out["dQ"].reshape(shape_q), "dK": out["dK"].reshape(shape_k), "dV": out["dV"].reshape(shape_k)}


@pytest.mark.parametrize("spec, variant", VARIANTS, ids=IDS)
def test_seed_gradient_example_through_every_program(spec, variant):
    wl, data = seed_case()
    data.d_o = SEED_DO[None, None].copy()
    g = grads(training(spec, variant, wl, data, 2, 2), data.q.shape, data.k.shape)
    dv, dq, dk = g["dV"][0, 0], g["dQ"][0, 0], g["dK"][0, 0]
    np.testing.assert_allclose(dv, np.repeat([[0.590], [0.217], [0.976], [0.217]], 4, axis=1), atol=5e-4)
    np.testing.assert_allclose(dq[0], [-1.19, 1.19, 4.38, 1.91], atol=5e-3)
    np.testing.assert_allclose(dk[:, 0], [-12.99, -1.31, 8.66, 5.64], atol=5e-3)
    ref = attention_backward(wl, data, data.d_o)
    np.testing.assert_allclose(ref["D"][0, 0], [34.82, 0, 30.30, 0], atol=5e-3)
    np.testing.assert_allclose(ref["dS"][0, 0, 0], [-5.57, -0.73, 4.38, 1.91], atol=5e-3)
    for name in ("dQ", "dK", "dV"):
        np.testing.assert_allclose(g[name], ref[name], rtol=0, atol=1e-12)


shapes = grouped_fields(st.fixed_dictionaries({
    "batch": st.integers(1, 2), "heads": st.integers(1, 2), "seq_len_q": st.integers(1, 30),
    "seq_len_kv": st.integers(1, 30), "head_dim": st.sampled_from([1, 4, 8]),
    "dtype": st.sampled_from(["fp16", "bf16", "fp32"]), "causal": st.booleans(),
    "key_padding_mask": st.booleans(), "dropout": st.sampled_from([0.0, 0.3]),
}))


@settings(max_examples=40, deadline=None)
@given(shapes, st.integers(1, 13), st.integers(1, 13), st.integers(0, 2**31 - 1))
def test_gradients_equal_reference(fields, bq, bkv, seed):
    wl = Workload(**fields)
    data = random_data(wl, seed)
    ref = attention_backward(wl, data, data.d_o)
    for prog in trainings(wl, data, bq, bkv):
        g = grads(prog, data.q.shape, data.k.shape)
        for name in ("dQ", "dK", "dV"):
            assert np.all(np.isfinite(g[name])), (prog.name, name)
            np.testing.assert_allclose(g[name], ref[name], rtol=0, atol=1e-12, err_msg=f"{prog.name} {name}")


@pytest.mark.parametrize("fields", [dict(), dict(causal=True), dict(key_padding_mask=True, dropout=0.25),
                                    dict(causal=True, seq_len_q=5, seq_len_kv=7)])
def test_reference_backward_equals_finite_differences(fields):
    wl = Workload(**{"batch": 1, "heads": 2, "seq_len_q": 6, "seq_len_kv": 6, "head_dim": 3, **fields})
    data = random_data(wl, 7)
    ref = attention_backward(wl, data, data.d_o)

    def loss():   # L = sum(O * dO): its gradient w.r.t. q, k, v is what backward returns
        return float(np.sum(attention_forward(wl, data)[0] * data.d_o))
    h = 1e-6
    for name, arr in (("dQ", data.q), ("dK", data.k), ("dV", data.v)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            old = arr[idx]
            arr[idx] = old + h
            up = loss()
            arr[idx] = old - h
            down = loss()
            arr[idx] = old
            num[idx] = (up - down) / (2 * h)
        np.testing.assert_allclose(ref[name], num, rtol=0, atol=1e-7, err_msg=name)


def test_fully_masked_rows_and_unseen_keys_give_zero_gradients():
    wl = Workload(2, 1, 10, 4, 8, causal=True, key_padding_mask=True)
    data = random_data(wl, 3)
    data.kv_lens = np.array([4, 0])
    ref = attention_backward(wl, data, data.d_o)
    assert np.all(ref["dQ"][1] == 0) and np.all(ref["dK"][1] == 0) and np.all(ref["dQ"][0, 0, :6] == 0)
    for prog in trainings(wl, data, 3, 2):
        g = grads(prog, data.q.shape, data.k.shape)
        for name in ("dQ", "dK", "dV"):
            assert not np.any(np.isnan(g[name]))
            np.testing.assert_allclose(g[name], ref[name], rtol=0, atol=1e-12)


def test_nan_in_output_gradient_is_rejected():
    wl = Workload(1, 1, 4, 4, 4)
    data = random_data(wl, 0)
    data.d_o[0, 0, 2, 1] = np.inf
    with pytest.raises(HbmsimError, match="input dO: contains NaN or inf"):
        flash2_training(wl, 2, 2, data)


workloads = grouped(st.builds(
    Workload, batch=st.integers(1, 3), heads=st.sampled_from([1, 2, 4]), seq_len_q=st.integers(1, 300),
    seq_len_kv=st.integers(1, 300), head_dim=st.sampled_from([8, 64]),
    dtype=st.sampled_from(["fp16", "fp32"]), causal=st.booleans(), key_padding_mask=st.booleans(),
    dropout=st.sampled_from([0.0, 0.1])))


# Blocks and tiles from 4 up: a 1 x 1 tile over N = 300 is millions of simulated steps (minutes of
# wall time for one example); tiny blocks are covered on tiny shapes in test_tiny_blocks_and_tiles.
BLOCKS = st.integers(4, 130)
TILES = st.integers(4, 130)


def counted_backward(prog):
    return {name: (t.read, t.write) for name, t in simulate(GPU, prog).tensors("backward").items()}


def nonzero(io):
    return {k: v for k, v in io.items() if v != (0, 0)}


# Each program's default variant (the standard variants' counts: test_standard_variants.py; the v1
# kernel's: test_flash1_kernel.py).
DEFAULTS = [(spec, variant) for spec, variant in VARIANTS if variant == (spec.variants or (None,))[0]]
DEFAULT_IDS = [f"{spec.name}-{variant}" for spec, variant in DEFAULTS]


@pytest.mark.parametrize("spec, variant", DEFAULTS, ids=DEFAULT_IDS)
@settings(max_examples=20, deadline=None)
@given(wl=workloads, bq=BLOCKS, bkv=BLOCKS)
def test_backward_counts_equal_closed_form(spec, variant, wl, bq, bkv):
    m = mapping(spec, variant, wl, bq, bkv)
    prog = spec.build(wl, m, None, True)
    assert counted_backward(prog) == spec.io(wl, m, "backward")
    fwd = {name: (t.read, t.write) for name, t in simulate(GPU, prog).tensors("forward").items()}
    assert fwd == spec.io(wl, m, "forward")


def test_causal_flash_backward_moves_about_half_the_kv_side_bytes():
    base = dict(batch=1, heads=1, seq_len_q=8192, seq_len_kv=8192, head_dim=64)
    for io in (F.flash1_backward_io, F.flash2_backward_io):
        full, causal = io(Workload(**base), 128, 128), io(Workload(**base, causal=True), 128, 128)
        # the per-pair terms (Q, dO read per visited pair) halve: 64 blocks -> (64 + 1) / 2 on average
        assert causal["Q"][0] / full["Q"][0] == pytest.approx(65 / 2 / 64)
    std_full = F.standard_backward_io(Workload(**base))
    std_causal = F.standard_backward_io(Workload(**base, causal=True))
    assert std_causal["dP"] == std_full["dP"] and std_causal["dS"][0] > std_full["dS"][0]


def test_training_footprint_standard_keeps_p_flash_keeps_o_and_lse():
    wl = Workload(1, 1, 512, 512, 32, dropout=0.1)
    e, n, d = 2, 512, 32
    std = simulate(GPU, standard_training(wl))
    fwd_peak = max(k.hbm_peak_bytes for k in std.select("forward"))
    # S is freed after the softmax; training keeps P, P_drop and the 1-byte mask, so the forward
    # peaks in gemm_pv: Q, K, V, O + P + P_drop + mask
    assert fwd_peak == 4 * n * d * e + 2 * n * n * e + n * n * 1
    fl = simulate(GPU, flash2_training(wl, 64, 64))
    # Q, K, V, O, dO, dK, dV, dQ in the storage dtype, the fp32 dQ accumulator, lse and D: O(N d)
    assert fl.hbm_peak_bytes == 8 * n * d * e + n * d * 4 + 2 * n * 4


@pytest.mark.parametrize("l2_bytes", [0, 3000, 1 << 26])
def test_counts_hold_with_l2_and_forward_pass_of_training_equals_forward(l2_bytes):
    # The L2 changes where bytes are served, never how many a program requests.
    gpu = tiny_gpu(sram_bytes_per_sm=1 << 22, l2_bytes=l2_bytes, l2_bytes_per_s=1e12 if l2_bytes else 0.0)
    wl = Workload(2, 2, 70, 45, 16, causal=True, key_padding_mask=True, dropout=0.1)

    def counted(prog, pass_name):
        return nonzero({n: (t.read, t.write) for n, t in simulate(gpu, prog).tensors(pass_name).items()})
    for spec, variant in VARIANTS:
        m = mapping(spec, variant, wl, 16, 8)
        prog = spec.build(wl, m, None, True)
        for pass_name in ("forward", "backward"):
            assert counted(prog, pass_name) == nonzero(spec.io(wl, m, pass_name)), (spec.name, variant, pass_name)


def test_each_pass_is_credited_with_its_own_dram_writes():
    # Everything fits in L2: DRAM writes happen only at the end-of-program write-back, which must
    # credit the forward's outputs (O, lse) to the forward pass, as in a forward-only run.
    from hbmsim.algorithms.flash2 import flash2_forward
    gpu = tiny_gpu(sram_bytes_per_sm=1 << 22, l2_bytes=1 << 26, l2_bytes_per_s=1e12)
    wl = Workload(2, 4, 128, 128, 32)
    fwd_only = simulate(gpu, flash2_forward(wl, 64, 64))
    train = simulate(gpu, flash2_training(wl, 64, 64))
    assert train.total("hbm_write", "forward") == fwd_only.total("hbm_write") == 2 * 4 * 128 * (32 * 2 + 4)
    assert [k.name for k in train.kernels if k.name == "l2_writeback"] == ["l2_writeback"] * 2
    # backward's own DRAM writes: dQ, dK, dV (storage dtype) and D, dQ_accum (fp32), all dirty at the end
    assert train.total("hbm_write", "backward") == 8 * 128 * 32 * (3 * 2 + 4) + 8 * 128 * 4


@pytest.mark.parametrize("blocks", [(1, 1), (1, 3), (2, 1)])
def test_tiny_blocks_and_tiles(blocks):
    """Blocks and tiles of one or two rows, on a ragged tiny workload with every mask."""
    wl = Workload(1, 2, 5, 4, 3, causal=True, key_padding_mask=True, dropout=0.1)
    for spec, variant in VARIANTS:
        m = mapping(spec, variant, wl, *blocks)
        prog = spec.build(wl, m, None, True)
        assert counted_backward(prog) == spec.io(wl, m, "backward"), (spec.name, variant)
        fwd = {n: (t.read, t.write) for n, t in simulate(GPU, prog).tensors("forward").items()}
        assert fwd == spec.io(wl, m, "forward"), (spec.name, variant)


def test_fa2_grids_turn_the_batch_before_the_head():
    """FA2's grids are (blocks, batch, heads) (flash_fwd_launch_template.h: dim3 grid(num_m_block,
    params.b, params.h)), so the batch-heads come in the order b0h0, b1h0, b0h1, ... (common.fa2_batch_head),
    g = b x heads + h. Batch 2, 3 heads."""
    from hbmsim.algorithms.common import fa2_batch_head
    from hbmsim.algorithms.workload import Workload
    wl = Workload(2, 3, 64, 64, 16)
    assert [fa2_batch_head(wl, bh) for bh in range(6)] == [0, 3, 1, 4, 2, 5]
    # grouped-query heads (2 query heads a K/V head): the two heads of a group are a batch apart
    gqa = Workload(2, 4, 64, 64, 16, kv_heads=2)
    assert [gqa.kv_group(fa2_batch_head(gqa, bh)) for bh in range(8)] == [0, 2, 0, 2, 1, 3, 1, 3]


def test_fa2_kernel_computes_whole_tiles_at_the_sequences_ends_by_hand():
    """FA2's kernels run their MMAs and softmax over whole kBlockM x kBlockN tiles, a last block's
    rows and keys past the sequence too (loaded as zeros, masked: flash_fwd_kernel.h and
    flash_bwd_kernel.h with Is_even_MN false); only the bytes are cut. H100, head dim 64, N = 200:
    the forward's 128 x 128 tiles, 2 query blocks x 2 K/V tiles, and the backward's 128 x 128, 2
    K/V blocks x 2 query tiles, every one whole; a training run's forward as a forward-only run's.
    The paper variant computes its real keys, and its blocks' block_q rows (q_tile_rows = block_q),
    in training as alone; its backward the real rows and keys."""
    from hbmsim.scenarios.experiment import resolve_hardware
    h100 = resolve_hardware("h100-sxm5-80gb")
    spec = registry.get("flash2")
    wl = Workload(1, 2, 200, 200, 64, dtype="bf16")
    m = spec.resolved(h100, wl, spec.mapping_type(), True)[0]
    assert (m.block_q, m.block_kv, m.block_q_bwd, m.block_kv_bwd, m.q_tile_rows) == (128, 128, 128, 128, 128)
    whole = 2 * 2 * 2 * 128 * 128 * 64                        # batch-heads x blocks x tiles x rows x keys x d
    res = simulate(h100, spec.build(wl, m, None, True))
    fwd, main = (next(k for k in res.kernels if k.name == name) for name in ("flash2_fwd", "flash2_bwd"))
    assert fwd.matmul_flops == 4 * whole                      # S = Q K^T, O += P V: 2 FLOPs a multiply-add
    assert main.matmul_flops == 10 * whole                    # the backward's five GEMMs
    assert main.exp_ops == whole // 64
    alone = simulate(h100, spec.build(wl, spec.resolved(h100, wl, spec.mapping_type(), False)[0], None, False))
    assert alone.kernels[0].matmul_flops == fwd.matmul_flops
    for p in ("forward", "backward"):                         # the bytes: the real rows' closed forms
        got = {n: (t.read, t.write) for n, t in res.tensors(p).items() if t.read or t.write}
        assert got == {n: rw for n, rw in spec.io(wl, m, p).items() if rw[0] or rw[1]}
    paper = spec.resolved(h100, wl, spec.mapping_type(variant="paper", block_q=128, block_kv=128), True)[0]
    kernels = simulate(h100, spec.build(wl, paper, None, True)).kernels
    assert next(k for k in kernels if k.name == "flash2_fwd").matmul_flops == 4 * 2 * 256 * 200 * 64
    assert next(k for k in kernels if k.name == "flash2_bwd").matmul_flops == 10 * 2 * 200 * 200 * 64
