"""kvlayout.validate's bounded file read (session 22, mutation coverage): at most one byte past the cap is
read, so a pipe whose writer has sent cap + 1 bytes and stays open is refused at once, not waited on.
"""

from __future__ import annotations

import os
import pathlib
import threading

import pytest

from kvlayout import validate as V
from kvlayout.errors import SpecError


def test_read_capped_reads_one_byte_past_the_cap(tmp_path: pathlib.Path) -> None:
    """_read_capped returns at most cap + 1 bytes of a longer file, and a shorter file whole."""
    p = tmp_path / "big.json"
    p.write_bytes(b"0123456789" * 3)
    assert V._read_capped(str(p), 4) == b"01234"
    assert V._read_capped(str(p), 29) == p.read_bytes()
    assert V._read_capped(str(p), 100) == p.read_bytes()


def test_a_pipe_past_the_cap_is_refused_without_waiting_for_its_writer() -> None:
    """A writer that sent cap + 1 bytes and keeps the pipe open: the file is refused as larger than the cap
    at once (reading one byte more would wait for the writer, forever for an idle one)."""
    r, w = os.pipe()
    path = f"/dev/fd/{r}"
    got: list[str] = []

    def read() -> None:
        try:
            V.read_json_file(SpecError, "spec file", path, max_bytes=4)
        except SpecError as e:
            got.append(str(e))

    os.write(w, b"[1, 2")  # cap + 1 bytes, the pipe left open
    t = threading.Thread(target=read, daemon=True)
    try:
        t.start()
        t.join(5)
        waited = t.is_alive()
    finally:
        os.close(w)  # a reader still waiting sees the end of the file now
        t.join(5)
        os.close(r)
    assert not waited, "the read waited for a byte past cap + 1"
    assert got == [f"spec file = {path!r}: larger than 4 B"]


@pytest.mark.parametrize("cap", [0, 1, 7])
def test_read_capped_of_a_pipe_returns_cap_plus_one_bytes(cap: int) -> None:
    """From an open pipe holding more than cap + 1 bytes, exactly cap + 1 are read."""
    r, w = os.pipe()
    try:
        os.write(w, b"x" * (cap + 1))
        os.write(w, b"y" * 3)
        assert V._read_capped(f"/dev/fd/{r}", cap) == b"x" * (cap + 1)
    finally:
        os.close(w)
        os.close(r)
