"""The measurements taken on a lent H100 (scenarios/measured/h100-*.json) and the tools that took
them (kernels/library*.py, kernels/microbench.py): the files are consistent with themselves and
with the constants the presets and programs take from them, and the tools' pure parts work
without a GPU. The GPU parts run under `pytest -m gpu`.
"""
import json
import math

import pytest

from hbmsim.algorithms.flash2_spec import FA2_KERNEL_REGISTERS_PER_THREAD
from hbmsim.kernels import library
from hbmsim.kernels.implementations import IMPLEMENTATIONS, TIMED_HERE
from hbmsim.kernels.library_nsight import summarise_ncu_raw
from hbmsim.kernels.library_timing import hardware_preset, one_wave_grid, paper_flops
from hbmsim.kernels.microbench import MMA_FLOPS_PER_WARP_INSTR
from hbmsim.scenarios.published import MEASURED_DIR
from hbmsim.scenarios.validate import configs_of

TORCH = MEASURED_DIR / "h100-torch-fwd-bwd.json"
NCU = MEASURED_DIR / "h100-ncu-kernels.json"
MICRO = MEASURED_DIR / "h100-microbench.json"


def _load(path):
    return json.loads(path.read_text())


def test_the_torch_measurements_cover_the_fa2_paper_grid_pass_by_pass():
    doc = _load(TORCH)
    assert doc["source"] == "measured" and doc["provenance"]["gpu"] == "NVIDIA H100 80GB HBM3"
    runs = doc["runs"]
    # 2 implementations x 2 head dims x 2 masks x 6 sequence lengths x 3 passes, nothing skipped
    assert len(runs) == 2 * 2 * 2 * 6 * 3 and doc["skipped"] == []
    by = {(r["implementation"], r["workload"]["head_dim"], r["workload"]["seq_len"], r["workload"]["causal"],
           r["pass"]): r for r in runs}
    for (impl, d, n, causal, p), r in by.items():
        wl = r["workload"]
        assert r["source"] == "measured" and r["hardware"] == "h100-sxm5-80gb"
        # the paper's set-up: 16k tokens, hidden 2048
        assert wl["batch"] * n == 16384 and wl["heads"] * d == 2048
        if p == "forward+backward":       # the sum of the two passes, as benchmark_fwd_bwd reports it
            f, b = by[(impl, d, n, causal, "forward")], by[(impl, d, n, causal, "backward")]
            assert r["time_s"] == f["time_s"] + b["time_s"]
        else:                             # mean of the 30 timed runs, and the kernels that ran
            assert r["time_s"] == pytest.approx(sum(r["times_s"]) / len(r["times_s"]), rel=1e-12)
            assert len(r["times_s"]) == 30 and r["kernels"]
        flops = paper_flops(wl["batch"], wl["heads"], n, d, causal, p)
        assert r["tflops_per_s"] == pytest.approx(flops / r["time_s"] / 1e12, rel=1e-12)


def test_the_torch_measurements_name_the_one_implementation_table():
    """The program, variant and provenance line of each timed implementation come from
    kernels/implementations.py, the table the published files use too."""
    for path in sorted(MEASURED_DIR.rglob("*-torch-*.json")):
        doc = _load(path)
        torch_version = doc["provenance"]["torch"]
        # a line for each implementation timed (files written before cudnn and fa3 list every one then timed)
        lines = doc["provenance"]["implementations"]
        assert {r["implementation"] for r in doc["runs"]} <= set(lines) <= set(TIMED_HERE)
        cudnn = doc["provenance"].get("cudnn")          # (the cudnn line names cuDNN's version)
        assert lines == {name: TIMED_HERE[name].describe(TIMED_HERE[name].timed_here.format(torch=torch_version,
                                                                                          cudnn=cudnn))
                         for name in lines}
        for r in doc["runs"]:
            impl = IMPLEMENTATIONS[r["implementation"]]
            assert (r["algorithm"], r["variant"]) == (impl.algorithm, impl.variant)
    assert list(library.IMPLEMENTATIONS) == ["fa2", "pytorch", "cudnn", "fa3"] and library.HEAD_DIMS == (64, 128)
    assert library.DEFAULT_IMPLEMENTATIONS == ("fa2", "pytorch")


