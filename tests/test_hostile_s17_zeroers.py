"""Hostile pass 17 (/tmp/h17), the Pallas zeroers: one regression test per finding, each failing on the
code before its fix. Buffers are poisoned (no zero bytes) and compared with the NumPy reference byte
for byte. The cases that need ids or buffers on other devices run in a 9-device subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.sharding import shard_spec

jax = pytest.importorskip("jax")
kp = pytest.importorskip("kvlayout.backends.pallas")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from tests.oracles import LyingInt  # noqa: E402
from tests.pallas_stand_ins import (  # noqa: E402
    KERNELS,
    NUM_BLOCKS,
    on_device,
    poisoned,
    reset_interpreter,  # noqa: E402, F401 (the autouse fixture)
    same,
)
from tests.pallas_stand_ins import dsv4_table as _table  # noqa: E402
from tests.pallas_stand_ins import raises as _raises  # noqa: E402


@pytest.fixture
def x64() -> Iterator[None]:
    """x64 on for the whole process: the TPU interpreter's callbacks run in other threads, where the
    thread-local ``jax.enable_x64`` context would not hold."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


# ---- F1: apply_masked / zero_local took ids without apply's rule ----------------------------------
@pytest.mark.parametrize(("kernel", "kw"), KERNELS)
def test_f1_apply_masked_counts_wide_ids_bad_before_narrowing(
    kernel: str, kw: dict[str, Any], x64: None
) -> None:
    """int64 2**32+3 wrapped to block 3 on the GPU direct path; the sorted paths raised JAX's TypeError."""
    t = _table()
    z = kp.PallasZeroer(t, kernel=kernel, interpret=True, **kw)
    host = poisoned(z)
    cases = (
        (jnp.array([2**32 + 3, 2, -(2**32) + 5, 2**31, -(2**63)], jnp.int64), [2]),
        (jnp.array([2**64 - 13, 2**32 + 1, 1], jnp.uint64), [1]),
        (jnp.array([2**32 - 1, 4], jnp.uint32), [4]),
        (jnp.array([-1, 5, 127], jnp.int8), [5]),
    )
    for ids, expect in cases:
        valid = jnp.ones(ids.shape, jnp.bool_)
        out = z.apply_masked(on_device(host, z), ids, valid)
        assert same(out, host, t, expect), (ids.dtype, ids.tolist())
        out = jax.jit(z.apply_masked)(on_device(host, z), ids, valid)
        assert same(out, host, t, expect), (ids.dtype, ids.tolist())


@pytest.mark.parametrize(("kernel", "kw"), KERNELS)
def test_f1_apply_masked_refuses_non_integer_ids_and_a_mask_of_other_shape(
    kernel: str, kw: dict[str, Any], x64: None
) -> None:
    """Float ids zeroed page 3 (direct) or raised TypeError (sorted); a short mask was broadcast."""
    t = _table()
    z = kp.PallasZeroer(t, kernel=kernel, interpret=True, **kw)
    host = poisoned(z)
    buf = on_device(host, z)
    for ids in (jnp.array([3.0]), jnp.array([True]), jnp.array([3 + 0j]), jnp.array([3.0], jnp.float32)):
        e = _raises(K.BlockIdError, z.apply_masked, buf, ids, jnp.array([True]))
        assert e.field == "ids" and str(ids.dtype) in str(e)
        e = _raises(K.BlockIdError, jax.jit(z.apply_masked), buf, ids, jnp.array([True]))
        assert e.field == "ids"
    ids = jnp.array([3, 5], jnp.int32)
    for valid in (jnp.array([True]), jnp.array([True, True, False]), jnp.ones((2, 2), jnp.bool_)):
        e = _raises(K.BlockIdError, z.apply_masked, buf, ids, valid)
        assert e.field == "valid.shape" and str(tuple(valid.shape)) in str(e)
    e = _raises(K.BlockIdError, z.apply_masked, buf, ids, jnp.array([1.0, 0.0]))
    assert e.field == "valid"
    assert not buf.is_deleted() and same(buf, host, t, [])
    # valid input as before: an integer mask (nonzero = valid), a bool mask
    assert same(z.apply_masked(buf, ids, jnp.array([2, 0], jnp.int32)), host, t, [3])
    assert same(z.apply_masked(buf, ids, jnp.array([True, True])), host, t, [3, 5])


N_PAGES = 8
SHAPE = (N_PAGES, 4, 2, 2, 128)


def _leaf_host() -> np.ndarray:
    return K.poison_pattern(int(np.prod(SHAPE)) * 2, seed=1).copy().view(jnp.bfloat16).reshape(SHAPE)


