"""Build notebooks/NN_name.ipynb from the percent script notebooks/NN_name.py (outputs stripped).

The notebooks are written as plain text, in the percent format jupytext reads: ``# %%`` starts a
code cell, ``# %% [markdown]`` a markdown cell whose lines are ``# ``-commented markdown, and
line magics are commented (``# %matplotlib inline``). This converter needs only nbformat; CI
checks that the committed .ipynb files equal its output and executes them (tests/test_notebooks.py).

    python scripts/make_notebooks.py          # rewrite every .ipynb from its .py
    python scripts/make_notebooks.py --check  # exit 1 if a committed .ipynb is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
MARKER = re.compile(r"^# %%(?P<md> \[markdown\])?\s*$")
ANY_MARKER = re.compile(r"^# ?%%")
MAGIC = re.compile(r"^# (%[A-Za-z]\w*(?:\s.*)?)$")
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def _markdown(path: Path, start: int, lines: list[str]) -> str:
    """Uncomment a markdown cell: every line is ``#`` or ``# text``."""
    out = []
    for i, line in enumerate(lines):
        if line != "#" and not line.startswith("# "):
            raise ValueError(f"{path}:{start + i}: a markdown cell line must start with '# ': {line!r}")
        out.append(line[2:])
    return "\n".join(out)


def _code(lines: list[str]) -> str:
    """Uncomment line magics (``# %matplotlib inline`` -> ``%matplotlib inline``)."""
    return "\n".join(m[1] if (m := MAGIC.match(line)) else line for line in lines)


def split_cells(path: Path) -> list[tuple[str, str]]:
    """``(kind, source)`` for every cell of the percent script at ``path``, ``kind`` "markdown" or "code"."""
    cells: list[tuple[str, int, list[str]]] = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        m = MARKER.match(line)
        if m:
            cells.append(("markdown" if m["md"] else "code", n + 1, []))
        elif ANY_MARKER.match(line):
            raise ValueError(f"{path}:{n}: unsupported cell marker {line!r}; use '# %%' or '# %% [markdown]'")
        elif cells:
            cells[-1][2].append(line)
        elif line.strip():
            raise ValueError(f"{path}:{n}: text before the first '# %%' cell marker")
    out = []
    for kind, start, lines in cells:
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
            start += 1
        out.append((kind, _markdown(path, start, lines) if kind == "markdown" else _code(lines)))
    return out


def build(path: Path) -> nbformat.NotebookNode:
    """The notebook of the percent script ``path``: no outputs, cell ids numbered for stable diffs."""
    cells = [
        (new_markdown_cell if kind == "markdown" else new_code_cell)(source, id=f"cell-{i:02d}")
        for i, (kind, source) in enumerate(split_cells(path))
    ]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    return nb


def render(path: Path) -> str:
    """The .ipynb text that :func:`main` writes for ``path``."""
    text = nbformat.writes(build(path))
    return text if text.endswith("\n") else text + "\n"


def sources(folder: Path = NOTEBOOKS) -> list[Path]:
    """Every percent script in ``folder`` (``NN_name.py``)."""
    return sorted(folder.glob("[0-9]*.py"))


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) every notebook; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report .ipynb files that differ from their .py")
    args = ap.parse_args(argv)
    stale = []
    for src in sources():
        dst = src.with_suffix(".ipynb")
        text = render(src)
        if args.check:
            if not dst.exists() or dst.read_text() != text:
                stale.append(dst)
            continue
        dst.write_text(text)
        print("wrote", dst)
    for dst in stale:
        print(f"out of date: {dst} (run python scripts/make_notebooks.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
