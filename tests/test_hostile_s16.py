"""Hostile pass 16 (/tmp/h16/FINDINGS.md): one regression test per finding, each failing on the code before
its fix. The 2-device sharded case of H1 is in tests/mesh_cases.py (it needs the 9-device run)."""

from __future__ import annotations

import array
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.sharding import shard_spec

jax = pytest.importorskip("jax")
kp = pytest.importorskip("kvlayout.backends.pallas")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import Mesh  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


def _raises(cls: type[Exception], fn: Any, *args: Any, **kwargs: Any) -> Any:
    with pytest.raises(cls) as e:
        fn(*args, **kwargs)
    return e.value


class WeirdInt(int):
    """An int whose ``__index__`` (what NumPy reads) lies about its value (what torch reads)."""

    def __index__(self) -> int:
        return 0


# ---- H1: ShardedPallasZeroer.apply checked no buffer ------------------------------------------------
def _sharded() -> Any:
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(6), {"x": 1}, block_axes=("x",))
    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    return kp.ShardedPallasZeroer(lay, mesh, kernel="triton", interpret=True)


def test_h1_sharded_apply_refuses_a_buffer_of_other_rows_or_dtype_by_name() -> None:
    z = _sharded()
    rows = z.buffer_shape[0]
    ids = jnp.array([5], jnp.int32)
    step = jax.jit(z.apply, donate_argnums=0)
    for shape, dtype, field in (
        ((rows + 8, 128), jnp.int32, "buffer.shape"),
        ((rows - 8, 128), jnp.int32, "buffer.shape"),
        ((rows, 128), jnp.uint8, "buffer.dtype"),
        ((rows, 128), jnp.float32, "buffer.dtype"),
    ):
        host = np.full(shape, 0x5A, np.dtype(dtype))
        buf = jax.device_put(jnp.asarray(host), z.sharding)
        e = _raises(K.LayoutBufferError, step, buf, ids)
        assert e.field == field, (shape, dtype, str(e))
        if field == "buffer.shape":
            assert str(e) == f"buffer shape = {shape}: must be {z.buffer_shape} (1 shards x {rows} rows)"
        else:
            assert str(e).startswith(f"buffer dtype = {np.dtype(dtype)}: must be int32")
        assert not buf.is_deleted() and np.array_equal(np.asarray(buf), host)  # untouched, not donated


def test_h1_per_shard_paths_check_the_rows_they_assume() -> None:
    z = _sharded()
    rows = z.shard_rows
    ids, keep = jnp.array([1], jnp.int32), jnp.array([True])
    short = jnp.zeros((z.local.rows - 8, 128), jnp.int32)
    e = _raises(K.LayoutBufferError, z.local.apply_masked, short, ids, keep)
    assert e.field == "buffer.shape" and str(e).startswith(f"buffer rows = {z.local.rows - 8}: the layout")
    e = _raises(K.LayoutBufferError, z.local.apply_masked, jnp.zeros((rows, 128), jnp.uint8), ids, keep)
    assert e.field == "buffer.dtype"
    # the shard_map bodies: a shard block other than [shard_rows, 128] is refused before any write
    for body in (z._shard_step, z._shard_step_local):
        e = _raises(K.LayoutBufferError, body, jnp.zeros((rows + 8, 128), jnp.int32), ids)
        assert e.field == "buffer.shape" and str(e).startswith(
            f"buffer shard shape = {(rows + 8, 128)}: must be {(rows, 128)}"
        ), str(e)


def test_h1_sharded_apply_still_zeroes_the_right_bytes() -> None:
    z = _sharded()
    data = K.poison_pattern(z.layout.gathered_bytes)
    out, bad = jax.jit(z.apply, donate_argnums=0)(z.make_buffer(data), jnp.array([1, 5, 9], jnp.int32))
    assert int(bad) == 1
    chk = z.layout.compare(data, z.to_host(out), [1, 5])
    assert chk.matches, chk.describe()


