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


def test_native_check_verifies_each_page_size_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``check`` of a native spec ran the verifier once per leaf: 200,000 leaves (12 MB of JSON,
    under the 64 MiB cap) ran past 20 s. Leaves of one page size now share one safe report."""
    import kvlayout.native as kn

    shapes = [(4, 2, 8 * (1 + i % 3)) for i in range(3000)]
    leaves = [kn.NativeLeaf(name=f"l{i}", shape=s, dtype="bfloat16") for i, s in enumerate(shapes)]
    spec = kn.NativeCacheSpec(tuple(leaves))
    calls: list[int] = []
    real = kn.verify

    def counting(t: K.SegmentTable) -> object:
        calls.append(1)
        return real(t)

    monkeypatch.setattr(kn, "verify", counting)
    reports = kn.verify_native(spec)
    assert len(reports) == 3000 and all(r.ok for r in reports.values())
    assert len(calls) == 3  # one per page size
    assert reports["l4"].num_rows == 1 and reports["l4"].total_bytes == 4 * 2 * 16 * 2
