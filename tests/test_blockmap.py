"""Block-size maps: every cell's bytes from the run's counters (equal to the closed forms), the
cells whose blocks do not fit SRAM marked with the reason, a figure and a JSON file."""
import json

import pytest

from hbmsim.algorithms import io_formulas as F
from hbmsim.algorithms.workload import Workload
from hbmsim.scenarios import blockmap
from hbmsim.scenarios.cli import main


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