def _pages(out: Any, host: np.ndarray) -> list[int]:
    got = np.asarray(out).view(np.uint8).reshape(out.shape[0], -1)
    before = host.view(np.uint8).reshape(host.shape[0], -1)
    changed = [p for p in range(got.shape[0]) if not np.array_equal(got[p], before[p])]
    assert all((got[p] == 0).all() for p in changed)  # a page written is all zero
    return changed


@pytest.mark.parametrize("kernel", ["triton", "tpu"])
def test_f1_zero_local_takes_ids_as_apply_does(kernel: str, x64: None) -> None:
    """int64 2**32+3 marked valid zeroed page 3 and float 5.0 zeroed page 5 (both kernels)."""
    host = _leaf_host()
    z = kp.CacheZeroer({"layers.0.kv": jnp.asarray(host)}, kernel=kernel, interpret=True)
    for ids, expect in (
        (jnp.array([2**32 + 3], jnp.int64), []),
        (jnp.array([-(2**32) + 5, 2, 2**31], jnp.int64), [2]),
        (jnp.array([2**64 - 1, 6], jnp.uint64), [6]),
        (jnp.array([2**32 - 1, 8, 1], jnp.uint32), [1]),
    ):
        out = z.zero_local([jnp.asarray(host)], (0,), ids, jnp.ones(ids.shape, jnp.bool_))[0]
        assert _pages(out, host) == expect, ids.tolist()
    leaf = jnp.asarray(host)
    for ids in (jnp.array([5.0]), jnp.array([True])):
        e = _raises(K.BlockIdError, z.zero_local, [leaf], (0,), ids, jnp.array([True]))
        assert e.field == "ids"
    e = _raises(K.BlockIdError, z.zero_local, [leaf], (0,), jnp.array([1, 2]), jnp.array([True]))
    assert e.field == "valid.shape"
    assert _pages(leaf, host) == []


@pytest.mark.parametrize("kernel", ["triton", "tpu"])
def test_f1_zero_local_checks_its_leaves(kernel: str) -> None:
    """A 2-page leaf (the zeroer was built for 8) with id 7 ran (clamped, or an out-of-bounds write)."""
    host = _leaf_host()
    z = kp.CacheZeroer({"layers.0.kv": jnp.asarray(host)}, kernel=kernel, interpret=True)
    ids, valid = jnp.array([7], jnp.int32), jnp.array([True])
    small = jnp.asarray(host[:2])
    e = _raises(K.LayoutBufferError, z.zero_local, [small], (0,), ids, valid)
    assert e.field == "leaf 'layers.0.kv'" and "bfloat16(2, 4, 2, 2, 128)" in str(e)
    e = _raises(K.LayoutBufferError, z.zero_local, [jnp.zeros(SHAPE, jnp.float32)], (0,), ids, valid)
    assert e.field == "leaf 'layers.0.kv'" and "float32" in str(e)
    for sel in ((), (1,), (0, 0), (-1,)):
        e = _raises(K.LayoutBufferError, z.zero_local, [small], sel, ids, valid)
        assert e.field == "sel"
    e = _raises(K.LayoutBufferError, z.zero_local, [], (0,), ids, valid)
    assert e.field == "leaves"
    leaf = jnp.asarray(host)
    assert _pages(z.zero_local([leaf], (0,), ids, valid)[0], host) == [7]


# ---- F4: an int subclass whose comparisons lie ------------------------------------------------------
def test_f4_lying_comparisons_are_not_asked() -> None:
    """_list_ids compared the subclass itself: 2**40+3 passed as in int32 and NumPy raised OverflowError.
    Since pass 32 an int subclass redefining int's comparisons is no integer at all: every zeroer refuses
    the list by name, writing nothing (a lying id_lo or offset had placed writes elsewhere)."""
    t = _table()
    z = kp.PallasZeroer(t, kernel="triton", interpret=True)
    host = poisoned(z)
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(NUM_BLOCKS), {"x": 1}, block_axes=("x",))
    zs = kp.ShardedPallasZeroer(lay, Mesh(np.array(jax.devices()[:1]), ("x",)), kernel="triton",
                                interpret=True)
    leaf = _leaf_host()
    zc = kp.CacheZeroer({"layers.0.kv": jnp.asarray(leaf)}, kernel="triton", interpret=True)
    why = "an int subclass that redefines int's operators or reads differently is no integer"
    for ids in ([LyingInt(2**40 + 3)], [5, LyingInt(4)], [jnp.int32(1), LyingInt(4)]):
        calls = (
            lambda ids=ids: z.apply(on_device(host, z), ids),
            lambda ids=ids: jax.jit(lambda b: z.apply(b, ids))(on_device(host, z)),
            lambda ids=ids: zs.apply(zs.make_buffer(K.poison_pattern(lay.gathered_bytes)), ids),
            lambda ids=ids: zc.apply({"layers.0.kv": jnp.asarray(leaf)}, ids),
        )
        for call in calls:
            with pytest.raises(K.BlockIdError, match=why):
                call()
    out, bad = z.apply(on_device(host, z), [4])  # the plain int: zeroed
    assert same(out, host, t, [4]) and int(bad) == 0


