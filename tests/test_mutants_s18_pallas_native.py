"""The native-array zeroer's newer host rules under mutation (scripts/mutation.sh pallas-native): leaves that
are no arrays named by ``check_caches``, ``_dtype_name``, ``zero_local``'s own checks of ``sel`` and its
leaves (local page counts that differ come from a mesh of stand-in devices: only its shape is read), and the
diagnoses after JAX refuses a call (an abstract leaf, ids committed to other devices, seen through a
``jax.Array`` stand-in whose sharding is a NamedSharding over stand-in devices). Leaves are poisoned (no zero
element) and the pages written are compared with the ids given."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.native import NativeCacheSpec, NativeLeaf

jax = pytest.importorskip("jax")
N = pytest.importorskip("kvlayout.backends.pallas.native")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from tests.pallas_stand_ins import (  # noqa: E402
    D1,
    D2,
    TAIL,
    Placed,
    reset_interpreter,  # noqa: E402, F401 (the autouse fixture)
)
from tests.pallas_stand_ins import raises as _err  # noqa: E402

PAGES = 8
SHAPE = (PAGES, 2, 128)


def elsewhere(shown: str, where: str, want: str) -> str:
    """The refusal of ids committed to ``shown``, not to the devices ``want`` of ``where``."""
    return f"block_ids = <{shown}>: are committed to {shown}, not the devices of {where} ({want}){TAIL}"


HOST = (np.arange(int(np.prod(SHAPE)), dtype=np.float32) + 1).reshape(SHAPE)  # no zero element


def _zeroer(kernel: str = "triton", n: int = 1) -> Any:
    return N.CacheZeroer([jnp.asarray(HOST) for _ in range(n)], kernel=kernel, interpret=True)


def _pages(out: Any) -> list[int]:
    got = np.asarray(out).reshape(PAGES, -1)
    before = HOST.reshape(PAGES, -1)
    changed = [p for p in range(PAGES) if not np.array_equal(got[p], before[p])]
    assert all((got[p] == 0).all() for p in changed)  # a page written is all zero
    return changed


# ---- check_caches, _dtype_name ------------------------------------------------------------------------
@pytest.mark.parametrize(("leaf", "kind"), [("x", "str"), (3, "int"), (None, "NoneType")])
def test_a_leaf_that_is_no_array_is_named_by_its_type(leaf: Any, kind: str) -> None:
    z = _zeroer(n=2)
    caches = [jnp.asarray(HOST), leaf]
    if leaf is None:  # None is no pytree leaf: the structure differs
        e = _err(K.LayoutBufferError, z.check_caches, caches)
        assert e.field == "caches"
        return
    e = _err(K.LayoutBufferError, z.check_caches, caches)
    assert str(e) == f"leaf '1' = {kind}: must be a jax.Array of float32{SHAPE}"
    assert e.field == "leaf '1'" and e.value == kind


def test_arrays_and_abstract_leaves_are_taken() -> None:
    z = _zeroer(n=2)
    leaves = [jnp.asarray(HOST), jax.ShapeDtypeStruct(SHAPE, jnp.float32)]
    assert z.check_caches(leaves) == leaves


def test_dtype_names() -> None:
    assert N._dtype_name(None) is None
    assert N._dtype_name(np.float32) == "float32" and N._dtype_name(jnp.bfloat16) == "bfloat16"
    assert N._dtype_name("torch.bfloat16") == "torch.bfloat16"  # JAX cannot read it: its text


# ---- zero_local's own checks ---------------------------------------------------------------------------
def test_zero_local_refuses_sel_and_leaves_by_name() -> None:
    z = _zeroer(n=2)
    leaf = jnp.asarray(HOST)
    ids, valid = jnp.array([1]), jnp.array([True])
    why = "must be a non-empty tuple of distinct leaf indices in [0, 2)"
    for sel in ((), (2,), (0, 0), (-1,), (True,), (np.int64(0),), "0", None):
        e = _err(K.LayoutBufferError, z.zero_local, [leaf], sel, ids, valid)
        assert str(e) == f"sel = {K.errors.short(sel)}: {why}" and e.field == "sel" and e.value is sel
    e = _err(K.LayoutBufferError, z.zero_local, [leaf], (0, 1), ids, valid)
    assert str(e) == "leaves = 1: must be a list of 2 arrays (one per sel)" and e.field == "leaves"
    e = _err(K.LayoutBufferError, z.zero_local, leaf, (0,), ids, valid)
    assert str(e) == "leaves = 'ArrayImpl': must be a list of 1 arrays (one per sel)"
    assert e.value == "ArrayImpl"
    e = _err(K.LayoutBufferError, z.zero_local, [jnp.asarray(HOST[:4])], (1,), ids, valid)
    part = "must be float32(8, 2, 128) (this device's part of the leaf)"
    assert str(e) == f"leaf '1' = float32(4, 2, 128): {part}"
    assert e.field == "leaf '1'" and e.value == "float32(4, 2, 128)"
    e = _err(K.LayoutBufferError, z.zero_local, [object()], (0,), ids, valid)
    assert str(e).startswith("leaf '0' = NoneNone: must be float32(8, 2, 128)")
    out = z.zero_local([leaf, leaf], [1, 0], ids, valid)  # a list of indices is a sel too
    assert [_pages(x) for x in out] == [[1], [1]]


def test_zero_local_refuses_leaves_of_different_local_page_counts() -> None:
    mesh = Mesh(np.array([D1, D2], dtype=object), ("dp",))  # stand-ins: only the mesh's shape is read
    caches = [jax.ShapeDtypeStruct(SHAPE, jnp.float32), jax.ShapeDtypeStruct(SHAPE, jnp.float32)]
    z = N.CacheZeroer(caches, mesh=mesh, partition_specs=[P("dp"), P()], kernel="triton", interpret=True)
    assert z.local_shapes == ((PAGES // 2, 2, 128), SHAPE)
    leaves = [jnp.asarray(HOST[: PAGES // 2]), jnp.asarray(HOST)]
    e = _err(K.LayoutBufferError, z.zero_local, leaves, (0, 1), jnp.array([1]), jnp.array([True]))
    why = "the leaves have different local page counts [4, 8]: one call per page count"
    assert str(e) == f"sel = (0, 1): {why}"
    assert e.field == "sel" and e.value == (0, 1)
    assert _pages(z.zero_local([leaves[1]], (1,), jnp.array([6, 1]), jnp.array([True, False]))[0]) == [6]


@pytest.mark.parametrize("kernel", ["triton", "tpu"])
def test_zero_local_writes_valid_ids_in_range(kernel: str) -> None:
    z = _zeroer(kernel)
    leaf = jnp.asarray(HOST)
    for ids, valid, expect in (
        ([5], [True], [5]),
        ([3, 8, -1, 2, 3, 7], [True, True, True, False, True, True], [3, 7]),
        ([0, 4], [2, 0], [0]),  # an integer mask: nonzero = valid
    ):
        out = z.zero_local([leaf], (0,), jnp.array(ids, jnp.int32), jnp.array(valid))
        assert _pages(out[0]) == expect, (ids, valid)
    none = z.zero_local([leaf], (0,), jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool))
    assert _pages(none[0]) == [] and none[0] is leaf


# ---- the diagnoses after JAX refused a call ----------------------------------------------------------
def test_abstract_leaf_after_a_type_error_is_named() -> None:
    z = _zeroer(n=2)
    err = TypeError("jax")
    abstract = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    e = _err(K.LayoutBufferError, z._diagnose_leaves, [jnp.asarray(HOST), abstract], err)
    why = "is abstract (jax.ShapeDtypeStruct): zeroing needs the arrays"
    assert str(e) == f"leaf '1' = 'ShapeDtypeStruct': {why}"
    assert e.field == "leaf '1'" and e.value == "ShapeDtypeStruct" and e.__cause__ is err
    e = _err(K.LayoutBufferError, z._diagnose_leaves, [jnp.asarray(HOST), "x"], err)
    assert e.field == "leaf '1'" and e.__cause__ is err
    assert z._diagnose_leaves([jnp.asarray(HOST), jnp.asarray(HOST)], err) is None  # JAX's error stands


def test_ids_committed_elsewhere_are_named_after_a_refusal() -> None:
    cpu = jax.devices()[0]
    z = _zeroer()
    err = ValueError("jax")
    leaf = jax.device_put(jnp.asarray(HOST), cpu)
    e = _err(K.BlockIdError, z._diagnose_ids, [leaf], Placed((D1, D2)), err)
    shown = "dev:1, dev:2"
    assert str(e) == elsewhere(shown, "the caches", str(cpu))
    assert e.field == "block_ids" and e.__cause__ is err
    # the first committed leaf is the one compared; uncommitted and host leaves are passed over
    z2 = _zeroer(n=3)
    e = _err(K.BlockIdError, z2._diagnose_ids, [HOST.copy(), jnp.asarray(HOST), leaf], Placed((D1,)), err)
    assert f"not the devices of the caches ({cpu})" in str(e)
    assert z2._diagnose_ids([HOST.copy(), jnp.asarray(HOST), jnp.asarray(HOST)], Placed((D1,)), err) is None
    assert z._diagnose_ids([leaf], jax.device_put(jnp.arange(2), cpu), err) is None  # the caches' device
    assert z._diagnose_ids([leaf], [1, 2], err) is None  # host ids
    mesh = Mesh(np.array(jax.devices()[:1]), ("dp",))
    zm = N.CacheZeroer([jax.device_put(jnp.asarray(HOST), NamedSharding(mesh, P("dp")))], mesh=mesh,
                       kernel="triton", interpret=True)
    e = _err(K.BlockIdError, zm._diagnose_ids, [leaf], Placed((D1,)), err)
    assert str(e) == elsewhere("dev:1", "the mesh", str(cpu))
    assert zm._diagnose_ids([leaf], jax.device_put(jnp.arange(2), cpu), err) is None


@pytest.mark.parametrize("path", ["__call__", "apply"])
def test_each_entry_names_ids_committed_elsewhere(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """apply reaches the diagnosis through the stand-in's own failure; __call__'s jit cannot take the
    stand-in at all, so its step is replaced by one that refuses as JAX does (ValueError)."""
    cpu = jax.devices()[0]
    z = _zeroer()
    leaf = jax.device_put(jnp.asarray(HOST), cpu)
    if path == "__call__":
        def refuse(*args: Any, **kw: Any) -> Any:
            raise ValueError("incompatible devices")

        monkeypatch.setattr(z, "_step", refuse)
        e = _err(K.BlockIdError, z, [leaf], Placed((D1, D2)))
    else:
        e = _err(K.BlockIdError, z.apply, [leaf], Placed((D1, D2)))
    shown = "dev:1, dev:2"
    assert str(e) == elsewhere(shown, "the caches", str(cpu))
    assert e.field == "block_ids" and e.__cause__ is not None
    assert not leaf.is_deleted() and _pages(leaf) == []


@pytest.mark.parametrize("path", ["apply", "__call__"])
def test_an_abstract_or_donated_leaf_is_named_with_jaxs_error_as_the_cause(path: str) -> None:
    z = _zeroer()
    call = z.apply if path == "apply" else z
    e = _err(K.LayoutBufferError, call, [jax.ShapeDtypeStruct(SHAPE, jnp.float32)], [1])
    assert e.field == "leaf '0'" and str(e).startswith("leaf '0' = ")
    if "is abstract" in str(e):  # named after jit refused it: jit's TypeError is the cause
        assert isinstance(e.__cause__, TypeError)
    gone = jnp.asarray(HOST)
    gone.delete()
    e = _err(K.LayoutBufferError, call, [gone], [1])
    why = "was donated to an earlier call: pass the caches that call returned"
    assert str(e) == f"leaf '0' = 'deleted': {why}"
    assert isinstance(e.__cause__, (RuntimeError, ValueError))


def test_zero_local_on_the_tpu_kernel_names_a_leaf_it_cannot_take() -> None:
    """A leaf no call zeroes (zeroed=False) is not planned at construction; zero_local given it plans it
    then, and the TPU kernel's refusal names it by its name in the spec."""
    odd = jax.ShapeDtypeStruct((6, 256), jnp.bfloat16)  # rank-2 bf16: 6 pages, not a multiple of 8
    a = jax.ShapeDtypeStruct((6, 2, 128), jnp.float32)
    spec = NativeCacheSpec((NativeLeaf("a", (6, 2, 128), "float32"),
                            NativeLeaf("odd", (6, 256), "bfloat16", zeroed=False)))
    z = N.CacheZeroer({"a": a, "odd": odd}, spec=spec, kernel="tpu", interpret=True)
    leaf = jnp.ones((6, 256), jnp.bfloat16)
    e = _err(K.LayoutBufferError, z.zero_local, [leaf], (1,), jnp.array([1]), jnp.array([True]))
    assert e.field == "leaf 'odd'.shape" and "multiple of 8" in str(e)