def test_validate_reads_the_torch_measurements():
    doc = _load(TORCH)
    cfgs = configs_of(str(TORCH), doc["runs"], only="fa2", max_seq_len=1024)
    assert len(cfgs) == 2 * 2 * 2 * 3           # head dims x masks x N in (512, 1024) x passes
    cfg, run = cfgs[0]
    assert cfg.gpu.name == "h100-sxm5-80gb" and cfg.run.algorithm == "flash2"


def test_fa2_register_count_is_the_measured_one():
    fa2 = [k for r in _load(NCU)["runs"] for k in r["kernels"]
           if "flash_fwd_kernel" in k["name"] or "flash_bwd_dq_dk_dv" in k["name"]]
    # forward at head dims 64 and 128 (and causal at 128, and N = 16384 at 64), backward at 64 and 128
    assert len(fa2) == 6
    assert {k["launch__registers_per_thread"] for k in fa2} == {FA2_KERNEL_REGISTERS_PER_THREAD}
    # and the occupancy ncu reports is the one the registers effect computes: 2 forward blocks, 1 backward
    assert sorted(k["launch__occupancy_limit_registers"] for k in fa2) == [1, 1, 2, 2, 2, 2]


def test_h100_preset_rates_are_the_microbenchmarks():
    from hbmsim.scenarios.experiment import resolve_hardware
    gpu = resolve_hardware("h100-sxm5-80gb")
    res = _load(MICRO)["results"]
    mma = [v["flops_per_s"] for k, v in res.items() if k.startswith("mma_sync")]
    assert gpu.mma_sync_fraction == pytest.approx(max(mma) / gpu.matmul_flops_per_s, abs=5e-4)
    gemm = max(g["flops_per_s"] for g in _load(TORCH)["provenance"]["gemm"])
    assert gpu.tensor_achievable_fraction == pytest.approx(gemm / gpu.matmul_flops_per_s, abs=5e-4)
    # and the microbenchmark's own arithmetic: FLOPs = warps x iterations x chains x 4096
    r = res["mma_sync_m16n8k16_f16_f32_8warps"]
    assert r["flops"] == r["blocks"] * 8 * r["iters"] * 8 * MMA_FLOPS_PER_WARP_INSTR
    assert r["flops_per_s"] == pytest.approx(r["flops"] / r["time_s"], rel=1e-12)


def test_l2_hit_latency_is_the_shipped_pointer_chase(h100, h200):
    """The presets' l2_hit_latency_s and hbm_latency_s are the pointer chase's seconds a load over an
    L2-resident buffer and over 256 MiB, every line new (h100-latency.json, h200-latency.json); the
    DRAM walks take 2.3-2.5x as long as the L2's."""
    for gpu, name in ((h100, "h100"), (h200, "h200")):
        res = json.loads((MEASURED_DIR / f"{name}-latency.json").read_text())["results"]
        l2 = res["load_latency_l2_hit"]
        assert gpu.l2_hit_latency_s == pytest.approx(l2["seconds_per_load"], rel=1e-3)
        assert gpu.hbm_latency_s == pytest.approx(res["load_latency_dram_256mib"]["seconds_per_load"], rel=1e-3)
        assert 280 < l2["cycles_per_load"] < 300
        for dram in ("load_latency_dram_256mib", "load_latency_dram"):
            assert 2.3 < res[dram]["seconds_per_load"] / l2["seconds_per_load"] < 2.5


