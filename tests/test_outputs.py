"""Every output path of every command is checked before the work starts: a folder that does not
exist, a file where a folder should be, or a folder that refuses new files is one line naming the
option, the path and why, exit code 2, and nothing is made. Folders are made only when asked
(`demo --out`), and an error never names a temporary file."""
import errno
import os

import pytest

from hbmsim.scenarios import outputs, runner
from hbmsim.scenarios.cli import main
from hbmsim.simulator import HbmsimError

from test_cli import GOOD, run_cli, scenario


def no_work(monkeypatch):
    """Make every way a command starts its work fail the test."""
    from hbmsim.scenarios import bench, compare, validate
    from hbmsim.scenarios.commands import demo
    fail = lambda *a, **k: pytest.fail("the work started before the outputs were checked")
    monkeypatch.setattr(runner, "simulate", fail)
    monkeypatch.setattr(demo, "seed_example", fail)
    monkeypatch.setattr(bench, "bench", fail)
    monkeypatch.setattr(validate, "validate", fail)
    monkeypatch.setattr(compare, "compare_files", fail)


# (argv, the option named): {out} is an output path whose folder does not exist
COMMANDS = [
    (["run", "{exp}", "--json", "{out}.json"], "--json"),
    (["run", "{exp}", "--plot", "{out}.png"], "--plot"),
    (["run", "{exp}", "--roofline", "{out}.png"], "--roofline"),
    (["run", "{exp}", "--timeline", "{out}.json"], "--timeline"),
    (["run", "{exp}", "--results", "{out}.jsonl"], "--results"),
    (["demo", "--out", "{out}"], "--out"),
    (["blockmap", "--json", "{out}.json"], "--json"),
    (["blockmap", "--plot", "{out}.png"], "--plot"),
    (["bench", "--json", "{out}.json"], "--json"),
    (["compare", "a.json", "b.json", "--plot", "{out}.png"], "--plot"),
    (["validate", "--json", "{out}.json"], "--json"),
    (["validate", "--plot", "{out}.png"], "--plot"),
    (["emulate", "emulate-small", "--out", "{out}.json"], "--out"),
    (["profile", "emulate-small", "--out", "{out}.json"], "--out"),
    (["profile-library", "--out", "{out}.json"], "--out"),
    (["microbench", "--out", "{out}.json"], "--out"),
]


@pytest.mark.parametrize("argv, option", COMMANDS, ids=[" ".join(a[:1] + [o]) for a, o in COMMANDS])
def test_an_output_in_a_missing_folder_is_refused_before_any_work(tmp_path, capsys, monkeypatch, argv, option):
    no_work(monkeypatch)
    missing = tmp_path / "no" / "such"
    fill = lambda a: a.format(exp=scenario(tmp_path, GOOD), out=missing / "x")
    args = [fill(a) for a in argv]
    code, out, err = run_cli(capsys, *args)
    path = args[args.index(option) + 1]
    assert code == 2 and out == ""
    assert err.splitlines() == [f"hbmsim: error: {option} {path!r}: the folder {str(missing)!r} does not exist "
                                "(make it first)"]
    assert not (tmp_path / "no").exists()


def test_run_json_in_a_missing_folder_makes_no_folder(tmp_path, capsys):
    """The new user's case: `hbmsim run ... --json /nonexistent/dir/x.json` used to make the folder."""
    dest = tmp_path / "nonexistent" / "dir" / "x.json"
    code, _, err = run_cli(capsys, "run", "small-masked", "--count-only", "--json", str(dest))
    assert code == 2 and err == (f"hbmsim: error: --json {str(dest)!r}: the folder {str(dest.parent)!r} does not "
                                 "exist (make it first)\n")
    assert not (tmp_path / "nonexistent").exists()


def test_demo_makes_its_out_folder_when_its_parent_exists(tmp_path):
    made = outputs.check_output_dir(tmp_path / "d", "--out")
    assert made == tmp_path / "d" and not made.exists()        # checked; made only when the work is done
    assert outputs.make_output_dir(made, "--out").is_dir()
    assert os.listdir(tmp_path) == ["d"] and os.listdir(made) == []   # no probe file is left behind


def test_demo_out_that_is_a_file_or_holds_a_folder_is_refused(tmp_path, capsys, monkeypatch):
    no_work(monkeypatch)
    (tmp_path / "f").write_text("x")
    code, _, err = run_cli(capsys, "demo", "--out", str(tmp_path / "f"))
    assert code == 2 and err == f"hbmsim: error: --out {str(tmp_path / 'f')!r} is a file, not a folder\n"
    (tmp_path / "d" / "demo.png").mkdir(parents=True)
    code, _, err = run_cli(capsys, "demo", "--out", str(tmp_path / "d"))
    assert code == 2 and err == (f"hbmsim: error: --out {str(tmp_path / 'd')!r}: 'demo.png' in it is a folder "
                                 "(demo writes demo.json, demo.png, roofline.png)\n")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("argv, option", [(["demo", "--out", "/proc/demo"], "--out"),
                                          (["run", "small-masked", "--json", "/proc/x.json"], "--json"),
                                          (["emulate", "emulate-small", "--out", "/proc/x.json"], "--out")])
def test_a_folder_that_refuses_new_files_is_found_before_any_work(capsys, monkeypatch, argv, option):
    """/proc passes a permission check (for root, everything does) but refuses new files: the
    folder is tried, not guessed. `demo --out /proc/demo` used to simulate everything first."""
    no_work(monkeypatch)
    code, out, err = run_cli(capsys, *argv)
    path = argv[argv.index(option) + 1]
    assert code == 2 and out == ""
    assert err == f"hbmsim: error: {option} {path!r}: cannot write in the folder '/proc' (the folder does not " \
        "accept new files)\n"


def test_a_failed_write_names_the_file_not_its_temporary_file(tmp_path, monkeypatch):
    def refuse(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied", str(src))
    monkeypatch.setattr(outputs.os, "replace", refuse)
    dest = tmp_path / "r.json"
    with pytest.raises(HbmsimError) as exc:
        outputs.write_text_atomic(dest, "{}\n")
    assert str(exc.value) == f"cannot write {str(dest)!r} (Permission denied)"
    assert os.listdir(tmp_path) == []                  # the temporary file is removed too


def test_a_failed_write_through_the_command_is_one_line_without_the_temporary_name(tmp_path, capsys, monkeypatch):
    real = os.replace

    def refuse(src, dst):
        if str(dst).endswith("r.json"):
            raise PermissionError(errno.EACCES, "Permission denied", str(src))
        return real(src, dst)
    monkeypatch.setattr(outputs.os, "replace", refuse)
    dest = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "run", scenario(tmp_path, GOOD), "--count-only", "--json", str(dest))
    assert code == 2 and ".tmp" not in err and "Traceback" not in err
    # (the file could not be written, so the line does not say that the finished runs are in it)
    assert err.strip().splitlines() == [f"hbmsim: error: cannot write {str(dest)!r} (Permission denied)"]
    assert os.listdir(tmp_path) == ["exp.toml"]


def test_the_entry_point_still_runs(capsys):
    assert main(["hardware"]) == 0 and "a100-sxm4-40gb" in capsys.readouterr().out
