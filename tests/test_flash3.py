"""flash3 (FlashAttention-3 on Hopper): counters = closed forms, numerics = the float64
reference, the kernel's own tiles, refusal without TMA/wgmma, and the schedule's effect on time."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hbmsim.algorithms import registry
from hbmsim.algorithms.flash3_spec import fa3_backward_tiles, fa3_forward_tiles, fa3_pingpong
from hbmsim.algorithms.reference import attention_backward, attention_forward
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.scenarios.experiment import resolve_hardware
from hbmsim.simulator import HbmsimError, TimeModel, simulate

H100 = resolve_hardware("h100-sxm5-80gb")
SPEC = registry.get("flash3")


def resolved(wl, training=False, **fields):
    return SPEC.resolved(H100, wl, SPEC.mapping_type(**fields), training)[0]


def counted(result, pass_name):
    return {n: (t.read, t.write) for n, t in result.tensors(pass_name).items() if t.read or t.write}


def nonzero(io):
    return {n: rw for n, rw in io.items() if rw[0] or rw[1]}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", ["fa3-kernel", "fp8"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_forward_counts_equal_closed_forms_and_hand_numbers(causal, variant, d):
    wl = Workload(1, 2, 256, 256, d, dtype="bf16", causal=causal)
    m = resolved(wl, variant=variant)
    got = counted(simulate(H100, SPEC.build(wl, m, None, False)), "forward")
    assert got == nonzero(SPEC.io(wl, m, "forward"))
    e_in = 1 if variant == "fp8" else 2
    assert got["Q"] == (2 * 256 * d * e_in, 0)          # Q read once, in e4m3 for FP8
    assert got["O"] == (0, 2 * 256 * d * 2)             # O written once, in bf16
    if not causal:                                      # every query block reads all of K once
        blocks = -(-256 // m.block_q)
        assert got["K"] == (2 * blocks * 256 * d * e_in, 0)


def test_forward_numerics_equal_the_float64_reference():
    for causal, variant in ((False, "fa3-kernel"), (True, "fa3-kernel"), (True, "fp8")):
        wl = Workload(1, 2, 200, 136, 64, dtype="bf16", causal=causal)
        m = resolved(wl, variant=variant, block_q=128, block_kv=48)     # 2 warpgroups, 3 K/V steps
        out = simulate(H100, SPEC.build(wl, m, random_data(wl, seed=3), False)).outputs
        o_ref, lse_ref = attention_forward(wl, random_data(wl, seed=3))
        assert np.max(np.abs(out["O"] - o_ref.reshape(out["O"].shape))) < 1e-12
        # rows that see no key (causal, more queries than keys): lse = -inf in both
        np.testing.assert_allclose(out["lse"][..., 0], lse_ref.reshape(out["lse"].shape[:2]), rtol=0, atol=1e-12)


def test_a_last_partial_block_computes_the_kernels_whole_tile_by_hand():
    """FA3's warpgroups run their 64-row wgmma and softmax over the whole kBlockM x kBlockN tile, a
    last block's rows and keys past the sequence too (TMA zero-fills them; the keys are masked, the
    epilogue stores the real rows): N = 200 at head dim 64 is two 192 x 192 tiles a side, the
    second with 8 real rows (one warpgroup with 8, two with none) and 8 real keys, and every tile
    computes 192 x 192 scores. Bytes are the real rows' (closed forms), the output the float64
    reference's."""
    wl = Workload(1, 2, 200, 200, 64, dtype="bf16")
    m = resolved(wl)
    assert (m.block_q, m.block_kv, m.q_tile_rows) == (192, 192, 192)
    data = random_data(wl, seed=5)
    res = simulate(H100, SPEC.build(wl, m, data, False))
    k = res.kernels[0]
    # 2 batch-heads x 2 query tiles x 192 rows x 2 K/V tiles x 192 keys x 64: S = Q K^T and O += P V,
    # 2 FLOPs a multiply-add each; an exp a score and one a row a K/V tile
    assert k.matmul_flops == 2 * 2 * 192 * 384 * 64 * 2 * 2
    assert k.exp_ops == 2 * 2 * 2 * (192 * 192 + 192)
    assert counted(res, "forward") == nonzero(SPEC.io(wl, m, "forward"))
    assert counted(res, "forward")["Q"] == (2 * 200 * 64 * 2, 0)      # the real rows only
    o_ref, lse_ref = attention_forward(wl, data)
    assert np.max(np.abs(res.outputs["O"] - o_ref.reshape(res.outputs["O"].shape))) < 1e-12
    np.testing.assert_allclose(res.outputs["lse"][..., 0], lse_ref.reshape(2, 200), rtol=0, atol=1e-12)
    # q_tile_rows = 192 given is the kernel's tile; 0 (a mapping built unresolved): each block's own
    # rows in whole warpgroups (wgmma's M is 64), 192 + 64 a batch-head (its keys still whole tiles)
    own = simulate(H100, SPEC.build(wl, resolved(wl, q_tile_rows=192), None, False)).kernels[0]
    assert own.matmul_flops == k.matmul_flops
    rows_only = dataclasses.replace(m, q_tile_rows=0)
    assert simulate(H100, SPEC.build(wl, rows_only, None, False)).kernels[0].matmul_flops == \
        2 * (192 + 64) * 384 * 64 * 2 * 2
    # cuDNN's tiles are not FA3's: a warpgroup's 64 rows (q_tile_rows 64), its real keys
    cudnn = resolved(wl, variant="cudnn-sm90")
    assert (cudnn.block_q, cudnn.q_tile_rows) == (192, 64)
    assert simulate(H100, SPEC.build(wl, cudnn, None, False)).kernels[0].matmul_flops == \
        2 * (192 + 64) * 200 * 64 * 2 * 2


def test_the_backward_computes_whole_tiles_at_the_sequences_ends_by_hand():
    """FA3's backward (head dim 64: 128 x 128 tiles, 2 warpgroups) at N = 200: two K/V blocks (128
    and 72 keys) of two query tiles each (128 and 72 rows), every step's five GEMMs over a whole
    128 x 128 tile, 10 x 128 x 128 x 64 FLOPs; the bytes are the real rows' (closed forms)."""
    wl = Workload(1, 2, 200, 200, 64, dtype="bf16")
    m = resolved(wl, training=True)
    assert (m.block_q_bwd, m.block_kv_bwd) == (128, 128)
    res = simulate(H100, SPEC.build(wl, m, None, True))
    main = next(k for k in res.kernels if k.name == "flash3_bwd")
    assert main.matmul_flops == 2 * (2 * 2) * 10 * 128 * 128 * 64
    assert main.exp_ops == 2 * (2 * 2) * 128 * 128
    assert counted(res, "backward") == nonzero(SPEC.io(wl, m, "backward"))
    cudnn = resolved(wl, training=True, variant="cudnn-sm90")          # its real rows and keys
    main = next(k for k in simulate(H100, SPEC.build(wl, cudnn, None, True)).kernels if k.name == "flash3_bwd")
    assert main.matmul_flops == 2 * 10 * 200 * 200 * 64


