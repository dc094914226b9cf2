"""kvlayout.validate's rules that the mutation run of issue 25 found untested: JSON integer
literals past Python's conversion limit, invalid JSON, and names with separators that are not
control characters."""

from __future__ import annotations

from typing import Any

import pytest

from kvlayout import validate as V
from kvlayout.errors import BlockIdError, SpecError


def test_json_integer_literals_at_and_past_the_digit_limit() -> None:
    cap = V.MAX_JSON_INT_DIGITS
    for sign in ("", "-"):
        ok = sign + "7" * cap
        assert V.parse_json(SpecError, "spec", '{"a": ' + ok + "}") == {"a": int(ok)}  # the cap itself
        for n in (cap + 1, cap + 700):
            lit = sign + "7" * n
            with pytest.raises(SpecError) as e:
                V.parse_json(SpecError, "spec", f'{{"a": [1, {lit}]}}')
            shown = f"{lit[:20]}...({n} digits)"
            assert (e.value.field, e.value.value) == ("spec", shown)
            why = f"an integer literal of {n} digits: at most {cap} allowed"
            assert str(e.value) == f"spec = {shown!r}: {why}"
    # another error class and what: both taken as given (the table reader, the mesh flag)
    with pytest.raises(BlockIdError) as e2:
        V.parse_json(BlockIdError, "table", "9" * (cap + 1))
    assert e2.value.field == "table" and type(e2.value) is BlockIdError


def test_json_int_hook_keeps_small_literals_exact() -> None:
    for lit in ("0", "-0", "12", "-4096", "9" * 50):
        assert V._json_int(lit) == int(lit) and type(V._json_int(lit)) is int
    lit = "-" + "1" * (V.MAX_JSON_INT_DIGITS + 1)
    with pytest.raises(V._LongInt) as e:
        V._json_int(lit)
    assert e.value.digits == V.MAX_JSON_INT_DIGITS + 1 and e.value.args == (lit,)


def test_invalid_json_names_the_field_json() -> None:
    with pytest.raises(SpecError) as e:
        V.parse_json(SpecError, "spec", "{nope")
    assert (e.value.field, e.value.value) == ("json", None)
    assert str(e.value).startswith("spec is not valid JSON: ")


def test_names_refuse_control_characters_and_line_separators_only() -> None:
    # a no-break space (Zs) and an ideographic space are not printable yet neither control nor a line break
    for name in ("a\u00a0b", "x\u3000", "layer 0", "\u00e9t\u00e9"):
        assert V.check_name(SpecError, "name", name) == name
    # Cc, Cc, Cf, U+2028 / U+2029 (Zl, Zp: str.splitlines breaks on them, a forged row; issue 25), Co, Cs, Cn
    for name in ("a\nb", "\x1b[31m", "a\u200eb", "a\u2028b", "x\u2029", "\ue000", "\ud800", "\U000effff"):
        with pytest.raises(SpecError) as e:
            V.check_name(SpecError, "name", name)
        assert str(e.value).endswith("must not contain control characters or line separators")
        assert e.value.value == name


def test_json_int_under_a_lower_interpreter_limit() -> None:
    """A process that lowered Python's own limit (sys.set_int_max_str_digits): the literal is
    refused by kvlayout's message, naming it, instead of Python's ValueError."""
    import sys

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        lit = "8" * 1000
        with pytest.raises(SpecError) as e:
            V.parse_json(SpecError, "spec", lit)
        assert e.value.value == f"{lit[:20]}...(1000 digits)"
    finally:
        sys.set_int_max_str_digits(old)


def test_block_ids_of_odd_kinds_masked_int_subclasses_timedeltas() -> None:
    """A masked array is checked on its data (a masked -5 is refused, not skipped); int subclasses
    (IntEnum) in a list are integers taken by value; a timedelta64 in a list is not an id."""
    import enum

    import numpy as np

    ok = V.block_ids(np.ma.array([1, 2], mask=[False, True]), 4)
    assert type(ok) is np.ndarray and ok.dtype == np.int64 and ok.tolist() == [1, 2]
    with pytest.raises(BlockIdError) as e:
        V.block_ids(np.ma.array([1, -5], mask=[False, True]), 4)
    assert (e.value.field, e.value.value) == ("block_ids[1]", -5)

    class E(enum.IntEnum):
        A = 3

    got = V.block_ids([E.A, 1], 4)
    assert got.tolist() == [3, 1] and got.dtype == np.int64
    with pytest.raises(BlockIdError) as e:
        V.block_ids([1, np.timedelta64(2)], 4)
    assert e.value.field == "block_ids[1]"
    assert str(e.value).endswith("must be an integer (nothing was written)")
    assert V.block_ids([np.int32(2), np.uint8(1)], 4).tolist() == [2, 1]


def test_files_are_opened_without_blocking_and_read_blocking(tmp_path: Any) -> None:
    """A FIFO nobody writes to reads as empty at once (``open`` had blocked forever); a pipe whose writer
    is slow is read whole; a directory is named as one (issue 25)."""
    import os
    import threading
    import time

    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    got: list[Any] = []

    def read() -> None:
        try:
            V.read_json_file(SpecError, "spec file", fifo)
        except SpecError as e:
            got.append(str(e))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(20)
    assert got == [f"spec file {fifo!r} is not valid JSON: Expecting value: line 1 column 1 (char 0)"]
    r, w = os.pipe()

    def write() -> None:
        time.sleep(0.3)
        os.write(w, b'{"a": [1, 2]}')
        os.close(w)

    threading.Thread(target=write, daemon=True).start()
    try:
        assert V.read_json_file(SpecError, "spec file", f"/dev/fd/{r}") == {"a": [1, 2]}
    finally:
        os.close(r)
    with pytest.raises(SpecError) as e:
        V.read_json_file(SpecError, "spec file", str(tmp_path))
    assert (e.value.field, str(e.value)) == ("spec file", f"spec file = {str(tmp_path)!r}: Is a directory")
