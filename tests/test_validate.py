"""kvlayout.validate: every input rule's bound, field, value and message (issue 19 mutation survivors).

Expected messages are written out here from the rule ``field = value: why`` (kvlayout/errors.py),
never built with the library's own helpers.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import kvlayout as K
from kvlayout import validate as V
from kvlayout.errors import (
    BackendError,
    BlockIdError,
    KVLayoutError,
    LayoutBufferError,
    SpecError,
    TableError,
)
from kvlayout.table import check_table


def _raises(  # type: ignore[no-untyped-def]
    cls: type[KVLayoutError], message: str, field: str | None, value: object, fn, *args, **kw
):
    """``fn(*args, **kw)`` raises exactly ``cls`` with this message, field and value."""
    with pytest.raises(cls) as e:
        fn(*args, **kw)
    assert type(e.value) is cls
    assert str(e.value) == message
    assert e.value.field == field
    assert type(e.value.value) is type(value) and e.value.value == value


def test_is_int() -> None:
    assert V.is_int(3) and V.is_int(-3) and V.is_int(np.int8(1)) and V.is_int(np.uint64(2**64 - 1))
    assert not V.is_int(True) and not V.is_int(np.bool_(True)) and not V.is_int(1.0) and not V.is_int("1")


def test_check_int_types_and_lower_bounds() -> None:
    _raises(SpecError, "a.b = 'x': must be an integer", "a.b", "x", V.check_int, SpecError, "a.b", "x")
    _raises(TableError, "t = True: must be an integer", "t", True, V.check_int, TableError, "t", True, lo=0)
    _raises(TableError, "t = 1.0: must be an integer", "t", 1.0, V.check_int, TableError, "t", 1.0)
    got = V.check_int(SpecError, "f", np.int64(7), lo=7)  # lo itself is allowed
    assert got == 7 and type(got) is int
    assert V.check_int(SpecError, "f", -(2**70)) == -(2**70)  # no lower bound by default
    _raises(SpecError, "f = 0: must be positive", "f", 0, V.check_int, SpecError, "f", 0, lo=1)
    _raises(SpecError, "f = -1: must be at least 0", "f", -1, V.check_int, SpecError, "f", -1, lo=0)
    _raises(SpecError, "f = 1: must be at least 2", "f", 1, V.check_int, SpecError, "f", 1, lo=2)
    # the value in the error is the int, not the NumPy scalar it came as
    _raises(SpecError, "f = 0: must be positive", "f", 0, V.check_int, SpecError, "f", np.int32(0), lo=1)


def test_check_int_upper_bounds_name_the_limit() -> None:
    top = 2**62 - 1
    assert V.check_int(SpecError, "f", top) == top
    _raises(
        SpecError,
        f"f = {top + 1}: must be at most 2**62 - 1 (GEOMETRY.md section 8)",
        "f",
        top + 1,
        V.check_int,
        SpecError,
        "f",
        top + 1,
    )
    assert V.check_int(TableError, "n", 2**31 - 1, hi=2**31 - 1) == 2**31 - 1
    _raises(
        TableError,
        f"n = {2**31}: must be at most 2**31 - 1 (GEOMETRY.md section 8)",
        "n",
        2**31,
        V.check_int,
        TableError,
        "n",
        np.int64(2**31),
        hi=2**31 - 1,
    )
    assert V.check_int(TableError, "n", 10, hi=10) == 10
    _raises(
        TableError,
        "n = 11: must be at most 10 (GEOMETRY.md section 8)",
        "n",
        11,
        V.check_int,
        TableError,
        "n",
        11,
        lo=0,
        hi=10,
    )


def test_check_name() -> None:
    assert V.check_name(SpecError, "g", "é x") == "é x"
    assert V.check_name(SpecError, "g", "", empty=True) == ""
    assert V.check_name(SpecError, "g", "a" * 4096) == "a" * 4096
    _raises(SpecError, "g = '': must be a non-empty string", "g", "", V.check_name, SpecError, "g", "")
    _raises(SpecError, "g = 3: must be a non-empty string", "g", 3, V.check_name, SpecError, "g", 3)
    _raises(SpecError, "g = 3: must be a string", "g", 3, V.check_name, SpecError, "g", 3, empty=True)
    long = "a" * 4097
    _raises(
        SpecError,
        f"g = {repr(long)[:77]}...: must be at most 4096 characters",
        "g",
        long,
        V.check_name,
        SpecError,
        "g",
        long,
    )
    for bad in ("a\x00", "\tb", "a\u200bb", "x\x7f"):  # Cc and Cf categories
        _raises(
            TableError,
            f"n = {bad!r}: must not contain control characters or line separators",
            "n",
            bad,
            V.check_name,
            TableError,
            "n",
            bad,
        )


def test_block_ids_arrays() -> None:
    got = V.block_ids(np.array([4, 0, 4], np.int32), 5)
    assert got.dtype == np.int64 and got.tolist() == [4, 0, 4]
    assert V.block_ids(np.zeros(0, np.uint16), 5).dtype == np.int64  # an empty unsigned batch is fine
    assert V.block_ids(np.array([4], np.uint8), 5).tolist() == [4]
    _raises(
        BlockIdError,
        "block_ids.dtype = float64: must be an integer dtype",
        "block_ids.dtype",
        "float64",
        V.block_ids,
        np.array([1.0]),
        5,
    )
    _raises(
        BlockIdError,
        "block_ids.dtype = bool: must be an integer dtype",
        "block_ids.dtype",
        "bool",
        V.block_ids,
        np.array([True]),
        5,
    )
    _raises(
        BlockIdError,
        "block_ids.shape = (1, 2): must be 1-D",
        "block_ids.shape",
        (1, 2),
        V.block_ids,
        np.array([[1, 2]]),
        5,
    )
    _raises(
        BlockIdError, "block_ids.shape = (): must be 1-D", "block_ids.shape", (), V.block_ids, np.array(3), 5
    )
    # unsigned ids past int64 must not wrap to negatives: the first id >= num_blocks is named
    _raises(
        BlockIdError,
        f"block_ids[1] = {2**64 - 1}: outside [0, 5)",
        "block_ids[1]",
        2**64 - 1,
        V.block_ids,
        np.array([1, 2**64 - 1, 7], np.uint64),
        5,
    )
    _raises(
        BlockIdError,
        "block_ids[2] = 5: outside [0, 5)",
        "block_ids[2]",
        5,
        V.block_ids,
        np.array([1, 4, 5, 9], np.uint32),
        5,
    )
    _raises(
        BlockIdError,
        "block_ids[1] = -1: outside [0, 5) (2 bad ids; nothing was written)",
        "block_ids[1]",
        -1,
        V.block_ids,
        np.array([0, -1, 2, 5], np.int16),
        5,
    )


def test_block_ids_lists() -> None:
    got = V.block_ids([3, np.int32(1)], 4)
    assert got.dtype == np.int64 and got.tolist() == [3, 1]
    empties: tuple[list[int], tuple[()]] = ([], ())
    for empty in empties:
        e = V.block_ids(empty, 4)
        assert e.dtype == np.int64 and e.shape == (0,)
    assert V.block_ids((0, 3), 4).tolist() == [0, 3]
    _raises(
        BlockIdError,
        "block_ids[1] = 1.0: must be an integer (nothing was written)",
        "block_ids[1]",
        1.0,
        V.block_ids,
        [0, 1.0],
        4,
    )
    _raises(
        BlockIdError,
        "block_ids[2] = True: must be an integer (nothing was written)",
        "block_ids[2]",
        True,
        V.block_ids,
        (0, 1, True),
        4,
    )
    _raises(
        BlockIdError,
        "block_ids[0] = '1': must be an integer (nothing was written)",
        "block_ids[0]",
        "1",
        V.block_ids,
        ["1"],
        4,
    )
    # past int64: named by the first element outside [-2**63, 2**63), not by a wrapped value
    _raises(
        BlockIdError,
        f"block_ids[1] = {2**63}: outside [0, 4)",
        "block_ids[1]",
        2**63,
        V.block_ids,
        [-(2**63), 2**63],
        4,
    )
    _raises(
        BlockIdError,
        f"block_ids[1] = {-(2**63) - 1}: outside [0, 4)",
        "block_ids[1]",
        -(2**63) - 1,
        V.block_ids,
        [2**63 - 1, -(2**63) - 1],
        4,
    )
    _raises(
        BlockIdError,
        f"block_ids[0] = {-(2**63)}: outside [0, 4) (2 bad ids; nothing was written)",
        "block_ids[0]",
        -(2**63),
        V.block_ids,
        [-(2**63), 2**63 - 1, 3],
        4,
    )
    _raises(
        BlockIdError,
        "block_ids[2] = 4: outside [0, 4) (1 bad ids; nothing was written)",
        "block_ids[2]",
        4,
        V.block_ids,
        [0, 3, 4],
        4,
    )
    _raises(
        BlockIdError,
        "block_ids = '0,1': must be a list, tuple or integer NumPy array",
        "block_ids",
        "0,1",
        V.block_ids,
        "0,1",
        4,
    )
    _raises(
        BlockIdError,
        "block_ids = 2: must be a list, tuple or integer NumPy array",
        "block_ids",
        2,
        V.block_ids,
        2,
        4,
    )


def test_offset_and_size() -> None:
    got = V.offset_and_size(np.int64(8), 108, 100)  # exactly fits
    assert got == 8 and type(got) is int
    assert V.offset_and_size(0, 100, 100) == 0
    _raises(
        LayoutBufferError,
        "offset = -4: must be a non-negative integer",
        "offset",
        -4,
        V.offset_and_size,
        -4,
        100,
        4,
    )
    _raises(
        LayoutBufferError,
        "offset = True: must be a non-negative integer",
        "offset",
        True,
        V.offset_and_size,
        True,
        100,
        4,
    )
    _raises(
        LayoutBufferError,
        "offset = 4.0: must be a non-negative integer",
        "offset",
        4.0,
        V.offset_and_size,
        4.0,
        100,
        4,
    )
    _raises(
        LayoutBufferError, "offset = 2: must be a multiple of 4", "offset", 2, V.offset_and_size, 2, 100, 4
    )
    _raises(
        LayoutBufferError,
        "buffer.nbytes = 107: smaller than offset 8 + total_bytes 100",
        "buffer.nbytes",
        107,
        V.offset_and_size,
        8,
        107,
        100,
    )


def test_host_buffer() -> None:
    buf = np.zeros((4, 6), np.float32)
    got = V.host_buffer(buf, 88, 8)
    assert got.dtype == np.uint8 and got.shape == (96,) and np.shares_memory(got, buf)
    _raises(
        LayoutBufferError,
        "buffer = 'list': must be a numpy.ndarray",
        "buffer",
        "list",
        V.host_buffer,
        [0] * 8,
        8,
        0,
    )
    _raises(
        LayoutBufferError,
        "buffer = 'non-contiguous': must be C-contiguous",
        "buffer",
        "non-contiguous",
        V.host_buffer,
        np.zeros(16, np.uint8)[::2],
        8,
        0,
    )
    ro = np.zeros(16, np.uint8)
    ro.flags.writeable = False
    _raises(
        LayoutBufferError,
        "buffer = 'read-only': must be writeable",
        "buffer",
        "read-only",
        V.host_buffer,
        ro,
        8,
        0,
    )
    _raises(
        LayoutBufferError,
        "buffer.nbytes = 96: smaller than offset 12 + total_bytes 88",
        "buffer.nbytes",
        96,
        V.host_buffer,
        buf,
        88,
        12,
    )
    _raises(LayoutBufferError, "offset = 1: must be a multiple of 4", "offset", 1, V.host_buffer, buf, 8, 1)


def test_parse_json() -> None:
    assert V.parse_json(TableError, "t", '{"a": [1]}') == {"a": [1]}
    assert V.parse_json(TableError, "t", '{"a": "\u00e9"}'.encode()) == {"a": "\u00e9"}
    _raises(
        TableError,
        "t = 'byte 2': is not UTF-8 text",
        "t",
        "byte 2",
        V.parse_json,
        TableError,
        "t",
        b'["\xff"]',
    )
    with pytest.raises(SpecError) as e:
        V.parse_json(SpecError, "spec", "{nope")
    assert type(e.value) is SpecError and e.value.field == "json" and e.value.value is None
    assert str(e.value).startswith("spec is not valid JSON: Expecting property name")
    _raises(
        SpecError,
        "s = 'nested arrays/objects': nesting too deep",
        "s",
        "nested arrays/objects",
        V.parse_json,
        SpecError,
        "s",
        "[" * 200_000 + "]" * 200_000,
    )


def test_read_json_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "t.json"
    p.write_text("[1, 2]")
    assert V.read_json_file(TableError, "table", str(p)) == [1, 2]
    missing = str(tmp_path / "none.json")
    _raises(
        TableError,
        f"table = {missing!r}: No such file or directory",
        "table",
        missing,
        V.read_json_file,
        TableError,
        "table",
        missing,
    )
    p.write_text("[1,")
    with pytest.raises(TableError, match=r"^table '.*t\.json' is not valid JSON: "):
        V.read_json_file(TableError, "table", str(p))
    monkeypatch.setattr(V, "MAX_JSON_BYTES", 8)
    p.write_text("[1, 2, 3]")  # 9 bytes
    _raises(
        SpecError,
        f"spec = {str(p)!r}: larger than 8 B",
        "spec",
        str(p),
        V.read_json_file,
        SpecError,
        "spec",
        str(p),
    )
    p.write_text("[1,2,34]")  # exactly 8 bytes
    assert V.read_json_file(SpecError, "spec", str(p)) == [1, 2, 34]


def test_block_ids_edges_found_by_mutation() -> None:
    # an unsigned id equal to num_blocks is refused by the unsigned check (no count of bad ids)
    _raises(
        BlockIdError,
        "block_ids[1] = 5: outside [0, 5)",
        "block_ids[1]",
        5,
        V.block_ids,
        np.array([1, 5, 2], np.uint8),
        5,
    )
    # int64 ids keep every bit: 2**62 + 1 is named exactly, not as a rounded float
    _raises(
        BlockIdError,
        f"block_ids[0] = {2**62 + 1}: outside [0, 4) (1 bad ids; nothing was written)",
        "block_ids[0]",
        2**62 + 1,
        V.block_ids,
        np.array([2**62 + 1, 0], np.int64),
        4,
    )


class _Endless:
    """A file like /dev/zero: any bounded read succeeds, an unbounded one would never end."""

    def __enter__(self) -> _Endless:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            raise AssertionError("unbounded read of an endless file")
        return b"0" * size


def test_read_json_file_bounds_what_it_reads(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes, not characters, and never more than the limit plus one (an endless file is refused)."""
    monkeypatch.setattr(V, "MAX_JSON_BYTES", 8)
    p = tmp_path / "t.json"
    p.write_text('"\u00e9\u00e9\u00e9"', encoding="utf-8")  # 8 bytes, 5 characters
    assert V.read_json_file(SpecError, "spec", str(p)) == "\u00e9\u00e9\u00e9"
    p.write_text('"\u00e9\u00e9\u00e9\u00e9"', encoding="utf-8")  # 10 bytes, 6 characters
    _raises(
        SpecError,
        f"spec = {str(p)!r}: larger than 8 B",
        "spec",
        str(p),
        V.read_json_file,
        SpecError,
        "spec",
        str(p),
    )
    p.write_bytes(b'["\xff"]')  # not UTF-8: refused as the error class, not a UnicodeDecodeError
    _raises(
        TableError,
        f"table {str(p)!r} = 'byte 2': is not UTF-8 text",
        f"table {str(p)!r}",
        "byte 2",
        V.read_json_file,
        TableError,
        "table",
        str(p),
    )
    monkeypatch.setattr(V, "open", lambda *a, **k: _Endless(), raising=False)
    _raises(
        SpecError,
        "spec = '/dev/zero': larger than 8 B",
        "spec",
        "/dev/zero",
        V.read_json_file,
        SpecError,
        "spec",
        "/dev/zero",
    )


