"""Progress on stderr (tqdm): configurations done and left, blocks inside a long configuration;
nothing on stdout changes; off with --quiet or a non-terminal stderr."""
import io
import sys

from hbmsim.scenarios import progress as P
from hbmsim.scenarios.cli import main


class Tty(io.StringIO):
    def isatty(self):
        return True


def run(monkeypatch, capsys, *extra):
    return main(["run", "small-masked", "--count-only", *extra]), capsys.readouterr()


def test_bars_on_a_terminal(monkeypatch, capsys):
    quiet_code, quiet = run(monkeypatch, capsys, "--quiet")
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.setattr(P, "INNER_S", 0.0)            # every configuration gets its bar of blocks
    code, shown = run(monkeypatch, capsys)
    err = tty.getvalue()
    assert code == quiet_code == 0
    assert "configurations: 100%" in err and "3/3" in err and "blocks simulated" in err
    assert shown.out == quiet.out                       # stdout is the same with and without progress


def test_off_when_stderr_is_not_a_terminal_or_quiet(capsys):
    code, shown = main(["run", "small-masked", "--count-only"]), capsys.readouterr()
    assert code == 0 and "configurations" not in shown.err and "%" not in shown.err


def test_the_machine_reports_every_block(a100):
    from hbmsim.algorithms.flash2 import flash2_forward
    from hbmsim.algorithms.workload import Workload
    from hbmsim.simulator import simulate
    seen = []
    simulate(a100, flash2_forward(Workload(1, 2, 256, 256, 64), 64, 64), progress=lambda d, t: seen.append((d, t)))
    assert seen == [(i, 8) for i in range(1, 9)]        # 2 heads x 4 query blocks, one call per block
