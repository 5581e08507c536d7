"""The registry is the only way in: a throwaway program registered here runs from an experiment
TOML, reports, compares and plots, with no other file changed; and every registered program
keeps the three-way equality (counters = closed forms, numerics = float64 reference)."""
import json
import math
from dataclasses import dataclass

import numpy as np
import pytest

from hbmsim.algorithms import registry
from hbmsim.algorithms.common import input_tensors, output
from hbmsim.algorithms.registry import AlgorithmSpec
from hbmsim.algorithms.workload import Workload, random_data
from hbmsim.scenarios.cli import main
from hbmsim.simulator import Launch, Program, simulate

from conftest import tiny_gpu


@dataclass(frozen=True)
class RowPanels:
    rows: int = 16          # query rows per block


def naive_program(wl: Workload, m: RowPanels, data, training: bool) -> Program:
    """One block per (batch-head, panel of `rows` query rows): loads its Q rows and the whole of
    K and V, computes softmax(scale Q K^T) V exactly, stores its O rows (no masks)."""
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    t = input_tensors(wl, data)
    O = output(wl, "O", nq, d, wl.dtype, data)
    panels = math.ceil(nq / m.rows)

    def block(ctx, index):
        g, i = divmod(index, panels)
        rows = slice(i * m.rows, min(nq, (i + 1) * m.rows))
        q, k, v = yield from ctx.load_tiles((t["Q"][g], rows, slice(0, d)), (t["K"][g], slice(0, nk), slice(0, d)),
                                            (t["V"][g], slice(0, nk), slice(0, d)))
        n = rows.stop - rows.start
        yield from ctx.compute(matmul_flops=4 * n * nk * d, vector_flops=5 * n * nk)   # QK^T and PV; softmax
        o = None
        if q is not None:
            s = wl.softmax_scale * q @ k.T
            p = np.exp(s - s.max(axis=1, keepdims=True))
            o = (p / p.sum(axis=1, keepdims=True)) @ v
        yield from ctx.store(O[g], rows, slice(0, d), o)

    sram = (m.rows + 2 * nk) * d * wl.itemsize
    return Program("naive_forward", [Launch("naive_fwd", g_count * panels, sram, block)],
                   inputs=tuple(t.values()), outputs={"O": O})


def naive_io(wl: Workload, m: RowPanels, pass_name: str) -> dict:
    # Q and O once; K and V once per row panel of each batch-head.
    g, nq, nk, d, e = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.itemsize
    panels = math.ceil(nq / m.rows)
    return {"Q": (g * nq * d * e, 0), "K": (g * panels * nk * d * e, 0), "V": (g * panels * nk * d * e, 0),
            "O": (0, g * nq * d * e)}


NAIVE = AlgorithmSpec(name="naive", label="throwaway test program", mapping_type=RowPanels, build=naive_program,
                      io=naive_io, sram_bytes=lambda wl, m, training: (m.rows + 2 * wl.seq_len_kv) * wl.head_dim
                      * wl.itemsize, passes=("forward",), match_fields=("rows",))


@pytest.fixture
def naive():
    registry.register(NAIVE)
    yield NAIVE
    registry.unregister("naive")


EXPERIMENT = """
name = "naive-test"
hardware = "a100-sxm4-40gb"
[workload]
batch = 2
heads = 3
seq_len = 100
head_dim = 16
dtype = "fp32"
[[runs]]
algorithm = "naive"
rows = 32
[[runs]]
algorithm = "flash2"
[sweep]
seq_len = [64, 100]
"""


def test_a_throwaway_program_runs_reports_compares_and_plots(tmp_path, capsys, naive):
    exp = tmp_path / "naive.toml"
    exp.write_text(EXPERIMENT)
    pred, png = tmp_path / "pred.json", tmp_path / "traffic.png"
    assert main(["run", str(exp), "--json", str(pred), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("naive ")]
    assert len(rows) == 2 and all(" 32 " in line for line in rows)     # the mapping column: rows = 32
    runs = json.loads(pred.read_text())["runs"]
    mine = [r for r in runs if r["algorithm"] == "naive"]
    assert [r["workload"]["seq_len"] for r in mine] == [64, 100] and all(r["rows"] == 32 for r in mine)
    for r in mine:
        wl = Workload(2, 3, r["workload"]["seq_len"], r["workload"]["seq_len"], 16, dtype="fp32")
        assert {k: (v["read"], v["write"]) for k, v in r["tensors"].items()} == naive_io(wl, RowPanels(32), "forward")
        assert r["max_abs_error"] < 1e-12
    assert "naive/" not in out            # it keeps no N x N matrix: not a baseline for the ratios
    assert png.stat().st_size > 10000
    # A "measurement" of the same runs, 10% slower: compare matches by the program's match fields.
    measured = {"source": "measured", "runs": [dict(r, time_s=1.1 * r["time_s"], source="measured") for r in mine]}
    meas = tmp_path / "meas.json"
    meas.write_text(json.dumps(measured))
    assert main(["compare", str(pred), str(meas), "--plot", str(tmp_path / "cmp.png")]) == 0
    text = capsys.readouterr().out
    assert "matched 2 run(s)" in text and "naive fp32 B=2 H=3 N=64x64 d=16 32" in text
    assert "time_s                       9.09%" in text          # |1 - 1.1| / 1.1


def test_unknown_mapping_field_of_the_throwaway_is_refused_for_others(tmp_path, capsys, naive):
    exp = tmp_path / "bad.toml"
    exp.write_text(EXPERIMENT.replace('algorithm = "flash2"', 'algorithm = "flash2"\nrows = 8'))
    assert main(["run", str(exp)]) == 2
    assert "field 'rows' does not apply to algorithm 'flash2'" in capsys.readouterr().err


VARIANTS = [(spec, v) for spec in registry.algorithms() for v in (spec.variants or (None,))]


@pytest.mark.parametrize("spec, variant", VARIANTS, ids=[f"{s.name}-{v}" for s, v in VARIANTS])
def test_every_registered_program_keeps_the_three_way_equality(spec, variant):
    """Counters equal the spec's closed forms, per pass; numerics equal the float64 reference;
    for every program and every named variant of its mapping."""
    from hbmsim.algorithms.reference import attention_backward, attention_forward
    wl = Workload(2, 2, 37, 29, 8, dtype="fp16", causal=True, key_padding_mask=True, dropout=0.1)
    gpu = tiny_gpu(sram_bytes_per_sm=1 << 20)
    training = "backward" in spec.passes
    mapping = spec.uniform(16, **({"variant": variant} if variant else {}))
    mapping, _ = spec.resolved(gpu, wl, mapping, training)
    data = random_data(wl, seed=5)
    result = simulate(gpu, spec.build(wl, mapping, data, training))
    for p in spec.passes:
        counted = {n: (t.read, t.write) for n, t in result.tensors(p).items() if (t.read, t.write) != (0, 0)}
        assert counted == spec.io(wl, mapping, p)
    o_ref, _ = attention_forward(wl, data)
    assert np.max(np.abs(result.outputs["O"].reshape(o_ref.shape) - o_ref)) < 1e-12
    if training:
        grads = attention_backward(wl, data, data.d_o)
        for n in ("dQ", "dK", "dV"):
            assert np.max(np.abs(result.outputs[n].reshape(grads[n].shape) - grads[n])) < 1e-12
