"""Published measurements as measured files, and `hbmsim validate` against them."""
import json
import statistics
from pathlib import Path

import pytest

from hbmsim.algorithms import registry
from hbmsim.scenarios.cli import main
from hbmsim.scenarios.compare import load
from hbmsim.scenarios.experiment import preset_names
from hbmsim.scenarios.published import MEASURED_DIR, convert_fa2_paper_csv
from hbmsim.scenarios.validate import Point
from hbmsim.scenarios.validate_report import family_stats

SHIPPED = MEASURED_DIR / "fa2-paper-fwd-bwd.json"
CSV = Path(__file__).resolve().parents[2] / "shared" / "published" / "fa2-paper-fwd-bwd.csv"
# One A100 FA2 configuration and its four shapes at N = 512 (head dim 64 and 128, causal or not).
SUBSET = ["validate", "fa2-paper-fwd-bwd", "--only", "fa2 flash2 fa2-kernel a100", "--max-seq-len", "512", "--quiet"]


@pytest.mark.skipif(not CSV.is_file(), reason="../shared/published is not beside this checkout")
def test_shipped_file_is_the_conversion_of_the_published_csv():
    assert json.loads(SHIPPED.read_text()) == convert_fa2_paper_csv(CSV)


def test_every_published_run_names_a_program_variant_and_preset_that_reproduce_it():
    f = load(SHIPPED)                        # the compare schema's checks: numbers, duplicates
    assert f.source == "published" and "arXiv 2307.08691" in f.provenance["citation"]
    assert {"gpu", "setup", "flop_convention"} <= set(f.provenance)
    names = {a.name: a for a in registry.algorithms()}
    assert len(f.runs) == 136
    for r in f.runs:
        assert r["source"] == "published" and r["hardware"] in preset_names()
        assert r["variant"] in names[r["algorithm"]].variants
    by_impl = {r["implementation"]: (r["algorithm"], r["variant"]) for r in f.runs}
    assert by_impl == {"fa2": ("flash2", "fa2-kernel"), "fa1": ("flash1", "fa1-kernel"),
                       "pytorch": ("standard", "pytorch-bench")}


def test_time_follows_the_papers_flop_convention():
    # A100, FA2, head dim 64, 32 heads, batch 32, N = 512, not causal, 132 TFLOPs/s:
    # forward 4 N^2 d heads batch = 4 * 512^2 * 64 * 32 * 32 = 68.72 GFLOP; x 3.5 = 240.5 GFLOP;
    # / 132e12 = 1.822 ms. Causal halves the FLOPs.
    runs = load(SHIPPED).runs
    r = next(r for r in runs if r["hardware"] == "a100-sxm4-80gb" and r["implementation"] == "fa2"
             and r["workload"]["seq_len"] == 512 and r["workload"]["head_dim"] == 64 and not r["workload"]["causal"])
    assert r["tflops_per_s"] == 132 and r["time_s"] == pytest.approx(3.5 * 4 * 512**2 * 64 * 32 * 32 / 132e12, rel=1e-4)
    for r in runs:
        w = r["workload"]
        flops = 3.5 * 4 * w["seq_len"] ** 2 * w["head_dim"] * w["heads"] * w["batch"] / (2 if w["causal"] else 1)
        assert r["time_s"] == pytest.approx(flops / (r["tflops_per_s"] * 1e12), rel=1e-3)
        assert w["batch"] * w["seq_len"] == 16384 and w["heads"] * w["head_dim"] == 2048