# ---- F9: a Python int that does not fit the dtype of a JAX value beside it --------------------------
def test_f9_mixed_lists_narrow_each_element_on_its_own() -> None:
    """JAX promoted [int8 3, 300] to int8 (an OverflowError) and [uint4 0, 19] to uint4, silently: 19 became
    block 3 (eighteenth pass, H1). Each element is now an int32 id on its own, JAX values checked in their
    own dtype: ids that do not fit are bad ids, counted, never written."""
    t = _table()
    for kernel, kw in KERNELS:
        z = kp.PallasZeroer(t, kernel=kernel, interpret=True, **kw)
        host = poisoned(z)
        for ids, expect in (
            ([jnp.int8(3), 300], [3]),  # 300 is outside the pool: one bad id
            ([jnp.uint8(3), -1], [3]),
            ([jnp.array(0, jnp.uint4), 19], [0]),  # 19 wrapped to block 3 under uint4
            ([jnp.array(0, jnp.int4), 18], [0]),
            ([jnp.array(1, jnp.uint4), 5], [1, 5]),
            ([jnp.uint32(2**31), 2], [2]),  # outside int32 in its own dtype: bad
        ):
            out, bad = z.apply(on_device(host, z), ids)
            assert same(out, host, t, expect) and int(bad) == len(ids) - len(expect), (kernel, ids)
    z = kp.PallasZeroer(t, kernel="triton", interpret=True)
    host = poisoned(z)
    buf = on_device(host, z)
    e = _raises(K.BlockIdError, z.apply, buf, [jnp.arange(2), 1])  # as before (test_mutants_pallas_zeroer_s9)
    assert e.field == "block_ids" and "must be a 1-D integer array of block ids" in str(e)
    assert not buf.is_deleted() and same(buf, host, t, [])


def test_h18_cache_zeroer_mixed_list_and_masked_edges() -> None:
    """CacheZeroer.apply([uint4 0, 21]) zeroed page 5; timedelta64 ids passed the integer check and raised
    JAX's ValueError; empty ids on the triton kernel raised JAX's TypeError; a torch dtype leaf raised
    TypeError (eighteenth pass)."""
    for kernel in ("triton", "tpu"):
        host = _leaf_host()
        z = kp.CacheZeroer([jnp.asarray(host)], kernel=kernel, interpret=True)
        out, bad = z.apply([jnp.asarray(host)], [jnp.array(0, jnp.uint4), 21])
        assert _pages(out[0], host) == [0] and int(bad) == 1
        leaf = jnp.asarray(host)
        none = z.zero_local([leaf], (0,), jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool))
        assert _pages(none[0], host) == []
        e = _raises(K.BlockIdError, z.zero_local, [leaf], (0,), np.array([1], "m8[s]"), np.ones(1, bool))
        assert e.field == "ids"
        alien = SimpleNamespace(shape=leaf.shape, dtype="torch.bfloat16")  # a dtype JAX cannot read
        e = _raises(K.LayoutBufferError, z.zero_local, [alien], (0,), jnp.array([1]), jnp.ones(1, bool))
        assert "torch.bfloat16" in str(e)
    t = _table()
    for kernel, kw in KERNELS:
        z = kp.PallasZeroer(t, kernel=kernel, interpret=True, **kw)
        host = poisoned(z)
        out = z.apply_masked(on_device(host, z), jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool))
        assert same(out, host, t, [])
        buf = on_device(host, z)
        e = _raises(K.BlockIdError, z.apply_masked, buf, np.array([1], "m8[s]"), np.ones(1, bool))
        assert e.field == "ids"


