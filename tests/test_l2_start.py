"""L2's starting state as an input (simulator/l2.py `warm`, machine.py `l2_start`): cold (an
empty L2, the default) or warm with named inputs resident, as the copies that made them left them."""
from pathlib import Path

import pytest

from hbmsim.algorithms.flash2 import flash2_forward
from hbmsim.algorithms.workload import Workload
from hbmsim.simulator import HbmsimError, Launch, Program, Tensor, load_gpu, simulate

from conftest import tiny_gpu

H100 = load_gpu(Path(__file__).resolve().parents[1] / "scenarios" / "hardware" / "h100-sxm5-80gb.toml")


def traffic(result) -> dict:
    return {n: (t.read, t.write, t.hbm_read, t.hbm_write) for n, t in result.tensors().items()}


def test_warm_inputs_at_n_256_read_nothing_from_dram():
    """The demo's N = 256 (batch 4, 16 heads, head dim 64, fp16: Q, K, V 2 MiB each, far below
    the H100's 50 MB L2): cold, each input is read from DRAM once (K/V tiles reused by the
    second query block hit L2); warm, none is. L2-side bytes and the writes do not change."""
    wl = Workload(4, 16, 256, 256, 64)
    size = 4 * 16 * 256 * 64 * 2
    cold = traffic(simulate(H100, flash2_forward(wl, 128, 128)))
    warm = traffic(simulate(H100, flash2_forward(wl, 128, 128), l2_start="warm"))
    assert cold["Q"] == (size, 0, size, 0)
    assert cold["K"] == cold["V"] == (2 * size, 0, size, 0)
    assert warm["Q"] == (size, 0, 0, 0)
    assert warm["K"] == warm["V"] == (2 * size, 0, 0, 0)
    assert warm["O"] == cold["O"] == (0, size, 0, size) and warm["lse"] == cold["lse"]
    only_q = traffic(simulate(H100, flash2_forward(wl, 128, 128), l2_start=("Q",)))
    assert only_q["Q"][2] == 0 and only_q["K"] == cold["K"] and only_q["V"] == cold["V"]


def test_warm_lines_by_hand():
    """A 160-byte L2 warmed with A (64 B) then B (128 B): B is the most recent, and making room
    for it evicts A. B's tiles hit until its warm line is used up; A reads DRAM."""
    a = Tensor("A", (1, 1, 64), "bool", count_only=True)
    b = Tensor("B", (1, 1, 128), "bool", count_only=True)
    row = slice(0, 1)

    def block(ctx, i):
        yield from ctx.load(b[0], row, slice(0, 96))        # warm: a hit; B's warm line keeps 32 B
        yield from ctx.load(a[0], row, slice(0, 64))        # A was evicted by B's warming: DRAM; evicts B's rest
        yield from ctx.load(b[0], row, slice(96, 128))      # B's warm line is gone: DRAM
    r = simulate(tiny_gpu(l2_bytes=160, l2_bytes_per_s=1e12), Program("p", [Launch("p", 1, 0, block)], inputs=(a, b)),
                 l2_start="warm")
    assert traffic(r) == {"B": (128, 0, 32, 0), "A": (64, 0, 64, 0)}


@pytest.mark.parametrize("l2_start, message", [
    ("hot", "l2_start = 'hot' must be one of cold, warm"),
    (("Q", "X"), "l2_start: X not an input of program flash2_forward"),
    ((), "must be one of cold, warm or a list of input names"),
])
def test_a_bad_l2_start_is_one_line(l2_start, message):
    with pytest.raises(HbmsimError, match=message) as err:
        simulate(H100, flash2_forward(Workload(1, 1, 64, 64, 64), 64, 64), l2_start=l2_start)
    assert "\n" not in str(err.value)


