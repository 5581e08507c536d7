"""Where output goes, checked before any work: a `--json`, `--plot` or `--out` that cannot be
written fails at once, with one line, instead of after a whole run (or silently somewhere else).
Files are written whole or not at all (`write_text_atomic`), so an interrupted run never leaves a
half-written file."""
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


def check_plot_output(path: str, option: str) -> Path:
    """A plot option's file: a format matplotlib writes (check_plot_path) where this user may
    write (check_output_path)."""
    return check_output_path(check_plot_path(path), option)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Lay out, write (creating its folder) and close a matplotlib figure; returns the path."""
    import matplotlib.pyplot as plt
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def check_output_path(path: str | Path, option: str) -> Path:
    """A file the command will write: not a folder, in a folder that exists or can be created
    and that this user may write. Raises HbmsimError naming the option and the path."""
    text = os.fspath(path)
    p = Path(text)
    if p.is_dir() or text.endswith(("/", os.sep)):
        raise HbmsimError(f"{option} {text!r} is a folder: give a file name such as {str(p / 'results.json')!r}")
    if p.exists() and not os.access(p, os.W_OK):
        raise HbmsimError(f"{option} {text!r}: the file exists and is not writable")
    _check_writable_folder(p.absolute().parent, option, text)
    return p


def _check_writable_folder(folder: Path, option: str, text: str) -> None:
    """`folder` exists and is writable, or its nearest existing ancestor is a writable folder."""
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise HbmsimError(f"{option} {text!r}: {str(folder)!r} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HbmsimError(f"{option} {text!r}: the folder {str(folder)!r} is not writable")


def check_output_dir(path: str | Path, option: str) -> Path:
    """A folder the command will write files into (made if missing)."""
    text = os.fspath(path)
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise HbmsimError(f"{option} {text!r} is a file, not a folder")
    _check_writable_folder(p.absolute(), option, text)
    return p


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename: readers (and a Ctrl-C)
    only ever see the old file or the new one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
