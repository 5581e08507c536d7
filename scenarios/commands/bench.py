"""`hbmsim bench`: the simulator's own speed against bare SimPy (scenarios/bench.py)."""
from __future__ import annotations

import json

from ..outputs import check_output_path, write_text_atomic


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="time the simulator on a GPT-2-medium-sized experiment vs bare SimPy")
    b.add_argument("--experiment", default="gpt2-medium", help="experiment to time (default: gpt2-medium)")
    b.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    b.add_argument("--mode", choices=("both", "fast", "full"), default="both",
                   help="fast mode (as hbmsim run), full simulation, or both (default)")
    b.add_argument("--instructions", action="store_true",
                   help="count instructions under valgrind's callgrind instead of timing (repeatable; minutes)")
    b.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from ..bench import bench
    if args.json:
        check_output_path(args.json, "--json")
    result = bench(args.experiment, mode=args.mode, instructions=args.instructions)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        write_text_atomic(args.json, text + "\n")
    return 0