def test_pack_gqa_packs_a_decode_steps_query_heads_by_fa3s_rule_by_hand():
    """FA3's PackGQA (heuristics.h should_pack_gqa): one query row, 4 query heads a K/V head, so a
    192-row tile holds 4 real rows packed against 1 unpacked, and FA3 packs. Batch 2 x 2 K/V heads:
    4 blocks (not 16), each reading its K/V head once (N = 300: two 192-key tiles, the second with
    108 real keys) and computing the whole 192 x 384 tile; O and lse equal the float64 reference."""
    from hbmsim.algorithms.flash3_spec import fa3_pack_gqa
    wl = Workload(2, 8, 1, 300, 64, dtype="bf16", kv_heads=2)
    assert fa3_pack_gqa(wl, 192) and not fa3_pack_gqa(dataclasses.replace(wl, kv_heads=8), 192)
    m = resolved(wl)
    assert (m.pack_gqa, m.block_q, m.block_kv, m.q_tile_rows) == (True, 4, 192, 192)
    data = random_data(wl, seed=7)
    res = simulate(H100, SPEC.build(wl, m, data, False))
    k = res.kernels[0]
    assert k.grid == 4 and k.matmul_flops == 4 * 192 * 384 * 64 * 2 * 2
    got = counted(res, "forward")
    assert got == nonzero(SPEC.io(wl, m, "forward"))
    assert got["K"] == (2 * 2 * 300 * 64 * 2, 0)           # each K/V head once, not once per query head
    o_ref, lse_ref = attention_forward(wl, data)
    assert np.max(np.abs(res.outputs["O"].reshape(o_ref.shape) - o_ref)) < 1e-12
    np.testing.assert_allclose(res.outputs["lse"].reshape(lse_ref.shape), lse_ref, rtol=0, atol=1e-12)
    unpacked = resolved(wl, pack_gqa=False)
    assert simulate(H100, SPEC.build(wl, unpacked, None, False)).kernels[0].grid == 16
    with pytest.raises(HbmsimError, match="pack_gqa = true needs query heads sharing a K/V head"):
        resolved(dataclasses.replace(wl, kv_heads=8), pack_gqa=True)
    with pytest.raises(HbmsimError, match="pack_gqa packs a forward's query heads"):
        resolved(wl, training=True, pack_gqa=True)
    assert resolved(wl, training=True).pack_gqa is False      # a training run: FA3's backward does not pack
    assert resolved(wl, variant="cudnn-sm90").pack_gqa is False      # cuDNN's rule is not FA3's


def test_pack_gqa_of_many_query_rows_under_the_causal_mask_by_hand():
    """PackGQA with 300 query rows (flash3_pack.py): 8 query heads on 2 K/V heads, N = 300, head dim 64,
    causal (192 x 128 tiles). FA3's rule: 300 / 384 = 0.78 unpacked against 1200 / 1344 = 0.89
    packed, 0.78 < 0.9 x 0.89: pack. 1,200 packed rows a K/V head, 7 blocks of 192; block i's last
    query row is 48 (i + 1) - 1 (packed row r is query row r // 4), so it sees 48, 96, ..., 288,
    300 keys: 1, 1, 2, 2, 2, 3, 3 tiles of 128 = 14, and reads 128 + 128 + 256 + 256 + 256 + 300 +
    300 = 1,624 K rows (a tile's real keys) against 8 x (256 + 300) = 4,448 unpacked. O and lse
    equal the float64 reference, and so do those of the same run in 2 splits (packed, as FA3 always
    packs a split)."""
    from hbmsim.algorithms.flash3_spec import fa3_pack_gqa
    wl = Workload(1, 8, 300, 300, 64, dtype="bf16", causal=True, kv_heads=2)
    assert fa3_pack_gqa(wl, 192) and not fa3_pack_gqa(dataclasses.replace(wl, seq_len_q=384, seq_len_kv=384), 192)
    m = resolved(wl)
    assert (m.pack_gqa, m.block_q, m.block_kv, m.num_splits) == (True, 192, 128, 1)
    data = random_data(wl, seed=11)
    o_ref, lse_ref = attention_forward(wl, data)
    res = simulate(H100, SPEC.build(wl, m, data, False))
    k = res.kernels[0]
    assert k.grid == 2 * 7 and k.matmul_flops == 2 * 14 * 2 * 2 * 192 * 128 * 64
    got = counted(res, "forward")
    assert got == nonzero(SPEC.io(wl, m, "forward"))
    assert got["K"] == (2 * 1624 * 64 * 2, 0) and got["Q"] == (8 * 300 * 64 * 2, 0)
    assert got["O"] == (0, 8 * 300 * 64 * 2) and got["lse"] == (0, 8 * 300 * 4)
    assert counted(simulate(H100, SPEC.build(wl, resolved(wl, pack_gqa=False), None, False)),
                   "forward")["K"] == (8 * (256 + 300) * 64 * 2, 0)
    for mapping in (m, resolved(wl, num_splits=2)):
        res = simulate(H100, SPEC.build(wl, mapping, data, False))
        assert mapping.pack_gqa is True
        assert counted(res, "forward") == nonzero(SPEC.io(wl, mapping, "forward"))
        assert np.max(np.abs(res.outputs["O"].reshape(o_ref.shape) - o_ref)) < 1e-12
        np.testing.assert_allclose(res.outputs["lse"].reshape(lse_ref.shape), lse_ref, rtol=0, atol=1e-12)


def test_split_kv_by_fa3s_rule_worked_by_hand():
    """FA3's num_splits_heuristic (flash_api.cpp get_num_splits): a decode step, batch 8, 32 query
    heads on 8 K/V heads, N = 16384, head dim 128 on the H100's 132 SMs: kBlockM x kBlockN 128 x
    176, the 4 query heads packed into one query block, 8 x 8 = 64 blocks < 0.8 x 132; 94 K/V
    blocks; wave efficiency 64 s / 132 over its ceiling: 0.48 at 1 split, 0.97 at 2, the best 1.0
    (33): 2 splits, the first within 0.85 of it. One K/V head over 50 MB (N = 131072: 64 MiB) with
    1,024 >= 2 x 132 query blocks and no mask: 2 pieces of 50 MB; causal: 1."""
    from hbmsim.algorithms.flash3_spec import fa3_num_splits
    decode = Workload(8, 32, 1, 16384, 128, dtype="bf16", kv_heads=8)
    assert fa3_num_splits(decode, 128, 176, 132, False) == 2
    m = resolved(decode)
    assert (m.num_splits, m.pack_gqa, m.block_q) == (2, True, 4)
    long = Workload(1, 32, 131072, 131072, 128, dtype="bf16")
    assert fa3_num_splits(long, 128, 176, 132, False) == 2
    assert fa3_num_splits(dataclasses.replace(long, causal=True), 128, 128, 132, False) == 1
    # "auto" keeps that long prefill in one split (0.2% off, its fast mode folds), saying so
    m, notes = SPEC.resolved(H100, long, SPEC.mapping_type(), False)
    assert m.num_splits == 1 and "FA3 splits this long prefill's K/V heads in 2" in notes[0]
    # a split whose fp32 partial outputs would not fit the GPU's HBM: one, saying so
    need = 2 * 256 * 1 * 129 * 4 + 2 * (256 * 1 + 64 * 16384) * 128 * 2      # 2 splits' partials; Q, O; K, V
    small = dataclasses.replace(H100, hbm_capacity_bytes=need - 1)
    m, notes = SPEC.resolved(small, decode, SPEC.mapping_type(), False)
    assert m.num_splits == 1 and "do not fit hbm_capacity_bytes" in notes[0]
    assert SPEC.resolved(dataclasses.replace(H100, hbm_capacity_bytes=need), decode, SPEC.mapping_type(),
                         False)[0].num_splits == 2
    assert resolved(decode, training=True).num_splits == 1 and resolved(decode, variant="cudnn-sm90").num_splits == 1
    with pytest.raises(HbmsimError, match="num_splits = 300 is more than FA3 allows"):
        resolved(decode, num_splits=300)
    with pytest.raises(HbmsimError, match="split-KV is forward-only"):
        resolved(decode, training=True, num_splits=2)


