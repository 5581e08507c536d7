"""`hbmsim explain`: the walkthrough's numbers come from the programs' own annotations and equal
values worked out by hand (and the float64 reference)."""
import json
import re
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


def test_default_example_tile_by_tile_by_hand(a100, seed):
    _, flash = X.flash_part(seed, a100)
    first, second = tile_notes(flash, 0)
    # tile (0, 0): q0 = [1,0,1,0] against k0, k1: S = [1, 0]; m = 1; exp = [1, e^-1]; l = 1 + e^-1 = 1.368;
    # O = V0 + e^-1 V1 = [1,2,3,4] + 0.368 [5,6,7,8] = [2.84, 4.21, 5.58, 6.94]
    assert first["S"][0] == pytest.approx([1, 0]) and first["m_new"][0] == 1
    assert first["l"][0] == pytest.approx(1 + 1 / E) == pytest.approx(1.368, abs=5e-4)
    assert first["O"][0] == pytest.approx([2.84, 4.21, 5.57, 6.94], abs=6e-3)
    # the running normalised output, attention over keys 0..1 only: O / l = (V0 + e^-1 V1) / (1 + e^-1)
    # = V0 + (V1 - V0) / (e + 1) = [1,2,3,4] + 4 / 3.718 = [2.0758, 3.0758, 4.0758, 5.0758]
    assert first["O_over_l"][0] == pytest.approx([1 + 4 / (E + 1), 2 + 4 / (E + 1), 3 + 4 / (E + 1), 4 + 4 / (E + 1)])
    assert first["O_over_l"][0] == pytest.approx([2.076, 3.076, 4.076, 5.076], abs=5e-4)
    # the same by numpy: softmax of row 0's first two scores applied to V0, V1
    w = np.exp([1.0, 0.0])
    assert first["O_over_l"][0] == pytest.approx(w / w.sum() @ seed.v[:2])
    # tile (0, 1): S = [2, 0]; m 1 -> 2, c = e^-1 = 0.368; l = e^-1 (1 + e^-1) + 1 + e^-2 = 1 + e^-1 + 2e^-2 = 1.638;
    # O = e^-1 O + V2 + e^-2 V3 = [11.81, 13.44, 15.08, 16.72]
    assert second["m_old"][0] == 1 and second["m_new"][0] == 2
    assert second["c"][0] == pytest.approx(1 / E) == pytest.approx(0.368, abs=5e-4)
    assert second["l"][0] == pytest.approx(1 + 1 / E + 2 / E ** 2)
    assert second["l"][0] == pytest.approx(1.638, abs=1e-3)
    assert second["O"][0] == pytest.approx([11.81, 13.44, 15.08, 16.71], abs=0.011)
    final = [v for *_, v in flash["notes"].of("flash2 final") if v["rows"][0] == 0][0]
    assert final["O"][0] == pytest.approx([7.20, 8.20, 9.20, 10.20], abs=5e-3)
    # after the last tile the running normalised output is the final O, row by row
    finals = {v["rows"][0]: v for *_, v in flash["notes"].of("flash2 final")}
    for row0 in (0, 2):
        assert tile_notes(flash, row0)[-1]["O_over_l"] == pytest.approx(finals[row0]["O"], abs=1e-15)
    # backward with dO rows [1,1,1,1], 0, [1,1,1,1], 0: dV_j = (P_0j + P_2j) [1, 1, 1, 1]
    dv = flash["result"].outputs["dV"].reshape(4, 4)
    assert dv[:, 0] == pytest.approx([0.590, 0.217, 0.976, 0.217], abs=5e-4)
    assert np.all(dv == dv[:, :1])


def test_default_walkthrough_prints_the_numbers(a100, capsys):
    assert main(["explain"]) == 0
    out = capsys.readouterr().out
    for text in ("row 0: max 2.000, exp(S - max) = [0.368, 0.135, 1.000, 0.135], sum 1.639",
                 "exp(S - m_new) = [1.000, 0.368], l = c l + sum = 1.368",
                 "m_old = 1.000, m_new = 2.000, c = exp(m_old - m_new) = 0.368",
                 "row 0: O = O / l = [7.204, 8.204, 9.204, 10.204]",
                 "load V[0][0:2, 0:4] 32 B (HBM)", "load K[0][0:2, 0:4] 32 B (L2 hit)",
                 "rows 0..1: D = rowsum(dO o O) = [34.816, 0.000]", "[0.590, 0.590, 0.590, 0.590]",
                 "softmax        P 64 B written, S 64 B read"):
        assert text in out, text
    assert "O_flash - O_standard: max |difference|" in out


