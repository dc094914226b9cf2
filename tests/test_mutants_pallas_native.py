"""Host-side rules of the native-array zeroer that mutation testing checks (issue 25).

The Python around the native kernels (``backends/pallas/native.py``, :class:`CacheZeroer`):
every refusal's full ``field = value: why``, option bounds, the host-id bucket (-1 padding,
never written), the bad-id count, groups, donation, the cached kernel calls, mesh checks and
the routing of ids to page shards, ``lower`` and ``abstract_caches``. Tiny leaves, so the
kernels run fast in interpret mode; every write is checked byte for byte on poisoned leaves
(a pattern with no zero byte) against the NumPy reference, neighbouring pages and leaves of
other groups being the guard bands.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.native import NativeCacheSpec, NativeLeaf, zero_native_numpy

jax = pytest.importorskip("jax")
N = pytest.importorskip("kvlayout.backends.pallas.native")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

Z = N.CacheZeroer
PAGES = 6
A = ((PAGES, 2, 128), "float32")  # one leaf of 1 KiB pages
B = ((PAGES, 4, 64), "bfloat16")  # 512 B pages
ERR = "must be an integer from"


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


def poisoned(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    dt = jnp.dtype(dtype)
    raw = K.poison_pattern(int(np.prod(shape)) * dt.itemsize, seed=seed).copy()
    if dt.itemsize == 2:  # bf16 NaN/Inf patterns quieted by XLA:CPU: clear one exponent bit
        w = raw.view(np.uint16)
        w[(w & 0x7F80) == 0x7F80] &= np.uint16(~0x4000 & 0xFFFF)
    return raw.view(dt).reshape(shape)


def host_leaves(*shapes: tuple[tuple[int, ...], str]) -> list[np.ndarray]:
    return [poisoned(s, d, i + 3) for i, (s, d) in enumerate(shapes)]


def dev(host: list[np.ndarray]) -> list[jax.Array]:
    return [jnp.asarray(a) for a in host]


def same(got: Any, want: np.ndarray) -> bool:
    a, b = np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8)
    if a.shape != b.shape or not np.array_equal(a, b):
        print("differ at", np.flatnonzero(a.reshape(-1) != b.reshape(-1))[:8])
        return False
    return True


def want(z: Any, host: list[np.ndarray], ids: list[int], group: str | None = None) -> list[np.ndarray]:
    ref = [a.copy() for a in host]
    zero_native_numpy(ref, z.spec, ids, group=group)
    return ref


def raises(cls: type[Exception], fn: Any, *args: Any, **kw: Any) -> Any:
    with pytest.raises(cls) as e:
        fn(*args, **kw)
    return e.value


def abstract(*shapes: tuple[tuple[int, ...], str]) -> list[Any]:
    return [jax.ShapeDtypeStruct(s, jnp.dtype(d)) for s, d in shapes]


# ------------------------------------------------------------------------------ pure host helpers
def test_page_axes() -> None:
    """The mesh axes of a spec's first dimension, as a tuple (none when unsplit or empty)."""
    assert N._page_axes(P()) == ()
    assert N._page_axes(P(None, "tp")) == ()
    assert N._page_axes(P("dp")) == ("dp",)
    assert N._page_axes(P(("dp", "tp"), None)) == ("dp", "tp")
    assert N.KERNELS == ("tpu", "triton")


def test_host_bucket_sizes_and_padding() -> None:
    """A power-of-two bucket of at least 8 int32 slots; every slot past the ids is -1."""
    for n in (1, 2, 7, 8, 9, 16, 17, 33):
        host = np.arange(3, 3 + n, dtype=np.int64)
        b = N._host_bucket(host)
        size = max(8, 1 << (n - 1).bit_length())
        assert b.dtype == np.int32 and b.shape == (size,), n
        assert b[:n].tolist() == host.tolist() and b[n:].tolist() == [-1] * (size - n), n
    e = raises(K.BlockIdError, N._host_bucket, np.array([-3, 1], np.int64))
    assert str(e) == "block_ids: id -3 does not fit int32"


# ------------------------------------------------------------------------------ construction
def test_constructor_refusals_name_field_and_value() -> None:
    caches = abstract(A)
    e = raises(K.LayoutBufferError, Z, [])
    assert str(e) == "caches = []: needs at least one array" and e.field == "caches" and e.value == []
    e = raises(K.BackendError, Z, caches, kernel="cuda")
    assert str(e) == "kernel = 'cuda': valid kernels: tpu, triton"
    assert e.field == "kernel" and e.value == "cuda"
    for bad in (1, "no", 0):
        e = raises(K.BackendError, Z, caches, interpret=bad)
        assert str(e) == f"interpret = {bad!r}: must be True, False or None"
        assert e.field == "interpret" and e.value == bad
    for name, lo, hi in (("tile_bytes", 1024, 1 << 26), ("max_inflight", 1, 1 << 16),
                         ("box_elements", 1, 1 << 20), ("num_warps", 1, 32)):
        for bad in (lo - 1, hi + 1, 2 * hi, True, False, 4.0, "8", None):
            e = raises(K.BackendError, Z, caches, **{name: bad})
            assert str(e) == f"{name} = {bad!r}: must be an integer from {lo} to {hi:,}", (name, bad)
            assert e.field == name and e.value == bad
        for good in (lo, hi):
            assert getattr(Z(caches, **{name: good}), name) == good
    for name in ("box_elements", "num_warps"):
        for bad in (3, 6, 12, 31):
            e = raises(K.BackendError, Z, caches, **{name: bad})
            assert str(e) == f"{name} = {bad}: must be a power of two" and e.field == name and e.value == bad
    assert Z(caches, box_elements=1, num_warps=2).box_elements == 1
    e = raises(K.LayoutBufferError, Z, caches, partition_specs=[P()])
    assert str(e) == f"partition_specs = {[P()]!r}: needs a mesh"
    assert e.field == "partition_specs" and e.value == [P()]


