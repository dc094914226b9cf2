"""The Pallas zeroer's masked and device-check paths under mutation (scripts/mutation.sh pallas-zeroer):
``masked_ids``' refusals and mask rule, ``check_ids_devices`` / ``device_order`` (ids committed to other
devices, seen here through a ``jax.Array`` stand-in whose sharding is a NamedSharding over stand-in
devices, so one CPU device is enough; the 9-device subprocess of tests/test_hostile_s17_zeroers.py is
invisible to mutmut), the eager entries that call them, a JAX bool or a wide JAX id in a list, and
``apply_masked`` with one id or none on each kernel (poisoned buffer against the NumPy reference)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import short

jax = pytest.importorskip("jax")
Z = pytest.importorskip("kvlayout.backends.pallas.zeroer")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import SingleDeviceSharding  # noqa: E402

from tests.pallas_stand_ins import (  # noqa: E402
    D1,
    D2,
    D3,
    D4,
    KERNELS,
    NUM_BLOCKS,
    TAIL,
    Placed,
    on_device,
    poisoned,
    reset_interpreter,  # noqa: E402, F401 (the autouse fixture)
    same,
)
from tests.pallas_stand_ins import dsv4_table as _table  # noqa: E402
from tests.pallas_stand_ins import raises as _err  # noqa: E402


def elsewhere(field: str, shown: str, where: str, want: str) -> str:
    """The refusal of ids committed to ``shown``, not to the devices ``want`` of ``where``."""
    return f"{field} = <{shown}>: are committed to {shown}, not the devices of {where} ({want}){TAIL}"


# ---- device_order / check_ids_devices ------------------------------------------------------------
def test_device_order_of_each_sharding_kind() -> None:
    cpu = jax.devices()[0]
    assert Z.device_order(SingleDeviceSharding(cpu)) == (cpu,)
    assert Z.device_order(Placed((D2, D1)).sharding) == (D2, D1)
    assert Z.device_order(object()) is None


def test_ids_on_other_devices_are_refused_by_name() -> None:
    e = _err(K.BlockIdError, Z.check_ids_devices, Placed((D1, D2)), (D3,), "the pool")
    shown = "dev:1, dev:2"
    assert str(e) == elsewhere("block_ids", shown, "the pool", "dev:3")
    assert e.field == "block_ids" and e.value == shown
    e = _err(K.BlockIdError, Z.check_ids_devices, Placed((D1, D2)), (D3, D4), "the pool")
    assert str(e) == elsewhere("block_ids", shown, "the pool", "dev:3, dev:4")
    e = _err(K.BlockIdError, Z.check_ids_devices, Placed((D1, D2)), (D2, D1), "the mesh", "valid")
    order = f"are committed to the devices of the mesh in another order ({shown})"
    assert str(e) == f"valid = <{shown}>: {order}{TAIL}"
    assert e.field == "valid" and e.value == shown
    cpu = jax.devices()[0]
    real = jax.device_put(jnp.arange(3, dtype=jnp.int32), cpu)  # committed to the one real device
    e = _err(K.BlockIdError, Z.check_ids_devices, real, (D1,), "x")
    assert str(e) == elsewhere("block_ids", str(cpu), "x", "dev:1")


def test_ids_left_to_jax_are_not_refused() -> None:
    cpu = jax.devices()[0]
    assert Z.check_ids_devices(Placed((D1, D2)), (D1, D2), "the mesh") is None  # the same devices, in order
    assert Z.check_ids_devices(Placed((D1, D2)), None, "the mesh") is None  # no devices wanted
    assert Z.check_ids_devices(Placed((D1,), committed=False), (D3,), "the mesh") is None  # JAX moves them
    assert Z.check_ids_devices(np.array([1, 2]), (D3,), "the mesh") is None  # host ids
    assert Z.check_ids_devices(jax.device_put(jnp.arange(2), cpu), (cpu,), "x") is None
    seen = []

    def traced(x: Any) -> Any:
        seen.append(Z.check_ids_devices(x, (D3,), "the mesh"))  # a tracer: left to JAX
        return x + 1

    assert np.array_equal(np.asarray(jax.jit(traced)(jnp.arange(2))), [1, 2]) and seen == [None]


def test_the_zeroers_static_check_names_the_buffer() -> None:
    cpu = jax.devices()[0]
    buf = jax.device_put(jnp.zeros((4, 128), jnp.int32), cpu)
    e = _err(K.BlockIdError, Z.PallasZeroer._check_ids_devices, buf, Placed((D1, D2)))
    assert str(e) == elsewhere("block_ids", "dev:1, dev:2", "the buffer", str(cpu))
    assert e.field == "block_ids"
    loose = jnp.zeros((4, 128), jnp.int32)  # an uncommitted buffer: left to JAX
    assert Z.PallasZeroer._check_ids_devices(loose, Placed((D1,))) is None


@pytest.mark.parametrize("path", ["__call__", "apply", "ids", "valid"])
def test_each_eager_entry_refuses_ids_committed_elsewhere(path: str) -> None:
    t = _table()
    z = Z.PallasZeroer(t, kernel="triton", interpret=True)
    host = poisoned(z)
    cpu = jax.devices()[0]
    buf = jax.device_put(on_device(host, z), cpu)
    away = Placed((D1, D2))
    if path == "__call__":
        e = _err(K.BlockIdError, z, buf, away)
    elif path == "apply":
        e = _err(K.BlockIdError, z.apply, buf, away)
    elif path == "ids":
        e = _err(K.BlockIdError, z.apply_masked, buf, away, jax.device_put(jnp.ones(2, bool), cpu))
    else:
        ids = jax.device_put(jnp.array([1, 2], jnp.int32), cpu)
        e = _err(K.BlockIdError, z.apply_masked, buf, ids, Placed((D1, D2), dtype=jnp.bool_))
    field = {"__call__": "block_ids", "apply": "block_ids"}.get(path, path)
    assert str(e) == elsewhere(field, "dev:1, dev:2", "the buffer", str(cpu))
    assert e.field == field
    assert not buf.is_deleted() and same(buf, host, t, [])


# ---- masked_ids ---------------------------------------------------------------------------------------
def test_masked_ids_refuses_what_is_no_array_naming_which() -> None:
    e = _err(K.BlockIdError, Z.masked_ids, [1], jnp.array([True]), NUM_BLOCKS)
    assert str(e) == "ids = 'list': must be a jax.Array" and e.field == "ids" and e.value == "list"
    e = _err(K.BlockIdError, Z.masked_ids, jnp.array([1]), (True,), NUM_BLOCKS)
    assert str(e) == "valid = 'tuple': must be a jax.Array" and e.field == "valid" and e.value == "tuple"


def test_masked_ids_refuses_ids_masks_and_shapes_by_name() -> None:
    ids = jnp.array([1, 2], jnp.int32)
    e = _err(K.BlockIdError, Z.masked_ids, jnp.array([1.0, 2.0], jnp.float32), jnp.ones(2, bool), NUM_BLOCKS)
    assert str(e) == "ids: must be a 1-D integer array, got float32(2,)" and e.field == "ids"
    e = _err(K.BlockIdError, Z.masked_ids, np.array([1], "m8[s]"), np.ones(1, bool), NUM_BLOCKS)
    assert e.field == "ids" and "timedelta64" in str(e)
    e = _err(K.BlockIdError, Z.masked_ids, ids, jnp.array([1.0, 0.0], jnp.float32), NUM_BLOCKS)
    assert str(e) == "valid = float32(2,): must be a bool array"
    assert e.field == "valid" and e.value == "float32(2,)"
    e = _err(K.BlockIdError, Z.masked_ids, ids, jnp.array([True]), NUM_BLOCKS)
    assert str(e) == "valid.shape = (1,): must have the shape of ids (2,) (a mask is never broadcast)"
    assert e.field == "valid.shape" and e.value == (1,)


def test_masked_ids_writes_valid_slots_in_range() -> None:
    ids = np.array([1, 7, -1, 3, 4, 5, 2], np.int64)
    for valid, want in (
        (np.array([1, 1, 1, 0, 1, 1, 1], bool), [1, 0, 0, 0, 1, 1, 1]),
        (np.array([2, 1, 1, 0, -1, 1, 0], np.int32), [1, 0, 0, 0, 1, 1, 0]),  # nonzero = valid, 1 and 2 alike
        (np.array([0, 3, 0, 1, 255, 0, 1], np.uint8), [0, 0, 0, 1, 1, 0, 1]),
    ):
        ids32, ok = Z.masked_ids(ids, valid, NUM_BLOCKS)
        assert ids32.dtype == jnp.int32 and np.array_equal(np.asarray(ids32), [1, 0, 0, 3, 4, 5, 2])
        assert ok.dtype == jnp.bool_ and np.asarray(ok).astype(int).tolist() == want, valid


# ---- _list_ids, _integer_dtype, _fit32_jax -----------------------------------------------------------
def test_a_jax_bool_in_a_list_is_named_with_its_value() -> None:
    v = jnp.array(True)
    e = _err(K.BlockIdError, Z.step_ids, [1, v])
    assert str(e) == f"block_ids[1] = {short(v)}: must be an integer block id, not a bool"
    assert e.field == "block_ids[1]" and e.value is v


def test_jax_ids_outside_int32_in_a_list_become_minus_one() -> None:
    got = Z.step_ids([jnp.uint32(2**31), 2, jnp.int8(-3), jnp.uint32(7)])  # 2**31: no valid id
    assert got.dtype == jnp.int32 and got.tolist() == [-1, 2, -1, 7]  # negative: bad either way
    assert int(Z._fit32_jax(jnp.uint32(2**32 - 1))) == -1 and int(Z._fit32_jax(jnp.uint16(9))) == 9


def test_integer_dtypes_of_ids() -> None:
    for dtype in ("int8", "uint16", "int32", "uint64", jnp.int4, jnp.uint4):
        assert Z._integer_dtype(jnp.dtype(dtype)) is True, dtype
    for dtype in ("m8[s]", "M8[s]", "bool", "float32", "complex64"):
        assert Z._integer_dtype(np.dtype(dtype)) is False, dtype
    e = _err(K.BlockIdError, Z.check_id_array, np.array([1, 2], "m8[s]"))
    assert e.field == "block_ids" and "timedelta64" in str(e)


# ---- apply_masked: one id, no id ----------------------------------------------------------------------
@pytest.mark.parametrize(("kernel", "kw"), KERNELS)
def test_apply_masked_with_one_id_or_none(kernel: str, kw: dict[str, Any]) -> None:
    t = _table()
    z = Z.PallasZeroer(t, kernel=kernel, interpret=True, **kw)
    host = poisoned(z)
    out = z.apply_masked(on_device(host, z), jnp.array([4], jnp.int32), jnp.array([True]))
    assert same(out, host, t, [4])
    out = z.apply_masked(on_device(host, z), jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool))
    assert same(out, host, t, [])
