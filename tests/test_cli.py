"""The hbmsim command: demo, run, hardware, bench, and one clear line + exit 2 for bad input."""
import json
import shutil
import subprocess
import sys

import pytest

from hbmsim.scenarios.cli import main
from hbmsim.scenarios.experiment import EXPERIMENTS_DIR, load_experiment

GOOD = """
name = "t"
hardware = "a100-sxm4-40gb"
[workload]
batch = 1
heads = 2
seq_len = 64
head_dim = 32
[[runs]]
algorithm = "flash2"
block_q = 32
block_kv = 32
"""


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def scenario(tmp_path, text):
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return str(p)


BAD = [
    (GOOD.replace("batch = 1\n", ""), "missing field 'batch'"),
    (GOOD.replace("heads = 2", "heads = -2"), "field 'heads' = -2 must be a whole number >= 1"),
    (GOOD.replace("seq_len = 64", "seq_len = 0"), "field 'seq_len' = 0 must be a whole number >= 1"),
    (GOOD + "[sweep]\nseq_len = [64, 12.5]\n",
     "(sweep seq_len=12.5): workload: field 'seq_len' = 12.5 must be a whole"),
    (GOOD.replace("seq_len = 64", "seq_len_q = 0\nseq_len_kv = 8"),
     "field 'seq_len_q' = 0 must be a whole number >= 1"),
    (GOOD.replace("block_q = 32", "block_q = 32.5"), "field 'block_q' = 32.5 must be a whole number >= 1 or \"auto\""),
    (GOOD + "[hardware_overrides]\nname = 5\n", "field 'name' = 5 must be a non-empty string"),
    (GOOD.replace("seq_len = 64", "seq_len_q = 64"), "missing field 'seq_len'"),
    (GOOD.replace("seq_len = 64", "seq_len = 64\nseq_len_q = 64"), "give either 'seq_len' or 'seq_len_q'"),
    (GOOD.replace('algorithm = "flash2"', 'algorithm = "flash9"'), "field 'algorithm' = 'flash9' must be one of"),
    (GOOD.replace('algorithm = "flash2"', 'algorithm = "flash3"'), "needs Hopper's TMA and wgmma"),
    (GOOD.replace("block_q = 32", "block_q = 0"), "field 'block_q' = 0 must be a whole number >= 1 or \"auto\""),
    (GOOD.replace("block_q = 32", "block_q = 512").replace("head_dim = 32", "head_dim = 128").replace(
        "block_kv = 32", "block_kv = 512").replace("seq_len = 64", "seq_len = 1024"),
     "a block needs 393216 bytes of SRAM, more than sram_bytes_per_sm = 166912"),
    (GOOD.replace("head_dim = 32", 'head_dim = 32\ndtype = "fp8"'),
     "field 'dtype' = 'fp8' must be one of fp16, bf16, fp32"),
    (GOOD.replace("head_dim = 32", "head_dim = 32\ndropout = 1.5"), "field 'dropout' = 1.5 must be a number in [0, 1)"),
    (GOOD.replace("head_dim = 32", 'head_dim = 32\ncausal = "yes"'), "field 'causal' = 'yes' must be true or false"),
    (GOOD.replace("head_dim = 32", "head_dim = 32\nkv_heads = 3"), "field 'kv_heads' = 3 must divide heads = 2"),
    (GOOD.replace("head_dim = 32", "head_dim = 32\nkv_heads = 0"), "field 'kv_heads' = 0 must be a whole number >= 1"),
    (GOOD.replace("head_dim = 32", "head_dim = 32\nkv_page_size = 0"),
     "field 'kv_page_size' = 0 must be a whole number >= 1"),
    (GOOD.replace("head_dim = 32", "head_dim = 32\nkv_page_size = 100"),
     "flash2: field 'kv_page_size' = 100 must be a multiple of 256"),
    (GOOD.replace('hardware = "a100-sxm4-40gb"', 'hardware = "b200"'), "hardware 'b200' is neither a preset"),
    (GOOD + "[hardware_overrides]\nwarp_size = 32\n", "unknown hardware field 'warp_size'"),
    (GOOD + "[hardware_overrides]\nhbm_bytes_per_s = -1.0\n", "field 'hbm_bytes_per_s' = -1.0 must be > 0"),
    (GOOD + "[sweep]\nwarpz = [1, 2]\n", "[sweep]: 'warpz' names neither a workload, a run nor a hardware field"),
    (GOOD + "[sweep]\nseq_len = 128\n", "[sweep]: 'seq_len' = 128 must be a non-empty list"),
    (GOOD.replace("block_kv = 32", 'block_kv = 32\npasses = ["sideways"]'),
     "field 'passes' has 'sideways'; supported: forward, backward"),
    (GOOD.replace("block_kv = 32", 'block_kv = 32\npasses = ["forward", "forward"]'), "names a pass twice"),
    (GOOD.replace("block_kv = 32", "block_kv = 32\ntile_m = 64"),
     "field 'tile_m' does not apply to algorithm 'flash2'"),
    (GOOD + "colour = 1\n", "unknown field 'colour'"),
    (GOOD.split("[[runs]]")[0], "needs at least one [[runs]] table"),
    (GOOD.replace("[workload]", "[workload"), "not valid TOML"),
    (GOOD.replace("batch = 1", "batch = 100000").replace("seq_len = 64", "seq_len = 65536"),
     "Q, K, V and O alone need 3355443200000 bytes of HBM, more than hbm_capacity_bytes = 40000000000"),
]