@pytest.mark.parametrize("d", [64, 256])
def test_split_forward_and_combine_bytes_and_numerics_by_hand(d):
    """A split forward (FA3's Split) and its combine: 1 batch x 2 heads, 100 query rows, 1000 keys,
    3 splits (head dim 64: 8 blocks of 128 keys, 3, 3, 2 a split; 256: 16 of 64, 6, 6, 4, within
    shared memory). Q is read once per (query block,
    split), K and V once per split's share, an fp32 partial O and lse written per split and read
    by the combine (its lse by each of its column blocks: 2 at head dim 256, kBlockK 128), O and
    lse written once; the output is the float64 reference's, causal or not."""
    for causal in (False, True):
        wl = Workload(1, 2, 100, 1000, d, dtype="bf16", causal=causal)
        m = resolved(wl, block_q=64, block_kv=128 if d == 64 else 64, num_splits=3)
        data = random_data(wl, seed=4)
        res = simulate(H100, SPEC.build(wl, m, data, False))
        assert [k.name for k in res.kernels][:2] == ["flash3_fwd", "flash3_fwd_combine"]
        got = counted(res, "forward")
        assert got == nonzero(SPEC.io(wl, m, "forward"))
        if not causal:
            assert got["K"] == (2 * 2 * 1000 * d * 2, 0)             # each query block reads every key once
            assert got["O_accum"] == (2 * 3 * 100 * d * 4,) * 2      # written and read once a split, fp32
            assert got["lse_accum"] == (2 * 3 * 100 * 4 * (d // 128 if d > 64 else 1), 2 * 3 * 100 * 4)
            assert got["O"] == (0, 2 * 100 * d * 2) and got["lse"] == (0, 2 * 100 * 4)
        o_ref, lse_ref = attention_forward(wl, data)
        assert np.max(np.abs(res.outputs["O"].reshape(o_ref.shape) - o_ref)) < 1e-12
        np.testing.assert_allclose(res.outputs["lse"].reshape(lse_ref.shape), lse_ref, rtol=0, atol=1e-12)


def test_training_counts_and_gradients():
    wl = Workload(1, 2, 192, 192, 64, dtype="fp16", causal=True)
    m = resolved(wl, True, block_q_bwd=64, block_kv_bwd=64)
    res = simulate(H100, SPEC.build(wl, m, random_data(wl, seed=4), True))
    for p in ("forward", "backward"):
        assert counted(res, p) == nonzero(SPEC.io(wl, m, p))
    data = random_data(wl, seed=4)
    ref = attention_backward(wl, data, data.d_o)
    for name in ("dQ", "dK", "dV"):
        got = res.outputs[name]
        assert np.max(np.abs(got - ref[name].reshape(got.shape))) < 1e-12, name
    assert [k.name for k in res.kernels if k.pass_name == "backward"][:3] == [
        "flash3_bwd_preprocess", "flash3_bwd", "flash3_bwd_convert_dq"]


def test_the_kernel_rules():
    # hopper/tile_size.h tile_size_fwd_sm90 and flash_bwd_launch_template.h (sm90 branches)
    assert fa3_forward_tiles(128, False, False) == (128, 176, True, True)
    assert fa3_forward_tiles(128, True, False) == (128, 128, True, True)
    assert fa3_forward_tiles(64, False, False) == (192, 192, False, True)
    assert fa3_forward_tiles(256, False, False) == (128, 80, True, True)
    assert fa3_forward_tiles(128, False, True) == (128, 224, True, True)
    assert fa3_backward_tiles(128, False) == (80, 128, 2, 2)
    assert fa3_backward_tiles(128, True) == (64, 128, 2, 2)
    assert fa3_pingpong(128, 128, False, True) and not fa3_pingpong(128, 256, False, True)
    assert fa3_pingpong(128, 256, True, True) and not fa3_pingpong(192, 64, True, True)
    wl = Workload(4, 16, 4096, 4096, 128, dtype="fp16")
    m = resolved(wl, True)
    assert (m.block_q, m.block_kv, m.block_q_bwd, m.block_kv_bwd, m.stages) == (128, 176, 80, 128, 2)


def test_the_kernel_traits_table_in_programs_md_is_the_rules():
    """docs/programs.md's table of flash3's tiles is what fa3_forward_tiles and fa3_backward_tiles say."""
    from pathlib import Path

    def f(d, c, fp8, p):
        m, n, rs, ov = fa3_forward_tiles(d, c, fp8, p)
        return f"{m} x {n}" + ("" if rs else ", P smem") + ("" if ov else ", no overlap")

    doc = (Path(__file__).resolve().parent.parent / "docs" / "programs.md").read_text()
    for d in (64, 96, 128, 192, 256):
        (bq, bk, _, wg), (bqc, bkc, _, wgc) = fa3_backward_tiles(d, False), fa3_backward_tiles(d, True)
        row = (f"| {d} | {f(d, False, False, False)} | {f(d, True, False, False)} | {f(d, False, False, True)} | "
               f"{f(d, False, True, False)} | {f(d, False, True, True)} | {bq} x {bk}, {wg} WG | "
               f"{bqc} x {bkc}, {wgc} WG |")
        assert row in doc, row


def test_backward_gemm_layouts_are_the_sources():
    """The backward's traits (flash_bwd_launch_template.h, Arch >= 90): P and dS reach the dV and dK
    GEMMs from registers at head dims 64, 96 and 128 only (Mma_dKV_is_RS), dQ's GEMM never takes dS
    from registers (Mma_dQ_is_RS needs AtomLayoutMSdP = NumMmaWarpGroups, never so on sm90), and a
    wgmma GEMM's shared-memory reads by hand: a 128 x 80 x 128 GEMM of two warpgroups along m reads
    B (80 x 128) twice and A (128 x 128) once; A in registers, B alone; along n, A twice."""
    from hbmsim.algorithms.flash3_backward import fa3_bwd_traits, wgmma_operand_bytes
    rs = {d: fa3_bwd_traits(d, False).mma_dkv_is_rs for d in (64, 96, 128, 192, 256)}
    assert rs == {64: True, 96: True, 128: True, 192: False, 256: False}
    assert not any(fa3_bwd_traits(d, c).mma_dq_is_rs for d in (64, 96, 128, 192, 256) for c in (False, True))
    assert fa3_bwd_traits(96, False).v_in_regs and not fa3_bwd_traits(128, True).v_in_regs
    assert wgmma_operand_bytes(128, 80, 128, 1, True, 2) == 2 * (128 * 128 + 2 * 80 * 128)
    assert wgmma_operand_bytes(128, 80, 128, 1, False, 2) == 2 * 2 * 80 * 128
    assert wgmma_operand_bytes(64, 80, 256, 2, True, 2) == 2 * (2 * 64 * 256 + 80 * 256)


@pytest.mark.parametrize("preset", ["a100-sxm4-40gb", "a100-sxm4-80gb"])
def test_refused_without_wgmma_in_one_line(preset):
    wl = Workload(1, 1, 128, 128, 64)
    with pytest.raises(HbmsimError, match="has_wgmma = 0") as err:
        SPEC.resolved(resolve_hardware(preset), wl, SPEC.mapping_type(), False)
    assert "\n" not in str(err.value)
    with pytest.raises(HbmsimError, match="forward only"):
        resolved(wl, True, variant="fp8")


def test_refused_in_the_cli_with_exit_2(tmp_path, capsys):
    from hbmsim.scenarios.cli import main
    exp = tmp_path / "fa3.toml"
    exp.write_text('name = "fa3"\nhardware = "a100-sxm4-80gb"\n[workload]\nbatch = 1\nheads = 1\nseq_len = 128\n'
                   'head_dim = 64\n[[runs]]\nalgorithm = "flash3"\npasses = ["forward"]\n')
    assert main(["run", str(exp), "--count-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert "has_wgmma = 0" in err and len(err.splitlines()) == 1


def test_same_bytes_as_flash2_less_time_and_fp8_faster():
    """FA3 moves FA2's bytes with the same tiles and no split (FA3's own rule would split these 64
    query blocks over 2); its schedule (wgmma, overlap) takes less time."""
    wl = Workload(1, 8, 1024, 1024, 128, dtype="fp16")
    flash2 = registry.get("flash2")
    m2 = flash2.resolved(H100, wl, flash2.mapping_type(block_q=128, block_kv=128), False)[0]
    assert resolved(wl).num_splits == 2
    m3 = resolved(wl, block_q=128, block_kv=128, num_splits=1)
    r2, r3 = simulate(H100, flash2.build(wl, m2, None, False)), simulate(H100, SPEC.build(wl, m3, None, False))
    assert counted(r2, "forward") == counted(r3, "forward")
    assert r3.time_s < 0.8 * r2.time_s
    r8 = simulate(H100, SPEC.build(wl, resolved(wl, variant="fp8", block_q=128, block_kv=128, num_splits=1), None,
                                   False))
    assert r8.time_s < r3.time_s


def test_overlap_is_what_the_schedule_says():
    """One warpgroup (64 query rows): its softmax can only hide under its own next GEMM, which the
    intra-warpgroup overlap issues first; without it the same bytes and FLOPs take longer. (With
    two warpgroups the other one's GEMMs already fill the tensor pipe.) With the measured
    xu_tensor_serial (the default) the overlap hides nothing: it is no faster."""
    from hbmsim.algorithms.flash3 import flash3_forward
    wl = Workload(1, 8, 1024, 1024, 128, dtype="fp16")
    pipes = TimeModel().off("xu_tensor_serial", "wgmma_full_rate")      # the overlap the schedule draws, unmeasured
    with_overlap = simulate(H100, flash3_forward(wl, 64, 128, None, 2, True, False), model=pipes)
    without = simulate(H100, flash3_forward(wl, 64, 128, None, 2, False, False), model=pipes)
    assert counted(with_overlap, "forward") == counted(without, "forward")
    k_with, k_without = (r.kernels[0].end_s - r.kernels[0].start_s for r in (with_overlap, without))
    assert k_with < 0.95 * k_without
    serial = [simulate(H100, flash3_forward(wl, 64, 128, None, 2, overlap, False)) for overlap in (True, False)]
    k_with, k_without = (r.kernels[0].end_s - r.kernels[0].start_s for r in serial)
    assert k_with >= k_without          # (issued ahead of the softmax, the next GEMM only reorders the one pipe)


def test_p_goes_through_shared_memory_where_the_kernel_says():
    """MmaPV_is_RS false (tile_size_fwd_sm90: head dim 64 without a mask, 96): each warpgroup stores
    its P (n x nc, 16-bit) to shared memory after its softmax and the P V wgmma reads it there as its
    A operand. One block of one warpgroup, one K/V step of 128 keys at head dim 64: 2 x 64 x 128 x 2
    = 32,768 more bytes of shared-memory traffic, the P tile (16,384 bytes) in the block's footprint,
    the same DRAM and L2 bytes and FLOPs, and no less time."""
    from hbmsim.algorithms.flash3 import flash3_forward, flash3_sram_bytes
    wl = Workload(1, 1, 64, 128, 64, dtype="fp16")
    rs, smem = (simulate(H100, flash3_forward(wl, 64, 128, None, 2, True, False, pv_is_rs=p)) for p in (True, False))
    assert smem.kernels[0].sram_read_bytes - rs.kernels[0].sram_read_bytes == 2 * 64 * 128 * 2
    assert counted(smem, "forward") == counted(rs, "forward")
    assert smem.kernels[0].matmul_flops == rs.kernels[0].matmul_flops
    assert smem.kernels[0].time_s >= rs.kernels[0].time_s
    assert flash3_sram_bytes(wl, 64, 128, 2, False, False) - flash3_sram_bytes(wl, 64, 128, 2, False) == 64 * 128 * 2
    # the spec builds it so for head dim 64 unmasked only (causal: 128-key tiles, P in registers)
    for causal, extra in ((False, 192 * 192 * 2), (True, 0)):
        big = Workload(1, 1, 4096, 4096, 64, dtype="fp16", causal=causal)
        m = resolved(big)
        assert SPEC.sram_bytes(big, m, False) == flash3_sram_bytes(big, m.block_q, m.block_kv, 2, False) + extra


def test_the_paper_set_is_simulated_with_the_kernel_the_paper_timed():
    """The FA3 paper's runs record the tiles of its July 2024 kernel where today's differ
    (published_fa3.PAPER_KERNELS), and validate builds each run with them: head dim 64 fp16 192 x 128
    with P in registers (today 192 x 192 through shared memory without a mask), the backward at head
    dim 128 64 x 128 (today 80 x 128), FP8 head dim 64 192 x 128 with 4 stages; head dim 256 as today."""
    from hbmsim.scenarios.runner import resolved_mapping
    from hbmsim.scenarios.validate import plan
    configs, _ = plan(["fa3-paper-h100"], only="fa3")
    got = {}
    for cfg in (c for c in configs if c.run.algorithm == "flash3"):      # not the paper's FA2 column
        wl, m = cfg.workload, resolved_mapping(cfg)
        got[(m.variant, wl.head_dim, wl.causal)] = (m.block_q, m.block_kv, m.stages, m.pv_in_registers,
                                                    m.block_q_bwd if cfg.run.training else None)
    assert got[("fa3-kernel", 64, False)][:4] == (192, 128, 2, True)
    assert got[("fa3-kernel", 64, True)][:4] == (192, 128, 2, True)
    assert got[("fa3-kernel", 128, False)] == (128, 176, 2, True, 64)
    assert got[("fa3-kernel", 256, False)][:4] == (128, 80, 2, True)
    assert got[("fp8", 64, False)][:3] == (192, 128, 4)
    assert got[("fp8", 128, True)][:3] == (128, 256, 2)
    # the grid's tile order, not today's longest-first (published_fa3.PAPER_TILE_ORDER)
    assert {resolved_mapping(c).lpt_order for c in configs if c.run.algorithm == "flash3"} == {False}


def test_fa3_causal_tile_order_worked_by_hand():
    """flash3.lpt_tile, FA3's DynamicPersistentTileScheduler (hopper/tile_scheduler.hpp): longest query
    block first, the batch-heads in sections whose K and V fit 32 MB, batch-heads fastest in a section."""
    from hbmsim.algorithms.flash3 import lpt_tile
    # K and V of a head: 1024 x 2 x 64 x 2 B = 256 KB, so 128 heads fit 32 MB: one section of the 4
    # batch-heads (batch 2 x 2 heads), 8 query blocks each
    tile, swizzle = lpt_tile(Workload(2, 2, 1024, 1024, 64), 8, 2)
    assert swizzle == 128
    assert [tile(k) for k in range(6)] == [(0, 7), (1, 7), (2, 7), (3, 7), (0, 6), (1, 6)]
    assert tile(31) == (3, 0)
    # N = 65536, head dim 128: 65536 x 2 x 128 x 2 B = 33.5 MB > 32 MB, one K/V head a section; 4
    # query heads on 2 K/V heads (PackGQA off): a section is the 2 query heads of one K/V head
    wl = Workload(1, 4, 65536, 65536, 128, kv_heads=2)
    tile, swizzle = lpt_tile(wl, 512, 2)
    assert swizzle == 2
    assert [tile(k) for k in (0, 1, 2, 1023, 1024)] == [(0, 511), (1, 511), (0, 510), (1, 0), (2, 511)]
    assert sorted(tile(k) for k in range(4 * 512)) == [(g, i) for g in range(4) for i in range(512)]
    # K and V of a head 40000 x 2 x 64 x 2 B = 10.2 MB: 3 fit, rounded down to a power of two, 2; 3
    # batch-heads in sections of 2: the last section (the remainder) is one batch-head
    tile, swizzle = lpt_tile(Workload(3, 1, 512, 40000, 64), 4, 2)
    assert swizzle == 2 and [tile(k) for k in range(8, 12)] == [(2, 3), (2, 2), (2, 1), (2, 0)]


def test_fa3_causal_backward_order_worked_by_hand():
    """flash3.lpt_bwd_tile, FA3's SingleTileBwdLPTScheduler: K/V blocks first to last (longest first
    under the mask), the batch-heads in sections whose Q, dO and fp32 dQ accumulator fit 40 MB."""
    from hbmsim.algorithms.flash3 import lpt_bwd_tile
    # a head's Q, dO and dQaccum: 1024 x (2 x 64 x 2 + 64 x 4) B = 512 KB, so 80 fit: 64, one
    # section of the 4 batch-heads, 8 K/V blocks each, the batch-heads fastest
    tile, swizzle = lpt_bwd_tile(Workload(2, 2, 1024, 1024, 64), 8, 2)
    assert swizzle == 64 and [tile(k) for k in range(6)] == [0, 8, 16, 24, 1, 9]
    assert sorted(tile(k) for k in range(32)) == list(range(32))
    # N = 65536, head dim 128: 64 MB a head, more than 40: the grid's own order
    tile, swizzle = lpt_bwd_tile(Workload(1, 4, 65536, 65536, 128), 512, 2)
    assert swizzle == 1 and [tile(k) for k in (0, 1, 511, 512, 2047)] == [0, 1, 511, 512, 2047]


def test_fa3_takes_the_causal_tile_order_by_default_and_keeps_its_counts():
    """lpt_order "auto": FA3's kernels (fa3-kernel, fp8) under a causal mask; not cuDNN's (its order is
    not known) nor without a mask. The order moves no byte: the counts equal the grid order's and the
    closed forms; it moves the time (N = 4096, batch 4, 16 heads, H100: the longest blocks first)."""
    from hbmsim.scenarios.experiment import Config, RunSpec
    from hbmsim.scenarios.runner import resolve_mapping, run_config
    gpu = resolve_hardware("h100-sxm5-80gb")
    wl = Workload(4, 16, 4096, 4096, 128, causal=True)
    mapping = lambda variant, causal=True, **kw: resolve_mapping(Config(
        gpu, dataclasses.replace(wl, causal=causal), RunSpec("flash3", ("forward",), {"variant": variant, **kw})))[0]
    assert mapping("fa3-kernel").lpt_order is True and mapping("fp8").lpt_order is True
    assert mapping("cudnn-sm90").lpt_order is False and mapping("fa3-kernel", causal=False).lpt_order is False
    assert mapping("fa3-kernel", lpt_order=False).lpt_order is False
    runs = {}
    for lpt in (True, False):
        cfg = Config(gpu, wl, RunSpec("flash3", ("forward",), {"lpt_order": lpt}))
        cfg = dataclasses.replace(cfg, mapping=resolve_mapping(cfg)[0])
        runs[lpt] = run_config(cfg, count_only=True)[0]
    for key in ("global_read_bytes", "global_write_bytes", "matmul_flops", "vector_flops", "exp_ops"):
        assert runs[True][key] == runs[False][key], key
    assert runs[True]["time_s"] != runs[False]["time_s"]
    # training (the backward's order too): the same counts, both passes
    small = Workload(1, 4, 1024, 1024, 64, causal=True)
    training = {}
    for lpt in (True, False):
        cfg = Config(gpu, small, RunSpec("flash3", ("forward", "backward"), {"lpt_order": lpt}))
        cfg = dataclasses.replace(cfg, mapping=resolve_mapping(cfg)[0])
        training[lpt] = run_config(cfg, count_only=True)
    for a, b in zip(training[True], training[False]):
        for key in ("global_read_bytes", "global_write_bytes", "matmul_flops", "vector_flops", "exp_ops"):
            assert a[key] == b[key], (a["pass"], key)


def test_shipped_published_set_is_the_conversion_of_its_csv():
    from hbmsim.scenarios.published_fa3 import FA3_PAPER_FILE, convert_fa3_paper_csv
    shipped = json.loads(FA3_PAPER_FILE.read_text())
    assert shipped == json.loads(json.dumps(convert_fa3_paper_csv()))
    run = next(r for r in shipped["runs"] if r["implementation"] == "fa3" and r["workload"]["head_dim"] == 128
               and r["workload"]["seq_len"] == 4096 and not r["workload"]["causal"] and r["pass"] == "forward")
    # 4 N^2 d heads batch / 638 TFLOPs/s: 4 x 4096^2 x 128 x 16 x 4 / 638e12
    assert run["time_s"] == pytest.approx(4 * 4096 ** 2 * 128 * 16 * 4 / 638e12, rel=1e-4)
    assert all(r["citation"].startswith("FlashAttention-3 paper") for r in shipped["runs"])
    # the FP8 figure's "16k" is the benchmark's 16896 = 128 x 132, batch 1: 4 N^2 d heads / 1008 TFLOP/s
    fp8 = next(r for r in shipped["runs"] if r["implementation"] == "fa3-fp8" and r["workload"]["head_dim"] == 128
               and r["workload"]["batch"] == 1 and not r["workload"]["causal"])
    assert fp8["workload"]["seq_len"] == 16896
    assert fp8["time_s"] == pytest.approx(4 * 16896 ** 2 * 128 * 16 / 1008e12, rel=1e-4)


def test_the_paper_runs_are_simulated_at_its_locked_1830_mhz_clock():
    """The FA3 paper locked the clock at 1830 MHz (appendix C.1); validate builds each run's GPU
    with the run's hardware_overrides: the per-clock rates of the preset (at its 1980 MHz) at 1830
    MHz, the tensor-core peak (already at 1830 MHz) and DRAM unchanged."""
    from hbmsim.scenarios.published_fa3 import FA3_PAPER_FILE
    from hbmsim.scenarios.validate import config_of
    shipped = json.loads(FA3_PAPER_FILE.read_text())
    gpu = config_of(str(FA3_PAPER_FILE), 0, shipped["runs"][0]).gpu
    assert gpu.clock_hz == 1.83e9
    # 16,896 FP32 lanes x 2 FLOPs x 1.83 GHz; 128 B/clk of shared memory; 4472.3 B/clk of L2
    assert gpu.vector_flops_per_s == pytest.approx(61.839e12, rel=1e-4)
    assert gpu.sram_bytes_per_s_per_sm == pytest.approx(234.24e9) and gpu.l2_bytes_per_s == pytest.approx(8.1843e12,
                                                                                                       rel=1e-4)
    assert (gpu.matmul_flops_per_s, gpu.hbm_bytes_per_s) == (H100.matmul_flops_per_s, H100.hbm_bytes_per_s)
    assert "hardware_overrides" in gpu.source["clock_hz"]


def test_timeline_draws_each_role_on_a_track_of_its_own():
    from hbmsim.simulator.timeline import ROLE_TID_BASE, Timeline
    t = Timeline()
    t.transfer(3, "flash3_fwd", 0, "load K", 0.0, 1e-6, 4096, 0, role="producer")
    t.compute(3, "flash3_fwd", 0, 0.5e-6, 1.5e-6, {"matmul_flops": 8}, role="consumer 0")
    t.compute(3, "flash3_fwd", 0, 1.0e-6, 2.0e-6, {"matmul_flops": 8}, role="consumer 1")
    t.compute(3, "flash3_fwd", 0, 2.0e-6, 3.0e-6, {"matmul_flops": 8})
    chrome = t.to_chrome(132, "fa3")
    names = {e["tid"]: e["args"]["name"] for e in chrome["traceEvents"] if e["name"] == "thread_name"}
    assert names == {3: "SM 3", ROLE_TID_BASE: "SM 3 producer", ROLE_TID_BASE + 1: "SM 3 consumer 0",
                     ROLE_TID_BASE + 2: "SM 3 consumer 1"}
    spans = {e["tid"]: (e["ts"], e["dur"]) for e in chrome["traceEvents"] if e.get("ph") == "X"}
    # the two consumers' computes overlap in time (microseconds), on tracks of their own
    assert spans[ROLE_TID_BASE + 1] == pytest.approx((0.5, 1.0))
    assert spans[ROLE_TID_BASE + 2] == pytest.approx((1.0, 1.0))


def test_run_prints_its_tiles_and_the_timeline_has_its_roles(tmp_path, capsys):
    """`hbmsim run` on the H100 preset: the table names FA3's own tiles for head dim 128 fp16
    (tile_size_fwd_sm90: 128 x 176, 2 stages), and `--timeline` draws the producer and the two
    consumer warpgroups of SM 0 on tracks of their own."""
    from hbmsim.scenarios.cli import main
    import json
    exp = tmp_path / "fa3.toml"
    exp.write_text('name = "fa3"\nhardware = "h100-sxm5-80gb"\n[workload]\nbatch = 1\nheads = 2\nseq_len = 1024\n'
                   'head_dim = 128\ndtype = "fp16"\n[[runs]]\nalgorithm = "flash3"\npasses = ["forward"]\n')
    trace = tmp_path / "t.json"
    assert main(["run", str(exp), "--timeline", str(trace)]) == 0
    assert "128x176 2st" in capsys.readouterr().out
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    tracks = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert {"SM 0 producer", "SM 0 consumer 0", "SM 0 consumer 1"} <= tracks


def test_fast_mode_takes_several_causal_tiles_a_step_in_a_long_grid_with_the_same_counts():
    """Fast mode's causal rule (common.tiles_per_step with the grid's blocks): in a grid of 1,024 blocks or more,
    tiles // 32 a step, 2 to 4, from 64 K/V tiles; in a shorter grid, and without a mask,
    common.tiles_per_step's. The counts of coarse steps: batch 1, 2 heads, N = 2048, head dim 64,
    tiles of 192 x 32 (up to 64 K/V tiles a block), two tiles a step forced: against a step per
    tile, the same L2-side bytes, FLOPs and DRAM bytes (K/V loaded tile by tile)."""
    from hbmsim.algorithms import common
    from hbmsim.algorithms import flash3 as fa3
    from hbmsim.scenarios.experiment import Config, Experiment, RunSpec
    from hbmsim.scenarios.runner import prepare, run_config
    rule = common.tiles_per_step
    assert [rule(t, False, 1024) for t in (32, 63, 64, 96, 128, 1024)] == [1, 1, 2, 3, 4, 8]
    assert [rule(t, False, 1023) for t in (64, 128, 1024)] == [1, 1, 8]        # a short grid: common's
    assert [rule(t, True, 4096) for t in (32, 64, 128)] == [1, 4, 8]           # no mask: common's even rule
    wl = Workload(1, 2, 2048, 2048, 64, causal=True)
    cfg = prepare(Experiment("x", "x", H100, [Config(H100, wl, RunSpec("flash3", ("forward",),
                                                                        {"block_q": 192, "block_kv": 32}))])).configs[0]
    per_tile = run_config(cfg, True, fast=True)[0]
    from hbmsim.algorithms import flash3_spec
    fwd_rule = flash3_spec.fwd_tiles_per_step
    fa3.coarse_step = lambda tiles, even=False, blocks=0: 2
    flash3_spec.fwd_tiles_per_step = lambda wl, block_q, block_kv, blocks=0: 2
    try:
        coarse = run_config(cfg, True, fast=True)[0]
    finally:
        fa3.coarse_step, flash3_spec.fwd_tiles_per_step = rule, fwd_rule
    for f in ("global_read_bytes", "global_write_bytes", "matmul_flops", "vector_flops", "exp_ops",
              "hbm_read_bytes", "hbm_write_bytes"):
        assert coarse[f] == per_tile[f], f
    assert coarse["sim_events"] < 0.7 * per_tile["sim_events"]


def test_fast_mode_backward_takes_the_causal_rule_in_a_grid_of_2048_kv_blocks_with_the_same_counts():
    """A key-parallel backward's fast-mode step (common.bwd_tiles_per_step): the causal rule over
    the longest loop once the main kernel's grid holds 2,048 K/V blocks; a step per tile below that
    (FA3's head dim 256 moved by up to 1.1%); without a mask the even rule. Coarse steps end at
    multiples of the step, so the counts are a step per tile's: batch 1, 2 heads, N = 2048, head
    dim 64, causal, two query tiles a step forced."""
    from hbmsim.algorithms import common, flash3_spec
    from hbmsim.scenarios.experiment import Config, Experiment, RunSpec
    from hbmsim.scenarios.runner import prepare, run_config
    rule = common.bwd_tiles_per_step
    big = Workload(1, 32, 8192, 8192, 64, causal=True)             # 32 x 64 = 2,048 K/V blocks of 128
    assert rule(big, 128, 128) == 2 and rule(Workload(1, 32, 16384, 16384, 64, causal=True), 128, 128) == 4
    assert rule(Workload(1, 31, 8192, 8192, 64, causal=True), 128, 128) == 1      # 1,984 blocks
    assert rule(Workload(1, 1, 8192, 8192, 64), 128, 128) == 4                    # no mask: 64 tiles, 16 steps
    wl = Workload(1, 2, 2048, 2048, 64, causal=True)
    run = RunSpec("flash3", ("forward", "backward"), {})
    cfg = prepare(Experiment("x", "x", H100, [Config(H100, wl, run)])).configs[0]
    per_tile = run_config(cfg, True, fast=True)
    flash3_spec.bwd_tiles_per_step = lambda wl, block_q, block_kv: 2
    try:
        coarse = run_config(cfg, True, fast=True)
    finally:
        flash3_spec.bwd_tiles_per_step = rule
    fine_bwd, coarse_bwd = (next(r for r in rs if r["pass"] == "backward") for rs in (per_tile, coarse))
    for f in ("global_read_bytes", "global_write_bytes", "matmul_flops", "vector_flops", "exp_ops"):
        assert coarse_bwd[f] == fine_bwd[f], f
    assert coarse_bwd["sim_events"] < 0.9 * fine_bwd["sim_events"]       # (the program's, forward's too)


def test_the_serial_bound_script_by_hand(capsys):
    """scripts/fa3_serial_bound.py: wgmma at the spec peak plus the exps, nothing overlapped. FA3
    fp16, head dim 128, B 4, H 16, N 4096, no mask, at the paper's 1830 MHz: 4 N^2 d = 8.590e9
    FLOPs a head x 64 heads / 989.4e12 = 0.5557 ms; N^2 x 64 = 1.074e9 exps / (16 x 132 x 1.83e9)
    = 0.2778 ms; 64 x 32 = 2048 blocks of 128 rows are 15.52 waves of 132, so x 16 / 15.52: 0.8595
    ms (published: 0.862). A causal toy by hand: N = 4, d = 2, 2 x 2 tiles: 32 + 64 FLOPs, 4 + 8 exps."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "scripts" / "fa3_serial_bound.py"
    spec = importlib.util.spec_from_file_location("fa3_serial_bound", path)
    bound = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bound)
    assert bound.visited(4, 2, 2, 2, True) == (96, 12, [32, 64])
    run = {"hardware": "h100-sxm5-80gb", "algorithm": "flash3", "variant": "fa3-kernel", "pass": "forward",
           "workload": {"batch": 4, "heads": 16, "seq_len": 4096, "head_dim": 128, "causal": False},
           "hardware_overrides": {"clock_hz": 1.83e9}}
    flops, exps = 64 * 4 * 4096**2 * 128, 64 * 4096**2
    want = (flops / 989.4e12 + exps / (16 * 132 * 1.83e9)) * 16 / (2048 / 132)
    assert bound.bound_s(run) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(0.8595e-3, rel=1e-3)
    assert bound.main([]) == 0
    assert "fa3-kernel no mask      9      1.5%" in capsys.readouterr().out
    assert bound.main(["h100-torch-fwd-bwd"]) == 2
    assert "no flash3 forward run" in capsys.readouterr().err


# the operand bytes each wgmma of the step reads from shared memory (bwd_gemm_operand_bytes), by hand:
# head dim 64 (128 x 128 tiles; S and dP transposed, warpgroups along the keys; P and dS in registers for
# dV and dK; dQ = dS K with its two warpgroups along the head dim): S^T = K Q^T reads K once (128 x 64)
# and Q once per 64 keys (2 x 128 x 64): 24,576 elements, and dP^T as much: 98,304 bytes; dV and dK read
# dO and Q once per 64 keys: 2 x 2 x 128 x 64 x 2 = 65,536 bytes; dQ reads dS (128 x 128) and K once per
# 64 rows (2 x 64 x 128): 65,536 bytes. Head dim 256 (64 x 80 tiles, nothing transposed but dK, dV and
# dQ, nothing in registers): S reads Q once per warpgroup column (2 x 64 x 256) and K once (80 x 256):
# 53,248 elements, dP as much: 212,992 bytes; dV^T and dK^T read dO^T, Q^T (256 x 64) and P, dS 4 times
# (4 x 80 x 64): 2 x 36,864 elements = 147,456 bytes; dQ^T reads K^T (256 x 80) and dS^T 4 times
# (4 x 64 x 80): 81,920 bytes. A staged dQ tile (fp32) is written and read back (TMA): 2 x 4 x n x d.
# FlashAttention's own config search counts the same (flash_attn/cute/sm90_config_search.py, _mma_traffic).
@pytest.mark.parametrize("d, n_q, n_kv, stored, sdp_bytes, dkv_bytes, dq_bytes, dq_staged",
                         [(64, 128, 128, 1, 98_304, 65_536, 65_536, True),
                          (256, 64, 80, 2, 212_992, 147_456, 81_920, False)])
def test_backward_step_is_the_sources_phases_by_hand(d, n_q, n_kv, stored, sdp_bytes, dkv_bytes, dq_bytes,
                                                     dq_staged):
    """One block, one step of the main backward kernel: each consumer warpgroup's GEMMs, then P's exps,
    then dS = P o (dP - D) with its stores to shared memory, then dV's GEMM, the named barrier of both
    warpgroups, then dK's and dQ's GEMMs (FA3's bwd_step order). Head dim 64 feeds dV and dK from
    registers and stages dQ in shared memory, and issues the kernel's SASS count (705 instructions a
    consumer warp, the producer's 52.5 and the dQ writer's 40 an iteration: 11,465 / 32,768 a score,
    32 lanes each, at the schedulers' rate) in P's phase; 256 (not counted) stores P and dS, adds dQ
    from registers and counts its FP32 operations, dS's after the exps. The SM's busy time is the
    calls' sum, and the shared-memory bytes are every wgmma's operand reads (by hand above; dV's GEMM
    reads half of dV's and dK's) and the stored tiles."""
    from hbmsim.algorithms.backward_common import bwd_vector_flops
    from hbmsim.algorithms.flash3_spec import FA3_BWD_INSTRUCTIONS_PER_SCORE
    from hbmsim.simulator.time_model import FP32, INSTRUCTIONS, WGMMA, SmRates
    wl = Workload(1, 1, n_q, n_kv, d, dtype="fp16")
    m = resolved(wl, training=True)
    assert (m.block_q_bwd, m.block_kv_bwd) == (n_q, n_kv)            # one block, one step
    result = simulate(H100, SPEC.build(wl, m, None, True))
    main = next(k for k in result.kernels if k.name == "flash3_bwd")
    n, nc, e, wgs = n_q, n_kv, 2, 2
    sass = FA3_BWD_INSTRUCTIONS_PER_SCORE.get((d, False))
    if sass:
        assert sass == 11_465 / 32_768 and d == 64
        vec = round(32 * sass * n * nc)                          # lane-instructions: 183,440 on 128 x 128
        p_phase, ds_phase, work = (0, vec // wgs, n * nc // wgs, 0), (0, 0, 0, stored * n * nc * e // wgs), INSTRUCTIONS
    else:
        vec = bwd_vector_flops(wl, n, nc)
        p_phase = (0, (vec - 2 * n * nc) // wgs, n * nc // wgs, 0)
        ds_phase, work = (0, 2 * n * nc // wgs, 0, stored * n * nc * e // wgs), FP32
    calls = [  # (matmul flops, vector ops, exps, shared-memory bytes) of one warpgroup
        (4 * n * nc * d // wgs, 0, 0, sdp_bytes // wgs), p_phase, ds_phase,
        (2 * n * nc * d // wgs, 0, 0, dkv_bytes // 2 // wgs),
        (4 * n * nc * d // wgs, 0, 0, (dkv_bytes // 2 + dq_bytes + (2 * 4 * n * d if dq_staged else 0)) // wgs)]
    rates = SmRates(H100, TimeModel())
    by_hand_s = wgs * sum(sum(rates.compute_s(WGMMA, *c, work)) for c in calls)
    assert main.compute_busy_s == pytest.approx(by_hand_s, rel=1e-9)
    assert main.sram_read_bytes == wgs * sum(c[3] for c in calls)
    assert main.vector_flops == vec and main.exp_ops == n * nc     # the counts are the program's, split not changed


def test_cudnn_variant_issues_its_measured_instructions_in_the_softmax_phase():
    """The cudnn-sm90 variant (torch's cuDNN attention as FA3's program): its backward main kernel
    issues Nsight's 0.5727 warp instructions a score (head dim 64) in the step's softmax phase, 32
    lanes each at the warp schedulers' rate (vector_work "instructions"), in place of FA3's count
    from its SASS (11,465 / 32,768 a score); the GEMMs, exps, stores and bytes are FA3's. One block,
    one step, by hand."""
    from hbmsim.algorithms.flash3_spec import CUDNN_BWD_INSTRUCTIONS_PER_SCORE, FA3_BWD_INSTRUCTIONS_PER_SCORE
    from hbmsim.simulator.time_model import INSTRUCTIONS, WGMMA, SmRates
    d, n, nc, wgs = 64, 128, 128, 2
    wl = Workload(1, 1, n, nc, d, dtype="fp16")
    fa3 = simulate(H100, SPEC.build(wl, resolved(wl, training=True), None, True))
    m = resolved(wl, training=True, variant="cudnn-sm90")
    result = simulate(H100, SPEC.build(wl, m, None, True))
    main = next(k for k in result.kernels if k.name == "flash3_bwd")
    main_fa3 = next(k for k in fa3.kernels if k.name == "flash3_bwd")
    lanes = round(32 * CUDNN_BWD_INSTRUCTIONS_PER_SCORE[64] * n * nc)
    assert CUDNN_BWD_INSTRUCTIONS_PER_SCORE[64] == 0.5727
    assert main.vector_flops == lanes // wgs * wgs                 # instructions x 32 lanes, not FP32 ops
    assert (main.matmul_flops, main.exp_ops, main.sram_read_bytes) == \
        (main_fa3.matmul_flops, main_fa3.exp_ops, main_fa3.sram_read_bytes)
    assert counted(result, "backward") == counted(fa3, "backward")    # the same bytes, tensor by tensor
    rates = SmRates(H100, TimeModel())
    softmax = sum(rates.compute_s(WGMMA, 0, lanes // wgs, n * nc // wgs, 0, INSTRUCTIONS))
    lanes_fa3 = round(32 * FA3_BWD_INSTRUCTIONS_PER_SCORE[(64, False)] * n * nc)
    assert main_fa3.vector_flops == lanes_fa3 == 183_440
    softmax_fa3 = sum(rates.compute_s(WGMMA, 0, lanes_fa3 // wgs, n * nc // wgs, 0, INSTRUCTIONS))
    # the busy time differs from FA3's by the two warpgroups' softmax phases, and by nothing else
    assert main.compute_busy_s - main_fa3.compute_busy_s == pytest.approx(wgs * (softmax - softmax_fa3), rel=1e-6)
    assert softmax > softmax_fa3


def test_cudnn_head_dim_256_computes_s_and_dp_twice():
    """cuDNN's head-dim-256 backward: Nsight's tensor ops are 14 N^2 d a batch-head (S and dP twice,
    CUDNN_BWD_SDP_PASSES), so the cudnn-sm90 main kernel's matmul FLOPs are 14 N^2 d (10, the five
    GEMMs', at head dim 128); the bytes to and from memory are fa3-kernel's, tensor by tensor.
    N = 128, one batch-head (cuDNN computes its real rows and keys: no whole tiles)."""
    from hbmsim.algorithms.flash3_spec import CUDNN_BWD_SDP_PASSES
    n = 128
    assert CUDNN_BWD_SDP_PASSES == {256: 2}
    for d, gemm_per_score_d in ((256, 14), (128, 10)):
        wl = Workload(1, 1, n, n, d, dtype="fp16")
        cudnn = simulate(H100, SPEC.build(wl, resolved(wl, training=True, variant="cudnn-sm90"), None, True))
        fa3 = simulate(H100, SPEC.build(wl, resolved(wl, training=True), None, True))
        main = next(k for k in cudnn.kernels if k.name == "flash3_bwd")
        assert main.matmul_flops == gemm_per_score_d * n * n * d
        assert counted(cudnn, "backward") == counted(fa3, "backward")


def test_cudnn_variant_says_where_it_has_no_count():
    """Head dims Nsight did not count (192) keep FA3's counting, and the run says so in a note."""
    wl = Workload(1, 8, 1024, 1024, 192, dtype="fp16")
    m, notes = SPEC.resolved(H100, wl, SPEC.mapping_type(variant="cudnn-sm90"), True)
    assert notes == ("variant cudnn-sm90: head_dim = 192 has no measured instruction count (measured: 64, 128, 256); "
                     "its backward counts FA3's operations",)
    assert SPEC.describe(m).endswith(" cudnn")
    assert SPEC.resolved(H100, Workload(1, 8, 1024, 1024, 128, dtype="fp16"), m, True)[1] == ()


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_cudnn_instruction_counts_are_nsights(gpu):
    """CUDNN_BWD_INSTRUCTIONS_PER_SCORE read off the shipped Nsight files: cuDNN's sm90 backward
    main kernel's warp instructions over its scores (batch-heads x N^2, the batch-heads from its
    wgmma FLOPs: 10 N^2 d each), N = 4096, the same on both GPUs; and off the tensor pipe the kernel
    spends 93-103% of those instructions at 4 an SM-clock (validation.md)."""
    import json

    from hbmsim.algorithms.flash3_spec import CUDNN_BWD_INSTRUCTIONS_PER_SCORE
    from hbmsim.scenarios.published import MEASURED_DIR
    doc = json.loads((MEASURED_DIR / f"{gpu}-ncu-pipes.json").read_text())
    for d, batch_heads, off_tensor in ((64, 128, 0.93), (128, 64, 1.03)):
        run = next(r for r in doc["runs"] if r["file"] == f"ncu-cudnn-{d}-4096-backward.csv")
        k = next(k for k in run["kernels"] if "bprop" in k["name"])
        n = 4096
        assert k["sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum"] == 10 * n * n * d * batch_heads
        scores = batch_heads * n * n
        per_score = k["smsp__inst_executed.sum"] / scores
        assert round(per_score, 4) == CUDNN_BWD_INSTRUCTIONS_PER_SCORE[d]
        assert k["launch__grid_size"] == 132                          # persistent: one CTA on each of the 132 SMs
        cycles = k["gpu__time_duration.sum"] * 1e-9 * k["sm__cycles_elapsed.avg.per_second"] * 132     # SM-cycles
        off = cycles / scores * (1 - k["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"] / 100)
        assert per_score / 4 / off == pytest.approx(off_tensor, abs=0.01)


def test_cudnn_instruction_count_at_head_dim_256_and_what_does_not_move_it():
    """Head dim 256's count off the 2026-11-27 H200 Nsight file (batch 4 x 8 heads, N = 4096: 32
    batch-heads), and the same kernel family's count at head dim 64 at N = 1024 (512 batch-heads) and
    under a causal mask (N = 4096, 128 batch-heads, the tiles on and below the diagonal: the hgmma
    FLOPs say 66 of the 128 heads' full N^2, 1/2 + 64/4096) within 3% of the N = 4096 unmasked
    0.5727: a count a score, not a length's or a mask's. At 256 the hgmma counter reads 14 N^2 d a
    head where the five GEMMs are 10 (its tensor pipe is busy for 10 N^2 d at 4096 FLOPs a cycle:
    0.648 against 0.625 SM-cycles a score), so the batch-heads come from the workload there."""
    import json

    from hbmsim.algorithms.flash3_spec import CUDNN_BWD_INSTRUCTIONS_PER_SCORE
    from hbmsim.scenarios.published import MEASURED_DIR
    doc = json.loads((MEASURED_DIR / "h200-ncu-cudnn-bwd.json").read_text())
    assert doc["source"] == "measured" and doc["provenance"]["gpu"] == ["NVIDIA H200"]

    def main_kernel(file):
        run = next(r for r in doc["runs"] if r["file"] == file)
        return next(k for k in run["kernels"] if "bprop" in k["name"])
    k = main_kernel("ncu-cudnn-256-4096-backward.csv")
    n, d, batch_heads = 4096, 256, 4 * 8
    assert k["sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum"] == 14 * n * n * d * batch_heads
    assert round(k["smsp__inst_executed.sum"] / (batch_heads * n * n), 4) == CUDNN_BWD_INSTRUCTIONS_PER_SCORE[256]
    for file, n, computed_heads, per_score in (("ncu-cudnn-64-1024-backward.csv", 1024, 512, 0.5830),
                                               ("ncu-cudnn-64-4096-causal-backward.csv", 4096, 66, 0.5580)):
        k = main_kernel(file)
        assert k["sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum"] == 10 * n * n * 64 * computed_heads
        assert round(k["smsp__inst_executed.sum"] / (computed_heads * n * n), 4) == per_score
        assert per_score / CUDNN_BWD_INSTRUCTIONS_PER_SCORE[64] == pytest.approx(1, abs=0.03)
