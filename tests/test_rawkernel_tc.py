"""The tensor-core kernel (kernels/flash_attention_tc.cu): its CPU emulation (kernels/emulation_tc.py)
against the float64 reference, its emulated bytes = the closed forms of flash2 variant
"rawkernel-tc" = the simulator's counters, for every tile configuration, ragged and causal
included; its configuration checks; and, on a GPU (marked gpu, skipped without one), the kernel."""
import math
import re

import numpy as np
import pytest

from hbmsim.algorithms import flash2_rawkernel_tc as tc
from hbmsim.algorithms import registry
from hbmsim.algorithms.reference import attention_forward
from hbmsim.algorithms.workload import AttentionData, Workload
from hbmsim.kernels import emulation_tc_config as cfgmod
from hbmsim.kernels.compile_check import find_nvcc, find_ptxas
from hbmsim.kernels.emulation_tc import emulate_flash_attention_tc, round_to_dtype, tile_copy_sectors
from hbmsim.kernels.emulation_tc_config import TcConfig
from hbmsim.kernels.gpu import gpu_available
from hbmsim.scenarios.cli import main
from hbmsim.simulator import HbmsimError, load_gpu, simulate
from hbmsim.scenarios.experiment import HARDWARE_DIR

FLASH2 = registry.get("flash2")
H100 = load_gpu(HARDWARE_DIR / "h100-sxm5-80gb.toml")
# unit roundoff of the input dtype (IEEE 754 binary16: 2^-11; bfloat16, 8 significant bits: 2^-8)
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def inputs(dtype, b, h, nq, nk, d, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(round_to_dtype(rng.standard_normal(s), dtype) for s in [(b, h, nq, d), (b, h, nk, d), (b, h, nk, d)])


def reference(dtype, q, k, v, causal):
    b, h, nq, d = q.shape
    wl = Workload(b, h, nq, k.shape[2], d, dtype=dtype, causal=causal)
    return wl, attention_forward(wl, AttentionData(*(x.astype(np.float64) for x in (q, k, v))))


def simulated_forward_bytes(wl, block_q, block_kv, warps):
    """The variant's program, count-only, through the registry and the simulator."""
    m, _ = FLASH2.resolved(H100, wl, FLASH2.mapping_type(block_q=block_q, block_kv=block_kv, warps=warps,
                                                          variant=tc.RAWKERNEL_TC), False)
    result = simulate(H100, FLASH2.build(wl, m, None, False))
    return m, {n: (t.read, t.write) for n, t in result.tensors("forward").items() if (t.read, t.write) != (0, 0)}


# ---- numerics: the emulation against the float64 reference ------------------------------------

@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape, blocks, causal", [
    ((1, 2, 100, 77, 64), (None, None, None), True),        # the launch rule's 128 x 128, 8 warps; ragged
    ((2, 1, 130, 200, 128), (None, None, None), False),     # 128 x 64; ragged both ways
    ((1, 1, 300, 37, 128), (64, 32, 2), True),              # 2 m-tiles a warp; Nq > Nk: rows that see no key
    ((1, 1, 37, 300, 64), (32, 16, 2), True),
    ((1, 1, 1, 1, 64), (16, 16, 1), False),                 # one query, one key: O = V
])
def test_emulation_matches_the_float64_reference(dtype, shape, blocks, causal):
    b, h, nq, nk, d = shape
    q, k, v = inputs(dtype, *shape)
    run = emulate_flash_attention_tc(q, k, v, dtype=dtype, block_q=blocks[0], block_kv=blocks[1], warps=blocks[2],
                                     causal=causal)
    _, (o_ref, lse_ref) = reference(dtype, q, k, v, causal)
    # Stated tolerance: P rounded to the input dtype moves sum(p v) / l by at most u max|v| (l is
    # summed from the unrounded p); O's final rounding by u |O|; fp32 arithmetic adds ~1e-6.
    u = UNIT_ROUNDOFF[dtype]
    bound = u * (np.abs(o_ref) + np.abs(v).max()) + 1e-5
    assert np.all(np.abs(run.o - o_ref) <= bound)
    assert np.array_equal(run.o, round_to_dtype(run.o, dtype))          # O is stored in the input dtype
    fin = np.isfinite(lse_ref)
    assert np.array_equal(np.isinf(run.lse), ~fin) and np.all(run.lse[~fin] < 0)
    np.testing.assert_allclose(run.lse[fin], lse_ref[fin], rtol=0, atol=1e-5)
    assert np.all(run.o[~fin] == 0)                                      # a row with no visible key: O = 0
    assert np.all(np.isneginf(run.lse_padded[..., nq:]))                # padding rows