def test_run_and_validate_take_the_l2_start(tmp_path, capsys):
    """`hbmsim run --l2-start warm` and a measured run's "l2_start": "warm" both simulate a warm
    L2: batch 1, 16 heads, N = 256, head dim 64 on the H100: Q, K and V are 512 KiB each, read
    from DRAM once cold (1,572,864 B) and not at all warm. A bad l2_start is one line."""
    import json

    from hbmsim.scenarios.cli import main
    from hbmsim.scenarios.validate import config_of
    exp = tmp_path / "warm.toml"
    exp.write_text('name = "warm"\nhardware = "h100-sxm5-80gb"\n[workload]\nbatch = 1\nheads = 16\nseq_len = 256\n'
                   'head_dim = 64\ndtype = "fp16"\n[[runs]]\nalgorithm = "flash2"\npasses = ["forward"]\n')
    reads = {}
    for state in ("cold", "warm"):
        out = tmp_path / f"{state}.json"
        assert main(["run", str(exp), "--count-only", "--l2-start", state, "--json", str(out)]) == 0
        reads[state] = json.loads(out.read_text())["runs"][0]["hbm_read_bytes"]
    assert reads == {"cold": 3 * 512 * 1024, "warm": 0}
    run = {"hardware": "h100-sxm5-80gb", "algorithm": "flash2", "time_s": 1e-5, "pass": "forward",
           "workload": {"batch": 1, "heads": 16, "seq_len": 256, "head_dim": 64, "dtype": "fp16"}}
    assert config_of("m.json", 0, dict(run, l2_start="warm")).l2_start == "warm"
    assert config_of("m.json", 0, run).l2_start == "cold"
    with pytest.raises(HbmsimError, match=r"m.json: runs\[0\]: field 'l2_start' = 'hot' must be cold or warm"):
        config_of("m.json", 0, dict(run, l2_start="hot"))


def test_a_tile_in_l2_lines_hits_and_misses_line_by_line():
    """tensor.L2Lines(r): one request whose rows the L2 keeps as lines of r rows. A (4 rows of 8
    bytes, 32 B) stored row by row: a load of rows 0-2 as L2Lines(1) hits its three lines (no DRAM),
    the same rows as one plain tile miss (24 B from DRAM: the L2 holds rows, not a 3-row line); a
    store of rows 2-4 as L2Lines(1) hits row 2's line and allocates row 3's. Bytes: 32 stored, then
    24 + 24 read, 16 stored."""
    from hbmsim.simulator.tensor import L2Lines
    a = Tensor("A", (1, 4, 8), "bool", count_only=True)
    cols = slice(0, 8)

    def block(ctx, i):
        ctx.store_tiles(*[(a[0], slice(r, r + 1), cols, None) for r in range(4)])
        yield from ctx.load(a[0], slice(0, 3), cols, L2Lines(1))         # three lines, each a hit
        yield from ctx.load(a[0], slice(0, 3), cols)                     # a 3-row line: a miss
        ctx.store_tiles((a[0], slice(2, 4), cols, None, L2Lines(1)))
    r = simulate(tiny_gpu(l2_bytes=4096, l2_bytes_per_s=1e12), Program("p", [Launch("p", 1, 0, block)], inputs=(a,)))
    read, write, hbm_read, _ = traffic(r)["A"]
    assert (read, write, hbm_read) == (48, 48, 24)


def test_flush_launches_empties_the_l2_before_every_kernel_by_hand():
    """Nsight Compute's cache control, as `simulate(..., flush_launches=True)` does it: a 4096-byte
    L2; launch 1 stores a 1024-byte tile T, launch 2 loads it. Without the flush launch 2 hits
    (no DRAM read) and T's dirty line is written back at the program's end (l2_writeback); with
    it, T is written back and evicted before launch 2, outside every kernel (no kernel is credited
    its 1024 bytes), and launch 2 reads T from DRAM."""
    t = Tensor("T", (1, 1, 1024), "bool", count_only=True)
    row, cols = slice(0, 1), slice(0, 1024)

    def store(ctx, i):
        ctx.store(t[0], row, cols)
        yield from ()

    def load(ctx, i):
        yield from ctx.load(t[0], row, cols)
    program = lambda: Program("p", [Launch("store", 1, 0, store, allocs=(t,)), Launch("load", 1, 0, load)])
    gpu = tiny_gpu(l2_bytes=4096, l2_bytes_per_s=1e12)

    def by_kernel(result):
        return [(k.name, k.total("hbm_read"), k.total("hbm_write")) for k in result.kernels]
    assert by_kernel(simulate(gpu, program())) == [("store", 0, 0), ("load", 0, 0), ("l2_writeback", 0, 1024)]
    assert by_kernel(simulate(gpu, program(), flush_launches=True)) == [("store", 0, 0), ("load", 1024, 0)]
