"""Hostile pass 33 (/tmp/h33), on pass 32's fixes: each test failing on the code before its fix."""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError
from tests.hostile_cases import eight


def test_jax_apply_refuses_ids_counted_past_int32_max_before_any_mask() -> None:
    """``apply`` with a broadcast host array of 2**40 ids raised NumPy's 1 TiB MemoryError (``__call__``
    refused them by name)."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from kvlayout.backends.pallas import PallasZeroer
    from kvlayout.backends.pallas.native import CacheZeroer

    huge = np.broadcast_to(np.int64(1), (2**40,))
    z = PallasZeroer(eight(), kernel="triton", interpret=True)
    buf = jnp.asarray(K.poison_pattern(z.rows * 128 * 4).view(np.int32).reshape(z.rows, 128))
    zc = CacheZeroer({"k": jnp.zeros((8, 128), jnp.float32)}, kernel="triton", interpret=True)
    for call in (lambda: z.apply(buf, huge), lambda: zc.apply({"k": jnp.zeros((8, 128), jnp.float32)}, huge)):
        with pytest.raises(BlockIdError, match="block_ids.size = 1099511627776: at most 2147483647 ids"):
            call()
