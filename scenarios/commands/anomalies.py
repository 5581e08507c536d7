"""`hbmsim anomalies`: how often a bigger GPU is predicted slower (scenarios/anomalies.py)."""
from __future__ import annotations

import json

from ..experiment import resolve_hardware
from .common import count


def add_parser(sub) -> None:
    a = sub.add_parser("anomalies", help="measure how often a bigger GPU is predicted slower (scheduling anomalies)")
    a.add_argument("--hardware", default="a100-sxm4-40gb", help="preset or hardware TOML (default: a100-sxm4-40gb)")
    a.add_argument("--trials", type=count(1), default=30, help="random configurations to try (default 30)")
    a.add_argument("--seed", type=count(0), default=1, help="seed of the random configurations (default 1)")
    a.set_defaults(func=cmd_anomalies)


def cmd_anomalies(args) -> int:
    from ..anomalies import measure
    print(json.dumps(measure(resolve_hardware(args.hardware), args.trials, args.seed), indent=1))
    return 0