def test_every_tile_prints_the_running_normalised_output_beside_o(capsys):
    assert main(["explain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    beside = [line.strip() for line in lines if "O (unnormalised)" in line]
    # 2 query blocks x 2 tiles x 2 rows; row 0 after keys 0..1, then after keys 2..3 (= the final O / l)
    assert len(beside) == 8 and all(", O / l = [" in line for line in beside)
    assert beside[0] == ("O (unnormalised) = c O + P V = [2.839, 4.207, 5.575, 6.943], "
                         "O / l = [2.076, 3.076, 4.076, 5.076]")
    assert beside[2] == ("O (unnormalised) = c O + P V = [11.804, 13.442, 15.081, 16.720], "
                         "O / l = [7.204, 8.204, 9.204, 10.204]")
    tile = lines.index("    tile keys 0..1:")
    assert lines[tile + 1].startswith("      row 0: S = [1.000, 0.000], tile max = 1.000, m_old = -inf, m_new = 1.000")


def test_the_notes_tables_describe_what_the_programs_note(a100, seed):
    """Every value a program notes is described in its NOTES (or located by g, row, rows, cols), and
    every described value is noted: the tables cannot drift from the ctx.note call sites."""
    _, flash = X.flash_part(seed, a100)
    notes = flash["notes"]
    x = X.Tensor("X", (1, 4, 4), "fp32", np.arange(16, dtype=float).reshape(1, 4, 4))
    X.simulate(a100, X.softmax_program("online", x, 2), listener=notes.note)
    tables = {**X.FLASH2_NOTES, **X.FLASH2_BACKWARD_NOTES, **X.SOFTMAX_NOTES}
    for *_, what, values in notes.notes:
        about = tables[what]
        described = {key for line in about.get("per_row", about.get("values")) for key in line}
        assert described == set(values) - {"g", "row", "rows", "cols"}, what
    assert {n[3] for n in notes.notes} == set(tables)


def test_render_is_generic():
    about = {"heading": "chunk {cols}", "per_row": ({"a": "a = x + 1"}, {"b": "b"})}
    assert X.render(about, {"rows": (3, 5), "cols": (0, 2), "a": [1, 2], "b": [[1, 0], [0, 1]]}, "") == [
        "chunk 0..1:", "  row 3: a = x + 1 = 1.000", "         b = [1.000, 0.000]",
        "  row 4: a = x + 1 = 2.000", "         b = [0.000, 1.000]"]
    about = {"heading": "block {rows}", "values": ({"s": "s"}, {"M": "M"})}
    assert X.render(about, {"rows": (0, 2), "s": 0.5, "M": np.eye(2)}, "  ") == [
        "  block 0..1: s = 0.500", "    M =\n        [1.000, 0.000]\n        [0.000, 1.000]"]


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
    # the running O / l: after keys 0..2 the mean of V0..V2 = [1, 0, 0, 1]; after keys 3..5
    # [4 + 11e^-1, 0, 0, 1 + 5e^-1] / (1 + 5e^-1); its last column is 1 after every tile
    assert t0["O_over_l"][0] == pytest.approx([1, 0, 0, 1])
    assert t1["O_over_l"][0] == pytest.approx([(4 + 11 / E) / (1 + 5 / E), 0, 0, 1])
    assert all(t["O_over_l"][:, 3] == pytest.approx(1) for t in (t0, t1, t2))
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


def test_annotations_cost_nothing_when_nobody_listens(a100, seed):
    from hbmsim.algorithms.flash2 import flash2_forward
    from hbmsim.simulator import simulate
    ex = seed
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
    assert ("row 0, columns 2..3: m_old = 1.000, m_new = max(m_old, chunk max) = 2.000, "
            "c = exp(m_old - m_new) = 0.368, l = c l + sum exp(x - m_new) = 1.639") in out


def test_the_demo_lines_come_from_the_one_seed_example(a100):
    text = X.every_program(a100)
    assert text.startswith("Seed example (Q, K 4x4, V = 1..16, scale 1, blocks 2x2): O through the simulator\n"
                           "[[ 7.2   8.2   9.2  10.2 ]")
    diffs = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "max |O - reference|" in line]
    assert len(diffs) == len(X.registry.algorithms()) and max(diffs) < 1e-12


def test_hopper_walkthrough_same_bytes_by_hand(capsys):
    """`explain --hopper`: FA2 and FA3 on one head (N = 1024, d = 128, H100) move the same bytes and
    FLOPs (the table's two columns equal: Q, K, V read once from DRAM, 3 x 1024 x 128 x 2 B =
    786,432 B; O and lse written, 1024 x (256 + 4) = 266,240 B), a block's GEMMs are
    2 x 2 x 128 x 1024 x 128 FLOPs, and FA3's softmax does not run under its GEMMs (xu_tensor_serial)."""
    assert main(["explain", "--hopper"]) == 0
    out = capsys.readouterr().out
    rows = {m[1].strip(): (m[2], m[3]) for m in re.finditer(r"^  ([A-Za-z0-9 ()-]+?)\s{2,}([\d,]+)\s+([\d,]+)$",
                                                               out, re.M)}
    for label in ("L2-side reads (B)", "L2-side writes (B)", "DRAM reads (B)", "DRAM writes (B)", "matmul FLOPs"):
        assert rows[label][0] == rows[label][1], label
    assert rows["DRAM reads (B)"][0] == f"{3 * 1024 * 128 * 2:,}" and rows["DRAM writes (B)"][0] == f"{266_240:,}"
    assert f"= {2 * 2 * 128 * 1024 * 128:,} FLOP" in out
    t2, t3 = (float(x) for x in re.search(r"kernel time \(predicted, us\)\s+([\d.]+)\s+([\d.]+)", out).groups())
    assert t3 < t2
    # section 3: the first events are the producer's loads of the ring's stages, then consumer 0's GEMM
    events = re.findall(r"^\s+([\d.]+) -\s+([\d.]+)  (producer|consumer \d)\s+(.*)$", out, re.M)
    assert [e[2] for e in events[:4]] == ["producer"] * 4
    assert events[4][2:] == ("consumer 0", "wgmma GEMM, 2,097,152 FLOP")      # 2 x 64 rows x 128 keys x 128
    tensor, vector, both = (float(x) for x in re.search(
        r"tensor pipe busy ([\d.]+) us, vector pipe ([\d.]+) us, both at once ([\d.]+) us", out).groups())
    # xu_tensor_serial: the softmax never runs while a GEMM does (measured on a Hopper attention kernel)
    assert both == 0 and 0 < vector < tensor and tensor + vector <= t3
    # section 5, at scale (warp_issue): a 128 x 64 step's 4 warps issue 4 x 1,220 instructions (Nsight's count a
    # warp a step); FA3's gain at scale is less than the lone blocks' but a gain
    assert "then its 4 warps' 4,880 instructions at 4 a clock" in out
    at_scale, lone = (float(x) for x in re.search(r"FA3 ([\d.]+)x faster at scale, ([\d.]+)x for the lone",
                                                  out).groups())
    assert 1 < at_scale < lone and lone == pytest.approx(t2 / t3, abs=0.01)


def test_gqa_walkthrough_by_hand(capsys):
    """`explain --gqa`: 4 query heads on 1 K/V head, 3 query rows against 8 keys (d 4, causal, H100).
    FA3's rule: 3 / 192 = 0.0156 < 0.9 x 12 / 192 = 0.0563, so pack. Packed row r is query row r // 4
    of head r % 4 and sees keys 0..q + 5. Unpacked, 4 blocks each read K and V (8 x 4 x 2 B = 64 B
    each); packed, one block reads Q head by head (4 x 24 B) and K and V once: K 256 B against 64 B.
    Each block computes the whole 192-row tile: 2 x 2 x 192 x 8 x 4 = 24,576 FLOPs a block."""
    assert main(["explain", "--gqa"]) == 0
    out = capsys.readouterr().out
    assert "0.0156 < 0.9 x 0.0625 = 0.0563: pack" in out
    assert "row  5: head 1, query row 1, keys 0..6" in out and "row 11: head 3, query row 2, keys 0..7" in out
    packed = out.split("3b.")[1].split("4.")[0]
    assert [line.split(": ", 1)[1] for line in packed.strip().splitlines()[1:]] == [
        f"load  Q[{h}][0:3, 0:4] 24 B (HBM)" for h in range(4)] + [
        "load  K[0][0:8, 0:4] 64 B (HBM)", "load  V[0][0:8, 0:4] 64 B (HBM)"]
    rows = {m[1].strip(): (m[2], m[3]) for m in re.finditer(r"^  ([A-Za-z ()]+?)\s{2,}([\d,]+)\s+([\d,]+)$", out, re.M)}
    assert rows["K read (B)"] == ("256", "64") and rows["Q read (B)"] == ("96", "96")
    assert rows["matmul FLOPs"] == (f"{4 * 24_576:,}", f"{24_576:,}")
    assert float(re.search(r"max \|difference\| ([\d.e+-]+)", out).group(1)) < 1e-12
    # at scale: K and V read once a packed block, not once a query head (4x the L2-side bytes unpacked)
    mb = [float(x) for x in re.findall(r"([\d.]+) MB read", out)]
    assert mb[0] > 3.9 * mb[1] and mb[1] == pytest.approx(mb[2], rel=0.01)


@pytest.mark.parametrize("args, message", [
    (["--hopper", "--decode"], "explain: --hopper walks through its own example: drop --decode"),
    (["--hopper", "--hardware", "a100-sxm4-80gb"], "explain --hopper: a100-sxm4-80gb has no wgmma/TMA"),
    (["--gqa", "--causal"], "explain: --gqa walks through its own example: drop --causal"),
    (["--gqa", "--hopper"], "explain: --hopper walks through its own example: drop --gqa"),
    (["--gqa", "--hardware", "a100-sxm4-80gb"], "explain --gqa: a100-sxm4-80gb has no wgmma/TMA"),
])
def test_hopper_walkthrough_bad_input_is_one_line(capsys, args, message):
    assert main(["explain", *args]) == 2
    assert capsys.readouterr().err.startswith(f"hbmsim: error: {message}")
