"""Where output goes, checked before any work: a `--json`, `--plot`, `--out` (or any other output
option) that cannot be written fails at once, with one line naming the option, the path and why,
instead of after a whole run (or silently somewhere else).

Folders are made only when asked: a file's folder must exist; a folder option (`demo --out`) is
made by its command, when its parent exists. Writability is tried, not guessed from permission
bits (root passes those everywhere, and /proc or a read-only mount refuse anyway): a probe file is
created and removed. Files are written whole or not at all (`write_text_atomic`), so an interrupted
run never leaves a half-written file, and an error names the file asked for, never the temporary
file it went through.
"""
from __future__ import annotations

import errno
import os
import tempfile
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
    """Lay out, write and close a matplotlib figure; returns the path. Its folder must exist."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return Path(path)


def check_output_path(path: str | Path, option: str) -> Path:
    """A file the command will write: not a folder, in a folder that exists and that this user
    can write in. Raises HbmsimError naming the option and the path."""
    text = os.fspath(path)
    p = Path(text)
    if p.is_dir() or text.endswith(("/", os.sep)):
        raise HbmsimError(f"{option} {text!r} is a folder: give a file name such as {str(p / 'results.json')!r}")
    if p.exists() and not os.access(p, os.W_OK):
        raise HbmsimError(f"{option} {text!r}: the file exists and is not writable")
    _check_folder(p.absolute().parent, option, text)
    return p


def check_output_dir(path: str | Path, option: str) -> Path:
    """A folder the command will write files into: an existing folder, or one it can make (its
    parent exists and can be written in). Nothing is made here: `make_output_dir` makes it when
    the work is done."""
    text = os.fspath(path)
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise HbmsimError(f"{option} {text!r} is a file, not a folder")
    if p.is_dir():
        _check_folder(p.absolute(), option, text)
        return p
    _check_folder(p.absolute().parent, option, text)
    try:                                  # can it be made? (made and removed: nothing is left behind)
        p.mkdir()
        p.rmdir()
    except OSError as err:
        raise HbmsimError(f"{option} {text!r}: cannot make the folder ({_why(err, p.absolute().parent)})") from None
    return p


def make_output_dir(path: str | Path, option: str) -> Path:
    """Make the folder of a folder option (checked by check_output_dir) if it is missing."""
    p = Path(path)
    try:
        p.mkdir(exist_ok=True)
    except OSError as err:
        raise HbmsimError(f"{option} {os.fspath(path)!r}: cannot make the folder "
                          f"({_why(err, p.absolute().parent)})") from None
    return p


def _check_folder(folder: Path, option: str, text: str) -> None:
    """`folder` exists, is a folder, and a file can be created in it (tried with a probe file)."""
    if not folder.exists():
        existing = folder.parent
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise HbmsimError(f"{option} {text!r}: {str(existing)!r} is a file, not a folder")
        raise HbmsimError(f"{option} {text!r}: the folder {str(folder)!r} does not exist (make it first)")
    if not folder.is_dir():
        raise HbmsimError(f"{option} {text!r}: {str(folder)!r} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".hbmsim-probe-", dir=folder)
    except OSError as err:
        raise HbmsimError(f"{option} {text!r}: cannot write in the folder {str(folder)!r} "
                          f"({_why(err, folder)})") from None
    os.close(fd)
    os.unlink(probe)


def _why(err: OSError, folder: Path) -> str:
    """An OSError met making a file or folder in `folder`, in words, without the file name it
    carries (it may be a probe or temporary file's): a folder that refuses new files (as /proc
    does, with "No such file or directory") says so."""
    if err.errno == errno.ENOENT:
        return "the folder does not accept new files" if folder.is_dir() else "the folder does not exist"
    return err.strerror or type(err).__name__


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename: readers (and a Ctrl-C)
    only ever see the old file or the new one. Its folder must exist. A failure is an
    HbmsimError naming `path` (not the temporary file)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    except OSError as err:
        raise HbmsimError(f"cannot write {os.fspath(path)!r} ({_why(err, p.absolute().parent)})") from None
    finally:
        if tmp.exists():
            tmp.unlink()