def test_validate_reports_families_and_plots(tmp_path, capsys):
    png, out_json = tmp_path / "v.png", tmp_path / "v.json"
    assert main(SUBSET + ["--plot", str(png), "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out_json.read_text())
    points = doc["points"]
    assert len(points) == 4 and {p["seq_len"] for p in points} == {512}
    assert {p["measured_file"] for p in points} == {"fa2-paper-fwd-bwd"}
    assert doc["speedups"] == []          # one implementation: nothing to pair
    for p in points:
        assert p["error"] == pytest.approx((p["predicted_time_s"] - p["measured_time_s"]) / p["measured_time_s"])
    errs = [p["error"] for p in points]
    row = next(line for line in text.splitlines() if line.startswith("fa2 a100-sxm4-80gb forward+backward"))
    # n, median |e|, worst |e|, signed median over every N; no run with N >= 1024 in this subset
    assert row.split()[3:7] == ["4", f"{100 * statistics.median(abs(e) for e in errs):.0f}%",
                                f"{100 * max(abs(e) for e in errs):.0f}%",
                                f"{100 * statistics.median(errs):+.0f}%" if statistics.median(errs) < 0
                                else f"{100 * statistics.median(errs):.0f}%"]
    assert png.stat().st_size > 10000


def test_family_stats_by_hand():
    fam = ("fa2", "a100-sxm4-80gb", "forward+backward")
    pts = [Point(fam, 512, "a", 0.5, 1.0), Point(fam, 1024, "b", 0.8, 1.0), Point(fam, 2048, "c", 1.3, 1.0)]
    # errors -0.5, -0.2, +0.3: median |e| 0.3, worst 0.5, signed median -0.2; N >= 1024: -0.2, +0.3
    (n, med, worst, signed) = family_stats(pts)[fam]["all"]
    assert (n, med, worst, signed) == (3, pytest.approx(0.3), pytest.approx(0.5), pytest.approx(-0.2))
    (n, med, worst, signed) = family_stats(pts)[fam]["long"]
    assert (n, med, worst, signed) == (2, pytest.approx(0.25), pytest.approx(0.3), pytest.approx(0.05))


def test_targets_line_counts_the_families_within_both_bounds():
    """Issue 23's targets as validate states them: a family is within when its median |e| and its
    worst |e| over all N are both at or under the bound (event level 10% / 25%)."""
    from hbmsim.scenarios.validate_report import EVENT_TARGET, KERNEL_TARGET, targets_line
    good, wide, off = (("fa2", "h100-sxm5-80gb", p) for p in ("forward", "backward", "forward+backward"))
    pts = [Point(good, 512, "a", 0.95, 1.0), Point(good, 1024, "b", 1.25, 1.0),      # |e| 0.05, 0.25, 0.05:
           Point(good, 2048, "g", 1.05, 1.0),                                        # within
           Point(wide, 512, "c", 1.0, 1.0), Point(wide, 1024, "d", 1.26, 1.0),       # worst 0.26: not
           Point(off, 512, "e", 0.85, 1.0), Point(off, 1024, "f", 0.89, 1.0)]        # median 0.13: not
    line = targets_line(family_stats(pts), EVENT_TARGET)
    assert line == ("within median |e| <= 10% and worst |e| <= 25% (all N): 1 of 3 families "
                    "(fa2 h100-sxm5-80gb forward)")
    assert targets_line(family_stats(pts), KERNEL_TARGET).endswith(": 0 of 3 families")


def test_speedup_stats_by_hand():
    """Issue 26's speed-up: the baseline's time over the implementation's on one configuration of one
    measured file, predicted against measured. FA3 predicted 1.0 s against FA2's 2.0 (2x), measured
    1.2 against 1.8 (1.5x): e = 2 / 1.5 - 1 = +1/3. cuDNN against FA2 at kernel level: predicted
    1.5x, measured 2x: e = -1/4. An FA2 run of another file on FA3's configuration is no pair."""
    from hbmsim.scenarios.validate_report import speedup_stats, speedup_table
    cfg = "h100-sxm5-80gb forward d=128 B=4 H=16 N=4096"
    fwd = ("h100-sxm5-80gb", "forward")
    pts = [Point(("fa3", *fwd), 4096, "fa3 " + cfg, 1.0, 1.2, source="paper"),
           Point(("fa2-fa3paper", *fwd), 4096, "fa2-fa3paper " + cfg, 2.0, 1.8, source="paper"),
           Point(("fa2", *fwd), 4096, "fa2 " + cfg, 3.0, 1.0, source="elsewhere"),
           Point(("cudnn", *fwd), 4096, "cudnn " + cfg, 1.1, 1.1, predicted_kernel_s=1.0, measured_kernel_s=1.0,
                 source="lib"),
           Point(("fa2", *fwd), 4096, "fa2 " + cfg, 1.6, 2.1, predicted_kernel_s=1.5, measured_kernel_s=2.0,
                 source="lib")]
    stats = speedup_stats(pts)
    assert set(stats) == {("fa3", "fa2-fa3paper", *fwd, "event"), ("cudnn", "fa2", *fwd, "event"),
                          ("cudnn", "fa2", *fwd, "kernel")}
    n, med, worst, signed = stats[("fa3", "fa2-fa3paper", *fwd, "event")]
    assert (n, signed) == (1, pytest.approx(1 / 3)) and med == worst == pytest.approx(1 / 3)
    assert stats[("cudnn", "fa2", *fwd, "kernel")][3] == pytest.approx(-0.25)
    assert any(line.startswith("fa3 over fa2-fa3paper h100-sxm5-80gb forward") and "33%" in line
               for line in speedup_table(pts))
    assert speedup_table(pts[:1]) == []
    from hbmsim.scenarios.validate_report import to_json
    (row,) = [r for r in json.loads(to_json(pts, True))["speedups"] if r["level"] == "kernel"]
    assert (row["implementation"], row["baseline"], row["n"]) == ("cudnn", "fa2", 1)
    assert row["median_error"] == pytest.approx(-0.25)


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("hardware"), "missing field 'hardware'"),
    (lambda r: r.update(variant="fa9-kernel"), "field 'variant' = 'fa9-kernel' must be one of fa2-kernel, paper"),
    (lambda r: r.update(time_s=-1.0), "field 'time_s' = -1.0 must be a finite number > 0"),
    (lambda r: r.update(hardware="b200"), "hardware 'b200' is neither a preset"),
    (lambda r: r.update(hardware_overrides={"clock_ghz": 1.83}), "runs[0]: hardware_overrides: unknown hardware "
                                                                  "field 'clock_ghz'"),
    (lambda r: r.update(hardware_overrides=1830), "field 'hardware_overrides' = 1830 must be a table"),
    (lambda r: r.update(times_s=[1e-3, float("nan")]), "field 'times_s[1]' = nan must be a finite number > 0"),
    (lambda r: r.update(times_s=1e-3), "field 'times_s' = 0.001 must be a list of seconds"),
])
def test_bad_measured_file_is_one_line(tmp_path, capsys, change, message):
    doc = json.loads(SHIPPED.read_text())
    doc["runs"] = doc["runs"][:1]
    change(doc["runs"][0])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["validate", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_validate_fast_folds_a_long_run_and_says_so(tmp_path, capsys):
    """`--fast` simulates in fast mode (for sequences too long to simulate whole) and every point,
    report and plot says how much was simulated. One measured H100 run: FA2 forward, d 128, 16 heads,
    N = 65536 (scenarios/measured/long/), measured 104.9 ms."""
    doc = json.loads((MEASURED_DIR / "long" / "h100-2026-11-23-torch-long.json").read_text())
    run = next(r for r in doc["runs"] if r["pass"] == "forward" and r["workload"]["head_dim"] == 128
               and r["workload"]["seq_len"] == 65536 and not r["workload"]["causal"])
    one, out_json, png = tmp_path / "one.json", tmp_path / "v.json", tmp_path / "v.png"
    one.write_text(json.dumps({**doc, "runs": [run]}))
    assert main(["validate", str(one), "--fast", "--quiet", "--json", str(out_json), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    (p,) = json.loads(out_json.read_text())["points"]
    # 4 N^2 d H = 3.52e13 FLOPs (two GEMMs of 2 N^2 d a head), predicted at 373 TFLOP/s (two resident
    # blocks issuing their instructions after their GEMMs, one after the other: warp_issue), and the
    # host's SDPA call (84.7 us) before the kernel
    assert p["predicted_time_s"] == pytest.approx(0.09452, rel=1e-3)
    assert p["measured_time_s"] == pytest.approx(0.10485, rel=1e-3)
    assert 0.1 < p["simulated_fraction"] < 0.3          # 22.7% of the blocks simulated, the rest folded
    assert "fast mode: 1 of the 1 runs folded, 22.7% to 22.7% of their blocks simulated" in text
    assert png.stat().st_size > 10_000


def test_nothing_left_to_validate_is_one_line(capsys):
    assert main(["validate", "fa2-paper-fwd-bwd", "--only", "no-such-thing"]) == 2
    assert "no run left to simulate" in capsys.readouterr().err


def test_ablation_simulates_each_effect_off(tmp_path, capsys):
    out_json = tmp_path / "a.json"
    assert main(SUBSET + ["--ablation", "--json", str(out_json), "--quiet"]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out_json.read_text())
    assert doc["time_model"] == "all effects on"
    labels = [f"without {e}" for e in ("stream_dram", "achievable_tensor", "mma_sync", "sfu_exp", "fp32_ops",
                                       "instruction_issue", "l2_sectors", "serial_softmax", "registers",
                                       "mma_operands",
                                       "sm_pipes", "pipe_sharing", "xu_tensor_serial", "wgmma_full_rate",
                                       "mma_sync_pipes", "warp_issue", "block_dispatch", "l2_hit_latency",
                                       "l2_dirty_limit", "fixed_chain", "named_barriers", "host", "sdpa_call")]
    for p in doc["points"]:
        abl = p["ablation_time_s"]
        assert list(abl) == labels + ["all off"]
        # FA2 on A100: a block's GEMMs and softmax in series cost time; mma.sync is A100's full rate
        assert abl["without serial_softmax"] < p["predicted_time_s"]
        assert abl["without mma_sync"] == p["predicted_time_s"]
        assert abl["without sm_pipes"] == p["predicted_time_s"]     # two pipes only for wgmma kernels (FA3)
        assert abl["without pipe_sharing"] == p["predicted_time_s"]     # so is their sharing
        assert abl["without xu_tensor_serial"] == p["predicted_time_s"]     # and the measured limit on them
        assert abl["without wgmma_full_rate"] == p["predicted_time_s"]      # wgmma's rate: FA3's kernels only
        assert abl["without mma_sync_pipes"] == p["predicted_time_s"]       # measured on Hopper, not A100
        assert abl["without warp_issue"] == p["predicted_time_s"]           # so is this (and the counts sm90's)
        assert abl["without instruction_issue"] == p["predicted_time_s"]    # for PyTorch's counted kernels
        assert abl["without l2_sectors"] == p["predicted_time_s"]           # for PyTorch's transposing copies
        assert abl["without block_dispatch"] == p["predicted_time_s"]       # not measured on an A100: 0
        assert abl["without l2_hit_latency"] == p["predicted_time_s"]       # not measured on an A100: 0
        assert abl["without l2_dirty_limit"] == p["predicted_time_s"]       # not measured on an A100: 0
        assert abl["without sdpa_call"] == p["predicted_time_s"]            # the paper's harness calls FA2 itself
        assert abl["without named_barriers"] == p["predicted_time_s"]       # FA3's backward meets its warpgroups
        assert abl["without achievable_tensor"] < p["predicted_time_s"]
        assert abl["all off"] < p["predicted_time_s"]
        # the host's dispatch and launches before the first kernel of each pass are on the stopwatch
        assert abl["without host"] < p["predicted_time_s"]
    errs = [(p["ablation_time_s"]["all off"] - p["measured_time_s"]) / p["measured_time_s"] for p in doc["points"]]
    ablation = text[text.index("ablation: signed median"):]          # the ablation table, after the report
    row = next(line for line in ablation.splitlines() if line.startswith("fa2 a100-sxm4-80gb forward+backward"))
    assert len(row.split()) == 3 + 1 + 23 + 1          # family, the model, each effect off, all off
    assert row.split()[-1] == f"{100 * statistics.median(errs):+.0f}%"


def test_without_switches_an_effect_off(tmp_path, capsys):
    out_json = tmp_path / "w.json"
    assert main(SUBSET + ["--without", "serial_softmax", "--without", "sfu_exp", "--json", str(out_json),
                          "--quiet"]) == 0
    assert json.loads(out_json.read_text())["time_model"] == "off: sfu_exp, serial_softmax"
    assert "time model: off: sfu_exp, serial_softmax" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(SUBSET + ["--without", "sfu"])
    assert exc.value.code == 2 and "invalid choice: 'sfu'" in capsys.readouterr().err


def test_sigterm_keeps_the_finished_points(tmp_path):
    """A real SIGTERM (a job scheduler's stop) once the first simulation has finished: the report
    and the JSON of what finished are written, one line says so, exit 130, no traceback."""
    import signal
    import subprocess
    import sys
    out_json = tmp_path / "v.json"
    proc = subprocess.Popen([sys.executable, "-m", "hbmsim.scenarios.cli", "validate", "h100-torch-seqlens",
                             "--workers", "1", "--json", str(out_json)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()               # stderr is not a terminal: a line per simulation
    assert line.startswith("validate: 1/"), line
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("hbmsim: validate interrupted after")
    doc = json.loads(out_json.read_text())
    assert doc["complete"] is False and len(doc["points"]) >= 1
    assert "(partial: interrupted after" in out


def test_a_predicted_file_is_refused(tmp_path, capsys):
    doc = json.loads(SHIPPED.read_text())
    doc["source"] = "predicted"
    for r in doc["runs"]:
        r["source"] = "predicted"
    bad = tmp_path / "pred.json"
    bad.write_text(json.dumps(doc))
    assert main(["validate", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'source' = 'predicted'" in err


def test_a_run_is_simulated_with_the_mapping_it_records(tmp_path):
    """`validate FILE` takes the block sizes a run records, not the defaults."""
    from hbmsim.scenarios.validate import config_of
    r = dict(json.loads(SHIPPED.read_text())["runs"][0], block_q=64, block_kv=32)
    cfg = config_of("f.json", 0, r)
    assert cfg.run.params == {"variant": "fa2-kernel", "block_q": 64, "block_kv": 32}


def test_kernel_groups_by_hand():
    from hbmsim.scenarios.kernel_rows import UNCLAIMED_MEASURED, UNCLAIMED_PREDICTED, compare_kernels
    predicted = [{"name": "flash2_bwd_dot_do_o", "time_s": 1e-5}, {"name": "flash2_bwd", "time_s": 8e-5},
                 {"name": "flash2_bwd_convert_dq", "time_s": 1e-5}, {"name": "l2_writeback", "time_s": 2e-6}]
    measured = [{"name": "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>", "time_s": 1e-4},
                {"name": "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, ...>", "time_s": 2e-5},
                {"name": "void pytorch_flash::flash_bwd_convert_dq_kernel<...>", "time_s": 1e-5},
                {"name": "Memset (Device)", "time_s": 1e-6}]
    assert compare_kernels("flash2", "fa2-kernel", predicted, measured) == [
        ("dO.O (preprocess)", 1e-5, 2e-5), ("dQ dK dV", 8e-5, 1e-4), ("convert dQ", 1e-5, 1e-5),
        (UNCLAIMED_MEASURED, 0.0, 1e-6), (UNCLAIMED_PREDICTED, 2e-6, 0.0)]
    assert compare_kernels("flash1", "paper", predicted, measured) is None


def test_a_group_whose_rows_miss_launches_is_not_compared():
    """h100-torch-fwd-bwd.json at N = 16384, causal: the profiler has no row for the rearranges'
    copies, so the copies group holds only the mask's cast (1 launch measured against 4
    predicted): its times move to the unclaimed lines, not into the group's error. The causal
    add split into 8 launches (over 2^31 elements) against one predicted is compared."""
    from hbmsim.scenarios.kernel_rows import ROWS_MISSING, UNCLAIMED_MEASURED, compare_kernels
    predicted = [{"name": n, "time_s": t} for n, t in (("rearrange_q", 9e-5), ("rearrange_k", 1.2e-4),
                                                       ("einsum_copy_v", 1e-4), ("causal_to_dtype", 5.5e-4),
                                                       ("causal_add", 2.6e-2))]
    measured = [{"name": "void at::native::elementwise_kernel<128, 4, ...CUDAFunctor_add<c10::Half>...>",
                 "launches": 8.0, "time_s": 2.4e-2},
                {"name": "void at::native::vectorized_elementwise_kernel<8, at::native::float16_copy_kernel_cuda...>",
                 "launches": 1.0, "time_s": 5.3e-4}]
    assert compare_kernels("standard", "pytorch-bench", predicted, measured) == [
        ("causal mask (full, triu, add)", 2.6e-2, 2.4e-2), (UNCLAIMED_MEASURED, 0.0, 5.3e-4),
        (ROWS_MISSING, pytest.approx(8.6e-4), 0.0)]
    measured.append({"name": "void at::native::elementwise_kernel<128, 4, ...direct_copy_kernel_cuda...>",
                     "launches": 3.0, "time_s": 4.2e-4})        # with the copies' row: compared
    assert compare_kernels("standard", "pytorch-bench", predicted, measured)[0] == (
        "copies (rearrange, einsum, stack, mask cast)", pytest.approx(8.6e-4), pytest.approx(9.5e-4))


def test_fa3_and_cudnn_kernel_rows_group_by_hand():
    """flash3 stands for FlashAttention-3's kernels and for torch's cuDNN attention on Hopper: their
    rows (names as their sources and cuDNN's generated kernels give them) fall in its groups."""
    from hbmsim.scenarios.kernel_rows import UNCLAIMED_MEASURED, compare_kernels
    predicted = [{"name": "flash3_bwd_preprocess", "time_s": 1e-5}, {"name": "flash3_bwd", "time_s": 6e-5},
                 {"name": "flash3_bwd_convert_dq", "time_s": 1e-5}]
    fa3 = [{"name": "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnBwdSm90<...>>>",
            "time_s": 7e-5},
           {"name": "void cutlass::device_kernel<flash::FlashAttnBwdPreprocess<...>>", "time_s": 2e-5},
           {"name": "void cutlass::device_kernel<flash::FlashAttnBwdPostprocessConvertdQ<...>>", "time_s": 1e-5}]
    assert compare_kernels("flash3", "fa3-kernel", predicted, fa3) == [
        ("dO.O (preprocess)", 1e-5, 2e-5), ("dQ dK dV", 6e-5, 7e-5), ("convert dQ", 1e-5, 1e-5)]
    cudnn = [{"name": "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7_64x128x128", "time_s": 8e-5},
             {"name": "Memset (Device)", "time_s": 1e-6}]
    assert compare_kernels("flash3", "fa3-kernel", predicted, cudnn) == [
        ("dO.O (preprocess)", 1e-5, 0.0), ("dQ dK dV", 6e-5, 8e-5), ("convert dQ", 1e-5, 0.0),
        (UNCLAIMED_MEASURED, 0.0, 1e-6)]
    forward = [{"name": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128", "time_s": 3e-5}]
    assert compare_kernels("flash3", "fa3-kernel", [{"name": "flash3_fwd", "time_s": 2e-5}], forward) == [
        ("forward", 2e-5, 3e-5)]


def test_the_library_times_hopper_kernels_only_when_asked(capsys):
    """cudnn and fa3 are timed by name (`--impl cudnn fa3`), never by default; a name it does not know
    is refused before anything is measured."""
    from hbmsim.kernels import library
    assert library.DEFAULT_IMPLEMENTATIONS == ("fa2", "pytorch")
    assert set(library.DEFAULT_IMPLEMENTATIONS) < set(library.IMPLEMENTATIONS) == {"fa2", "pytorch", "cudnn", "fa3"}
    with pytest.raises(SystemExit) as exit_:
        library.main(["--out", "x.json", "--impl", "fa2", "cudnn9"])
    assert exit_.value.code == 2
    assert "--impl 'cudnn9' must be one of fa2, pytorch, cudnn, fa3" in capsys.readouterr().err


def test_kernel_level_is_reported_for_files_with_kernel_rows(tmp_path, capsys):
    out_json = tmp_path / "k.json"
    assert main(["validate", "h100-torch-fwd-bwd", "--only", "fa2 flash2 fa2-kernel h100-sxm5-80gb forward",
                 "--max-seq-len", "512", "--quiet", "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "kernel level:" in text and "fa2 h100-sxm5-80gb forward: forward" in text
    # the measurement's own spread: the 4 forward runs keep their 30 repeats (the sums keep none)
    assert "the 4 runs that keep their repeats:" in text
    for p in json.loads(out_json.read_text())["points"]:
        if p["pass"] == "forward+backward":
            assert p["measured_kernel_time_s"] is None          # the file has no rows for the sum
            assert "measured_repeats_s" not in p
            continue
        rep = p["measured_repeats_s"]
        assert rep["min"] <= rep["median"] <= rep["max"] and rep["min"] <= p["measured_time_s"] <= rep["max"]
        assert p["kernel_error"] == pytest.approx(
            (p["predicted_kernel_time_s"] - p["measured_kernel_time_s"]) / p["measured_kernel_time_s"])
        # the stopwatch sees the kernels and the host's dispatch before them
        assert p["predicted_time_s"] > p["predicted_kernel_time_s"]


def test_the_library_harness_pays_its_transposes_and_sdpas_own_work_before_the_kernel(tmp_path):
    """A file `python -m hbmsim.kernels.library` wrote: its fa2 forward's timed call transposes q, k
    and v (three framework ops, kernels/implementations.py) before SDPA, and SDPA does its own host
    work (sdpa_forward_s, 84.7 us), so the stopwatch's prediction is 3 x 6.8 + 84.7 us later than
    the program's own (3 x 6.8 us with `--without sdpa_call`); a run may say so itself
    ("caller_ops"), and without the library's command a file's runs pay neither. One H100 run: FA2
    forward, N = 128."""
    doc = json.loads((MEASURED_DIR / "h100-torch-seqlens.json").read_text())
    run = next(r for r in doc["runs"] if r["implementation"] == "fa2" and r["pass"] == "forward"
               and r["workload"]["seq_len"] == 128 and r["workload"]["head_dim"] == 64 and not r["workload"]["causal"])
    assert "hbmsim.kernels.library " in doc["provenance"]["command"]

    def predicted(provenance: dict, *options, **fields) -> dict:
        f, out = tmp_path / "one.json", tmp_path / "out.json"
        f.write_text(json.dumps({**doc, "provenance": provenance, "runs": [{**run, **fields}]}))
        assert main(["validate", str(f), "--quiet", "--json", str(out), *options]) == 0
        (p,) = json.loads(out.read_text())["points"]
        return p

    library = predicted(doc["provenance"])
    paper = predicted({k: v for k, v in doc["provenance"].items() if k != "command"})
    own = predicted({k: v for k, v in doc["provenance"].items() if k != "command"}, caller_ops={"forward": 5})
    assert library["predicted_kernel_time_s"] == paper["predicted_kernel_time_s"]
    assert library["predicted_time_s"] - paper["predicted_time_s"] == pytest.approx(3 * 6.8e-6 + 84.7e-6, abs=1e-12)
    without = predicted(doc["provenance"], "--without", "sdpa_call")
    assert without["predicted_time_s"] - paper["predicted_time_s"] == pytest.approx(3 * 6.8e-6, abs=1e-12)
    assert own["predicted_time_s"] - paper["predicted_time_s"] == pytest.approx(5 * 6.8e-6, abs=1e-12)


@pytest.mark.parametrize("ops, message", [
    ([3], "field 'caller_ops' = [3] must be a table {pass: framework ops}"),
    ({"forward": -1}, "field 'caller_ops.forward' = -1 must be a whole number >= 0"),
    ({"forward": 1.5}, "field 'caller_ops.forward' = 1.5 must be a whole number >= 0"),
    ({"sideways": 1}, "field 'caller_ops.sideways': the pass must be forward or backward"),
])
def test_bad_caller_ops_are_one_line(tmp_path, capsys, ops, message):
    doc = json.loads(SHIPPED.read_text())
    doc["runs"] = [{**doc["runs"][0], "caller_ops": ops}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["validate", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "runs[0]" in err and "Traceback" not in err


def test_a_papers_loop_of_calls_hides_the_host(tmp_path):
    """The FlashAttention-2 paper timed a loop of calls (torch.utils.benchmark's timeit), so its runs
    say "calls": "back-to-back" and a call takes the loop's period: at N = 512 on A100 the GPU is the
    slower, so the predicted time is the kernels' plus a 0.9 us gap before each of the four launched
    kernels (the forward's one, the backward's three; the L2's write-back is not launched). The same
    run timed as one call pays the host's dispatch and the autograd engine's 95.7 us before them."""
    doc = json.loads(SHIPPED.read_text())
    assert {r["calls"] for r in doc["runs"]} == {"back-to-back"} and "timeit" in doc["provenance"]["timing"]
    run = next(r for r in doc["runs"] if r["implementation"] == "fa2" and r["hardware"] == "a100-sxm4-80gb"
               and r["workload"]["seq_len"] == 512 and r["workload"]["head_dim"] == 64 and not r["workload"]["causal"])

    def point(**fields) -> dict:
        f, out = tmp_path / "one.json", tmp_path / "out.json"
        f.write_text(json.dumps({**doc, "runs": [{**run, **fields}]}))
        assert main(["validate", str(f), "--quiet", "--json", str(out)]) == 0
        (p,) = json.loads(out.read_text())["points"]
        return p

    loop, one = point(), point(calls="one")
    assert loop["predicted_time_s"] - loop["predicted_kernel_time_s"] == pytest.approx(4 * 0.9e-6, abs=1e-12)
    assert one["predicted_kernel_time_s"] == loop["predicted_kernel_time_s"]
    assert one["predicted_time_s"] - one["predicted_kernel_time_s"] > 95.7e-6


@pytest.mark.parametrize("row, message", [
    ({"name": "k", "time_s": "abc"}, "field 'kernels[0].time_s' = 'abc' must be a finite number >= 0"),
    ({"name": "k", "time_s": -1e-6}, "field 'kernels[0].time_s' = -1e-06 must be a finite number >= 0"),
    ({"name": "k", "time_s": float("nan")}, "field 'kernels[0].time_s' = nan must be a finite number >= 0"),
    ({"name": "k"}, "field 'kernels[0].time_s' = None must be a finite number >= 0"),
    ({"name": "", "time_s": 1e-6}, "field 'kernels[0].name' = '' must be a non-empty string"),
    ({"name": "k", "time_s": 1e-6, "launches": 0}, "field 'kernels[0].launches' = 0 must be a finite number > 0"),
    ("k", "field 'kernels[0]' = 'k' must be an object with 'name' and 'time_s'"),
])
def test_bad_kernel_rows_are_one_line(tmp_path, capsys, row, message):
    """A measured run's kernel rows are checked before anything is simulated: one line, exit 2."""
    doc = json.loads((MEASURED_DIR / "h100-decode-sdpa-gqa.json").read_text())
    doc["runs"] = [{**doc["runs"][0], "kernels": [row]}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["validate", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs[0]" in err and message in err


def test_bad_calls_are_one_line(tmp_path, capsys):
    doc = json.loads(SHIPPED.read_text())
    doc["runs"] = [{**doc["runs"][0], "calls": "many"}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["validate", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs[0]: field 'calls' = 'many' must be one of one, back-to-back" in err


def test_a_rerun_simulates_only_what_the_cache_lacks_for_its_programs_code(tmp_path, monkeypatch):
    """validate keeps each finished simulation in $HBMSIM_CACHE/validate/simulations.jsonl under its
    configuration's key and its program's code hash: a rerun simulates nothing it holds (the same
    points; a line cut short is skipped); an edit to one program's modules simulates that program's
    configurations again and keeps the others' (FA2's four here, FA1's and PyTorch's kept), the
    records the edit made stale dropped; --no-cache simulates everything; an older release's
    per-hash file is removed."""
    from hbmsim.scenarios import sim_cache, sweep
    cache = tmp_path / "cache"
    monkeypatch.setenv("HBMSIM_CACHE", str(cache))
    monkeypatch.delenv("HBMSIM_NO_CACHE")
    (cache / "validate").mkdir(parents=True)
    (cache / "validate" / "0123456789abcdef0123.jsonl").write_text("{}\n")       # an older release's
    args = ["validate", "fa2-paper-fwd-bwd", "--only", "a100-sxm4-80gb forward+backward", "--max-seq-len", "512",
            "--quiet", "--workers", "1", "--json"]
    assert main(args + [str(tmp_path / "first.json")]) == 0
    log = cache / "validate" / "simulations.jsonl"
    assert [f.name for f in (cache / "validate").iterdir()] == [log.name]
    with log.open("a") as fh:
        fh.write('{"index": 0, "key": "cut sh')            # a line another process left cut short: skipped
    simulated, real = [], sweep.run_config

    def counted(cfg, *a, **k):
        simulated.append(cfg.run.algorithm)
        return real(cfg, *a, **k)
    monkeypatch.setattr(sweep, "run_config", counted)
    assert main(args + [str(tmp_path / "second.json")]) == 0
    assert simulated == []
    edited = {**sim_cache.code_hashes(), "flash2": "0" * sim_cache.HASH_CHARS}
    monkeypatch.setattr(sim_cache, "code_hashes", lambda: edited)
    assert main(args + [str(tmp_path / "third.json")]) == 0
    assert sorted(simulated) == ["flash2"] * 4
    first, second, third = (json.loads((tmp_path / f).read_text())["points"]
                            for f in ("first.json", "second.json", "third.json"))
    assert len(first) == 12 and second == first and third == first
    codes = [json.loads(line)["key"].split(" ", 1)[0] for line in log.read_text().splitlines()]
    assert len(codes) == 12 and codes.count("0" * sim_cache.HASH_CHARS) == 4        # stale FA2 records gone
    simulated.clear()
    assert main(args + [str(tmp_path / "fourth.json"), "--no-cache"]) == 0
    assert len(simulated) == 12


def test_a_programs_code_is_its_spec_modules_imports():
    """The modules whose edit makes validate simulate a program again: its spec module's imports,
    directly or not (FA2's spec reaches neither FA3's nor FA1's kernels), and everything when a
    module imports the programs package itself (which imports every program)."""
    from hbmsim.scenarios.sim_cache import code_hashes, program_files
    files = program_files()
    assert {"flash2", "flash2_backward", "flash2_splitkv", "common"} <= files["flash2"]
    assert not {"flash3", "flash3_backward", "flash1_kernel", "standard_kernels"} & files["flash2"]
    assert {"flash3", "flash3_backward", "flash3_combine"} <= files["flash3"]
    assert not {"flash2", "flash3", "flash1"} & files["standard"]
    hashes = code_hashes()
    assert sorted(hashes) == ["flash1", "flash2", "flash3", "standard"] and len(set(hashes.values())) == 4


def test_an_import_of_the_programs_package_reaches_every_program(tmp_path):
    from hbmsim.scenarios.sim_cache import _algorithm_imports
    f = tmp_path / "m.py"
    f.write_text("from hbmsim.algorithms import get\nfrom .common import x\nfrom . import paged\n"
                 "import hbmsim.algorithms.flash3\n")
    assert _algorithm_imports(f) == {"__init__", "get", "common", "paged", "flash3"}


def _one_wave_times(path, capsys, *extra) -> dict:
    """{(N, tiles an SM): (predicted, measured)} kernel time of FA2's forward at head dim 128, one and
    two 128-row tiles an SM, from validate's points of a one-wave file (batch 1, heads = K x 132 x
    128 / N)."""
    assert main(["validate", "one-wave/h100-torch-one-wave", "--only", "fa2", "--quiet", "--json", str(path),
                 *extra]) == 0
    capsys.readouterr()
    t = {}
    for p in json.loads(path.read_text())["points"]:
        if p["pass"] == "forward" and " d=128 " in p["label"]:
            heads = int(p["label"].split(" H=")[1].split()[0])
            t[(p["seq_len"], heads * p["seq_len"] // (132 * 128))] = (p["predicted_kernel_time_s"],
                                                                      p["measured_kernel_time_s"])
    return t


def _ratios(t: dict) -> dict:
    """{N: (predicted, measured)} two tiles' time over one's."""
    return {n: (t[(n, 2)][0] / t[(n, 1)][0], t[(n, 2)][1] / t[(n, 1)][1]) for n, k in t if k == 1}


def test_one_and_two_resident_fa2_forward_blocks_as_measured(tmp_path, capsys):
    """warp_issue against the measured one-wave set (H100, 2026-11-26): a lone FA2 forward block an SM
    waits its own chain (its GEMM and ldmatrix, then its softmax), two blocks take the SM's issue,
    max(mma.sync, ldmatrix) + every warp instruction at 4 a clock, one block after the other. Both
    kernel times within 5% of the measured ones at N >= 1536 (-0..-2% and -1..-4%); two over one
    1.64-1.66 against 1.67-1.71 measured. mma_sync_pipes alone (two pipes, first come first served)
    said 1.67-1.70 here, with the two-block times 16-19% fast at head dim 64 and 20-24% slow at 256
    (docs/validation.md)."""
    t = _one_wave_times(tmp_path / "on.json", capsys)
    assert sorted(n for n, k in t if k == 1) == [512, 1536, 4224, 8448, 16896]
    for (n, k), (predicted, measured) in t.items():
        if n >= 1536:
            assert abs(predicted / measured - 1) < 0.05, (n, k, predicted, measured)
    for n, (predicted, measured) in _ratios(t).items():
        if n >= 1536:
            assert 1.66 < measured < 1.72 and 1.63 < predicted < 1.67
    for n, (predicted, _) in _ratios(_one_wave_times(tmp_path / "off.json", capsys, "--without",
                                                     "warp_issue")).items():
        if n >= 1536:      # mma_sync_pipes: the tensor pipe's mma.sync + ldmatrix, 85% of a step, twice
            assert 1.66 < predicted < 1.70
