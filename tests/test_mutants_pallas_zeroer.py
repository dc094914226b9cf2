"""Host-side rules of the Pallas zeroer that mutation testing checks (issue 25).

The Python around the Pallas kernels (``backends/pallas/zeroer.py``): every refusal's full
``field = value: why``, the id paths (host lists, NumPy arrays of every width, device arrays,
ids that do not fit int32 with x64 off), the bad-id count, groups, donation and the jitted
steps. Tiny tables (256 or 512 B a block), so the kernels run fast in interpret mode; every
write is checked byte for byte on a poisoned buffer with guard bands against the NumPy
reference.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import kvlayout as K

jax = pytest.importorskip("jax")
Z = pytest.importorskip("kvlayout.backends.pallas.zeroer")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

I32 = 2**31 - 1
GUARD = 4096  # bytes of poison before the layout (the zeroer's offset) and rows after it


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


def layer(name: str, head_size: int = 8) -> K.FullAttentionSpec:
    return K.FullAttentionSpec(
        name=name, block_size=16, num_kv_heads=1, head_size=head_size, dtype="bfloat16"
    )


def tiny(num_blocks: int = 6, head_size: int = 8) -> K.SegmentTable:
    """One layer: 512 B a block (one 128-lane row) at head size 8, 256 B (half a row) at 4."""
    return K.plan(K.KVCacheSpec(num_blocks, "BLHNC", (K.GroupSpec("g", (layer("a", head_size),)),)))


def two_groups(num_blocks: int = 6) -> K.SegmentTable:
    """Group g (layers a, c) and group h (layer b): g's second layer has bytes h never shares."""
    groups = (K.GroupSpec("g", (layer("a"), layer("c"))), K.GroupSpec("h", (layer("b"),)))
    return K.plan(K.KVCacheSpec(num_blocks, "BLHNC", groups))


def spy_lock(z: Any) -> list[bool]:
    """Record, per step, whether it ran under the process-wide TPU-interpret lock."""
    step, seen = z._step, []

    def spy(*args: Any) -> Any:
        seen.append(Z._TPU_INTERPRET_LOCK.locked())
        return step(*args)

    z._step = spy
    return seen


def poisoned(z: Any, seed: int = 7) -> tuple[np.ndarray, jax.Array]:
    """Poisoned bytes of the zeroer's buffer plus 4 trailing guard rows, and the buffer."""
    rows = z.buffer_shape[0] + 4
    data = K.poison_pattern(rows * 512, seed)
    return data, jnp.asarray(data.view(np.int32).reshape(rows, 128))


def want(z: Any, data: np.ndarray, ids: list[int]) -> np.ndarray:
    out = data.copy()
    K.zero_blocks_numpy(out, z.table, ids, offset=z.offset, group=z.group)
    return out


def got(buf: jax.Array) -> np.ndarray:
    return np.asarray(buf).reshape(-1).view(np.uint8)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    if not np.array_equal(a, b):
        print("differ at bytes", np.flatnonzero(a != b)[:8])
        return False
    return True


def raises(cls: type[Exception], fn: Any, *args: Any, **kw: Any) -> Any:
    with pytest.raises(cls) as e:
        fn(*args, **kw)
    return e.value


# ------------------------------------------------------------------------------ pure host helpers
def test_default_kernel_and_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    for plat, expected in (
        ("tpu", ("tpu", False)),
        ("gpu", ("triton", False)),
        ("cuda", ("triton", False)),
        ("cpu", ("tpu", True)),
        ("rocm", ("tpu", True)),
    ):
        monkeypatch.setattr(Z, "jax_platform", lambda plat=plat: plat)
        assert Z.default_kernel() == expected, plat
    assert Z.kernel_mode("tpu", True) == "tpu-interpret"
    assert Z.kernel_mode("tpu", False) == "native"
    assert Z.kernel_mode("triton", True) == "triton-interpret"
    assert Z.kernel_mode("triton", False) == "native-gpu"
    p = Z.interpret_params()
    assert p.detect_races is True and p.uninitialized_memory == "nan"
    assert Z.KERNELS == ("tpu", "triton") and Z.INT32_MIN == -(2**31)


