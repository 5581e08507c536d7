"""The measurements a lent GPU owes the open issues, as one prepared run.

A session with a lent H100 or H200 has about 15 minutes of device time, machine start included. This
script runs, in order of what they settle (or in the order `--only` names them), every measurement
the docs leave for a GPU, each under its own time limit, and writes every file into one folder (the
device tool's $OUT) with a log. The budget is wall-clock: each step runs under the smaller of its
limit and what is left of the budget, and once less than MIN_STEP_S is left the rest are logged as
left out. A measurement that fails or runs out of time is logged
and the next one runs; each library command writes its file after every configuration, so a
stopped one keeps what it finished.

    python scripts/gpu_session.py --out "$OUT" --budget-s 540       # on the GPU machine
    python scripts/gpu_session.py --out x --dry-run                  # the plan, here

Then, on this machine: copy the files into scenarios/measured/ under the names STEPS gives
(`ship`), with their provenance as written, and run `hbmsim validate FILE` on each timing file.
tests/test_gpu_session.py checks that every command here parses against today's CLI.
"""
from __future__ import annotations

import argparse
import glob
import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# (It imports nothing from hbmsim, not even its argument checks: on the GPU machine it runs before
# hbmsim is installed, and installs it.)
PY = sys.executable
# kernels/store_retention.py's METRICS (written out: this script imports nothing from hbmsim)
STORE_RETENTION_METRICS = ("gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,"
                           "lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,"
                           "sm__cycles_elapsed.avg.per_second,device__attribute_display_name,"
                           "device__attribute_multiprocessor_count")
MIN_STEP_S = 30           # below this much budget a step is not started (a torch import alone takes ~10 s)


@dataclass(frozen=True)
class Step:
    name: str
    limit_s: int            # killed after this long
    commands: tuple         # argv lists, run one after another ({out}: the folder, {gpu}: h100 or h200)
    settles: str            # what the measurement is for (the issue and the question)
    ship: tuple = ()        # (file in the folder, where it goes in the repository)


def _ncu_run(csv: str, *library_args: str, ncu_options: tuple = ()) -> tuple:
    """`python -m hbmsim.kernels.library library_args` under Nsight Compute's full set (and
    `ncu_options`), its raw page into {out}/CSV (kernels/library_nsight.py: ncu_one, ncu_decode)."""
    return ("ncu", "--csv", "--page", "raw", "--set", "full", *ncu_options, "--profile-from-start", "off",
            "--log-file", f"{{out}}/{csv}", PY, "-m", "hbmsim.kernels.library", *library_args)


def _ncu(impl: str, head_dim: int, pass_name: str = "forward", seq_len: int = 4096, causal: bool = False) -> tuple:
    """One warmed pass of the library's `impl` into {out}/ncu-IMPL-D-N-PASS.csv (-causal before -PASS
    under a causal mask)."""
    mask = "-causal" if causal else ""
    return _ncu_run(f"ncu-{impl}-{head_dim}-{seq_len}{mask}-{pass_name}.csv", "--ncu", impl, str(head_dim),
                    str(seq_len), str(causal).lower(), pass_name)


def _ncu_wave(impl: str, head_dim: int, tiles: int, seq_len: int = 4224, pass_name: str = "forward") -> tuple:
    """As _ncu, one pass of one wave of `tiles` 128-row tiles an SM (batch 1, --tiles-per-sm),
    into {out}/ncu-IMPL-D-N-kK.csv (-backward before .csv for the backward)."""
    tail = "" if pass_name == "forward" else f"-{pass_name}"
    return _ncu_run(f"ncu-{impl}-{head_dim}-{seq_len}-k{tiles}{tail}.csv", "--ncu", impl, str(head_dim), str(seq_len),
                    "false", pass_name, "--tiles-per-sm", str(tiles))


def _ncu_sass(head_dim: int, causal: bool, seq_len: int = 256) -> tuple:
    """FA2's forward under Nsight's source page (its SASS, each instruction's address, executions and
    stall samples: scripts/sass_regions.py) into {out}/ncu-fa2-D-N-{causal,full}-sass.csv."""
    return ("ncu", "--csv", "--page", "source", "--print-source", "sass", "--section", "SourceCounters",
            "--section", "WarpStateStats", "--profile-from-start", "off", "--log-file",
            f"{{out}}/ncu-fa2-{head_dim}-{seq_len}-{'causal' if causal else 'full'}-sass.csv", PY, "-m",
            "hbmsim.kernels.library", "--ncu", "fa2", str(head_dim), str(seq_len), str(causal).lower(), "forward")


