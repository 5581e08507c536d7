"""The CLI's layout: one module per command (or small group) in scenarios/commands/, each with its
`add_parser`, small, and importing downward only: no library module imports a command."""
import ast
from pathlib import Path

from hbmsim.scenarios import commands
from hbmsim.scenarios.cli import build_parser

SCENARIOS = Path(commands.__file__).parent.parent


def imported(path: Path) -> set:
    """The modules a file imports, relative ones written as in the file (e.g. '.commands')."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names |= {base} | {f"{base}.{a.name}" if node.module else base + a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_no_library_module_imports_a_command():
    for path in SCENARIOS.glob("*.py"):
        if path.name == "cli.py":
            continue
        assert not any("commands" in name for name in imported(path)), path


def test_every_command_module_adds_its_parser_and_stays_small():
    for module in commands.COMMANDS:
        assert callable(module.add_parser), module.__name__
    for path in Path(commands.__file__).parent.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path
    assert len((SCENARIOS / "cli.py").read_text().splitlines()) <= 100


def test_the_parser_lists_every_command_in_its_order():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == ["demo", "run", "explain", "blockmap", "hardware", "bench", "anomalies", "emulate",
                                 "profile", "profile-library", "microbench", "compare", "validate"]
