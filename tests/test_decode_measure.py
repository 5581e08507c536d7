"""The decode timings (issue 25, item 7: kernels/library_decode.py, `python -m hbmsim.kernels.library
--decode`, `hbmsim profile-library --decode`) without a GPU: the grid, the skips, the run records,
the arguments, and `hbmsim validate` reading a file in their schema. The GPU part (TorchDecode) runs
where one is lent; these tests put a fake in its place."""
import json
import sys
import types

import pytest

from hbmsim.kernels import library
from hbmsim.kernels import library_decode as D
from hbmsim.kernels.implementations import IMPLEMENTATIONS, TIMED_DECODE, TIMED_HERE
from hbmsim.scenarios import compare as C
from hbmsim.scenarios.cli import main as cli
from hbmsim.scenarios.kernel_rows import compare_kernels
from hbmsim.scenarios.validate import configs_of

GiB = 1 << 30


def test_the_table_holds_the_decode_implementations_apart_from_the_papers():
    assert list(TIMED_DECODE) == ["sdpa-gqa-decode", "fa2-kvcache"]
    assert list(TIMED_HERE) == ["fa2", "pytorch", "cudnn", "fa3"]
    for impl in TIMED_DECODE.values():
        assert (impl.algorithm, impl.variant, impl.in_fa2_paper) == ("flash2", "fa2-kernel", None)
    assert library.DEFAULT_IMPLEMENTATIONS == ("fa2", "pytorch")     # the paper grid's default is unchanged
    assert set(D.IMPLEMENTATIONS) <= set(IMPLEMENTATIONS)


def test_the_grid_and_its_workloads():
    plan = D.decode_plan(list(D.IMPLEMENTATIONS), D.BATCHES, D.KV_LENS)
    assert D.BATCHES == (1, 8, 64) and D.KV_LENS[0] == 1024 and D.KV_LENS[-1] == 128 * 1024 and len(D.KV_LENS) == 8
    # SDPA contiguous only; flash-attn contiguous and paged
    assert len(plan) == 3 * 8 + 2 * 3 * 8
    assert {p for i, _, _, p in plan if i == "sdpa-gqa-decode"} == {None}
    assert {p for i, _, _, p in plan if i == "fa2-kvcache"} == {None, 256}
    w = D.decode_workload(8, 4096)
    assert w == {"batch": 8, "heads": 32, "kv_heads": 8, "seq_len_q": 1, "seq_len_kv": 4096, "head_dim": 128,
                 "dtype": "fp16", "causal": False, "key_padding_mask": False, "dropout": 0.0}
    assert D.decode_workload(8, 4096, 256)["kv_page_size"] == 256
    # K and V: 2 x B x N x 8 heads x 128 x 2 bytes; B 64, N 128k: 34.4 GB, fits an 80 GB H100
    assert D.kv_bytes(64, 131072) == 2 * 64 * 131072 * 8 * 128 * 2
    assert D.kv_bytes(1, 1000, 256) == D.kv_bytes(1, 1024)           # whole pages
    assert D.kv_bytes(64, 131072) < D.needed_bytes(64, 131072) < 1.02 * D.kv_bytes(64, 131072)


def test_kernel_rows_say_whether_the_split_and_its_combine_ran():
    rows = [{"name": "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>()", "time_s": 1e-5},
            {"name": "void flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>()",
             "time_s": 2e-6}]
    assert D.split_kernels(rows) == {"splitkv_kernel": True, "combine_kernel": True, "one_pass_kernel": False}
    assert D.split_kernels(rows[:1])["combine_kernel"] is False
    # validate's kernel level: the split kernel under "forward", the combine in its own group
    pred = [{"name": "flash2_fwd_splitkv", "time_s": 8e-6}, {"name": "flash2_fwd_splitkv_combine", "time_s": 1e-6}]
    assert compare_kernels("flash2", "fa2-kernel", pred, rows) == [("forward", 8e-6, 1e-5),
                                                                  ("split-KV combine", 1e-6, 2e-6)]
    # the flush's rows taken out of a profile of flush + call
    flush = [{"name": "fill", "launches": 1.0, "time_s": 3e-6}]
    both = [{"name": "fill", "launches": 1.0, "time_s": 3.1e-6}, {"name": "k", "launches": 1.0, "time_s": 1e-5}]
    assert D.minus_rows(both, flush) == [both[1]]


