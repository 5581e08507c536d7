"""Every registered program, in each of its variants, computes the same O as the float64 reference
(1e-12), through the simulator."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hbmsim.algorithms import registry
from hbmsim.algorithms.flash2 import flash2_forward
from hbmsim.algorithms.reference import attention_forward
from hbmsim.algorithms.standard import standard_forward
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.simulator import HbmsimError, simulate

from conftest import grouped_fields, SEED_O, SEED_V, seed_case, tiny_gpu

GPU = tiny_gpu(sram_bytes_per_sm=1 << 20)


# Every registered program, in each of its variants: registering a program puts it under these tests.
VARIANTS = registry.algorithm_variants()
IDS = [f"{spec.name}-{variant}" for spec, variant in VARIANTS]


def forward(spec, variant, wl, data, bq, bkv):
    """The program's forward with blocks (or GEMM tiles) bq tall and bkv wide, resolved for GPU."""
    mapping, _ = spec.resolved(GPU, wl, spec.rectangular(bq, bkv, **({"variant": variant} if variant else {})), False)
    return spec.build(wl, mapping, data, False)


def programs(wl, data, bq, bkv):
    return [forward(spec, variant, wl, data, bq, bkv) for spec, variant in VARIANTS]


@pytest.mark.parametrize("spec, variant", VARIANTS, ids=IDS)
def test_seed_example_through_every_program(spec, variant):
    wl, data = seed_case()
    prog = forward(spec, variant, wl, data, 2, 2)
    o = simulate(GPU, prog).outputs["O"][0]
    np.testing.assert_allclose(o, SEED_O, atol=0.005)      # the numbers, 2 decimals
    o_ref, _ = attention_forward(wl, seed_case()[1])
    np.testing.assert_allclose(o, o_ref[0, 0], rtol=0, atol=1e-12)


def test_seed_reference_row0_by_hand():
    # Row 0 scores: q0 = [1,0,1,0] against K rows -> [1, 0, 2, 0]; softmax weights e^s / sum.
    wl, data = seed_case()
    o, lse = attention_forward(wl, data)
    w = np.exp([1.0, 0.0, 2.0, 0.0])
    np.testing.assert_allclose(o[0, 0, 0], (w / w.sum()) @ SEED_V, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse[0, 0, 0], np.log(w.sum()), rtol=0, atol=1e-12)


shapes = grouped_fields(st.fixed_dictionaries({
    "batch": st.integers(1, 2), "heads": st.integers(1, 2), "seq_len_q": st.integers(1, 40),
    "seq_len_kv": st.integers(1, 40), "head_dim": st.sampled_from([1, 4, 8, 16]),
    "dtype": st.sampled_from(["fp16", "bf16", "fp32"]), "causal": st.booleans(),
    "key_padding_mask": st.booleans(), "dropout": st.sampled_from([0.0, 0.0, 0.25]),
}))


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(1, 17), st.integers(1, 17), st.integers(0, 2**31 - 1))
def test_programs_equal_reference(fields, bq, bkv, seed):
    wl = Workload(**fields)
    data = random_data(wl, seed)
    o_ref, lse_ref = attention_forward(wl, data)
    for prog in programs(wl, data, bq, bkv):
        out = simulate(GPU, prog).outputs
        o = out["O"].reshape(o_ref.shape)
        assert np.all(np.isfinite(o)), prog.name
        np.testing.assert_allclose(o, o_ref, rtol=0, atol=1e-12, err_msg=prog.name)
        if "lse" in out:
            lse = out["lse"].reshape(lse_ref.shape)
            assert np.array_equal(np.isinf(lse), np.isinf(lse_ref))
            fin = np.isfinite(lse_ref)
            np.testing.assert_allclose(lse[fin], lse_ref[fin], rtol=0, atol=1e-12)


def test_fully_masked_rows_give_zeros_not_nan():
    # Causal with more queries than keys (bottom-right aligned): the first 6 query rows see no key;
    # batch entry 1 has no valid key at all.
    wl = Workload(2, 1, 10, 4, 8, causal=True, key_padding_mask=True)
    data = random_data(wl, 3)
    data.kv_lens = np.array([4, 0])
    o_ref, lse_ref = attention_forward(wl, data)
    assert np.all(o_ref[0, 0, :6] == 0) and np.all(o_ref[1] == 0) and np.all(np.isneginf(lse_ref[1]))
    for prog in programs(wl, data, 3, 2):
        o = simulate(GPU, prog).outputs["O"].reshape(o_ref.shape)
        assert not np.any(np.isnan(o)), prog.name
        np.testing.assert_allclose(o, o_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_nan_input_is_rejected_naming_the_tensor(name):
    wl = Workload(1, 1, 4, 4, 4)
    data = random_data(wl, 0)
    getattr(data, name)[0, 0, 1, 2] = np.nan
    with pytest.raises(HbmsimError, match=f"input {name}: contains NaN or inf"):
        flash2_forward(wl, 2, 2, data)


def test_shapes_that_disagree_are_rejected():
    wl = Workload(1, 2, 4, 4, 4)
    data = random_data(Workload(1, 2, 4, 5, 4), 0)
    with pytest.raises(HbmsimError,
                       match=r"input k: shape \(1, 2, 5, 4\) disagrees with the workload's \(1, 2, 4, 4\)"):
        standard_forward(wl, data)


def test_count_only_gives_same_counts_and_time():
    wl = Workload(2, 2, 33, 21, 8, causal=True, dropout=0.1)
    for with_data, without in zip(programs(wl, random_data(wl, 1), 8, 4), programs(wl, None, 8, 4)):
        a, b = simulate(GPU, with_data).to_dict(), simulate(GPU, without).to_dict()
        assert a == b
