"""`hbmsim compare PREDICTED MEASURED`: predicted against measured, field by field
(scenarios/compare.py)."""
from __future__ import annotations

from ..outputs import check_plot_output


def add_parser(sub) -> None:
    c = sub.add_parser("compare", help="predicted (hbmsim run --json) vs measured (emulate/profile) per field")
    c.add_argument("predicted", help="results of `hbmsim run ... --json PATH` (source: predicted)")
    c.add_argument("measured", help="a measurement file: `hbmsim emulate` (emulated) or `hbmsim profile` (measured)")
    c.add_argument("--plot", metavar="PNG", help="draw predicted against measured traffic (log axes, y = x)")
    c.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    from ..compare import compare_files
    if args.plot:
        check_plot_output(args.plot, "--plot")
    print(compare_files(args.predicted, args.measured, args.plot))
    return 0
