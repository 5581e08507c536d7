"""kernels/store_retention.py without a GPU: the kernels it would launch, the names that carry each
kernel's size, and the retention rows read off a summary (dirty at the end = stored - DRAM written)."""
import json
import re

from hbmsim.kernels import store_retention as S


def test_one_kernel_a_mode_and_size_each_named_by_its_size():
    src = S.source([4, 64])
    names = re.findall(r'extern "C" __global__ void (\w+)\(', src)
    assert names == ["store_4MiB", "copy_4MiB", "paced_4MiB", "store_64MiB", "copy_64MiB", "paced_64MiB"]
    assert all(S.parse_name(n) == (n.split("_")[0], int(n.split("_")[1][:-3])) for n in names)
    assert S.parse_name("store_4MB") is None and S.parse_name("flash_fwd_kernel") is None
    # the paced kernel's store waits for a chain of PACE_FMAS dependent FMAs; the others store at once
    assert src.count(f"k < {S.PACE_FMAS}; ++k) x = fmaf(x, a, 1e-3f)") == 2
    assert "out[i] = in[i];" in src and "out[i] = make_float4(1.f, 2.f, 3.f, 4.f);" in src


def test_retention_rows_by_hand(tmp_path):
    """64 MiB stored, 40.5 MiB written: 23.5 MiB left dirty; a kernel not made here is skipped."""
    kernels = [{"name": "store_64MiB", "dram__bytes_write.sum": 40.5 * 2**20, "dram__bytes_read.sum": 0.0,
                "gpu__time_duration.sum": 21632.0},
               {"name": "at::elementwise_kernel", "dram__bytes_write.sum": 1.0}]
    rows = S.retention(kernels)
    assert rows == [{"mode": "store", "stored_bytes": 64 * 2**20, "dram_write_bytes": 40.5 * 2**20,
                     "dram_read_bytes": 0.0, "time_ns": 21632.0, "dirty_at_end_bytes": 23.5 * 2**20}]
    doc = S.document(kernels, "x.csv", ["NVIDIA H100 80GB HBM3"], "python -m hbmsim.kernels.store_retention ...")
    assert doc["source"] == "measured" and doc["retention"] == rows and doc["runs"][0]["kernels"] == kernels
    json.dumps(doc)


def test_bad_input_is_one_line(tmp_path, capsys):
    """A raw page that is not there, or a size under 1 MiB: one line naming it, exit 2 (no GPU needed)."""
    import pytest
    for argv, said in ((["--summarise", str(tmp_path / "none.csv"), "--out", str(tmp_path / "x.json")],
                        "none.csv': No such file or directory"),
                       (["--sizes-mib", "0", "4"], "--sizes-mib: 0 MiB; each size must be at least 1 MiB")):
        with pytest.raises(SystemExit) as stop:
            S.main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert said in err[-1] and err[-1].startswith("python -m hbmsim.kernels.store_retention: error:")
