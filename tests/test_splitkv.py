"""FlashAttention-2's split-KV forward (Flash-Decoding), decode packing and the KV-cache append
(issue 25 items 2, 3, 5, 6): numerics against the float64 reference, counters against the closed
forms (algorithms/flash2_splitkv.py flash2_splitkv_io), FA2's num_splits_heuristic, the decode
experiment, the roofline's decode points, `hbmsim explain --decode`, and bad input in one line."""
import math
import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import counted_by_tensor as counted
from conftest import nonzero

from hbmsim.algorithms import registry
from hbmsim.algorithms.flash2_spec import Flash2Blocks
from hbmsim.algorithms.flash2_splitkv import (combine_block_m, num_splits_heuristic, pack_applies,
                                              splitkv_block_n)
from hbmsim.algorithms.reference import attention_forward
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.scenarios import explain as X
from hbmsim.scenarios import roofline
from hbmsim.scenarios.cli import main
from hbmsim.scenarios.experiment import load_experiment
from hbmsim.scenarios.runner import prepare, run_config
from hbmsim.simulator import HbmsimError, simulate

SPEC = registry.get("flash2")


def run(gpu, wl, data=None, **fields):
    m, _ = SPEC.resolved(gpu, wl, Flash2Blocks(**fields), False)
    return m, simulate(gpu, SPEC.build(wl, m, data, False))


def test_num_splits_heuristic_as_fa2():
    # flash_api.cpp's own example: batch x heads = 48 on 108 SMs -> 2 splits (efficiency 0.89)
    assert num_splits_heuristic(48, 108, 1000, 128) == 2
    assert num_splits_heuristic(87, 108, 1000, 128) == 1          # >= 80% of the SMs: no split
    assert num_splits_heuristic(1, 264, 3, 128) == 3               # at most one split per K/V block
    # 8 packed K/V heads, 1M keys of 128-wide blocks, H100 (132 SMs x 2): 29 splits (33 is the best
    # wave, 29 the smallest within 85% of it)
    assert num_splits_heuristic(8, 264, 8192, 128) == 29
    assert (splitkv_block_n(64), splitkv_block_n(128), splitkv_block_n(256)) == (256, 128, 64)
    assert (combine_block_m(128), combine_block_m(64), combine_block_m(96), combine_block_m(40)) == (4, 8, 16, 8)


def test_defaults_leave_results_unchanged(a100):
    """num_splits defaults to 1 and pack_gqa "auto" is a no-op for multi-head attention: the
    program and its counts are those of flash2 as before."""
    wl = Workload(2, 4, 33, 47, 16, dtype="fp32", causal=True)
    m, _ = SPEC.resolved(a100, wl, Flash2Blocks(), False)
    assert (m.num_splits, m.pack_gqa, m.kv_append) == (1, False, False)
    prog = SPEC.build(wl, m, None, False)
    assert [launch.name for launch in prog.launches] == ["flash2_fwd"]
    # "auto" at a prefill shape that fills the machine: one split
    m2, _ = SPEC.resolved(a100, Workload(8, 16, 1024, 1024, 64), Flash2Blocks(num_splits="auto"), False)
    assert m2.num_splits == 1


@st.composite
def shapes(draw):
    kv_heads = draw(st.sampled_from([1, 2]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 3]))
    nq = draw(st.sampled_from([1, 1, 2, 3, 5]))
    nk = draw(st.integers(max(1, nq), 41))
    wl = Workload(draw(st.integers(1, 2)), heads, nq, nk, draw(st.sampled_from([8, 12, 16])), dtype="fp32",
                  causal=draw(st.booleans()), key_padding_mask=draw(st.booleans()), kv_heads=kv_heads)
    fields = dict(num_splits=draw(st.integers(1, 7)), block_q=draw(st.integers(1, 4)),
                  block_kv=draw(st.integers(1, 9)), kv_append=draw(st.booleans()),
                  pack_gqa=draw(st.sampled_from(["auto", False])))
    return wl, fields


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes(), st.integers(0, 3))
def test_split_kv_equals_reference_and_closed_form(a100, case, seed):
    """Ragged shapes (K/V blocks not dividing N_kv, splits not dividing the blocks, empty splits
    under the causal mask), GQA packed and not, key padding, the append: O equals the float64
    reference and every tensor's bytes equal the closed form, 0 bytes off."""
    wl, fields = case
    data = random_data(wl, seed)
    m, result = run(a100, wl, data, **fields)
    o_ref, _ = attention_forward(wl, data)
    np.testing.assert_allclose(result.outputs["O"].reshape(o_ref.shape), o_ref, rtol=0, atol=1e-12)
    assert counted(result) == nonzero(SPEC.io(wl, m, "forward"))


def test_packing_reads_kv_once_per_group(a100):
    """seq_len_q = 1, 8 query heads on 2 K/V heads: packed, K and V are read once per K/V head;
    unpacked, once per query head."""
    wl = Workload(1, 8, 1, 300, 16, kv_heads=2)
    kv_bytes = 2 * 300 * 16 * 2
    assert pack_applies(wl) and not pack_applies(Workload(1, 8, 2, 300, 16, kv_heads=2))
    for pack, times in (("auto", 1), (False, 4)):
        m, result = run(a100, wl, pack_gqa=pack, num_splits=3)
        assert counted(result)["K"] == (times * kv_bytes, 0)
        assert counted(result) == nonzero(SPEC.io(wl, m, "forward"))


