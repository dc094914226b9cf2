"""kvlayout.backends.pallas.zeroer's lines that the thirty-fourth session's mutation run found unpinned.

A survivor of ``scripts/mutation.sh pallas-zeroer`` on the sources of 09f82c9 (zeroer.py of ae4fa0b, pass
33): a 64-bit JAX id in a list, made while x64 was on and used with it off, was matched by a word of the
message only (tests/test_hostile_s33.py); the field naming the element was not pinned.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvlayout.errors import BlockIdError
from tests.hostile_cases import eight

jax = pytest.importorskip("jax")


def test_a_64_bit_jax_id_in_a_list_is_named_by_its_index() -> None:
    import jax.numpy as jnp
    from kvlayout.backends.pallas import PallasZeroer

    jax.config.update("jax_enable_x64", True)
    try:
        wide = jnp.asarray(np.array([2**32 + 3], np.int64))[0]
    finally:
        jax.config.update("jax_enable_x64", False)
    z = PallasZeroer(eight(), kernel="triton", interpret=True)
    buf = jnp.asarray(np.full(z.buffer_shape, 7, np.int32))
    with pytest.raises(BlockIdError) as e:
        z.apply(buf, [1, wide])
    why = "64-bit ids with jax_enable_x64 off, which JAX narrows: pass int32 ids (nothing written)"
    assert str(e.value) == f"block_ids[1].dtype = int64: {why}"
    assert e.value.field == "block_ids[1].dtype" and e.value.value == "int64"
