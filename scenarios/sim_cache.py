"""validate's cache of finished simulations.

Every simulation `hbmsim validate` finishes is kept in $HBMSIM_CACHE/validate/<hash>.jsonl
(kernels/emulation.cache_dir, default ~/.cache/hbmsim; a sweep.ResultsLog shared between
processes), the hash that of every source and preset file of hbmsim's packages: a rerun of the
same code (another --host-spec, another --only, after Ctrl-C) simulates only what the file lacks,
and any change to the code or a preset starts a new file and removes the old. HBMSIM_NO_CACHE=1
or `validate --no-cache` turns it off (the tests do).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .sweep import ResultsLog

NO_CACHE_ENV = "HBMSIM_NO_CACHE"
CACHE_SUFFIXES = (".py", ".toml")        # what decides a simulation's results: the code and the presets


def source_hash() -> str:
    """sha256 (20 hex digits) of hbmsim's code and presets: the four packages' .py and .toml files,
    by their path inside the package and their bytes."""
    import hbmsim.algorithms
    import hbmsim.kernels
    import hbmsim.scenarios
    import hbmsim.simulator
    h = hashlib.sha256()
    for pkg in (hbmsim.algorithms, hbmsim.kernels, hbmsim.scenarios, hbmsim.simulator):
        root = Path(pkg.__file__).parent
        for f in sorted(p for p in root.rglob("*") if p.suffix in CACHE_SUFFIXES and "__pycache__" not in p.parts):
            h.update(f"{pkg.__name__}/{f.relative_to(root).as_posix()}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:20]


def validate_cache() -> ResultsLog | None:
    """The cache's log for this code, older codes' files removed; None when HBMSIM_NO_CACHE is set
    or the cache folder cannot be written."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return None
    from hbmsim.kernels.emulation import cache_dir
    folder = cache_dir() / "validate"
    path = folder / f"{source_hash()}.jsonl"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.jsonl"):
            if old != path:
                old.unlink(missing_ok=True)
        path.touch()
    except OSError:
        return None
    return ResultsLog(path, shared=True)
