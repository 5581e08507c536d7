"""validate's cache of finished simulations, kept per program.

Every simulation `hbmsim validate` finishes is kept in $HBMSIM_CACHE/validate/simulations.jsonl
(kernels/emulation.cache_dir, default ~/.cache/hbmsim; a sweep.ResultsLog shared between
processes), under its configuration's key (sweep.config_key: the workload, the resolved mapping,
every hardware field, the time model) and the hash of the code that simulates it: every source
file of the simulator, scenarios and kernels packages, and of the programs package the modules
that no program's spec imports (the registry, the reference), plus the modules its own program's
spec module imports, directly or not (`program_files`: flash2's spec imports neither flash3.py
nor flash1_kernel.py). So a rerun of the same code (another --host-spec, another --only, after
Ctrl-C) simulates only what the file lacks; an edit to one program's modules simulates that
program's configurations again and keeps the others'; an edit to a preset's numbers, which are in
the key, those on that GPU (its [source] citations change nothing); any other code change, all of
them. Records no current code wrote are dropped when the cache opens. HBMSIM_NO_CACHE=1 or
`validate --no-cache` turns it off (the tests do).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import sys
from pathlib import Path

from .sweep import ResultsLog

NO_CACHE_ENV = "HBMSIM_NO_CACHE"
CACHE_FILE = "simulations.jsonl"
HASH_CHARS = 20


def _package_files(pkg) -> list:
    root = Path(pkg.__file__).parent
    return [(f"{pkg.__name__}/{f.relative_to(root).as_posix()}", f)
            for f in sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)]


def _algorithm_imports(path: Path) -> set:
    """The hbmsim.algorithms modules (by name) that the module at `path` imports, read from its
    source: `from .x import`, `from . import x`, `from hbmsim.algorithms.x import`, `import
    hbmsim.algorithms.x`; the package itself as "__init__" (which imports every program)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        absolute = isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hbmsim.algorithms")
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        elif absolute and node.level == 0:
            parts = node.module.split(".")
            out.update([parts[2]] if len(parts) > 2 else ["__init__"] + [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[2] if a.name.count(".") >= 2 else "__init__"
                       for a in node.names if a.name.startswith("hbmsim.algorithms"))
    return out


def _closure(start: set, imports: dict) -> set:
    seen, todo = set(), list(start)
    while todo:
        m = todo.pop()
        if m not in seen and m in imports:
            seen.add(m)
            todo += imports[m]
    return seen


@functools.cache
def program_files() -> dict:
    """{program name: the hbmsim.algorithms module names its spec module imports, itself included,
    directly or not} for every registered program of hbmsim's own (one a test registers from
    elsewhere is left out: not cached)."""
    import hbmsim.algorithms as algorithms
    root = Path(algorithms.__file__).parent
    imports = {p.stem: _algorithm_imports(p) for p in root.glob("*.py")}
    out = {}
    for spec in algorithms.algorithms(hopper=True):
        homes = {m.__name__.rsplit(".", 1)[1] for m in list(sys.modules.values())
                 if getattr(m, "__name__", "").startswith("hbmsim.algorithms.")
                 and any(v is spec for v in vars(m).values())}
        if homes:
            out[spec.name] = frozenset(_closure(homes, imports))
    return out


@functools.cache
def code_hashes() -> dict:
    """{program name: sha256 (HASH_CHARS hex digits) of the code that simulates its configurations}:
    the shared files (simulator, scenarios, kernels; the programs package's modules that no
    program's spec imports) and its own modules, by their path in the package and their bytes."""
    import hbmsim.algorithms
    import hbmsim.kernels
    import hbmsim.scenarios
    import hbmsim.simulator
    programs = program_files()
    owned = set().union(*programs.values()) if programs else set()
    shared, own = hashlib.sha256(), {}
    for pkg in (hbmsim.algorithms, hbmsim.kernels, hbmsim.scenarios, hbmsim.simulator):
        for name, f in _package_files(pkg):
            if pkg is hbmsim.algorithms and f.stem in owned:
                own[f.stem] = (name, f.read_bytes())
                continue
            shared.update(f"{name}\0".encode() + f.read_bytes())
    out = {}
    for program, modules in programs.items():
        h = shared.copy()
        for m in sorted(modules):
            name, data = own[m]
            h.update(f"{name}\0".encode() + data)
        out[program] = h.hexdigest()[:HASH_CHARS]
    return out


class SimulationCache(ResultsLog):
    """A ResultsLog whose records carry their program's code hash (key "<hash> <config key>"):
    `done` gives only those the current code wrote, `append` marks each with it; a program with
    no hash (registered outside hbmsim) is neither read nor written."""

    def __init__(self, path, hashes: dict):
        super().__init__(path, shared=True)
        self.hashes = hashes

    def _hash(self, key: str) -> str | None:
        try:
            return self.hashes.get(json.loads(key)["algorithm"])
        except (json.JSONDecodeError, KeyError, TypeError):
            return None

    def _current(self, stored: str) -> str | None:
        """The configuration key of a stored key ("<hash> <config key>") the current code wrote, else None."""
        code, _, key = stored.partition(" ")
        return key if code and code == self._hash(key) else None

    def done(self) -> dict:
        return {key: results for stored, results in super().done().items()
                if (key := self._current(stored)) is not None}

    def append(self, index: int, key: str, results: list) -> None:
        code = self._hash(key)
        if code is not None:
            super().append(index, f"{code} {key}", results)

    def prune(self) -> None:
        """Rewrite the file with only the records the current code wrote (whole lines, in order)."""
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                stored = json.loads(line)["key"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            if isinstance(stored, str) and self._current(stored) is not None:
                kept.append(line + "\n")
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, self.path)


def validate_cache() -> SimulationCache | None:
    """The cache's log, records older code wrote dropped (and older releases' per-hash files
    removed); None when HBMSIM_NO_CACHE is set or the cache folder cannot be written."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return None
    from hbmsim.kernels.emulation import cache_dir
    folder = cache_dir() / "validate"
    path = folder / CACHE_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.jsonl"):
            if old != path:
                old.unlink(missing_ok=True)
        path.touch()
        log = SimulationCache(path, code_hashes())
        log.prune()
    except OSError:
        return None
    return log