def test_ids_in_range_every_dtype() -> None:
    cases = (
        (jnp.int32, [0, 5, 6, -1, I32, -(2**31)], 6),
        (jnp.int32, [2**24 + 1, I32 - 1, I32], I32),  # exact: not through float32 (2**24 + 1 rounds)
        (jnp.int8, [1, -2, 100, 127, -128], 120),  # 120 fits int8; 200 would not: narrowed first
        (jnp.int8, [1, -2, 100, 127, -128], 200),
        (jnp.uint8, [0, 255, 199, 200], 200),
        (jnp.uint8, [0, 255, 7], 300),
        (jnp.int16, [-1, 0, 32767, 300], 301),
        (jnp.uint32, [0, 2**32 - 1, 2**31 + 3, 3, 2**31 - 1], 4),
    )
    arrays = [jnp.array(vals, dtype) for dtype, vals, _ in cases]
    results = jax.jit(lambda arrs: [Z.ids_in_range(a, c[2]) for a, c in zip(arrs, cases)])(arrays)
    for (dtype, vals, limit), (ids32, ok) in zip(cases, results):
        exp_ok = np.array([0 <= v < limit for v in vals])
        assert ids32.dtype == jnp.int32 and ok.dtype == jnp.bool_, dtype
        assert np.array_equal(np.asarray(ok), exp_ok), (dtype, vals, limit)
        # out-of-range slots become 0 (masked off); in-range ids are kept exactly
        assert np.array_equal(np.asarray(ids32), np.where(exp_ok, vals, 0)), (dtype, vals, limit)


def test_step_ids_host_paths() -> None:
    dev = jnp.array([1, 2], jnp.int32)
    assert Z.step_ids(dev) is dev
    for empty in ([], ()):
        e = Z.step_ids(empty)
        assert e.shape == (0,) and e.dtype == jnp.int32
    lo, hi = -(2**31), I32
    cases: list[tuple[Any, list[int]]] = [
        ([3, lo, hi, lo - 1, hi + 1, 2**64 + 1], [3, lo, hi, -1, -1, -1]),
        ((np.int64(2**40), np.uint64(5), np.int64(-7)), [-1, 5, -7]),
        ([np.uint64(2**63 + 1), 0], [-1, 0]),
        (np.array([3, lo, hi, lo - 1, hi + 1, 2**32 + 3], np.int64), [3, lo, hi, -1, -1, -1]),
        (np.array([0, hi, hi + 1, 2**63], np.uint64), [0, hi, -1, -1]),
        (np.array([0, hi, hi + 1, 2**32 - 1], np.uint32), [0, hi, -1, -1]),
    ]
    for ids, exp in cases:
        out = Z.step_ids(ids)
        assert out.dtype == jnp.int32 and out.shape == (len(exp),), ids
        assert np.asarray(out).tolist() == exp, ids
    with jax.enable_x64(True):  # host ids narrow to int32 whatever JAX's default integer
        for ids, exp in (
            ([3, 2**40], [3, -1]),
            ((np.int64(-(2**40)), 4), [-1, 4]),
            (np.array([3, 2**40], np.int64), [3, -1]),
        ):
            out = Z.step_ids(ids)
            assert out.dtype == jnp.int32 and np.asarray(out).tolist() == exp, ids
    for scalar in (np.int64(2**33), np.int64(5), np.uint64(2**32), np.int32(1), np.zeros((2, 2), np.int64)):
        e = raises(K.BlockIdError, Z.step_ids, scalar)  # not 1-D: named by the dtype given (issue 25)
        assert (e.field, e.value) == ("block_ids", str(scalar.dtype))
        assert str(e) == f"block_ids: must be a 1-D integer array, got {scalar.dtype}{scalar.shape}"
    # narrow dtypes pass as they are (checked in the traced code)
    for dtype in (np.int8, np.int16, np.uint16, np.int32):
        out = Z.step_ids(np.array([1, 2], dtype))
        assert out.dtype == jnp.dtype(dtype) and np.asarray(out).tolist() == [1, 2]
    for ids, at in (([True, 2], 0), ([2, np.False_], 1), ([True], 0), ([3, jnp.array(True)], 1)):
        e = raises(K.BlockIdError, Z.step_ids, ids)  # a bool beside ints became block 0 or 1 (issue 25)
        assert e.field == f"block_ids[{at}]" and str(e).endswith(": must be an integer block id, not a bool")
    assert Z.step_ids([2, jnp.array(3)]).tolist() == [2, 3]  # a device scalar beside ints: not a bool
    for arr in (np.array([True]), np.array([1.5])):  # refused by the dtype given (hostile pass 16, L2)
        e = raises(K.BlockIdError, Z.step_ids, arr)
        assert str(e) == f"block_ids.dtype = {arr.dtype}: must be an integer array, got dtype {arr.dtype}"
    e = raises(K.BlockIdError, Z.step_ids, np.array([1, None], dtype=object))
    assert str(e) == "block_ids.dtype = object: must be an integer array, got dtype object"
    assert e.field == "block_ids.dtype" and e.value == "object"
    why = Z.IDS_WHY  # what __call__ takes, or a jax.Array (hostile pass 16, L1)
    for bad in ("ab", None, {"a": 1}, 2**40):
        e = raises(K.BlockIdError, Z.step_ids, bad)
        assert str(e) == f"block_ids = {bad!r}: {why}; got a {type(bad).__name__}"
        assert e.field == "block_ids" and e.value == bad
    for bad in (["x"], [None]):
        e = raises(K.BlockIdError, Z.step_ids, bad)
        assert str(e) == f"block_ids[0] = {bad[0]!r}: must be an integer block id"
        assert e.field == "block_ids[0]"


