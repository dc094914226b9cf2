"""Fifteenth hostile pass: the Pallas-Triton interpreter keeps NaN payloads of pages it does not
zero; bad vLLM caches, aliased or donated buffers, non-str backend names, bad ``--backend`` specs
and loosely typed options are refused with the field and value named."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from kvlayout.backends.pallas.native import CacheZeroer

# ---- 1: the Pallas-Triton interpreter keeps the bits of pages it does not zero ------------------------

#: dtype -> same-width unsigned view and NaNs with non-canonical payloads (canonical: 0x7fc0, 0x7f)
_POISON = {
    "bfloat16": (np.uint16, [0x7F81, 0xFF83, 0x7FA5, 0xFFFF]),
    "float8_e5m2": (np.uint8, [0x7D, 0xFE, 0x7E, 0xFD]),
}


@pytest.mark.parametrize("device_ids", [False, True])
@pytest.mark.parametrize("dtype", list(_POISON))
def test_triton_interpret_keeps_nan_payloads_of_other_pages(dtype: str, device_ids: bool) -> None:
    """XLA on the CPU computes bfloat16 and fp8 in float32, so the interpreter's read-modify-write of a
    leaf rewrote every NaN payload to the canonical NaN, pages no id named included. Bits outside the
    zeroed pages must be those given, bit for bit."""
    udt, nans = _POISON[dtype]
    shape = (4, 3, 8)
    raw = np.resize(np.array(nans, udt), int(np.prod(shape))).reshape(shape)
    leaves = [jnp.asarray(raw.view(jnp.dtype(dtype))), jnp.asarray(raw.view(jnp.dtype(dtype))[:, :2])]
    z = CacheZeroer(leaves, "g", kernel="triton", interpret=True)
    ids: Any = jnp.array([2], jnp.int32) if device_ids else [2]
    out = z(leaves, ids)
    for got, want in zip(out, (raw, raw[:, :2])):
        expect = want.copy()
        expect[2] = 0
        np.testing.assert_array_equal(np.asarray(got).view(udt), expect)
    z.check()
