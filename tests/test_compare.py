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


# ---- issue 7: results files are validated like experiments; --plot is checked before any work ----

GOOD = dict(global_read_bytes=100, global_write_bytes=40, hbm_read_bytes=80, hbm_write_bytes=40, time_s=2e-6,
            tensors={"Q": {"read": 60, "write": 0}, "O": {"read": 0, "write": 40}})
DESC = "flash2 fp16 B=1 H=2 N=100x77 d=32 32x16"        # describe(run())


def _bad(**change):
    """A valid run with some fields replaced (None: the field is deleted)."""
    r = run(**GOOD)
    r["tensors"] = {k: dict(v) for k, v in r["tensors"].items()}
    for key, value in change.items():
        if key.startswith("tensors."):
            _, name, side = key.split(".")
            r["tensors"][name][side] = value
        elif key.startswith("workload."):
            r["workload"][key.split(".")[1]] = value
        elif value is None:
            del r[key]
        else:
            r[key] = value
    return r


def _compare_fails(capsys, pred, meas, *extra):
    capsys.readouterr()
    assert main(["compare", pred, meas, *extra]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("hbmsim: error: ")
    return captured.err[len("hbmsim: error: "):].rstrip("\n")


BAD_VALUES = [        # (what is wrong, change to runs[1], the end of the one-line message)
    ("negative bytes", {"global_write_bytes": -40}, "field 'global_write_bytes' = -40 must be a whole number > 0"),
    ("NaN literal", {"time_s": math.nan}, "field 'time_s' = nan must be a finite number > 0"),
    ("Infinity literal", {"hbm_read_bytes": math.inf}, "field 'hbm_read_bytes' = inf must be a whole number >= 0"),
    ("-Infinity literal", {"time_s": -math.inf}, "field 'time_s' = -inf must be a finite number > 0"),
    ("zero time", {"time_s": 0}, "field 'time_s' = 0 must be a finite number > 0"),
    ("negative time", {"time_s": -1e-6}, "field 'time_s' = -1e-06 must be a finite number > 0"),
    ("zero global bytes", {"global_read_bytes": 0}, "field 'global_read_bytes' = 0 must be a whole number > 0"),
    ("string", {"time_s": "2e-6"}, "field 'time_s' = '2e-6' must be a finite number > 0"),
    ("bool", {"global_read_bytes": True}, "field 'global_read_bytes' = True must be a whole number > 0"),
    ("fractional bytes", {"hbm_write_bytes": 40.5}, "field 'hbm_write_bytes' = 40.5 must be a whole number >= 0"),
    ("negative tensor bytes", {"tensors.Q.read": -60}, "field 'tensors.Q.read' = -60 must be a whole number >= 0"),
    ("NaN tensor bytes", {"tensors.O.write": math.nan}, "field 'tensors.O.write' = nan must be a whole number >= 0"),
    ("string tensor bytes", {"tensors.Q.write": "0"}, "field 'tensors.Q.write' = '0' must be a whole number >= 0"),
    ("zero batch", {"workload.batch": 0}, "field 'workload.batch' = 0 must be a whole number >= 1"),
    ("string head_dim", {"workload.head_dim": "32"}, "field 'workload.head_dim' = '32' must be a whole number >= 1"),
    ("zero block", {"block_kv": 0}, "field 'block_kv' = 0 must be a whole number >= 1"),
]


@pytest.mark.parametrize("what,change,message", BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_bad_measured_value_is_one_line(tmp_path, capsys, what, change, message):
    pred = write(tmp_path, "p.json", [run(bq=16, **GOOD), run(**GOOD)])
    meas = write(tmp_path, "m.json", [run(bq=16, **GOOD), _bad(**change)], "measured")
    text = (tmp_path / "m.json").read_text()
    assert ("NaN" in text) == ("NaN" in what) and ("Infinity" in text) == ("Infinity" in what)   # JSON's literals
    desc = DESC.replace(*{"zero batch": ("B=1", "B=0"), "zero block": ("32x16", "32x0")}.get(what, ("", "")))
    assert _compare_fails(capsys, pred, meas) == f"{meas}: runs[1] ({desc}): {message}"


@pytest.mark.parametrize("change,message", [
    ({"time_s": math.nan}, "field 'time_s' = nan must be a finite number > 0"),
    # predicted: inputs start in DRAM
    ({"hbm_read_bytes": 0}, "field 'hbm_read_bytes' = 0 must be a whole number > 0"),
    ({"global_read_bytes": "100"}, "field 'global_read_bytes' = '100' must be a whole number > 0"),
    ({"tensors.O.write": -1}, "field 'tensors.O.write' = -1 must be a whole number >= 0"),
])
def test_bad_predicted_value_is_one_line(tmp_path, capsys, change, message):
    pred = write(tmp_path, "p.json", [run(bq=16, **GOOD), _bad(**change)])
    meas = write(tmp_path, "m.json", [run(**GOOD)], "measured")
    assert _compare_fails(capsys, pred, meas) == f"{pred}: runs[1] ({DESC}): {message}"


@pytest.mark.parametrize("which", ["measured", "predicted"])
def test_duplicate_runs_are_refused(tmp_path, capsys, which):
    same = run(**GOOD)       # the same configuration written with the seq_len shorthand
    same["workload"] = {"seq_len": 64, **{k: v for k, v in WL.items() if k not in ("seq_len_q", "seq_len_kv")}}
    explicit = run(**GOOD)
    explicit["workload"].update(seq_len_q=64, seq_len_kv=64)
    runs = [run(bq=16, **GOOD), explicit, run(bq=64, **GOOD), same]
    pred = write(tmp_path, "p.json", runs if which == "predicted" else [run(**GOOD)])
    meas = write(tmp_path, "m.json", runs if which == "measured" else [run(**GOOD)], "measured")
    path, one = (meas, "measurement") if which == "measured" else (pred, "prediction")
    assert _compare_fails(capsys, pred, meas) == (
        f"{path}: runs[1] and runs[3] are the same configuration (flash2 fp16 B=1 H=2 N=64x64 d=32 32x16): "
        f"one {one} per configuration")


@pytest.mark.parametrize("change,message", [
    ({"workload": [1, 2]}, "runs[1].workload = [1, 2] must be an object of plain values"),
    ({"workload": "x"}, "runs[1].workload = 'x' must be an object of plain values"),
    ({"algorithm": 2}, "runs[1].algorithm = 2 must be a plain value (a string, e.g. 'flash2')"),
    ({"pass": True}, "runs[1].pass = True must be a plain value (a string, e.g. 'forward')"),
    ({"tensors": [1]}, "runs[1].tensors must map tensor names to"),
])
def test_bad_identity_field_is_one_line(tmp_path, capsys, change, message):
    pred = write(tmp_path, "p.json", [run(bq=16, **GOOD), run(**GOOD)])
    meas = write(tmp_path, "m.json", [run(bq=16, **GOOD), _bad(**change)], "measured")
    assert _compare_fails(capsys, pred, meas).startswith(f"{meas}: {message}")


@pytest.mark.parametrize("doc,message", [
    ({"source": ["measured"], "runs": []}, "field 'source' = ['measured'] must be a string"),
    ({"source": "measured", "provenance": [1], "runs": []}, "field 'provenance' = [1] must be an object"),
])
def test_bad_file_fields_are_one_line(tmp_path, capsys, doc, message):
    pred = write(tmp_path, "p.json", [run(**GOOD)])
    (tmp_path / "m.json").write_text(json.dumps(doc))
    assert _compare_fails(capsys, pred, str(tmp_path / "m.json")).startswith(f"{tmp_path / 'm.json'}: {message}")


def test_null_is_absent_and_zero_where_it_can_be(tmp_path, capsys):
    """null fields are skipped; measured DRAM reads and any DRAM writes may be 0; a tensor may
    have 0 writes; emulated files carry no times or HBM bytes at all."""
    pred = write(tmp_path, "p.json", [run(**{**GOOD, "hbm_write_bytes": 0}, max_abs_error=None)])
    meas = write(tmp_path, "m.json", [{**run(**GOOD), "hbm_read_bytes": 0, "hbm_write_bytes": 0, "time_s": None,
                                       "max_abs_error": None, "tensors": None}], "measured")
    emu = write(tmp_path, "e.json", [_bad(time_s=None, hbm_read_bytes=None, hbm_write_bytes=None)], "emulated")
    assert main(["compare", pred, meas]) == 0 and main(["compare", pred, emu]) == 0
    out = capsys.readouterr().out
    assert "hbm_write_bytes" in out and "not compared (absent from one file): time_s" in out


def test_predicted_forward_can_write_nothing_to_dram(tmp_path, capsys):
    """Why hbm_write_bytes may be 0: with a small write-back L2, the forward's O stays dirty until
    the backward evicts it, so the simulator credits the forward with no DRAM writes."""
    exp = tmp_path / "e.toml"
    exp.write_text("""hardware = "a100-sxm4-40gb"
[hardware_overrides]
l2_bytes = 65536
[workload]
batch = 1
heads = 1
seq_len = 256
head_dim = 64
dtype = "fp16"
[[runs]]
algorithm = "flash2"
passes = ["forward", "backward"]
block_q = 64
block_kv = 64
""")
    out = tmp_path / "p.json"
    assert main(["run", str(exp), "--count-only", "--json", str(out)]) == 0
    runs = C.load(out).runs
    assert [r["pass"] for r in runs] == ["forward", "backward", "forward+backward"]
    assert runs[0]["hbm_write_bytes"] == 0 and all(r["hbm_read_bytes"] > 0 for r in runs)


def test_shipped_predictions_still_load(tmp_path, capsys):
    """Real `hbmsim run --json` files (standard, flash1, flash2; forward, backward, both) pass."""
    out = tmp_path / "p.json"
    assert main(["run", "small-masked", "--count-only", "--json", str(out)]) == 0
    f = C.load(out)
    assert f.source == "predicted" and len(f.runs) == 9


@pytest.mark.parametrize("name", ["out.txt", "out.tar.gz", "out.PNGX"])
def test_plot_format_refused_before_any_work(tmp_path, capsys, name):
    """The inputs do not even exist: the plot path is what is reported, and nothing is written."""
    png = tmp_path / name
    msg = _compare_fails(capsys, str(tmp_path / "missing-p.json"), str(tmp_path / "missing-m.json"), "--plot", str(png))
    suffix = png.suffix
    assert msg.startswith(f"plot path {str(png)!r}: suffix {suffix!r} "
                          "is not a format matplotlib can write (supported: ")
    assert ".png" in msg and ".pdf" in msg and ".svg" in msg
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["figs", "figs.png"])
def test_plot_to_existing_directory_refused_before_any_work(tmp_path, capsys, name):
    d = tmp_path / name
    d.mkdir()
    msg = _compare_fails(capsys, str(tmp_path / "missing-p.json"), str(tmp_path / "missing-m.json"), "--plot", str(d))
    assert msg == f"plot path {str(d)!r} is a directory: give a file name such as {str(d / 'plot.png')!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name] and list(d.iterdir()) == []


def test_plot_without_suffix_is_png(tmp_path, capsys):
    pred = write(tmp_path, "p.json", [run(**GOOD)])
    meas = write(tmp_path, "m.json", [run(**GOOD)], "measured")
    assert main(["compare", pred, meas, "--plot", str(tmp_path / "cmp")]) == 0
    assert f"wrote {tmp_path / 'cmp.png'}" in capsys.readouterr().out
    assert (tmp_path / "cmp.png").stat().st_size > 10_000 and not (tmp_path / "cmp").exists()


@pytest.mark.parametrize("name,expected", [("a.png", "a.png"), ("a.PDF", "a.PDF"), ("a.svg", "a.svg"), ("a", "a.png"),
                                           ("sub/a", "sub/a.png")])
def test_check_plot_path_accepts(tmp_path, name, expected):
    from hbmsim.scenarios.outputs import check_plot_path
    assert check_plot_path(str(tmp_path / name)) == tmp_path / expected


@pytest.mark.parametrize("name,message", [("a.txt", "suffix '.txt' is not a format"), ("a.json", "suffix '.json'"),
                                          ("d/", "is a directory"), ("d", "is a directory")])
def test_check_plot_path_refuses(tmp_path, name, message):
    from hbmsim.scenarios.outputs import check_plot_path
    (tmp_path / "d").mkdir()
    with pytest.raises(HbmsimError, match=re.escape(message)):
        check_plot_path(str(tmp_path / name) + ("/" if name.endswith("/") else ""))