def test_check_id_array_and_buffer_type() -> None:
    Z.check_id_array(jnp.zeros((3,), jnp.int32))
    Z.check_id_array(jnp.zeros((0,), jnp.uint8))
    for arr, shown in (
        (jnp.zeros((2, 2), jnp.int32), "int32(2, 2)"),
        (jnp.zeros((), jnp.int32), "int32()"),
        (jnp.zeros((3,), jnp.float32), "float32(3,)"),
        (jnp.zeros((3,), jnp.bool_), "bool(3,)"),
    ):
        e = raises(K.BlockIdError, Z.check_id_array, arr)
        assert str(e) == f"block_ids: must be a 1-D integer array, got {shown}"
        assert e.field == "block_ids" and e.value == str(arr.dtype)
    Z.check_int32_array(jnp.zeros((2, 128), jnp.int32))
    e = raises(K.LayoutBufferError, Z.check_int32_array, np.zeros((2, 128), np.int32))
    assert str(e) == "buffer type = ndarray: must be a jax.Array"
    assert e.field == "buffer" and e.value == "ndarray"
    e = raises(K.LayoutBufferError, Z.check_int32_array, jnp.zeros((2, 128), jnp.uint32))
    assert str(e) == "buffer dtype = uint32: must be int32 (view other dtypes as int32 rows)"
    assert e.field == "buffer.dtype" and e.value == "uint32"


def test_bucket_ids() -> None:
    for n in (1, 2, 7, 8, 9, 16, 17, 33):
        host = np.arange(5, 5 + n, dtype=np.int64)
        b = Z.bucket_ids(host)
        size = max(8, 2 ** int(np.ceil(np.log2(n))))
        assert b.dtype == np.int32 and b.shape == (size,), n
        assert b[:n].tolist() == host.tolist() and (b[n:] == 5).all(), n  # padded with the first id
    assert Z.bucket_ids(np.array([0, I32], np.int64)).tolist() == [0, I32] + [0] * 6
    for host, bad in (
        ([-5, 3], -5),
        ([3, I32 + 1], I32 + 1),
        ([-5, 2**40], 2**40),
        ([-1], -1),
        ([-5, I32], -5),
    ):
        e = raises(K.BlockIdError, Z.bucket_ids, np.array(host, np.int64))
        assert (
            str(e) == f"block_ids: id {bad} does not fit int32" and e.field == "block_ids" and e.value == bad
        )


def test_bad_id_count() -> None:
    c = Z.BadIdCount()
    c.check(5, "x")  # nothing counted yet
    c.add(jnp.asarray(0, jnp.int32))
    c.check(5, "x")  # zero bad ids: no error
    c.add(jnp.asarray(2, jnp.int32))
    c.add(jnp.asarray(3, jnp.int32))
    e = raises(K.BlockIdError, c.check, 9, "they wrote nothing")
    assert str(e) == "device block_ids: 5 ids outside [0, 9); they wrote nothing"
    assert e.field == "block_ids" and e.value == 5
    c.check(9, "x")  # reset by the check
    seen = []

    def fn(acc: jax.Array) -> tuple[str, jax.Array]:
        assert acc.dtype == jnp.int32 and acc.shape == ()  # exact counts: never a float
        seen.append(int(acc))
        return "out", acc + 4

    assert c.step(fn) == "out" and c.step(fn) == "out"
    assert seen == [0, 4]  # the first step starts from 0, the next from the running count
    c.add(jnp.asarray(1, jnp.int32))
    e = raises(K.BlockIdError, c.check, 3, "c")
    assert e.value == 9 and "9 ids outside [0, 3); c" in str(e)


