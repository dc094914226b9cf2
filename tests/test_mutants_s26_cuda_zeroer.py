"""The cuda zeroer's lines that the twenty-sixth session's mutation run found unpinned (issue 25).

Survivors of ``scripts/mutation.sh cuda-zeroer`` on the sources of df5b8e3 (backends/cuda/zeroer.py of
ff1c461): hostile pass 25's reading of an ndarray subclass as the plain array it is
(``CudaZeroer.from_dlpack``, ffc94c0) was tested only in tests/test_hostile_s25.py, not in the module's
fast list, and no test there imported a NumPy array through ``from_dlpack`` at all. Here a plain and a
subclass array imported and zeroed in place, and read-only memory behind a subclass's lying ``flags``
refused by ``field`` and ``value``, nothing written. Interpreter only (host memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import LayoutBufferError

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")

pytestmark = pytest.mark.skipif(kc.MODE == "native", reason="host memory: interpreter only")

# 64 blocks of one 8-byte row, block stride 32: block b's bytes are [32b, 32b + 8)
TABLE = K.SegmentTable(total_bytes=2048, num_blocks=64, segments=(K.Segment(0, 32, 8, "a", "L0"),))


class _Flags:
    """Flags that say C-contiguous and writeable, whatever the memory is."""

    c_contiguous = True
    writeable = True


class _Lying(np.ndarray):
    """An ndarray subclass whose ``flags`` say writeable, whatever it is."""

    @property
    def flags(self) -> Any:
        return _Flags()


class _Honest(np.ndarray):
    """An ndarray subclass that changes nothing."""


@pytest.mark.parametrize("kind", [np.ndarray, _Honest])
def test_from_dlpack_zeroes_a_host_array_in_place(kind: type) -> None:
    """A writeable NumPy array (or a subclass of one) is imported without a copy: zeroing blocks 0 and 5
    writes exactly their bytes into it."""
    poison = K.poison_pattern(TABLE.total_bytes)
    host = poison.copy().view(kind)
    z = kc.CudaZeroer.from_dlpack(host, TABLE, graphs=False)
    z.zero([0, 5])
    assert K.changed_ranges(poison, np.asarray(host)).tolist() == [[0, 8], [160, 168]]


def test_from_dlpack_refuses_read_only_memory_behind_a_subclass_s_flags() -> None:
    """Read-only memory (``np.frombuffer`` over ``bytes``) in a subclass whose flags say writeable: read as
    the plain array it is, refused by ``field`` ``buffer`` and ``value`` ``read-only``, its own type named
    in the message; the ``bytes`` object is not written."""
    data = bytes([7]) * TABLE.total_bytes
    lying = np.frombuffer(data, np.uint8).view(_Lying)
    assert lying.flags.writeable  # what it says
    with pytest.raises(LayoutBufferError) as e:
        kc.CudaZeroer.from_dlpack(lying, TABLE, graphs=False).zero([0, 1])
    assert str(e.value) == "buffer = _Lying (read-only): zeroing writes in place; pass writeable memory"
    assert e.value.field == "buffer"
    assert type(e.value.value) is str and e.value.value == "read-only"
    assert data == bytes([7]) * TABLE.total_bytes