@pytest.mark.parametrize("text, message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_scenario_one_line_exit_2(tmp_path, capsys, text, message):
    code, out, err = run_cli(capsys, "run", scenario(tmp_path, text), "--count-only")
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hbmsim: error: "), err
    assert message in lines[0]
    assert "Traceback" not in err


def test_unreadable_toml_exit_2(tmp_path, capsys):
    p = tmp_path / "bin.toml"
    p.write_bytes(b"name = \"\xff\xfe\"\n")
    code, _, err = run_cli(capsys, "run", str(p))
    assert code == 2 and err.count("\n") == 1 and "not valid TOML" in err


@pytest.mark.parametrize("argv, message", [
    (["run", "small-masked", "--trace", "-3"], "argument --trace: -3 must be >= 0"),
    (["anomalies", "--trials", "0"], "argument --trials: 0 must be >= 1"),
    (["emulate", "emulate-small", "--seed", "-1"], "argument --seed: -1 must be >= 0"),
    (["profile", "emulate-small", "--repeats", "0"], "argument --repeats: 0 must be >= 1"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_command_line_one_line_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and err.startswith("hbmsim: error: ") and message in err


def test_output_path_that_is_a_folder_exit_2(tmp_path, capsys):
    code, _, err = run_cli(capsys, "run", scenario(tmp_path, GOOD), "--count-only", "--json", str(tmp_path))
    assert code == 2 and err.strip().splitlines() == [
        f"hbmsim: error: --json '{tmp_path}' is a folder: give a file name such as '{tmp_path / 'results.json'}'"]


def test_trace_and_plot_with_json_to_stdout_keep_stdout_pure(tmp_path, capsys):
    code, out, err = run_cli(capsys, "run", scenario(tmp_path, GOOD), "--json", "-", "--trace", "2",
                             "--plot", str(tmp_path / "fig"))
    assert code == 0 and len(json.loads(out)["runs"]) == 1
    assert "# trace of flash2" in err and (tmp_path / "fig.png").stat().st_size > 10000


def test_sweeping_the_algorithm_applies_its_own_block_fields(tmp_path):
    text = GOOD.replace('algorithm = "flash2"\nblock_q = 32\nblock_kv = 32', 'algorithm = "standard"')
    exp = load_experiment(scenario(tmp_path, text + "[sweep]\nblock_kv = [16]\nalgorithm = [\"flash2\"]\n"))
    assert [(c.run.algorithm, c.run.params) for c in exp.configs] == [("flash2", {"block_kv": 16})]


def test_missing_file_exit_2(capsys):
    code, _, err = run_cli(capsys, "run", "/nonexistent/x.toml")
    assert code == 2 and "experiment '/nonexistent/x.toml' not found" in err


def test_bad_input_through_the_installed_command(tmp_path):
    p = scenario(tmp_path, GOOD.replace("heads = 2", "heads = -2"))
    proc = subprocess.run([sys.executable, "-m", "hbmsim.scenarios.cli", "run", p], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "field 'heads' = -2" in proc.stderr


def test_run_json_to_stdout_is_only_json(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "run", scenario(tmp_path, GOOD), "--json", "-")
    assert code == 0
    runs = json.loads(out)["runs"]
    assert len(runs) == 1
    r = runs[0]
    assert r["algorithm"] == "flash2" and r["pass"] == "forward" and r["source"] == "predicted"
    assert r["workload"]["seq_len"] == 64 and r["block_q"] == 32
    # Q, K re-read once per query block (2 blocks): counts are the closed form
    assert r["tensors"]["K"]["read"] == 2 * 2 * 64 * 32 * 2
    assert r["max_abs_error"] < 1e-12
    for key in ("hbm_read_bytes", "hbm_write_bytes", "global_read_bytes", "global_write_bytes", "hbm_peak_bytes",
                "sram_peak_bytes", "matmul_flops", "vector_flops", "time_s", "cycles", "bound", "kernels", "tensors"):
        assert key in r


def test_run_prints_table_and_plot(tmp_path, capsys):
    exp = scenario(tmp_path, GOOD.replace("block_kv = 32", "block_kv = 32\n[[runs]]\nalgorithm = \"standard\"")
                   + "[sweep]\nseq_len = [64, 128]\n")
    png = tmp_path / "p.png"
    code, out, err = run_cli(capsys, "run", exp, "--plot", str(png), "--json", str(tmp_path / "r.json"))
    assert code == 0 and png.stat().st_size > 10000
    assert "standard/flash2: HBM bytes" in out and "predicted" in out
    assert "configurations" not in err          # no progress bars: stderr is not a terminal (test_progress.py)
    assert len(json.loads((tmp_path / "r.json").read_text())["runs"]) == 4


def test_trace_is_readable(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "run", scenario(tmp_path, GOOD), "--trace", "3")
    assert code == 0
    lines = [l for l in out.splitlines() if " us  SM" in l]
    assert len(lines) == 3
    assert lines[0].split() == ["0.000", "us", "SM0", "flash2_fwd", "block", "0:", "load", "Q[0][0:32,", "0:32]",
                                "2048", "B", "(HBM)"]


def test_sweep_expands_cartesian_product():
    exp = load_experiment(EXPERIMENTS_DIR / "demo.toml")
    assert [(c.run.algorithm, c.workload.seq_len_q) for c in exp.configs][:4] == [
        ("standard", 256), ("flash2", 256), ("standard", 512), ("flash2", 512)]
    exp = load_experiment("block-sweep")
    assert [c.run.params["block_kv"] for c in exp.configs] == [32, 64, 128, 256]


def test_every_shipped_experiment_loads():
    for p in EXPERIMENTS_DIR.glob("*.toml"):
        assert load_experiment(p).configs


def test_small_masked_training_reports_each_pass_and_checks_numerics(capsys):
    code, out, _ = run_cli(capsys, "run", "small-masked", "--json", "-")
    runs = json.loads(out)["runs"]
    assert code == 0
    assert [(r["algorithm"], r["pass"]) for r in runs] == [
        (a, p) for a in ("standard", "flash1", "flash2") for p in ("forward", "backward", "forward+backward")]
    assert all(r["max_abs_error"] < 1e-12 for r in runs)
    for fwd, bwd, total in zip(runs[0::3], runs[1::3], runs[2::3]):
        for key in ("hbm_read_bytes", "hbm_write_bytes", "global_read_bytes", "matmul_flops"):
            assert total[key] == fwd[key] + bwd[key]
        assert total["time_s"] == pytest.approx(fwd["time_s"] + bwd["time_s"])
        assert {k["pass"] for k in bwd["kernels"]} == {"backward"}
    # auto blocks: the FA2 kernel's 128 x 128 for head dim 32 (forward and backward), clipped to
    # N_q = 100 and N_kv = 77
    assert [runs[6][k] for k in ("block_q", "block_kv", "block_q_bwd", "block_kv_bwd")] == [100, 77, 100, 77]


def test_hardware_list_and_detail(capsys):
    code, out, _ = run_cli(capsys, "hardware")
    assert code == 0 and "a100-sxm4-40gb" in out and "h100-sxm5-80gb" in out
    code, out, _ = run_cli(capsys, "hardware", "h100-sxm5-80gb")
    assert code == 0 and "sm_count" in out and "132" in out and "whitepaper" in out


def test_demo_writes_figure_and_table(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "demo", "--out", str(tmp_path / "d"))
    assert code == 0
    assert (tmp_path / "d" / "demo.png").stat().st_size > 20000
    runs = json.loads((tmp_path / "d" / "demo.json").read_text())["runs"]
    assert {r["workload"]["seq_len"] for r in runs} == {256, 512, 1024, 2048, 4096}
    assert "max |O - reference| =" in out and "standard/flash2: HBM bytes" in out
    by = {(r["algorithm"], r["workload"]["seq_len"]): r for r in runs}
    for n in (1024, 2048, 4096):
        assert by["flash2", n]["time_s"] < by["standard", n]["time_s"]


def test_bench_reports_wall_time_and_ratio(capsys):
    from hbmsim.scenarios.bench import bench
    result = bench("small-masked", progress=False)
    assert result["mode"] == "count-only" and result["peak_rss_bytes"] > 0
    for mode in ("fast", "full"):
        m = result[mode]
        assert m["sim_events"] == sum(r["sim_events"] for r in m["runs"]) > 0
        assert m["ratio_to_bare_simpy"] > 0 and m["wall_s"] > 0
    # small-masked is too short to fold: both modes simulate the same events and predict the same times
    fast, full = result["fast"]["runs"], result["full"]["runs"]
    assert [r["predicted_time_s"] for r in fast] == [r["predicted_time_s"] for r in full]
    assert [r["simulated_fraction"] for r in fast] == [1.0] * len(fast)
    assert "full" not in bench("small-masked", progress=False, mode="fast")


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind (callgrind) not installed")
def test_bench_counts_instructions_of_the_same_simulation_under_callgrind():
    """--instructions runs the simulation and bare SimPy in child Pythons under callgrind (about
    40 s here): the child simulates the same events as the timed bench, every count is net of a
    child that only imports and loads, and a count repeats."""
    from hbmsim.scenarios.bench import _callgrind, bench
    timed = bench("small-masked", progress=False, mode="fast")["fast"]
    counted = bench("small-masked", progress=False, mode="fast", instructions=True)
    assert counted["measure"] == "instructions (valgrind --tool=callgrind), not time" and "full" not in counted
    m = counted["fast"]
    assert m["sim_events"] == timed["sim_events"]
    assert m["instructions_per_event"] == round(m["instructions"] / m["sim_events"])
    # bare SimPy runs at least as many events (1,000 processes, each a whole number of timeouts)
    assert m["bare_simpy_events"] >= m["sim_events"]
    # a SimPy event costs thousands of instructions, not millions: the import-only child was subtracted
    assert 2_000 < m["bare_simpy_instructions_per_event"] < 100_000
    # (the ratio is of the unrounded per-event counts: the rounded ones may move it by 0.01)
    per_event, bare = m["instructions_per_event"], m["bare_simpy_instructions_per_event"]
    assert m["ratio_to_bare_simpy"] == pytest.approx(per_event / bare, abs=0.011)
    # the count repeats: a second import-only child executes the same instructions, within a hundred
    again, _ = _callgrind(["none", "small-masked"], progress=False)
    assert abs(again - counted["import_only_instructions"]) <= 100, (again, counted["import_only_instructions"])


def test_bench_instructions_without_valgrind_is_one_line_exit_2(capsys, monkeypatch):
    monkeypatch.setattr("hbmsim.scenarios.bench.shutil.which", lambda name: None)
    code, out, err = run_cli(capsys, "bench", "--experiment", "small-masked", "--instructions")
    assert code == 2 and out == ""
    assert err.strip() == ("hbmsim: error: bench --instructions: valgrind not found on PATH (Debian's package "
                           "valgrind counts the instructions)")