def test_constructor_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    caches = abstract(A, B)
    z = Z(caches)
    assert (z.kernel, z.interpret, z.mode, z.serialised) == ("tpu", True, "tpu-interpret", True)
    assert (z.tile_bytes, z.max_inflight, z.box_elements, z.num_warps) == (
        N.DEFAULT_TILE_BYTES, N.DEFAULT_MAX_INFLIGHT, N.DEFAULT_BOX_ELEMENTS, 4)
    assert z.mesh is None and z.pspecs is None and z.shardings is None and z._ids_sharding is None
    assert z.local_shapes == (A[0], B[0]) and z.num_blocks == PAGES and z._calls == {}
    assert z.treedef == jax.tree_util.tree_structure(caches) and z.spec.names == ("0", "1")
    assert z._bad._err is None
    y = Z(caches, kernel="triton", interpret=False, tile_bytes=4096, max_inflight=3, box_elements=64,
          num_warps=8)
    assert (y.kernel, y.interpret, y.mode, y.serialised) == ("triton", False, "native-gpu", False)
    assert (y.tile_bytes, y.max_inflight, y.box_elements, y.num_warps) == (4096, 3, 64, 8)
    assert Z(caches, kernel="triton", interpret=True).mode == "triton-interpret"
    x = Z(caches, kernel="tpu", interpret=False)
    assert (x.mode, x.serialised) == ("native", False)
    monkeypatch.setattr(N, "default_kernel", lambda: ("triton", False))
    assert (Z(caches).kernel, Z(caches).interpret) == ("triton", False)
    assert Z(caches, interpret=True).interpret is True and Z(caches, kernel="tpu").kernel == "tpu"
    # names from the pytree's keys ("leaf" for a lone array)
    assert Z({"k": [caches[0]]}).spec.names == ("k.0",) and Z(caches[0]).spec.names == ("leaf",)


def test_spec_must_describe_these_leaves() -> None:
    caches = abstract(A, B)
    spec = NativeCacheSpec((NativeLeaf("k", *A, group="g"), NativeLeaf("v", *B, zeroed=False)))
    z = Z(caches, spec=spec)
    assert z.spec is spec and z.spec.names == ("k", "v")
    e = raises(K.LayoutBufferError, Z, caches, spec={"leaves": []})
    assert str(e) == "spec = 'dict': must be a kvlayout.native.NativeCacheSpec"
    assert e.field == "spec" and e.value == "dict"
    e = raises(K.LayoutBufferError, Z, caches, "g", spec=spec)
    assert str(e) == "groups = 'g': give groups or a spec, not both"
    assert e.field == "groups" and e.value == "g"
    e = raises(K.LayoutBufferError, Z, caches[:1], spec=spec)
    assert str(e) == "spec.leaves = 2: describes 2 leaves; the caches have 1"
    assert e.field == "spec.leaves" and e.value == 2
    for other, i in (([caches[0], abstract(((PAGES, 4, 65), "bfloat16"))[0]], 1),
                     ([abstract(((PAGES, 2, 128), "int32"))[0], caches[1]], 0)):
        e = raises(K.LayoutBufferError, Z, other, spec=spec)
        leaf, got = spec.leaves[i], other[i]
        assert str(e) == (f"spec.leaves[{i}] = {leaf.name!r}: is {leaf.dtype}{leaf.shape}; cache leaf "
                          f"'{i}' is {jnp.dtype(got.dtype).name}{tuple(got.shape)}")
        assert e.field == f"spec.leaves[{i}]" and e.value == leaf.name


# ------------------------------------------------------------------------------ calls, bytes checked
@pytest.mark.parametrize("kernel", ["tpu", "triton"])
def test_calls_bytes_bad_ids_donation(kernel: str, compiled_steps: Any) -> None:
    """Host ids (validated, deduplicated, -1 padded: never written nor counted) and device ids
    (bad ones counted, never written); every leaf donated; only the ids' pages change."""
    host = host_leaves(A, B)
    caches = dev(host)
    z = Z(caches, kernel=kernel, interpret=True, max_inflight=2)
    out = z(caches, [4, 1, 4])
    assert all(c.is_deleted() for c in caches)
    assert all(same(o, w) for o, w in zip(out, want(z, host, [1, 4])))
    z.check()  # the padding is not counted
    assert z(out, []) is out and z(out, np.zeros((0,), np.int64)) is out
    assert z(out, jnp.zeros((0,), jnp.int32)) is out and not any(c.is_deleted() for c in out)
    out = z(out, jnp.array([5, PAGES, -1, 5, 2**31 - 1], jnp.int32))
    assert all(same(o, w) for o, w in zip(out, want(z, host, [1, 4, 5])))
    e = raises(K.BlockIdError, z.check)
    assert str(e) == "device block_ids: 3 ids outside [0, 6); they wrote nothing" and e.value == 3
    z.check()
    old, dev_ids = out, jnp.array([0], jnp.int32)
    out = z(out, dev_ids)
    assert all(c.is_deleted() for c in old) and not dev_ids.is_deleted()  # the caches donated, not the ids
    z.check()
    for bad in ([PAGES], [-1], [0, 2**32], [True]):
        e = raises(K.BlockIdError, z, out, bad)
        assert e.field.startswith("block_ids") and not any(c.is_deleted() for c in out)
    e = raises(K.BlockIdError, z, out, jnp.zeros((2, 2), jnp.int32))
    assert str(e) == "block_ids: must be a 1-D integer array, got int32(2, 2)"
    out = z(out, np.array([2], np.int64))
    assert all(same(o, w) for o, w in zip(out, want(z, host, [0, 1, 2, 4, 5])))
    assert compiled_steps(z) == 3  # one host bucket, two device batch shapes


