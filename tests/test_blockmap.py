"""Block-size maps: every cell's bytes from the run's counters (equal to the closed forms), the
cells whose blocks do not fit SRAM marked with the reason, a figure and a JSON file."""
import json

import pytest

from hbmsim.algorithms import io_formulas as F
from hbmsim.algorithms.workload import Workload
from hbmsim.scenarios import blockmap
from hbmsim.scenarios.cli import main
from hbmsim.simulator import HbmsimError


def test_cells_equal_the_closed_forms_and_misfits_are_marked(a100):
    wl = Workload(1, 2, 512, 512, 128)
    cells = blockmap.block_map(a100, wl, "flash2", (64, 256))
    assert [(c.block_q, c.block_kv) for c in cells] == [(64, 64), (64, 256), (256, 64), (256, 256)]
    big = cells[-1]      # (256 + 2 x 256) x 128 x 2 B = 196,608 B > 166,912 B of SRAM per SM
    assert big.time_s is None and "196608 bytes of SRAM, more than sram_bytes_per_sm = 166912" in big.reason
    for c in cells[:-1]:
        io = F.flash2_forward_io(wl, c.block_q, c.block_kv)
        assert c.l2_side_bytes == sum(r + w for r, w in io.values())
        assert c.time_s > 0 and 0 < c.dram_bytes <= c.l2_side_bytes
    # a bigger query block re-reads K and V fewer times
    assert cells[2].l2_side_bytes < cells[0].l2_side_bytes