def test_run_step_serialises_under_the_lock() -> None:
    held = []

    def fn(a: int, b: int) -> jax.Array:
        held.append(Z._TPU_INTERPRET_LOCK.locked())
        return jnp.asarray(a * 10 + b)

    assert int(Z.run_step(False, fn, 1, 2)) == 12
    assert int(Z.run_step(True, fn, 3, 4)) == 34
    assert held == [False, True] and not Z._TPU_INTERPRET_LOCK.locked()
    assert isinstance(Z._TPU_INTERPRET_LOCK, type(threading.Lock()))


# ------------------------------------------------------------------------------ construction
def test_constructor_refusals_name_field_and_value() -> None:
    t = tiny()
    P = Z.PallasZeroer
    e = raises(K.TableError, P, t, group=3)
    assert str(e) == "group = 3: must be a group name (str) or None" and e.field == "group" and e.value == "3"
    for off in (-4, 2, 6, True, 4.0, "8", None):
        e = raises(K.LayoutBufferError, P, t, offset=off)
        assert str(e) == f"offset = {off!r}: must be a non-negative multiple of 4", off
        assert e.field == "offset" and e.value == off
    bounded = (
        ("tile_rows", 1 << 16, False),
        ("ids_per_step", 1 << 16, False),
        ("chunk_rows", 1 << 16, True),
        ("num_warps", 32, True),
        ("programs", I32, False),
    )
    for name, limit, pow2 in bounded:
        what = "a positive power of two" if pow2 else "a positive integer"
        for bad in (0, -1, 2 * limit, True) + ((3,) if pow2 else ()):
            e = raises(K.BackendError, P, t, **{name: bad})
            assert str(e) == f"{name} = {bad!r}: must be {what}, at most {limit}", (name, bad)
            assert e.field == name and e.value == bad
    for name in ("dedup", "vector", "unit_major", "evict_first"):
        for bad in (1, "yes", None):
            e = raises(K.BackendError, P, t, **{name: bad})
            assert str(e) == f"{name} = {bad!r}: must be True or False" and e.field == name and e.value == bad
    for bad in (1, "no"):
        e = raises(K.BackendError, P, t, interpret=bad)
        assert str(e) == f"interpret = {bad!r}: must be True, False or None"
        assert e.field == "interpret" and e.value == bad
    e = raises(K.LayoutBufferError, P, t, kernel="cuda")
    assert (
        str(e) == "kernel = 'cuda': valid kernels: tpu, triton" and e.field == "kernel" and e.value == "cuda"
    )
    unsafe = K.SegmentTable(1024, 4, (K.Segment(0, 128, 256),))  # blocks overlap
    raises(K.TableError, P, unsafe)


