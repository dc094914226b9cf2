"""The Pallas zeroer's session-16 host rules: ``step_ids`` takes what ``__call__`` takes (a list or tuple
of integers, JAX values beside them, an integer NumPy array, a jax.Array) and refuses anything else by
name; a donated buffer is named; ``apply_masked`` checks the buffer as ``apply`` does; ``coalesce`` must
be a bool; a NumPy offset is an offset. Tiny tables, interpret mode."""

from __future__ import annotations

import array
from collections.abc import Iterator

import numpy as np
import pytest

import kvlayout as K
from kvlayout.validate import LYING_INT_WHY

jax = pytest.importorskip("jax")
Z = pytest.importorskip("kvlayout.backends.pallas.zeroer")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

IDS_WHY = "must be a list, tuple or integer NumPy array of block ids, or a jax.Array (nothing was written)"
LO, HI = -(2**31), 2**31 - 1


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


def tiny(num_blocks: int = 6) -> K.SegmentTable:
    layer = K.FullAttentionSpec(name="a", block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")
    return K.plan(K.KVCacheSpec(num_blocks, "BLHNC", (K.GroupSpec("g", (layer,)),)))


def _err(cls: type[Exception], fn: object, *args: object, **kw: object) -> Exception:
    with pytest.raises(cls) as e:
        fn(*args, **kw)  # type: ignore[operator]
    return e.value


class IndexLies(int):
    def __index__(self) -> int:
        return int.__int__(self) + 1


def test_the_ids_text_is_the_contract() -> None:
    assert Z.IDS_WHY == IDS_WHY


@pytest.mark.parametrize("bad", [range(3), array.array("q", [1, 2]), b"\x01\x02", bytearray(b"\x01"), {1: 2},
                                 {1, 2}, 3, 2.0, None, "12"])
def test_other_containers_and_scalars_are_refused_naming_their_type(bad: object) -> None:
    e = _err(K.BlockIdError, Z.step_ids, bad)
    assert str(e) == f"block_ids = {K.errors.short(bad)}: {IDS_WHY}; got a {type(bad).__name__}"
    assert e.field == "block_ids" and e.value is bad  # type: ignore[attr-defined]


@pytest.mark.parametrize("dtype", ["float32", "float64", "bool", "complex64", "m8[s]", "U1", "O"])
def test_arrays_of_a_dtype_that_is_no_integer_are_refused_by_dtype(dtype: str) -> None:
    arr = np.zeros(2, dtype=dtype)
    e = _err(K.BlockIdError, Z.step_ids, arr)
    assert str(e) == f"block_ids.dtype = {arr.dtype}: must be an integer array, got dtype {arr.dtype}"
    assert e.field == "block_ids.dtype" and e.value == str(arr.dtype)  # type: ignore[attr-defined]
    scalar = np.float64(1.0)  # a NumPy scalar is an array of its dtype: the same rule
    e = _err(K.BlockIdError, Z.step_ids, scalar)
    assert e.field == "block_ids.dtype"  # type: ignore[attr-defined]


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32"])
def test_narrow_integer_arrays_pass_unchanged(dtype: str) -> None:
    out = Z.step_ids(np.array([0, 5, 7], dtype))
    assert isinstance(out, jax.Array) and out.tolist() == [0, 5, 7]


def test_wide_arrays_outside_int32_become_minus_one() -> None:
    out = Z.step_ids(np.array([LO - 1, LO, 3, HI, HI + 1], np.int64))
    assert out.dtype == jnp.int32 and out.tolist() == [-1, LO, 3, HI, -1]
    out = Z.step_ids(np.array([3, HI, HI + 1, 2**64 - 1], np.uint64))
    assert out.dtype == jnp.int32 and out.tolist() == [3, HI, -1, -1]
    out = Z.step_ids(np.array([4, HI], np.uint32))
    assert out.tolist() == [4, HI]
    masked = np.ma.masked_array(np.array([1, 2], np.int64), mask=[True, False])  # read as its data
    assert Z.step_ids(masked).tolist() == [1, 2]


def test_lists_of_host_ints() -> None:
    empty = Z.step_ids([])
    assert empty.shape == (0,) and empty.dtype == jnp.int32
    assert Z.step_ids(()).shape == (0,)
    out = Z.step_ids([0, np.int64(HI + 1), LO - 1, np.uint8(3), HI, LO])
    assert out.dtype == jnp.int32 and out.tolist() == [0, -1, -1, 3, HI, LO]
    assert Z.step_ids((2, 1)).tolist() == [2, 1]


@pytest.mark.parametrize(
    "bad, why",
    [(True, "must be an integer block id, not a bool"),
     (np.bool_(False), "must be an integer block id, not a bool"),
     (IndexLies(1), f"must be an integer block id: {LYING_INT_WHY}"), (1.5, "must be an integer block id"),
     (np.array(1), "must be an integer block id"), ("1", "must be an integer block id"),
     (None, "must be an integer block id")],
)
def test_a_list_element_that_is_no_integer_is_named_by_index(bad: object, why: str) -> None:
    for ids in ([1, bad], [jnp.asarray(1, jnp.int32), bad]):  # host ints, or JAX values beside it
        e = _err(K.BlockIdError, Z.step_ids, ids)
        assert str(e) == f"block_ids[1] = {K.errors.short(bad)}: {why}"
        assert e.field == "block_ids[1]" and e.value is bad  # type: ignore[attr-defined]


def test_jax_values_beside_host_ints() -> None:
    one = jnp.asarray(1, jnp.int32)
    assert Z.step_ids([one, 2, np.int64(HI + 1), LO - 1, np.int32(4)]).tolist() == [1, 2, -1, -1, 4]
    assert Z.step_ids([3, jnp.asarray(5)]).tolist() == [3, 5]
    flag = jnp.asarray(True)
    e = _err(K.BlockIdError, Z.step_ids, [1, flag])
    assert e.field == "block_ids[1]" and str(e).endswith(": must be an integer block id, not a bool")
    ragged = [jnp.asarray([1, 2], jnp.int32), 3]
    e = _err(K.BlockIdError, Z.step_ids, ragged)
    assert str(e).endswith(": must be a 1-D integer array of block ids (nothing was written)")
    assert e.field == "block_ids" and e.value is ragged  # type: ignore[attr-defined]
    dev = jnp.asarray([1, 2], jnp.int32)
    assert Z.step_ids(dev) is dev


def test_a_donated_buffer_is_named_before_anything_runs() -> None:
    t = tiny()
    z = Z.PallasZeroer(t, kernel="triton", interpret=True)
    buf = jnp.zeros(z.buffer_shape, jnp.int32)
    out = z(buf, [1])
    assert buf.is_deleted()
    e = _err(K.LayoutBufferError, z, buf, [1])
    assert str(e) == (
        "buffer = 'deleted': was donated to an earlier call (or deleted): pass the buffer that call returned"
    )
    assert e.field == "buffer" and e.value == "deleted"  # type: ignore[attr-defined]
    out = z(out, [2])  # the returned buffer is the live one
    assert not out.is_deleted()
    Z.check_not_donated(out)
    traced = jax.jit(lambda b: (Z.check_not_donated(b), b)[1])(out)  # a tracer is never "deleted"
    assert traced.shape == out.shape


def test_apply_masked_checks_the_buffer_as_apply_does() -> None:
    z = Z.PallasZeroer(tiny(), kernel="triton", interpret=True)
    ids, keep = jnp.array([1], jnp.int32), jnp.array([True])
    e = _err(K.LayoutBufferError, z.apply_masked, jnp.zeros((z.rows - 1, 128), jnp.int32), ids, keep)
    assert e.field == "buffer.shape"  # type: ignore[attr-defined]
    e = _err(K.LayoutBufferError, z.apply_masked, jnp.zeros(z.buffer_shape, jnp.float32), ids, keep)
    assert e.field == "buffer.dtype"  # type: ignore[attr-defined]
    e = _err(K.LayoutBufferError, z.apply_masked, np.zeros(z.buffer_shape, np.int32), ids, keep)
    assert e.field == "buffer"  # type: ignore[attr-defined]
    m = K.plan(K.KVCacheSpec(4, "packed", (K.GroupSpec("m", (K.MambaSpec("m0", state_bytes=1024),)),)))
    y = Z.PallasZeroer(m, kernel="triton", interpret=True)  # no rows: checked all the same
    e = _err(K.LayoutBufferError, y.apply_masked, jnp.zeros((y.rows, 128), jnp.uint8), ids, keep)
    assert e.field == "buffer.dtype"  # type: ignore[attr-defined]
    good = jnp.ones(y.buffer_shape, jnp.int32)
    assert y.apply_masked(good, ids, keep) is good


@pytest.mark.parametrize("bad", ["no", 0, 1, None])
def test_coalesce_must_be_a_bool(bad: object) -> None:
    e = _err(K.BackendError, Z.PallasZeroer, tiny(), coalesce=bad, kernel="triton", interpret=True)
    assert str(e) == f"coalesce = {bad!r}: must be True or False"
    assert e.field == "coalesce" and e.value is bad  # type: ignore[attr-defined]


def test_a_numpy_offset_is_a_python_int() -> None:
    z = Z.PallasZeroer(tiny(), offset=np.int64(8), kernel="triton", interpret=True)
    assert type(z.offset) is int and z.offset == 8 and z.rows == 7
    z = Z.PallasZeroer(tiny(), offset=np.uint8(4), kernel="triton", interpret=True)
    assert type(z.offset) is int and z.offset == 4
    for bad in (True, 4.0, -4, 6, np.int64(-8), IndexLies(4), "8"):
        e = _err(K.LayoutBufferError, Z.PallasZeroer, tiny(), offset=bad, kernel="triton", interpret=True)
        assert str(e) == f"offset = {bad!r}: must be a non-negative multiple of 4"
        assert e.field == "offset"  # type: ignore[attr-defined]
