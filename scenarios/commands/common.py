"""What several commands share: the parser's one-line errors, argument types, the time model's
--without and --host-spec, the check of --plot and --json, how a Ctrl-C after saved work ends, and the results
file of `run` and `demo`."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from hbmsim.simulator import TimeModel
from hbmsim.simulator.host import DEFAULT_HOST, host_from_measured

from ..outputs import check_output_path, check_plot_output, write_text_atomic


class Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors (and exit code 2)."""

    def error(self, message):
        print(f"hbmsim: error: {self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


class Interrupted(Exception):
    """Ctrl-C during a run, after what finished was saved: one line, exit 130."""


def count(minimum: int):
    """An argparse type: a whole number >= minimum, named in the error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value
    return parse


def time_model(args) -> TimeModel:
    """The time model with the effects named by --without switched off, and the host's fields
    from --host-spec FILE (a measured file of `hbmsim microbench --host`) when given."""
    model = TimeModel().off(*(args.without or ()))
    path = getattr(args, "host_spec", None)
    if path:
        model = dataclasses.replace(model, host_spec=host_from_measured(path, DEFAULT_HOST))
    return model


def add_without(parser) -> None:
    parser.add_argument("--without", action="append", choices=TimeModel.effects(), metavar="EFFECT",
                        help="switch an effect of the time model off (repeatable): "
                             + ", ".join(TimeModel.effects()))
    parser.add_argument("--host-spec", metavar="FILE",
                        help="the host's launch and dispatch fields measured by `hbmsim microbench --host` (a "
                             "measured file with a host_spec table; fields it lacks keep the public figures)")


def check_plot_and_json(args) -> None:
    """A command's --plot and --json outputs, checked before any work."""
    if args.plot:
        check_plot_output(args.plot, "--plot")
    if args.json:
        check_output_path(args.json, "--json")


def results_doc(name: str, results: list[dict], complete: bool, stopped: str | None = None) -> str:
    """The JSON that `run --json` and `demo` write: {"experiment", "complete", ["stopped"], "runs"}."""
    doc = {"experiment": name, "complete": complete}
    if stopped:
        doc["stopped"] = stopped
    doc["runs"] = results
    return json.dumps(doc, indent=1) + "\n"


def write_results(results: list[dict], dest: str, name: str = "", complete: bool = True,
                  stopped: str | None = None, quiet: bool = False) -> None:
    """results_doc to `dest` (a file, said on stderr unless quiet), or to stdout with "-"."""
    text = results_doc(name, results, complete, stopped)
    if dest == "-":
        sys.stdout.write(text)
    else:
        write_text_atomic(dest, text)
        if not quiet:
            print(f"wrote {dest}", file=sys.stderr)