# ---- M1: _walk_tensors recursed without a bound -----------------------------------------------------
def test_m1_views_nested_5000_deep_are_a_spec_error_naming_the_layer() -> None:
    pytest.importorskip("torch")
    from tests.driver import ground_truth

    ground_truth()
    import torch
    from vllm.v1 import kv_cache_interface as iface

    from kvlayout.integrations.vllm import (
        KVBlockZeroer,
        check_views_against_layout,
        spec_from_kv_cache_config,
    )

    names = ["model.layers.0.attn", "model.layers.1.attn"]
    attn = iface.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)
    t = iface.KVCacheTensor(size=8192, layers=names, layer_stride=1024, block_stride=2048)
    groups = [iface.KVCacheGroupSpec(names, attn)]
    cfg = iface.KVCacheConfig(
        num_blocks=4, kv_cache_tensors=[t], kv_cache_groups=groups, kv_cache_layout="BLHNC"
    )
    raw = torch.zeros(8192, dtype=torch.int8)
    views = dict(zip(names, iface.create_kv_cache_views(raw, attn, 4, iface.KVCacheLayout.BLHNC, t)))
    x = views[names[1]]
    for _ in range(5000):
        x = [x]
    views[names[1]] = x
    e = _raises(K.SpecError, KVBlockZeroer.from_kv_caches, cfg, views)
    assert e.field == "kv_caches['model.layers.1.attn']", str(e)
    assert str(e).startswith("kv_caches['model.layers.1.attn'] = lists nested 17 deep: nests lists/tuples")
    assert not raw.any()
    layout = K.plan_layout(spec_from_kv_cache_config(cfg, "BLHNC"))
    e = _raises(K.SpecError, check_views_against_layout, layout, views, 8192)
    assert e.field == "kv_caches['model.layers.1.attn']", str(e)
    views[names[1]] = [[[views[names[0]]]]]  # shallow nesting is walked (then refused: another layer's)
    e = _raises(K.SpecError, check_views_against_layout, layout, views, 8192)
    assert "nested" not in str(e)


# ---- L1: apply took id containers __call__ refuses ---------------------------------------------------
def _cache_apply(ids: Any) -> Any:
    cz = kp.CacheZeroer([jnp.ones((8, 4, 128), jnp.float32)], "g")
    return cz.apply([jnp.ones((8, 4, 128), jnp.float32)], ids)


def test_l1_apply_refuses_what_call_refuses_naming_block_ids_and_the_type() -> None:
    torch = pytest.importorskip("torch")
    pz = kp.PallasZeroer(K.plan(K.preset("dsv4-test").with_num_blocks(6)), kernel="triton", interpret=True)
    buf = jnp.zeros(pz.buffer_shape, jnp.int32)
    cases = (
        (bytearray(b"\x03"), "bytearray"),
        (b"\x03", "bytes"),
        (range(2, 4), "range"),
        (memoryview(b"\x03"), "memoryview"),
        (array.array("q", [3]), "array"),
        (torch.tensor([3]), "Tensor"),
        ({3}, "set"),
        (3, "int"),
    )
    for ids, kind in cases:
        for apply in (_cache_apply, lambda i: pz.apply(buf, i)):
            e = _raises(K.BlockIdError, apply, ids)
            assert e.field == "block_ids" and str(e).endswith(f"; got a {kind}"), (ids, str(e))
            assert "must be a list, tuple or integer NumPy array of block ids, or a jax.Array" in str(e)
    for ids, at in (([np.array(3)], 0), ([2, torch.tensor(3)], 1), ([jnp.int32(1), np.array(2)], 1)):
        e = _raises(K.BlockIdError, _cache_apply, ids)  # __call__ refuses 0-d arrays in a list too
        assert e.field == f"block_ids[{at}]" and str(e).endswith(": must be an integer block id"), str(e)
    # what the contract takes still works, in a user's jit too
    for ids in ([1, np.int64(5)], (1, 5), np.array([1, 5], np.int64), jnp.array([1, 5])):
        out, bad = jax.jit(_cache_apply)(ids) if isinstance(ids, jax.Array) else _cache_apply(ids)
        assert int(bad) == 0 and [i for i in range(8) if float(out[0][i].sum()) == 0] == [1, 5], ids


