"""The kernels on a real GPU through CuPy (marked gpu: skipped without CuPy or a device), and
what the profiler does without one: one line, exit 2. Also the pieces testable anywhere:
configuration errors, the parsing of Nsight Compute's CSV, and what each kernel says of itself
(kernels/traits.py)."""
import json

import numpy as np
import pytest

from hbmsim.algorithms.reference import attention_forward
from hbmsim.algorithms.workload import AttentionData, Workload
from hbmsim.kernels.config import KernelConfig
from hbmsim.kernels.gpu import gpu_available
from hbmsim.kernels import profile
from hbmsim.kernels.profile import RunSpec, ncu_fields, parse_ncu_csv
from hbmsim.kernels.traits import KERNELS
from hbmsim.scenarios.cli import main
from hbmsim.simulator import HbmsimError

HAVE_GPU, WHY = gpu_available()
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason=f"needs CuPy and a CUDA GPU: {WHY}")


@pytest.mark.skipif(HAVE_GPU, reason="this machine has a GPU")
def test_profile_without_gpu_prints_one_line_and_exits_2(tmp_path, capsys):
    out = tmp_path / "measured.json"
    assert main(["profile", "emulate-small", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("hbmsim: error: profile: no GPU to measure on")
    assert not out.exists()


@pytest.mark.parametrize("kwargs,message", [
    (dict(dtype="bf16", block_q=64, block_kv=64, head_dim=64), "field 'dtype' = 'bf16' must be one of fp32, fp16"),
    (dict(dtype="fp16", block_q=0, block_kv=64, head_dim=64), "field 'block_q' = 0 must be a whole number in 1..1024"),
    (dict(dtype="fp16", block_q=2048, block_kv=64, head_dim=64), "field 'block_q' = 2048"),
    (dict(dtype="fp16", block_q=64, block_kv=64, head_dim=96), "field 'head_dim' = 96 must be one of 32, 64, 128"),
    (dict(dtype="fp32", block_q=64, block_kv=64, head_dim=256), "field 'head_dim' = 256 must be one of 32, 64, 128"),
])
def test_kernel_config_errors(kwargs, message):
    with pytest.raises(HbmsimError, match=message.replace("(", r"\(").replace(")", r"\)")):
        KernelConfig(**kwargs)


NCU_CSV = '''==PROF== Connected to process 4242 (/usr/bin/python3)
==PROF== Profiling "flash_attention_forward": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3","127.0.0.1","void flash_attention_forward<fp16, 64, 64, 64>(...)","1","7","(64, 1, 1)","(4, 8, 1)","0","8.0","Command line profiler metrics","dram__bytes_read.sum","byte","1,048,576"
"0","4242","python3","127.0.0.1","void flash_attention_forward<fp16, 64, 64, 64>(...)","1","7","(64, 1, 1)","(4, 8, 1)","0","8.0","Command line profiler metrics","dram__bytes_write.sum","Kbyte","2"
"0","4242","python3","127.0.0.1","void flash_attention_forward<fp16, 64, 64, 64>(...)","1","7","(64, 1, 1)","(4, 8, 1)","0","8.0","Command line profiler metrics","lts__t_sectors_op_read.sum","sector","40000"
"0","4242","python3","127.0.0.1","void flash_attention_forward<fp16, 64, 64, 64>(...)","1","7","(64, 1, 1)","(4, 8, 1)","0","8.0","Command line profiler metrics","lts__t_sectors_op_write.sum","sector","100"
"0","4242","python3","127.0.0.1","void flash_attention_forward<fp16, 64, 64, 64>(...)","1","7","(64, 1, 1)","(4, 8, 1)","0","8.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","12,345"
==PROF== Disconnected from process 4242
'''


def test_parse_ncu_csv():
    kernels = parse_ncu_csv(NCU_CSV)
    assert len(kernels) == 1 and kernels[0]["name"].startswith("void flash_attention_forward")
    f = ncu_fields(kernels)
    assert (f["hbm_read_bytes"], f["hbm_write_bytes"]) == (1_048_576, 2000)
    assert (f["global_read_bytes"], f["global_write_bytes"]) == (40000 * 32, 100 * 32)
    assert f["ncu_time_s"] == pytest.approx(12.345e-6)
    assert "global_write_bytes_from_sm" not in f and "global_write_bytes_from_sm" not in f["kernels"][0]


def test_parse_ncu_csv_keeps_the_sectors_the_sms_sent():
    """lts__t_sectors_srcunit_tex_* (the SMs' own sectors, without what one L2 partition forwards
    to the other) are kept beside the all-sources counts, per kernel and in total."""
    line = NCU_CSV.splitlines()[6]
    extra = "\n".join(line.replace("lts__t_sectors_op_write.sum", f"lts__t_sectors_srcunit_tex_op_{op}.sum")
                      .replace('"100"', f'"{n}"') for op, n in (("read", 39000), ("write", 64)))
    kernels = parse_ncu_csv(NCU_CSV.replace("==PROF== Disconnected", extra + "\n==PROF== Disconnected"))
    f = ncu_fields(kernels)
    assert (f["global_read_bytes_from_sm"], f["global_write_bytes_from_sm"]) == (39000 * 32, 64 * 32)
    assert f["kernels"][0]["global_write_bytes_from_sm"] == 64 * 32
    assert f["global_write_bytes"] == 100 * 32


def test_every_programs_kernel_describes_itself():
    """The real kernels the programs name are exactly the rows of kernels/traits.py."""
    from hbmsim.algorithms import registry
    assert {a.kernel for a in registry.algorithms() if a.kernel} | {"flash_attention_tc"} == set(KERNELS)
    for a in registry.algorithms():
        if a.emulated:                       # the CPU emulation runs the tiled kernel
            assert KERNELS[a.kernel].tiled
    assert [(t.name, t.tiled, t.causal_mask_tensor, t.passes) for t in KERNELS.values()] == [
        ("flash_attention", True, False, ("forward",)), ("flash_attention_tc", True, False, ("forward",)),
        ("standard_attention", False, True, ("forward",))]


def test_forward_launches_what_the_kernel_says(monkeypatch):
    """profile.forward asks the spec's kernel how to launch it; no GPU needed to see the call."""
    from hbmsim.kernels import gpu
    calls = []
    monkeypatch.setattr(gpu, "flash_attention", lambda q, k, v, **kw: calls.append(("flash", kw)) or ("O", "lse"))
    monkeypatch.setattr(gpu, "standard_attention", lambda q, k, v, **kw: calls.append(("standard", kw)) or "O")
    flash = RunSpec("flash_attention", 1, 2, 64, 64, 64, "fp16", causal=True, block_q=64, block_kv=32, scale=0.5)
    standard = RunSpec("standard_attention", 1, 2, 64, 64, 64, "fp16", causal=True)
    assert profile.forward(flash, 1, 2, 3) == ("O", "lse")
    assert profile.forward(standard, 1, 2, 3, mask="M") == ("O", None)
    assert calls == [("flash", dict(block_q=64, block_kv=32, causal=True, scale=0.5)),
                     ("standard", dict(causal=True, scale=None, mask="M"))]
    with pytest.raises(HbmsimError, match=r"profile: no GPU kernel 'tiled_v9' \(flash_attention, flash_attention_tc, standard_attention\)"):
        profile.forward(RunSpec("tiled_v9", 1, 1, 64, 64, 64, "fp16"), 1, 2, 3)


def _inputs(wl, dtype, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(wl.batch, wl.heads, n, wl.head_dim) for n in (wl.seq_len_q, wl.seq_len_kv, wl.seq_len_kv)]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype,bq,bkv,d,nq,nk,causal", [
    ("fp32", 64, 32, 64, 100, 77, True), ("fp16", 64, 64, 64, 257, 300, False), ("fp16", 128, 64, 128, 130, 90, True),
    ("fp16", 16, 16, 32, 9, 5, True)])
