"""The CUDA kernel run through its CPU emulation: output equals the float64 reference, the bytes
its global loads and stores moved equal the simulator's flash2 counts exactly, out-of-bounds
accesses are caught, and the shared-memory layout is what the simulator charges."""
import numpy as np
import pytest

from hbmsim.algorithms.flash2 import flash2_sram_bytes
from hbmsim.algorithms.io_formulas import flash2_forward_io
from hbmsim.algorithms.reference import attention_forward
from hbmsim.algorithms.workload import AttentionData, Workload
from hbmsim.kernels.config import KernelConfig
from hbmsim.kernels.emulation import EmulationError, Emulator, compiler
from hbmsim.simulator import HbmsimError

try:
    compiler()
except HbmsimError as err:
    pytest.skip(str(err), allow_module_level=True)

# (dtype, block_q, block_kv, head_dim, batch, heads, seq_len_q, seq_len_kv): ragged lengths,
# lengths below one block, more queries than keys (under causal the first rows see no key),
# block sizes that are not powers of two (the kernel steps 8, 4 or 1 keys at a time).
CASES = [
    ("fp32", 16, 16, 32, 1, 2, 37, 45),
    ("fp32", 32, 16, 64, 2, 1, 100, 77),
    ("fp32", 32, 16, 64, 1, 1, 5, 3),
    ("fp32", 16, 32, 128, 1, 2, 50, 70),
    ("fp32", 37, 20, 32, 1, 1, 80, 41),
    ("fp32", 8, 7, 32, 1, 1, 19, 23),
    ("fp16", 16, 16, 32, 2, 1, 37, 45),
    ("fp16", 64, 64, 64, 1, 1, 130, 130),
    ("fp16", 32, 16, 64, 1, 2, 100, 77),
    ("fp16", 16, 24, 128, 1, 1, 33, 60),
]
CONFIGS = {KernelConfig(c[0], c[1], c[2], c[3]) for c in CASES}


@pytest.fixture(scope="module")
def emu():
    return Emulator(CONFIGS)


def make_inputs(dtype, b, h, nq, nk, d, seed=0):
    rng = np.random.default_rng(seed)
    npdt = np.float16 if dtype == "fp16" else np.float32
    return tuple(rng.standard_normal(shape).astype(npdt) for shape in ((b, h, nq, d), (b, h, nk, d), (b, h, nk, d)))


def reference(wl, q, k, v):
    return attention_forward(wl, AttentionData(q.astype(float), k.astype(float), v.astype(float)))


def assert_matches_reference(dtype, o, lse, o_ref, lse_ref):
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    if dtype == "fp32":
        np.testing.assert_allclose(o, o_ref, rtol=0, atol=2e-5)
    else:   # O is stored in fp16: within half an fp16 ulp of the exact value, plus fp32 slack
        half_ulp = 0.5 * np.spacing(np.abs(o_ref).astype(np.float16)).astype(float)
        assert np.all(np.abs(o.astype(float) - o_ref) <= half_ulp + 2e-5)
    masked = np.isneginf(lse_ref)
    assert np.array_equal(np.isneginf(lse), masked)
    np.testing.assert_allclose(lse[~masked], lse_ref[~masked], rtol=1e-6, atol=1e-5)
    assert np.all(o[masked] == 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "{}-{}x{}-d{}-N{}x{}".format(c[0], c[1], c[2], c[3], c[6], c[7]))
def test_output_and_bytes(emu, case, causal):
    dtype, bq, bkv, d, b, h, nq, nk = case
    wl = Workload(b, h, nq, nk, d, dtype=dtype, causal=causal)
    q, k, v = make_inputs(dtype, b, h, nq, nk, d)
    run = emu.flash_attention(q, k, v, block_q=bq, block_kv=bkv, causal=causal)
    o_ref, lse_ref = reference(wl, q, k, v)
    assert_matches_reference(dtype, run.o, run.lse, o_ref, lse_ref)
    # the bytes the kernel's own loads and stores moved are the simulator's prediction, exactly
    assert run.traffic == flash2_forward_io(wl, bq, bkv)


def test_rows_that_see_no_key(emu):
    # 100 queries, 77 keys, causal bottom-right: queries 0..22 see nothing -> O = 0, lse = -inf
    q, k, v = make_inputs("fp32", 2, 1, 100, 77, 64, seed=3)
    run = emu.flash_attention(q, k, v, block_q=32, block_kv=16, causal=True)
    assert np.all(run.o[:, :, :23] == 0) and np.all(np.isneginf(run.lse[:, :, :23]))
    assert np.all(np.isfinite(run.lse[:, :, 23:]))


