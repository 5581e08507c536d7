"""`hbmsim explain`: the walkthrough's numbers come from the programs' own annotations and equal
values worked out by hand (and the float64 reference)."""
import json
import math

import numpy as np
import pytest

from hbmsim.scenarios import explain as X
from hbmsim.scenarios.cli import main
from hbmsim.scenarios.experiment import resolve_hardware

E = math.e


@pytest.fixture(scope="module")
def a100():
    return resolve_hardware("a100-sxm4-40gb")


def tile_notes(flash, row0):
    """The flash2 forward annotations of the query block starting at row0, in order."""
    return [v for *_, v in flash["notes"].of("flash2 tile") if v["rows"][0] == row0]


def test_default_example_tile_by_tile_by_hand(a100):
    _, flash = X.flash_part(X.default_example(), a100)
    first, second = tile_notes(flash, 0)
    # tile (0, 0): q0 = [1,0,1,0] against k0, k1: S = [1, 0]; m = 1; exp = [1, e^-1]; l = 1 + e^-1 = 1.368;
    # O = V0 + e^-1 V1 = [1,2,3,4] + 0.368 [5,6,7,8] = [2.84, 4.21, 5.58, 6.94]
    assert first["S"][0] == pytest.approx([1, 0]) and first["m_new"][0] == 1
    assert first["l"][0] == pytest.approx(1 + 1 / E) == pytest.approx(1.368, abs=5e-4)
    assert first["O"][0] == pytest.approx([2.84, 4.21, 5.57, 6.94], abs=6e-3)
    # tile (0, 1): S = [2, 0]; m 1 -> 2, c = e^-1 = 0.368; l = e^-1 (1 + e^-1) + 1 + e^-2 = 1 + e^-1 + 2e^-2 = 1.638;
    # O = e^-1 O + V2 + e^-2 V3 = [11.81, 13.44, 15.08, 16.72]
    assert second["m_old"][0] == 1 and second["m_new"][0] == 2
    assert second["c"][0] == pytest.approx(1 / E) == pytest.approx(0.368, abs=5e-4)
    assert second["l"][0] == pytest.approx(1 + 1 / E + 2 / E ** 2)
    assert second["l"][0] == pytest.approx(1.638, abs=1e-3)
    assert second["O"][0] == pytest.approx([11.81, 13.44, 15.08, 16.71], abs=0.011)
    final = [v for *_, v in flash["notes"].of("flash2 final") if v["rows"][0] == 0][0]
    assert final["O"][0] == pytest.approx([7.20, 8.20, 9.20, 10.20], abs=5e-3)
    # backward with dO rows [1,1,1,1], 0, [1,1,1,1], 0: dV_j = (P_0j + P_2j) [1, 1, 1, 1]
    dv = flash["result"].outputs["dV"].reshape(4, 4)
    assert dv[:, 0] == pytest.approx([0.590, 0.217, 0.976, 0.217], abs=5e-4)
    assert np.all(dv == dv[:, :1])


def test_default_walkthrough_prints_the_numbers(a100, capsys):
    assert main(["explain"]) == 0
    out = capsys.readouterr().out
    for text in ("row 0: max 2.000, exp(S - max) = [0.368, 0.135, 1.000, 0.135], sum 1.639",
                 "l = c l + sum = 1.368, O (unnormalised) = c O + P V = [2.839, 4.207, 5.575, 6.943]",
                 "m 1.000 -> 2.000, c = exp(m_old - m_new) = 0.368",
                 "[11.804, 13.442, 15.081, 16.720]", "row 0: O = O / l = [7.204, 8.204, 9.204, 10.204]",
                 "load V[0][0:2, 0:4] 32 B (HBM)", "load K[0][0:2, 0:4] 32 B (L2 hit)",
                 "D = rowsum(dO o O), rows 0..1: [34.816, 0.000]", "[0.590, 0.590, 0.590, 0.590]",
                 "softmax        P 64 B written, S 64 B read"):
        assert text in out, text
    assert "O_flash - O_standard: max |difference|" in out


def nine_by_four(path):
    """Q row 0 = e1, rows 1..8 = e2; K is zero but for K4 = [1,0,0,0] and K7 = [2,0,0,0]; V_j = [j, 0, 0, 1]."""
    q = [[1, 0, 0, 0]] + [[0, 1, 0, 0]] * 8
    k = [[0, 0, 0, 0]] * 9
    k[4], k[7] = [1, 0, 0, 0], [2, 0, 0, 0]
    v = [[j, 0, 0, 1] for j in range(9)]
    path.write_text(json.dumps({"Q": q, "K": k, "V": v}))
    return path


