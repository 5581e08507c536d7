"""The `hbmsim` command: its parser and `main`. Each command lives in scenarios/commands/ (demo,
run, explain, blockmap, hardware, bench, anomalies, the real-kernel commands emulate, profile,
profile-library and microbench, compare, validate), a thin shell over the library modules.

User errors (bad scenario, block too big, bad shapes, an output that cannot be written) print one
line and exit 2; a Ctrl-C exits 130 after saying what was kept; a closed pipe exits 141 quietly.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys

from hbmsim.simulator import HbmsimError

from .commands import COMMANDS
from .commands.common import Interrupted, Parser


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="hbmsim", description="Simulate attention on a GPU memory hierarchy.")
    p.add_argument("--version", action="version", version=f"hbmsim {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("hbmsim")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        code = args.func(args)
        sys.stdout.flush()          # a closed pipe shows here, where it is handled, not at exit
        return code
    except HbmsimError as err:
        print(f"hbmsim: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if isinstance(err, BrokenPipeError) or err.errno == errno.EPIPE:
            # The reader went away (`hbmsim compare ... | head`): stop quietly, as Unix tools do.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 141
        print(f"hbmsim: error: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)   # a folder, unwritable
        return 2
    except Interrupted as err:
        print(f"hbmsim: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("hbmsim: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