def test_cli_writes_table_json_and_figure(tmp_path, capsys):
    png, out = tmp_path / "m.png", tmp_path / "m.json"
    assert main(["blockmap", "--seq-len", "256", "--heads", "2", "--head-dim", "128", "--sizes", "64,256",
                 "--plot", str(png), "--json", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "does not fit: a block needs 196608 bytes of SRAM" in text and "predicted by hbmsim" in text
    doc = json.loads(out.read_text())
    assert doc["source"] == "predicted" and len(doc["cells"]) == 4
    assert png.stat().st_size > 10000


@pytest.mark.parametrize("sizes", ["64,x", "0,64", ""])
def test_bad_sizes_are_one_line(sizes, capsys):
    assert main(["blockmap", "--sizes", sizes, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--sizes" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, said", [
    (["--algorithm", "flash9"], "blockmap: --algorithm = 'flash9' must be one of flash1, flash2"),
    (["--algorithm", "standard"], "blockmap: --algorithm = 'standard' has no block_q x block_kv to map"),
    (["--heads", "2000", "--seq-len", "65536"],
     "--heads 2000 --seq-len 65536 --head-dim 64 --dtype fp16: Q, K, V and O alone need 67,108,864,000 bytes of HBM, "
     "more than hbm_capacity_bytes = 40,000,000,000"),
    (["--head-dim", "2048", "--dtype", "fp32", "--seq-len", "256", "--sizes", "32,16"],
     "no cell of --sizes 32,16 fits, the smallest neither: block_q = 16, block_kv = 16: kernel flash2_fwd: a block "
     "needs 393216 bytes of SRAM, more than sram_bytes_per_sm = 166912"),
    (["--seq-len", "262144", "--full"], "h of simulation on this machine (more than 60 min): pass --yes to start"),
])
def test_refused_before_any_simulation_in_one_line(argv, said, capsys, monkeypatch):
    monkeypatch.setattr(blockmap, "simulate", lambda *a, **k: pytest.fail("simulated"))
    assert main(["blockmap", *argv]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and said in cap.err and len(cap.err.strip().splitlines()) == 1, cap.err


def test_library_refuses_a_program_without_blocks(a100):
    with pytest.raises(HbmsimError, match="'standard' has no block_q x block_kv"):
        blockmap.block_map(a100, Workload(1, 1, 128, 128, 64), "standard", (64,))


def test_fast_by_default_full_on_request_and_quiet_off_a_terminal(tmp_path, capsys, monkeypatch):
    """Fast mode is the default (as in `hbmsim run`), --full simulates whole; a long map says its
    estimate first; progress never reaches a pipe; the JSON says which mode ran."""
    seen = []
    real = blockmap.run_config
    monkeypatch.setattr(blockmap, "run_config", lambda cfg, **kw: seen.append(kw["fast"]) or real(cfg, **kw))
    monkeypatch.setattr(blockmap, "estimated_wall_s", lambda cfg, fast=False: 3.0)     # over 2 s: said
    out = tmp_path / "m.json"
    argv = ["blockmap", "--seq-len", "256", "--heads", "2", "--sizes", "64", "--json", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "blockmap: 1 cell(s) to simulate, roughly at most 3 s" in err and "%|" not in err
    assert seen == [True] and json.loads(out.read_text())["fast"] is True
    assert main(argv + ["--full", "--quiet"]) == 0
    assert capsys.readouterr().err == "" and seen == [True, False] and json.loads(out.read_text())["fast"] is False


def test_fast_mode_folds_a_long_map_and_says_so(a100):
    """N = 65536: fast mode simulates a few % of the blocks; L2-side bytes stay exact."""
    wl = Workload(1, 16, 65536, 65536, 64)
    cells = blockmap.block_map(a100, wl, "flash2", (128,))
    c = cells[0]
    assert 0 < c.simulated_fraction < 0.5
    io = F.flash2_forward_io(wl, 128, 128)
    assert c.l2_side_bytes == sum(r + w for r, w in io.values())
    assert "fast mode: 1 of 1 cells simulated" in blockmap.fast_note(cells)


def test_a_map_estimated_over_an_hour_needs_yes(capsys, monkeypatch):
    """In fast mode the estimate is an upper bound (folding is decided while simulating): said so."""
    monkeypatch.setattr(blockmap, "estimated_wall_s", lambda cfg, fast=False: 200.0)
    monkeypatch.setattr(blockmap, "simulate", lambda *a, **k: pytest.fail("simulated"))
    assert main(["blockmap", "--seq-len", "1024"]) == 2
    err = capsys.readouterr().err
    assert "25 cell(s) that fit, estimated at most 83 min of simulation on this machine (more than 60 min; fast " \
           "mode folds steady launches, often to far less): pass --yes to start" in err
    assert len(err.strip().splitlines()) == 1


# ---- blockmap --measured: a measured or emulated block-grid file against the prediction ----

from hbmsim.scenarios import blockmap_measured as M      # noqa: E402


def test_spearman_by_hand_with_ties():
    """x = 1, 2, 2, 3 has average ranks 1, 2.5, 2.5, 4; y = 10, 30, 20, 40 ranks 1, 3, 2, 4.
    Centred: (-1.5, 0, 0, 1.5) and (-1.5, 0.5, -0.5, 1.5); covariance sum 4.5, squares 4.5 and 5:
    rho = 4.5 / sqrt(4.5 x 5) = sqrt(0.9)."""
    assert list(M.average_ranks([3, 1, 3, 2])) == [3.5, 1.0, 3.5, 2.0]
    assert M.spearman([1, 2, 2, 3], [10, 30, 20, 40]) == pytest.approx(0.9 ** 0.5, abs=1e-12)
    assert M.spearman([1, 2, 3], [9, 5, 1]) == pytest.approx(-1.0)
    assert M.spearman([1, 1, 1], [1, 2, 3]) != M.spearman([1, 1, 1], [1, 2, 3])    # NaN: constant side
    # pred ranks 4, 3, 2, 1 and measured 1, 4, 3, 2: d = 3, -1, -1, -1, 1 - 6 x 12 / (4 x 15) = -0.2
    assert M.spearman([4, 3, 2, 1], [1.0, 1.2, 1.1, 1.05]) == pytest.approx(-0.2)


def test_regret_by_hand():
    # predicted best is the 4th (1): measured 1.05 against the measured best 1.0: 5%
    assert M.regret([4, 3, 2, 1], [1.0, 1.2, 1.1, 1.05]) == pytest.approx(0.05)
    # a tie for the predicted best counts the worse measured of the two: 3 / 1 - 1
    assert M.regret([1, 1, 2], [2, 3, 1]) == pytest.approx(2.0)
    assert M.regret([1, 2], [0, 0]) == 0.0 and M.regret([2, 1], [0, 5]) == float("inf")


TINY_GRID = ["--kernel", "flash_attention", "--block-q", "16,32", "--block-kv", "16,32", "--head-dim", "64",
             "--seq-len", "128", "--causal", "false,true", "--batch", "1", "--heads", "2", "--quiet"]


@pytest.fixture(scope="module")
def emulated_grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid") / "grid.json"
    assert main(["profile", "--emulate", *TINY_GRID, "--out", str(out)]) == 0
    return out


def test_measured_map_of_an_emulated_grid(emulated_grid, tmp_path, capsys):
    """The emulated bytes are the predicted bytes, so the L2-side reads rank the same (Spearman 1)
    and the predicted best costs nothing; writes do not depend on the blocks (no ranking: n/a);
    the time and DRAM panels are said to be missing, not drawn."""
    png, js = tmp_path / "m.png", tmp_path / "m.json"
    assert main(["blockmap", "--measured", str(emulated_grid), "--plot", str(png), "--json", str(js), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "8 point(s), emulated on the CPU (the kernel's CPU emulation: bytes only); predicted by hbmsim " \
           "(flash2" in out
    assert "B=1 H=2 N=128 d=64 fp16 causal         L2-side reads        4    1.000     0.0%  32x16 -> 32x16" in out
    assert "L2-side writes       4      n/a     0.0%" in out
    assert "time: not measured (emulated on the CPU)" in out and "DRAM bytes: not in the file" in out
    doc = json.loads(js.read_text())
    assert all(p["predicted"] == p["measured"] for p in doc["points"])
    assert png.stat().st_size > 10000


def _fixture_file(tmp_path) -> str:
    """A hand-made measured grid (a test fixture, not a measurement): one workload, four blocks,
    bytes and times chosen here."""
    runs = []
    for i, (bq, bkv) in enumerate([(16, 16), (16, 32), (32, 16), (32, 32)]):
        runs.append({"algorithm": "flash2", "pass": "forward", "source": "measured", "kernel": "flash_attention",
                     "workload": {"batch": 1, "heads": 2, "seq_len_q": 128, "seq_len_kv": 128, "head_dim": 64,
                                  "dtype": "fp16", "causal": False},
                     "block_q": bq, "block_kv": bkv, "warps": None, "l2_start": "cold",
                     "global_read_bytes": 1000 + i, "global_write_bytes": 500, "hbm_read_bytes": 300,
                     "hbm_write_bytes": 200, "time_s": [1.0e-3, 1.2e-3, 1.1e-3, 1.05e-3][i]})
    doc = {"source": "measured", "kind": "block-grid", "provenance": {"gpu": "TEST FIXTURE (not an H100 run)"},
           "runs": runs}
    p = tmp_path / "fixture.json"
    p.write_text(json.dumps(doc))
    return str(p)


def _predict_4_3_2_1_us(monkeypatch):
    """The prediction of the fixture's four blocks, set here: 4, 3, 2, 1 us, 5 bytes stored each."""
    predicted = {(16, 16): 4e-6, (16, 32): 3e-6, (32, 16): 2e-6, (32, 32): 1e-6}

    def fake_run_config(cfg, **kw):
        p = cfg.run.params
        return [{"global_read_bytes": 10, "global_write_bytes": 5, "hbm_read_bytes": 3, "hbm_write_bytes": 2,
                 "time_s": predicted[p["block_q"], p["block_kv"]]}]
    monkeypatch.setattr(M, "run_config", fake_run_config)


def test_measured_map_rank_correlation_and_regret_by_hand(tmp_path, capsys, monkeypatch):
    """Predicted times 4, 3, 2, 1 us (set here) against measured 1.0, 1.2, 1.1, 1.05 ms: Spearman
    -0.2 and regret 5% (the predicted best, 32x32, measured 1.05 ms against 1.0 ms at 16x16)."""
    _predict_4_3_2_1_us(monkeypatch)
    assert main(["blockmap", "--measured", _fixture_file(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "measured on TEST FIXTURE (not an H100 run); predicted by hbmsim (flash2" in out
    assert "B=1 H=2 N=128 d=64 fp16 L2 cold        time                 4   -0.200     5.0%  32x32 -> 16x16" in out
    assert "time            Spearman min -0.200, median -0.200; regret of the predicted best at most 5.0%" in out


@pytest.mark.parametrize("change, said", [
    ({"time_s": float("nan")}, "runs[2]: field 'time_s' = nan must be a finite number >= 0"),
    ({"hbm_read_bytes": -1}, "runs[2]: field 'hbm_read_bytes' = -1 must be a finite number >= 0"),
    ({"time_s": None}, "runs[2]: field 'time_s' = None must be a finite number >= 0"),
    ({"block_kv": 0}, "runs[2]: field 'block_kv' = 0 must be a whole number >= 1"),
    ({"l2_start": "hot"}, "runs[2]: field 'l2_start' = 'hot' must be 'cold' or 'warm'"),
])
def test_a_bad_measured_file_is_one_line(change, said, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(M, "run_config", lambda *a, **k: pytest.fail("simulated"))
    path = _fixture_file(tmp_path)
    doc = json.loads(open(path).read())
    doc["runs"][2].update(change)
    open(path, "w").write(json.dumps(doc))
    assert main(["blockmap", "--measured", path]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"hbmsim: error: blockmap --measured: {path}: {said}"


def test_a_missing_field_or_a_predicted_file_is_one_line(tmp_path, capsys):
    path = _fixture_file(tmp_path)
    doc = json.loads(open(path).read())
    del doc["runs"][3]["time_s"]
    open(path, "w").write(json.dumps(doc))
    assert main(["blockmap", "--measured", path]) == 2
    assert capsys.readouterr().err.strip().endswith("runs[3]: field 'time_s' is missing (runs[0] has it)")
    doc["source"] = "predicted"
    open(path, "w").write(json.dumps(doc))
    assert main(["blockmap", "--measured", path]) == 2
    assert "field 'source' = 'predicted' must be 'measured' or 'emulated'" in capsys.readouterr().err
    assert main(["blockmap", "--measured", str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.strip().endswith("none.json: no such file")


def test_measured_map_says_which_points_spilled_and_ranks_the_rest(tmp_path, capsys, monkeypatch):
    """A point whose SMs stored 50 bytes where the program stores 5 wrote local memory (register
    spills, which no program models): said, and the summary given again over the other three.
    Predicted 4, 3, 2 us against measured 1.0, 1.2, 1.1 ms: ranks 3, 2, 1 and 1, 3, 2, d = 2, -1,
    -1, Spearman 1 - 6 x 6 / (3 x 8) = -0.5; the predicted best (32x16) 1.1 ms against 1.0: 10%."""
    _predict_4_3_2_1_us(monkeypatch)
    path = _fixture_file(tmp_path)
    doc = json.loads(open(path).read())
    for r, sm in zip(doc["runs"], (5, 5.2, 5, 50)):
        r["global_write_bytes_from_sm"] = sm
    open(path, "w").write(json.dumps(doc))
    assert main(["blockmap", "--measured", path, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert ("register spills: 1 of 4 point(s) stored more from the SMs than the kernel's output (up to 10x the "
            "predicted stores: local memory, which hbmsim does not count); over the other 3:\n") in out
    tail = out[out.index("over the other 3:"):]
    assert "time            Spearman min -0.500, median -0.500; regret of the predicted best at most 10.0%" in tail
    # without the SMs' store counts nothing is said
    assert M.spill_note([M.Point(0, {"global_write_bytes": 1}, {"global_write_bytes": 1})], ["time_s"]) == ""