def test_the_combine_kernel_waits_a_latency_a_split_under_nsight(h100, h200):
    """Nsight Compute on one decode call (h100/h200-ncu-decode.json): FA2's split-KV combine kernel
    reads the split kernel's partial outputs from the L2 (77-82% of its read sectors hit, no DRAM
    reads to speak of) and takes 200-210 ns more a split from 8 splits (N = 1024) to 32 (N = 16384),
    one grid of 8 blocks: 1.3-1.5x an L2 hit's measured latency, what l2_hit_latency charges a split
    (the rest: the loop's own dependent instructions, not modelled)."""
    for gpu, name in ((h100, "h100"), (h200, "h200")):
        runs = {r["file"]: next(k for k in r["kernels"] if "combine" in k["name"])
                for r in json.loads((MEASURED_DIR / f"{name}-ncu-decode.json").read_text())["runs"]}
        few, many = runs["ncu-decode-b1-1024.csv"], runs["ncu-decode-b1-16384.csv"]
        assert few["launch__grid_size"] == many["launch__grid_size"] == 8
        assert all(k["lts__t_sector_op_read_hit_rate.pct"] > 75 and k["dram__bytes_read.sum"] <= 256
                   for k in runs.values())
        per_split_s = (many["gpu__time_duration.sum"] - few["gpu__time_duration.sum"]) * 1e-9 / (32 - 8)
        assert 1.3 < per_split_s / gpu.l2_hit_latency_s < 1.5