def test_one_key_gives_v_exactly():
    q, k, v = inputs("bf16", 1, 1, 5, 1, 64)
    run = emulate_flash_attention_tc(q, k, v, dtype="bf16", block_q=16, block_kv=16, warps=1)
    assert np.array_equal(run.o[0, 0], np.repeat(v[0, 0], 5, axis=0))     # p = 1, l = 1: O = V_0


def test_bf16_rounding_by_hand():
    # bf16 keeps 8 significant bits: the spacing above 1 is 2^-7; ties go to the even neighbour.
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -3.0], np.float32)
    assert round_to_dtype(x, "bf16").tolist() == [1.0, 1 + 2 ** -6, 1 + 2 ** -7, -3.0]


# ---- traffic: emulated = closed form = simulator, for every tile configuration ------------------

TILES = [(16, 1), (32, 2), (64, 2), (64, 4), (128, 8)]           # (block_q, warps): 1 or 2 m-tiles a warp


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_q, warps", TILES)
@pytest.mark.parametrize("block_kv", [16, 32, 64, 128])
def test_emulated_bytes_equal_closed_form_and_simulator(head_dim, block_q, warps, block_kv):
    for (b, h, nq, nk), causal in (((1, 2, 77, 150), False), ((2, 1, 150, 77), True), ((1, 1, 64, 64), True)):
        q, k, v = inputs("fp16", b, h, nq, nk, head_dim, seed=nq)
        run = emulate_flash_attention_tc(q, k, v, block_q=block_q, block_kv=block_kv, warps=warps, causal=causal)
        wl = Workload(b, h, nq, nk, head_dim, dtype="fp16", causal=causal)
        closed = tc.rawkernel_tc_forward_io(wl, block_q, block_kv)
        assert run.traffic == closed
        m, counted = simulated_forward_bytes(wl, block_q, block_kv, warps)
        assert (m.block_q, m.block_kv, m.warps) == (block_q, block_kv, warps)
        assert counted == closed
        assert all(r % 32 == 0 and w % 32 == 0 for r, w in closed.values())


def test_closed_form_by_hand():
    # B = H = 1, Nq = 100, Nk = 77, d = 64 fp16 (128-byte rows, 4 sectors), 64 x 32 blocks, no mask:
    # Q and O 100 rows = 12800 B (400 sectors); K, V: 2 query blocks x 77 rows = 19712 B each;
    # lse: Nq8 = 104 rows x 4 B = 416 B (13 sectors), though only 100 rows are valid.
    wl = Workload(1, 1, 100, 77, 64, dtype="fp16")
    io = tc.rawkernel_tc_forward_io(wl, 64, 32)
    assert io == {"Q": (12800, 0), "K": (19712, 0), "V": (19712, 0), "O": (0, 12800), "lse": (0, 416)}
    q, k, v = inputs("fp16", 1, 1, 100, 77, 64)
    run = emulate_flash_attention_tc(q, k, v, block_q=64, block_kv=32, warps=4)
    assert run.sectors == {"Q": (400, 0), "K": (616, 0), "V": (616, 0), "O": (0, 400), "lse": (0, 13)}


def test_causal_bytes_by_hand():
    # N = 256 both, 128 x 64 blocks, causal: query block 0 reads keys [0, 128) (2 tiles), block 1
    # keys [0, 256): 384 K rows of 256 B (d = 128, bf16) = 98304 B, and as many of V.
    wl = Workload(1, 1, 256, 256, 128, dtype="bf16", causal=True)
    assert tc.rawkernel_tc_forward_io(wl, 128, 64)["K"] == (384 * 256, 0)


def test_sector_counting_of_a_partial_warp_instruction():
    # 3 rows of 128 B = 24 chunks: one warp instruction, 12 sectors; shifted by 16 bytes off a
    # sector boundary the same chunks touch 13.
    assert tile_copy_sectors(0, 3, 128, 64) == 12
    assert tile_copy_sectors(16, 3, 128, 64) == 13


# ---- the kernel's tables and checks ------------------------------------------------------------

def test_traits_tables_agree_with_the_source():
    assert {d: (t.block_q, t.block_kv, t.warps, t.stages) for d, t in tc.TC_TRAITS.items()} == \
        {d: (t.block_q, t.block_kv, t.warps, t.stages) for d, t in cfgmod.TC_TRAITS.items()}
    src = (cfgmod.__file__.rsplit("/", 1)[0] + "/flash_attention_tc.cu")
    rows = re.findall(r"TcTraits<(\d+)>\s*\{[^}]*?kBlockQ = (\d+);[^}]*?kBlockKV = (\d+);[^}]*?kWarps = (\d+);"
                      r"[^}]*?kStages = (\d+);", open(src).read(), re.S)
    assert {int(d): tuple(map(int, r)) for d, *r in rows} == \
        {d: (t.block_q, t.block_kv, t.warps, t.stages) for d, t in cfgmod.TC_TRAITS.items()}


