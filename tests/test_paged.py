"""flash2 over a paged KV cache (issue 25 item 4, algorithms/paged.py): numerics against the
float64 reference and counters against the closed forms over random shapes (ragged N_kv, tiles
that straddle pages, split and not, packed and not, the append), the block-table bytes worked by
hand, tile loads split at page boundaries, the pages' placement, and bad input in one line."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import counted_by_tensor as counted
from conftest import nonzero

from hbmsim.algorithms import registry
from hbmsim.algorithms.flash2_spec import Flash2Blocks
from hbmsim.algorithms.paged import block_table, table_entries
from hbmsim.algorithms.reference import attention_forward
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.scenarios.cli import main
from hbmsim.scenarios.experiment import load_experiment
from hbmsim.scenarios.runner import prepare, run_config
from hbmsim.simulator import HbmsimError, simulate

SPEC = registry.get("flash2")


def run(gpu, wl, data=None, trace=None, **fields):
    m, _ = SPEC.resolved(gpu, wl, Flash2Blocks(**fields), False)
    return m, simulate(gpu, SPEC.build(wl, m, data, False), trace)


@st.composite
def paged_shapes(draw):
    kv_heads = draw(st.sampled_from([1, 2]))
    heads = kv_heads * draw(st.sampled_from([1, 2]))
    nq = draw(st.sampled_from([1, 1, 2, 3, 5]))
    nk = draw(st.integers(max(1, nq), 900))                      # mostly not a multiple of the page
    wl = Workload(draw(st.integers(1, 2)), heads, nq, nk, 8, dtype="fp32", causal=draw(st.booleans()),
                  key_padding_mask=draw(st.booleans()), kv_heads=kv_heads,
                  kv_page_size=draw(st.sampled_from([256, 512])))
    fields = dict(num_splits=draw(st.integers(1, 5)), block_q=draw(st.integers(1, 4)),
                  block_kv=draw(st.integers(40, 300)), kv_append=draw(st.booleans()),
                  pack_gqa=draw(st.sampled_from(["auto", False])))
    return wl, fields


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(paged_shapes(), st.integers(0, 3))
def test_paged_equals_reference_and_closed_form(a100, case, seed):
    """Ragged N_kv, K/V tiles that straddle pages, no split and split-KV, GQA packed and not, key
    padding, the causal mask, the append: O equals the float64 reference, every tensor's bytes
    (block_table included) the closed form, 0 bytes off; K and V bytes equal a contiguous
    cache's."""
    wl, fields = case
    data = random_data(wl, seed)
    m, result = run(a100, wl, data, **fields)
    o_ref, _ = attention_forward(wl, data)
    np.testing.assert_allclose(result.outputs["O"].reshape(o_ref.shape), o_ref, rtol=0, atol=1e-12)
    got = counted(result)
    assert got == nonzero(SPEC.io(wl, m, "forward"))
    flat = nonzero(SPEC.io(replace(wl, kv_page_size=None), m, "forward"))
    assert {k: v for k, v in got.items() if k != "block_table"} == flat


def test_block_table_bytes_by_hand(a100):
    """2 sequences of 600 keys in 256-token pages: 3 pages each (the last holds 88 keys). 2 query
    heads on 1 K/V head, one query row, K/V tiles of 128 (5 tiles, the last 88 keys).
    - no split, unpacked: each of the 2 x 2 query heads' blocks reads entries 0..2: 4 x 3 x 4 = 48 B;
    - 2 splits (3 tiles a split), unpacked: split 0 keys 0..383 -> pages 0, 1; split 1 keys
      384..599 -> pages 1, 2: 4 entries a query head, 4 x 4 x 4 = 64 B;
    - 2 splits, packed (one block of 2 rows per K/V head and split): 2 x 4 x 4 = 32 B.
    K and V bytes are a contiguous cache's: one read of 600 x 8 x 4 B per block and split range."""
    wl = Workload(2, 2, 1, 600, 8, dtype="fp32", kv_heads=1, kv_page_size=256)
    assert table_entries(wl, 0, 600) == 3 and table_entries(wl, 0, 384) == 2 and table_entries(wl, 384, 600) == 2
    for fields, table_bytes, k_bytes in ((dict(num_splits=1, pack_gqa=False), 48, 4 * 600 * 8 * 4),
                                         (dict(num_splits=2, pack_gqa=False), 64, 4 * 600 * 8 * 4),
                                         (dict(num_splits=2, pack_gqa="auto"), 32, 2 * 600 * 8 * 4)):
        m, result = run(a100, wl, block_q=2, block_kv=128, **fields)    # packed: the 2 heads are 1 block
        c = counted(result)
        assert c["block_table"] == (table_bytes, 0), fields
        assert c["K"] == (k_bytes, 0) and c["V"] == (k_bytes, 0)
        assert c == nonzero(SPEC.io(wl, m, "forward"))


