"""Predicted DRAM bytes against Nsight Compute's, kernel group by kernel group: a check of the
L2 model's counts (what reaches DRAM), not of time.

    python scripts/ncu_dram_bytes.py [NCU_FILE ...] [--plot PNG]   (default: the shipped h100-ncu-kernels)

Each run of an ncu file (scenarios/measured/*-ncu-kernels.json, `scripts/gpu_session.py`'s ncu
step) names its configuration in its file name: `ncu-IMPL-D-PASS.csv` (N = 4096, no mask),
`ncu-IMPL-D-N-CAUSAL-PASS.csv`, `n-IMPL-D-N[-causal]-PASS.csv`, with batch = 16384 / N and
heads = 2048 / D (the FlashAttention-2 paper's grid, fp16). IMPL fa2 is flash2 fa2-kernel,
pytorch is standard pytorch-bench. Nsight Compute ran with its default cache control ("all"): the
L2 written back and emptied before every kernel, outside it. The simulation does the same
(`simulate(..., flush_launches=True)`), so each kernel starts from an empty L2 as it did there.

Printed per kernel group (scenarios/kernel_rows.py) that has measured rows: the predicted and
the measured DRAM read and write bytes, and the error (predicted - measured) / measured. Where
the rows also carry Nsight's L2 sectors the SMs asked for (`lts__t_sectors_srcunit_tex_op_read`
and `_op_write`, kept by `gpu_session.py`'s ncu-stalls step), a second table sets hbmsim's
L2-side counts (every tile's bytes, or its 32-byte sectors where the program names an access
pattern: tensor.GATHER for PyTorch's transposing copies) against them, x 32 bytes. A group
whose rows the file filtered (the n-* files kept only some kernel names) compares the predicted
kernels its rows stand for. `--plot PNG`: predicted against measured bytes per kernel group, reads
and writes, log axes, y = x. A bad file or plot path is one line, exit 2.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from hbmsim.scenarios.experiment import Experiment
from hbmsim.scenarios.kernel_rows import GROUPS
from hbmsim.scenarios.outputs import check_plot_path, pyplot, save_figure
from hbmsim.scenarios.published import resolve_measured
from hbmsim.scenarios.runner import build_program, prepare
from hbmsim.scenarios.validate import config_of
from hbmsim.simulator import HbmsimError, simulate

DEFAULT = "h100-ncu-kernels"
TOKENS = 16384          # batch x N of the FA2 paper's grid
HIDDEN = 2048           # heads x head dim
IMPLS = {"fa2": ("flash2", "fa2-kernel"), "pytorch": ("standard", "pytorch-bench")}
NAME = re.compile(r"^n(?:cu)?-(?P<impl>[a-z0-9]+)-(?P<d>\d+)(?:-(?P<n>\d+))?(?:-(?P<causal>true|false|causal))?"
                  r"-(?P<pass>forward|backward)\.csv$")
GPU_OF = {"h100": "h100-sxm5-80gb", "h200": "h200-sxm-141gb"}


def run_of(file_name: str, hardware: str) -> dict | None:
    """The measured-file run (validate's schema) that an ncu file name stands for; None for a file
    that is not an attention pass (the microbenchmarks)."""
    m = NAME.match(file_name)
    if m is None or m["impl"] not in IMPLS:
        return None
    d, n = int(m["d"]), int(m["n"] or 4096)
    algorithm, variant = IMPLS[m["impl"]]
    return {"hardware": hardware, "algorithm": algorithm, "variant": variant, "time_s": 1.0,
            "pass": "forward+backward" if m["pass"] == "backward" else "forward",
            "workload": {"batch": TOKENS // n, "heads": HIDDEN // d, "seq_len": n, "head_dim": d, "dtype": "fp16",
                         "causal": m["causal"] in ("true", "causal")},
            "ncu_pass": m["pass"]}


L2_READ, L2_WRITE = "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum"
SECTOR_BYTES = 32


def predicted_bytes(run: dict, where: str) -> dict:
    """{kernel name: (DRAM read bytes, DRAM write bytes, L2-side read bytes, L2-side write bytes)}
    of the run's pass, each kernel from an empty L2 (summed over launches of one name)."""
    cfg = config_of(where, 0, run)
    cfg = prepare(Experiment("ncu", "ncu", cfg.gpu, [cfg])).configs[0]
    result = simulate(cfg.gpu, build_program(cfg, None, True), fold=True, flush_launches=True)
    out: dict = {}
    for k in result.kernels:
        if k.pass_name != run["ncu_pass"] or not k.launched:
            continue
        r, w, lr, lw = out.get(k.name, (0, 0, 0, 0))
        out[k.name] = (r + k.total("hbm_read"), w + k.total("hbm_write"), lr + k.total("read"), lw + k.total("write"))
    return out


def _groups(run: dict, rows: list, predicted: dict):
    """(group label, its measured rows, the predicted kernels they stand for) for each group with both."""
    for g in GROUPS[(run["algorithm"], run["variant"])]:
        mine = [r for r in rows if re.search(g.measured, r["name"])]
        names = [n for n in g.predicted if n in predicted]
        if mine and names:
            yield g.label, mine, names[:len(mine)]   # a filtered file: the predicted kernels its rows stand for


def compare(run: dict, rows: list, predicted: dict) -> list:
    """[(group, predicted read, measured read, predicted write, measured write)] DRAM bytes, for
    each group with measured rows."""
    return [(label, sum(predicted[n][0] for n in names), sum(r["dram__bytes_read.sum"] for r in mine),
             sum(predicted[n][1] for n in names), sum(r["dram__bytes_write.sum"] for r in mine))
            for label, mine, names in _groups(run, rows, predicted)]


def compare_l2(run: dict, rows: list, predicted: dict) -> list:
    """The same for the L2 side: hbmsim's L2-side read and write bytes against Nsight's sectors
    the SMs asked the L2 for, x 32 bytes; only groups whose every row has both counts. (Atomics,
    Nsight's op_red / op_atom, are not compared: hbmsim counts one as a read and a write.)"""
    return [(label, sum(predicted[n][2] for n in names), SECTOR_BYTES * sum(r[L2_READ] for r in mine),
             sum(predicted[n][3] for n in names), SECTOR_BYTES * sum(r[L2_WRITE] for r in mine))
            for label, mine, names in _groups(run, rows, predicted)
            if all(L2_READ in r and L2_WRITE in r for r in mine)]


def load_ncu(ref: str) -> tuple:
    path = resolve_measured(ref)
    try:
        data = json.loads(Path(path).read_text())
        runs = data["runs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HbmsimError(f"{path}: not an ncu kernels file ({e})") from None
    gpu = next((v for k, v in GPU_OF.items() if Path(path).name.startswith(k)), None)
    if gpu is None:
        raise HbmsimError(f"{path}: the file name does not name a GPU ({', '.join(GPU_OF)})")
    for i, r in enumerate(runs):
        if not isinstance(r, dict) or not isinstance(r.get("file"), str) or not isinstance(r.get("kernels"), list):
            raise HbmsimError(f"{path}: runs[{i}] needs a 'file' name and a list of 'kernels'")
        for j, k in enumerate(r["kernels"]):
            if not isinstance(k, dict) or not isinstance(k.get("name"), str):
                raise HbmsimError(f"{path}: runs[{i}].kernels[{j}] needs a 'name'")
            for field in ("dram__bytes_read.sum", "dram__bytes_write.sum", L2_READ, L2_WRITE):
                v = k.get(field)
                if field.startswith("lts") and v is None:
                    continue                   # optional: only ncu-stalls' files keep the L2's sectors
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                    raise HbmsimError(f"{path}: runs[{i}].kernels[{j}].{field} = {v!r} must be a number >= 0")
    return str(path), gpu, runs


def pct(p: float, m: float) -> str:
    return f"{(p - m) / m:+7.1%}" if m > 0 else "      -"


def _line(file: str, label: str, pr: float, mr: float, pw: float, mw: float) -> str:
    """One kernel group's row: MB read and written, predicted, measured, error."""
    return (f"  {(file + ': ' + label)[:58]:58s} {pr / 1e6:12.1f} {mr / 1e6:8.1f} {pct(pr, mr)}"
            f" {pw / 1e6:13.1f} {mw / 1e6:8.1f} {pct(pw, mw)}")


def plot(points: dict, path, sources: list) -> Path:
    """Predicted (x) against measured (y) DRAM bytes per kernel group, reads and writes, log-log."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    values = []
    for what, color, marker in (("read", "tab:blue", "o"), ("write", "tab:red", "s")):
        pts = [(p, m) for p, m in points[what] if p > 0 and m > 0]
        if pts:
            ax.scatter(*zip(*pts), color=color, marker=marker, alpha=0.8,
                       label=f"DRAM {what} bytes ({len(pts)} kernel groups)")
            values += [v for pt in pts for v in pt]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="gray", ls="--", label="y = x (prediction exact)")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="predicted by hbmsim, each kernel from an empty L2 (bytes)",
           ylabel="measured: Nsight Compute dram__bytes (bytes)",
           title="DRAM bytes per kernel group: " + ", ".join(Path(s).name for s in sources))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", default=[DEFAULT])
    ap.add_argument("--plot", metavar="PNG", help="predicted against measured DRAM bytes, log axes, y = x")
    a = ap.parse_args(argv)
    errors: dict = {"read": [], "write": [], "L2-side read": [], "L2-side write": []}
    points: dict = {"read": [], "write": []}
    sources = []
    try:
        plot_to = check_plot_path(a.plot) if a.plot else None      # before any work
        for ref in a.files:
            path, gpu, runs = load_ncu(ref)
            sources.append(path)
            print(f"{path} (measured: Nsight Compute DRAM bytes; predicted: hbmsim, each kernel from an empty L2)")
            print(f"  {'run / kernel group':58s} {'read MB pred':>12s} {'meas':>8s} {'err':>7s}"
                  f" {'write MB pred':>13s} {'meas':>8s} {'err':>7s}")
            l2_lines = []
            for i, r in enumerate(runs):
                run = run_of(r["file"], gpu)
                if run is None:
                    continue
                predicted = predicted_bytes(run, f"{path}: runs[{i}]")
                for label, pr, mr, pw, mw in compare(run, r["kernels"], predicted):
                    errors["read"].append(abs(pr - mr) / mr if mr else None)
                    errors["write"].append(abs(pw - mw) / mw if mw else None)
                    points["read"].append((pr, mr))
                    points["write"].append((pw, mw))
                    print(_line(r["file"], label, pr, mr, pw, mw))
                for label, pr, mr, pw, mw in compare_l2(run, r["kernels"], predicted):
                    errors["L2-side read"].append(abs(pr - mr) / mr if mr else None)
                    errors["L2-side write"].append(abs(pw - mw) / mw if mw else None)
                    l2_lines.append(_line(r["file"], label, pr, mr, pw, mw))
            if l2_lines:
                print("  L2 side (measured: Nsight's lts__t_sectors_srcunit_tex_op_read / _op_write x 32 B; "
                      "predicted: hbmsim's L2-side counts)")
                print("\n".join(l2_lines))
    except HbmsimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for what, es in errors.items():
        es = [e for e in es if e is not None]
        if es:
            print(f"{'DRAM ' if 'L2' not in what else ''}{what} bytes: {len(es)} kernel groups, median |error| "
                  f"{statistics.median(es):.1%}, worst {max(es):.1%}")
    if plot_to is not None and points["read"]:
        print(f"wrote {plot(points, plot_to, sources)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
