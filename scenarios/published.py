"""Published measurements as measured files: the CSV that others' papers give, converted into the
`compare` schema with `"source": "published"`, the citation, GPU, set-up and FLOP convention in
the file, and on every run the program, variant and hardware preset that reproduce it (the
program and variant of each implementation: kernels/implementations.py).

The shipped file scenarios/measured/fa2-paper-fwd-bwd.json is `convert_fa2_paper_csv` of
../shared/published/fa2-paper-fwd-bwd.csv (a test checks that it still is). After a change to
the CSV or to the conversion, rebuild it with

    python -m hbmsim.scenarios.published ../shared/published/fa2-paper-fwd-bwd.csv
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from hbmsim.kernels.implementations import IN_FA2_PAPER as IMPLEMENTATIONS     # the paper's rows
from hbmsim.simulator import HbmsimError

MEASURED_DIR = Path(__file__).parent / "measured"
FA2_PAPER_FILE = MEASURED_DIR / "fa2-paper-fwd-bwd.json"

FA2_PAPER_PROVENANCE = {
    "short": "FlashAttention-2 paper (Dao 2023, arXiv 2307.08691), Fig. 4 (A100) and Fig. 7 (H100)",
    "citation": "Tri Dao, FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning, "
                "arXiv 2307.08691 (2023): Fig. 4 (A100 80GB SXM4) and Fig. 7 (H100 80GB SXM5), forward + backward; "
                "benchmark code benchmarks/benchmark_flash_attention.py in Dao-AILab/flash-attention",
    "gpu": "NVIDIA A100 80GB SXM4 and H100 80GB SXM5 (the paper's figures)",
    "setup": "fp16, no dropout, 16k tokens in total (batch = 16384 / seq_len), hidden size 2048 (head dim 64: "
             "32 heads; head dim 128: 16 heads), seq_len 512..16k; PyTorch runs out of memory at 16k",
    "timing": "benchmark_fwd_bwd of flash_attn/utils/benchmark.py: torch.utils.benchmark's Timer.timeit over a loop "
              "of calls between two synchronises, the mean per call: one call's host work overlaps the kernels of "
              "the one before; every run says \"calls\": \"back-to-back\"",
    "flop_convention": "forward = 4 N^2 d heads batch (halved when causal); forward + backward = 3.5 x forward; "
                       "time = FLOPs / the throughput read off the figure",
    "read_off": "throughput values read from the figures' printed bar labels; 'bar height (+-2)' marks values "
                "estimated from bar height (+-2 TFLOPs/s)",
}


def convert_fa2_paper_csv(csv_path: str | Path) -> dict:
    """The FlashAttention-2 paper's forward+backward grids as a measured file."""
    runs = []
    with Path(csv_path).open(newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            where = f"{csv_path}: row {i + 2}"
            impl = IMPLEMENTATIONS.get(row["implementation"])
            if impl is None:
                raise HbmsimError(f"{where}: field 'implementation' = {row['implementation']!r} must be one of "
                                  f"{', '.join(IMPLEMENTATIONS)}")
            n = int(row["seq_len"])
            runs.append({
                "algorithm": impl.algorithm, "variant": impl.variant, "implementation": row["implementation"],
                "pass": row["pass"], "hardware": row["gpu"], "source": "published",
                "workload": {"batch": int(row["batch"]), "heads": int(row["heads"]), "seq_len": n, "seq_len_q": n,
                             "seq_len_kv": n, "head_dim": int(row["head_dim"]), "dtype": row["dtype"],
                             "causal": row["causal"] == "true", "key_padding_mask": False,
                             "dropout": float(row["dropout"])},
                "time_s": float(row["time_ms"]) * 1e-3,
                "tflops_per_s": float(row["tflops_per_s"]),
                "read_off": row["read_off"],
                "citation": row["source"],
                "calls": "back-to-back",      # torch.utils.benchmark's timeit: a loop of calls
            })
    return {"source": "published", "provenance": {**FA2_PAPER_PROVENANCE, "implementations": {
        name: impl.describe(impl.in_fa2_paper) for name, impl in IMPLEMENTATIONS.items()}}, "runs": runs}


def measured_names() -> list[str]:
    """The shipped timing sets `hbmsim validate` reads by default: the measured files whose runs
    name an implementation (published and `hbmsim profile-library` files; `hbmsim profile` files of
    this project's own kernel, microbenchmarks and Nsight summaries are not timing sets)."""
    out = []
    for p in sorted(MEASURED_DIR.glob("*.json")):
        runs = json.loads(p.read_text()).get("runs") or [{}]
        if isinstance(runs[0], dict) and "implementation" in runs[0]:
            out.append(p.stem)
    return out


def resolve_measured(ref: str) -> Path:
    """A measured file: a path, or a shipped file's name (scenarios/measured/NAME.json)."""
    from .experiment import resolve_shipped
    return resolve_shipped(ref, MEASURED_DIR, ".json", "measured file",
                           "a measured JSON file or a shipped measured file's name")


def write_fa2_paper(csv_path: str | Path, out: str | Path = FA2_PAPER_FILE) -> Path:
    """Convert the FlashAttention-2 paper's CSV and write it as a measured file (by default the
    shipped scenarios/measured/fa2-paper-fwd-bwd.json)."""
    Path(out).write_text(json.dumps(convert_fa2_paper_csv(csv_path), indent=1) + "\n")
    return Path(out)


def main(argv=None) -> int:
    """`python -m hbmsim.scenarios.published CSV [--out JSON]`: rebuild the shipped file."""
    p = argparse.ArgumentParser(prog="python -m hbmsim.scenarios.published",
                                description="Convert the FlashAttention-2 paper's CSV into its measured file.")
    p.add_argument("csv", help="the paper's numbers (../shared/published/fa2-paper-fwd-bwd.csv)")
    p.add_argument("--out", default=str(FA2_PAPER_FILE), help="measured file to write (default: the shipped one)")
    a = p.parse_args(argv)
    try:
        print(write_fa2_paper(a.csv, a.out))
    except (HbmsimError, OSError, KeyError, ValueError) as err:      # a missing file, column or number
        print(f"published: {a.csv}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
