"""scripts/fa3_bwd_sass.py: FlashAttention-3's backward main kernel counted in its compiled SASS (the
nvdisasm listings shipped in scripts/fa3_sass/), and the counts flash3_spec's fa3-kernel variant
issues: the same numbers, by hand."""
import importlib.util
import sys
from pathlib import Path

import pytest

from hbmsim.algorithms.flash3_spec import FA3_BWD_INSTRUCTIONS_PER_SCORE

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fa3_bwd_sass.py"
spec = importlib.util.spec_from_file_location("fa3_bwd_sass", SCRIPT)
sass = importlib.util.module_from_spec(spec)
sys.modules["fa3_bwd_sass"] = sass          # (its dataclasses look their module up)
spec.loader.exec_module(sass)


@pytest.mark.parametrize("name, consumer, producer, dq_writer, tile", [
    ("bwd_h64_noncausal", 705, 52.5, 40, 128 * 128),
    ("bwd_h64_causal", 669, 61.5, 40, 128 * 128),
    ("bwd_h128_noncausal", 506, 66, 40, 80 * 128),
    ("bwd_h128_causal", 482, 75, 40, 64 * 128)])
def test_each_kernels_loops_and_its_share_of_a_score(name, consumer, producer, dq_writer, tile):
    """A main-loop iteration: the consumer warp's instructions (the fast path of its two pipeline
    waits), the producer's and the dQ writer's (two iterations a pass, halved); a score's share is
    8 consumer warps' and the two warps' over the tile, what the program issues."""
    listing = sass.read_listing(sass.DIR / f"{name}.sass.gz")
    k = sass.KERNELS[name]
    counts = {loop.what: sum(sass.loop_counts(listing, loop).values()) for loop in k.loops}
    assert (counts["consumer"], counts["producer"], counts["dQ writer"]) == (consumer, producer, dq_writer)
    share = (8 * consumer + producer + dq_writer) / tile
    assert sass.per_score(name, listing) == share == FA3_BWD_INSTRUCTIONS_PER_SCORE[(k.head_dim, k.causal)]


def test_a_consumer_iteration_by_kind():
    """Head dim 64, no mask, a 128 x 128 tile over two warpgroups: a thread owns 64 scores and runs
    four FP32 instructions on each (FFMA, MUFU.EX2, FADD, FMUL: 256), a select and a conversion (F2FP
    packs two); 32 HGMMAs (8 for S and dP, 24 for dV, dK and dQ); the masked copy of the causal kernel's
    loop runs 107 more, in address arithmetic."""
    listing = sass.read_listing(sass.DIR / "bwd_h64_noncausal.sass.gz")
    c = sass.loop_counts(listing, sass.KERNELS["bwd_h64_noncausal"].loops[0])
    assert [c[k] for k in ("FFMA", "MUFU", "FADD", "FMUL", "FMNMX")] == [64, 64, 64, 64, 0]
    assert (c["HGMMA"], c["FSEL/FSETP"], c["F2FP"], c["SHFL"]) == (32, 64, 64, 64)
    causal = sass.read_listing(sass.DIR / "bwd_h64_causal.sass.gz")
    loops = sass.KERNELS["bwd_h64_causal"].loops[:2]
    unmasked, masked = (sum(sass.loop_counts(causal, loop).values()) for loop in loops)
    assert (unmasked, masked) == (669, 776)


def test_what_is_not_a_listing_is_one_line(tmp_path, capsys):
    assert sass.main([str(SCRIPT)]) == 2                                          # not a counted kernel
    bad = tmp_path / "bwd_h64_noncausal.sass"
    bad.write_text("not SASS\n")
    assert sass.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "not one of the counted kernels" in err[0] and "not an nvdisasm listing" in err[1]