class FakeGPU:
    """TorchDecode's part in measure_decode: 35 GiB free; one configuration fails, one runs out of
    memory; flash-attn imports or not."""

    def __init__(self, flash_attn=True, free=35 * GiB):
        self.flash_attn, self.free, self.calls = flash_attn, free, []

    def provenance(self, command, warmup, repeats):
        return {"source": "measured", "gpu": "NVIDIA H100 80GB HBM3", "sm_count": 132, "command": " ".join(command)}

    def hardware(self, prov):
        from hbmsim.kernels.library_timing import hardware_preset
        return hardware_preset(prov["gpu"], prov["sm_count"])

    def available(self, impl):
        return (True, "") if impl != "fa2-kvcache" or self.flash_attn else (False, "flash-attn does not import")

    def free_bytes(self):
        return self.free

    def is_oom(self, err):
        return isinstance(err, MemoryError)

    def release(self):
        pass

    def stop(self):
        pass

    def measure(self, impl, b, n, page, warmup, repeats):
        self.calls.append((impl, b, n, page))
        if (b, n) == (8, 1024) and impl == "sdpa-gqa-decode":
            raise RuntimeError("No available kernel. Aborting execution.")
        if (b, n) == (8, 2048) and page == 256:
            raise MemoryError("CUDA out of memory")
        t = D.kv_bytes(b, n, page) / 3e12 + 5e-6
        split = b == 1
        kernels = [{"name": "flash_fwd_splitkv_kernel" if split else "flash_fwd_kernel", "launches": 1.0,
                    "time_s": t * 0.9}]
        if split:
            kernels.append({"name": "flash_fwd_splitkv_combine_kernel", "launches": 1.0, "time_s": t * 0.05})
        return {"time_s": t, "time_s_median": t, "time_s_min": t, "times_s": [t] * repeats, "kernels": kernels,
                "sm_clock_mhz": None, "l2_flushed": True}


def test_measure_decode_records_runs_and_skips(tmp_path):
    out, kv = tmp_path / "sdpa.json", tmp_path / "kv.json"
    gpu = FakeGPU()
    docs = D.measure_decode(str(out), str(kv), list(D.IMPLEMENTATIONS), [1, 8, 64], [1024, 2048, 131072], 1, 2,
                            ["python", "-m", "hbmsim.kernels.library", "--decode"], gpu=gpu)
    assert set(docs) == {str(out), str(kv)}
    sdpa, fa = json.loads(out.read_text()), json.loads(kv.read_text())
    # B = 64, N = 128k needs ~34 GiB: over 90% of 35 GiB free, skipped before any allocation
    assert (("sdpa-gqa-decode", 64, 131072, None)) not in gpu.calls
    big = [s for s in sdpa["skipped"] if s["workload"]["batch"] == 64 and s["workload"]["seq_len_kv"] == 131072]
    assert len(big) == 1 and big[0]["reason"].startswith("does not fit: needs about 32.")
    failed = [s for s in sdpa["skipped"] if s["reason"].startswith("RuntimeError")]
    assert [(s["workload"]["batch"], s["workload"]["seq_len_kv"]) for s in failed] == [(8, 1024)]
    oom = [s for s in fa["skipped"] if s["reason"].startswith("out of memory")]
    assert [s["workload"]["kv_page_size"] for s in oom] == [256]
    assert len(sdpa["runs"]) == 9 - 2 and len(fa["runs"]) == 2 * 9 - 2 - 1
    for r in sdpa["runs"] + fa["runs"]:
        assert (r["algorithm"], r["variant"], r["pass"], r["hardware"]) == ("flash2", "fa2-kernel", "forward",
                                                                           "h100-sxm5-80gb")
        assert (r["num_splits"], r["pack_gqa"], r["kv_append"], r["source"]) == ("auto", "auto", False, "measured")
        assert r["workload"]["seq_len_q"] == 1 and r["workload"]["kv_heads"] == 8
        assert r["splitkv_kernel"] == (r["workload"]["batch"] == 1) == r["combine_kernel"]
        wl = r["workload"]
        assert r["kv_gb_per_s"] == pytest.approx(D.kv_bytes(wl["batch"], wl["seq_len_kv"],
                                                            wl.get("kv_page_size")) / r["time_s"] / 1e9)
    assert {r["implementation"] for r in sdpa["runs"]} == {"sdpa-gqa-decode"}
    assert {r["workload"].get("kv_page_size") for r in fa["runs"]} == {None, 256}
    # both files load in the compare schema (contiguous and paged runs are different configurations)
    # and give validate a configuration per run
    for path in (out, kv):
        f = C.load(path)
        cfgs = configs_of(str(path), f.runs)
        assert len(cfgs) == len(f.runs)
        cfg, run = cfgs[0]
        assert cfg.run.algorithm == "flash2" and cfg.workload.kv_heads == 8 and cfg.workload.seq_len_q == 1
        assert cfg.run.params == {"variant": "fa2-kernel", "num_splits": "auto", "pack_gqa": "auto",
                                  "kv_append": False}
    assert C.load(kv).runs[-1]["workload"]["kv_page_size"] == 256
    assert configs_of(str(kv), C.load(kv).runs)[-1][0].workload.kv_page_size == 256


