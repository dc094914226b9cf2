"""Fifteenth hostile pass: the Pallas-Triton interpreter keeps NaN payloads of pages it does not
zero; bad vLLM caches, aliased or donated buffers, non-str backend names, bad ``--backend`` specs
and loosely typed options are refused with the field and value named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from kvlayout.backends.pallas.native import CacheZeroer

ROOT = Path(__file__).resolve().parent.parent

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


# ---- 2: the int64 carve-out kvlayout cannot see is documented ---------------------------------------


@pytest.mark.parametrize("doc", ["docs/reliability.md", "docs/tpu.md"])
def test_int64_ids_narrowed_by_the_users_own_jit_are_documented(doc: str) -> None:
    """JAX (x64 off) narrows NumPy int64 arguments of the user's own jit before ``apply`` sees them:
    the docs say so, with the remedies (int32 ids checked on the host, or x64)."""
    text = " ".join((ROOT / doc).read_text().split())
    assert "narrowed by JAX itself" in text
    for remedy in ("int32", "normalize_block_ids", "jax_enable_x64"):
        assert remedy in text, remedy