def test_tpu_calls_are_serialised(monkeypatch: pytest.MonkeyPatch) -> None:
    """TPU interpret mode runs its steps under the process-wide lock; the GPU path does not."""
    from kvlayout.backends.pallas import zeroer

    seen: list[tuple[bool, str]] = []
    real = N.run_step

    def spy(serialise: bool, fn: Any, *args: Any) -> Any:
        seen.append((serialise, type(fn).__name__))
        return real(serialise, fn, *args)

    monkeypatch.setattr(N, "run_step", spy)
    for kernel, interpret in (("tpu", True), ("triton", True)):
        caches = dev(host_leaves(A))
        z = Z(caches, kernel=kernel, interpret=interpret)
        out = z(caches, [1])
        out = z(out, jnp.array([2], jnp.int32), group="")
        z(out, jnp.array([3], jnp.int32))
    assert [s for s, _ in seen] == [True] * 3 + [False] * 3
    assert not zeroer._TPU_INTERPRET_LOCK.locked()


def test_groups_zero_only_their_leaves() -> None:
    """A group's call zeroes the leaves of that group (an overlaid slot is in both); an unknown
    group is refused before anything runs; a group of no leaf only counts bad ids."""
    host = host_leaves(A, B, A)
    caches = dev(host)
    z = Z(caches, [("full", "swa"), "full", "swa"], kernel="triton", interpret=True)
    out = z(caches, [1, 3], group="swa")
    assert all(same(o, w) for o, w in zip(out, want(z, host, [1, 3], group="swa")))
    out = z(out, jnp.array([0, 9], jnp.int32), group="full")
    exp = want(z, want(z, host, [1, 3], group="swa"), [0], group="full")
    assert all(same(o, w) for o, w in zip(out, exp))
    e = raises(K.SpecError, z, out, [2], group="mla")
    assert "no such group" in str(e) and not any(c.is_deleted() for c in out)
    assert z._selected("swa") == (0, 2) and z._selected("full") == (0, 1) and z._selected(None) == (0, 1, 2)
    e = raises(K.BlockIdError, z.check)
    assert e.value == 1
    spec = NativeCacheSpec((NativeLeaf("k", *A, zeroed=False),))
    cold = Z(abstract(A), spec=spec, kernel="tpu", interpret=True)
    data = dev(host_leaves(A))
    leaves, bad = jax.jit(cold.apply)(data, jnp.array([1, 7, -2], jnp.int32))
    assert int(bad) == 2 and same(leaves[0], host_leaves(A)[0])


def test_apply_traceable_counts_and_empty() -> None:
    """apply returns (caches, bad count) as an int32 scalar: the direct GPU path counts in the
    kernel, the sorted path counts ids outside [0, num_blocks); no ids: 0, nothing written."""
    for kernel in ("triton", "tpu"):
        host = host_leaves(A, B)
        z = Z(dev(host), kernel=kernel, interpret=True)
        out, bad = jax.jit(z.apply, donate_argnums=0)(dev(host), jnp.array([2, -4, 2, 6, 0], jnp.int32))
        assert int(bad) == 2 and bad.dtype == jnp.int32 and bad.shape == ()
        assert all(same(o, w) for o, w in zip(out, want(z, host, [0, 2])))
        out, bad = z.apply(out, jnp.zeros((0,), jnp.int32))
        assert int(bad) == 0 and bad.dtype == jnp.int32 and bad.shape == ()
        out, bad = z.apply(out, [5, 2**40, -1])  # host ids narrowed without wrapping
        assert int(bad) == 2
        assert all(same(o, w) for o, w in zip(out, want(z, host, [0, 2, 5])))
        z.check()  # apply keeps no count


def test_wide_device_ids_take_the_sorted_path() -> None:
    """x64 on: int64 device ids beyond int32 are bad ids, never wrapped (2**32 + 3 is not 3)."""
    with jax.enable_x64(True):
        for kernel in ("triton", "tpu"):
            host = host_leaves(A)
            z = Z(dev(host), kernel=kernel, interpret=True)
            out = z(dev(host), jnp.array([2**32 + 3, 1, -(2**32) + 2], jnp.int64))
            assert same(out[0], want(z, host, [1])[0])
            e = raises(K.BlockIdError, z.check)
            assert e.value == 2


def test_check_caches_refusals() -> None:
    host = host_leaves(A, B)
    caches = dev(host)
    z = Z(caches)
    e = raises(K.LayoutBufferError, z, caches[:1], [0])
    assert str(e) == f"caches = {str(jax.tree_util.tree_structure(caches[:1]))!r}: must have the structure " \
        f"{z.treedef}" and e.field == "caches"
    e = raises(K.LayoutBufferError, z, [caches[0], jnp.zeros((PAGES, 4, 63), jnp.bfloat16)], [0])
    assert str(e) == "leaf '1' = bfloat16(6, 4, 63): must be bfloat16(6, 4, 64)"
    assert e.field == "leaf '1'" and e.value == "bfloat16(6, 4, 63)"
    e = raises(K.LayoutBufferError, z, [caches[0].astype(jnp.int32), caches[1]], [0])
    assert str(e) == "leaf '0' = int32(6, 2, 128): must be float32(6, 2, 128)"
    assert z.check_caches(caches) == caches
    assert z.check_caches(abstract(A, B), shardings=True) == abstract(A, B)
    assert not any(c.is_deleted() for c in caches)


