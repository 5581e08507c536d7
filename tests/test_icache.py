"""kernels/icache.py, the instruction-cache microbenchmark: its kernels' bodies are the straight-line
code of the size they are named for, and its arithmetic by hand; on a GPU, a small body runs at the
issue rate."""
import pytest

from hbmsim.kernels import icache
from hbmsim.kernels.gpu import gpu_available

HAVE_GPU, WHY = gpu_available()


def test_each_body_is_its_size_of_independent_ffmas():
    src = icache.source((4, 16))
    assert src.count("__global__") == 2 and "icache_4KiB" in src and "icache_16KiB" in src
    body = icache.body(4)
    lines = body.splitlines()
    assert len(lines) == icache.ffmas(4) == 4 * 1024 // 16 == 256      # 16-byte SASS instructions
    assert lines[0].strip() == "x0 = fmaf(x0, a, 1e-7f);" and lines[9].strip() == "x1 = fmaf(x1, a, 10e-7f);"
    assert len({ln.split(",")[-1] for ln in lines}) == 256            # every addend its own: nothing folds
    assert "#pragma unroll 1" in src                                   # the loop is not unrolled


def test_iterations_and_cycles_per_instruction_by_hand():
    assert icache.iterations(4) == (1 << 21) // 256 == 8192
    assert icache.iterations(256) == (1 << 21) // 16384 == 128
    # blocks of 3 M, 4 M and 5 M cycles (median 4 M), 256 FFMAs x 8192 passes, 2 warps a scheduler
    assert icache.cycles_per_instruction([3e6, 4e6, 5e6], 4, 2) == pytest.approx(4e6 / (256 * 8192 * 2))


def test_the_command_line():
    a = icache.parser().parse_args(["--out", "x.json"])
    assert (a.out, a.repeats) == ("x.json", 3)
    with pytest.raises(SystemExit) as e:                   # before any GPU work
        icache.main(["--out", "x.json", "--repeats", "0"])
    assert e.value.code == 2


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason=f"needs CuPy and a CUDA GPU: {WHY}")
def test_a_small_body_issues_about_one_ffma_a_cycle():
    rows = icache.measure((8,), repeats=1)
    assert len(rows) == len(icache.WARPS_PER_SCHEDULER)
    for r in rows:
        assert 0.9 < r["cycles_per_instruction"] < 1.5, r
