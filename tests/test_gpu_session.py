"""scripts/gpu_session.py, the prepared run of every measurement a lent GPU owes the issues: each of
its commands parses against today's command lines, the budget decides what runs, and every file
it ships is one its commands write."""
import importlib.util
import sys
from pathlib import Path

import pytest

from hbmsim.kernels import icache, library, microbench, store_retention
from hbmsim.scenarios.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gpu_session", ROOT / "scripts" / "gpu_session.py")
S = importlib.util.module_from_spec(_spec)
sys.modules["gpu_session"] = S          # (dataclasses look their module up while the class is made)
_spec.loader.exec_module(S)


def _python_part(argv: list) -> list:
    """The `python -m MODULE ...` part of a command (after ncu's own options for a profiled one)."""
    if argv[0] != S.PY:
        assert Path(argv[0]).name == "ncu"          # found on PATH or in CUDA's folders, else the bare name
    i = argv.index(S.PY)
    return argv[i:]


@pytest.mark.parametrize("step", S.STEPS, ids=lambda s: s.name)
def test_every_command_parses_against_todays_cli(step):
    for argv in step.commands:
        cmd = _python_part(S.expand(argv, "/o", "h100"))
        assert cmd[1] == "-m"
        module, rest = cmd[2], cmd[3:]
        if module == "hbmsim.scenarios.cli":
            build_parser().parse_args(rest)                 # exits 2 on an argument it does not know
        elif module == "hbmsim.kernels.library":
            args = library.parser().parse_args(rest)
            assert all(i in library.IMPLEMENTATIONS for i in args.impl or ())
        elif module == "hbmsim.kernels.microbench":
            microbench.parser().parse_args(rest)
        elif module == "hbmsim.kernels.icache":
            icache.parser().parse_args(rest)
        elif module == "hbmsim.kernels.store_retention":
            store_retention.parser().parse_args(rest)
            if argv[0] == "ncu":                         # the metrics the summary reads
                assert argv[argv.index("--metrics") + 1] == store_retention.METRICS
        else:
            assert module == "pytest" and rest[:2] == ["-m", "gpu"]


def test_the_files_shipped_are_the_files_written():
    for step in S.STEPS:
        written = {a for argv in step.commands for a in S.expand(argv, "/o", "h100") if a.startswith("/o/")}
        for src, dst in step.ship:
            assert "/o/" + src.format(gpu="h100") in written, (step.name, src)
            assert dst.startswith("scenarios/measured/") and dst.format(gpu="h100").endswith(".json")


def test_the_order_and_the_budgets_split():
    names = [s.name for s in S.STEPS]
    assert names[:2] == ["gpu-tests", "host"]              # the cheapest checks of the most first
    steps, split = S.plan(None, sum(s.limit_s for s in S.STEPS))
    assert [s.name for s in steps] == names and {when for _, when in split} == {"sure"}
    # 540 s: the limits fit for the first three (150 + 120 + 240 = 510); the rest run if those end early
    steps, split = S.plan(None, 540)
    assert [(s.name, when) for s, when in split][2:4] == [("one-wave", "sure"), ("many-waves", "if time is left")]
    # --only: the order it names, each once
    steps, split = S.plan(["decode", "host", "decode"], 200)
    assert [(s.name, when) for s, when in split] == [("decode", "if time is left"), ("host", "if time is left")]
    steps, _ = S.plan(["host", "decode"], 400)
    assert [s.name for s in steps] == ["host", "decode"]


def test_the_clock_decides_what_runs(tmp_path, monkeypatch):
    """A step gets min(its limit, the budget left); under MIN_STEP_S left, the rest are left out."""
    ran = []
    monkeypatch.setattr(S, "gpu_prefix", lambda: "h100")
    monkeypatch.setattr(S.subprocess, "run", lambda *a, **k: None)      # (the install check)
    clock = iter([0.0, 0.0, 100.0, 190.0])          # start; step 1 at 0; step 2 at 100; step 3 at 190
    monkeypatch.setattr(S.time, "monotonic", lambda: next(clock, 190.0))
    monkeypatch.setattr(S, "run_step", lambda step, out, gpu, log, left_s: ran.append((step.name, left_s)) or
                        {"step": step.name, "status": "ok", "wall_s": 0})
    assert S.main(["--out", str(tmp_path), "--budget-s", "210", "--only", "host", "decode", "grid-tc"]) == 1
    assert ran == [("host", 210.0), ("decode", 110.0)]
    doc = __import__("json").loads((tmp_path / "gpu_session.json").read_text())
    assert doc["left_out"] == ["grid-tc"] and "grid-tc: left out (20 s of the budget left)" in (
        tmp_path / "gpu_session.log").read_text()


def test_dry_run_prints_the_plan(capsys):
    assert S.main(["--out", "OUT", "--dry-run", "--budget-s", "400"]) == 0
    text = capsys.readouterr().out
    assert "host (up to 120 s, sure): issue 23" in text and "microbench --out OUT/GPU-host.json" in text
    assert "ship GPU-host.json -> scenarios/measured/GPU-host.json" in text
    assert "grid-tc (up to 300 s, if time is left)" in text


def test_a_step_that_cannot_run_is_logged_and_the_next_runs(tmp_path):
    """A missing tool (here a command that does not exist) fails its step, not the session."""
    step = S.Step("missing", 10, (("/nonexistent/tool", "x"),), "nothing")
    with open(tmp_path / "log", "w") as log:
        r = S.run_step(step, tmp_path, "h100", log)
    assert r["status"].startswith("failed (not run:") and r["commands"][0]["argv"] == ["/nonexistent/tool", "x"]
    ok = S.Step("true", 10, ((S.PY, "-c", "open('{out}/made.txt', 'w').write('{gpu}')"),), "a file")
    with open(tmp_path / "log", "a") as log:
        r = S.run_step(ok, tmp_path, "h200", log)
    assert r["status"] == "ok" and "made.txt" in r["files"] and (tmp_path / "made.txt").read_text() == "h200"


@pytest.mark.parametrize("budget", ["-5", "0", "nan", "ten"])
def test_a_bad_budget_is_one_line(budget, capsys):
    with pytest.raises(SystemExit) as exit_:
        S.main(["--out", "OUT", "--dry-run", "--budget-s", budget])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --budget-s:" in err and "Traceback" not in err