def test_nine_by_four_with_query_blocks_of_2_and_key_blocks_of_3_by_hand(a100, tmp_path, capsys):
    ex = X.load_example(str(nine_by_four(tmp_path / "nine.json")), block_q=2, block_kv=3)
    _, flash = X.flash_part(ex, a100)
    t0, t1, t2 = tile_notes(flash, 0)
    # row 0 scores: S = [0,0,0 | 0,1,0 | 0,2,0]
    # keys 0..2: m -inf -> 0, exp = [1,1,1], l = 3, O = V0 + V1 + V2 = [3, 0, 0, 3]
    assert (t0["m_new"][0], t0["l"][0]) == (0, 3) and t0["O"][0] == pytest.approx([3, 0, 0, 3])
    # keys 3..5: m 0 -> 1, c = e^-1, exp = [e^-1, 1, e^-1], l = 3e^-1 + 1 + 2e^-1 = 1 + 5e^-1 = 2.839,
    # O = e^-1 [3,0,0,3] + e^-1 V3 + V4 + e^-1 V5 = [4 + 11e^-1, 0, 0, 1 + 5e^-1]
    assert t1["c"][0] == pytest.approx(1 / E) and t1["l"][0] == pytest.approx(1 + 5 / E)
    assert t1["O"][0] == pytest.approx([4 + 11 / E, 0, 0, 1 + 5 / E])
    # keys 6..8: m 1 -> 2, l = e^-1 (1 + 5e^-1) + 1 + 2e^-2 = 1 + e^-1 + 7e^-2 = 2.315,
    # O = [7 + 4e^-1 + 25e^-2, 0, 0, 1 + e^-1 + 7e^-2]; O / l: [5.120, 0, 0, 1] (V's last column is all ones)
    assert t2["l"][0] == pytest.approx(1 + 1 / E + 7 / E ** 2) == pytest.approx(2.315, abs=5e-4)
    final = [v for *_, v in flash["notes"].of("flash2 final") if v["rows"][0] == 0][0]
    assert final["O"][0] == pytest.approx([(7 + 4 / E + 25 / E ** 2) / (1 + 1 / E + 7 / E ** 2), 0, 0, 1])
    assert final["O"][0][0] == pytest.approx(5.120, abs=5e-4)
    # rows 1..8 see all-zero scores: uniform weights, O = mean of V = [4, 0, 0, 1]
    o = flash["result"].outputs["O"].reshape(9, 4)
    assert o[1:] == pytest.approx(np.tile([4, 0, 0, 1], (8, 1)))
    # dO defaults to ones: dV_7 = (P_07 + 8/9) [1,1,1,1], P_07 = 1 / (1 + e^-1 + 7e^-2)
    dv = flash["result"].outputs["dV"].reshape(9, 4)
    assert dv[7] == pytest.approx([1 / (1 + 1 / E + 7 / E ** 2) + 8 / 9] * 4)
    # five query blocks (the last has one row), three key blocks each: 15 tiles
    assert len(flash["notes"].of("flash2 tile")) == 15
    assert main(["explain", "--inputs", str(tmp_path / "nine.json"), "--block-q", "2", "--block-kv", "3"]) == 0
    out = capsys.readouterr().out
    assert "query rows 8..8 (thread block 4):" in out and "row 0: O = O / l = [5.120, 0.000, 0.000, 1.000]" in out


def test_npz_inputs_causal_scale_and_random(a100, tmp_path, capsys):
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((5, 3)), rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
    np.savez(tmp_path / "x.npz", Q=q, K=k, V=v, dO=np.ones((5, 3)))
    assert main(["explain", "--inputs", str(tmp_path / "x.npz"), "--causal", "--scale", "0.5", "--block-kv", "4"]) == 0
    out = capsys.readouterr().out
    # every difference against the float64 reference is rounding only
    diffs = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if "float64 reference" in line]
    assert len(diffs) == 2 and max(diffs) < 1e-12
    assert main(["explain", "--random", "6", "5", "4", "--seed", "7"]) == 0
    assert "a random 6 x 5 example, head dim 4, seed 7" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    ({"Q": [[1, 0]], "K": [[1, 0]]}, "missing array 'V'"),
    ({"Q": [[1, 0]], "K": [[1, 0, 0]], "V": [[1, 0, 0]]}, "K has 3 columns but Q has 2"),
    ({"Q": [[1, 0]], "K": [[1, 0]], "V": [[1, 0], [2, 0]]}, "V has shape (2, 2) but K has (1, 2)"),
    ({"Q": [[1, "x"]], "K": [[1, 0]], "V": [[1, 0]]}, "array 'Q' is not a matrix of numbers"),
    ({"Q": [1, 0], "K": [[1, 0]], "V": [[1, 0]]}, "array 'Q' has shape (2,), must be a non-empty matrix"),
])
def test_bad_inputs_are_one_line(tmp_path, capsys, content, message):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(content))
    assert main(["explain", "--inputs", str(f)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_nan_and_blocks_longer_than_the_sequence(tmp_path, capsys):
    f = tmp_path / "nan.npz"
    np.savez(f, Q=np.array([[np.nan, 0.0]]), K=np.ones((1, 2)), V=np.ones((1, 2)))
    assert main(["explain", "--inputs", str(f)]) == 2
    assert "array 'Q' contains NaN or inf" in capsys.readouterr().err
    assert main(["explain", "--block-q", "8"]) == 2
    assert "--block-q = 8 is longer than the sequence (4 rows)" in capsys.readouterr().err
    assert main(["explain", "--random", "100000", "4", "4"]) == 2
    assert "too big to print (at most 256 rows" in capsys.readouterr().err


def test_annotations_cost_nothing_when_nobody_listens(a100):
    from hbmsim.algorithms.flash2 import flash2_forward
    from hbmsim.simulator import simulate
    ex = X.default_example()
    heard = []
    quiet = simulate(a100, flash2_forward(ex.workload(), 2, 2, ex.data()))
    loud = simulate(a100, flash2_forward(ex.workload(), 2, 2, ex.data()), listener=lambda *a: heard.append(a))
    assert len(heard) == 4 + 2 and quiet.time_s == loud.time_s and quiet.sim_events == loud.sim_events


def test_softmax_passes_section(capsys):
    assert main(["explain"]) == 0
    out = capsys.readouterr().out
    # S is 4 x 4 fp32 = 64 B: safe reads it 3 times, online twice, the fused form not at all
    assert "safe softmax (max, then sum of exps, then write: 3 reads): X 192 B read, Y 64 B written" in out
    assert "online softmax (running max and rescaled sum in one read, then write: 2 reads): X 128 B read" in out
    # online softmax's running max and sum on row 0 in chunks of 2 are flash's tile-by-tile m and l
    assert "row 0, columns 2..3: m 1.000 -> 2.000, c = 0.368, l = 1.639" in out