def _ncu_decode(batch: int, kv_len: int) -> tuple:
    """One decode call (library --ncu-decode) under Nsight Compute into {out}/ncu-decode-bB-N.csv, the
    L2 left as the kernels leave it (--cache-control none: the combine kernel reads the partial outputs
    the split kernel has just written, as it does outside ncu)."""
    return _ncu_run(f"ncu-decode-b{batch}-{kv_len}.csv", "--ncu-decode", str(batch), str(kv_len),
                    ncu_options=("--cache-control", "none"))


DECODE_NCU = ((1, 1024), (1, 16384), (8, 16384))
SHORT_CAUSAL = ((64, 128), (64, 256), (64, 512), (128, 128))     # (head dim, N) of ncu-short-causal
LONG_CAUSAL = ((64, 1024), (64, 4096), (128, 4096))              # and of ncu-causal-long
# (implementation, head dim, N, causal, pass) of ncu-free-clock
FREE_CLOCK = (("pytorch", 64, 4096, False, "forward"), ("cudnn", 64, 4096, False, "backward"),
              ("fa2", 64, 512, True, "forward"))


def _free_clock_csv(impl: str, head_dim: int, seq_len: int, causal: bool, pass_name: str) -> str:
    return f"ncu-{impl}-{head_dim}-{seq_len}{'-causal' if causal else ''}-{pass_name}-free-clock.csv"


def _summarise(csvs: tuple, out: str) -> tuple:
    return (PY, "-m", "hbmsim.kernels.library", "--summarise-ncu", *(f"{{out}}/{c}" for c in csvs), "--out", out)