# ---- L2: float64 ids reported as float32 --------------------------------------------------------------
def test_l2_apply_names_the_dtype_given() -> None:
    given = ((np.array([1.0, 2.0]), "float64"), (np.array([True]), "bool"), (np.array([1], ">f8"), ">f8"))
    for ids, dtype in given:
        e = _raises(K.BlockIdError, _cache_apply, ids)
        shown = str(np.dtype(dtype))
        assert (e.field, e.value) == ("block_ids.dtype", shown), str(e)
        assert str(e) == f"block_ids.dtype = {shown}: must be an integer array, got dtype {shown}"
    e = _raises(K.BlockIdError, _cache_apply, [1.0, 2.0])  # a list of floats: the first float named
    assert (e.field, e.value) == ("block_ids[0]", 1.0) and str(e).endswith("must be an integer block id")


# ---- L3: an int subclass whose __index__ disagrees with its value --------------------------------------
def test_l3_a_lying_int_is_refused_on_every_path() -> None:
    from kvlayout.integrations.vllm_plugin import checked_step_ids
    from kvlayout.validate import LYING_INT_WHY, is_int

    w = WeirdInt(5)
    assert not is_int(w) and is_int(np.int64(5)) and is_int(5)
    for fn in (
        lambda ids: K.normalize_block_ids(ids, 8),
        lambda ids: checked_step_ids(ids, 8),
    ):
        e = _raises(K.BlockIdError, fn, [1, w])
        assert e.field == "block_ids[1]" and LYING_INT_WHY in str(e), str(e)
    pz = kp.PallasZeroer(K.plan(K.preset("dsv4-test").with_num_blocks(6)), kernel="triton", interpret=True)
    buf = jnp.zeros(pz.buffer_shape, jnp.int32)
    for call in (lambda: pz(buf, [w]), lambda: pz.apply(buf, [w]), lambda: _cache_apply([1, w])):
        e = _raises(K.BlockIdError, call)
        assert e.field.startswith("block_ids[") and LYING_INT_WHY in str(e), str(e)
    assert not buf.is_deleted() and not np.asarray(buf).any()


def test_l3_honest_int_subclasses_are_still_ids() -> None:
    import enum

    from kvlayout.integrations.vllm_plugin import checked_step_ids

    class Page(enum.IntEnum):
        A = 3

    assert K.normalize_block_ids([Page.A, 1], 8).tolist() == [3, 1]
    assert checked_step_ids([Page.A, 1], 8).tolist() == [3, 1]
    out, bad = _cache_apply([Page.A])
    assert int(bad) == 0 and [i for i in range(8) if float(out[0][i].sum()) == 0] == [3]


# ---- L4: a rank-2 8/16-bit leaf refused at the first call, not at construction ---------------------------
def test_l4_rank2_int8_leaf_of_odd_pages_refused_at_construction_naming_it() -> None:
    for dtype in (jnp.int8, jnp.bfloat16):
        e = _raises(K.LayoutBufferError, kp.CacheZeroer, {"k": jnp.ones((4, 16), dtype)}, "g", kernel="tpu")
        assert e.field == "leaf 'k'.shape" and "multiple of 8" in str(e), str(e)
    kp.CacheZeroer([jnp.ones((8, 16), jnp.int8)], "g", kernel="tpu")  # a multiple of 8: fine
    kp.CacheZeroer([jnp.ones((4, 16), jnp.int8)], "g", kernel="triton", interpret=True)  # no such limit
