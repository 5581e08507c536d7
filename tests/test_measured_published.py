"""The published timing set's file (scenarios/measured/fa2-paper-fwd-bwd.json) and its documented
rebuild, `python -m hbmsim.scenarios.published CSV`: the conversion of the FlashAttention-2
paper's CSV, byte for byte, with each implementation's program and variant from the one table
(kernels/implementations.py) that the library timings use too."""
import subprocess
import sys
from pathlib import Path

import pytest

from hbmsim.kernels.implementations import IMPLEMENTATIONS, TIMED_HERE
from hbmsim.scenarios.published import FA2_PAPER_FILE, main

CSV = Path(__file__).resolve().parents[2] / "shared" / "published" / "fa2-paper-fwd-bwd.csv"


@pytest.mark.skipif(not CSV.is_file(), reason="../shared/published is not beside this checkout")
def test_the_documented_rebuild_writes_the_shipped_file_byte_for_byte(tmp_path, capsys):
    out = tmp_path / "fa2.json"
    assert main([str(CSV), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes() == FA2_PAPER_FILE.read_bytes()


@pytest.mark.skipif(not CSV.is_file(), reason="../shared/published is not beside this checkout")
def test_the_rebuild_runs_as_its_module(tmp_path):
    out = tmp_path / "fa2.json"
    proc = subprocess.run([sys.executable, "-m", "hbmsim.scenarios.published", str(CSV), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == FA2_PAPER_FILE.read_bytes()


def test_the_rebuild_refuses_a_bad_csv_in_one_line(tmp_path, capsys):
    out = tmp_path / "fa2.json"
    assert main([str(tmp_path / "missing.csv"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "missing.csv" in err and len(err.strip().splitlines()) == 1 and not out.exists()
    bad = tmp_path / "bad.csv"
    bad.write_text("implementation,seq_len\nfa9,512\n")
    assert main([str(bad), "--out", str(out)]) == 2
    assert "'fa9' must be one of fa2, fa1, pytorch" in capsys.readouterr().err and not out.exists()


def test_one_table_maps_implementations_to_programs():
    assert {n: (i.algorithm, i.variant) for n, i in IMPLEMENTATIONS.items()} == {
        "fa2": ("flash2", "fa2-kernel"), "fa1": ("flash1", "fa1-kernel"), "pytorch": ("standard", "pytorch-bench"),
        "cudnn": ("flash3", "cudnn-sm90"), "fa3": ("flash3", "fa3-kernel"),                      # Hopper (issue 26)
        "sdpa-gqa-decode": ("flash2", "fa2-kernel"), "fa2-kvcache": ("flash2", "fa2-kernel")}   # decode (issue 25)
    assert list(TIMED_HERE) == ["fa2", "pytorch", "cudnn", "fa3"]     # fa1 is only in the paper's figures