def test_shared_memory_equals_the_variants_charge():
    wl = Workload(1, 1, 256, 256, 128, dtype="bf16")
    cfg = TcConfig.default("bf16", 128)
    assert cfg.smem_bytes == tc.tc_sram_bytes(wl, cfg.block_q, cfg.block_kv) == (128 + 4 * 64) * 128 * 2 == 98304


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="fp32", block_q=64, block_kv=64, head_dim=64, warps=4), "field 'dtype' = 'fp32' must be one of"),
    (dict(dtype="fp16", block_q=64, block_kv=64, head_dim=96, warps=4), "field 'head_dim' = 96 must be one of 64"),
    (dict(dtype="fp16", block_q=48, block_kv=64, head_dim=64, warps=2), "field 'block_q' = 48 must be a multiple of"),
    (dict(dtype="fp16", block_q=64, block_kv=24, head_dim=64, warps=4), "field 'block_kv' = 24 must be a multiple"),
    (dict(dtype="fp16", block_q=256, block_kv=256, head_dim=128, warps=16), "more than 232448"),
])
def test_config_errors_are_one_line(kwargs, message):
    with pytest.raises(HbmsimError, match=re.escape(message)) as err:
        TcConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_emulation_refuses_values_not_of_the_dtype():
    q = np.full((1, 1, 4, 64), 0.1, np.float32)            # 0.1 is not an fp16 number
    with pytest.raises(HbmsimError, match="input q: values are not all fp16 numbers"):
        emulate_flash_attention_tc(q, q, q)


# ---- the variant as users reach it -----------------------------------------------------------

def test_variant_resolves_to_the_launch_rule_and_notes_what_the_kernel_cannot_run():
    m, notes = FLASH2.resolved(H100, Workload(2, 16, 2048, 2048, 128, dtype="bf16"),
                               FLASH2.mapping_type(variant=tc.RAWKERNEL_TC), False)
    assert (m.block_q, m.block_kv, m.warps) == (128, 64, 8) and notes == ()
    prog = FLASH2.build(Workload(2, 16, 2048, 2048, 128, dtype="bf16"), m, None, False)
    launch = prog.launches[0]
    assert (launch.threads_per_block, launch.tensor_op, launch.sram_bytes) == (256, "mma.sync", 98304)
    assert launch.registers_per_thread == tc.tc_registers_estimate(128, 64, 16) == 255     # 32+64+32+4+128+32, capped
    assert tc.tc_registers_estimate(64, 32, 16) == 16 + 32 + 16 + 4 + 32 + 32
    _, notes = FLASH2.resolved(H100, Workload(1, 1, 64, 64, 32, dtype="fp32"),
                               FLASH2.mapping_type(variant=tc.RAWKERNEL_TC), False)
    assert "does not run dtype fp32 (fp16, bf16), head_dim 32 (64, 128)" in notes[0]
    m, notes = FLASH2.resolved(H100, Workload(1, 1, 64, 64, 64), FLASH2.mapping_type(variant=tc.RAWKERNEL_TC), True)
    assert m.variant == "fa2-kernel" and "no backward kernel" in notes[0]


def test_variant_refuses_fa2_only_features_in_one_line():
    with pytest.raises(HbmsimError, match="num_splits, pack_gqa and kv_append model the FA2 kernel"):
        FLASH2.resolved(H100, Workload(1, 1, 1, 4096, 64), FLASH2.mapping_type(variant=tc.RAWKERNEL_TC, num_splits=4),
                        False)


def test_hbmsim_run_with_the_variant(tmp_path, capsys):
    exp = tmp_path / "tc.toml"
    exp.write_text('name = "tc"\nhardware = "h100-sxm5-80gb"\n[workload]\nbatch = 1\nheads = 2\nseq_len = 300\n'
                   'head_dim = 64\ndtype = "fp16"\ncausal = true\n[[runs]]\nalgorithm = "flash2"\n'
                   'passes = ["forward"]\nvariant = "rawkernel-tc"\n')
    assert main(["run", str(exp), "--count-only"]) == 0
    out = capsys.readouterr().out
    assert "128x128 (rawkernel-tc)" in out


