"""The FlashAttention-3 paper's H100 figures as a measured file (`"source": "published"`), in the
schema of scenarios/published.py's FA2 set: scenarios/measured/fa3-paper-h100.json is
`convert_fa3_paper_csv` of scenarios/published/fa3-paper-h100.csv (a test checks that it still
is). Rebuild it with

    python -m hbmsim.scenarios.published_fa3
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from hbmsim.simulator import HbmsimError

from .published import MEASURED_DIR

FA3_PAPER_CSV = Path(__file__).parent / "published" / "fa3-paper-h100.csv"
FA3_PAPER_FILE = MEASURED_DIR / "fa3-paper-h100.json"

# implementation -> (hbmsim program, variant, what the paper timed)
IMPLEMENTATIONS = {
    "fa3": ("flash3", "fa3-kernel", "FlashAttention-3, fp16 (hopper/ of Dao-AILab/flash-attention, July 2024)"),
    "fa3-fp8": ("flash3", "fp8", "FlashAttention-3, FP8 e4m3 forward (Q, K, V in e4m3, O in bf16)"),
    "fa2-fa3paper": ("flash2", "fa2-kernel", "FlashAttention-2 as timed in the FlashAttention-3 paper (the "
                     "flash-attn release of mid 2024, sm80 code on H100)"),
}

# The kernels the paper timed (July 2024) chose some tiles other than today's (flash3_spec's rules, taken
# from a 2026 commit): each run records the paper's own, so that validate simulates what was timed.
# (implementation, head dim) -> mapping fields; source: Dao-AILab/flash-attention at the paper's time.
PAPER_KERNELS_SOURCE = (
    "fp16: hopper/flash_fwd_launch_template.h at commit 3c4053b7 (2024-07-23), run_mha_fwd_hdim64: "
    "Flash_fwd_kernel_traits<64, 192, 128, 16, 2, ...> (kBlockN 128 with or without a mask, today 192 "
    "without), P V from registers (rs_op_selector in mainloop_fwd_sm90_tma_gmma_ws.hpp; today's "
    "MmaPV_is_RS is false at head dim 64 without a mask); hdim128 and hdim256 as today; "
    "flash_bwd_launch_template.h run_mha_bwd_hdim128: Flash_bwd_kernel_traits<128, 64, 128, 12, ...> "
    "(kBlockM 64, today 80 without a mask), hdim64 as today. FP8: hopper/flash_fwd_launch_template.h at "
    "commit 5018ac6a (2024-07-30), run_mha_fwd_fp8_hdim64: kBlockM 192, kBlockN 128, kStages 4 (today "
    "192 x 160, 2 stages); hdim128: 128 x 256, 2 stages (today 128 x 224); hdim256: 128 x 128 as today. "
    "Tile order (lpt_order = false on every FA3 run): hopper/tile_scheduler.hpp at 3c4053b7, "
    "DynamicPersistentTileScheduler, query block first in order, then head, then batch; the FP8 kernel of "
    "5018ac6a not persistent; today causal kernels take the longest tiles first, in L2 sections")
PAPER_KERNELS = {
    ("fa3", 64): {"block_q": 192, "block_kv": 128, "pv_in_registers": True, "block_q_bwd": 128, "block_kv_bwd": 128},
    ("fa3", 128): {"block_q_bwd": 64, "block_kv_bwd": 128},
    ("fa3-fp8", 64): {"block_q": 192, "block_kv": 128, "stages": 4},
    ("fa3-fp8", 128): {"block_q": 128, "block_kv": 256, "stages": 2},
}
# The FA3 kernels the paper timed took their tiles in the grid's order (commit 3c4053b7:
# DynamicPersistentTileScheduler maps its counter to query block first, then head, then batch, in
# order; the FP8 kernel of 5018ac6a had no persistent scheduler), not today's longest-first order in
# L2 sections (flash3.lpt_tile), so every FA3 run of the set records lpt_order = false.
PAPER_TILE_ORDER = {"lpt_order": False}

# The paper's GPU ran at a locked clock (appendix C.1: "To reduce variability, we fix the GPU clock
# speed to 1830MHz (clock speed used to calculate the 989 TFLOPS FP16 theoretical max throughput)").
# The h100-sxm5-80gb preset's per-clock rates are at its 1980 MHz maximum SM clock; each run
# carries them at 1830 MHz (the tensor-core peaks are at 1830 MHz already, DRAM has its own clock):
PAPER_CLOCK_HZ = 1.83e9
FA3_PAPER_CLOCK = {
    "clock_hz": PAPER_CLOCK_HZ,                          # the special-function unit's exps: 16 a clock per SM
    "vector_flops_per_s": 16_896 * 2 * PAPER_CLOCK_HZ,   # 16,896 FP32 lanes, an FMA = 2 FLOPs, a clock
    "sram_bytes_per_s_per_sm": 128 * PAPER_CLOCK_HZ,     # 128 bytes of shared memory a clock per SM
    "l2_bytes_per_s": 4472.3 * PAPER_CLOCK_HZ,           # the preset's microbenchmarked 4472.3 bytes a clock
}

FA3_PAPER_PROVENANCE = {
    "short": "FlashAttention-3 paper (Shah et al. 2024, arXiv 2407.08608), H100 forward, backward and FP8 figures",
    "citation": "Jay Shah, Ganesh Bikshandi, Ying Zhang, Vijay Thakkar, Pradeep Ramani, Tri Dao, FlashAttention-3: "
                "Fast and Accurate Attention with Asynchrony and Low-precision, arXiv 2407.08608 (2024), section 4.1: "
                "the forward speed figure (FP16/BF16), the backward speed figure (FP16/BF16) and the FP8 forward "
                "speed figure, H100 80GB SXM5; benchmark hopper/benchmark_attn.py in Dao-AILab/flash-attention",
    "gpu": "NVIDIA H100 80GB SXM5 (the paper's figures)",
    "setup": "16k tokens in total (batch = 16384 / seq_len), hidden size 2048 (heads = 2048 / head dim); the paper "
             "benchmark's set-up as pytorch/benchmark commit ff65cb675209d2308f7d27c6920af8a32de9aa90 states it "
             "('the FA3 paper sizes inputs such that B*S=16k and H*Dhead=2048'). Shipped: seq_len 1k, 4k, 16k of "
             "the figures' 512..16k, to keep validate short",
    "clock": "the paper's appendix C.1: the GPU clock locked at 1830 MHz; each run's hardware_overrides give the "
             "preset's per-clock rates (SFU, FP32 lanes, shared memory, L2) at that clock",
    "fp8_lengths": "the FP8 runs at '4k' and '16k' are the benchmark's 4224 (batch 4) and 16896 (batch 1): appendix "
                   "C.2 (lengths from 4k made divisible by the 132 SMs) and hopper/benchmark_flash_attention_fp8.py "
                   "line 222 at Dao-AILab/flash-attention commit 5018ac6a (bs_seqlen_vals ... (4, 4224), (2, 8448), "
                   "(1, 8448 * 2)); their times are the printed TFLOP/s at those sizes",
    "timing": "hopper/benchmark_attn.py times a loop of calls with the host running ahead of the GPU (triton's "
              "do_bench for the forward, flash_attn/utils/benchmark.py's benchmark_backward, torch.utils.benchmark's "
              "timeit, for the backward): one call's host work overlaps the kernels of the one before; every run "
              "says \"calls\": \"back-to-back\"",
    "kernels": PAPER_KERNELS_SOURCE,
    "flop_convention": "forward = 4 N^2 d heads batch, halved when causal (hopper/benchmark_attn.py line 62: "
                       "batch nheads 2 seqlen_q avg_seqlen (headdim + headdim_v)); backward = 2.5 x forward "
                       "(benchmark_attn.py line 398); time = FLOPs / the printed throughput",
    "read_off": "each value is a bar's printed label, as given in text by the transcription of the paper's figure "
                "image cited on the run (subtext.edge.nugit.net/image/<hash>, a text rendering of the arXiv HTML "
                "figures); values whose label could not be read in text (FP8, head dim 64, causal, 4k and 16k) are "
                "left out. The panels' titles do not say whether they are causal: of the two panels each figure "
                "has per head dim, the one whose every bar is lower (standard attention, FA2 and FA3 alike, as "
                "halving the counted FLOPs of a causal pass makes it) is entered as the causal one. The backward "
                "figure has one panel per head dim, entered as non-causal",
}


def convert_fa3_paper_csv(csv_path: str | Path = FA3_PAPER_CSV) -> dict:
    runs = []
    with Path(csv_path).open(newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            where = f"{csv_path}: row {i + 2}"
            if row["implementation"] not in IMPLEMENTATIONS:
                raise HbmsimError(f"{where}: field 'implementation' = {row['implementation']!r} must be one of "
                                  f"{', '.join(IMPLEMENTATIONS)}")
            algorithm, variant, _ = IMPLEMENTATIONS[row["implementation"]]
            n = int(row["seq_len"])
            runs.append({
                "algorithm": algorithm, "variant": variant, "implementation": row["implementation"],
                "pass": row["pass"], "hardware": row["gpu"], "source": "published",
                "workload": {"batch": int(row["batch"]), "heads": int(row["heads"]), "seq_len": n, "seq_len_q": n,
                             "seq_len_kv": n, "head_dim": int(row["head_dim"]), "dtype": row["dtype"],
                             "causal": row["causal"] == "true", "key_padding_mask": False, "dropout": 0.0},
                "hardware_overrides": dict(FA3_PAPER_CLOCK),
                "time_s": float(row["time_ms"]) * 1e-3, "tflops_per_s": float(row["tflops_per_s"]),
                "read_off": row["read_off"], "citation": row["source"],
                "calls": "back-to-back",      # a loop of calls, the host running ahead (FA3_PAPER_PROVENANCE's timing)
                **PAPER_KERNELS.get((row["implementation"], int(row["head_dim"])), {}),
                **(PAPER_TILE_ORDER if algorithm == "flash3" else {}),
            })
    return {"source": "published", "provenance": {**FA3_PAPER_PROVENANCE, "implementations": {
        name: f"hbmsim algorithm {a}, variant {v}: {what}" for name, (a, v, what) in IMPLEMENTATIONS.items()}},
        "runs": runs}


def main(argv=None) -> int:
    """`python -m hbmsim.scenarios.published_fa3`: rebuild the shipped file from the shipped CSV."""
    try:
        FA3_PAPER_FILE.write_text(json.dumps(convert_fa3_paper_csv(), indent=1) + "\n")
    except (HbmsimError, OSError, KeyError, ValueError) as err:
        print(f"published_fa3: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    print(FA3_PAPER_FILE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
