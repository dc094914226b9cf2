"""Shared by the Pallas zeroers' hostile and mutation tests: the interpreter reset, a raise helper,
stand-in devices and committed ``jax.Array`` s (so one CPU device can show ids placed elsewhere), and the
poisoned dsv4-test buffer with its NumPy reference. Import it after ``pytest.importorskip("jax")``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import kvlayout as K

NUM_BLOCKS = 6
KERNELS = (("triton", {"dedup": False}), ("triton", {"dedup": True}), ("tpu", {}))
TAIL = ": jax.device_put them there, or pass host ids (nothing was written)"


@pytest.fixture(autouse=True)
def reset_interpreter() -> Iterator[None]:
    """The TPU interpreter's process-wide state cleared after each test (import it to use it)."""
    yield
    pltpu.reset_tpu_interpret_mode_state()


def raises(cls: type[Exception], fn: Any, *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)`` must raise ``cls``: the exception."""
    with pytest.raises(cls) as e:
        fn(*args, **kw)
    return e.value


class Dev:
    """A stand-in device: only its identity and its text matter to the checks."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __str__(self) -> str:
        return f"dev:{self.n}"

    __repr__ = __str__


D1, D2, D3, D4 = Dev(1), Dev(2), Dev(3), Dev(4)


class Placed(jax.Array):
    """A 1-D ``jax.Array`` stand-in (no values) committed, or not, to the devices of a mesh."""

    def __init__(self, devices: tuple[Any, ...], committed: bool = True, n: int = 2,
                 dtype: Any = jnp.int32) -> None:
        self._sharding = NamedSharding(Mesh(np.array(devices, dtype=object), ("x",)), P())
        self._committed, self._shape, self._dtype = committed, (n,), jnp.dtype(dtype)

    sharding = property(lambda self: self._sharding)
    committed = property(lambda self: self._committed)
    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype)
    ndim = property(lambda self: len(self._shape))


def dsv4_table() -> K.SegmentTable:
    """The dsv4-test preset with :data:`NUM_BLOCKS` blocks."""
    return K.plan(K.preset("dsv4-test").with_num_blocks(NUM_BLOCKS))


def poisoned(z: Any) -> np.ndarray:
    """The host image of a poisoned ``int32[rows, 128]`` buffer of zeroer ``z``, as bytes."""
    return K.poison_pattern(z.buffer_shape[0] * 512).copy()


def on_device(host: np.ndarray, z: Any) -> Any:
    """``host`` as zeroer ``z``'s device buffer."""
    return jnp.asarray(host.view(np.int32).reshape(z.buffer_shape))


def same(out: Any, host: np.ndarray, table: Any, expect: list[int]) -> bool:
    """``out`` equals ``host`` with blocks ``expect`` zeroed by the NumPy reference, byte for byte."""
    ref = host.copy()
    if expect:
        K.zero_blocks_numpy(ref, table, expect)
    return bool(np.array_equal(np.asarray(out).reshape(-1).view(np.uint8), ref))
