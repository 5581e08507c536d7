"""The results table's units and mapping column, with values worked by hand: a figure keeps 3
significant digits in the smallest unit that keeps it under 1000 (1.95 TB, not 1.95e+03 GB;
150 s, not 1.5e+05 ms), and a forward row shows only the forward's blocks."""
import pytest

from hbmsim.scenarios import report

from test_cli import run_cli, scenario


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (999, "999 B"), (1000, "1 KB"), (1234, "1.23 KB"),
    (999_600, "1 MB"),                      # 999.6 KB rounds to 1000 KB: one unit up
    (541_000_000, "541 MB"), (137_489_285_120, "137 GB"),
    (1.95e12, "1.95 TB"),                   # was 1.95e+03 GB
    (2.5e15, "2.5 PB"), (3e18, "3 EB"), (4e21, "4e+03 EB"),    # the last unit takes any figure
])
def test_bytes_switch_units(n, text):
    assert report.fmt_bytes(n) == text


@pytest.mark.parametrize("s, text", [
    (0.0, "0 us"), (5e-7, "0.5 us"), (18.3e-6, "18.3 us"), (999e-6, "999 us"),
    (0.9996e-3, "1 ms"),                    # 999.6 us rounds to 1000 us: one unit up
    (1e-3, "1 ms"), (9.87e-3, "9.87 ms"), (0.999, "999 ms"),
    (1.5, "1.5 s"), (150.0, "150 s"),       # was 1.5e+05 ms
    (2000.0, "33.3 min"),                   # 2000 s / 60
    (72_000.0, "20 h"),                     # 1200 min / 60
])
def test_times_switch_units(s, text):
    assert report.fmt_time(s) == text


def result(pass_name: str, algorithm: str = "flash2", **mapping) -> dict:
    return {"algorithm": algorithm, "pass": pass_name, "hardware": "a100-sxm4-40gb",
            "workload": {"batch": 64, "heads": 16, "seq_len_q": 16384, "seq_len_kv": 16384, "head_dim": 128,
                         "dtype": "fp16"},
            "hbm_read_bytes": 1.95e12, "hbm_write_bytes": 0.9996e9, "global_read_bytes": 1e15,
            "global_write_bytes": 5e14, "hbm_peak_bytes": 541_000_000, "time_s": 150.0, "bound": "memory",
            **mapping}


FLASH2 = dict(block_q=128, block_kv=64, block_q_bwd=64, block_kv_bwd=128, variant="fa2-kernel", warps=4,
              warps_bwd=8)
FA1 = dict(block_q=16, block_kv=128, variant="fa1-kernel", num_splits=29, bwd_parallel=True)


def test_large_values_in_the_table_switch_units():
    row = report.table([result("forward", **FLASH2)]).splitlines()[2].split()
    # HBM read 1.95e12 B, write 0.9996e9 B (rounds to 1000 MB), L2-side 1.5e15 B, peak 541e6 B, time 150 s
    assert row[-11:] == ["1.95", "TB", "1", "GB", "1.5", "PB", "541", "MB", "150", "s", "memory"]


@pytest.mark.parametrize("r, text", [
    (result("forward", **FLASH2), "128x64"),                          # was 128x64 bwd 64x128
    (result("backward", **FLASH2), "128x64 bwd 64x128"),
    (result("forward+backward", **FLASH2), "128x64 bwd 64x128"),
    (result("forward", "flash1", **FA1), "fa1-kernel 16x128 split 29"),              # was ... kv-par
    (result("backward", "flash1", **FA1), "fa1-kernel 16x128 split 29 kv-par"),
    (result("forward", **dict(FLASH2, block_q_bwd=128, block_kv_bwd=64)), "128x64"),
    (result("forward", **dict(FLASH2, variant="paper")), "128x64 (paper)"),
])
def test_a_forward_row_shows_only_the_forwards_blocks(r, text):
    assert report._mapping(r) == text


EXPERIMENT = """
name = "fwd"
hardware = "a100-sxm4-40gb"
[workload]
batch = 1
heads = 2
seq_len = 256
head_dim = 64
[[runs]]
algorithm = "flash2"
block_q = 128
block_kv = 64
block_q_bwd = 64
block_kv_bwd = 128
[[runs]]
algorithm = "flash2"
block_q = 128
block_kv = 64
block_q_bwd = 64
block_kv_bwd = 128
passes = ["forward", "backward"]
"""


def columns(table: str) -> list[dict]:
    """The table's rows as {heading: cell}, cut where the line of dashes under the heading is."""
    lines = table.splitlines()
    spans, at = [], 0
    for dashes in lines[1].split("  "):
        spans.append((at, at + len(dashes)))
        at += len(dashes) + 2
    cut = lambda line: [line[a:b].strip() for a, b in spans]
    return [dict(zip(cut(lines[0]), cut(line))) for line in lines[2:]]


def test_a_forward_only_run_prints_no_backward_blocks(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "run", scenario(tmp_path, EXPERIMENT), "--count-only")
    rows = columns("\n".join(out.splitlines()[1:7]))
    assert code == 0 and [(r["pass"], r["mapping"]) for r in rows] == [
        ("forward", "128x64"), ("forward", "128x64"), ("backward", "128x64 bwd 64x128"),
        ("forward+backward", "128x64 bwd 64x128")]
