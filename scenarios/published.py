"""Published measurements as measured files: the CSV that others' papers give, converted into the
`compare` schema with `"source": "published"`, the citation, GPU, set-up and FLOP convention in
the file, and on every run the program, variant and hardware preset that reproduce it.

The shipped files live in scenarios/measured/ and were made with `convert_fa2_paper_csv` from
../shared/published/fa2-paper-fwd-bwd.csv (tests check that they still equal that conversion).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from hbmsim.simulator import HbmsimError

MEASURED_DIR = Path(__file__).parent / "measured"

# Which hbmsim program and variant reproduces each implementation the FlashAttention-2 paper
# timed (see the README's Mappings table for the sources of each variant).
FA2_PAPER_IMPLEMENTATIONS = {
    "fa2": {"algorithm": "flash2", "variant": "fa2-kernel",
            "why": "FlashAttention-2 v2.0.x, the paper's release (July 2023)"},
    "fa1": {"algorithm": "flash1", "variant": "fa1-kernel",
            "why": "FlashAttention v1.0.9, the newest v1 at the time (Dao-AILab/flash-attention#505), which "
                   "splits the query sequence across thread blocks"},
    "pytorch": {"algorithm": "standard", "variant": "pytorch-bench",
                "why": "attention_pytorch of benchmarks/benchmark_flash_attention.py"},
}

FA2_PAPER_PROVENANCE = {
    "short": "FlashAttention-2 paper (Dao 2023, arXiv 2307.08691), Fig. 4 (A100) and Fig. 7 (H100)",
    "citation": "Tri Dao, FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning, "
                "arXiv 2307.08691 (2023): Fig. 4 (A100 80GB SXM4) and Fig. 7 (H100 80GB SXM5), forward + backward; "
                "benchmark code benchmarks/benchmark_flash_attention.py in Dao-AILab/flash-attention",
    "gpu": "NVIDIA A100 80GB SXM4 and H100 80GB SXM5 (the paper's figures)",
    "setup": "fp16, no dropout, 16k tokens in total (batch = 16384 / seq_len), hidden size 2048 (head dim 64: "
             "32 heads; head dim 128: 16 heads), seq_len 512..16k; PyTorch runs out of memory at 16k",
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
            impl = FA2_PAPER_IMPLEMENTATIONS.get(row["implementation"])
            if impl is None:
                raise HbmsimError(f"{where}: field 'implementation' = {row['implementation']!r} must be one of "
                                  f"{', '.join(FA2_PAPER_IMPLEMENTATIONS)}")
            n = int(row["seq_len"])
            runs.append({
                "algorithm": impl["algorithm"], "variant": impl["variant"], "implementation": row["implementation"],
                "pass": row["pass"], "hardware": row["gpu"], "source": "published",
                "workload": {"batch": int(row["batch"]), "heads": int(row["heads"]), "seq_len": n, "seq_len_q": n,
                             "seq_len_kv": n, "head_dim": int(row["head_dim"]), "dtype": row["dtype"],
                             "causal": row["causal"] == "true", "key_padding_mask": False,
                             "dropout": float(row["dropout"])},
                "time_s": float(row["time_ms"]) * 1e-3,
                "tflops_per_s": float(row["tflops_per_s"]),
                "read_off": row["read_off"],
                "citation": row["source"],
            })
    return {"source": "published", "provenance": {**FA2_PAPER_PROVENANCE, "implementations": {
        k: f"hbmsim algorithm {v['algorithm']}, variant {v['variant']}: {v['why']}"
        for k, v in FA2_PAPER_IMPLEMENTATIONS.items()}}, "runs": runs}


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


def write_fa2_paper(csv_path: str | Path, out: str | Path = MEASURED_DIR / "fa2-paper-fwd-bwd.json") -> Path:
    Path(out).write_text(json.dumps(convert_fa2_paper_csv(csv_path), indent=1) + "\n")
    return Path(out)