STEPS = (
    Step("gpu-tests", 150, ((PY, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"),),
         "every test marked gpu passes on this machine (CuPy kernels against their emulation, microbenchmarks)"),
    Step("host", 120, ((PY, "-m", "hbmsim.scenarios.cli", "microbench", "--out", "{out}/{gpu}-host.json"),),
         "issue 23: the host's launch and dispatch fields (then `hbmsim validate --host-spec FILE`), and the "
         "rates: whether a lone sector costs the L2 32 bytes of its bandwidth (l2_read_lines_vs_sectors: "
         "PyTorch's transposing copy, 250 us measured against 121 predicted)",
         (("{gpu}-host.json", "scenarios/measured/{gpu}-host.json"),)),
    Step("one-wave", 240, ((PY, "-m", "hbmsim.kernels.library", "--impl", "fa2", "cudnn",
                            "--head-dim", "64", "128", "256", "--causal", "false", "--tiles-per-sm", "1", "2",
                            "--repeats", "10", "--out", "{out}/{gpu}-torch-one-wave.json"),),
         "issues 23 and 26: one wave of 128-row tiles, 1 and 2 per SM, N = 512 to 16896 (batch 1, heads to "
         "fit): how much two resident blocks overlap (FA2's forward: 1.67-1.71x one block's time at head dim "
         "128 on 2026-11-26's H100 and H200, the mma_sync_pipes effect's check), and the fixed cost of a tile "
         "(time against N: FA3's and the FP8 forward's N = 1k rows are predicted too fast)",
         (("{gpu}-torch-one-wave.json", "scenarios/measured/one-wave/{gpu}-torch-one-wave.json"),)),
    Step("many-waves", 180, ((PY, "-m", "hbmsim.kernels.library", "--impl", "fa2", "--head-dim", "64", "128",
                              "--causal", "false", "true", "--seq-lens", "512", "--tiles-per-sm", "2", "4", "8", "16",
                              "--repeats", "10", "--out", "{out}/{gpu}-torch-many-waves.json"),),
         "issue 23: FA2's forward at N = 512 in 1, 2, 4 and 8 waves of two 128-row tiles an SM: whether a "
         "block costs more when it follows another on its slot (one wave of two predicted within 1%, the same "
         "blocks in 8-16 waves 8-10% short, causal 25-34%: warp_issue's lead in docs/validation.md)",
         (("{gpu}-torch-many-waves.json", "scenarios/measured/one-wave/{gpu}-torch-many-waves.json"),)),
    Step("ncu-one-wave", 240, (
        _ncu_wave("fa2", 64, 1), _ncu_wave("fa2", 64, 2), _ncu_wave("fa2", 128, 1), _ncu_wave("fa2", 256, 1),
        _summarise(("ncu-fa2-64-4224-k1.csv", "ncu-fa2-64-4224-k2.csv", "ncu-fa2-128-4224-k1.csv",
                    "ncu-fa2-256-4224-k1.csv"), "{out}/{gpu}-ncu-one-wave.json")),
         "issue 23: FA2's forward in one wave under Nsight Compute, one block an SM (head dims 64 and 128) "
         "and two (64; 256, whose 64-row tiles make two at K = 1): where a lone block's time goes at head "
         "dim 64 (predicted 10-14% short, 128 within 4%), and why the operand reads overlap the mma.sync "
         "at 256 (predicted 20-24% long before warp_issue, within 3% since)",
         (("{gpu}-ncu-one-wave.json", "scenarios/measured/{gpu}-ncu-one-wave.json"),)),
    Step("lone-block", 240, (
        (PY, "-m", "hbmsim.scenarios.cli", "microbench", "--out", "{out}/{gpu}-microbench-4warps.json"),
        _ncu_wave("fa2", 64, 1, pass_name="backward"), _ncu_wave("fa2", 128, 1, pass_name="backward"),
        _summarise(("ncu-fa2-64-4224-k1-backward.csv", "ncu-fa2-128-4224-k1-backward.csv"),
                   "{out}/{gpu}-ncu-one-wave-bwd.json")),
         "issue 23: mma.sync's rate with one warp a scheduler (a lone 4-warp FA2 forward block is 10-14% "
         "longer than its counted work at head dim 64), and FA2's backward with one block an SM under Nsight "
         "(predicted 10-16% long at head dims 64 and 128, right at 256)",
         (("{gpu}-microbench-4warps.json", "scenarios/measured/{gpu}-microbench-4warps.json"),
          ("{gpu}-ncu-one-wave-bwd.json", "scenarios/measured/{gpu}-ncu-one-wave-bwd.json"))),
    Step("ncu-stalls", 300, (
        _ncu("fa2", 128), _ncu("pytorch", 64), _ncu("pytorch", 64, "backward"),
        _summarise(("ncu-fa2-128-4096-forward.csv", "ncu-pytorch-64-4096-forward.csv",
                    "ncu-pytorch-64-4096-backward.csv"), "{out}/{gpu}-ncu-stalls.json")),
         "issue 23: why FA2's forward overlaps its pipes only in part (warp stall reasons), whether "
         "PyTorch's transposing copy asks for a sector per element (global load sectors per request), and "
         "why the backward's stack into qkv.grad (CatArrayBatchedCopy, -30..-34% at kernel level) reads DRAM "
         "1.9x its gradients' bytes on an H100: its L2 sectors, hits and stalls",
         (("{gpu}-ncu-stalls.json", "scenarios/measured/{gpu}-ncu-stalls.json"),)),
    Step("hopper-library", 300, ((PY, "-m", "hbmsim.kernels.library", "--impl", "cudnn", "fa3", "fa2",
                                  "--head-dim", "64", "128", "256",          # the FA3 paper's three
                                  "--repeats", "10", "--out", "{out}/{gpu}-torch-hopper.json"),),
         "issue 26: torch's cuDNN attention and FlashAttention-3 (where installed) against the flash3 program, "
         "and FA2 beside them for the measured FA3/FA2 speed-up",
         (("{gpu}-torch-hopper.json", "scenarios/measured/{gpu}-torch-hopper.json"),)),
    Step("ncu-hopper", 240, (
        _ncu("cudnn", 64), _ncu("cudnn", 256),
        _summarise(("ncu-cudnn-64-4096-forward.csv", "ncu-cudnn-256-4096-forward.csv"), "{out}/{gpu}-ncu-hopper.json")),
         "issue 26: whether a warp-specialised Hopper kernel (cuDNN's attention) runs its exps under its wgmma "
         "GEMMs (the GMMA tensor pipe's and the XU pipe's active cycles) at head dims 64 and 256, where the "
         "flash3 program is 23% fast and 12% slow and scripts/fa3_serial_bound.py's no-overlap bound fits",
         (("{gpu}-ncu-hopper.json", "scenarios/measured/{gpu}-ncu-hopper.json"),)),
    Step("ncu-pipes", 240, (
        _ncu("cudnn", 128), _ncu("cudnn", 64, "backward"), _ncu("cudnn", 128, "backward"), _ncu("fa2", 256),
        _summarise(("ncu-cudnn-128-4096-forward.csv", "ncu-cudnn-64-4096-backward.csv",
                    "ncu-cudnn-128-4096-backward.csv", "ncu-fa2-256-4096-forward.csv"), "{out}/{gpu}-ncu-pipes.json")),
         "issue 26: whether cuDNN's forward at head dim 128 also runs its exps and its GEMMs one after the other "
         "(tensor + XU pipes ~100% of the time, as the ncu-hopper step found at 64 and 256 on an H200), "
         "and its backward's "
         "pipes and instruction mix (the flash3 backward is predicted 27-28% fast against it, its FMA pipe twice "
         "as busy as the counted FP32 work: FP32, integer address arithmetic or conversions?); issue 23: FA2's "
         "forward at head dim 256 (predicted 18-20% slow at kernel level)",
         (("{gpu}-ncu-pipes.json", "scenarios/measured/{gpu}-ncu-pipes.json"),)),
    Step("ncu-cudnn-bwd", 180, (
        _ncu("cudnn", 256, "backward"), _ncu("cudnn", 64, "backward", seq_len=1024),
        _ncu("cudnn", 64, "backward", causal=True),
        _summarise(("ncu-cudnn-256-4096-backward.csv", "ncu-cudnn-64-1024-backward.csv",
                    "ncu-cudnn-64-4096-causal-backward.csv"), "{out}/{gpu}-ncu-cudnn-bwd.json")),
         "issue 26: the warp instructions a score of cuDNN's sm90 backward (flash3 variant cudnn-sm90: "
         "CUDNN_BWD_INSTRUCTIONS_PER_SCORE, counted at head dims 64 and 128, N = 4096, no mask) at head dim 256 "
         "(predicted 26-48% fast with FA3's counting), at N = 1024 and under a causal mask (-24..-38% at N = 512: "
         "a block's fixed instructions and the mask's)",
         (("{gpu}-ncu-cudnn-bwd.json", "scenarios/measured/{gpu}-ncu-cudnn-bwd.json"),)),
    Step("decode", 240, ((PY, "-m", "hbmsim.kernels.library", "--decode", "--repeats", "10", "--out",
                          "{out}/{gpu}-decode-sdpa-gqa.json", "--out-kvcache", "{out}/{gpu}-decode-fa2-kvcache.json"),),
         "issue 25: decode with grouped-query heads, split-KV and paged caches",
         (("{gpu}-decode-sdpa-gqa.json", "scenarios/measured/{gpu}-decode-sdpa-gqa.json"),
          ("{gpu}-decode-fa2-kvcache.json", "scenarios/measured/{gpu}-decode-fa2-kvcache.json"))),
    Step("ncu-decode", 240, (
        *(_ncu_decode(b, n) for b, n in DECODE_NCU),
        _summarise(tuple(f"ncu-decode-b{b}-{n}.csv" for b, n in DECODE_NCU), "{out}/{gpu}-ncu-decode.json")),
         "issue 23: why FA2's split-KV combine kernel takes 3.6-9.8 us (measured kernel rows, H200) where one "
         "parallel load of the partial outputs predicts under 1 us: its loop over the splits (8, 32 and 4 "
         "here), L2 hits, long-scoreboard stalls a split",
         (("{gpu}-ncu-decode.json", "scenarios/measured/{gpu}-ncu-decode.json"),)),
    Step("ncu-short", 240, (
        _ncu("fa2", 64, seq_len=128), _ncu("fa2", 64, seq_len=256), _ncu("fa2", 128, seq_len=128),
        _summarise(("ncu-fa2-64-128-forward.csv", "ncu-fa2-64-256-forward.csv", "ncu-fa2-128-128-forward.csv"),
                   "{out}/{gpu}-ncu-short.json")),
         "issue 23: FA2's forward at one and two K/V steps a block (N = 128, 256: the paper grid's 16k "
         "tokens, 4,096 blocks) under Nsight Compute: a block's fixed instructions and the stall cycles each "
         "costs, which the long runs (about 530 fixed + 1,676 a step a warp at head dim 64) cannot separate; "
         "these runs are predicted 20-31% fast at kernel level since lock-step is gone, as short decodes are",
         (("{gpu}-ncu-short.json", "scenarios/measured/{gpu}-ncu-short.json"),)),
    Step("ncu-short-causal", 240, (
        *(_ncu("fa2", d, seq_len=n, causal=True) for d, n in SHORT_CAUSAL),
        _ncu("fa2", 64, seq_len=512),
        _summarise((*(f"ncu-fa2-{d}-{n}-causal-forward.csv" for d, n in SHORT_CAUSAL), "ncu-fa2-64-512-forward.csv"),
                   "{out}/{gpu}-ncu-short-causal.json")),
         "issue 23: FA2's causal forward at N = 128-512 under Nsight Compute beside the unmasked runs of "
         "ncu-short (and N = 512 unmasked here): the kernel level's worst FA2 forwards (-22..-38%) are these; "
         "the long causal run's count gives a masked step 251.9 more warp instructions, which moved them "
         "only 1-3.5 points: how much of the rest is the short block's own (fixed instructions, stalls) and "
         "how much the mask's at short N",
         (("{gpu}-ncu-short-causal.json", "scenarios/measured/{gpu}-ncu-short-causal.json"),)),
    Step("ncu-causal-long", 180, (
        *(_ncu("fa2", d, seq_len=n, causal=True) for d, n in LONG_CAUSAL),
        _summarise(tuple(f"ncu-fa2-{d}-{n}-causal-forward.csv" for d, n in LONG_CAUSAL),
                   "{out}/{gpu}-ncu-causal-long.json"),
        # the causal N = 256 kernel's SASS with each instruction's stall samples: the two copies of the
        # step, their sizes (addresses) and where the instruction-fetch waits fall
        _ncu_sass(64, True)),
         "issue 23: FA2's causal forward at N = 1024 and 4096 under Nsight Compute's full set (stall reasons): "
         "at N = 256 and 512 its warps wait on instruction fetch (no_instruction 1.31-1.41 warp-cycles an "
         "issued instruction, 0.09-0.23 unmasked and at one step, h200-ncu-short-causal.json) while its blocks "
         "run both copies of the step (the masking steps' and the rest's): does that wait last at longer N, "
         "where a block runs its masking steps once among many (the long causal runs are predicted within 5%)?",
         (("{gpu}-ncu-causal-long.json", "scenarios/measured/{gpu}-ncu-causal-long.json"),)),
    Step("icache", 240, (
        (PY, "-m", "hbmsim.kernels.icache", "--out", "{out}/{gpu}-icache.json"),
        *(_ncu_sass(d, causal) for d, causal in ((64, False), (128, True), (128, False)))),
         "issue 23: the SM's instruction-cache capacity (kernels/icache.py: a scheduler's cycles an FFMA over "
         "straight-line bodies of 4-256 KiB, 1-4 warps a scheduler; since 2026-11-27's second session also "
         "two different bodies of 4-64 KiB on each scheduler's warps, what FA2's causal blocks out of step "
         "pay) and the SASS of FA2's forward kernels "
         "(ncu's source page: each instruction's address, count and stall samples) unmasked at head dim 64 "
         "and with and without the mask at 128, beside the causal head-dim-64 kernel's (72 KB, "
         "ncu-causal-long): whether a causal kernel's two copies of the step outgrow the cache",
         (("{gpu}-icache.json", "scenarios/measured/{gpu}-icache.json"),)),
    Step("latency", 120, ((PY, "-m", "hbmsim.kernels.microbench", "--latency", "--out", "{out}/{gpu}-latency.json"),),
         "issue 23: an L2 hit's and a DRAM access's load-to-use latency on this GPU (pointer_chase): what each of "
         "the split-KV combine kernel's dependent split loads waits (Nsight: ~0.21 us a split at base and boost "
         "clocks alike, L2 hits), and the preset's hbm_latency_s (now an H800 PCIe figure)",
         (("{gpu}-latency.json", "scenarios/measured/{gpu}-latency.json"),)),
    Step("l2-retention", 90, (
        ("ncu", "--csv", "--page", "raw", "--metrics", STORE_RETENTION_METRICS, "--log-file",
         "{out}/ncu-l2-retention.csv", PY, "-m", "hbmsim.kernels.store_retention"),
        (PY, "-m", "hbmsim.kernels.store_retention", "--summarise", "{out}/ncu-l2-retention.csv", "--out",
         "{out}/{gpu}-l2-store-retention.json")),
         "issue 23: how many of a kernel's stores the L2 still holds dirty when it ends (kernels/store_retention.py: "
         "a store-only, a copy and a paced kernel of 4-256 MiB each under Nsight Compute, the L2 flushed before "
         "each): measured 2026-11-27, 0.47 of the L2 after a store-only kernel on both GPUs (l2_dirty_fraction); "
         "since then the paced kernel (stores a twentieth of DRAM's rate): does the L2 write back while DRAM "
         "idles, as FA2's compute-bound forward suggests (it leaves nothing dirty under Nsight)?",
         (("{gpu}-l2-store-retention.json", "scenarios/measured/{gpu}-l2-store-retention.json"),)),
    Step("ncu-free-clock", 270, (
        *(_ncu_run(_free_clock_csv(*run), "--ncu", *map(str, run[:3]), str(run[3]).lower(), run[4],
                   ncu_options=("--clock-control", "none")) for run in FREE_CLOCK),
        _summarise(tuple(_free_clock_csv(*run) for run in FREE_CLOCK), "{out}/{gpu}-ncu-free-clock.json")),
         "issue 23: PyTorch's forward, cuDNN's backward (head dim 64, N = 4096) and FA2's causal forward at "
         "N = 512 under Nsight Compute with the clock left free (--clock-control none): the SM clock each kernel "
         "really ran at (sm__cycles_elapsed.avg.per_second). At the locked base clock the softmax forward takes "
         "the same 13.0 M cycles on an H100 and an H200, yet in the kernel rows it runs 1.03-1.25x longer on the "
         "H200 at N >= 4096 (-15% predicted); cuDNN's backward takes 15% more cycles in the kernel rows at boost "
         "than at Nsight's locked clock, and FA2's short causal forward 19% more (the model: +2-7%): a lower "
         "clock under load, which NVML's 20 ms samples do not resolve (the H200's GEMMs ran at 1.76-1.78 GHz "
         "with the clock free, 2026-11-27)?",
         (("{gpu}-ncu-free-clock.json", "scenarios/measured/{gpu}-ncu-free-clock.json"),)),
    Step("ncu-tc", 180, (
        ("ncu", "--csv", "--page", "raw", "--set", "full", "-k", "regex:flash_attention_tc", "--log-file",
         "{out}/ncu-tc-64-4096.csv", PY, "-m", "hbmsim.scenarios.cli", "profile", "--kernel", "flash_attention_tc",
         "--block-q", "64,128", "--block-kv", "32,64", "--warps", "4", "--head-dim", "64", "--seq-len", "4096",
         "--causal", "false", "--warmup", "0", "--repeats", "1", "--no-ncu", "--quiet", "--out",
         "{out}/tc-scratch.json"),
        _summarise(("ncu-tc-64-4096.csv",), "{out}/{gpu}-ncu-tc.json")),
         "issue 23 (the measured side): this project's tensor-core kernel under Nsight Compute's full set at four "
         "blocks that do not spill (64 and 128 rows, 32 and 64 keys, 4 warps; head dim 64, N = 4096): its "
         "measured grid on the H200 (2026-11-27) runs 1.3-2.8x the predicted time and its block ranking does not "
         "follow the model's (Spearman -0.5..0.3 over the blocks without spills): which pipe or stall the "
         "model lacks (shared-memory bank conflicts of its ldmatrix reads, its synchronous loads?)",
         (("{gpu}-ncu-tc.json", "scenarios/measured/{gpu}-ncu-tc.json"),)),
    Step("grid-tc", 300, ((PY, "-m", "hbmsim.scenarios.cli", "profile", "--kernel", "flash_attention_tc",
                           "--seq-len", "4096", "--l2", "cold", "--out", "{out}/{gpu}-grid-tc-4k-cold.json"),),
         "issue 24: the tensor-core kernel's block grid at N = 4096, cold L2 (then `hbmsim blockmap --measured`)",
         (("{gpu}-grid-tc-4k-cold.json", "scenarios/measured/{gpu}-profile-grid-tc-4k.json"),)),
)


def gpu_prefix() -> str:
    """h100 or h200 from nvidia-smi's name ("gpu" when it says neither, or is missing)."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "gpu"
    return next((p for p in ("h100", "h200") if p in name.lower()), "gpu")


def tool(name: str) -> str:
    """A CUDA tool's path: on PATH, else where CUDA and Nsight Compute install it, else the bare name."""
    found = shutil.which(name)
    if found:
        return found
    paths = sorted(glob.glob(f"/usr/local/cuda*/bin/{name}"))
    paths += sorted(glob.glob(f"/opt/nvidia/nsight-compute/*/{name}"))
    return paths[-1] if paths else name


def expand(argv: tuple, out: str, gpu: str) -> list:
    cmd = [a.format(out=out, gpu=gpu) for a in argv]
    return [tool(cmd[0])] + cmd[1:] if cmd and cmd[0] == "ncu" else cmd


def plan(names: list | None, budget_s: float) -> tuple:
    """(steps to try, in order: STEPS' or the order `names` gives; the budget's split: (step, "sure" when
    the limits before it and its own fit the budget, else "if time is left")). The run itself goes by
    the clock (main), so a step marked "if time is left" runs when the ones before it end early."""
    steps = list(STEPS) if not names else [next(s for s in STEPS if s.name == n) for n in dict.fromkeys(names)]
    split, used = [], 0
    for step in steps:
        used += step.limit_s
        split.append((step, "sure" if used <= budget_s else "if time is left"))
    return steps, split


def run_step(step: Step, out: Path, gpu: str, log, limit_s: float | None = None) -> dict:
    """Run the step's commands in turn, all within `limit_s` (default its own limit)."""
    limit_s = step.limit_s if limit_s is None else min(limit_s, step.limit_s)
    start = time.monotonic()
    result = {"step": step.name, "settles": step.settles, "commands": [], "status": "ok"}
    for argv in step.commands:
        cmd = expand(argv, str(out), gpu)
        left_s = limit_s - (time.monotonic() - start)
        print(f"$ {shlex.join(cmd)}", file=log, flush=True)
        try:
            p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=max(left_s, 1))
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        except OSError as err:        # the tool is missing (ncu, nvidia-smi)
            rc = f"not run: {err}"
        result["commands"].append({"argv": cmd, "rc": rc})
        if rc != 0:
            result["status"] = f"failed ({rc})"
            break
    result["wall_s"] = round(time.monotonic() - start, 1)
    result["files"] = sorted(p.name for p in out.iterdir() if p.is_file())
    return result


def _positive_s(text: str) -> float:
    """--budget-s: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number of seconds above 0")
    return value


def main(argv=None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--out", required=True, help="folder for every file (the device tool's $OUT)")
    a.add_argument("--budget-s", type=_positive_s, default=540, help="seconds the steps may take in all (default 540)")
    a.add_argument("--only", nargs="+", choices=[s.name for s in STEPS], help="these steps (default: all)")
    a.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = a.parse_args(argv)
    gpu = "GPU" if args.dry_run else gpu_prefix()       # GPU: h100 or h200 when it runs
    steps, split = plan(args.only, args.budget_s)
    if args.dry_run:
        print(f"budget {args.budget_s:.0f} s of wall clock; a step starts while {MIN_STEP_S} s or more are left")
        for s, when in split:
            print(f"{s.name} (up to {s.limit_s} s, {when}): {s.settles}")
            for c in s.commands:
                print("    " + shlex.join(expand(c, args.out, gpu)))
            for src, dst in s.ship:
                print(f"    ship {src.format(gpu=gpu)} -> {dst.format(gpu=gpu)}")
        return 0
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:                                  # the device machine's copy of the tree may not be installed
        subprocess.run([PY, "-c", "import hbmsim.simulator"], check=True, capture_output=True, timeout=60)
    except subprocess.CalledProcessError:
        subprocess.run([PY, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "-e", "."], timeout=300)
    results, left = [], []

    def save():                           # after every step, so a killed run keeps what it finished
        (out / "gpu_session.json").write_text(json.dumps({"gpu": gpu, "results": results, "left_out": left},
                                                         indent=1) + "\n")
    with open(out / "gpu_session.log", "w") as log:
        for step in steps:
            left_s = args.budget_s - (time.monotonic() - start)
            if left_s < MIN_STEP_S:
                left.append(step.name)
                print(f"== {step.name}: left out ({left_s:.0f} s of the budget left)", file=log, flush=True)
            else:
                print(f"== {step.name} (within {min(left_s, step.limit_s):.0f} s): {step.settles}", file=log,
                      flush=True)
                results.append(run_step(step, out, gpu, log, left_s))
                print(f"{step.name}: {results[-1]['status']} in {results[-1]['wall_s']} s", flush=True)
            save()
    return 0 if all(r["status"] == "ok" for r in results) and not left else 1

if __name__ == "__main__":
    raise SystemExit(main())
