"""kvlayout.validate's lines that the twenty-seventh session's mutation run found unpinned (issue 25).

Survivors of ``scripts/mutation.sh validate`` on the sources of 7c1af0f (validate.py of 9ac153b): hostile
passes 24 to 26 tested ``plain_str``, ``plain_fields``' reading of ``str`` subclasses and ``host_buffer``'s
plain view only in tests/test_hostile_s24_core.py, _s25.py and _s26.py, which are not in the module's fast
list. Here each helper directly: what is made a plain str (alone or in a tuple) and what is left as it is,
and a buffer read as the plain ndarray it is before its flags and shape are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from kvlayout.errors import LayoutBufferError
from kvlayout.validate import host_buffer, plain_fields, plain_str


class _Name(str):
    """A str subclass that changes nothing but its type."""


@dataclass(frozen=True)
class _Fields:
    a: Any
    b: Any
    c: Any
    d: Any
    e: Any
    f: Any


def test_plain_str_reads_a_str_subclass_as_its_plain_str_and_leaves_the_rest() -> None:
    got = plain_str(_Name("g"))
    assert type(got) is str and got == "g"
    for v in ("g", None, 5, b"g", (_Name("g"),)):
        assert plain_str(v) is v


def test_plain_fields_makes_str_subclasses_plain_alone_and_in_tuples() -> None:
    """NumPy ints become ints, a str subclass field and each str subclass in a plain tuple (one holding no
    plain str too) become plain strs; plain values, a tuple of plain strs and a list holding a subclass
    are left as they are."""
    listed = [_Name("x")]
    obj = _Fields(np.int64(3), _Name("g"), (_Name("x"), 4), ("p", "q"), listed, "h")
    plain_fields(obj)
    assert type(obj.a) is int and obj.a == 3
    assert type(obj.b) is str and obj.b == "g"
    assert type(obj.c) is tuple and [type(x) for x in obj.c] == [str, int] and obj.c == ("x", 4)
    assert obj.d == ("p", "q") and obj.e is listed and type(obj.e[0]) is _Name and obj.f == "h"


class _Flags:
    """Flags that say C-contiguous and writeable, whatever the memory is."""

    c_contiguous = True
    writeable = True


class _Lying(np.ndarray):
    """An ndarray subclass whose ``flags`` say C-contiguous and writeable, whatever it is."""

    @property
    def flags(self) -> Any:
        return _Flags()


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # numpy.matrix
def test_host_buffer_reads_a_subclass_as_the_plain_array_it_is() -> None:
    """A reversed view whose flags say C-contiguous is refused as non-contiguous, read-only memory whose
    flags say writeable as read-only; a 2-D ``numpy.matrix`` comes back as its 1-D bytes, a plain array."""
    rev = np.zeros(64, np.uint8)[::-1].view(_Lying)
    with pytest.raises(LayoutBufferError) as e:
        host_buffer(rev, 64, 0)
    assert (e.value.field, e.value.value) == ("buffer", "non-contiguous")
    ro = np.frombuffer(bytes(64), np.uint8).view(_Lying)
    with pytest.raises(LayoutBufferError) as e:
        host_buffer(ro, 64, 0)
    assert (e.value.field, e.value.value) == ("buffer", "read-only")
    m = np.asmatrix(np.arange(16, dtype=np.uint8).reshape(2, 8))
    got = host_buffer(m, 16, 0)
    assert type(got) is np.ndarray and got.shape == (16,) and got.tolist() == list(range(16))
    got[3] = 0
    assert m[0, 3] == 0  # a view of the matrix's bytes, not a copy
