"""Nothing is lost and nothing starts blind: every sweep point and output path is checked before
simulating, results are written as they finish, an error or Ctrl-C keeps them, and a large
sweep says how large it is before it starts."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hbmsim.algorithms import io_formulas as F
from hbmsim.algorithms.workload import Workload
from hbmsim.scenarios import runner
from hbmsim.scenarios.cli import build_parser, main
from hbmsim.simulator import HbmsimError

from test_cli import GOOD, run_cli, scenario

SWEEP = GOOD + "[sweep]\nseq_len = [64, 128, 256]\n"


def hbmsim_lines(err: str) -> list:
    """stderr lines that the command itself says (progress lines start with '[' or the name)."""
    return [line for line in err.splitlines() if line.startswith("hbmsim")]


def test_sweep_with_one_bad_point_refuses_before_simulating(tmp_path, capsys, monkeypatch):
    text = GOOD.replace("head_dim = 32", "head_dim = 128").replace("seq_len = 64", "seq_len = 1024") + \
        "[sweep]\nblock_kv = [32, 64, 512]\n"
    monkeypatch.setattr(runner, "simulate", lambda *a, **k: pytest.fail("simulated before checking every point"))
    out_json = tmp_path / "r.json"
    code, out, err = run_cli(capsys, "run", scenario(tmp_path, text), "--json", str(out_json))
    assert code == 2 and out == "" and not out_json.exists()
    # Q tile + K and V tiles: (32 + 2 * 512) rows of 128 fp16 values = 270336 bytes
    assert err.strip().splitlines() == [
        f"hbmsim: error: {tmp_path / 'exp.toml'} [[runs]] #1 (sweep block_kv=512): block_q = 32, block_kv = 512: "
        "kernel flash2_fwd: a block needs 270336 bytes of SRAM, more than sram_bytes_per_sm = 166912 on "
        "a100-sxm4-40gb"]


def test_sweep_point_over_hbm_capacity_refuses_before_simulating(tmp_path, capsys, monkeypatch):
    text = GOOD.replace('algorithm = "flash2"\nblock_q = 32\nblock_kv = 32', 'algorithm = "standard"') + \
        "[sweep]\nseq_len = [64, 131072]\n"
    monkeypatch.setattr(runner, "simulate", lambda *a, **k: pytest.fail("simulated before checking every point"))
    code, out, err = run_cli(capsys, "run", scenario(tmp_path, text))
    # standard keeps S and P (2 x 2 heads x 131072^2 x 2 bytes = 137 GB, plus Q, K, V, O) in HBM
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "(sweep seq_len=131072)" in err and "HBM footprint 137489285120 bytes exceeds hbm_capacity_bytes = " \
        "40000000000 on a100-sxm4-40gb" in err


def test_bad_sweep_point_of_a_hardware_field_names_it(tmp_path, capsys):
    code, _, err = run_cli(capsys, "run", scenario(tmp_path, GOOD + "[sweep]\nsram_bytes_per_sm = [65536, -1]\n"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "(sweep sram_bytes_per_sm=-1) [sweep]: field 'sram_bytes_per_sm' = -1 must be > 0" in err


def test_hardware_fields_and_presets_can_be_swept(tmp_path, capsys):
    text = GOOD.replace("block_q = 32\nblock_kv = 32", "") + \
        '[sweep]\nhardware = ["a100-sxm4-40gb", "h100-sxm5-80gb"]\nsram_bytes_per_sm = [16384, 65536]\n'
    code, out, _ = run_cli(capsys, "run", scenario(tmp_path, text), "--json", "-")
    runs = json.loads(out)["runs"]
    assert code == 0
    assert [(r["hardware"], r["hardware_sweep"]["sram_bytes_per_sm"]) for r in runs] == [
        ("a100-sxm4-40gb", 16384), ("a100-sxm4-40gb", 65536), ("h100-sxm5-80gb", 16384), ("h100-sxm5-80gb", 65536)]
    # auto blocks: the FA2 kernel's 128 x 128 for head dim 32, clipped to N = 64; they fit 16 KiB
    assert [(r["block_q"], r["block_kv"]) for r in runs] == [(64, 64)] * 4
    code, out, _ = run_cli(capsys, "run", scenario(tmp_path, text))
    assert "hardware" in out.splitlines()[1] and "h100-sxm5-80gb sram_bytes_per_sm=16384" in out


def test_block_longer_than_the_sequence_is_clamped_and_said(tmp_path, capsys):
    text = GOOD.replace("block_q = 32", "block_q = 100").replace("block_kv = 32", "block_kv = 500")
    code, out, err = run_cli(capsys, "run", scenario(tmp_path, text), "--json", "-")
    r = json.loads(out)["runs"][0]
    assert code == 0 and (r["block_q"], r["block_kv"]) == (64, 64)
    assert r["notes"] == ["block_q = 100 is longer than seq_len_q = 64: clamped to 64",
                          "block_kv = 500 is longer than seq_len_kv = 64: clamped to 64"]
    assert hbmsim_lines(err) == [f"hbmsim: note: {tmp_path / 'exp.toml'} [[runs]] #1: {n}" for n in r["notes"]]
    # one query block of 64 rows: K and V read once, and the SRAM charged is 64 rows' worth
    io = F.flash2_forward_io(Workload(1, 2, 64, 64, 32), 64, 64)
    assert {k: (v["read"], v["write"]) for k, v in r["tensors"].items()} == io
    assert r["sram_peak_bytes"] <= 3 * 64 * 32 * 2 * 8


@pytest.mark.parametrize("argv_tail, message", [
    (["--plot", "fig.txt"], "plot path 'fig.txt': suffix '.txt' is not a format matplotlib can write"),
    (["--plot", "{dir}"], "plot path '{dir}' is a directory"),
    (["--json", "{dir}/r.json", "--plot", "{dir}/p.png"], None),         # fine: the folder exists
    (["--json", "{dir}/f/r.json", "--plot", "{dir}/f/p.png"],            # no folder is made unasked
     "--json '{dir}/f/r.json': the folder '{dir}/f' does not exist (make it first)"),
    (["--json", "{file}/r.json"], "--json '{file}/r.json': '{file}' is a file, not a folder"),
])
def test_outputs_are_checked_before_simulating(tmp_path, capsys, monkeypatch, argv_tail, message):
    (tmp_path / "afile").write_text("x")
    fill = lambda s: s.format(dir=tmp_path, file=tmp_path / "afile")
    if message is None:
        code, _, _ = run_cli(capsys, "run", scenario(tmp_path, GOOD), *map(fill, argv_tail))
        assert code == 0 and (tmp_path / "r.json").exists() and (tmp_path / "p.png").exists()
        return
    monkeypatch.setattr(runner, "simulate", lambda *a, **k: pytest.fail("simulated before checking the outputs"))
    code, out, err = run_cli(capsys, "run", scenario(tmp_path, GOOD), *map(fill, argv_tail))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and fill(message) in err
    assert not (tmp_path / "fig.png").exists() and not (tmp_path / "f").exists()


def _failing_after(n_ok: int, exc):
    real = runner.run_config
    calls = [0]

    def run_config(cfg, *a, **k):
        calls[0] += 1
        if calls[0] > n_ok:
            raise exc
        return real(cfg, *a, **k)
    return run_config


@pytest.mark.parametrize("exc, code, line", [
    (HbmsimError("boom"), 2,
     "hbmsim: error: boom (stopped after 1 of 3 configurations; the finished ones are in {json})"),
    (KeyboardInterrupt(), 130, "hbmsim: interrupted after 1 of 3 configurations; the finished ones are in {json}"),
])
def test_error_or_interrupt_keeps_finished_results(tmp_path, capsys, monkeypatch, exc, code, line):
    monkeypatch.setattr(runner, "run_config", _failing_after(1, exc))
    out_json = tmp_path / "r.json"
    got, out, err = run_cli(capsys, "run", scenario(tmp_path, SWEEP), "--json", str(out_json))
    assert got == code
    assert hbmsim_lines(err) == [line.format(json=out_json)]
    doc = json.loads(out_json.read_text())
    assert doc["complete"] is False and "after 1 of 3 configurations" in doc["stopped"]
    assert [r["workload"]["seq_len"] for r in doc["runs"]] == [64]
    assert "(partial: 1 of 3 configurations finished)" in out and "64x64" in out


def test_results_file_grows_as_configurations_finish(tmp_path, capsys, monkeypatch):
    sizes = []
    real = runner.run_config
    out_json = tmp_path / "r.json"

    def spy(cfg, *a, **k):
        if out_json.exists():
            sizes.append(len(json.loads(out_json.read_text())["runs"]))
        return real(cfg, *a, **k)
    monkeypatch.setattr(runner, "run_config", spy)
    code, _, _ = run_cli(capsys, "run", scenario(tmp_path, SWEEP), "--json", str(out_json))
    assert code == 0 and sizes == [1, 2] and json.loads(out_json.read_text())["complete"] is True


def test_ctrl_c_in_a_real_process_leaves_a_valid_file(tmp_path):
    """A real SIGINT, while the second of several half-second configurations runs (simulated
    whole: fast mode would finish them all before the signal lands)."""
    text = (GOOD.replace("heads = 2", "heads = 16")
            .replace("block_q = 32\nblock_kv = 32", "block_q = 16\nblock_kv = 16")
            + "[sweep]\nseq_len = [768, 769, 770, 771, 772, 773, 774, 775]\n")
    out_json = tmp_path / "r.json"
    # (preexec_fn: a shell without job control starts background jobs with SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler: give the child the default back)
    proc = subprocess.Popen([sys.executable, "-m", "hbmsim.scenarios.cli", "run", scenario(tmp_path, text),
                             "--count-only", "--full", "--json", str(out_json)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not out_json.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = hbmsim_lines(err)
    assert len(lines) == 1 and lines[0].startswith("hbmsim: interrupted after ") and "Traceback" not in err
    doc = json.loads(out_json.read_text())
    assert doc["complete"] is False and 1 <= len(doc["runs"]) < 8


def test_large_sweep_says_its_size_and_needs_yes(tmp_path, capsys):
    text = GOOD + "[sweep]\n" + f"seq_len = {list(range(1, 41))}\nhead_dim = {list(range(1, 31))}\n"
    code, out, err = run_cli(capsys, "run", scenario(tmp_path, text))
    assert code == 2 and err.strip().splitlines() == [
        f"hbmsim: error: {tmp_path / 'exp.toml'}: 1,200 configurations (more than 1,000): pass --yes to simulate "
        "them all, or narrow the [sweep]"]


def test_long_estimate_needs_yes(tmp_path, capsys, monkeypatch):
    text = GOOD.replace("seq_len = 64", "seq_len = 4194304").replace("block_q = 32\nblock_kv = 32", "")
    monkeypatch.setattr(runner, "simulate", lambda *a, **k: pytest.fail("started without --yes"))
    # simulated whole (--full) it is estimated at over an hour; fast mode takes 128 steps a block
    code, _, err = run_cli(capsys, "run", scenario(tmp_path, text), "--count-only", "--full")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "1 configuration(s), estimated" in err and "pass --yes to start" in err


def test_estimate_is_printed_before_long_work(tmp_path, capsys, monkeypatch):
    code, _, err = run_cli(capsys, "run", scenario(tmp_path, SWEEP), "--count-only")
    assert code == 0 and "roughly" not in err                 # short work: no estimate line
    monkeypatch.setattr(runner, "WALL_S_PER_STEP", 1.0)       # as if each tile step took a second
    code, _, err = run_cli(capsys, "run", scenario(tmp_path, SWEEP), "--count-only")
    # flash2 32x32 blocks, 2 heads: 2 x (2x2 + 4x4 + 8x8) = 168 tile steps
    assert code == 0 and err.splitlines()[0] == ("t: 3 configuration(s), roughly 3 min of simulation "
                                                  "(estimated; fast mode may fold it to much less)")


@pytest.mark.parametrize("override, message", [
    ("matmul_flops_per_s = 1.04e-322",
     "field 'matmul_flops_per_s' = 1.04e-322 must be 0 or at least 2.2250738585072014e-308"),
    ("sram_bytes_per_s_per_sm = 1.89e-321", "field 'sram_bytes_per_s_per_sm' = 1.89e-321 must be 0 or at least"),
    ("matmul_flops_per_s = 1e-306", "field 'matmul_flops_per_s' = 1e-306 is too small: split over sm_count = 108 SMs"),
])
def test_subnormal_rates_are_refused_up_front(tmp_path, capsys, override, message):
    code, out, err = run_cli(capsys, "run", scenario(tmp_path, GOOD + f"[hardware_overrides]\n{override}\n"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err


def test_huge_shapes_are_refused_before_building_anything(tmp_path, capsys):
    text = GOOD.replace("batch = 1", "batch = 1000000").replace("seq_len = 64", "seq_len = 2147483648")
    t0 = time.perf_counter()
    code, _, err = run_cli(capsys, "run", scenario(tmp_path, text))
    assert code == 2 and time.perf_counter() - t0 < 5 and len(err.strip().splitlines()) == 1
    # 2e6 batch-heads x 4 x 2^31 rows x 32 x 2 bytes
    assert f"Q, K, V and O alone need {2_000_000 * 4 * 2**31 * 32 * 2} bytes of HBM" in err


def test_table_shows_dtype_and_masks(tmp_path, capsys):
    text = GOOD.replace("head_dim = 32", 'head_dim = 32\ndtype = "bf16"\ncausal = true\ndropout = 0.1')
    code, out, _ = run_cli(capsys, "run", scenario(tmp_path, text), "--count-only")
    head, _, row = out.splitlines()[1:4]
    assert head.split()[7:9] == ["dtype", "masks"] and row.split()[5:7] == ["bf16", "causal+drop0.1"]


def test_version_and_help_texts(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("hbmsim 0.")
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in subparsers.items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"hbmsim {name}: argument {action.dest} has no help text"


def test_profile_of_a_missing_experiment_says_not_found(capsys):
    code, _, err = run_cli(capsys, "profile", "no-such-experiment")
    assert code == 2 and "experiment 'no-such-experiment' not found" in err


def test_run_of_a_folder_says_folder(tmp_path, capsys):
    code, _, err = run_cli(capsys, "run", str(tmp_path))
    assert code == 2 and err == f"hbmsim: error: experiment '{tmp_path}' is a folder: give an experiment TOML file " \
        "or a shipped experiment's name\n"


def test_closed_pipe_is_quiet(tmp_path):
    """`hbmsim ... | head`: no 'Broken pipe' message, no traceback."""
    proc = subprocess.run(f"{sys.executable} -m hbmsim.scenarios.cli run small-masked --count-only --json - "
                          "| head -c 20",
                          shell=True, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "0"})
    assert proc.stdout == '{\n "experiment": "sm'
    assert "Broken pipe" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_folder_named_like_a_shipped_experiment_does_not_shadow_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "small-masked").mkdir()
    (tmp_path / "demo").mkdir()
    code, out, _ = run_cli(capsys, "run", "small-masked", "--count-only")
    assert code == 0 and "small-masked on a100-sxm4-40gb" in out