def test_explicit_scale(emu):
    wl = Workload(1, 2, 37, 45, 32, dtype="fp32", scale=0.37)
    q, k, v = make_inputs("fp32", 1, 2, 37, 45, 32, seed=5)
    run = emu.flash_attention(q, k, v, block_q=16, block_kv=16, scale=0.37)
    o_ref, lse_ref = reference(wl, q, k, v)
    assert_matches_reference("fp32", run.o, run.lse, o_ref, lse_ref)


@pytest.mark.parametrize("tensor,op,shrink",
                         [("K", "read", 1), ("Q", "read", 3), ("O", "write", 5), ("lse", "write", 1)])
def test_out_of_bounds_access_fails(emu, tensor, op, shrink):
    """The proxies check every global access against the buffer's extent: a buffer one element
    short (as if the kernel's bounds checks were off by one) makes the launch fail."""
    q, k, v = make_inputs("fp32", 1, 2, 37, 45, 32)
    sizes = {"Q": q.size, "K": k.size, "O": q.size, "lse": 2 * 37}
    with pytest.raises(EmulationError, match=f"out-of-bounds {op} of {tensor}: element"):
        emu.flash_attention(q, k, v, block_q=16, block_kv=16, buffer_elems={tensor: sizes[tensor] - shrink})


def test_missing_instantiation_is_a_clear_error(emu):
    q, k, v = make_inputs("fp32", 1, 1, 8, 8, 32)
    with pytest.raises(EmulationError, match="no instantiation fp32 64x64 d=32"):
        emu.flash_attention(q, k, v, block_q=64, block_kv=64)


@pytest.mark.parametrize("cfg", sorted(CONFIGS, key=repr), ids=lambda c: c.label())
def test_shared_memory_equals_simulator(emu, cfg):
    """FlashSmem<...>::bytes in the kernel source = what the simulator's flash2 charges."""
    wl = Workload(1, 1, 64, 64, cfg.head_dim, dtype=cfg.dtype)
    assert emu.smem_bytes(cfg) == cfg.smem_bytes == flash2_sram_bytes(wl, cfg.block_q, cfg.block_kv)


def bank_conflict_ways(emu, dtype, d, accesses):
    """Max number of distinct 4-byte words one bank serves for one warp's 32 accesses."""
    itemsize = 2 if dtype == "fp16" else 4
    words_by_bank = {}
    for row, col in accesses:
        word = emu.swizzle_index(dtype, d, row, col) * itemsize // 4
        words_by_bank.setdefault(word % 32, set()).add(word)
    return max(len(w) for w in words_by_bank.values())


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("d", [32, 64, 128])
def test_swizzle_is_a_conflict_free_permutation(emu, dtype, d):
    for row in range(70):   # each row's elements stay in that row, each exactly once
        assert sorted(emu.swizzle_index(dtype, d, row, c) for c in range(d)) == list(range(row * d, (row + 1) * d))
    for warp in range(2):
        rows = range(32 * warp, 32 * warp + 32)
        for col in range(0, d, 7):     # one thread per row reads column col (Q and O tiles)
            assert bank_conflict_ways(emu, dtype, d, [(r, col) for r in rows]) == 1
    for start in range(0, 4 * d, 32):  # a warp stores 32 consecutive elements (tile loads)
        elems = range(start, start + 32)
        assert bank_conflict_ways(emu, dtype, d, [(e // d, e % d) for e in elems]) == 1


def test_fp16_rounding_matches_numpy(emu):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000),
                        [0.0, -0.0, 65504.0, 65520.0, 1e6, -1e6, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26,
                         1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, np.inf, -np.inf]]).astype(np.float32)
    got = emu.float_to_half(x)
    with np.errstate(over="ignore"):      # numpy warns on the values that overflow to inf
        want = x.astype(np.float16)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_kernels_package_never_imports_algorithms_or_scenarios():
    import subprocess
    import sys
    # every module of the package (a new one is covered by being there), and nothing above it
    code = ("import sys, importlib, pkgutil, hbmsim.kernels as k; "
            "[importlib.import_module('hbmsim.kernels.' + m.name) for m in pkgutil.iter_modules(k.__path__)]; "
            "assert 'hbmsim.kernels.library_nsight' in sys.modules; "
            "sys.exit(any(m.startswith(('hbmsim.algorithms', 'hbmsim.scenarios')) for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