def test_read_json_file_os_error_without_strerror(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: object, **k: object) -> None:
        raise OSError("no such device")  # an OSError with no errno/strerror

    monkeypatch.setattr(V, "_read_capped", refuse)
    _raises(
        SpecError,
        "spec = 'x.json': no such device",
        "spec",
        "x.json",
        V.read_json_file,
        SpecError,
        "spec",
        "x.json",
    )


# ---- backend options and the table argument ------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "power_of_two", "limit", "ok"),
    [
        (1, False, 8, True),
        (1, True, 8, True),  # 2**0
        (3, True, 8, False),
        (8, False, 8, True),
        (np.int32(8), True, 8, True),
        (6, False, 8, True),
        (6, True, 8, False),  # not a power of two
        (16, True, 8, False),  # above the limit, although a power of two
        (9, False, 8, False),
        (0, False, 8, False),
        (-4, True, 8, False),
        (True, False, 8, False),  # a bool is not an option value
        (2.0, False, 8, False),
        ("2", False, 8, False),
        (2**31 - 1, False, 2**31 - 1, True),
        (2**31, False, 2**31 - 1, False),
    ],
)
def test_check_option(value: object, power_of_two: bool, limit: int, ok: bool) -> None:
    if ok:
        got = V.check_option("num_warps", value, power_of_two=power_of_two, limit=limit)
        assert got == value and type(got) is int
        return
    what = "a positive power of two" if power_of_two else "a positive integer"
    msg = f"num_warps = {value!r}: must be {what}, at most {limit}"
    with pytest.raises(BackendError, match=re.escape(msg)):
        V.check_option("num_warps", value, power_of_two=power_of_two, limit=limit)


def test_check_option_default_limit_is_int32() -> None:
    assert V.check_option("programs", 2**31 - 1) == 2**31 - 1
    with pytest.raises(BackendError, match=r"at most 2147483647") as e:
        V.check_option("programs", 2**31)
    assert e.value.field == "programs" and e.value.value == 2**31


def test_check_table() -> None:
    t = K.plan(K.preset("dsv4-test"))
    assert check_table(t) is t
    with pytest.raises(TableError, match=r"table type = dict: must be a kvlayout.SegmentTable") as e:
        check_table(t.to_dict())
    assert e.value.field == "table" and e.value.value == "dict"