def test_donated_caches_name_the_leaf(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caches an earlier call donated: a LayoutBufferError naming the first deleted leaf;
    leaves on several devices without a mesh: one naming the devices; else JAX's error."""
    host = host_leaves(A, B)
    caches = dev(host)
    z = Z(caches, kernel="triton", interpret=True)
    new = z(caches, [1])
    for ids in ([2], jnp.array([2], jnp.int32)):
        e = raises(K.LayoutBufferError, z, caches, ids)
        why = "was donated to an earlier call: pass the caches that call returned"
        assert str(e) == f"leaf '0' = 'deleted': {why}"
        assert e.field == "leaf '0'" and e.value == "deleted"
        assert isinstance(e.__cause__, (ValueError, RuntimeError))
    mixed = [new[0], caches[1]]
    e = raises(K.LayoutBufferError, z, mixed, [2])
    assert e.field == "leaf '1'" and not new[0].is_deleted()  # nothing ran
    z._diagnose(new[1:], ValueError("x"))  # nothing deleted, one device: JAX's error stands

    class Fake:
        def __init__(self, devs: list[str]) -> None:
            self.devs = devs

        def is_deleted(self) -> bool:
            return False

        def devices(self) -> list[str]:
            return self.devs

    monkeypatch.setattr(N.jax, "Array", Fake)
    err = ValueError("jax")
    e = raises(K.LayoutBufferError, z._diagnose, [Fake(["d0"]), Fake(["d1", "d0"])], err)
    why = ("leaves are on several devices (leaf '0' on d0, leaf '1' on d1); "
           "give a mesh to zero a sharded cache")
    assert str(e) == f"caches = 'several devices': {why}" and e.field == "caches" and e.__cause__ is err
    four = Z(abstract(A, A, A, A))
    e = raises(K.LayoutBufferError, four._diagnose, [Fake(["a"]), Fake(["b"]), Fake(["c"]), Fake(["d"])], err)
    assert "(leaf '0' on a, leaf '1' on b, leaf '2' on c);" in str(e)
    four._diagnose([Fake(["a"]), Fake(["a"]), 1, Fake(["a"])], err)
    four.mesh = object()
    four._diagnose([Fake(["a"]), Fake(["b"]), 1, Fake(["c"])], err)  # a mesh: several devices are fine


def test_diagnose_runs_only_on_jax_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ValueError or RuntimeError from the step is diagnosed, then re-raised as it is."""
    caches = dev(host_leaves(A))
    z = Z(caches, kernel="triton", interpret=True)
    seen: list[Exception] = []
    monkeypatch.setattr(z, "_diagnose", lambda c, e: seen.append(e))
    for cls in (ValueError, RuntimeError):
        def boom(*a: Any, cls: type[Exception] = cls, **k: Any) -> Any:
            raise cls("no")
        monkeypatch.setattr(z, "_host_step", boom)
        monkeypatch.setattr(z, "_step", boom)
        for ids in ([1], jnp.array([1], jnp.int32)):
            raises(cls, z, caches, ids)
    assert [type(e) for e in seen] == [ValueError, ValueError, RuntimeError, RuntimeError]


# ------------------------------------------------------------------------------ cached kernel calls
def test_kernel_calls_cached_with_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """One kernel per (leaves, padded id count) or per leaves for the direct GPU call, built
    with the zeroer's options; TPU ids padded up to whole steps of the plan."""
    built: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def rec(kind: str) -> Any:
        def f(*args: Any, **kw: Any) -> str:
            built.append((kind, args, kw))
            return f"{kind}{len(built)}"
        return f

    monkeypatch.setattr(N, "tpu_native_call", rec("tpu"))
    monkeypatch.setattr(N, "triton_native_call", rec("triton"))
    z = Z(abstract(A, B, ((PAGES, 8, 128), "uint8")), kernel="tpu", interpret=True, tile_bytes=2048,
          max_inflight=24)
    plan = N.plan_tpu([(A[0], A[1]), (B[0], B[1])], tile_bytes=2048, names=["0", "1"])
    step = N.ids_per_step_for(plan, 24)
    assert step > 1
    f, n_pad = z._call_for((0, 1), step + 1)
    assert (f, n_pad) == ("tpu1", 2 * step) and z._call_for((0, 1), step + 1) == ("tpu1", 2 * step)
    assert z._call_for((0, 1), step) == ("tpu2", step)
    assert built[0][1][0] == plan and built[0][1][1:3] == (2 * step, step) and built[0][2] == {}
    assert built[0][1][3].detect_races is True and built[0][1][3].uninitialized_memory == "nan"
    assert z._call_for((2,), 1)[0] == "tpu3" and len(z._calls) == 3
    x = Z(abstract(A), kernel="tpu", interpret=False)
    x._call_for((0,), 4)
    assert built[-1][1][3] is False
    y = Z(abstract(A, B), kernel="triton", interpret=False, box_elements=64, num_warps=8)
    assert y._call_for((1,), 5) == ("triton5", 5) and y._call_for((1,), 5)[0] == "triton5"
    assert built[-1][1] == (N.plan_triton([(B[0], B[1])], 64), PAGES, 8, False) and built[-1][2] == {}
    assert y._direct_call((0, 1)) == "triton6" and y._direct_call((0, 1)) == "triton6"
    assert built[-1][1] == (N.plan_triton([A, B], 64), PAGES, 8, False) and built[-1][2] == {"direct": True}
    assert y._call_for((0, 1), 5)[0] == "triton7" and len(built) == 7
    w = Z(abstract(A), kernel="triton", interpret=True)
    w._direct_call((0,))
    assert built[-1][1][1:] == (PAGES, 4, True)


def test_zero_local_pads_with_slots_never_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TPU path: valid ids sorted (invalid ones as num_blocks, last), each id taken once,
    the count of valid slots, padded to n_pad with num_blocks / not taken."""
    seen: list[tuple[Any, ...]] = []

    def fake(sel: tuple[int, ...], n: int) -> tuple[Any, int]:
        def f(s: Any, take: Any, count: Any, *leaves: Any) -> Any:
            seen.append((s, take, count))
            return leaves
        return f, 8

    z = Z(abstract(A), kernel="tpu", interpret=True)
    monkeypatch.setattr(z, "_call_for", fake)
    leaves = dev(host_leaves(A))
    ids = jnp.array([4, 1, 4, 0, 5], jnp.int32)
    ok = jnp.array([True, True, True, False, True])
    assert z.zero_local(leaves, (0,), ids, ok) == leaves
    s, take, count = seen[0]
    assert s.dtype == take.dtype == count.dtype == jnp.int32 and count.shape == (1,)
    assert s.tolist() == [1, 4, 4, 5, PAGES, PAGES, PAGES, PAGES]
    assert take.tolist() == [1, 1, 0, 1, 1, 0, 0, 0] and count.tolist() == [4]
    monkeypatch.setattr(z, "_call_for", lambda sel, n: (fake(sel, n)[0], n))
    z.zero_local(leaves, (0,), ids[:2], ok[:2])
    assert seen[1][0].tolist() == [1, 4] and seen[1][1].tolist() == [1, 1] and seen[1][2].tolist() == [2]
    # the GPU path: invalid slots become -1 (skipped by the kernel), no sort
    y = Z(abstract(A), kernel="triton", interpret=True)
    got: list[Any] = []
    monkeypatch.setattr(y, "_direct_call", lambda sel: lambda i, *lv: (got.append(i) or lv, None))
    assert y.zero_local(leaves, (0,), ids, ok) == leaves
    assert got[0].dtype == jnp.int32 and got[0].tolist() == [4, 1, 4, -1, 5]


# ------------------------------------------------------------------------------ mesh
def mesh1(*axes: str) -> Mesh:
    return Mesh(np.array(jax.devices()[:1]).reshape((1,) * len(axes)), axes)


def test_mesh_refusals() -> None:
    caches = abstract(A, B)
    m = mesh1("dp", "tp")
    e = raises(K.LayoutBufferError, Z, caches, mesh="m")
    assert str(e) == "mesh = 'str': must be a jax.sharding.Mesh" and e.field == "mesh" and e.value == "str"
    e = raises(K.LayoutBufferError, Z, caches, mesh=m)
    assert str(e) == ("leaf '0'.sharding = 'None': must be a NamedSharding over the mesh (or pass "
                      "partition_specs)") and e.field == "leaf '0'.sharding" and e.value == "None"
    for specs in ([P("dp")], [P("dp"), P(), P()], [P("dp"), None], (P(), "dp")):
        e = raises(K.LayoutBufferError, Z, caches, mesh=m, partition_specs=specs)
        assert str(e) == f"partition_specs = {specs!r}: needs one PartitionSpec per leaf (2)"
        assert e.field == "partition_specs" and e.value == specs
    why = ("the page axis must be split over mesh axes in mesh order (dp, tp), "
           "as ShardedLayout numbers block shards")
    for bad in (P(("tp", "dp")), P("zz"), P(("dp", "zz"))):
        e = raises(K.LayoutBufferError, Z, caches, mesh=m, partition_specs=[P(), bad])
        assert str(e) == f"leaf '1'.sharding = {str(bad)!r}: {why}"
        assert e.field == "leaf '1'.sharding" and e.value == str(bad)
    e = raises(K.LayoutBufferError, Z, caches, mesh=m, partition_specs=[P(None, "zz"), P()])
    assert e.field == "leaf '0'.sharding" and e.value == str(P(None, "zz"))
    assert str(e).startswith(f"leaf '0'.sharding = {str(P(None, 'zz'))!r}: ") and "zz" in str(e)[40:]


def test_mesh_attributes_and_shardings() -> None:
    m = mesh1("dp", "tp")
    specs = [P(("dp", "tp")), P(None, "tp")]
    z = Z(abstract(A, B), mesh=m, partition_specs=specs)
    assert z.mesh is m and z.pspecs == tuple(specs) and z.local_shapes == (A[0], B[0])
    assert z.shardings == tuple(NamedSharding(m, s) for s in specs)
    assert z._ids_sharding == NamedSharding(m, P())
    host = host_leaves(A, B)
    placed = [jax.device_put(a, s) for a, s in zip(host, z.shardings)]
    y = Z(placed, mesh=m, kernel="triton", interpret=True)
    assert y.pspecs == tuple(specs)
    out = y(placed, [3, 0])
    assert all(same(o, w) for o, w in zip(out, want(y, host, [0, 3])))
    out = y(out, jnp.array([5, 7], jnp.int32))
    assert all(same(o, w) for o, w in zip(out, want(y, host, [0, 3, 5])))
    assert all(o.sharding.is_equivalent_to(s, o.ndim) for o, s in zip(out, z.shardings))
    raises(K.BlockIdError, y.check)
    assert y.check_caches(out, shardings=True) == out
    # an abstract leaf has no sharding to check
    assert y.check_caches([abstract(A)[0], out[1]], shardings=True)[1] is out[1]
    # a group with no leaf under a mesh only counts
    g = Z(placed[:1], "late", mesh=m, kernel="triton", interpret=True)
    assert g._selected("late") == (0,)


def test_interpret_mesh_with_cpu0_is_refused() -> None:
    """TPU interpret mode refuses a mesh of several devices that holds cpu:0 (it deadlocks)."""
    cpu0 = jax.local_devices(backend="cpu")[0]

    class FakeMesh:
        def __init__(self, devs: list[Any]) -> None:
            self.devices = np.array(devs, dtype=object)

    z = Z(abstract(A), kernel="tpu", interpret=True)
    e = raises(K.BackendError, z._check_interpret_mesh, FakeMesh([object(), cpu0]))
    assert str(e) == ("pallas TPU interpret mode under shard_map deadlocks when the mesh includes cpu:0: "
                      "build the mesh from jax.devices()[1:] (force one more host device), "
                      "or pass kernel='triton'")
    assert e.field == "mesh" and e.value == str(cpu0)
    z._check_interpret_mesh(FakeMesh([cpu0]))  # one device: fine
    z._check_interpret_mesh(FakeMesh([object(), object()]))  # no cpu:0
    for kw in ({"kernel": "triton", "interpret": True}, {"kernel": "tpu", "interpret": False}):
        Z(abstract(A), **kw)._check_interpret_mesh(FakeMesh([object(), cpu0]))
    m = mesh1("dp")
    assert Z(abstract(A), mesh=m, partition_specs=[P("dp")], kernel="tpu", interpret=True).mesh is m


def test_shard_body_routes_ids_to_page_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside shard_map (simulated with vmap over named axes): a leaf split over page axes
    (row-major over them) zeroes only the ids its shard owns, at local page ids - lo; an
    unsplit leaf zeroes every valid id; leaves split alike share one call."""
    dp, tp = 2, 3
    glob = 12
    specs = (P("dp"), P(("dp", "tp")), P(None, "tp"), P("dp"))
    z = Z(abstract(((glob, 4), "float32"), ((glob, 4), "float32"), ((glob, 3), "float32"),
                   ((glob, 4), "float32")), kernel="triton", interpret=True)
    z.local_shapes = ((glob // dp, 4), (glob // (dp * tp), 4), (glob, 1), (glob // dp, 4))
    calls: list[tuple[int, ...]] = []

    def fake_local(leaves: list[Any], sel: tuple[int, ...], ids: Any, valid: Any) -> list[Any]:
        """zero_local's contract: int32 local ids, valid ones inside the shard (else NaN)."""
        assert ids.dtype == jnp.int32 and valid.dtype == jnp.bool_
        calls.append(sel)
        out = []
        for leaf in leaves:
            hit = (jnp.arange(leaf.shape[0])[:, None] == ids[None, :]) & valid[None, :]
            outside = jnp.any(valid & ((ids < 0) | (ids >= leaf.shape[0])))
            out.append(jnp.where(hit.any(axis=1)[:, None], 0.0, leaf) + jnp.where(outside, jnp.nan, 0.0))
        return out

    monkeypatch.setattr(z, "zero_local", fake_local)

    class FakeMesh:
        axis_names = ("dp", "tp")
        devices = np.zeros((dp, tp))

    body = z._shard_body((0, 1, 2, 3), FakeMesh(), specs)  # type: ignore[arg-type]
    ids = jnp.array([0, 5, 6, 11, 13, -1, 7, 3, 4], jnp.int32)
    ok = (ids >= 0) & (ids < glob) & (jnp.arange(9) != 8)  # slot 8 (id 4) masked off
    valid = [0, 5, 6, 11, 7, 3]

    def shard(*locals_: Any) -> Any:
        return body(list(locals_), ids, ok)

    inner = jax.vmap(shard, axis_name="tp")
    outer = jax.jit(jax.vmap(inner, axis_name="dp"))
    ones = [jnp.ones((dp, tp) + s, jnp.float32) for s in z.local_shapes]
    with jax.enable_x64(True):  # the shard's first page stays int32 (no float, no int64)
        outer(*ones)
    calls.clear()
    out = outer(*ones)
    assert sorted(calls) == [(0, 3), (1,), (2,)]  # grouped by page axes, in the order of sel
    for k, (spec, o) in enumerate(zip(specs, out)):
        for i in range(dp):
            for j in range(tp):
                local = np.asarray(o[i, j, :, 0])
                bps = z.local_shapes[k][0]
                axes = N._page_axes(spec)
                shard_no = {(): 0, ("dp",): i, ("dp", "tp"): i * tp + j}[axes]
                lo = shard_no * bps
                exp = [0.0 if lo + p in valid else 1.0 for p in range(bps)]
                assert local.tolist() == exp, (k, i, j)


# ------------------------------------------------------------------------------ lower, abstract
def test_lower_and_abstract_caches() -> None:
    z = Z(abstract(A, B), kernel="triton", interpret=True)
    for bad in (-1, 2**31, 1.0, True, "4", None):
        e = raises(K.BlockIdError, z.lower, bad)
        assert e.field == "num_ids" and e.value == bad
    low = z.lower(4)
    assert [(a.shape, a.dtype, a.donated) for a in low.args_info[0][0]] == [
        (A[0], jnp.dtype(A[1]), True), (B[0], jnp.dtype(B[1]), True)]
    assert (low.args_info[0][1].shape, low.args_info[0][1].dtype) == ((4,), jnp.int32)
    assert "sdy.sharding" not in low.as_text()
    d = jax.devices()[0]
    on = z.lower(0, device=d).as_text()
    assert on.count("sdy.sharding") >= 3
    ab = z.abstract_caches()
    assert [(a.shape, a.dtype, a.sharding) for a in ab] == [(A[0], jnp.dtype(A[1]), None),
                                                             (B[0], jnp.dtype(B[1]), None)]
    ab = z.abstract_caches(d)
    assert all(a.sharding == jax.sharding.SingleDeviceSharding(d) for a in ab)
    g = Z(abstract(A, B), ["x", "y"], kernel="triton", interpret=True)
    text = g.lower(3, group="y").as_text()
    assert "tensor<3xi32>" in text
    m = mesh1("dp")
    y = Z(abstract(A, B), mesh=m, partition_specs=[P("dp"), P()], kernel="triton", interpret=True)
    ab = y.abstract_caches(d)
    assert [a.sharding for a in ab] == list(y.shardings)
    text = y.lower(2).as_text()
    assert text.count("sdy.sharding") >= 3 and "tensor<2xi32>" in text


# ------------------------------------------------------------------------------ leaf_backend
def test_leaf_backend_holds_the_leaf_bytes() -> None:
    """A leaf's one-row buffer at an offset, guard bytes on both sides kept; the table must be
    the leaf's own; the mode and the kwargs are the zeroer's."""
    leaf = NativeLeaf("k", (PAGES, 4, 64), "int32", group="g")
    cls = N.leaf_backend(leaf, kernel="triton", interpret=True)
    assert cls.name == "pallas-native" and cls.extra == "pallas"
    t = leaf.table()
    data = K.poison_pattern(leaf.total_bytes + 200, seed=5).copy()
    b = cls.from_host(t, data, offset=100)
    assert b.mode == "triton-interpret" and b.offset == 100 and b.table is t
    assert b.zeroer.spec.groups == ("g",)
    b.zero([4, 1])
    b.zero([2], group="g")
    exp = data.copy()
    K.zero_blocks_numpy(exp, t, [1, 2, 4], offset=100)
    assert np.array_equal(b.to_host(), exp)
    other = NativeLeaf("k", (PAGES, 4, 32), "int32").table()
    e = raises(K.LayoutBufferError, cls, other, data)
    assert str(e) == f"table = {len(other)}: must be the one-row table of leaf 'k'" and e.field == "table"
    assert N.leaf_backend(leaf).from_host(t, data).mode == "tpu-interpret"


def test_sharding_check_on_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a mesh, a call checks each concrete leaf's sharding against the zeroer's first
    (by equivalence); abstract leaves carry none to check; without a mesh nothing is checked."""
    m = mesh1("dp")
    z = Z(abstract(A, B), mesh=m, partition_specs=[P("dp"), P()], kernel="triton", interpret=True)

    class Fake:
        def __init__(self, shape: tuple[int, ...], dtype: str, sharding: Any) -> None:
            self.shape, self.dtype, self.sharding = shape, jnp.dtype(dtype), sharding

    monkeypatch.setattr(N.jax, "Array", Fake)
    good = [Fake(*A, z.shardings[0]), Fake(*B, z.shardings[1])]
    assert z.check_caches(good, shardings=True) == good
    for k, bad in ((0, "dp"), (1, None)):
        leaves = list(good)
        leaves[k] = Fake(*(A, B)[k], bad)
        e = raises(K.LayoutBufferError, z.check_caches, leaves, shardings=True)
        assert str(e) == (f"leaf '{k}'.sharding = {str(bad)!r}: must be {z.shardings[k]} "
                          "(jax.device_put(leaf, z.shardings[i]))")
        assert e.field == f"leaf '{k}'.sharding" and e.value == str(bad)
        assert z.check_caches(leaves) == leaves  # only with shardings=True
        e = raises(K.LayoutBufferError, z, leaves, [1])
        assert e.field == f"leaf '{k}'.sharding"
    y = Z(abstract(A, B), kernel="triton", interpret=True)
    assert y.check_caches([Fake(*A, None), Fake(*B, None)], shardings=True)[0].sharding is None
    host = [np.zeros(A[0], np.float32), np.zeros(B[0], jnp.bfloat16)]  # no sharding attribute at all
    assert z.check_caches(host, shardings=True) == host
    ndims: list[Any] = []

    class Sharding:
        def is_equivalent_to(self, other: Any, ndim: Any) -> bool:
            ndims.append(ndim)
            return True

    monkeypatch.setattr(N.jax.sharding, "Sharding", Sharding)
    z.check_caches([Fake(*A, Sharding()), Fake(*B, Sharding())], shardings=True)
    assert ndims == [3, 3]  # compared at the leaf's rank


def test_mesh_leaf_shardings_shown_as_they_are() -> None:
    """Without partition_specs every leaf needs a NamedSharding: a leaf with none (a NumPy
    array) or another kind is refused showing that sharding."""
    m = mesh1("dp")
    e = raises(K.LayoutBufferError, Z, [np.zeros(A[0], np.float32)], mesh=m)
    assert e.field == "leaf '0'.sharding" and e.value == "None"
    single = jnp.zeros(A[0], jnp.float32)
    e = raises(K.LayoutBufferError, Z, [single], mesh=m)
    assert e.field == "leaf '0'.sharding" and e.value == str(single.sharding) != "None"
    assert str(e).startswith(f"leaf '0'.sharding = {str(single.sharding)!r}: must be a NamedSharding")


def test_interpret_mesh_looks_for_the_cpu_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device checked is the first local device of the cpu backend (not the default one)."""
    cpu0 = jax.local_devices(backend="cpu")[0]
    other = object()
    monkeypatch.setattr(N.jax, "local_devices", lambda backend=None: [cpu0] if backend == "cpu" else [other])

    class FakeMesh:
        devices = np.array([other, cpu0], dtype=object)

    z = Z(abstract(A), kernel="tpu", interpret=True)
    e = raises(K.BackendError, z._check_interpret_mesh, FakeMesh())
    assert e.value == str(cpu0)


def test_plan_names_the_leaf_and_takes_tile_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TPU plan is made with the zeroer's tile budget and the leaves' own names (its
    refusals name the leaf, not its position in the call)."""
    odd = jnp.zeros((PAGES, 256), jnp.bfloat16)
    caches = {"a": jnp.zeros(A[0], jnp.float32), "odd": odd}
    e = raises(K.LayoutBufferError, Z, caches, kernel="tpu", interpret=True)  # at construction (pass 16)
    assert e.field == "leaf 'odd'.shape" and not odd.is_deleted()
    plans: list[Any] = []
    monkeypatch.setattr(N, "tpu_native_call", lambda plan, *a: plans.append(plan) or "f")
    big = ((PAGES, 16, 8, 128), "float32")  # 64 KiB pages: chunked under a 1 KiB tile budget
    y = Z(abstract(big), kernel="tpu", interpret=True, tile_bytes=1024)
    y._call_for((0,), 1)
    want_plan = N.plan_tpu([big], tile_bytes=1024, names=["0"])
    assert plans == [want_plan] and want_plan != N.plan_tpu([big], names=["0"])


def test_zero_local_ids_stay_int32_with_x64(monkeypatch: pytest.MonkeyPatch) -> None:
    """x64 on: the sorted ids and their padding stay int32 (the kernel's operand type)."""
    seen: list[Any] = []

    def fake(sel: tuple[int, ...], n: int) -> tuple[Any, int]:
        return (lambda s, take, count, *leaves: seen.append(s) or leaves), n + 3

    with jax.enable_x64(True):
        z = Z(abstract(A), kernel="tpu", interpret=True)
        monkeypatch.setattr(z, "_call_for", fake)
        leaves = dev(host_leaves(A))
        z.zero_local(leaves, (0,), jnp.array([3, 1], jnp.int64), jnp.array([True, True]))
        assert seen[0].dtype == jnp.int32 and seen[0].tolist() == [1, 3, PAGES, PAGES, PAGES]


def test_apply_paths_and_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a mesh the GPU kernel takes int32 device ids as they are (one launch, it counts
    the bad ones); the TPU kernel, wider ids and a mesh take the range-checked path (bad slots
    -1 for the GPU call); with a mesh the ids go through shard_map with each leaf's spec.
    apply and lower take the group (an unknown one is refused)."""
    host = host_leaves(A, B)
    for kernel, x64, direct in (("triton", False, True), ("tpu", False, False), ("triton", True, False)):
        with jax.enable_x64(x64):
            z = Z(dev(host), kernel=kernel, interpret=True)
            seen: list[list[int]] = []
            real = z._direct_call

            def spy(sel: tuple[int, ...], real: Any = real, seen: list[list[int]] = seen) -> Any:
                f = real(sel)
                return lambda i, *lv: (seen.append(np.asarray(i).tolist()), f(i, *lv))[1]

            monkeypatch.setattr(z, "_direct_call", spy)
            ids = jnp.array([2, 9, 0], jnp.int64 if x64 else jnp.int32)
            out, bad = z.apply(dev(host), ids)
            assert int(bad) == 1 and all(same(o, w) for o, w in zip(out, want(z, host, [0, 2])))
            exp = [[2, 9, 0]] if direct else [[2, -1, 0]] if kernel == "triton" else []
            assert seen == exp, (kernel, x64)
    g = Z(dev(host), ["x", "y"], kernel="triton", interpret=True)
    out, bad = g.apply(dev(host), jnp.array([1], jnp.int32), group="y")
    assert same(out[0], host[0]) and all(same(o, w) for o, w in zip(out, want(g, host, [1], group="y")))
    for fn, args in ((g.apply, (dev(host), [1])), (g.lower, (3,))):
        e = raises(K.SpecError, fn, *args, group="nope")
        assert "no such group" in str(e)
    assert "no such group" in str(raises(K.SpecError, g, dev(host), [], group="nope"))
    assert "no such group" in str(raises(K.SpecError, g, dev(host), np.zeros((0,), np.int64), group="nope"))
    m = mesh1("dp")
    y = Z(abstract(A, B), mesh=m, partition_specs=[P("dp"), P()], kernel="triton", interpret=True)
    bodies: list[Any] = []
    real_body = y._shard_body
    monkeypatch.setattr(y, "_shard_body", lambda *a: bodies.append(a[0]) or real_body(*a))
    jaxpr = jax.make_jaxpr(y.apply)(abstract(A, B), jax.ShapeDtypeStruct((3,), jnp.int32))
    (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "shard_map"]
    assert eqn.params["in_specs"] == (P("dp"), P(), P(), P()) and eqn.params["check_vma"] is False
    assert bodies == [(0, 1)]


def test_host_ids_placed_for_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Host ids go to the step as the padded NumPy bucket (its call transfers them), or
    with a mesh replicated over it (NamedSharding(mesh, P()))."""
    seen: list[Any] = []
    real = N.run_step
    monkeypatch.setattr(N, "run_step", lambda s, fn, c, ids, *a: seen.append(ids) or real(s, fn, c, ids, *a))
    host = host_leaves(A)
    z = Z(dev(host), kernel="triton", interpret=True)
    z(dev(host), [3])
    assert isinstance(seen[0], np.ndarray) and seen[0].tolist() == [3] + [-1] * 7
    m = mesh1("dp")
    placed = [jax.device_put(host[0], NamedSharding(m, P("dp")))]
    y = Z(placed, mesh=m, kernel="triton", interpret=True)
    out = y(placed, [4, 1])
    assert isinstance(seen[1], jax.Array) and seen[1].sharding == NamedSharding(m, P())
    assert seen[1].tolist() == [1, 4] + [-1] * 6 and same(out[0], want(y, host, [1, 4])[0])


def test_lower_places_the_ids() -> None:
    """lower's ids operand: on the given device, replicated over the mesh, or unplaced."""
    z = Z(abstract(A), kernel="triton", interpret=True)
    assert not re.search(r"tensor<5xi32> \{sdy", z.lower(5).as_text())
    assert re.search(r"tensor<5xi32> \{sdy\.sharding", z.lower(5, device=jax.devices()[0]).as_text())
    m = mesh1("dp")
    y = Z(abstract(A), mesh=m, partition_specs=[P("dp")], kernel="triton", interpret=True)
    assert re.search(r"tensor<5xi32> \{sdy\.sharding", y.lower(5).as_text())


def test_leaf_backend_defaults_and_group() -> None:
    leaf = NativeLeaf("k", (PAGES, 4, 64), "int32", group="g")
    cls = N.leaf_backend(leaf, kernel="triton", interpret=True)
    t = leaf.table()
    data = K.poison_pattern(leaf.total_bytes, seed=2).copy()
    b = cls(t, data)
    assert b.offset == 0
    e = raises(K.SpecError, b.zero, [1], group="nope")
    assert "no such group" in str(e)
    b.zero([3], group="g")
    exp = data.copy()
    K.zero_blocks_numpy(exp, t, [3])
    assert np.array_equal(b.to_host(), exp)


def test_a_zeroed_leaf_of_a_dtype_without_zero_is_refused() -> None:
    """float8_e8m0fnu has no zero: the kernels' value 0 rounds to 0xff (NaN), so a zeroed leaf of it
    is refused before anything runs; a leaf zeroing never touches may be of it (issue 25)."""
    from kvlayout.errors import LayoutBufferError
    from kvlayout.native import NativeCacheSpec, NativeLeaf

    with pytest.raises(LayoutBufferError) as e:
        N.CacheZeroer({"k": jnp.zeros((4, 8), "float8_e8m0fnu")})
    assert (e.value.field, e.value.value) == ("leaf 'k'.dtype", "float8_e8m0fnu")
    spec = NativeCacheSpec((NativeLeaf("s", (4, 8), "float8_e8m0fnu", zeroed=False),))
    assert N.CacheZeroer([jnp.zeros((4, 8), "float8_e8m0fnu")], spec=spec).spec == spec