def test_flash_attention_on_gpu_matches_reference(dtype, bq, bkv, d, nq, nk, causal):
    import cupy as cp
    from hbmsim.kernels.gpu import flash_attention
    wl = Workload(2, 3, nq, nk, d, dtype=dtype, causal=causal)
    q, k, v = _inputs(wl, np.float16 if dtype == "fp16" else np.float32)
    o, lse = flash_attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), block_q=bq, block_kv=bkv, causal=causal)
    o_ref, lse_ref = attention_forward(wl, AttentionData(q.astype(float), k.astype(float), v.astype(float)))
    np.testing.assert_allclose(cp.asnumpy(o).astype(float), o_ref, atol=2e-3 if dtype == "fp16" else 2e-5, rtol=0)
    lse = cp.asnumpy(lse)
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    fin = np.isfinite(lse_ref)
    np.testing.assert_allclose(lse[fin], lse_ref[fin], atol=1e-4, rtol=1e-5)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_standard_attention_on_gpu_matches_reference(causal):
    import cupy as cp
    from hbmsim.kernels.gpu import standard_attention
    wl = Workload(1, 2, 70, 90, 64, dtype="fp32", causal=causal)
    q, k, v = _inputs(wl, np.float32)
    o = standard_attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=causal)
    o_ref, _ = attention_forward(wl, AttentionData(q.astype(float), k.astype(float), v.astype(float)))
    np.testing.assert_allclose(cp.asnumpy(o), o_ref, atol=1e-4, rtol=0)


@pytest.mark.gpu
@needs_gpu
def test_too_much_shared_memory_fails_before_launch():
    import cupy as cp
    from hbmsim.kernels.gpu import flash_attention
    q = cp.zeros((1, 1, 64, 128), dtype=cp.float32)
    with pytest.raises(HbmsimError, match=r"needs 655360 bytes of shared memory, more than this GPU's limit"):
        flash_attention(q, q, q, block_q=256, block_kv=512)


@pytest.mark.gpu
@needs_gpu
def test_profile_smoke(tmp_path):
    out = tmp_path / "measured.json"
    assert main(["profile", "emulate-small", "--out", str(out), "--repeats", "3", "--warmup", "1", "--no-ncu"]) == 0
    doc = json.loads(out.read_text())
    assert doc["source"] == "measured" and doc["provenance"]["gpu"]
    assert all(r["time_s"] > 0 and r["max_abs_error"] < 2e-3 for r in doc["runs"])
