"""Sweeps on a Dask cluster and results that survive: parallel equals serial, a rerun with
--resume skips what is done (even after a record cut short), a worker killed mid-sweep loses and
duplicates nothing."""
import json
import os
import signal

import pytest

from hbmsim.scenarios.cli import main
from hbmsim.scenarios.experiment import EXPERIMENTS_DIR, load_experiment
from hbmsim.scenarios.runner import prepare
from hbmsim.scenarios.sweep import ResultsLog, run_sweep

SAME = ("algorithm", "pass", "time_s", "tensors", "matmul_flops", "vector_flops", "workload")


def runs(path):
    return [{k: r[k] for k in SAME} for r in json.loads(path.read_text())["runs"]]


def test_parallel_equals_serial_in_the_experiments_order(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["run", "small-masked", "--count-only", "--json", str(a), "--quiet"]) == 0
    assert main(["run", "small-masked", "--count-only", "--json", str(b), "--workers", "2", "--quiet"]) == 0
    assert runs(a) == runs(b) and len(runs(a)) == 9


def test_resume_skips_what_is_done(tmp_path, capsys):
    full, log, out = tmp_path / "full.json", tmp_path / "r.jsonl", tmp_path / "out.json"
    assert main(["run", "small-masked", "--count-only", "--json", str(full), "--quiet"]) == 0
    assert main(["run", "small-masked", "--count-only", "--results", str(log), "--quiet"]) == 0
    lines = log.read_text().splitlines()
    assert len(lines) == 3
    log.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])     # killed while writing record 2
    assert main(["run", "small-masked", "--count-only", "--results", str(log), "--quiet"]) == 2
    assert "exists: pass --resume" in capsys.readouterr().err
    assert main(["run", "small-masked", "--count-only", "--results", str(log), "--resume", "--json", str(out),
                 "--quiet"]) == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(r["index"] for r in records) == [0, 1, 2]                 # nothing lost, nothing twice
    assert runs(out) == runs(full)
    assert main(["run", "small-masked", "--count-only", "--resume", "--quiet"]) == 2
    assert "--resume needs --results" in capsys.readouterr().err


def test_a_worker_killed_mid_sweep_loses_and_duplicates_nothing(tmp_path):
    from distributed import LocalCluster
    exp = prepare(load_experiment(EXPERIMENTS_DIR / "demo.toml"))
    serial = run_sweep(exp, count_only=True)
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    killed = []

    def kill_one(results):
        if not killed:
            nanny = next(iter(cluster.workers.values()))
            killed.append(nanny.process.process.pid)
            os.kill(killed[0], signal.SIGKILL)
    try:
        log = ResultsLog(tmp_path / "r.jsonl")
        got = run_sweep(exp, count_only=True, scheduler=cluster.scheduler_address, log=log, on_result=kill_one)
    finally:
        cluster.close()
    assert killed
    key = lambda r: (r["algorithm"], r["pass"], r["workload"]["seq_len_q"], r["time_s"], r["hbm_read_bytes"])
    assert [key(r) for r in got] == [key(r) for r in serial]
    indices = [json.loads(line)["index"] for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted(indices) == list(range(len(exp.configs)))


@pytest.mark.parametrize("extra, message", [
    (["--workers", "2", "--timeline", "t.json"], "--timeline records configurations run here"),
    (["--scheduler", "tcp://127.0.0.1:9"], "--scheduler tcp://127.0.0.1:9: cannot connect"),
])
def test_bad_sweep_options_are_one_line(tmp_path, capsys, monkeypatch, extra, message):
    from hbmsim.scenarios import sweep
    monkeypatch.setattr(sweep, "CONNECT_TIMEOUT_S", 1)
    extra = [str(tmp_path / e) if e.endswith(".json") else e for e in extra]
    assert main(["run", "small-masked", "--count-only", "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_ctrl_c_mid_sweep_keeps_a_valid_file_and_resume_finishes(tmp_path):
    from distributed import LocalCluster
    exp = prepare(load_experiment(EXPERIMENTS_DIR / "demo.toml"))
    log = ResultsLog(tmp_path / "r.jsonl")
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)

    def interrupt(results):
        raise KeyboardInterrupt            # as Ctrl-C would, once the first configuration arrived
    try:
        with pytest.raises(KeyboardInterrupt):
            run_sweep(exp, count_only=True, scheduler=cluster.scheduler_address, log=log, on_result=interrupt)
        kept = log.done()
        assert len(kept) == 1                                     # written whole before the interrupt
        finished = run_sweep(exp, count_only=True, scheduler=cluster.scheduler_address, log=log)
    finally:
        cluster.close()
    assert len(log.done()) == len(exp.configs)
    assert [r["time_s"] for r in finished] == [r["time_s"] for r in run_sweep(exp, count_only=True)]
