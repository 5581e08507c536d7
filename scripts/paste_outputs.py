"""Re-paste the command output quoted in README.md and docs/*.md from what the code prints now.

Each code block after a `<!-- output of: hbmsim ... -->` comment (tests/test_readme.py checks them)
is an excerpt of the command's output. This script runs every command as that test does (in one
temporary folder, the README's commands first) and replaces each quoted line with the printed
line that shares its longest leading run of words (the row's label: algorithm, pass, shape, ...),
so the excerpt keeps its rows and gets today's figures. Lines with no match are left for a person.

    python scripts/paste_outputs.py          # rewrites the files in place, prints what changed
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_readme as T  # noqa: E402  (the test's own reading of the docs)


def _common_words(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def repaste(body: str, printed: list[str]) -> str:
    out = []
    for line in body.splitlines():
        words = line.split()
        if not words or line.strip() == "...":
            out.append(line)
            continue
        best = max(printed, key=lambda p: _common_words(words, p.split()), default=None)
        if best is not None and _common_words(words, best.split()) >= min(2, len(words)):
            out.append(best.rstrip())
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, text in T.toml_files(T.README_TEXT).items():
            (folder / name).write_text(text)
        runner = T.Runner(folder)
        for command in T.COMMANDS:
            runner.run(command)
        for path in T.DOC_FILES:
            text = path.read_text()
            new = text
            for m in T.OUTPUT_OF.finditer(text):
                res = runner.run(m.group(1).strip())
                if res.returncode != 0:
                    print(f"{path.name}: {m.group(1)} exited {res.returncode}", file=sys.stderr)
                    continue
                new = new.replace(m.group(2), repaste(m.group(2), res.stdout.splitlines()), 1)
            if new != text:
                path.write_text(new)
                print(f"re-pasted {path.relative_to(T.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