def test_constructor_attributes() -> None:
    t = tiny()
    z = Z.PallasZeroer(
        t, tile_rows=1 << 16, ids_per_step=1 << 16, chunk_rows=1 << 16, num_warps=32, programs=5
    )
    assert (z.ids_per_step, z.chunk_rows, z.num_warps, z.programs) == (1 << 16, 1 << 16, 32, 5)
    assert z.plan.tile_rows == 1 << 16
    assert (z.kernel, z.interpret, z.mode, z.serialised, z.direct) == (
        "tpu",
        True,
        "tpu-interpret",
        True,
        False,
    )
    assert (z.dedup, z.vector, z.unit_major, z.evict_first) == (False, True, True, False)
    y = Z.PallasZeroer(t)
    assert (y.plan.tile_rows, y.ids_per_step, y.chunk_rows, y.num_warps, y.programs) == (128, 64, 16, 4, None)
    assert z.table is t and z.group is None and z.offset == 0 and z.vector_width == 1
    assert z.rows == z.plan.rows_needed == 6 and z.buffer_shape == (6, 128)
    assert z._buffer_ok is None and z._calls == {} and z._bad._err is None
    d = Z.PallasZeroer(
        t,
        offset=8,
        tile_rows=3,
        dedup=True,
        vector=False,
        unit_major=False,
        evict_first=True,
        kernel="triton",
        interpret=False,
    )
    assert (d.dedup, d.vector, d.unit_major, d.evict_first, d.programs) == (True, False, False, True, None)
    assert (d.kernel, d.interpret, d.mode, d.serialised, d.direct) == (
        "triton",
        False,
        "native-gpu",
        False,
        False,
    )
    assert d.plan.tile_rows == 3 and d.offset == 8 and d.rows == 7 and d.vector_width == 1
    g = Z.PallasZeroer(t, kernel="triton", interpret=True)
    assert (g.mode, g.serialised, g.direct, g.vector_width) == ("triton-interpret", False, True, 4)
    # 16-byte stores need the layout 16 B aligned
    assert Z.PallasZeroer(t, kernel="triton", offset=4).vector_width == 1
    assert Z.PallasZeroer(t, kernel="tpu", interpret=False).mode == "native"
    # coalesce: the groups overlay slot by slot (a and b share bytes), so only the coalesced rows
    # are disjoint per block; group g's two layers are adjacent rows, planned as one
    t2 = two_groups()
    assert len(t2) == 3 and len(t2.coalesced()) == 1
    assert Z.PallasZeroer(t2).kernel_table == t2.coalesced()
    e = raises(K.TableError, Z.PallasZeroer, t2, coalesce=False)
    assert "overlap inside block 0" in str(e)
    g_rows = t2.for_group("g")
    assert len(g_rows) == 2 and len(g_rows.coalesced()) == 1
    assert Z.PallasZeroer(t2, group="g").kernel_table == g_rows.coalesced()
    assert Z.PallasZeroer(t2, group="g", coalesce=False).kernel_table == g_rows
    assert Z.PallasZeroer(t2, group="h").group == "h"


def test_buffer_refusals() -> None:
    t = tiny()
    z = Z.PallasZeroer(t, offset=8, kernel="triton", interpret=True)
    assert z.rows == 7
    for _ in range(2):  # a refused shape is refused again (only accepted shapes are remembered)
        e = raises(K.LayoutBufferError, z, jnp.zeros((6, 128), jnp.int32), [0])
        assert str(e) == "buffer rows = 6: the layout needs 7 rows (3584 B for offset 8 + total_bytes 3072)"
        assert e.field == "buffer.shape" and e.value == (6, 128)
    for shape in ((7, 64), (7, 128, 1), (7 * 128,)):
        e = raises(K.LayoutBufferError, z, jnp.zeros(shape, jnp.int32), [0])
        assert str(e) == f"buffer shape = {shape}: must be (rows, 128)" and e.value == shape
        assert e.field == "buffer.shape"
    e = raises(K.LayoutBufferError, z.apply, np.zeros((7, 128), np.int32), [0])
    assert e.field == "buffer"
    e = raises(K.LayoutBufferError, z.apply, jnp.zeros((7, 128), jnp.float32), [0])
    assert e.field == "buffer.dtype"
    assert z._buffer_ok is None
    ids = jax.ShapeDtypeStruct((8,), jnp.int32)
    for kernel in ("triton", "tpu"):  # the Triton kernel indexes rows in int32; traced only, never allocated
        y = Z.PallasZeroer(t, kernel=kernel, interpret=True)
        rows = I32 - 16 + 1
        big = jax.ShapeDtypeStruct((rows, 128), jnp.int32)
        if kernel == "triton":
            e = raises(K.LayoutBufferError, jax.eval_shape, y.apply, big, ids)
            assert str(e).startswith(f"buffer rows = {rows}: the Pallas-Triton kernel indexes rows in int32")
            assert e.field == "buffer.shape" and e.value == rows
            ok = jax.ShapeDtypeStruct((rows - 1, 128), jnp.int32)
            assert jax.eval_shape(y.apply, ok, ids)[0].shape == (rows - 1, 128)
        else:
            assert jax.eval_shape(y.apply, big, ids)[0].shape == (rows, 128)
    y = Z.PallasZeroer(t, kernel="triton", interpret=True, chunk_rows=1024)
    rows = I32 - 1024 + 1
    e = raises(
        K.LayoutBufferError, jax.eval_shape, y.apply, jax.ShapeDtypeStruct((rows, 128), jnp.int32), ids
    )
    assert e.value == rows and "at most 2147482623 rows with chunk_rows 1024" in str(e)
    # checked up front on every buffer, also for a table without rows (no kernel is built for it)
    m = K.plan(K.KVCacheSpec(4, "packed", (K.GroupSpec("m", (K.MambaSpec("m0", state_bytes=1024),)),)))
    y = Z.PallasZeroer(m, kernel="triton", interpret=True, chunk_rows=1024)
    e = raises(
        K.LayoutBufferError, jax.eval_shape, y.apply, jax.ShapeDtypeStruct((rows, 128), jnp.int32), ids
    )
    assert e.value == rows and "at most 2147482623 rows with chunk_rows 1024" in str(e)


