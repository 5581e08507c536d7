"""hbmsim compare: runs matched by configuration, relative errors and their mean, the plot; and
the end-to-end path run -> emulate -> compare on the shipped experiment gives 0% on bytes."""
import json
import math
import re

import pytest

from hbmsim.kernels.emulation import compiler
from hbmsim.scenarios import compare as C
from hbmsim.scenarios.cli import main
from hbmsim.simulator import HbmsimError

def _no_compiler():
    try:
        compiler()
    except HbmsimError as err:
        return str(err)
    return None


needs_cxx = pytest.mark.skipif(_no_compiler() is not None, reason=f"emulation needs a C++ compiler: {_no_compiler()}")
WL = {"batch": 1, "heads": 2, "seq_len_q": 100, "seq_len_kv": 77, "head_dim": 32, "dtype": "fp16", "causal": False,
      "key_padding_mask": False, "dropout": 0.0}


def run(alg="flash2", bq=32, bkv=16, **fields):
    r = {"algorithm": alg, "pass": "forward", "workload": dict(WL), **fields}
    if alg != "standard":
        r.update(block_q=bq, block_kv=bkv)
    return r


def write(tmp_path, name, runs, source=None):
    doc = {"runs": runs} if source is None else {"source": source, "provenance": {"date": "x"}, "runs": runs}
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def test_match_by_configuration():
    pred = [run(global_read_bytes=100), run(bq=16, global_read_bytes=200), run("standard", global_read_bytes=5)]
    meas = [run(bq=16, global_read_bytes=150), run(bq=64, global_read_bytes=1), run("standard", global_read_bytes=4)]
    pairs, up, um = C.match(pred, meas)
    assert [(p["block_q"], m["block_q"]) for p, m in pairs if p["algorithm"] == "flash2"] == [(16, 16)]
    assert len(pairs) == 2 and [r.get("block_q") for r in up] == [32] and [r["block_q"] for r in um] == [64]


def test_seq_len_shorthand_matches_explicit_lengths():
    a = run()
    a["workload"] = {**WL, "seq_len_kv": 100}
    b = run()
    b["workload"] = {"seq_len": 100, **{k: v for k, v in WL.items() if k not in ("seq_len_q", "seq_len_kv")}}
    assert C.run_key(a) == C.run_key(b)


def test_rows_errors_and_summary():
    pred = [run(global_read_bytes=110, global_write_bytes=50, time_s=2e-6, tensors={"Q": {"read": 10, "write": 0}})]
    meas = [run(global_read_bytes=100, global_write_bytes=50, tensors={"Q": {"read": 10, "write": 0}})]
    table = C.rows(C.match(pred, meas)[0])
    got = {r.field: r.rel_error for r in table}
    assert got == {"global_read_bytes": pytest.approx(0.1), "global_write_bytes": 0.0, "tensors.Q.read": 0.0}
    s = C.summary(table)
    assert s["global_read_bytes"] == (pytest.approx(10.0), 1) and s["tensors"] == (0.0, 1)
    assert C.Row("x", "f", 1, 0).rel_error == math.inf and C.Row("x", "f", 0, 0).rel_error == 0.0


def test_compare_cli_prints_and_plots(tmp_path, capsys):
    pred = write(tmp_path, "p.json", [run(global_read_bytes=110, global_write_bytes=40, hbm_read_bytes=90,
                                          hbm_write_bytes=40, time_s=1e-6)])
    meas = write(tmp_path, "m.json", [run(global_read_bytes=100, global_write_bytes=40, hbm_read_bytes=80,
                                          hbm_write_bytes=40, time_s=2e-6, source="measured")], "measured")
    png = tmp_path / "cmp.png"
    assert main(["compare", pred, meas, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "10.00%" in out and "12.50%" in out and "50.00%" in out and "(measured: GPU measurement, hardware: " in out
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("measured,message", [
    ([run(bq=64, global_read_bytes=1)], "no run of"),
    ("not json", "not valid JSON"),
    ({"runs": 3}, "field 'runs' must be a list"),
])
def test_compare_errors_are_one_line(tmp_path, capsys, measured, message):
    pred = write(tmp_path, "p.json", [run(global_read_bytes=1)])
    m = tmp_path / "m.json"
    m.write_text(measured if isinstance(measured, str) else json.dumps(measured if isinstance(measured, dict)
                                                                        else {"runs": measured}))
    assert main(["compare", pred, str(m)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_plot_needs_a_traffic_field(tmp_path):
    with pytest.raises(HbmsimError, match="nothing to plot"):
        C.plot([(run(time_s=1.0), run(time_s=2.0))], tmp_path / "x.png", "measured")


@needs_cxx
def test_emulate_then_compare_is_exact(tmp_path, capsys):
    """The shipped small experiment: predicted global bytes = emulated kernel bytes, per tensor."""
    pred, emu, png = tmp_path / "pred.json", tmp_path / "emu.json", tmp_path / "cmp.png"
    assert main(["run", "emulate-small", "--json", str(pred), "--count-only"]) == 0
    assert main(["emulate", "emulate-small", "--out", str(emu)]) == 0
    doc = json.loads(emu.read_text())
    assert doc["source"] == "emulated" and all(r["source"] == "emulated" for r in doc["runs"])
    assert {"compiler", "date", "command"} <= set(doc["provenance"]) and len(doc["runs"]) == 16
    assert all("time_s" not in r and "hbm_read_bytes" not in r for r in doc["runs"])
    assert all(r["max_abs_error"] < 2e-3 for r in doc["runs"])
    capsys.readouterr()
    assert main(["compare", str(pred), str(emu), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "matched 16 run(s)" in out
    for field in ("global_read_bytes", "global_write_bytes", "tensors"):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(field) and "value(s)" in ln)
        assert "0.00%" in line
    errors = [ln.split()[-1] for ln in out.splitlines() if ln.rstrip().endswith("%") and "value(s)" not in ln]
    assert errors and set(errors) == {"0.00%"}
    assert png.stat().st_size > 10_000


@needs_cxx
def test_emulate_skips_what_the_kernel_cannot_run(tmp_path, capsys):
    exp = tmp_path / "e.toml"
    exp.write_text("""hardware = "a100-sxm4-40gb"
[workload]
batch = 1
heads = 1
seq_len = 40
head_dim = 32
dtype = "fp32"
[[runs]]
algorithm = "standard"
[[runs]]
algorithm = "flash1"
block_q = 16
block_kv = 16
[[runs]]
algorithm = "flash2"
block_q = 16
block_kv = 16
""")
    out = tmp_path / "emu.json"
    assert main(["emulate", str(exp), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["algorithm"] for r in doc["runs"]] == ["flash2"]
    assert sorted(s["algorithm"] for s in doc["skipped"]) == ["flash1", "standard"]
    assert "skipped standard" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    (None, "cannot be read as a results file"),                                   # a folder
    (b"\xff\xfe{", "cannot be read as a results file"),
    (b'{"runs": [{"algorithm": "flash2", "workload": "x"}]}', "runs[0].workload = 'x' must be an object"),
    (b'{"runs": [{"algorithm": ["flash2"]}]}', "runs[0].algorithm = ['flash2'] must be a plain value"),
    (b'{"runs": [{"algorithm": "flash2", "tensors": {"Q": 3}}]}', "runs[0].tensors must map tensor names"),
])
def test_malformed_results_file_is_one_clear_error(tmp_path, content, message):
    p = tmp_path / "r.json"
    if content is None:
        p.mkdir()
    else:
        p.write_bytes(content)
    with pytest.raises(HbmsimError, match=re.escape(message)):
        C.load(p)
