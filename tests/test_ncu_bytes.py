"""scripts/ncu_dram_bytes.py: predicted DRAM bytes against Nsight Compute's, kernel group by
kernel group, each kernel from an empty L2 as Nsight's cache control leaves it."""
import importlib.util
import json
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parent.parent / "scripts" / "ncu_dram_bytes.py"
_spec = importlib.util.spec_from_file_location("ncu_dram_bytes", PATH)
ncu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu)

MB64 = 4 * 32 * 4096 * 64 * 2          # one of Q, K, V, O at N = 4096, head dim 64 (batch 4, 32 heads), fp16


@pytest.mark.parametrize("name, want", [
    ("ncu-fa2-64-forward.csv", ("flash2", 4, 32, 4096, 64, False, "forward")),
    ("ncu-fa2-128-4096-true-forward.csv", ("flash2", 4, 16, 4096, 128, True, "forward")),
    ("n-pytorch-128-16384-backward.csv", ("standard", 1, 16, 16384, 128, False, "backward")),
    ("n-pytorch-128-8192-causal-forward.csv", ("standard", 2, 16, 8192, 128, True, "forward")),
])
def test_the_file_names_give_the_configurations(name, want):
    r = ncu.run_of(name, "h100-sxm5-80gb")
    w = r["workload"]
    assert (r["algorithm"], w["batch"], w["heads"], w["seq_len"], w["head_dim"], w["causal"], r["ncu_pass"]) == want
    assert ncu.run_of("ncu-micro-ex2_loop.csv", "h100-sxm5-80gb") is None


def test_groups_by_hand():
    """The FA2 backward's three kernels against three rows (MB): each group its own kernel."""
    run = ncu.run_of("ncu-fa2-64-backward.csv", "h100-sxm5-80gb")
    rows = [{"name": n, "dram__bytes_read.sum": r, "dram__bytes_write.sum": w} for n, r, w in (
        ("void flash_bwd_dot_do_o_kernel<1>", 134, 115),
        ("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 408, 263),
        ("void flash_bwd_convert_dq_kernel", 134, 53))]
    predicted = {"flash2_bwd_dot_do_o": (134, 84), "flash2_bwd": (403, 236), "flash2_bwd_convert_dq": (134, 15)}
    assert ncu.compare(run, rows, predicted) == [("dO.O (preprocess)", 134, 134, 84, 115),
                                                 ("dQ dK dV", 403, 408, 236, 263), ("convert dQ", 134, 134, 15, 53)]


def test_the_fa2_forward_reads_q_k_v_once_from_an_empty_l2():
    """FA2's forward at N = 4096 (head dim 64), from an empty L2: K/V tiles reused across query
    blocks hit the L2, so DRAM reads are Q, K and V once (3 x 64 MiB; Nsight: 201.6 MB); O and
    lse are written, part of them still dirty in the L2 at the kernel's end."""
    run = ncu.run_of("ncu-fa2-64-forward.csv", "h100-sxm5-80gb")
    (read, write), = ncu.predicted_bytes(run, "test").values()
    assert read == 3 * MB64
    assert 0 < write < MB64 + 4 * 32 * 4096 * 4


def test_a_bad_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "h100-ncu-bad.json"
    bad.write_text(json.dumps({"runs": [{"file": "ncu-fa2-64-forward.csv", "kernels": [
        {"name": "flash_fwd_kernel", "dram__bytes_read.sum": float("nan"), "dram__bytes_write.sum": 1.0}]}]}))
    assert ncu.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("runs[0].kernels[0].dram__bytes_read.sum = nan must be a number >= 0")
    bad.write_text(json.dumps({"runs": [{"file": "ncu-fa2-64-forward.csv"}]}))
    assert ncu.main([str(bad)]) == 2
    assert capsys.readouterr().err.strip().endswith("runs[0] needs a 'file' name and a list of 'kernels'")
    bad.write_text(json.dumps({"runs": [{"file": "ncu-fa2-64-forward.csv", "kernels": [{"dram__bytes_read.sum": 1}]}]}))
    assert ncu.main([str(bad)]) == 2
    assert capsys.readouterr().err.strip().endswith("runs[0].kernels[0] needs a 'name'")
    other = tmp_path / "a100-ncu.json"
    other.write_text("{}")
    assert ncu.main([str(other)]) == 2
    assert "not an ncu kernels file" in capsys.readouterr().err


def test_one_run_printed_and_plotted(tmp_path, capsys):
    """A file of one FA2 forward row (Nsight's measured 201.6 MB read, 70.3 MB written): the row's
    line, the summary, and the plot; a plot path that is a folder is one line, exit 2."""
    f = tmp_path / "h100-ncu-one.json"
    f.write_text(json.dumps({"runs": [{"file": "ncu-fa2-64-forward.csv", "kernels": [
        {"name": "void flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>",
         "dram__bytes_read.sum": 201588992.0, "dram__bytes_write.sum": 70313472.0}]}]}))
    png = tmp_path / "bytes.png"
    assert ncu.main([str(f), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "ncu-fa2-64-forward.csv: forward" in out and "201.3    201.6   -0.1%" in out
    assert "DRAM read bytes: 1 kernel groups" in out and png.stat().st_size > 10_000
    assert ncu.main([str(f), "--plot", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