def test_pointer_chase_cycle_visits_every_line_once():
    """chase_cycle: the first word of each 128-byte line points at the next line's first word, one
    cycle through all of them (a walk of n_lines steps comes back to its start, every line once)."""
    from hbmsim.kernels.microbench import chase_cycle
    n = 1000
    buf = chase_cycle(n, seed=3)
    assert buf.shape == (n * 32,) and not buf.reshape(n, 32)[:, 1:].any()
    idx, seen = 0, []
    for _ in range(n):
        idx = int(buf[idx])
        assert idx % 32 == 0
        seen.append(idx // 32)
    assert idx == 0 and sorted(seen) == list(range(n))


def test_paper_flops_and_presets():
    # forward 4 N^2 d H B: N = 4096, d = 128, 16 heads, batch 4; causal halves; backward 2.5x
    assert paper_flops(4, 16, 4096, 128, False, "forward") == 4 * 4096 ** 2 * 128 * 16 * 4
    assert paper_flops(4, 16, 4096, 128, True, "backward") == 2.5 * 2 * 4096 ** 2 * 128 * 16 * 4
    assert hardware_preset("NVIDIA H100 80GB HBM3", 132) == "h100-sxm5-80gb"
    assert hardware_preset("NVIDIA H100 PCIe", 114) is None


def test_one_wave_grid_holds_k_tiles_per_sm():
    # 132 SMs x 128 rows = 16896 rows: N = 4224 is 33 tiles a head, so 4 heads make one tile per SM, 8 two;
    # N = 1000 is no whole number of tiles, N = 2048 (16 tiles) does not divide 132 x 128
    grid, skipped = one_wave_grid([4224, 16896, 1000, 2048], [1, 2], 132)
    assert grid == [(1, 4, 4224), (1, 1, 16896), (1, 8, 4224), (1, 2, 16896)]
    assert len(skipped) == 4 and skipped[0].startswith("N = 1000")
    for b, h, n in grid:
        assert b * h * n // 128 in (132, 264)


NCU_RAW = '''"ID","Process ID","Kernel Name","device__attribute_multiprocessor_count","gpu__time_duration.sum","sm__cycles_elapsed.avg.per_second","l1tex__data_pipe_lsu_wavefronts_mem_shared.sum","launch__registers_per_thread"
"","","","","nsecond","hz","",""
"0","1","k<1>","2","1,000","1,000,000,000","1,500","255"
'''


def test_ncu_summary_of_a_raw_page():
    (k,) = summarise_ncu_raw(NCU_RAW)
    assert k["name"] == "k<1>" and k["launch__registers_per_thread"] == 255
    # 1,500 wavefronts over 2 SMs in 1,000 ns at 1 GHz (1,000 cycles): 75% busy
    assert k["shared_pipe_busy_pct"] == pytest.approx(75.0, rel=1e-12)
    assert summarise_ncu_raw("no table here") == []


def test_ncu_summary_keeps_stall_reasons_and_global_sectors():
    """Warp stall reasons, the global loads' requests and sectors, and the instruction mix (a pipe's
    instructions, FFMA and integer thread instructions) are kept by name prefix (their exact names
    vary between ncu versions); other columns are not."""
    page = ('"ID","Kernel Name","smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",'
            '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
            '"l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum","l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",'
            '"sm__inst_executed_pipe_fmaheavy.sum","smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",'
            '"smsp__sass_thread_inst_executed_op_integer_pred_on.sum","launch__uses_cdp"\n'
            '"","","ratio","ratio","request","sector","inst","inst","inst",""\n'
            '"0","copy<2>","0.25","3.5","1,048,576","33,554,432","7","640","320","0"\n')
    (k,) = summarise_ncu_raw(page)
    assert k["smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio"] == 0.25
    assert k["smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"] == 3.5
    # an uncoalesced load: 32 sectors a request (a 2-byte element from each of 32 sectors)
    assert k["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] / k["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"] == 32
    assert k["units"]["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] == "sector"
    assert k["sm__inst_executed_pipe_fmaheavy.sum"] == 7
    assert k["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] == 2 * k[
        "smsp__sass_thread_inst_executed_op_integer_pred_on.sum"] == 640
    assert "launch__uses_cdp" not in k


def test_the_library_command_summarises_ncu_pages(tmp_path):
    page = tmp_path / "fwd.csv"
    page.write_text(NCU_RAW)
    out = tmp_path / "ncu.json"
    assert library.main(["--summarise-ncu", str(page), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["source"] == "measured" and doc["runs"] == [{"file": "fwd.csv", "kernels": summarise_ncu_raw(NCU_RAW)}]
    # where the numbers come from: the page's GPU when it names one (this page does not), how ncu took them
    assert doc["provenance"]["gpu"] == [] and doc["provenance"]["raw_pages"] == ["fwd.csv"]
    assert "--set full" in doc["provenance"]["collected"] and "base" in doc["provenance"]["collected"]
    named = tmp_path / "named.csv"            # a page that names its GPU (device__attribute_display_name)
    named.write_text('"ID","Kernel Name","device__attribute_display_name"\n"","",""\n"0","k","NVIDIA H200"\n')
    assert library.main(["--summarise-ncu", str(page), str(named), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["provenance"]["gpu"] == ["NVIDIA H200"] and doc["provenance"]["raw_pages"] == ["fwd.csv", "named.csv"]
    with pytest.raises(SystemExit) as exit_:           # a page that is not there: one line, exit 2
        library.main(["--summarise-ncu", str(tmp_path / "missing.csv"), "--out", str(out)])
    assert exit_.value.code == 2


@pytest.mark.gpu
def test_microbench_on_gpu(tmp_path):
    from hbmsim.kernels.gpu import gpu_available
    from hbmsim.kernels.microbench import main
    ok, why = gpu_available()
    if not ok:
        pytest.skip(why)
    out = tmp_path / "mb.json"
    assert main(["--out", str(out), "--repeats", "3"]) == 0
    res = json.loads(out.read_text())["results"]
    # the rates' entries each time their kernel; block dispatch is a spread of start stamps and the
    # kernel floor a profiler row (no kernel time of their own)
    rates = {k: v for k, v in res.items() if not k.startswith("host_") and k not in ("block_dispatch", "kernel_floor")}
    assert {"dram_copy", "l2_read_lines_vs_sectors", "mma_sync_m16n8k16_f16_f32_8warps"} <= set(rates)
    assert all(v["time_s"] > 0 and math.isfinite(v["time_s"]) for v in rates.values())
    # a dependent load: an L2 hit in 100-1000 ns, a DRAM access longer
    l2, dram = res["load_latency_l2_hit"]["seconds_per_load"], res["load_latency_dram"]["seconds_per_load"]
    assert 1e-7 < l2 < dram < 1e-6
    assert 0 <= res["block_dispatch"]["per_block_s"] < 1e-6
    floor = res["kernel_floor"]
    assert "skipped" in floor or 0 < floor["kernel_s"] < 1e-4


@pytest.mark.gpu
def test_host_microbench_on_gpu(tmp_path):
    """`--host` on a real GPU: every CuPy entry measured, and the file gives a HostSpec (the PyTorch
    fields from the defaults where PyTorch is missing)."""
    from hbmsim.kernels.gpu import gpu_available
    from hbmsim.kernels.microbench import main
    from hbmsim.simulator.host import DEFAULT_HOST, host_from_measured
    ok, why = gpu_available()
    if not ok:
        pytest.skip(why)
    out = tmp_path / "host.json"
    assert main(["--out", str(out), "--repeats", "3", "--host"]) == 0
    doc = json.loads(out.read_text())
    assert {"launch_s", "launch_gap_s", "queue_launches"} <= set(doc["host_spec"])
    assert doc["results"]["host_launch_gap"]["queued_behind_spin"]
    h = host_from_measured(out, defaults=DEFAULT_HOST)
    assert 0 < h.launch_s < 1e-3 and h.queue_launches >= 1


@pytest.mark.gpu
def test_library_grid_on_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    out = tmp_path / "t.json"
    assert library.main(["--out", str(out), "--head-dim", "64", "--causal", "true", "--max-seq-len", "512",
                         "--repeats", "3"]) == 0
    doc = json.loads(out.read_text())
    assert {r["pass"] for r in doc["runs"]} == {"forward", "backward", "forward+backward"}
    assert all(r["time_s"] > 0 for r in doc["runs"])
    # one wave: N = 8448 (66 tiles a head) at 1 tile per SM of this GPU's SMs
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert library.main(["--out", str(out), "--head-dim", "64", "--causal", "false", "--seq-lens", "8448",
                         "--tiles-per-sm", "1", "--repeats", "2"]) == 0
    doc = json.loads(out.read_text())
    if (sms * 128) % 8448:
        assert doc["runs"] == [] and doc["skipped"]
    else:
        assert {r["workload"]["heads"] for r in doc["runs"]} == {sms * 128 // 8448}


def test_gpu_commands_refuse_bad_input_in_one_line(tmp_path, capsys):
    from hbmsim.scenarios.cli import main
    assert main(["profile-library", "--impl", "xformers", "--out", str(tmp_path / "a.json")]) == 2
    assert "--impl 'xformers' must be one of fa2, pytorch" in capsys.readouterr().err
    assert main(["profile-library", "--head-dim", "96", "--out", str(tmp_path / "a.json")]) == 2
    assert "--head-dim 96 must be one of the paper's 64, 128" in capsys.readouterr().err
    for cmd in ("profile-library", "microbench"):          # the output is a folder: said before measuring
        assert main([cmd, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "--out" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_validate_plot_says_measured_for_measured_files(tmp_path, monkeypatch):
    from hbmsim.scenarios import validate_report as V
    from hbmsim.scenarios.cli import main
    seen = {}
    monkeypatch.setattr(V, "plot", lambda points, path, source, model, kind: seen.update(kind=kind, source=source)
                        or path)
    args = ["validate", "h100-torch-fwd-bwd", "--only", "fa2 flash2 fa2-kernel h100-sxm5-80gb forward",
            "--max-seq-len", "512", "--quiet", "--plot", str(tmp_path / "v.png")]
    assert main(args) == 0
    assert seen["kind"] == "measured (this project's runs on a GPU)"
    assert "NVIDIA H100 80GB HBM3" in seen["source"]


def test_the_sequence_length_set_reaches_beyond_the_paper_grid():
    doc = _load(MEASURED_DIR / "h100-torch-seqlens.json")
    ns = {r["workload"]["seq_len"] for r in doc["runs"]}
    assert ns == {128, 256, 32768}
    # batch = 16384 // N, at least 1; PyTorch's N x N scores at N = 32768 (64 GiB) do not fit the 80 GB GPU
    assert all(r["workload"]["batch"] == max(1, 16384 // r["workload"]["seq_len"]) for r in doc["runs"])
    assert {(s["implementation"], s["workload"]["seq_len"]) for s in doc["skipped"]} == {("pytorch", 32768)}
    assert all("out of memory" in s["reason"] for s in doc["skipped"])
