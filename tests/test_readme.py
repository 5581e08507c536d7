"""The front door never breaks: every `hbmsim` command that README.md shows runs and exits 0, the
README stays short, its links into docs/ resolve, and the command output pasted into README.md and
docs/*.md (a code block right after a `<!-- output of: hbmsim ... -->` comment) is what the code
prints now.

Conventions the README and docs follow, so that this test can read them:
- a command is a line of a fenced code block that starts with `hbmsim ` (or an `&&`-joined part of
  one, as in `pip install . && hbmsim demo`); `#` starts a comment; the commands run in the order
  shown, all in one temporary folder, so a later one may read what an earlier one wrote;
- a ```toml block whose first line is `# save as NAME.toml` is written to NAME.toml in that folder
  before any command runs;
- `<!-- output of: COMMAND -->` before a fenced block: every line of the block (spaces collapsed;
  `...` lines skipped) is a line of what COMMAND prints (stdout, spaces collapsed).
"""
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TIMEOUT_S = 240             # per command; the README's own commands take seconds

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.S | re.M)
OUTPUT_OF = re.compile(r"<!-- output of: (hbmsim [^>]*?) -->\s*\n```[^\n]*\n(.*?)^```", re.S | re.M)


def _blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(text)]


def readme_commands(text: str) -> list[str]:
    """Every `hbmsim ...` command in the fenced code blocks of `text`, in order."""
    out = []
    for lang, body in _blocks(text):
        if lang not in ("", "sh", "bash", "console", "shell"):
            continue
        for line in body.splitlines():
            for part in line.split("&&"):
                part = part.split(" #")[0].strip()
                if part.startswith("hbmsim "):
                    out.append(part)
    return out


def toml_files(text: str) -> dict[str, str]:
    """{NAME.toml: text} for the ```toml blocks that say `# save as NAME.toml`."""
    out = {}
    for lang, body in _blocks(text):
        m = re.match(r"#\s*save as (\S+\.toml)", body)
        if lang == "toml" and m:
            out[m.group(1)] = body
    return out


def _hbmsim() -> list[str]:
    exe = Path(sys.executable).with_name("hbmsim")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from hbmsim.scenarios.cli import main; "
                                            "import sys; sys.exit(main(sys.argv[1:]))"]


def _needs_gxx(command: str) -> bool:
    """The CPU emulation of the kernel (and what reads its file) needs a C++ compiler."""
    return command.startswith("hbmsim emulate") or "emulated.json" in command


def _collapse(s: str) -> str:
    return " ".join(s.split())


class Runner:
    """Runs commands in one folder, each once, in the order they are first asked for."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.done: dict[str, subprocess.CompletedProcess] = {}
        self.seconds: dict[str, float] = {}

    def run(self, command: str) -> subprocess.CompletedProcess:
        if command not in self.done:
            argv = _hbmsim() + shlex.split(command)[1:]
            t0 = time.perf_counter()
            self.done[command] = subprocess.run(argv, cwd=self.folder, capture_output=True, text=True,
                                                timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
            self.seconds[command] = time.perf_counter() - t0
        return self.done[command]


README_TEXT = README.read_text()
COMMANDS = readme_commands(README_TEXT)
DOC_FILES = [README] + sorted(DOCS.glob("*.md"))
OUTPUTS = [(p.relative_to(ROOT).as_posix(), cmd, body) for p in DOC_FILES
           for cmd, body in ((m.group(1).strip(), m.group(2)) for m in OUTPUT_OF.finditer(p.read_text()))]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readme")
    for name, text in toml_files(README_TEXT).items():
        (folder / name).write_text(text)
    return Runner(folder)


def test_readme_shows_the_two_setup_commands_first():
    first = _blocks(README_TEXT)[0][1].splitlines()
    assert first == ['pip install . && hbmsim demo', 'pip install ".[test]" && ruff check . && pytest -q']
    assert len(COMMANDS) >= 8


@pytest.mark.parametrize("i", range(len(COMMANDS)), ids=[c[:60] for c in COMMANDS])
def test_every_readme_command_runs(runner, i):
    if _needs_gxx(COMMANDS[i]) and shutil.which("g++") is None:
        pytest.skip("the CPU emulation of the kernel needs g++")
    for earlier in COMMANDS[:i]:            # later commands may read what earlier ones wrote
        runner.run(earlier)
    res = runner.run(COMMANDS[i])
    assert res.returncode == 0, f"{COMMANDS[i]!r} exited {res.returncode}:\n{res.stderr[-3000:]}"


@pytest.mark.parametrize("where,command,body", OUTPUTS, ids=[f"{w}: {c[:50]}" for w, c, _ in OUTPUTS])
def test_pasted_output_is_what_the_code_prints(runner, where, command, body):
    for earlier in COMMANDS:                # docs' commands may read what the README's wrote
        if earlier == command:
            break
        runner.run(earlier)
    if _needs_gxx(command) and shutil.which("g++") is None:
        pytest.skip("the CPU emulation of the kernel needs g++")
    res = runner.run(command)
    assert res.returncode == 0, f"{where}: {command!r} exited {res.returncode}:\n{res.stderr[-3000:]}"
    printed = {_collapse(line) for line in res.stdout.splitlines()}
    stale = [line for line in body.splitlines()
             if line.strip() and line.strip() != "..." and _collapse(line) not in printed]
    assert not stale, (f"{where}: the output pasted after `{command}` is not what it prints now; "
                       f"paste the current output. Lines not printed:\n" + "\n".join(stale))


def test_readme_is_a_front_door():
    assert len(README_TEXT.splitlines()) <= 250


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}


def test_every_docs_link_resolves():
    for path in DOC_FILES:
        text = path.read_text()
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            where = path.parent / target if target else path
            assert where.exists(), f"{path.relative_to(ROOT)}: link to {target} does not resolve"
            if anchor and where.suffix == ".md":
                assert anchor in _anchors(where), f"{path.relative_to(ROOT)}: no heading #{anchor} in {target}"
    assert re.search(r"\]\(docs/", README_TEXT), "the README links into docs/"


def test_every_shipped_experiment_is_documented():
    text = "\n".join(p.read_text() for p in DOC_FILES)
    for toml in sorted((ROOT / "scenarios" / "experiments").glob("*.toml")):
        assert f"`{toml.stem}`" in text, f"shipped experiment {toml.stem} is not mentioned in README.md or docs/"
