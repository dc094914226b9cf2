"""Hostile pass 37 (/tmp/h37), on passes 35 and 36's fixes: each test failing on the code before its fix."""

from __future__ import annotations

import collections
import time

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError, LayoutBufferError


def test_several_groups_listed_for_a_dict_of_caches_are_refused() -> None:
    """``groups=["mamba", "attn"]`` for ``{"state", "kv"}`` was paired in sorted key order: zeroing "attn"
    cleared the state and left the KV page stale."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from kvlayout.backends.pallas.native import CacheZeroer

    caches = {"state": jnp.ones((8, 2, 16)), "kv": jnp.ones((8, 2, 16))}
    with pytest.raises(LayoutBufferError, match=r"^groups = \['mamba', 'attn'\]: several groups for"):
        CacheZeroer(caches, groups=["mamba", "attn"], kernel="triton", interpret=True)
    z = CacheZeroer(caches, groups={"state": "mamba", "kv": "attn"}, kernel="triton", interpret=True)
    out = z(caches, [1], group="attn")
    assert float(out["kv"][1].sum()) == 0 and float(out["state"][1].sum()) == 32
    assert CacheZeroer(caches, groups=["g", "g"], kernel="triton", interpret=True).spec.groups == ("g",)


def test_malformed_partition_specs_name_the_leaf() -> None:
    """A PartitionSpec past the leaf's rank (IndexError), an axis used twice (DuplicateSpecError) and
    ``P.UNCONSTRAINED`` on the page axis (TypeError) raised raw."""
    pytest.importorskip("jax")
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P
    from kvlayout.backends.pallas.native import CacheZeroer

    mesh = Mesh(np.array(jax.devices()[:1]), ("dp",))
    sds = jax.ShapeDtypeStruct((8, 4, 32), jnp.float32)
    for ps in (P(None, None, None, "dp"), P("dp", "dp"), P(P.UNCONSTRAINED)):
        with pytest.raises(LayoutBufferError, match=r"^leaf '0'.sharding = "):
            CacheZeroer([sds], mesh=mesh, partition_specs=[ps], kernel="triton", interpret=True)


def test_a_dict_jax_cannot_sort_is_named() -> None:
    """``{1: a, "kv": b}``: JAX's raw "Comparator raised exception while sorting pytree dictionary keys"."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from kvlayout.backends.pallas.native import CacheZeroer

    with pytest.raises(LayoutBufferError, match=r"^caches = dict: must be a pytree JAX can flatten"):
        CacheZeroer({1: jnp.ones((8, 16)), "kv": jnp.ones((8, 16))}, kernel="triton", interpret=True)


def test_a_list_spec_naming_the_leaves_in_another_order_is_matched_by_name() -> None:
    """A list cache's spec naming its leaves "1", "0" was matched by position: ``zeroed=False`` on "0" kept
    leaf 1 and leaf 0 was zeroed."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from kvlayout.backends.pallas.native import CacheZeroer

    from kvlayout.native import NativeCacheSpec, NativeLeaf

    caches = [jnp.ones((8, 2, 16)), jnp.ones((8, 2, 16))]
    spec = NativeCacheSpec((NativeLeaf("1", (8, 2, 16), "float32"),
                            NativeLeaf("0", (8, 2, 16), "float32", zeroed=False)))
    z = CacheZeroer(caches, spec=spec, kernel="triton", interpret=True)
    assert z.spec.names == ("0", "1")
    out = z(caches, [1])
    assert float(out[0][1].sum()) == 32 and float(out[1][1].sum()) == 0


def test_step_bytes_refuses_a_name_of_no_group() -> None:
    """A group the table does not have was counted as 0 bytes."""
    from kvlayout.viz.charts import step_bytes

    t = K.plan(K.preset("llama-8b").with_num_blocks(16))
    with pytest.raises(BlockIdError, match=r"^allocations key = 'nope': no group of the table's rows"):
        step_bytes(t, {"nope": [1, 2]})
    assert step_bytes(t, {"attn": [1, 2]})[0] > 0


def test_a_long_container_of_another_type_is_refused_by_its_type() -> None:
    """A deque of 10**7 ids was refused after 1.3 s and 250 MB spent on its repr."""
    ids = collections.deque(range(10**6))
    start = time.perf_counter()
    with pytest.raises(BlockIdError, match=r"^block_ids = <deque of 1000000 items>: must be a list, tuple"):
        K.validate.block_ids(ids, 16)
    assert time.perf_counter() - start < 0.05
