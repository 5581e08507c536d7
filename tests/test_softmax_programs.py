"""Softmax on its own (algorithms/softmax.py): three passes (safe) or two (online) over global
memory, counted exactly; the same numbers as the float64 reference; online's running max and sum
by hand."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hbmsim.algorithms.softmax import softmax_io, softmax_program
from hbmsim.simulator import Tensor, simulate

from conftest import tiny_gpu


def reference(x):
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    s = e.sum(axis=-1, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


@settings(max_examples=40, deadline=None)
@given(g=st.integers(1, 3), r=st.integers(1, 5), c=st.integers(1, 40), chunk=st.integers(1, 16),
       kind=st.sampled_from(["safe", "online"]), dtype=st.sampled_from(["fp16", "bf16", "fp32"]),
       seed=st.integers(0, 2**16))
def test_bytes_equal_the_closed_form_and_values_the_reference(g, r, c, chunk, kind, dtype, seed):
    x = np.random.default_rng(seed).standard_normal((g, r, c)) * 5
    x[0, 0, :] = -np.inf                                   # a fully masked row: zeros, never NaN
    res = simulate(tiny_gpu(), softmax_program(kind, Tensor("X", x.shape, dtype, x.copy()), chunk))
    itemsize = {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]
    counted = {n: (t.read, t.write) for n, t in res.kernels[0].tensors.items()}
    assert counted == softmax_io(kind, x.shape, itemsize)
    # no L2 on the tiny GPU: every byte is a DRAM byte
    assert {n: (t.hbm_read, t.hbm_write) for n, t in res.kernels[0].tensors.items()} == counted
    np.testing.assert_allclose(res.outputs["Y"], reference(x), rtol=0, atol=1e-12)
    assert not np.any(np.isnan(res.outputs["Y"]))


def test_online_running_max_and_sum_by_hand():
    # one row [0, 1, 0 | 0, 2, 0] in chunks of 3:
    # chunk 1: m -inf -> 1, l = e^-1 + 1 + e^-1 = 1.736
    # chunk 2: m 1 -> 2, c = e^-1, l = e^-1 (1 + 2e^-1) + e^-2 + 1 + e^-2 = 1 + e^-1 + 4e^-2 = 1.909
    x = np.array([[[0.0, 1, 0, 0, 2, 0]]])
    notes = []
    res = simulate(tiny_gpu(), softmax_program("online", Tensor("X", x.shape, "fp32", x.copy()), chunk=3),
                   listener=lambda *a: notes.append(a[-1]))
    first, second = notes
    assert (first["m_old"], first["m_new"]) == (-np.inf, 1) and first["l"] == pytest.approx(1 + 2 / math.e)
    assert (second["m_old"], second["m_new"]) == (1, 2) and second["c"] == pytest.approx(1 / math.e)
    assert second["l"] == pytest.approx(1 + 1 / math.e + 4 / math.e ** 2) == pytest.approx(1.909, abs=5e-4)
    assert res.outputs["Y"][0, 0, 4] == pytest.approx(1 / second["l"])


def test_three_passes_cost_more_than_two_on_a_memory_bound_gpu():
    x = Tensor("X", (4, 64, 4096), "fp16")
    gpu = tiny_gpu()
    safe, online = (simulate(gpu, softmax_program(k, x)).time_s for k in ("safe", "online"))
    # 4 and 3 passes of 2 MiB at 1e11 B/s: about 4/3 of the time
    assert safe / online == pytest.approx(4 / 3, rel=0.05)
