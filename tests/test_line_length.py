"""Every Python line of the repository is at most 110 characters (issue 28).

ruff's E501 skips a line that only a trailing pragma (``# noqa``, ``# type: ignore``) pushes past
the limit; this counts those too, in every folder: package, backends, tests, bench, scripts and
the notebooks' percent scripts.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("kvlayout", "backends", "tests", "bench", "scripts", "notebooks")
LIMIT = 110


def test_no_python_line_over_110_characters() -> None:
    files = [p for d in FOLDERS for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 100  # the walk found the tree
    long = [
        f"{p.relative_to(ROOT)}:{i}: {len(line)} characters"
        for p in files
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > LIMIT
    ]
    assert not long, "\n".join(long)
