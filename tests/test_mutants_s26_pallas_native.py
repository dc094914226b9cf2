"""The Pallas ``CacheZeroer``'s lines that the twenty-sixth session's mutation run found unpinned (issue 25).

Survivors of ``scripts/mutation.sh pallas-native`` on the sources of 7ccd0e3 (backends/pallas/native.py of
0a0cc71): hostile pass 20's refusals of a host leaf (tests/test_hostile_s20.py) were matched by a pattern
that let the value's repr pass for its name (``'?MaskedArray'?``). Here each refusal's ``field``, ``value``
and whole message: a NumPy leaf refused by :meth:`CacheZeroer.apply` (a zeroing call takes ``jax.Array``
leaves only), and a masked-array leaf that jit refuses in ``__call__``, named after the fact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvlayout.errors import LayoutBufferError

jax = pytest.importorskip("jax")
kp = pytest.importorskip("kvlayout.backends.pallas")
jnp = pytest.importorskip("jax.numpy")

HOST = (np.arange(6 * 4 * 8, dtype=np.float32) + 1).reshape(6, 4, 8)


def _zeroer() -> Any:
    """A zeroer over two float32 (6, 4, 8) leaves, ``k`` and ``v`` (the Triton kernel, interpreted)."""
    return kp.CacheZeroer({"k": jnp.asarray(HOST), "v": jnp.asarray(HOST)}, kernel="triton", interpret=True)


def _refused(call: Any, message: str, value: str) -> LayoutBufferError:
    """``call()`` raises a ``LayoutBufferError`` on leaf ``k`` with this message and value (a str)."""
    with pytest.raises(LayoutBufferError) as e:
        call()
    assert str(e.value) == message
    assert e.value.field == "leaf 'k'"
    assert type(e.value.value) is str and e.value.value == value
    return e.value


@pytest.mark.parametrize("leaf", [HOST.copy(), np.ma.masked_array(HOST.copy())], ids=["ndarray", "masked"])
def test_apply_refuses_a_host_leaf_by_its_type(leaf: np.ndarray) -> None:
    """``apply`` zeroes: a NumPy leaf of the right shape and dtype is refused before anything is traced,
    by its type name and the shape and dtype a ``jax.Array`` leaf must have."""
    z = _zeroer()
    kind = type(leaf).__name__
    v = jnp.asarray(HOST)
    e = _refused(lambda: z.apply({"k": leaf, "v": v}, [1]),
                 f"leaf 'k' = {kind}: must be a jax.Array of float32(6, 4, 8)", kind)
    assert e.__cause__ is None  # refused by the check itself, not after JAX's error
    assert np.array_equal(np.asarray(v), HOST) and np.array_equal(np.asarray(leaf), HOST)


def test_call_names_a_masked_leaf_that_jit_refused() -> None:
    """``__call__`` with a masked-array leaf: jit's ``ValueError`` is replaced by a
    ``LayoutBufferError`` naming the leaf, its type name as the value and shown bare."""
    z = _zeroer()
    v = jnp.asarray(HOST)
    masked = np.ma.masked_array(HOST.copy())
    e = _refused(lambda: z({"k": masked, "v": v}, [1]),
                 "leaf 'k' = MaskedArray: must be a jax.Array (a host array cannot be zeroed in place)",
                 "MaskedArray")
    assert isinstance(e.__cause__, ValueError)  # JAX's own refusal, kept as the cause
    assert np.array_equal(np.asarray(v), HOST) and np.array_equal(np.asarray(masked), HOST)
