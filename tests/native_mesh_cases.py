"""CacheZeroer on an 8-device CPU mesh (2 x 4), Pallas TPU interpret mode with race detection.

Not collected by the main session: ``scripts/test.sh`` runs this file in a pytest run of its
own with ``XLA_FLAGS=--xla_force_host_platform_device_count=9`` (fewer devices: it fails); the meshes
use devices 1..8 (TPU interpret mode stages its callbacks on cpu:0, which must stay idle).

Leaves carry tpu-inference-like PartitionSpecs: the page axis over the data-parallel axis
(each shard zeroes only the ids it owns, as ``ShardedLayout.route`` says) and/or heads and
lanes over the model axis (every shard zeroes its slice of every id).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.native import zero_native_numpy
from kvlayout.sharding import shard_spec

jax = pytest.importorskip("jax")
if jax.device_count() < 9:
    flag = "XLA_FLAGS=--xla_force_host_platform_device_count=9"
    raise RuntimeError(f"{jax.device_count()} devices: run with {flag} (scripts/test.sh does)")

import jax.numpy as jnp  # noqa: E402
import kvlayout.backends.pallas as kp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

DEVS = jax.devices()[1:9]
N = 8  # global pages

#: (global shape, dtype, PartitionSpec): tpu-inference-like leaves on a (dp, tp) mesh
ATTN = ((N, 4, 4, 2, 128), "bfloat16", P("dp", None, "tp", None, None))  # pages over dp, heads over tp
ATTN_FP8 = ((N, 4, 4, 4, 128), "float8_e4m3fn", P("dp", None, "tp", None, None))
MLA = ((N, 1, 32, 640), "bfloat16", P("dp"))  # pages over dp, replicated over tp
NOPE_LANES = ((N, 4, 4, 512), "uint8", P(None, None, None, "tp"))  # page axis whole, lanes over tp
HEADS_ONLY = ((N, 2, 4, 2, 128), "bfloat16", P(None, None, "tp", None, None))  # heads over tp only
BOTH_AXES = ((N, 2, 2, 128), "float32", P(("dp", "tp")))  # pages over both axes (8 block shards)


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


def mesh(devs: Sequence[Any] = DEVS, **axes: int) -> Mesh:
    n = math.prod(axes.values())
    return Mesh(np.array(devs[:n]).reshape(tuple(axes.values())), tuple(axes))


def poisoned(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    dt = jnp.dtype(dtype)
    return K.poison_pattern(int(np.prod(shape)) * dt.itemsize, seed=seed).view(dt).reshape(shape).copy()


def run(leaves: Sequence[tuple], batches: Sequence[Any], m: Mesh, **kw: Any) -> tuple[Any, list, list]:
    """Zero every batch (lists: host ids, tuples: device ids) on poisoned sharded leaves; check
    donation, shardings kept, each device's shard against the reference's slice, and the
    gathered leaves against the NumPy reference."""
    host = [poisoned(s, d, i) for i, (s, d, _) in enumerate(leaves)]
    caches = [jax.device_put(a, NamedSharding(m, spec)) for a, (_, _, spec) in zip(host, leaves)]
    z = kp.CacheZeroer(caches, mesh=m, **kw)
    seen: list[int] = []
    for ids in batches:
        old = caches
        caches = z(caches, jnp.asarray(np.array(ids, np.int32)) if isinstance(ids, tuple) else ids)
        assert all(x.is_deleted() for x in old)  # donated: zeroed in place
        seen += [b for b in ids if 0 <= b < N]
    ref = [a.copy() for a in host]
    zero_native_numpy(ref, z.spec, seen)
    for leaf, want, (_, _, spec) in zip(caches, ref, leaves):
        assert leaf.sharding.is_equivalent_to(NamedSharding(m, spec), leaf.ndim)
        assert len(leaf.addressable_shards) == m.devices.size
        for s in leaf.addressable_shards:  # every device, replicas included
            got = np.asarray(s.data).view(np.uint8)
            assert np.array_equal(got, want[s.index].view(np.uint8)), (spec, s.device)
        assert np.array_equal(np.asarray(leaf).view(np.uint8), want.view(np.uint8)), spec
    return z, host, caches


def changed_local_pages(before: np.ndarray, leaf: Any, dp_index: int, bps: int) -> list[int]:
    """Local page ids that changed on the shard of data-parallel index ``dp_index``."""
    for s in leaf.addressable_shards:
        if (s.index[0].start or 0) == dp_index * bps:
            got = np.asarray(s.data).view(np.uint8).reshape(bps, -1)
            old = before[s.index].view(np.uint8).reshape(bps, -1)
            return np.flatnonzero((got != old).any(axis=1)).tolist()
    raise AssertionError("no shard")


# ---- page axis over dp (block-sharded routing) ------------------------------------------------------
def test_pages_over_dp_heads_over_tp_host_ids_routed_as_sharded_layout() -> None:
    ids = [0, 5, 7, 5, 3]
    z, host, caches = run([ATTN, MLA], [ids], mesh(dp=2, tp=4))
    assert z.mode == "tpu-interpret" and z.local_shapes[0] == (4, 4, 1, 2, 128)
    spec = K.preset("llama-8b").with_num_blocks(N)
    lay = shard_spec(spec, {"dp": 2, "tp": 4}, block_axes=("dp",), head_axes=("tp",))
    routed = lay.route(ids)  # shard k = dp * 4 + tp
    for dp in range(2):
        assert changed_local_pages(host[0], caches[0], dp, 4) == routed[dp * 4].tolist()
        assert changed_local_pages(host[1], caches[1], dp, 4) == routed[dp * 4 + 3].tolist()


def test_device_ids_and_bad_ids_write_nothing_anywhere() -> None:
    z, _, _ = run([ATTN_FP8, MLA], [(6, N, 1, -2, 6)], mesh(dp=2, tp=4))
    with pytest.raises(K.BlockIdError, match=r"2 ids outside \[0, 8\); they wrote nothing"):
        z.check()


def test_ids_owned_by_one_shard_only() -> None:
    _, host, caches = run([MLA], [[4, 6, 4]], mesh(dp=2, tp=4))
    assert changed_local_pages(host[0], caches[0], 0, 4) == []
    assert changed_local_pages(host[0], caches[0], 1, 4) == [0, 2]


def test_pages_over_both_axes() -> None:
    lay = shard_spec(K.preset("llama-8b").with_num_blocks(N), {"dp": 2, "tp": 4}, block_axes=("dp", "tp"))
    ids = [7, 0, 3, 3]
    _, host, caches = run([BOTH_AXES], [ids, (2,)], mesh(dp=2, tp=4))
    routed = lay.route([*ids, 2])
    for k in range(8):
        shard = next(s for s in caches[0].addressable_shards if (s.index[0].start or 0) == k)
        got = np.asarray(shard.data).view(np.uint8).reshape(1, -1)
        changed = (got != host[0][shard.index].view(np.uint8).reshape(1, -1)).any(axis=1)
        assert np.flatnonzero(changed).tolist() == routed[k].tolist()


# ---- page axis whole (replicated routing): every shard zeroes its slice ------------------------------
def test_heads_and_lanes_over_tp_every_shard_zeroes_its_slice() -> None:
    run([NOPE_LANES, HEADS_ONLY], [[1, 6], (0, 0, 7)], mesh(dp=2, tp=4))


def test_mixed_routing_in_one_cache_and_group() -> None:
    """Leaves with different page splits in one pytree; group zeroing picks a subset."""
    leaves = [ATTN, NOPE_LANES, MLA]
    host = [poisoned(s, d, i) for i, (s, d, _) in enumerate(leaves)]
    m = mesh(dp=2, tp=4)
    caches = [jax.device_put(a, NamedSharding(m, spec)) for a, (_, _, spec) in zip(host, leaves)]
    z = kp.CacheZeroer(caches, ["attn", "v4", "v4"], m)
    caches = z(caches, [2, 5], group="v4")
    assert np.array_equal(np.asarray(caches[0]).view(np.uint8), host[0].view(np.uint8))
    for k in (1, 2):
        want = host[k].copy()
        want[[2, 5]] = 0
        assert np.array_equal(np.asarray(caches[k]).view(np.uint8), want.view(np.uint8))


def test_apply_inside_a_user_jit_keeps_shardings() -> None:
    leaves = [ATTN, MLA]
    host = [poisoned(s, d, i) for i, (s, d, _) in enumerate(leaves)]
    m = mesh(dp=2, tp=4)
    caches = [jax.device_put(a, NamedSharding(m, spec)) for a, (_, _, spec) in zip(host, leaves)]
    z = kp.CacheZeroer(caches, mesh=m)
    step = jax.jit(lambda c, i: z.apply(c, i), donate_argnums=0)
    out, bad = step(caches, jnp.array([1, 4], jnp.int32))
    assert int(bad) == 0
    for leaf, a, (_, _, spec) in zip(out, host, leaves):
        assert leaf.sharding.is_equivalent_to(NamedSharding(m, spec), leaf.ndim)
        want = a.copy()
        want[[1, 4]] = 0
        assert np.array_equal(np.asarray(leaf).view(np.uint8), want.view(np.uint8))


# ---- Pallas-Triton kernel on a mesh, and errors ------------------------------------------------------
def test_triton_interpret_kernel_on_a_mesh_with_cpu0() -> None:
    """Plain Pallas interpret mode has no cross-device barrier: any mesh works."""
    f32 = [((N, 2, 4, 128), "float32", P("dp", None, "tp")), ((N, 4, 4, 32), "int32", P(None, None, "tp"))]
    m = mesh(jax.devices()[:8], dp=2, tp=4)
    z, _, _ = run(f32, [[0, 7, 3], (4, 4, N)], m, kernel="triton", interpret=True)
    assert z.mode == "triton-interpret"


def test_mesh_errors() -> None:
    m = mesh(dp=2, tp=4)
    a = jnp.zeros((N, 2, 128), jnp.float32)
    with pytest.raises(K.LayoutBufferError, match="must be a NamedSharding"):
        kp.CacheZeroer([a], mesh=m)
    with pytest.raises(K.LayoutBufferError, match="in mesh order"):
        kp.CacheZeroer([a], mesh=m, partition_specs=[P(("tp", "dp"))])
    with pytest.raises(K.LayoutBufferError, match="one PartitionSpec per leaf"):
        kp.CacheZeroer([a, a], mesh=m, partition_specs=[P()])
    with pytest.raises(K.BackendError, match="includes cpu:0"):
        kp.CacheZeroer([a], mesh=mesh(jax.devices()[:8], dp=2, tp=4), partition_specs=[P("dp")])
    z = kp.CacheZeroer([a], mesh=m, partition_specs=[P("dp")])
    with pytest.raises(K.LayoutBufferError, match="sharding"):
        z([a], [0])  # one device, not the mesh
    with pytest.raises(K.BlockIdError):
        z([jax.device_put(a, z.shardings[0])], [N])  # type: ignore[index]


def test_leaves_on_several_devices_without_a_mesh_name_them() -> None:
    """JAX's own refusal (a raw ValueError) becomes a LayoutBufferError naming the devices; nothing ran."""
    a = jax.device_put(jnp.ones((N, 256), jnp.bfloat16), DEVS[0])
    b = jax.device_put(jnp.ones((N, 256), jnp.bfloat16), DEVS[1])
    z = kp.CacheZeroer([a, b])
    with pytest.raises(K.LayoutBufferError) as e:
        z([a, b], [1])
    assert e.value.field == "caches" and "leaf '0' on" in str(e.value) and "leaf '1' on" in str(e.value)
    assert not a.is_deleted() and not b.is_deleted()
    assert float(a.astype(jnp.float32).sum()) == float(b.astype(jnp.float32).sum()) == N * 256