def test_decode_blocks_compute_the_kernels_whole_tile(h100):
    """One query row, 32 query heads on 8 K/V heads, packed: a block holds 4 real rows, but FA2's
    kernel runs its MMAs and softmax over all kBlockM rows of its tile (q_tile_rows): 128 in the
    one-pass kernel at head dim 128, 64 in the split kernel. The bytes are the real rows'."""
    wl = Workload(1, 32, 1, 1024, 128, kv_heads=8)
    gemms = lambda rows: 8 * 2 * (2 * rows * 1024 * 128)     # 8 K/V heads x (S = Q K^T and P V: 2 rows N d)
    m, result = run(h100, wl, num_splits=1)
    assert (m.block_q, m.q_tile_rows) == (4, 128)
    assert result.kernels[0].matmul_flops == gemms(128)
    # exps: every score of the tile, plus a rescale per row and tile (1024 / 64 tiles of K/V)
    assert result.kernels[0].exp_ops == 8 * (128 * 1024 + 128 * 1024 // 64)
    assert counted(result) == nonzero(SPEC.io(wl, m, "forward"))
    m, result = run(h100, wl, num_splits=4)
    assert (m.block_q, m.q_tile_rows) == (4, 64)
    assert result.kernels[0].matmul_flops == gemms(64)
    # the paper's variant computes its rows only; a tile shorter than its block is refused
    m, result = run(h100, wl, num_splits=1, variant="paper")
    assert m.q_tile_rows == m.block_q and result.kernels[0].matmul_flops == gemms(4)
    with pytest.raises(HbmsimError, match="q_tile_rows = 2 must be at least block_q = 4"):
        run(h100, wl, num_splits=1, q_tile_rows=2)


def test_split_writes_fp32_partials_and_the_combine_reads_them(a100):
    wl = Workload(1, 4, 1, 1000, 64, kv_heads=4)
    m, result = run(a100, wl, num_splits=5)
    names = [k.name for k in result.kernels if k.tensors]
    assert names[:2] == ["flash2_fwd_splitkv", "flash2_fwd_splitkv_combine"]
    split, combine = result.kernels[0].tensors, result.kernels[1].tensors
    g, d = 4, 64
    assert split["O_accum"].write == 5 * g * d * 4 and split["lse_accum"].write == 5 * g * 4
    assert combine["O_accum"].read == 5 * g * d * 4 and combine["O"].write == g * d * 2


def test_combine_waits_an_l2_hit_latency_a_split(h100):
    """FA2's combine kernel adds the splits' partial outputs one after the other into one register
    tile (combine_attn_seqk_parallel: a runtime trip count), so each split's load waits the L2's
    load-to-use latency (l2_hit_latency: 148.8 ns measured on an H100, h100-latency.json): with 8
    blocks on 132 SMs, the kernel's chain is the LSEs' load, the S split loads and the output store,
    S + 2 latencies more than without the effect. Counts are the same either way."""
    from hbmsim.simulator import TimeModel
    wl = Workload(1, 32, 1, 4096, 128, kv_heads=8)
    m, _ = SPEC.resolved(h100, wl, Flash2Blocks(num_splits="auto"), False)
    assert m.num_splits == 32
    times, counts = {}, {}
    for on in (True, False):
        model = TimeModel() if on else TimeModel().off("l2_hit_latency")
        r = simulate(h100, SPEC.build(wl, m, None, False), model=model)
        combine = next(k for k in r.kernels if k.name == "flash2_fwd_splitkv_combine")
        times[on], counts[on] = combine.end_s - combine.start_s, counted(r)
    assert h100.l2_hit_latency_s == pytest.approx(148.8e-9)
    assert times[True] - times[False] == pytest.approx((32 + 2) * h100.l2_hit_latency_s, rel=0.02)
    assert counts[True] == counts[False] == nonzero(SPEC.io(wl, m, "forward"))


def test_kv_append_counts_the_new_tokens(a100):
    """The new token's K and V: read from K_new / V_new and written into the cache once per block
    whose split holds the cache's last row (packed: one per K/V head)."""
    wl = Workload(2, 8, 1, 500, 32, kv_heads=2)
    m, result = run(a100, wl, kv_append=True)
    c = counted(result)
    assert m.num_splits == 1 and c["K_new"] == (2 * 2 * 32 * 2, 0) and c["K"][1] == 2 * 2 * 32 * 2
    assert c == nonzero(SPEC.io(wl, m, "forward"))


def test_fast_mode_counts_exact_and_a_million_keys_decode_is_quick(h100):
    """Issue 25's speed target: 1 query row, 1M keys, 32 / 8 heads, head dim 128, count-only
    fast mode, in at most 10 s (about 1 s here); its L2-side counts equal the closed form."""
    exp = load_experiment("decode")
    wl = Workload(1, 32, 1, 1 << 20, 128, kv_heads=8)
    cfg = replace(exp.configs[1], workload=wl)                 # num_splits = "auto"
    cfg = prepare(replace(exp, configs=[cfg])).configs[0]
    t0 = time.perf_counter()
    (r,) = run_config(cfg, count_only=True, fast=True)
    assert time.perf_counter() - t0 <= 10
    assert r["num_splits"] == 29 and r["pack_gqa"] is True
    io = SPEC.io(wl, cfg.mapping, "forward")
    assert r["global_read_bytes"] == sum(v[0] for v in io.values())
    assert r["global_write_bytes"] == sum(v[1] for v in io.values())


def test_decode_experiment_and_roofline(tmp_path):
    exp = load_experiment("decode")
    assert len(exp.configs) == 72          # 3 batches x 4 KV lengths x contiguous / paged x 3 runs
    wls = {(c.workload.batch, c.workload.seq_len_kv) for c in exp.configs}
    assert (64, 131072) in wls and (1, 1024) in wls
    small = [c for c in exp.configs if c.workload.batch == 1 and c.workload.seq_len_kv == 1024
             and c.workload.kv_page_size is None]
    exp = prepare(replace(exp, configs=small))
    results = [r for cfg in exp.configs for r in run_config(cfg, count_only=True, fast=True)]
    # FA2 unsplit, FA2's heuristic (8), FA3's (8 K/V heads packed, 6 tiles of 176 keys: 6 splits)
    assert [r["num_splits"] for r in results] == [1, 8, 6]
    prefill = run_config(prepare(load_experiment("demo")).configs[0], count_only=True)
    pts = roofline.kernel_points(results + prefill)
    assert {p.phase for p in pts} == {"decode", "prefill"}
    assert any("splitkv_combine" in p.label and p.phase == "decode" for p in pts)
    assert roofline.plot(results + prefill, exp.gpu, tmp_path / "r.png", "t").exists()


def test_explain_decode_numbers_against_numpy(a100, capsys):
    """Each split's log-sum-exp and partial O, the combine's weights and O, from the walkthrough's
    annotations, against numpy."""
    ex = X.decode_example(block_q=1, block_kv=2)
    lines, run_ = X.decode_part(ex, a100, 2)
    q, k, v = ex.q[0], ex.k, ex.v
    s = q @ k.T
    finals = [n[4] for n in run_["notes"].notes if n[3] == "split final"]
    for split, vals in enumerate(finals):
        keys = slice(4 * split, 4 * split + 4)
        lse = np.log(np.exp(s[keys]).sum())
        assert vals["lse"][0] == pytest.approx(lse, abs=1e-12)
        np.testing.assert_allclose(vals["O"][0], np.exp(s[keys] - lse) @ v[keys], atol=1e-12)
    (comb,) = [n[4] for n in run_["notes"].notes if n[3] == "combine"]
    lse = np.log(np.exp(s).sum())
    assert comb["lse"][0] == pytest.approx(lse, abs=1e-12)
    np.testing.assert_allclose(comb["scale"][0], [math.exp(f["lse"][0] - lse) for f in finals], atol=1e-12)
    np.testing.assert_allclose(comb["O"][0], np.exp(s - lse) @ v, atol=1e-12)
    assert main(["explain", "--decode"]) == 0
    out = capsys.readouterr().out
    assert "lse = log sum_s exp(lse_s) = 2.881" in out and "exp(lse_s - lse) = [0.679, 0.321]" in out
    assert "flash2_fwd_splitkv_combine O 16 B written, O_accum 32 B read" in out


BAD_RUN = """
name = "t"
hardware = "a100-sxm4-40gb"
[workload]
batch = 1
heads = 4
kv_heads = 2
seq_len_q = {nq}
seq_len_kv = 64
head_dim = 32
dropout = {dropout}
[[runs]]
algorithm = "flash2"
passes = {passes}
{extra}
"""


@pytest.mark.parametrize("nq, dropout, passes, extra, message", [
    (1, 0.0, '["forward"]', "num_splits = 129", "num_splits = 129 is more than FA2's split-KV kernel allows (128)"),
    (1, 0.0, '["forward"]', "num_splits = 0", "num_splits' = 0 must be"),
    (2, 0.0, '["forward"]', "pack_gqa = true", "pack_gqa = true needs seq_len_q = 1"),
    (1, 0.0, '["forward", "backward"]', "num_splits = 2", "forward-only"),
    (1, 0.1, '["forward"]', "num_splits = 4", "no dropout"),
    (1, 0.0, '["forward"]', "kv_append = 3", "kv_append' = 3 must be true"),
])
def test_bad_decode_inputs_are_one_line(tmp_path, capsys, nq, dropout, passes, extra, message):
    p = tmp_path / "bad.toml"
    p.write_text(BAD_RUN.format(nq=nq, dropout=dropout, passes=passes, extra=extra))
    assert main(["run", str(p), "--count-only", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_explain_decode_bad_splits_is_one_line(capsys):
    assert main(["explain", "--decode", "--splits", "129"]) == 2
    err = capsys.readouterr().err.strip()
    assert "128" in err and "\n" not in err
