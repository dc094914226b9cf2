"""Issue 25, hostile review: inputs a fresh pass found that the fixes did not bound.

Each test fails on the code before its fix (checked once by reverting it).
"""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError


def test_pallas_apply_refuses_string_ids_as_block_id_error() -> None:
    """``apply`` with string ids raised JAX's raw ``TypeError``; a scalar int was said not to fit int64."""
    jax = pytest.importorskip("jax")
    kp = pytest.importorskip("kvlayout.backends.pallas")
    import jax.numpy as jnp

    table = K.plan(K.preset("dsv4-test").with_num_blocks(6))
    z = kp.PallasZeroer(table, kernel="triton", interpret=True)
    host = K.poison_pattern(z.rows * 512).view(np.int32).reshape(z.buffer_shape)
    cz = kp.CacheZeroer([jnp.zeros((6, 2, 4, 16), jnp.int32)])
    for bad in ("1", ["1"], ("a", "b"), [None], {"x": 1}):
        with pytest.raises(BlockIdError, match="block_ids"):
            z.apply(jnp.asarray(host), bad)
        with pytest.raises(BlockIdError, match="block_ids"):
            cz.apply([jnp.zeros((6, 2, 4, 16), jnp.int32)], bad)
    with pytest.raises(BlockIdError, match="1-D") as info:
        z.apply(jnp.asarray(host), 2**32 + 3)
    assert "int64" not in str(info.value)
    del jax
