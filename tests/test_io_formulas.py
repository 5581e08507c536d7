"""The simulator's per-tensor counters equal the closed forms in algorithms/io_formulas.py, and
the growth laws of standard and flash attention show in them."""

import pytest
from hypothesis import given, settings, strategies as st

from hbmsim.algorithms import io_formulas as F
from hbmsim.algorithms.blocks import auto_blocks
from hbmsim.algorithms.flash1 import flash1_forward
from hbmsim.algorithms.flash2 import flash2_forward
from hbmsim.algorithms.standard import standard_forward
from hbmsim.algorithms.standard_spec import KERNEL_LISTS
from hbmsim.algorithms.workload import Workload
from hbmsim.simulator import simulate

from conftest import grouped, tiny_gpu

GPU = tiny_gpu(sram_bytes_per_sm=1 << 22, sm_count=8)


def counted(prog, gpu=GPU):
    return {name: (t.read, t.write) for name, t in simulate(gpu, prog).tensors().items()}


workloads = grouped(st.builds(
    Workload, batch=st.integers(1, 3), heads=st.sampled_from([1, 2, 3, 4]), seq_len_q=st.integers(1, 300),
    seq_len_kv=st.integers(1, 300), head_dim=st.sampled_from([8, 32, 64, 128]),
    dtype=st.sampled_from(["fp16", "bf16", "fp32"]), causal=st.booleans(), key_padding_mask=st.booleans(),
    dropout=st.sampled_from([0.0, 0.1])))


@settings(max_examples=40, deadline=None)
@given(workloads, st.integers(4, 160), st.integers(4, 160))   # tiny blocks: test_backward's tiny test
def test_flash2_counts_equal_closed_form(wl, bq, bkv):
    assert counted(flash2_forward(wl, bq, bkv)) == F.flash2_forward_io(wl, bq, bkv)


@settings(max_examples=40, deadline=None)
@given(workloads, st.integers(4, 160), st.integers(4, 160))   # tiny blocks: test_backward's tiny test
def test_flash1_counts_equal_closed_form(wl, bq, bkv):
    assert counted(flash1_forward(wl, bq, bkv)) == F.flash1_forward_io(wl, bq, bkv)


@settings(max_examples=30, deadline=None)
@given(workloads, st.integers(4, 130), st.integers(4, 130), st.integers(4, 70))
def test_standard_counts_equal_closed_form(wl, tm, tn, tk):
    eager = KERNEL_LISTS["eager"]          # with kv_heads < heads: repeat_kv's copies first (gqa.py)
    assert counted(eager.forward(wl, None, (tm, tn, tk))) == eager.forward_io(wl, (tm, tn, tk))


def test_flash2_by_hand():
    # B*H = 2, N = 256, d = 64, fp16, 128 x 64 blocks: Q, O once (2*256*64*2 = 65536 B each);
    # K, V read by each of the 2 query blocks: 2 * 65536 = 131072 B each; lse 2*256*4 = 2048 B.
    io = counted(flash2_forward(Workload(1, 2, 256, 256, 64), 128, 64))
    assert io == {"Q": (65536, 0), "K": (131072, 0), "V": (131072, 0), "O": (0, 65536), "lse": (0, 2048)}


def test_standard_by_hand():
    # B*H = 1, N = 256, d = 64, fp16, GEMM tiles 128x128x64; elementwise panels of 128 rows.
    # S = QK^T: Q read once per column tile (2), K once per row tile (2): 2 * 32768 each.
    # S: written by the GEMM, read+written by scale, read by softmax: 131072 B each pass.
    # O = PV: 128x64 output tiles (tile_n clamps to d = 64): P read once, V once per row tile (2).
    io = counted(standard_forward(Workload(1, 1, 256, 256, 64), None, (128, 128, 64)))
    assert io == {"Q": (65536, 0), "K": (65536, 0), "S": (2 * 131072, 2 * 131072), "P": (131072, 131072),
                  "V": (65536, 0), "O": (0, 32768)}


