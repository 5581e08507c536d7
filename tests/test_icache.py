"""kernels/icache.py, the instruction-cache microbenchmark: its kernels' bodies are the straight-line
code of the size they are named for (the two-body kernels' too, compiled where nvcc is), and its
arithmetic by hand; on a GPU, a small body runs at the issue rate."""
import shutil
import subprocess

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


def test_the_two_body_kernels_run_different_code_on_each_schedulers_two_warps():
    """icache2_<K>KiB: two bodies of K KiB whose addends differ (the second's follow the first's), the
    second taken by warps whose index / 4 is odd: one warp of each body on each scheduler."""
    src = icache.source_two((4,))
    assert src.count("__global__") == 1 and "icache2_4KiB" in src and icache.kernel_name(4, 2) == "icache2_4KiB"
    assert "((threadIdx.x >> 5) / 4) & 1" in src and src.count("#pragma unroll 1") == 2
    adds = [ln.split(",")[-1] for ln in src.splitlines() if "fmaf" in ln]
    assert len(adds) == 2 * icache.ffmas(4) == 512 and len(set(adds)) == 512          # nothing shared or folded
    assert adds[0].strip() == "257e-7f);" and adds[256].strip() == "1e-7f);"     # the second body, then the first


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (compile only)")
def test_each_two_body_kernel_is_twice_its_body_in_sass(tmp_path):
    """Compiled for sm_90, icache2_4KiB's .text is the two 4 KiB bodies and at most 2 KiB more."""
    cu = tmp_path / "two.cu"
    cu.write_text(icache.source_two((4,)))
    subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-o", str(tmp_path / "two.cubin"), str(cu)],
                   check=True, capture_output=True, timeout=300)
    sections = subprocess.run(["readelf", "-S", "-W", str(tmp_path / "two.cubin")], capture_output=True,
                              text=True, check=True).stdout
    (line,) = [ln for ln in sections.splitlines() if ".text.icache2_4KiB" in ln]
    size = int(line.split("PROGBITS")[1].split()[2], 16)
    assert 2 * 4096 <= size <= 2 * 4096 + 2048


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
    rows = icache.measure((8,), repeats=1, two_stream_sizes_kib=(4,))
    assert len(rows) == len(icache.WARPS_PER_SCHEDULER) + len(icache.TWO_STREAM_WARPS)
    assert [r["streams"] for r in rows] == [1] * 3 + [2] * 2 and rows[-1]["union_kib"] == 8
    for r in rows:                       # 8 KiB of code, in one body or two, runs from the first level
        assert 0.9 < r["cycles_per_instruction"] < 1.5, r