def test_without_flash_attn_only_the_sdpa_file_is_written(tmp_path):
    out, kv = tmp_path / "sdpa.json", tmp_path / "kv.json"
    gpu = FakeGPU(flash_attn=False, free=80 * GiB)
    D.measure_decode(str(out), str(kv), list(D.IMPLEMENTATIONS), [1], [1024], 1, 1, ["x"], gpu=gpu)
    doc = json.loads(out.read_text())
    assert not kv.exists() and {c[0] for c in gpu.calls} == {"sdpa-gqa-decode"}
    assert {"implementation": "fa2-kvcache", "workload": None, "reason": "flash-attn does not import"} in doc["skipped"]
    assert len(doc["runs"]) == 1


def test_the_kvcache_file_sits_beside_the_out_file_by_default():
    assert D.default_kvcache_path("/o/h100-decode-sdpa.json") == "/o/h100-decode-sdpa-fa2-kvcache.json"


@pytest.mark.parametrize("argv, message", [
    (["--decode"], "--decode needs --out FILE"),
    (["--decode", "--out", "a.json", "--impl", "fa2"], "--impl 'fa2' must be one of sdpa-gqa-decode, fa2-kvcache"),
    (["--decode", "--out", "a.json", "--kv-lens", "0"], "0 must be at least 1"),
    (["--decode", "--out", "a.json", "--batches", "x"], "'x' is not a whole number"),
    (["--decode", "--out", "a.json", "--out-kvcache", "a.json"], "--out-kvcache must name another file"),
])
def test_bad_decode_arguments_exit_2(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(D, "measure_decode", lambda *a, **k: pytest.fail("measured despite bad arguments"))
    with pytest.raises(SystemExit) as e:
        library.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_the_decode_command_passes_its_arguments(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(D, "measure_decode", lambda *a, **k: seen.update(args=a, kw=k))
    out = str(tmp_path / "d.json")
    assert library.main(["--decode", "--out", out, "--batches", "1", "8", "--kv-lens", "1024", "--repeats", "5",
                         "--no-flush-l2"]) == 0
    a = seen["args"]
    assert a[:7] == (out, str(tmp_path / "d-fa2-kvcache.json"), ["sdpa-gqa-decode", "fa2-kvcache"], [1, 8], [1024],
                     3, 5)
    assert a[7][:4] == ["python", "-m", "hbmsim.kernels.library", "--decode"] and seen["kw"] == {"flush_l2": False}
    # and the paper's grid keeps its own defaults
    monkeypatch.setattr(library, "measure_grid", lambda out, impls, *rest: seen.update(grid=impls))
    assert library.main(["--out", out]) == 0 and seen["grid"] == ["fa2", "pytorch"]


def test_profile_library_decode_needs_torch_and_passes_through(monkeypatch, tmp_path, capsys):
    out = str(tmp_path / "d.json")
    monkeypatch.setitem(sys.modules, "torch", None)          # PyTorch absent: one line, exit 2
    assert cli(["profile-library", "--decode", "--out", out]) == 2
    assert "PyTorch is not installed" in capsys.readouterr().err
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake)
    seen = []
    monkeypatch.setattr(library, "main", lambda argv: seen.append(argv) or 0)
    assert cli(["profile-library", "--decode", "--out", out, "--repeats", "7"]) == 0
    assert seen == [["--decode", "--out", out, "--warmup", "3", "--repeats", "7"]]


def _run(impl, page, t):
    wl = D.decode_workload(1, 1024, page)
    return D.run_record(impl, wl, "h100-sxm5-80gb", "NVIDIA H100 80GB HBM3",
                        {"time_s": t, "time_s_median": t, "time_s_min": t, "times_s": [t],
                         "kernels": [{"name": "flash_fwd_splitkv_kernel", "launches": 1.0, "time_s": t * 0.8},
                                     {"name": "flash_fwd_splitkv_combine_kernel", "launches": 1.0, "time_s": 1e-6}],
                         "sm_clock_mhz": None, "l2_flushed": True})


def test_validate_reads_a_decode_file(tmp_path, capsys):
    """A hand-made file with two runs in the schema the command writes: SDPA contiguous and
    flash-attn paged, B 1, N 1k; `hbmsim validate FILE` simulates both (count-only, fast mode)."""
    path = tmp_path / "decode.json"
    doc = {"source": "measured", "provenance": {"gpu": "NVIDIA H100 80GB HBM3"},
           "runs": [_run("sdpa-gqa-decode", None, 2e-5), _run("fa2-kvcache", 256, 2.2e-5)], "skipped": []}
    path.write_text(json.dumps(doc))
    js = tmp_path / "v.json"
    assert cli(["validate", str(path), "--quiet", "--workers", "1", "--json", str(js)]) == 0
    points = json.loads(js.read_text())["points"]
    assert len(points) == 2
    assert [p["implementation"] for p in points] == ["sdpa-gqa-decode", "fa2-kvcache"]
    assert all(p["predicted_time_s"] > 0 and p["seq_len"] == 1024 for p in points)       # decode: the KV length
    assert [p["label"].split(" d=")[1] for p in points] == ["128 B=1 H=32/8 N=1x1024",
                                                           "128 B=1 H=32/8 N=1x1024 paged 256"]
    # kernel level: the split kernel and its combine each in their group
    assert {g["group"] for g in points[0]["kernel_groups"]} >= {"forward", "split-KV combine"}
    text = capsys.readouterr().out
    assert "sdpa-gqa-decode" in text and "fa2-kvcache" in text


def test_run_key_tells_grouped_query_and_paged_configurations_apart():
    base = {"algorithm": "flash2", "workload": D.decode_workload(1, 1024)}
    paged = {"algorithm": "flash2", "workload": D.decode_workload(1, 1024, 256)}
    assert C.run_key(base) != C.run_key(paged)
    assert C.run_key(paged) != C.run_key({**paged, "workload": {**paged["workload"], "kv_page_size": "contiguous"}})
    assert C.run_key(base) == C.run_key({**base, "workload": {**base["workload"], "kv_page_size": "contiguous"}})
    mha = {k: v for k, v in base["workload"].items() if k != "kv_heads"}
    assert C.run_key({**base, "workload": mha}) != C.run_key(base)                    # 32 K/V heads, not 8
    assert C.run_key({**base, "workload": mha}) == C.run_key({**base, "workload": {**mha, "kv_heads": 32}})
