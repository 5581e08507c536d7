"""What the third lent H200 of 2026-11-27 measured, as docs/validation.md and docs/measured-data.md
cite it: FA2's short causal forwards waiting for instructions (Nsight's stall reasons and source
pages, scripts/sass_regions.py), the SM's instruction caches (kernels/icache.py), a masked step's
instructions, the paced L2 retention and the free clock; and scripts/ncu_kernel_time.py's clock."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from hbmsim.scenarios.published import MEASURED_DIR

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module           # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def _kernels(name):
    doc = json.loads((MEASURED_DIR / f"{name}.json").read_text())
    assert doc["source"] == "measured"
    return {r["file"]: next(k for k in r["kernels"] if "flash_fwd" in k["name"]) for r in doc["runs"]}


STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def _cycles_an_issue(k):
    return sum(v for m, v in k.items() if m.startswith("smsp__average_warps_issue_stalled_") and m.endswith(".ratio"))


def test_the_causal_kernel_waits_for_instructions_at_n_256_to_1024():
    k = {**_kernels("h200-ncu-short-causal"), **_kernels("h200-ncu-causal-long"), **_kernels("h200-ncu-short")}
    no_inst = {f: round(v[STALL.format("no_instruction")], 2) for f, v in k.items()}
    share = {f: v[STALL.format("no_instruction")] / _cycles_an_issue(v) for f, v in k.items()}
    causal = {n: f"ncu-fa2-64-{n}-causal-forward.csv" for n in (128, 256, 512, 1024, 4096)}
    assert [no_inst[causal[n]] for n in (128, 256, 512, 1024, 4096)] == [0.11, 1.31, 1.41, 0.52, 0.05]
    assert [round(100 * share[causal[n]], 1) for n in (128, 256, 512, 1024, 4096)] == [2.6, 27.2, 29.8, 12.9, 1.4]
    for f in ("ncu-fa2-64-128-forward.csv", "ncu-fa2-64-256-forward.csv", "ncu-fa2-64-512-forward.csv",
              "ncu-fa2-128-128-forward.csv"):
        assert 0.09 <= no_inst[f] <= 0.23                          # unmasked: no such wait
    # at N = 256 the causal kernel runs 13% fewer instructions than the unmasked one, and takes longer
    c, u = k[causal[256]], k["ncu-fa2-64-256-forward.csv"]
    assert c["smsp__inst_executed.sum"] / u["smsp__inst_executed.sum"] == pytest.approx(0.866, abs=0.001)
    assert c["gpu__time_duration.sum"] > u["gpu__time_duration.sum"]


def test_a_masked_step_runs_about_300_more_instructions_a_warp():
    k = {**_kernels("h200-ncu-short-causal"), **_kernels("h200-ncu-short")}
    per_warp = {f: v["smsp__inst_executed.sum"] / v["launch__grid_size"] / 4 for f, v in k.items()}   # 4 warps a block
    # head dim 64, N = 128: one 128-key step, masked or not
    assert per_warp["ncu-fa2-64-128-causal-forward.csv"] - per_warp["ncu-fa2-64-128-forward.csv"] == 326
    # head dim 128, N = 128: two 64-key steps, both masked (n_masking_steps = 128 / 64)
    assert (per_warp["ncu-fa2-128-128-causal-forward.csv"] - per_warp["ncu-fa2-128-128-forward.csv"]) / 2 == 294


def test_the_kernels_sass_from_nsights_source_pages():
    sass = _script("sass_regions")
    pages = {p.name: sass.read_page(p) for p in sorted((MEASURED_DIR / "sass").glob("*.csv.gz"))}
    got = {n: (s.code_bytes, s.loops[-1][1] - s.loops[-1][0], round(100 * s.no_instruction_share, 1))
           for n, s in pages.items()}
    assert got == {"h200-fa2-fwd-64-causal-sass.csv.gz": (72_064, 25_920, 25.6),
                   "h200-fa2-fwd-64-sass.csv.gz": (64_128, 26_176, 5.4),
                   "h200-fa2-fwd-128-causal-sass.csv.gz": (86_144, 18_976, 17.5),
                   "h200-fa2-fwd-128-sass.csv.gz": (53_888, 19_024, 1.1)}
    assert pages["h200-fa2-fwd-64-causal-sass.csv.gz"].loops[-1][0] == 34_864      # before the loop
    # the page's executed instructions are the raw page's count of the same kernel (N = 256)
    k = _kernels("h200-ncu-short-causal")["ncu-fa2-64-256-causal-forward.csv"]
    assert pages["h200-fa2-fwd-64-causal-sass.csv.gz"].warp_instructions == k["smsp__inst_executed.sum"]
    assert sass.main([str(MEASURED_DIR / "h200-icache.json")]) == 2                   # not a page: exit 2


def test_the_instruction_caches_a_first_level_of_32_kib_a_second_of_128():
    doc = json.loads((MEASURED_DIR / "h200-icache.json").read_text())
    assert doc["source"] == "measured" and doc["provenance"]["gpu"] == "NVIDIA H200"
    cpi = {(r["code_kib"], r["warps_per_scheduler"]): r["cycles_per_instruction"] for r in doc["results"]}
    assert all(cpi[k, w] < 1.07 for k in (4, 8, 16, 24) for w in (1, 2, 4))
    assert all(2.40 < cpi[k, 1] < 2.48 for k in (48, 64, 96, 128))
    assert all(1.12 < cpi[k, 2] < 1.17 for k in (48, 64, 96, 128))
    assert all(5.85 < cpi[k, 1] < 5.95 for k in (192, 256))


def test_the_paced_kernel_leaves_as_much_dirty_as_the_store_only_one():
    doc = json.loads((MEASURED_DIR / "repeats" / "h200-2026-11-27-l2-store-retention-paced.json").read_text())
    mib = {(r["mode"], r["stored_bytes"] >> 20): r["dirty_at_end_bytes"] / 2**20 for r in doc["retention"]}
    big = (32, 40, 48, 64, 96, 128, 256)
    assert all(28.0 < mib["paced", m] < 28.5 for m in big)
    assert all(27.5 < mib["store", m] < 28.3 for m in big)
    assert mib["paced", 24] > 23.99                                    # below the bound: all of it


def test_the_free_clock_softmax_at_boost_gemms_lower():
    doc = json.loads((MEASURED_DIR / "h200-ncu-free-clock.json").read_text())
    clocks = {k["name"][:26]: k["sm__cycles_elapsed.avg.per_second"] for r in doc["runs"] for k in r["kernels"]}
    assert clocks["void at::<unnamed>::cunn_S"] > 1.97e9
    assert all(1.75e9 < v < 1.79e9 for n, v in clocks.items() if n.startswith("nvjet"))


def test_ncu_kernel_time_puts_the_preset_at_nsights_clock():
    from hbmsim.scenarios.experiment import resolve_hardware
    nk = _script("ncu_kernel_time")
    h200 = resolve_hardware("h200-sxm-141gb")
    o = nk.at_clock(h200, 1.32e9)
    assert o["clock_hz"] == 1.32e9
    assert o["vector_flops_per_s"] == pytest.approx(132 * 128 * 2 * 1.32e9, rel=1e-3)   # 128 FP32 lanes, FMA = 2
    assert o["sram_bytes_per_s_per_sm"] == pytest.approx(128 * 1.32e9)
    assert o["matmul_flops_per_s"] == pytest.approx(132 * 4096 * 1.32e9, rel=1e-4)     # 4096 FLOPs a clock an SM
    assert nk.at_clock(h200, 1.98e9)["matmul_flops_per_s"] == h200.matmul_flops_per_s  # quoted at 1.83 GHz
    run = nk.run_of("ncu-cudnn-256-4096-backward.csv", "h200-sxm-141gb")
    assert (run["algorithm"], run["variant"], run["workload"]["batch"], run["workload"]["heads"]) == \
        ("flash3", "cudnn-sm90", 4, 8)
    assert nk.main(["no-such-ncu-file"]) == 2


def test_fetch_regions_in_the_simulations_schedule():
    """scripts/fetch_regions.py, the check of a rule for the wait (validation.md): at N = 128 every
    block runs its one peeled step, so no two resident blocks run different code; at N = 256 they
    do for about 0.40 of the time (predicted schedule), and the measured waits are read off the files."""
    fr = _script("fetch_regions")
    assert fr.regions(*fr.step_starts(128, 64, True)) == (0.0, 0.0)
    differ, cold = fr.regions(*fr.step_starts(256, 64, True))
    assert 0.35 < differ < 0.45 and 0.40 < cold < 0.55
    waits = fr.measured_waits()
    assert round(waits["ncu-fa2-64-256-causal-forward.csv"], 2) == 1.31
    assert round(waits["ncu-fa2-64-256-forward.csv"], 2) == 0.20
    assert fr.main(["0"]) == 2