def test_triton_refuses_tables_beyond_int32_lanes() -> None:
    most = I32 // 127 + 1  # stride 127 words: lane0 = 127 * (num_blocks - 1)
    t = K.SegmentTable(508 * (most + 1), most + 1, (K.Segment(0, 508, 4),))
    e = raises(K.TableError, Z.PallasZeroer, t, kernel="triton", interpret=True)
    assert e.field == "table.num_blocks" and e.value == most + 1 and f"at most {most} blocks" in str(e)
    assert Z.PallasZeroer(t, kernel="tpu", interpret=True).table is t  # whole rows per block: accepted


# ------------------------------------------------------------------------------ steps, bytes checked
def test_tpu_kernel_steps_bytes_bad_ids_donation() -> None:
    """Half-row blocks (read-modify-write rows) at a 4 KiB offset, ids padded to ids_per_step."""
    t = tiny(6, head_size=4)
    z = Z.PallasZeroer(t, offset=GUARD + 8, kernel="tpu", ids_per_step=3)
    assert z.plan.period == 2 and not z.plan.aligned and z.serialised
    data, buf = poisoned(z)
    locked = spy_lock(z)
    out = z(buf, [4, 1, 4])
    assert buf.is_deleted() and same(got(out), want(z, data, [1, 4]))  # donated
    assert locked == [True]  # TPU interpret mode's simulator is process-wide: steps hold the lock
    assert z([out][0], []) is out and z(out, jnp.zeros((0,), jnp.int32)) is out  # nothing runs
    out = z(out, jnp.array([5, 6, -1, 5, 2**31 - 1, 1, 1, 1], jnp.int32))  # the host bucket's shape
    assert same(got(out), want(z, data, [1, 4, 5]))
    e = raises(K.BlockIdError, z.check)
    assert str(e) == "device block_ids: 3 ids outside [0, 6); they wrote nothing" and e.value == 3
    z.check()
    for bad in ([6], [-1], [0, 2**32]):
        e = raises(K.BlockIdError, z, out, bad)
        assert e.field.startswith("block_ids") and not out.is_deleted()
    out = z(out, np.array([0], np.int64))
    assert same(got(out), want(z, data, [0, 1, 4, 5]))
    z.check()


def test_apply_inside_user_jit_wide_ids() -> None:
    """x64 off: host int64 ids (constants of the user's jit) that do not fit int32 are counted
    bad and write nothing (passed as a jit argument, JAX itself narrows them first)."""
    assert not jax.config.jax_enable_x64
    t = tiny(6)
    z = Z.PallasZeroer(t, offset=GUARD, kernel="tpu", interpret=True)
    data, buf = poisoned(z)
    ids = np.array([2**32 + 3, 2, -(2**32) + 4, 2, 2**31, 6, 5, -1], np.int64)  # 3 and 4 if wrapped
    out, bad = jax.jit(lambda b: z.apply(b, ids), donate_argnums=0)(buf)
    assert int(bad) == 5 and bad.dtype == jnp.int32 and bad.shape == ()
    assert same(got(out), want(z, data, [2, 5]))
    z.check()  # apply returns its count; nothing is kept
    out, bad = z.apply(out, jnp.zeros((0,), jnp.int32))
    assert int(bad) == 0 and bad.dtype == jnp.int32


@pytest.mark.parametrize("kw", [{}, {"dedup": True, "programs": 3}])
def test_triton_kernel_steps(kw: dict[str, Any]) -> None:
    t = tiny(6, head_size=4)
    z = Z.PallasZeroer(t, offset=GUARD + 4, kernel="triton", interpret=True, chunk_rows=2, **kw)
    data, buf = poisoned(z)
    locked = spy_lock(z)
    out = z(buf, [3, 0, 3])
    assert buf.is_deleted() and same(got(out), want(z, data, [0, 3]))
    assert locked == [False]  # only the TPU interpreter is serialised
    out = z(out, jnp.array([5, 6, -1, 5, 2**31 - 1], jnp.int32))
    assert same(got(out), want(z, data, [0, 3, 5]))
    e = raises(K.BlockIdError, z.check)
    assert e.value == 3 and str(e).startswith("device block_ids: 3 ids outside [0, 6)")
    out, bad = jax.jit(z.apply)(out, jnp.array([7], jnp.int32))  # one id: counted, not written
    assert int(bad) == 1 and same(got(out), want(z, data, [0, 3, 5]))
    masked = jax.jit(z.apply_masked)(
        out, jnp.array([2, 4, 2, 4], jnp.int32), jnp.array([True, False, True, False])
    )
    assert same(got(masked), want(z, data, [0, 2, 3, 5]))
    z.check()


