"""`hbmsim run --plot`: the x-axis is the swept field (N when N is swept, a block size when blocks
are), one line per program, pass, variant and block with a legend naming it, and labelled ticks on
every panel's log axis however few decades it spans."""
import pytest

from hbmsim.scenarios import report
from hbmsim.scenarios.cli import main
from hbmsim.scenarios.experiment import load_experiment
from hbmsim.scenarios.runner import prepare, run_experiment

HEAD = """name = "p"
hardware = "a100-sxm4-40gb"
[workload]
batch = 1
heads = 2
seq_len = 256
head_dim = 64
"""
BLOCKS_AT_ONE_N = HEAD + """
[[runs]]
algorithm = "flash2"
block_q = 64
block_kv = 64
[[runs]]
algorithm = "flash2"
block_q = 64
block_kv = 128
[[runs]]
algorithm = "standard"
"""
BLOCK_KV_SWEEP = BLOCKS_AT_ONE_N.split("[[runs]]")[0] + """
[[runs]]
algorithm = "flash2"
block_q = 64
block_kv = 64
[[runs]]
algorithm = "standard"
[sweep]
block_kv = [32, 64, 128]
"""
N_SWEEP = HEAD + """
[[runs]]
algorithm = "flash2"
block_q = 64
block_kv = 64
[[runs]]
algorithm = "flash2"
block_q = 128
block_kv = 128
[[runs]]
algorithm = "flash1"
[sweep]
seq_len = [128, 256, 512]
"""


def results_of(tmp_path, text):
    path = tmp_path / "e.toml"
    path.write_text(text)
    exp = prepare(load_experiment(path))
    swept = list(dict.fromkeys(k for cfg in exp.configs for k in cfg.point))
    return run_experiment(exp, count_only=True, fast=True), swept


@pytest.fixture
def figure(monkeypatch):
    """The figure plot_sweep draws, kept open (drawn) instead of written."""
    kept = {}

    def keep(fig, path, dpi=110):
        fig.canvas.draw()
        kept["fig"] = fig
        return path
    monkeypatch.setattr(report, "save_figure", keep)
    return kept


def tick_labels(ax):
    return [t.get_text() for t in ax.get_yticklabels() if t.get_text()]


def legend_texts(fig):
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("text, x, xticks, series", [
    (BLOCKS_AT_ONE_N, "block_kv", ["64", "128"], ["flash2 fa2-kernel block_q=64", "standard eager tile 128x128x128 "
                                                                                  "(no block_kv: flat)"]),
    (BLOCK_KV_SWEEP, "block_kv", ["32", "64", "128"], ["flash2 fa2-kernel block_q=64",
                                                       "standard eager tile 128x128x128 (no block_kv: flat)"]),
    (N_SWEEP, "seq_len", ["128", "256", "512"], ["flash2 fa2-kernel block 64x64", "flash2 fa2-kernel block 128x128",
                                                 "flash1 paper block_q=64"]),
])
def test_x_is_the_swept_field_and_every_series_is_named(tmp_path, figure, text, x, xticks, series):
    results, swept = results_of(tmp_path, text)
    assert report.x_field(results, swept) == x
    report.plot_sweep(results, tmp_path / "p.png", "t", swept)
    fig = figure["fig"]
    axes = fig.axes
    assert len(axes) == 3
    for ax in axes:
        assert [t.get_text() for t in ax.get_xticklabels() if t.get_text()] == xticks
        assert len(tick_labels(ax)) >= 2, ax.get_title()          # every panel's y ticks are labelled
    assert any(label.endswith("us") for label in tick_labels(axes[2]))
    assert any(label.endswith("B") for label in tick_labels(axes[0]))
    texts = legend_texts(fig)
    for s in series:
        assert s in texts, texts
    assert "solid: DRAM (HBM) bytes" in texts


def test_blocks_at_one_n_are_two_lines_not_a_vertical_one(tmp_path, figure):
    """Two runs that differ only in block size: the x-axis is a block size, not N."""
    results, swept = results_of(tmp_path, BLOCKS_AT_ONE_N)
    assert swept == []
    report.plot_sweep(results, tmp_path / "p.png", "t", swept)
    time_panel = figure["fig"].axes[2]
    flash = [line for line in time_panel.get_lines() if line.get_label().startswith("flash2")]
    assert [list(line.get_xdata()) for line in flash] == [[64, 128]]


def test_auto_blocks_over_n_stay_one_line(tmp_path):
    """flash1's "auto" blocks change with N: still one series, named by what stays constant."""
    results, _ = results_of(tmp_path, N_SWEEP)
    series = report._series(results, "seq_len")
    assert len([s for s in series if s.startswith("flash1")]) == 1


@pytest.mark.parametrize("lo, hi", [(3.1e-5, 3.7e-5), (1e-5, 1e-2), (5e6, 9e6), (1.0, 1.0)])
def test_log_axis_labels_however_few_decades(lo, hi):
    from hbmsim.scenarios.outputs import pyplot
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.plot([0, 1], [lo, hi])
    report._log_axis(ax.yaxis, [lo, hi], report.fmt_time)
    fig.canvas.draw()
    labels = tick_labels(ax)
    plt.close(fig)
    assert 2 <= len(labels) <= 8 and len(set(labels)) == len(labels), labels


def test_cli_plot_of_a_block_sweep(tmp_path, capsys):
    (tmp_path / "e.toml").write_text(BLOCK_KV_SWEEP)
    png = tmp_path / "p.png"
    assert main(["run", str(tmp_path / "e.toml"), "--count-only", "--quiet", "--plot", str(png)]) == 0
    assert png.stat().st_size > 10000
