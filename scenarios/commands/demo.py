"""`hbmsim demo`: the seed example through every program, then standard vs flash attention
forward on the A100 preset (the shipped `demo` experiment): table, ratios, figure and roofline."""
from __future__ import annotations

import numpy as np

from hbmsim.simulator import HbmsimError, load_gpu

from .. import report
from ..experiment import EXPERIMENTS_DIR, HARDWARE_DIR, load_experiment
from ..outputs import check_output_dir, make_output_dir
from ..runner import prepare, run_experiment, stderr_progress
from .common import write_results

DEMO_EXPERIMENT = "demo"
DEMO_FILES = ("demo.json", "demo.png", "roofline.png")     # what it writes into --out


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="standard vs flash attention on the A100 preset: table + figure")
    d.add_argument("--out", default="hbmsim-demo", help="folder for demo.png and demo.json (default: hbmsim-demo)")
    d.set_defaults(func=cmd_demo)


def seed_example() -> str:
    """The 4x4 worked example: every program must give the same O as the float64 reference."""
    from hbmsim.algorithms import registry
    from hbmsim.algorithms.reference import attention_forward
    from hbmsim.algorithms.workload import AttentionData, Workload
    from hbmsim.simulator import simulate

    q = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]], float)
    k = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1]], float)
    v = np.arange(1, 17, dtype=float).reshape(4, 4)
    wl = Workload(1, 1, 4, 4, 4, dtype="fp32", scale=1.0)
    data = lambda: AttentionData(q[None, None].copy(), k[None, None].copy(), v[None, None].copy())
    o_ref, _ = attention_forward(wl, data())
    gpu = load_gpu(HARDWARE_DIR / "a100-sxm4-40gb.toml")
    lines = ["Seed example (Q, K 4x4, V = 1..16, scale 1, blocks 2x2): O through the simulator",
             np.array2string(o_ref[0, 0], precision=2)]
    for spec in registry.algorithms():
        mapping, _ = spec.resolved(gpu, wl, spec.uniform(2), False)     # every block / tile 2 wide
        prog = spec.build(wl, mapping, data(), False)
        o = simulate(gpu, prog).outputs["O"][0]
        lines.append(f"  {prog.name:17s} max |O - reference| = {np.max(np.abs(o - o_ref[0, 0])):.1e}")
    return "\n".join(lines)


def cmd_demo(args) -> int:
    out = check_output_dir(args.out, "--out")          # made (if missing) only once the work is done
    for name in DEMO_FILES:
        if (out / name).is_dir():
            raise HbmsimError(f"--out {args.out!r}: {name!r} in it is a folder (demo writes {', '.join(DEMO_FILES)})")
    exp = prepare(load_experiment(EXPERIMENTS_DIR / f"{DEMO_EXPERIMENT}.toml"))
    print(seed_example())
    print()
    print(f"Standard vs flash attention forward on {exp.gpu.name}, count-only (numbers predicted, not measured):")
    results = run_experiment(exp, count_only=True, progress=stderr_progress)
    print(report.table(results))
    print(report.ratios(results))
    make_output_dir(out, "--out")
    write_results(results, str(out / "demo.json"), exp.name)
    png = report.plot_vs_seq_len(results, out / "demo.png",
                                 f"Attention forward on {exp.gpu.name}: predicted by hbmsim (simulated, not measured)")
    from .. import roofline
    roof = roofline.plot(results, exp.gpu, out / "roofline.png", f"Roofline: attention forward on {exp.gpu.name}")
    print(f"\nWrote {png}, {roof.name} and {out / 'demo.json'} (folder: {out.resolve()})")
    return 0
