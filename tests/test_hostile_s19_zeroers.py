"""Hostile pass 19 (/tmp/h19), the Pallas zeroers: one regression test per finding, each failing on the
code before its fix (a2e18cb): leaves and buffers JAX cannot take, donated buffers on the traceable paths,
and host bytes that are not plain data, refused by name with nothing written."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import LayoutBufferError
from kvlayout.sharding import shard_spec

jax = pytest.importorskip("jax")
kp = pytest.importorskip("kvlayout.backends.pallas")
torch = pytest.importorskip("torch")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import Mesh  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:1]), ("dp",))


HOST = (np.arange(6 * 4 * 8, dtype=np.float32) + 1).reshape(6, 4, 8)  # no zero element


@pytest.mark.parametrize("path", ["__call__", "apply"])
@pytest.mark.parametrize(
    ("leaf", "shown"),
    [
        (torch.from_numpy(HOST.copy()), "Tensor"),
        ("x", "str"),
        (jax.ShapeDtypeStruct(HOST.shape, jnp.float32), "ShapeDtypeStruct"),
        (np.empty(HOST.shape, object), "object(6, 4, 8)"),
    ],
    ids=["torch", "str", "shape-dtype-struct", "object-array"],
)
def test_f2_a_leaf_jax_cannot_take_is_named(path: str, leaf: Any, shown: str) -> None:
    """F2 (MEDIUM): a torch tensor, a string, a ShapeDtypeStruct or an object array as a cache leaf got
    JAX's raw TypeError (apply read ``jnp.dtype(x.dtype)`` unguarded; __call__ caught no TypeError)."""
    z = kp.CacheZeroer({"k": jnp.asarray(HOST), "v": jnp.asarray(HOST)}, kernel="triton", interpret=True)
    v = jnp.asarray(HOST)
    pattern = rf"^leaf 'k' = '?{re.escape(shown)}'?: (must be|is abstract)"
    with pytest.raises(LayoutBufferError, match=pattern):
        getattr(z, path)({"k": leaf, "v": v}, [1])
    assert np.array_equal(np.asarray(v), HOST)  # nothing ran
    if isinstance(leaf, torch.Tensor):
        assert np.array_equal(leaf.numpy(), HOST)


def test_f3_the_traceable_paths_name_a_donated_buffer() -> None:
    """F3 (MEDIUM): PallasZeroer.apply / apply_masked and CacheZeroer.apply on a donated (deleted)
    buffer raised JAX's bare RuntimeError ("Array has been deleted"); __call__ already named it."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(6))
    z = kp.PallasZeroer(t, kernel="triton", interpret=True)
    b = jnp.zeros(z.buffer_shape, jnp.int32)
    b.delete()
    with pytest.raises(LayoutBufferError, match=r"^buffer = 'deleted': was donated"):
        z.apply(b, [1])
    with pytest.raises(LayoutBufferError, match=r"^buffer = 'deleted': was donated"):
        z.apply_masked(b, jnp.array([1]), jnp.array([True]))
    c = kp.CacheZeroer([jnp.asarray(HOST)], kernel="triton", interpret=True)
    d = jnp.asarray(HOST)
    d.delete()
    with pytest.raises(LayoutBufferError, match=r"^leaf '0' = 'deleted': was donated"):
        c.apply([d], [1])
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 1}, block_axes=("dp",))
    zs = kp.ShardedPallasZeroer(lay, _mesh(), kernel="triton", interpret=True)
    sb = zs.make_buffer()
    sb.delete()
    with pytest.raises(LayoutBufferError, match=r"^buffer = 'deleted': was donated"):
        zs.apply(sb, [1])


def test_f4_make_buffer_refuses_what_is_not_plain_bytes() -> None:
    """F4 (MEDIUM): ShardedPallasZeroer.make_buffer of an object array or a dict: NumPy's raw TypeError."""
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 1}, block_axes=("dp",))
    zs = kp.ShardedPallasZeroer(lay, _mesh(), kernel="triton", interpret=True)
    for g, shown in ((np.empty(lay.gathered_bytes, object), "object array"), ({}, "dict")):
        with pytest.raises(LayoutBufferError, match=rf"^gathered = '?{shown}'?: must be a NumPy array"):
            zs.make_buffer(g)  # type: ignore[arg-type]
    data = K.poison_pattern(lay.gathered_bytes)
    assert np.array_equal(zs.to_host(zs.make_buffer(data)), data)  # plain bytes still round-trip
