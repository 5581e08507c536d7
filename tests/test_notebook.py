"""The notebook (scenarios/notebooks/memory_bound.ipynb) runs from top to bottom, so it never rots;
its outputs are not committed."""
from pathlib import Path

import pytest

# the test extras install them; a machine with only the GPU extras (pytest -m gpu) skips this file
nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOK = Path(__file__).resolve().parents[1] / "scenarios" / "notebooks" / "memory_bound.ipynb"


def test_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def test_runs_top_to_bottom(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                            ).execute()          # raises CellExecutionError on any failing cell or assert
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "l = c l + sum = 1.368" in printed and "(compute-bound)" in printed
    assert (tmp_path / "roofline.png").stat().st_size > 10000 and (tmp_path / "blockmap.png").exists()
