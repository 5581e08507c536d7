"""The FlashAttention v1 kernel programs (flash-attention v1.0.9, spec8 section 1): counters equal
the closed forms in io_flash1_kernel.py, numerics and gradients equal the float64 reference, and
the configuration rules (Bc, num_splits, seq-parallel backward) follow the source."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hbmsim.algorithms.flash1_kernel import (QUERY_STEP, fa1_bwd_parallel, fa1_ctas_per_sm, fa1_kernel_blocks,
                                             fa1_kernel_forward, fa1_kernel_sram_bytes, fa1_num_splits)
from hbmsim.algorithms.flash1_kernel_backward import fa1_kernel_training
from hbmsim.algorithms.io_flash1_kernel import fa1_kernel_backward_io, fa1_kernel_forward_io
from hbmsim.algorithms.reference import attention_backward, attention_forward
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.simulator import HbmsimError, simulate

from conftest import tiny_gpu

GPU = tiny_gpu(sram_bytes_per_sm=1 << 22, sm_count=8)


def nonzero(io):
    return {k: v for k, v in io.items() if v != (0, 0)}


def counted(prog, pass_name, gpu=GPU):
    return nonzero({n: (t.read, t.write) for n, t in simulate(gpu, prog).tensors(pass_name).items()})


# ---- hand-worked bytes ----------------------------------------------------------------------------

def test_forward_by_hand():
    # B*H = 1, N = 512, d = 64, fp16: Bc = 256, 2 key blocks, 32 query steps of 16 rows, 1 split.
    # One Q/O/K/V matrix is 512*64*2 = 65536 B; o_tmp (fp32) 131072 B; lse (fp32) 2048 B.
    # K, V: read once (1 split): 65536 B each.
    # Q: re-read for each of the 2 key blocks: 131072 B.
    # o_tmp: block 0 writes every step (not final), block 1 reads it back: 131072 B each way.
    # lse: written at both blocks (4096 B), read at block 1 (2048 B).
    # O: written once, at block 1 (the final write): 65536 B.
    wl = Workload(1, 1, 512, 512, 64)
    assert fa1_kernel_blocks(wl) == 256
    want = {"Q": (131072, 0), "K": (65536, 0), "V": (65536, 0), "o_tmp": (131072, 131072),
            "lse": (2048, 4096), "O": (0, 65536)}
    assert counted(fa1_kernel_forward(wl, 256, 1), "forward") == want
    assert nonzero(fa1_kernel_forward_io(wl, 256, 1)) == want
    # 3 splits: every split CTA reads K_j and V_j again (3 * 65536); nothing else changes.
    want3 = {**want, "K": (196608, 0), "V": (196608, 0)}
    assert counted(fa1_kernel_forward(wl, 256, 3), "forward") == want3


def test_backward_by_hand():
    # Same shape. Non-parallel backward: K, V read and dK, dV written once (65536 B each);
    # Q and dO read at both key blocks (131072 B); lse and D (fp32) read at both (4096 B);
    # O read and D written at block 0 only (65536 B, 2048 B); dq_tmp (fp32) written at block 0
    # and read at block 1 (131072 B each); dQ written once at block 1 (65536 B).
    wl = Workload(1, 1, 512, 512, 64)
    want = {"K": (65536, 0), "V": (65536, 0), "dK": (0, 65536), "dV": (0, 65536), "Q": (131072, 0),
            "dO": (131072, 0), "lse": (4096, 0), "D": (4096, 2048), "O": (65536, 0),
            "dq_tmp": (131072, 131072), "dQ": (0, 65536)}
    assert counted(fa1_kernel_training(wl, 256, 1, False), "backward") == want
    assert nonzero(fa1_kernel_backward_io(wl, 256, False)) == want
    # Seq-parallel: dq_tmp zero-filled (131072 W), 2 key-block CTAs atomically add every step
    # (2 * 131072 R + W), converted (131072 R); dot_do_o reads dO and O once and writes D.
    par = {**want, "dO": (196608, 0), "dq_tmp": (393216, 393216)}
    assert counted(fa1_kernel_training(wl, 256, 1, True), "backward") == par


def test_loads_are_issued_a_step_ahead():
    # The v1.0.9 kernels load each 16-row step's Q (and lse; dO, D in the backward) during the
    # step before (fmha_fprop_kernel_1xN.h:403-441, fmha_dgrad_kernel_1xN_loop.h:454-458, 529-537,
    # 625-650), so a DRAM latency shorter than a step's compute is paid where nothing runs ahead:
    # the K_j/V_j loads that start each key block, and the last stores' drain. Same shape as above
    # (2 key blocks, 32 steps, about 7 us of compute a step on this GPU): a 2 us latency adds
    # 3 latencies to the forward (2 key blocks + the drain) and 2 to the seq-parallel backward
    # (its key block's start + the drain), where waiting at every step would add 32 or more.
    wl, lat = Workload(1, 1, 512, 512, 64), 2e-6

    def kernel_s(latency):
        gpu = tiny_gpu(sram_bytes_per_sm=1 << 22, sm_count=8, hbm_latency_s=latency)
        return {k.name: k.time_s for k in simulate(gpu, fa1_kernel_training(wl, 256, 1, True)).kernels}

    slow, fast = kernel_s(lat), kernel_s(1e-9)
    assert slow["fa1_fwd"] - fast["fa1_fwd"] == pytest.approx(3 * lat, rel=0.01)
    assert slow["fa1_bwd_seqparallel"] - fast["fa1_bwd_seqparallel"] == pytest.approx(2 * lat, rel=0.01)


def test_blocks_an_sm_holds_count_registers_as_cuda_does(a100):
    # cudaOccupancyMaxActiveBlocksPerMultiprocessor, which the num_splits heuristics read, counts
    # registers. Head dim 128, Bc = 128 on A100: the forward's block takes 41,088 B of shared
    # memory (2 x 16 x 128 x 2 for Q + 128 x 128 x 2 for K/V + 2 x 16 x 4 for lse), 4 of which fit
    # in 166,912 B, but its 128 threads at 255 registers take 4 warps x 8,192 (32 x 255 rounded up
    # to the 256-register unit) = 32,768 of the 65,536: 2 blocks. The backward's 256 threads at
    # 255: 8 x 8,192 = 65,536: 1.
    wl = Workload(4, 16, 2048, 2048, 128)
    assert fa1_kernel_sram_bytes(wl, 128, False) == 41088
    assert a100.sram_bytes_per_sm // 41088 == 4
    assert fa1_ctas_per_sm(a100, wl, 128, False) == 2
    assert fa1_ctas_per_sm(a100, wl, 128, True) == 1
    launches = {k.name: k for k in fa1_kernel_training(wl, 128, 1, True).launches}
    assert (launches["fa1_fwd"].threads_per_block, launches["fa1_fwd"].registers_per_thread) == (128, 255)
    assert (launches["fa1_bwd_seqparallel"].threads_per_block, launches["fa1_bwd_seqparallel"].registers_per_thread) \
        == (256, 255)
    # the heuristic then splits 64 batch-heads over 108 SMs x 2 blocks, not x 4
    assert fa1_num_splits(64, 108, 2, 2048) != fa1_num_splits(64, 108, 4, 2048)


def test_causal_final_write_on_the_diagonal():
    # N = 512, causal, Bc = 256: block 0 visits all 32 steps, block 1 starts at step 16. Steps
    # 0..15 are final at block 0 (fp16 O), steps 16..31 write fp32 o_tmp and are final at block 1.
    wl = Workload(1, 1, 512, 512, 64, causal=True)
    half = 256 * 64
    want = {"Q": ((512 + 256) * 64 * 2, 0), "K": (65536, 0), "V": (65536, 0),
            "o_tmp": (half * 4, half * 4), "lse": (256 * 4, (512 + 256) * 4), "O": (0, 65536)}
    assert counted(fa1_kernel_forward(wl, 256, 1), "forward") == want == nonzero(fa1_kernel_forward_io(wl, 256, 1))


def test_single_key_block_has_no_o_tmp():
    wl = Workload(1, 2, 100, 128, 64)
    assert fa1_kernel_blocks(wl) == 128
    io = counted(fa1_kernel_forward(wl, 128, 2), "forward")
    assert "o_tmp" not in io and io["lse"] == (0, 2 * 100 * 4) and io["Q"] == (2 * 100 * 64 * 2, 0)
    assert "dq_tmp" not in counted(fa1_kernel_training(wl, 128, 1, False), "backward")


# ---- counters equal closed forms --------------------------------------------------------------

workloads = st.builds(
    Workload, batch=st.integers(1, 2), heads=st.integers(1, 2), seq_len_q=st.integers(1, 300),
    seq_len_kv=st.integers(1, 300), head_dim=st.sampled_from([8, 32]),
    dtype=st.sampled_from(["fp16", "bf16", "fp32"]), causal=st.booleans(), key_padding_mask=st.booleans(),
    dropout=st.sampled_from([0.0, 0.1]))


@settings(max_examples=40, deadline=None)
@given(workloads, st.sampled_from([16, 32, 48, 128, 256]), st.integers(1, 5), st.booleans())
def test_counts_equal_closed_forms(wl, bkv, splits, par):
    prog = fa1_kernel_training(wl, bkv, splits, par)
    res = simulate(GPU, prog)
    fwd = nonzero({n: (t.read, t.write) for n, t in res.tensors("forward").items()})
    bwd = nonzero({n: (t.read, t.write) for n, t in res.tensors("backward").items()})
    assert fwd == nonzero(fa1_kernel_forward_io(wl, bkv, splits))
    assert bwd == nonzero(fa1_kernel_backward_io(wl, bkv, par))


def test_counts_hold_with_l2():
    gpu = tiny_gpu(sram_bytes_per_sm=1 << 22, l2_bytes=5000, l2_bytes_per_s=1e12)
    wl = Workload(2, 1, 70, 90, 16, causal=True, key_padding_mask=True, dropout=0.1)
    for par in (False, True):
        prog = fa1_kernel_training(wl, 32, 3, par)
        assert counted(prog, "forward", gpu) == nonzero(fa1_kernel_forward_io(wl, 32, 3))
        assert counted(prog, "backward", gpu) == nonzero(fa1_kernel_backward_io(wl, 32, par))


def test_non_causal_totals_match_spec_formulas():
    # spec 1.3 / 1.5 per-(b,h) totals, Nq = Nk = N, n_kb = N / Bc.
    n, d, bc, s = 1024, 64, 256, 3
    wl = Workload(1, 1, n, n, d)
    kb = n // bc
    f = fa1_kernel_forward_io(wl, bc, s)
    assert f["Q"] == (kb * n * d * 2, 0) and f["K"] == f["V"] == (s * n * d * 2, 0)
    assert f["o_tmp"] == ((kb - 1) * n * d * 4,) * 2 and f["O"] == (0, n * d * 2)
    assert f["lse"] == ((kb - 1) * n * 4, kb * n * 4)
    b = fa1_kernel_backward_io(wl, bc, False)
    assert b["Q"] == b["dO"] == (kb * n * d * 2, 0) and b["lse"] == (kb * n * 4, 0)
    assert b["D"] == (kb * n * 4, n * 4) and b["O"] == (n * d * 2, 0)
    assert b["dq_tmp"] == ((kb - 1) * n * d * 4,) * 2 and b["dQ"] == (0, n * d * 2)


# ---- numerics -------------------------------------------------------------------------------------

shapes = st.fixed_dictionaries({
    "batch": st.integers(1, 2), "heads": st.integers(1, 2), "seq_len_q": st.integers(1, 40),
    "seq_len_kv": st.integers(1, 40), "head_dim": st.sampled_from([1, 4, 8]),
    "dtype": st.sampled_from(["fp16", "fp32"]), "causal": st.booleans(),
    "key_padding_mask": st.booleans(), "dropout": st.sampled_from([0.0, 0.3]),
})


def check_numerics(wl, data, bkv, splits, par):
    out = simulate(GPU, fa1_kernel_training(wl, bkv, splits, par, data)).outputs
    o, lse = attention_forward(wl, data)
    np.testing.assert_allclose(out["O"].reshape(o.shape), o, rtol=0, atol=1e-12)
    got = out["lse"].reshape(lse.shape)
    assert np.array_equal(np.isneginf(got), np.isneginf(lse))
    fin = np.isfinite(lse)
    np.testing.assert_allclose(got[fin], lse[fin], rtol=0, atol=1e-12)
    ref = attention_backward(wl, data, data.d_o)
    for name in ("dQ", "dK", "dV"):
        g = out[name].reshape(ref[name].shape)
        assert np.all(np.isfinite(g)), name
        np.testing.assert_allclose(g, ref[name], rtol=0, atol=1e-12, err_msg=name)


@settings(max_examples=30, deadline=None)
@given(shapes, st.integers(1, 13), st.integers(1, 5), st.booleans(), st.integers(0, 2**31 - 1))
def test_numerics_and_gradients_equal_reference(fields, bkv, splits, par, seed):
    wl = Workload(**fields)
    check_numerics(wl, random_data(wl, seed), bkv, splits, par)


def test_fully_masked_rows_give_zero_output_and_gradients():
    # Nq > Nk, bottom-right causal: rows 0..5 see no key; batch 1 has no valid key at all.
    wl = Workload(2, 1, 10, 4, 8, causal=True, key_padding_mask=True)
    data = random_data(wl, 3)
    data.kv_lens = np.array([4, 0])
    for par in (False, True):
        check_numerics(wl, data, 2, 2, par)


# ---- configuration ------------------------------------------------------------------------------

def test_key_block_rules():
    assert QUERY_STEP == 16
    assert fa1_kernel_blocks(Workload(1, 1, 1024, 1024, 32)) == 256
    assert fa1_kernel_blocks(Workload(1, 1, 1024, 1024, 64)) == 256
    assert fa1_kernel_blocks(Workload(1, 1, 1024, 128, 64)) == 128     # seqlen_k <= 128
    assert fa1_kernel_blocks(Workload(1, 1, 1024, 129, 64)) == 256
    assert fa1_kernel_blocks(Workload(1, 1, 1024, 1024, 65)) == 128
    assert fa1_kernel_blocks(Workload(1, 1, 1024, 64, 128)) == 128
    with pytest.raises(HbmsimError, match="head_dim 160"):
        fa1_kernel_blocks(Workload(1, 1, 16, 16, 160))


@pytest.mark.parametrize("sms, bh, n, want", [
    (108, 1024, 512, (2, 4)), (108, 256, 2048, (5, 5)), (108, 32, 16384, (10, 13)),
    (108, 16, 16384, (13, 13)), (132, 1024, 512, (1, 1)), (132, 32, 16384, (4, 8))])
def test_forward_split_heuristic_on_spec_table(sms, bh, n, want):
    assert (fa1_num_splits(bh, sms, 1, n), fa1_num_splits(bh, sms, 2, n)) == want


def test_forward_split_search_bound_is_30_from_the_bug():
    # Intended bound ceil(seqlen_q/16) = 1 for a 16-row query; the bug's bound is
    # min(30, 16 + 16) = 30. With 1 batch-head on 108 SMs every n gives efficiency n/108 (one
    # partial wave), best at n = 30; the first n above 0.95 * 30 = 28.5 is 29.
    assert fa1_num_splits(1, 108, 1, 16) == 29      # first n with n/108 > 0.95 * 30/108
    assert fa1_num_splits(1, 108, 1, 1) == 29       # seqlen_q rounds up to 16 first


def test_backward_parallel_rule_on_spec_examples():
    # A100 (108 SMs), cps = 1, hidden 2048, 16k tokens: d = 64 (h = 32, Bc = 256) stays
    # non-parallel for N <= 1k; d = 128 (h = 16, Bc = 128) only at N = 512.
    for n in (512, 1024, 2048, 4096, 8192, 16384):
        assert fa1_bwd_parallel(32 * 16384 // n, 108, 1, n, 256, False) == (n >= 2048)
        assert fa1_bwd_parallel(16 * 16384 // n, 108, 1, n, 128, False) == (n >= 1024)
    assert fa1_bwd_parallel(10**6, 108, 1, 1280, 128, True)          # causal, 10 key blocks: always
    assert not fa1_bwd_parallel(1, 108, 1, 128, 128, False)          # one key block: nothing to split


def test_sram_bytes():
    wl = Workload(1, 1, 512, 512, 64)
    # Q double-buffered 2*16*64*2 = 4096, shared K/V buffer 256*64*2 = 32768, lse tile 128.
    assert fa1_kernel_sram_bytes(wl, 256, False) == 4096 + 32768 + 128
    # bwd (d = 64, Bc = 256: V not in registers): 2*4096 + 2*32768 + 16*64*4*8 + 2*16*256*2
    assert fa1_kernel_sram_bytes(wl, 256, True) == 8192 + 65536 + 32768 + 16384


def test_the_register_script_reads_ptxas_and_refuses_a_wrong_folder(tmp_path, capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "scripts" / "fa1_registers.py"
    spec = importlib.util.spec_from_file_location("fa1_registers", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    log = ("ptxas info    : Compiling entry function '_Z20fmha_fwd_loop_kernelI18FMHA_kernel_traitsILi128ELi128ELi16E"
           "Li1ELi4ELj8E6__halfELb0ELb0ELb0EEv17FMHA_fprop_params' for 'sm_80'\n"
           "ptxas info    : Function properties for _Z20fmha_fwd_loop_kernel...\n"
           "ptxas info    : Used 254 registers, used 1 barriers, 576 bytes cmem[0]\n")
    assert list(script.kernels(log)) == [("_Z20fmha_fwd_loop_kernelI18FMHA_kernel_traitsILi128ELi128ELi16E"
                                          "Li1ELi4ELj8E6__halfELb0ELb0ELb0EEv17FMHA_fprop_params", 254)]
    assert script.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not a flash-attention v1.0.9 checkout" in err or "nvcc is not on PATH" in err
