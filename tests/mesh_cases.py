"""Sharded zeroing on an 8-device CPU mesh, Pallas TPU interpret mode (race detection on).

Not collected by the main test session: ``scripts/test.sh`` runs this file in a pytest
invocation of its own with ``XLA_FLAGS=--xla_force_host_platform_device_count=9`` (set before
JAX starts); with fewer devices it fails to collect rather than skip. The meshes
use devices 1..8: TPU interpret mode stages its callbacks on cpu:0, which must stay idle
(``ShardedPallasZeroer`` refuses a mesh with cpu:0, tested below).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.sharding import ShardedLayout, shard_spec

jax = pytest.importorskip("jax")
if jax.device_count() < 9:
    flag = "XLA_FLAGS=--xla_force_host_platform_device_count=9"
    raise RuntimeError(f"{jax.device_count()} devices: run with {flag} (scripts/test.sh does)")

import jax.numpy as jnp  # noqa: E402
import kvlayout.backends.pallas as kp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

DEVS = jax.devices()[1:9]


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


def mesh(**axes: int) -> Mesh:
    n = math.prod(axes.values())
    return Mesh(np.array(DEVS[:n]).reshape(tuple(axes.values())), tuple(axes))


def run(lay: ShardedLayout, m: Mesh, batches: Sequence[Any], **kw: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """Zero every batch on a poisoned sharded buffer; check the result against the contract.

    Checks: the input is donated, the output keeps the sharding, the gathered bytes equal the
    gathered contract, and every device's image (replicas included) equals the single-shard
    reference for the ids routed to it.
    """
    z = kp.ShardedPallasZeroer(lay, m, **kw)
    data = K.poison_pattern(lay.gathered_bytes)
    buf = z.make_buffer(data)
    seen: list[int] = []
    for ids in batches:
        old = buf
        buf = z(buf, jnp.asarray(np.array(ids, np.int32)) if isinstance(ids, tuple) else ids)
        assert old.is_deleted()  # donated: zeroed in place
        seen += list(ids)
    z.check()
    assert buf.sharding.is_equivalent_to(z.sharding, 2)
    got = z.to_host(buf)
    chk = lay.compare(data, got, seen)
    assert chk.matches, chk.describe()
    routed = lay.route(seen)
    images = z.shard_images(buf)
    assert len(images) == m.devices.size
    sb = lay.shard_bytes
    for dev, k, img in images:
        local = K.reference.compare_to_contract(data[k * sb : (k + 1) * sb], img, lay.local_table, routed[k])
        assert local.matches, (dev, k, local.describe())
    return z, data, got


# ---- block-sharded -------------------------------------------------------------------------
def test_block_sharded_1d_uneven_host_batches(compiled_steps: Callable[[object], int]) -> None:
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 8}, block_axes=("dp",))
    z, _, _ = run(lay, mesh(dp=8), [[5], [0, 15, 7, 7, 8], [3, 2, 1], list(range(0, 16, 3))])
    assert z.mode == "tpu-interpret"
    assert compiled_steps(z) == 1  # every host batch fits the 8-id bucket


def test_block_sharded_1d_device_ids_uneven() -> None:
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 8}, block_axes=("dp",))
    run(lay, mesh(dp=8), [(9,), (14, 1, 14), (0, 3, 4, 6, 10, 11, 15)])


def test_block_sharded_gathered_equals_single_device_reference() -> None:
    """Packed, 2 blocks per shard = 585 whole rows: the gathered buffer is the global layout."""
    spec = K.preset("dsv4-test").with_num_blocks(16)
    lay = shard_spec(spec, {"dp": 8}, block_axes=("dp",))
    ids = [0, 1, 6, 9, 15]
    _, data, got = run(lay, mesh(dp=8), [ids])
    glob = K.plan(spec)
    ref = data.copy()
    K.zero_blocks_numpy(ref, glob, ids)
    assert lay.gathered_bytes == glob.total_bytes and np.array_equal(got, ref)


def test_ids_owned_by_one_shard_only() -> None:
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 8}, block_axes=("dp",))
    _, data, got = run(lay, mesh(dp=8), [[10, 11, 10]])  # both on shard 5
    z = kp.ShardedPallasZeroer(lay, mesh(dp=8))
    routed = z.route_host([10, 11, 10])
    assert routed is not None and routed.sharding.is_equivalent_to(z.routed_sharding, 1)
    per_device = {s.device: np.asarray(s.data).tolist() for s in routed.addressable_shards}
    assert per_device[DEVS[5]] == [0, 1] + [-1] * 6  # host routing: only the owner gets ids
    assert all(v == [-1] * 8 for d, v in per_device.items() if d != DEVS[5])
    sb = lay.shard_bytes
    changed = [bool((got[k * sb : (k + 1) * sb] != data[k * sb : (k + 1) * sb]).any()) for k in range(8)]
    assert changed == [k == 5 for k in range(8)]


# ---- replicated layout ---------------------------------------------------------------------
def test_replicated_1d_heads_split_aligned_fast_path() -> None:
    lay = shard_spec(K.preset("llama-8b").with_num_blocks(4), {"tp": 8}, head_axes=("tp",))
    assert lay.local_spec.groups[0].layers[0].num_kv_heads == 1  # type: ignore[attr-defined]
    z, _, _ = run(lay, mesh(tp=8), [[3], [0, 2]])
    assert z.local.plan.aligned


def test_replicated_1d_unaligned_rmw() -> None:
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(4), {"tp": 8}, head_axes=("tp",))
    z, _, _ = run(lay, mesh(tp=8), [[1, 2], (3,)])
    assert not z.local.plan.aligned


# ---- 2-D meshes ------------------------------------------------------------------------------
def test_2d_block_and_heads() -> None:
    lay = shard_spec(
        K.preset("dsv4-test").with_num_blocks(8), {"dp": 2, "tp": 4}, block_axes=("dp",), head_axes=("tp",)
    )
    run(lay, mesh(dp=2, tp=4), [[0, 5, 7], (4,), [3]])


def test_2d_block_sharded_over_both_axes() -> None:
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"a": 2, "b": 4}, block_axes=("a", "b"))
    assert [lay.block_shard(k) for k in range(8)] == list(range(8))
    run(lay, mesh(a=2, b=4), [[15, 0, 6, 9], (2, 13)])


def test_2d_replicated_with_replica_axis() -> None:
    """Buffer split over tp, identical copies over r: every copy zeroed the same way."""
    lay = shard_spec(K.preset("llama-8b").with_num_blocks(4), {"r": 2, "tp": 4}, head_axes=("tp",))
    assert lay.replica_axes == ("r",) and lay.num_shards == 4
    run(lay, mesh(r=2, tp=4), [[1, 3]])


def test_2d_block_sharded_with_dsv4_mix() -> None:
    lay = shard_spec(
        K.preset("dsv4").with_num_blocks(4), {"dp": 2, "tp": 2}, block_axes=("dp",), head_axes=("tp",)
    )
    run(lay, mesh(dp=2, tp=2), [[0, 3]])


# ---- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("ids", [[0, 16], [-1], [True]])
def test_bad_host_ids_run_nothing_on_any_shard(ids: list) -> None:
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 8}, block_axes=("dp",))
    z = kp.ShardedPallasZeroer(lay, mesh(dp=8))
    data = K.poison_pattern(lay.gathered_bytes)
    buf = z.make_buffer(data)
    with pytest.raises(K.BlockIdError):
        z(buf, ids)
    assert not buf.is_deleted() and np.array_equal(z.to_host(buf), data)


def test_bad_device_ids_write_nothing_on_any_shard() -> None:
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 8}, block_axes=("dp",))
    z = kp.ShardedPallasZeroer(lay, mesh(dp=8))
    data = K.poison_pattern(lay.gathered_bytes)
    buf = z(z.make_buffer(data), jnp.array([2, 9, 16, -4, 12], jnp.int32))
    assert lay.compare(data, z.to_host(buf), [2, 9, 12]).matches  # the bad ids wrote nothing anywhere
    with pytest.raises(K.BlockIdError, match=r"2 ids outside \[0, 16\); they wrote nothing on any shard"):
        z.check()
    z.check()  # reset
    buf = z(buf, jnp.array([16, 17], jnp.int32))  # only bad ids: nothing at all
    assert lay.compare(data, z.to_host(buf), [2, 9, 12]).matches
    with pytest.raises(K.BlockIdError):
        z.check()


def test_mesh_and_buffer_errors() -> None:
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 8}, block_axes=("dp",))
    with pytest.raises(
        K.LayoutBufferError, match=r"mesh axes = \{'x': 8\}: the layout was planned for \{'dp': 8\}"
    ):
        kp.ShardedPallasZeroer(lay, Mesh(np.array(DEVS), ("x",)))
    with pytest.raises(K.BackendError, match="includes cpu:0"):
        kp.ShardedPallasZeroer(lay, Mesh(np.array(jax.devices()[:8]), ("dp",)))
    z = kp.ShardedPallasZeroer(lay, mesh(dp=8))
    with pytest.raises(K.LayoutBufferError, match="buffer sharding"):
        z(jnp.zeros(z.buffer_shape, jnp.int32), [0])  # one device, not the mesh
    with pytest.raises(K.LayoutBufferError, match=r"buffer shape = \(8, 128\)"):
        z(jnp.zeros((8, 128), jnp.int32), [0])
    with pytest.raises(K.LayoutBufferError, match="offset"):
        kp.ShardedPallasZeroer(lay, mesh(dp=8), offset=512)


def test_triton_interpret_kernel_runs_on_a_mesh_with_cpu0() -> None:
    """Plain Pallas interpret mode has no cross-device barrier: any mesh works."""
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 8}, block_axes=("dp",))
    m = Mesh(np.array(jax.devices()[:8]), ("dp",))
    z, _, _ = run(lay, m, [[1, 14, 7], (3, 3, 12, 0)], kernel="triton", interpret=True)
    assert z.mode == "triton-interpret"
    assert z.local.programs is None and z.local_routed.programs == 4 * 132  # device ids: persistent programs


def test_apply_inside_a_user_jit() -> None:
    lay = shard_spec(
        K.preset("dsv4-test").with_num_blocks(8), {"dp": 2, "tp": 4}, block_axes=("dp",), head_axes=("tp",)
    )
    z = kp.ShardedPallasZeroer(lay, mesh(dp=2, tp=4))

    @jax.jit
    def step(buf: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        buf, bad = z.apply(buf, ids)
        return buf, bad + 0

    data = K.poison_pattern(lay.gathered_bytes)
    out, bad = step(z.make_buffer(data), jnp.array([1, 6], jnp.int32))
    assert int(bad) == 0 and out.sharding.is_equivalent_to(z.sharding, 2)
    assert lay.compare(data, z.to_host(out), [1, 6]).matches


@pytest.mark.parametrize("extra", [8, -8])
def test_sharded_apply_refuses_a_buffer_of_other_rows(extra: int) -> None:
    """Hostile pass 16, H1: 8 rows more or fewer per shard shifted every shard's writes (block 5 zeroed
    4,096 B off, inside its neighbours' rows); apply in a user's jit now refuses the shape, buffer intact."""
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(6), {"x": 2}, block_axes=("x",))
    z = kp.ShardedPallasZeroer(lay, mesh(x=2), kernel="triton", interpret=True)
    rows = z.buffer_shape[0] + 2 * extra
    host = np.full((rows, 128), 0x5A5A5A5A, np.int32)
    buf = jax.device_put(jnp.asarray(host), z.sharding)
    with pytest.raises(K.LayoutBufferError) as e:
        jax.jit(z.apply, donate_argnums=0)(buf, jnp.array([5], jnp.int32))
    assert e.value.field == "buffer.shape" and str(e.value) == (
        f"buffer shape = {(rows, 128)}: must be {z.buffer_shape} (2 shards x {z.shard_rows} rows)"
    )
    assert not buf.is_deleted() and np.array_equal(np.asarray(buf), host)


def test_the_flat_zeroer_refuses_a_buffer_spread_over_cpu0_in_tpu_interpret_mode() -> None:
    """Hostile pass 39: a buffer sharded over host devices including cpu:0 hung 40 s in XLA's rendezvous,
    then aborted the process (TPU interpret mode stages its callbacks on cpu:0)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    z = kp.PallasZeroer(K.plan(K.preset("llama-8b").with_num_blocks(8)), kernel="tpu", interpret=True)
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    buf = jax.device_put(jnp.zeros(z.buffer_shape, jnp.int32), NamedSharding(mesh, P("x", None)))
    with pytest.raises(K.BackendError, match="spread over several devices including cpu:0"):
        z(buf, [1, 5])
    with pytest.raises(K.BackendError, match="including cpu:0"):
        z.apply(buf, jnp.array([1], jnp.int32))
    host = K.poison_pattern(z.buffer_shape[0] * 512).view(np.int32).reshape(z.buffer_shape)
    off = jax.device_put(jnp.asarray(host), NamedSharding(Mesh(np.array(DEVS[:4]), ("x",)), P("x", None)))
    got = np.asarray(z(off, [1, 5])).reshape(-1).view(np.uint8)  # a mesh without cpu:0: zeroed, exactly
    want = host.reshape(-1).view(np.uint8).copy()
    for a, e in K.expected_zeroed(z.table, [1, 5]).tolist():
        want[a:e] = 0
    assert np.array_equal(got, want)