def test_group_zeroes_only_its_rows() -> None:
    t = two_groups()
    z = Z.PallasZeroer(t, group="h", kernel="triton", interpret=True)
    data, buf = poisoned(z)
    out = z(buf, [1, 4])
    assert same(got(out), want(z, data, [1, 4]))
    every = data.copy()
    K.zero_blocks_numpy(every, t, [1, 4])
    assert not np.array_equal(got(out), every)  # group g's layer c keeps its bytes


def test_table_without_rows_counts_bad_ids() -> None:
    m = K.plan(K.KVCacheSpec(4, "packed", (K.GroupSpec("m", (K.MambaSpec("m0", state_bytes=1024),)),)))
    for kernel in ("triton", "tpu"):
        z = Z.PallasZeroer(m, kernel=kernel, interpret=True)
        assert len(z.kernel_table) == 0
        data, buf = poisoned(z)
        out = z(buf, jnp.array([0, 9, 3, -2], jnp.int32))
        out = z(out, jnp.array([4], jnp.int32))  # one id is a batch too
        assert same(got(out), data)
        e = raises(K.BlockIdError, z.check)
        assert e.value == 3 and "outside [0, 4)" in str(e)


def cuda_text(z: Any, n: int) -> str:
    buf = jax.ShapeDtypeStruct(z.buffer_shape, jnp.int32)
    ids = jax.ShapeDtypeStruct((n,), jnp.int32)
    return str(jax.jit(z.apply).trace(buf, ids).lower(lowering_platforms=("cuda",)).as_text())


def test_lowering_donation_and_direct_launch() -> None:
    t = tiny()
    z = Z.PallasZeroer(t, kernel="triton", interpret=True)
    low = z.lower(4)
    assert [(a.shape, a.donated) for a in low.args_info[0]] == [((6, 128), True), ((4,), False)]
    text = low.as_text()
    assert re.search(r"tensor<6x128xi32> \{tf\.aliasing_output = \d", text) and "tensor<4xi32>" in text
    assert "sdy.sharding" not in text
    # on a given device (a TPU topology's, in CI): both operands placed there
    on = z.lower(4, device=jax.devices()[0]).as_text()
    assert re.search(r"tensor<6x128xi32> \{sdy\.sharding = [^\n]*, tf\.aliasing_output = \d", on)
    assert re.search(r"tensor<4xi32> \{sdy\.sharding = ", on)
    direct = cuda_text(Z.PallasZeroer(t, kernel="triton", interpret=False), 8)
    assert direct.count("__gpu$xla.gpu.triton") == 1
    assert not re.search(r"stablehlo\.(sort|reduce|concatenate|select|compare)", direct)
    sorted_ = cuda_text(Z.PallasZeroer(t, kernel="triton", interpret=False, dedup=True), 7)
    assert sorted_.count("__gpu$xla.gpu.triton") == 1 and "stablehlo.sort" in sorted_
    # one GPU program per id slot: 7 ids stay 7 (no padding), every operand int32
    assert "tensor<7xi32>" in sorted_ and not re.search(r"tensor<(8|64)xi32>|f32", sorted_)
    # apply_masked: the per-slot grid takes the slots as they come; the persistent grid (programs)
    # sorts the live slots first so that it walks only those
    for programs, sorts in ((None, False), (3, True)):
        y = Z.PallasZeroer(t, kernel="triton", interpret=False, programs=programs)
        args = (jax.ShapeDtypeStruct(y.buffer_shape, jnp.int32), jax.ShapeDtypeStruct((8,), jnp.int32))
        args += (jax.ShapeDtypeStruct((8,), jnp.bool_),)
        text = str(jax.jit(y.apply_masked).trace(*args).lower(lowering_platforms=("cuda",)).as_text())
        assert ("stablehlo.sort" in text) == sorts and text.count("__gpu$xla.gpu.triton") == 1


