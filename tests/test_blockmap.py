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
