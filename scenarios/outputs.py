"""Where a plot goes, checked before any work: a `--plot` that cannot be written fails at once,
with one line, instead of after a whole run (or silently somewhere else)."""
from __future__ import annotations

import os
from pathlib import Path

from hbmsim.simulator import HbmsimError


def check_plot_path(path: str) -> Path:
    """The file a plot will be written to: PATH, or PATH.png when PATH has no suffix (as before).

    Refused with an HbmsimError naming the path: an existing directory (or a path ending in a
    separator), which matplotlib would otherwise turn into DIR.png next to it, and a suffix that
    is not one of the formats matplotlib can write (png, pdf, svg, ...; case does not matter).
    """
    from matplotlib.figure import Figure

    text = os.fspath(path)
    p = Path(text)
    if not p.suffix and not p.is_dir() and not text.endswith(("/", os.sep)):
        p = p.with_suffix(".png")
    if p.is_dir() or text.endswith(("/", os.sep)):
        raise HbmsimError(f"plot path {str(p)!r} is a directory: give a file name such as {str(p / 'plot.png')!r}")
    supported = Figure().canvas.get_supported_filetypes()
    if p.suffix[1:].lower() not in supported:
        raise HbmsimError(f"plot path {text!r}: suffix {p.suffix!r} is not a format matplotlib can write "
                          f"(supported: {', '.join('.' + s for s in sorted(supported))})")
    return p