def test_zero_blocks_one_shot() -> None:
    t = tiny()
    z = Z.PallasZeroer(t, offset=GUARD, kernel="triton", interpret=True)
    data, buf = poisoned(z)
    out = Z.zero_blocks(t, buf, [2], offset=GUARD, kernel="triton", interpret=True)
    assert same(got(out), want(z, data, [2]))


def test_kernels_built_with_the_zeroer_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every option reaches the kernel builder, once per (ids, rows, direct) shape."""
    built: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def record(*args: Any, **kw: Any) -> str:
        built.append((args, kw))
        return f"call{len(built)}"

    monkeypatch.setattr(Z, "triton_zero_call", record)
    monkeypatch.setattr(Z, "tpu_zero_call", record)
    t = tiny()
    opts = {"num_warps": 8, "programs": 3, "vector": False, "unit_major": False, "evict_first": True}
    z = Z.PallasZeroer(t, offset=8, kernel="triton", interpret=False, chunk_rows=4, **opts)
    assert z._call_for(16, 9, True) == "call1" and z._call_for(16, 9, True) == "call1"
    assert (
        z._call_for(16, 9) == "call2"
        and z._call_for(16, 10, True) == "call3"
        and z._call_for(8, 9) == "call4"
    )
    fixed = {"direct": True, "vector": False, "unit_major": False, "evict_first": True}
    assert built[0] == ((z.kernel_table, 8, 9, 4, 8, False, 3), fixed)
    assert built[1] == ((z.kernel_table, 8, 9, 4, 8, False, 3), fixed | {"direct": False})
    assert built[2][0][2] == 10 and built[3][0][2] == 9
    y = Z.PallasZeroer(t, kernel="triton", interpret=True)
    y._call_for(8, 6, False)
    assert built[4] == (
        (y.kernel_table, 0, 6, 16, 4, True, None),
        {"direct": False, "vector": True, "unit_major": True, "evict_first": False},
    )
    for interpret in (True, False):
        x = Z.PallasZeroer(t, kernel="tpu", interpret=interpret, ids_per_step=5)
        n = len(built)
        assert x._call_for(10, 6) == f"call{n + 1}"
        args, kw = built[-1]
        assert args[:3] == (x.plan, 10, 5) and kw == {}
        if interpret:
            assert args[3].detect_races is True and args[3].uninitialized_memory == "nan"
        else:
            assert args[3] is False


def test_gpu_kernel_built_for_the_buffer_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU kernel is built for the rows of the buffer it gets (its row bound and chunking),
    on every path, with int32 operands of the id batch's own length."""
    seen: list[tuple[Any, ...]] = []

    def build(table: Any, offset: int, total_rows: int, *args: Any, direct: bool = False, **kw: Any) -> Any:
        def direct_call(ids: jax.Array, buf: jax.Array) -> tuple[jax.Array, jax.Array]:
            seen.append(("direct", total_rows, ids.dtype, ids.shape))
            return buf, jnp.zeros((1,), jnp.int32)

        def sorted_call(s: jax.Array, take: jax.Array, count: jax.Array, buf: jax.Array) -> jax.Array:
            seen.append(("sorted", total_rows, s.dtype, s.shape, take.dtype, take.shape, count.shape))
            return buf

        return direct_call if direct else sorted_call

    monkeypatch.setattr(Z, "triton_zero_call", build)
    t = tiny()
    ids, valid = jax.ShapeDtypeStruct((7,), jnp.int32), jax.ShapeDtypeStruct((7,), jnp.bool_)
    w = Z.PallasZeroer(t, kernel="triton", interpret=True)
    jax.eval_shape(w.apply, jax.ShapeDtypeStruct((20, 128), jnp.int32), ids)
    jax.eval_shape(w.apply_masked, jax.ShapeDtypeStruct((24, 128), jnp.int32), ids, valid)
    v = Z.PallasZeroer(t, kernel="triton", interpret=True, dedup=True)
    jax.eval_shape(v.apply_masked, jax.ShapeDtypeStruct((28, 128), jnp.int32), ids, valid)
    i32 = jnp.dtype(jnp.int32)
    assert seen == [
        ("direct", 20, i32, (7,)),
        ("direct", 24, i32, (7,)),
        ("sorted", 28, i32, (7,), i32, (7,), (1,)),
    ]
