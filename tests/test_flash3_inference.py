"""flash3 for inference: FA3's PackGQA over any number of query rows (flash3_pack.py) and its paged
KV cache (page_table, with TMA or the producer's cp.async: flash3_spec.fa3_paged_tma). Numerics
against the float64 reference and counters against the closed forms over random shapes; FA3's
rules and a paged decode step worked by hand; bad input in one line."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import counted_by_tensor as counted
from conftest import nonzero

from hbmsim.algorithms import registry
from hbmsim.algorithms.flash3_spec import fa3_forward_tiles, fa3_paged_tma
from hbmsim.algorithms.reference import attention_forward
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.scenarios.experiment import resolve_hardware
from hbmsim.simulator import HbmsimError, simulate

H100 = resolve_hardware("h100-sxm5-80gb")
SPEC = registry.get("flash3")


def run(wl, data=None, **fields):
    m, notes = SPEC.resolved(H100, wl, SPEC.mapping_type(**fields), False)
    return m, notes, simulate(H100, SPEC.build(wl, m, data, False))


@st.composite
def shapes(draw):
    kv_heads = draw(st.sampled_from([1, 2]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 3, 4]))
    nq = draw(st.sampled_from([1, 1, 2, 5, 40, 130]))
    nk = draw(st.integers(max(1, nq), 700))
    page = draw(st.sampled_from([None, None, 16, 64, 128, 256]))
    wl = Workload(draw(st.integers(1, 2)), heads, nq, nk, draw(st.sampled_from([16, 64])), dtype="bf16",
                  causal=draw(st.booleans()), kv_heads=kv_heads, kv_page_size=page)
    fields = dict(num_splits=draw(st.sampled_from(["auto", 1, 2, 3])), pack_gqa=draw(st.sampled_from(["auto", False])),
                  variant=draw(st.sampled_from(["fa3-kernel", "fa3-kernel", "fp8"])))
    return wl, fields


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes(), st.integers(0, 3))
def test_packed_and_paged_equal_reference_and_closed_form(case, seed):
    """Query heads packed or not (1-4 a K/V head, 1 to 130 query rows, causal or not), contiguous or
    paged (pages of 16 to 256 tokens, with TMA or without), split or not, fp16 and FP8: O and lse
    equal the float64 reference, every tensor's bytes the closed form (block_table included), 0
    bytes off; K and V bytes are a contiguous cache's."""
    wl, fields = case
    data = random_data(wl, seed)
    m, _, res = run(wl, data, **fields)
    o_ref, lse_ref = attention_forward(wl, data)
    np.testing.assert_allclose(res.outputs["O"].reshape(o_ref.shape), o_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(res.outputs["lse"].reshape(lse_ref.shape), lse_ref, rtol=0, atol=1e-12)
    got = counted(res)
    assert got == nonzero(SPEC.io(wl, m, "forward"))
    if wl.kv_page_size is not None:
        contiguous = SPEC.io(replace(wl, kv_page_size=None), m, "forward")
        assert got["K"] == contiguous["K"] and got["V"] == contiguous["V"]


def test_fa3s_paged_rules_by_hand():
    """get_pagedkv_tma (hopper/flash_api.cpp): TMA when the page holds whole tiles of the unpaged
    kernel (kBlockN 176 at head dim 128 unmasked, 128 causal) and the packed query rows exceed
    kBlockM (128); else cp.async with tile_size_fwd_sm90's paged tiles (128 keys at head dims 64
    and 128, 96 at 192; FP8 160 at 128, and no intra-warpgroup overlap at 256)."""
    prefill = Workload(1, 8, 512, 512, 128, dtype="bf16", causal=True, kv_heads=2, kv_page_size=256)
    assert fa3_paged_tma(prefill, False)                                   # 256 % 128 == 0, 2048 > 128
    assert not fa3_paged_tma(replace(prefill, causal=False), False)        # 256 % 176 != 0
    assert not fa3_paged_tma(replace(prefill, seq_len_q=32), False)        # 32 x 4 = 128 rows, not more
    assert not fa3_paged_tma(replace(prefill, kv_page_size=16), False)     # vLLM's 16-token pages
    assert fa3_forward_tiles(64, False, False, True) == (192, 128, True, True)
    assert fa3_forward_tiles(128, False, False, True) == (128, 128, True, True)
    assert fa3_forward_tiles(192, False, False, True)[1] == 96
    assert fa3_forward_tiles(128, False, True, True)[1] == 160
    assert fa3_forward_tiles(256, False, True, True) == (128, 128, True, False)


def test_a_paged_decode_step_by_hand():
    """A decode step on vLLM's 16-token pages: batch 2, 8 query heads on 2 K/V heads, N = 300, head
    dim 128. No TMA (16 is no multiple of 176), so 128-key tiles and the 4 query heads packed: 4
    blocks (one a K/V head), each reading its K/V head's 300 keys once, page by page (19 pages: 18
    reads of 16 rows and one of 12, a tile of 128 keys crossing 8 pages) and its 19 table entries
    (76 B); 3 tiles (300 keys, whole: 384 columns) of 128 rows (the tile's kBlockM, two 64-row
    warpgroups) computed. The same run contiguous reads the same K and V bytes in 176-key tiles."""
    wl = Workload(2, 8, 1, 300, 128, dtype="bf16", kv_heads=2, kv_page_size=16)
    data = random_data(wl, seed=5)
    m, notes, res = run(wl, data)
    assert (m.block_q, m.block_kv, m.pack_gqa, m.num_splits, m.q_tile_rows) == (4, 128, True, 1, 128)
    k = res.kernels[0]
    assert k.grid == 4 and k.matmul_flops == 4 * 2 * 2 * 128 * 384 * 128
    got = counted(res)
    assert got["K"] == (4 * 300 * 128 * 2, 0) and got["block_table"] == (4 * 19 * 4, 0)
    assert got == nonzero(SPEC.io(wl, m, "forward"))
    o_ref, _ = attention_forward(wl, data)
    np.testing.assert_allclose(res.outputs["O"].reshape(o_ref.shape), o_ref, rtol=0, atol=1e-12)
    contiguous, _, res_c = run(replace(wl, kv_page_size=None))
    assert contiguous.block_kv == 176 and counted(res_c)["K"] == got["K"] and "block_table" not in counted(res_c)
    # a causal decode step is run unmasked (mha_fwd): the unmasked tiles, no causal tile order; but
    # at head dims 65-128 with pages it stays causal (the causal order, LPT)
    causal = run(replace(wl, causal=True, kv_page_size=None))[0]
    assert (causal.block_kv, causal.lpt_order) == (176, False)
    assert run(replace(wl, head_dim=64, causal=True, kv_page_size=None))[0].block_kv == 192
    assert run(replace(wl, causal=True))[0].lpt_order is True


def test_fa3_packs_without_tma_whatever_it_is_asked():
    """run_mha_fwd: PackGQA = PackGQA_ || PagedKVNonTMA || Split: pack_gqa = false is overridden, with
    a note; with TMA pages it is not."""
    wl = Workload(1, 8, 1, 1000, 128, dtype="bf16", kv_heads=2, kv_page_size=16)
    m, notes, _ = run(wl, pack_gqa=False, num_splits=1)
    assert m.pack_gqa is True and "FA3 packs the query heads of a paged cache read without TMA" in notes[0]
    tma = replace(wl, seq_len_q=200, seq_len_kv=1024, kv_page_size=512, causal=True)
    assert fa3_paged_tma(tma, False)
    m, notes, _ = run(tma, pack_gqa=False, num_splits=1)
    assert m.pack_gqa is False and not notes


def test_paged_refusals_in_one_line():
    wl = Workload(1, 4, 64, 512, 64, dtype="bf16", kv_heads=2, kv_page_size=64)
    with pytest.raises(HbmsimError, match="FA3 pages the KV cache of its forward only") as err:
        SPEC.resolved(H100, wl, SPEC.mapping_type(), True)
    assert "\n" not in str(err.value)
    with pytest.raises(HbmsimError, match="variant cudnn-sm90 has no paged KV cache"):
        SPEC.resolved(H100, wl, SPEC.mapping_type(variant="cudnn-sm90"), False)
