"""The native-array zeroer's session-16 host rules: the TPU kernel's limits are checked at construction
for the leaves a call may zero (by their names), one jax.Array given as two leaves is named after JAX
refuses the call, and ``leaf_backend`` keeps a NumPy offset as a Python int."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.native import NativeCacheSpec, NativeLeaf

jax = pytest.importorskip("jax")
N = pytest.importorskip("kvlayout.backends.pallas.native")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

Z = N.CacheZeroer
PAGES = 6
A = ((PAGES, 2, 128), "float32")


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


def _raises(cls: type[Exception], fn: Any, *args: Any, **kw: Any) -> Any:
    with pytest.raises(cls) as e:
        fn(*args, **kw)
    return e.value


def test_the_tpu_kernel_refuses_at_construction_the_leaves_it_would_zero() -> None:
    odd = jax.ShapeDtypeStruct((PAGES, 256), jnp.bfloat16)  # rank-2 bf16: 6 pages, not a multiple of 8
    a = jax.ShapeDtypeStruct(*A[:1], jnp.float32)
    e = _raises(K.LayoutBufferError, Z, {"a": a, "odd": odd}, kernel="tpu", interpret=True)
    assert e.field == "leaf 'odd'.shape" and e.value == (PAGES, 256)
    assert "the TPU kernel needs the page count to be a multiple of 8" in str(e)
    # not zeroed: no call writes it, so the TPU kernel takes the cache
    spec = NativeCacheSpec((NativeLeaf("a", *A), NativeLeaf("odd", (PAGES, 256), "bfloat16", zeroed=False)))
    z = Z({"a": a, "odd": odd}, spec=spec, kernel="tpu", interpret=True)
    assert z.kernel == "tpu"
    # the refused leaf is named by its name in the spec, after a leaf that is not zeroed
    spec = NativeCacheSpec((NativeLeaf("s", *A, zeroed=False), NativeLeaf("t", (PAGES, 256), "bfloat16")))
    e = _raises(K.LayoutBufferError, Z, {"s": a, "t": odd}, spec=spec, kernel="tpu", interpret=True)
    assert e.field == "leaf 't'.shape"
    # the Triton kernel has no such limit
    assert Z({"a": a, "odd": odd}, kernel="triton", interpret=True).kernel == "triton"


def test_one_array_given_as_two_leaves_is_named() -> None:
    host = np.arange(np.prod(A[0]), dtype=np.float32).reshape(A[0]) + 1
    x = jnp.asarray(host)
    z = Z([x, jnp.asarray(host)], kernel="triton", interpret=True)
    e = _raises(K.LayoutBufferError, z, [x, x], [1])
    why = ("is the same jax.Array as leaf '0': every leaf is donated and written in place, so each must be "
           "an array of its own")
    assert str(e) == f"leaf '1' = 'same array': {why}"
    assert e.field == "leaf '1'" and e.value == "same array" and e.__cause__ is not None
    assert not x.is_deleted() and np.array_equal(np.asarray(x), host)  # nothing ran
    three = Z([x, jnp.asarray(host), jnp.asarray(host)], kernel="triton", interpret=True)
    y = jnp.asarray(host)
    e = _raises(K.LayoutBufferError, three._diagnose, [x, y, y], ValueError("jax"))
    assert e.field == "leaf '2'" and "the same jax.Array as leaf '1'" in str(e)
    three._diagnose([x, y, jnp.asarray(host)], ValueError("jax"))  # distinct arrays: JAX's error stands


def test_leaf_backend_offset_is_a_python_int() -> None:
    leaf = NativeLeaf("k", (PAGES, 4, 64), "int32")
    cls = N.leaf_backend(leaf, kernel="triton", interpret=True)
    t = leaf.table()
    data = K.poison_pattern(leaf.total_bytes + 200, seed=9).copy()
    b = cls.from_host(t, data, offset=np.int64(100))
    assert type(b.offset) is int and b.offset == 100
    b.zero([3])
    exp = data.copy()
    K.zero_blocks_numpy(exp, t, [3], offset=100)
    assert np.array_equal(b.to_host(), exp)