def test_causal_flash_reads_about_half_the_kv_of_non_causal():
    wl = dict(batch=1, heads=1, seq_len_q=4096, seq_len_kv=4096, head_dim=64)
    full = F.flash2_forward_io(Workload(**wl), 128, 128)["K"][0]
    causal = F.flash2_forward_io(Workload(**wl, causal=True), 128, 128)["K"][0]
    assert causal / full == pytest.approx((32 + 1) / 2 / 32)     # blocks 1..32 of 32
    std_full = F.standard_forward_io(Workload(**wl))
    std_causal = F.standard_forward_io(Workload(**wl, causal=True))
    assert std_causal["K"] == std_full["K"] and std_causal["S"][0] > std_full["S"][0]


def _total(io):
    r, w = F.total_io(io)
    return r + w


def test_leading_terms_standard_6n2e_flash2_2n2de_over_br():
    # standard: S written (gemm), read+written (scale), read (softmax); P written, read (gemm_pv):
    # 6 G N^2 e; plus the GEMMs re-reading Q, K (once per 128-wide tile of S) and V (once per
    # 128-row tile of O): 3 G N^2 d e / 128. flash2: K and V each read N/Br times: 2 G N^2 d e / Br.
    g, d, e, br = 16, 64, 2, 128
    for n in (8192, 16384):
        std = _total(F.standard_forward_io(Workload(1, g, n, n, d)))
        fl = _total(F.flash2_forward_io(Workload(1, g, n, n, d), br, 128))
        assert std == pytest.approx((6 + 3 * d / 128) * g * n * n * e, rel=0.01)
        assert fl == pytest.approx(2 * g * n * n * d * e / br, rel=0.02)   # + Q, O: O(N d)


def test_flash_kv_traffic_scales_as_n2_d2_over_m():
    # With the paper's auto blocks (B_r = min(M/4d, d)), K/V reads ~ N^2 d e / B_r; in the regime
    # M/4d < d, B_r ~ M/4d and traffic ~ N^2 d^2 / M: doubling M halves it.
    wl = Workload(1, 1, 8192, 8192, 128)
    kv = lambda sram: F.flash2_forward_io(wl, *auto_blocks(sram, 2, 128, 8192, 8192))["K"][0]
    assert kv(65536) / kv(131072) == pytest.approx(2, rel=0.01)


def test_hbm_footprint_standard_quadratic_flash_linear():
    def peak(prog):
        return simulate(tiny_gpu(sm_count=16, hbm_bytes_per_s=1e13), prog).hbm_peak_bytes
    n1, n2 = 512, 1024
    std = [peak(standard_forward(Workload(1, 1, n, n, 32))) for n in (n1, n2)]
    fl = [peak(flash2_forward(Workload(1, 1, n, n, 32), 64, 64)) for n in (n1, n2)]
    e = 2
    # standard peak: Q, K, V + S and P alive together in the softmax: 3 N d e + 2 N^2 e
    assert std == [3 * n * 32 * e + 2 * n * n * e for n in (n1, n2)]
    # flash2 peak: Q, K, V, O (N d e each) + lse (4 N): linear in N
    assert fl == [4 * n * 32 * e + 4 * n for n in (n1, n2)]


def test_grouped_query_by_hand():
    # B = 1, 4 query heads sharing 1 K/V head (multi-query), N = 256, d = 64, fp16, 128 x 64 blocks.
    # flash2 reads the shared head in place: each of the 4 query heads' 2 query blocks requests all
    # of K (32768 B): 4 * 2 * 32768 = 262144 B of K and of V, as multi-head attention requests.
    wl = Workload(1, 4, 256, 256, 64, kv_heads=1)
    assert counted(flash2_forward(wl, 128, 64))["K"] == (262144, 0)
    # eager standard attention first copies K and V per query head (repeat_kv): 4 * 32768 B read
    # from K and written to K_rep; its GEMM then reads K_rep as multi-head attention reads K.
    eager = KERNEL_LISTS["eager"]
    io = counted(eager.forward(wl, None, (128, 128, 64)))
    assert io["K"] == (131072, 0) and io["K_rep"] == (4 * 65536, 131072)
