"""kvlayout.reference's input checks added by the hostile passes 19 to 21 (session 22, mutation coverage):
``changed_ranges``' origin bound, ``_bytes``' refusals (the field, the value and the exact message),
``compare_to_ranges``' ``layout_bytes`` bound, image names, expected-range parsing and its window bound.

Expected messages are typed out; byte counts are the images' sizes, built here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvlayout import reference as R
from kvlayout.errors import LayoutBufferError


def _err(fn: Callable[[], object], field: str | None, value: Any, message: str) -> None:
    """``fn`` raises LayoutBufferError naming ``field`` and ``value``, with exactly ``message``."""
    with pytest.raises(LayoutBufferError) as e:
        fn()
    assert e.value.field == field, (e.value.field, str(e.value))
    assert type(e.value.value) is type(value) and e.value.value == value, (e.value.value, str(e.value))
    assert str(e.value) == message


def _img(n: int = 16) -> np.ndarray:
    return np.arange(1, n + 1, dtype=np.uint8)


def test_changed_ranges_origin_is_bounded_at_minus_2_62() -> None:
    """changed_ranges takes any integer origin down to -2**62 (as compare_to_ranges), and not one below."""
    b = _img()
    a = b.copy()
    a[3:5] = 0
    assert R.changed_ranges(b, a, -1000).tolist() == [[1003, 1005]]
    assert R.changed_ranges(b, a, -(2**62)).tolist() == [[2**62 + 3, 2**62 + 5]]
    low = -(2**62) - 1
    _err(lambda: R.changed_ranges(b, a, low), "origin", low,
         f"origin = {low}: must be at least {-(2**62)}")


def test_bytes_that_numpy_cannot_read_are_named() -> None:
    """A ragged list (NumPy's raw ValueError) is refused by the image's name, its type shown, NumPy's
    reason kept; _bytes' own default name is 'image'."""
    ragged = [[1], [1, 2]]
    for call, field in ((lambda: R.changed_ranges(ragged, _img(2)), "before"),  # type: ignore[arg-type]
                        (lambda: R.compare_to_ranges(_img(2), ragged, np.zeros((0, 2), np.int64)), "after"),
                        (lambda: R._bytes(ragged), "image")):  # type: ignore[arg-type]
        with pytest.raises(LayoutBufferError) as e:
            call()
        assert e.value.field == field and e.value.value == "list", (e.value.field, e.value.value)
        want = f"{field} = 'list': must be an array of bytes (setting an array element with a sequence"
        assert str(e.value).startswith(want), str(e.value)


@pytest.mark.parametrize("bad", [np.array(["ab"]), np.zeros(2, [("a", object)]), np.zeros(2, object)])
def test_images_that_are_not_plain_data_are_refused_by_dtype(bad: np.ndarray) -> None:
    """A string array (no objects, kind U) and a record holding an object (kind V) are refused as well as an
    object array: the dtype shown as written, and held as the error's value."""
    d = str(bad.dtype)
    why = "must be an array of plain data (bytes)"
    _err(lambda: R.changed_ranges(_img(2), bad), "after", d, f"after = {d}: {why}")
    none = np.zeros((0, 2), np.int64)
    _err(lambda: R.compare_to_ranges(bad, _img(2), none), "before", d, f"before = {d}: {why}")
    _err(lambda: R._bytes(bad), "image", d, f"image = {d}: {why}")


def test_datetime_and_void_images_are_plain_data() -> None:
    """datetime64 (kind M) and raw void (kind V) images are plain bytes, compared byte by byte."""
    for dt in ("M8[s]", "V2", "m8[s]"):
        b = np.zeros(4, dt)
        a = np.ones(8, np.uint8).view(dt) if dt == "V2" else np.array([0, 0, 1, 0], dt)
        got = R.changed_ranges(b, a).tolist()
        assert got == ([[0, 8]] if dt == "V2" else [[16, 17]]), (dt, got)
        assert R._bytes(b).dtype == np.uint8 and R._bytes(b).size == b.nbytes


def test_after_of_another_size_holds_its_size_as_value() -> None:
    """Images of two sizes: the field is 'after', its byte count shown and held as the error's value."""
    _err(lambda: R.changed_ranges(_img(16), _img(8)), "after", "8 B",
         "after = 8 B: must have as many bytes as before (16)")


def test_layout_bytes_must_not_be_negative() -> None:
    """compare_to_ranges' layout_bytes is at least 0: -1 is refused by name, not read as a bound."""
    img = _img(16)
    _err(lambda: R.compare_to_ranges(img, img.copy(), np.zeros((0, 2), np.int64), layout_bytes=-1),
         "layout_bytes", -1, "layout_bytes = -1: must be at least 0")
    assert R.compare_to_ranges(img, img.copy(), np.zeros((0, 2), np.int64), layout_bytes=16).matches


def test_empty_expected_ranges_of_any_shape_read_as_int64() -> None:
    """No expected range, as [], a float [0, 2] array or an int32 one, is an int64 [0, 2] array; an int32
    list of ranges is widened to int64."""
    img = _img(16)
    for exp in ([], np.zeros((0, 2)), np.zeros((0, 2), np.int32), np.zeros(0, np.int64)):
        chk = R.compare_to_ranges(img, img.copy(), exp)  # type: ignore[arg-type]
        assert chk.matches and chk.expected.dtype == np.int64 and chk.expected.shape == (0, 2), exp
    after = img.copy()
    after[2:6] = 0
    chk = R.compare_to_ranges(img, after, np.array([[2, 6]], np.int32))
    assert chk.matches and chk.expected.dtype == np.int64 and chk.expected.tolist() == [[2, 6]]


def test_one_number_is_not_a_range() -> None:
    """A single integer (size 1, 1-D) is not a [k, 2] range list: refused by name, the caller's type shown
    (a list named as the list it was, not as the array it was converted to)."""
    img = _img(16)
    why = "must be [k, 2] integer [start, end) ranges (int64)"
    for exp in ([5], np.array([5]), [0, 8, 16], [[1.5, 2]]):
        name = type(exp).__name__
        _err(lambda: R.compare_to_ranges(img, img.copy(), exp), "expected", name,  # noqa: B023
             f"expected = '{name}': {why}")
    _err(lambda: R.compare_to_ranges(img, img.copy(), [[0, 1], [2]]), "expected", "list",
         f"expected = 'list': {why}")


def test_empty_images_with_no_layout_bound() -> None:
    """Empty images and no expected range: nothing to hold, nothing changed (no layout bound of 1 byte)."""
    e = np.zeros(0, np.uint8)
    chk = R.compare_to_ranges(e, e.copy(), np.zeros((0, 2), np.int64))
    assert chk.matches and chk.zeroed.shape == (0, 2)


def test_image_too_short_for_the_ranges_holds_its_size_as_value() -> None:
    """An expected range past the images' end: the field is 'before', its byte count shown and held."""
    img = _img(8)
    _err(lambda: R.compare_to_ranges(img, img.copy(), np.array([[4, 12]])), "before", "8 B",
         "before = 8 B: must hold bytes [4, 12) (the layout at origin 0 and the ranges expected zeroed)")
