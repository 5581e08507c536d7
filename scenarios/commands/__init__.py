"""The `hbmsim` commands, one module per command (or per small group), each a thin shell over
the library modules of scenarios/: it checks its outputs, calls the library and prints. Each
module has `add_parser(sub)`, which adds its command's arguments and sets `func`; the parser
(`scenarios/cli.py`) lists them in COMMANDS order. Commands import the library, never the
other way round.
"""
from . import anomalies, bench, blockmap, compare, demo, explain, hardware, measure, run, validate

# In the order `hbmsim --help` lists them.
COMMANDS = (demo, run, explain, blockmap, hardware, bench, anomalies, measure, compare, validate)