def test_emulate_runs_the_variants_own_kernel_and_compare_finds_no_difference(tmp_path, capsys):
    """`hbmsim emulate` sends a rawkernel-tc run to the tensor-core kernel's emulation (registry:
    variant_kernels), and its bytes equal `hbmsim run`'s prediction, tensor by tensor."""
    import json
    exp = tmp_path / "tc.toml"
    exp.write_text('name = "tc"\nhardware = "h100-sxm5-80gb"\n[workload]\nbatch = 1\nheads = 2\nseq_len = 200\n'
                   'head_dim = 64\ndtype = "fp16"\ncausal = true\n[[runs]]\nalgorithm = "flash2"\n'
                   'passes = ["forward"]\nvariant = "rawkernel-tc"\nblock_q = 64\nblock_kv = 64\n')
    em, pred = tmp_path / "em.json", tmp_path / "pred.json"
    assert main(["emulate", str(exp), "--out", str(em)]) == 0
    assert main(["run", str(exp), "--json", str(pred), "--quiet"]) == 0
    run = json.loads(em.read_text())["runs"][0]
    # N = 200, d = 64, 64x64 blocks, causal, 2 heads: Q and O once (200 x 64 x 2 B x 2 heads = 51,200 B);
    # lse padded to 200 rows (a multiple of 8) x 4 B x 2 heads = 1,600 B
    assert run["tensors"]["Q"] == {"read": 51_200, "write": 0} and run["tensors"]["O"]["write"] == 51_200
    assert run["tensors"]["lse"]["write"] == 1_600
    assert main(["compare", str(pred), str(em)]) == 0
    out = capsys.readouterr().out
    assert "global_read_bytes            0.00%" in out and "tensors                      0.00%" in out


# ---- on a GPU ----------------------------------------------------------------------------------

HAVE_GPU, WHY = gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason=f"needs CuPy and a CUDA GPU: {WHY}")
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape, causal", [((2, 3, 300, 300, 64), True), ((1, 2, 130, 517, 128), False),
                                           ((1, 1, 517, 130, 128), True)])
def test_gpu_kernel_matches_reference_and_emulation(dtype, shape, causal):
    import cupy as cp
    from hbmsim.kernels.gpu_tc import flash_attention_tc
    q, k, v = inputs(dtype, *shape)
    store = np.float16 if dtype == "fp16" else None
    to_gpu = (lambda x: cp.asarray(x.astype(store))) if store else \
        (lambda x: cp.asarray((x.view(np.uint32) >> 16).astype(np.uint16)))          # bf16 bit patterns
    o, lse = flash_attention_tc(to_gpu(q), to_gpu(k), to_gpu(v), dtype=dtype, causal=causal)
    o = cp.asnumpy(o)
    o = o.astype(np.float32) if store else (o.astype(np.uint32) << 16).view(np.float32)
    _, (o_ref, lse_ref) = reference(dtype, q, k, v, causal)
    bound = UNIT_ROUNDOFF[dtype] * (np.abs(o_ref) + np.abs(v).max()) + 1e-5
    assert np.all(np.abs(o - o_ref) <= bound)
    fin = np.isfinite(lse_ref)
    np.testing.assert_allclose(cp.asnumpy(lse)[fin], lse_ref[fin], rtol=0, atol=1e-5)
    assert math.isfinite(float(np.abs(o).max()))


# ---- compile check: the CUDA toolkit, no GPU ----------------------------------------------------

NVCC = find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None or find_ptxas(NVCC) is None,
                                reason="nvcc or ptxas not found (CUDA toolkit not installed)")


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype, head_dim", [("fp16", 64), ("bf16", 128)])
def test_source_compiles_for_the_launch_rule(arch, dtype, head_dim):
    from hbmsim.kernels.gpu_tc import compile_report
    r = compile_report(TcConfig.default(dtype, head_dim), arch)
    # all shared memory is dynamic (TcConfig.smem_bytes); 256 threads may use up to 255 registers
    assert r.static_smem_bytes == 0 and 0 < r.registers <= 255
    assert r.spill_store_bytes <= 64          # CUDA 13.0: 12-20 B at d = 64, none at d = 128


def test_fast_mode_does_not_fold_batch_heads_of_part_sectors():
    """Found by the fuzz test: with Nk = 129, d = 8, fp16 a batch-head of K is 2064 bytes, 64.5
    sectors, so blocks a batch-head apart touch different sector counts and a fold would multiply
    the wrong unit. Such launches do not fold: fast mode's K and V reads equal the closed form
    (16 batch-heads of 129 rows; the closed form 33,536 bytes each, folding gave 33,728)."""
    from hbmsim.algorithms.workload import Workload
    from hbmsim.scenarios.experiment import Config, Experiment, RunSpec, resolve_hardware
    from hbmsim.scenarios.runner import prepare, run_config
    gpu = resolve_hardware("a100-sxm4-40gb").with_sms(1).with_overrides({"max_blocks_per_sm": 1, "l2_bytes": 0},
                                                                         "test")
    wl = Workload(4, 4, 1, 129, 8)
    cfg = prepare(Experiment("x", "x", gpu, [Config(gpu, wl, RunSpec("flash2", ("forward",),
                                                                      {"variant": "rawkernel-tc"}))])).configs[0]
    fast = run_config(cfg, count_only=True, fast=True)[0]
    io = cfg.run.spec.io(wl, cfg.mapping, "forward")
    assert (fast["tensors"]["K"]["read"], fast["tensors"]["V"]["read"]) == (io["K"][0], io["V"][0]) == (33536, 33536)