def test_tiles_split_at_page_boundaries_and_pages_are_scattered(a100):
    """Tiles of 200 keys over 256-token pages: [0, 200) is one access, [200, 400) and
    [400, 600) two each (5 K loads where a contiguous cache has 3), each from the physical page
    the block table names; the pages are not in order."""
    wl = Workload(1, 1, 1, 600, 8, dtype="fp32", kv_page_size=256)
    table = block_table(replace(wl, batch=4))
    assert sorted(table.reshape(-1)) == list(range(12)) and not np.array_equal(table.reshape(-1), np.arange(12))
    loads = []
    trace = lambda _t, _sm, _k, _b, text: loads.append(text) if text.startswith("load  K[") else None
    run(a100, wl, trace=trace, block_q=1, block_kv=200)
    assert len(loads) == 5
    pages = [int(s.split("[")[1].split("]")[0]) for s in loads]
    assert set(pages) == {int(p) for p in block_table(wl)[0]}
    assert [s.split("][")[1].split(",")[0] for s in loads] == ["0:200", "200:256", "0:144", "144:256", "0:88"]
    flat = []
    run(a100, replace(wl, kv_page_size=None), block_q=1, block_kv=200,
        trace=lambda _t, _sm, _k, _b, text: flat.append(text) if text.startswith("load  K[") else None)
    assert len(flat) == 3


def test_page_size_limits_and_training_refused(a100):
    with pytest.raises(HbmsimError, match=r"flash2: field 'kv_page_size' = 16 must be a multiple of 256"):
        SPEC.resolved(a100, Workload(1, 2, 1, 64, 8, kv_page_size=16), Flash2Blocks(), False)
    with pytest.raises(HbmsimError, match="inference only"):
        SPEC.resolved(a100, Workload(1, 2, 64, 64, 8, kv_page_size=256), Flash2Blocks(), True)
    with pytest.raises(HbmsimError, match="standard: field 'kv_page_size' = 256: only flash2"):
        registry.get("standard").resolved(a100, Workload(1, 2, 64, 64, 8, kv_page_size=256),
                                          registry.get("standard").mapping_type(), False)


BAD = """
name = "t"
hardware = "a100-sxm4-40gb"
[workload]
batch = 1
heads = 4
kv_heads = 2
seq_len_q = 1
seq_len_kv = 600
head_dim = 32
kv_page_size = {page}
[[runs]]
algorithm = "{alg}"
passes = {passes}
"""


@pytest.mark.parametrize("page, alg, passes, message", [
    ("100", "flash2", '["forward"]', "field 'kv_page_size' = 100 must be a multiple of 256"),
    ("0", "flash2", '["forward"]', "field 'kv_page_size' = 0 must be a whole number >= 1"),
    ("-256", "flash2", '["forward"]', "field 'kv_page_size' = -256 must be a whole number >= 1"),
    ("256", "flash2", '["forward", "backward"]', "kv_page_size = 256: FA2 pages the KV cache of inference only"),
    ("256", "flash1", '["forward"]', "flash1: field 'kv_page_size' = 256: only flash2 and flash3 model a paged KV"),
    ("256", "standard", '["forward"]', "standard: field 'kv_page_size' = 256: only flash2"),
])
def test_bad_paged_inputs_are_one_line(tmp_path, capsys, page, alg, passes, message):
    p = tmp_path / "bad.toml"
    p.write_text(BAD.format(page=page, alg=alg, passes=passes))
    assert main(["run", str(p), "--count-only", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_decode_experiment_compares_contiguous_and_paged():
    """The shipped decode experiment sweeps kv_page_size over "contiguous" and 256: at batch 1 and
    8192 keys the paged runs read the same K/V bytes, plus the block table, which the closed form
    gives."""
    exp = load_experiment("decode")
    pages = {c.workload.kv_page_size for c in exp.configs}
    assert pages == {None, 256}
    small = [c for c in exp.configs if c.workload.batch == 1 and c.workload.seq_len_kv == 8192
             and c.run.algorithm == "flash2"]
    exp = prepare(replace(exp, configs=small))
    results = [r for cfg in exp.configs for r in run_config(cfg, count_only=True, fast=True)]
    by = {(r["workload"].get("kv_page_size"), r["num_splits"]): r for r in results}
    assert set(by) == {(None, 1), (None, 32), (256, 1), (256, 32)}
    for splits in (1, 32):
        cfg = next(c for c in exp.configs if c.workload.kv_page_size == 256 and c.mapping.num_splits == splits)
        io = SPEC.io(cfg.workload, cfg.mapping, "forward")
        paged = by[(256, splits)]
        assert paged["global_read_bytes"] == sum(v[0] for v in io.values())
        assert paged["global_read_bytes"] - by[(None, splits)]["global_read_bytes"] == io["block_table"][0] > 0