# ---- F8: ids or a buffer on other devices (9 host devices, in a subprocess) -------------------------
F8_SCRIPT = r"""
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import kvlayout as K
import kvlayout.backends.pallas as kp
from kvlayout.sharding import shard_spec

def refused(cls, fn, field, *words):
    try:
        fn()
    except cls as e:
        assert e.field == field, (e.field, str(e))
        assert all(w in str(e) for w in words), str(e)
        return
    raise AssertionError("not refused")

DEVS = jax.devices()
lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 2}, block_axes=("dp",))
mesh = Mesh(np.array(DEVS[1:3]), ("dp",))
z = kp.ShardedPallasZeroer(lay, mesh, kernel="triton", interpret=True)
data = K.poison_pattern(lay.gathered_bytes)
rev_ids = NamedSharding(Mesh(np.array(DEVS[2:0:-1]), ("dp",)), P())
for where in (DEVS[0], DEVS[1], rev_ids):  # outside the mesh, one of its devices, its devices reversed
    ids = jax.device_put(jnp.array([3, 9], jnp.int32), where)
    buf = z.make_buffer(data)
    refused(K.BlockIdError, lambda: z(buf, ids), "block_ids", "committed")
    refused(K.BlockIdError, lambda: z.apply(buf, ids), "block_ids", "committed")
    assert not buf.is_deleted() and lay.compare(data, z.to_host(buf), []).matches
# uncommitted device ids and ids on the mesh: as before
out = z(z.make_buffer(data), jnp.array([3, 9], jnp.int32))
assert lay.compare(data, z.to_host(out), [3, 9]).matches
out = z(z.make_buffer(data), jax.device_put(jnp.array([4], jnp.int32), z.ids_sharding))
assert lay.compare(data, z.to_host(out), [4]).matches
# a buffer on the mesh's devices in reversed order
rev = NamedSharding(Mesh(np.array(DEVS[2:0:-1]), ("dp",)), P("dp", None))
host = data.view(np.int32).reshape(z.buffer_shape)
calls = (lambda b: z(b, [1]), lambda b: z(b, jnp.array([1], jnp.int32)), lambda b: z.apply(b, jnp.array([1])))
for call in calls:
    buf = jax.device_put(jnp.asarray(host), rev)
    words = ("another order", "[2, 1]", "[1, 2]")
    refused(K.LayoutBufferError, lambda: call(buf), "buffer.sharding", *words)
    assert not buf.is_deleted() and np.array_equal(np.asarray(buf), host)

t = K.plan(K.preset("dsv4-test").with_num_blocks(16))
for kernel in ("triton", "tpu"):
    single = kp.PallasZeroer(t, kernel=kernel, interpret=True)
    raw = K.poison_pattern(single.buffer_shape[0] * 512)
    ids = jax.device_put(jnp.array([3, 9], jnp.int32), DEVS[0])
    buf = jax.device_put(jnp.asarray(raw.view(np.int32).reshape(single.buffer_shape)), DEVS[1])
    refused(K.BlockIdError, lambda: single(buf, ids), "block_ids", "committed", "cpu:0")
    refused(K.BlockIdError, lambda: single.apply(buf, ids), "block_ids", "committed", "cpu:0")
    assert not buf.is_deleted() and np.array_equal(np.asarray(buf).reshape(-1).view(np.uint8), raw)
    # apply_masked, eager: ids or mask elsewhere were JAX's raw ValueError (eighteenth pass, M5)
    on0 = jax.device_put(jnp.ones(2, bool), DEVS[0])
    on1 = jax.device_put(jnp.ones(2, bool), DEVS[1])
    refused(K.BlockIdError, lambda: single.apply_masked(buf, ids, on1), "ids", "committed", "cpu:0")
    ids1 = jax.device_put(jnp.array([3, 9], jnp.int32), DEVS[1])
    refused(K.BlockIdError, lambda: single.apply_masked(buf, ids1, on0), "valid", "committed", "cpu:0")
    out = single(buf, jax.device_put(jnp.array([3], jnp.int32), DEVS[1]))  # ids beside the buffer
    ref = raw.copy(); K.zero_blocks_numpy(ref, t, [3])
    assert np.array_equal(np.asarray(out).reshape(-1).view(np.uint8), ref)

leaf = jax.device_put(jnp.zeros((8, 4, 128), jnp.float32), DEVS[1])
zc = kp.CacheZeroer([leaf], kernel="triton", interpret=True)
refused(K.BlockIdError, lambda: zc([leaf], jax.device_put(jnp.array([3], jnp.int32), DEVS[0])),
        "block_ids", "committed")
assert not leaf.is_deleted()
# CacheZeroer.apply, eager, with and without a mesh (eighteenth pass, M5)
refused(K.BlockIdError, lambda: zc.apply([leaf], jax.device_put(jnp.array([3], jnp.int32), DEVS[0])),
        "block_ids", "committed")
m = Mesh(np.array(DEVS[1:3]), ("dp",))
mk = lambda: [jax.device_put(np.ones((8, 2, 128), np.float32), NamedSharding(m, P("dp")))]
zm = kp.CacheZeroer(mk(), mesh=m, kernel="triton", interpret=True)
refused(K.BlockIdError, lambda: zm.apply(mk(), jax.device_put(jnp.array([1, 2], jnp.int32), DEVS[0])),
        "block_ids", "committed")
print("F8 OK")
"""


def test_f8_ids_and_buffers_on_other_devices_are_refused_by_name() -> None:
    """Raw ValueError ("incompatible devices") from __call__ / apply; the reversed-mesh buffer's message
    printed identical given and required shardings."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=9", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(F8_SCRIPT)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "F8 OK" in proc.stdout, proc.stderr[-3000:]
