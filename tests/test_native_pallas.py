"""CacheZeroer on CPU: the TPU kernel in interpret mode (race detection, NaN scratch), the
Pallas-Triton kernel interpreted, their NumPy models, and the real Mosaic compiler.

Every leaf starts as a poisoned pattern with no zero byte (``K.poison_pattern``); after each
run every leaf must equal the NumPy reference (``zero_native_numpy``, through the leaf's
one-row table) byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlayout as K
from kvlayout.native import expected_zeroed_native, zero_native_numpy
from tests.mosaic_compile import run_check

jax = pytest.importorskip("jax")
kp = pytest.importorskip("kvlayout.backends.pallas")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from kvlayout.backends.pallas import native_kernels as nk  # noqa: E402

N = 8  # pages per leaf: TPU interpret mode costs ~2.5 ms per DMA

#: every shape the issue names, with tiny pages: tpu-inference attention (bf16 packing 2, fp8
#: packing 4), MLA, DeepSeek-V4 uint8 roles, and arbitrary ranks (2 to 6) and dtypes
SHAPES: dict[str, tuple[tuple[int, ...], str]] = {
    "attn_bf16": ((N, 4, 2, 2, 128), "bfloat16"),
    "attn_fp8": ((N, 4, 1, 4, 128), "float8_e4m3fn"),
    "mla": ((N, 1, 32, 640), "bfloat16"),
    "v4_nope": ((N, 4, 4, 128), "uint8"),
    "v4_indexer": ((N, 1, 4, 256), "uint8"),
    "rank2_f32": ((N, 200), "float32"),
    "rank2_bf16": ((N, 256), "bfloat16"),
    "rank2_u8": ((N, 512), "uint8"),
    "rank3_i32": ((N, 3, 40), "int32"),
    "rank6_f16": ((N, 2, 3, 2, 4, 8), "float16"),
}


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


def poisoned(shape: Sequence[int], dtype: str, seed: int, *, finite: bool = False) -> np.ndarray:
    """A host array of the no-zero-byte pattern. ``finite``: 16-bit float NaN/Inf patterns get
    one exponent bit cleared (plain Pallas interpret runs bf16 stores through XLA:CPU, which
    quiets NaN payloads; the TPU interpreter moves bytes and needs no such care)."""
    dt = jnp.dtype(dtype)
    raw = K.poison_pattern(int(np.prod(shape)) * dt.itemsize, seed=seed).copy()
    if finite and dt.itemsize == 2 and dt.kind == "V" or finite and dt.name in ("bfloat16", "float16"):
        w = raw.view(np.uint16)
        exp = 0x7F80 if dt.name == "bfloat16" else 0x7C00
        w[(w & exp) == exp] &= np.uint16(~0x4000 & 0xFFFF)  # high byte keeps a set bit: no zero byte
    return raw.view(dt).reshape(tuple(shape))


def host_cache(names: Sequence[str], *, finite: bool = False, shapes: dict | None = None) -> list[np.ndarray]:
    shapes = shapes or SHAPES
    return [poisoned(*shapes[n], seed=i, finite=finite) for i, n in enumerate(names)]


def same_bytes(a: Any, b: np.ndarray) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def run(
    names: Sequence[str],
    batches: Sequence[Any],
    *,
    groups: Any = None,
    group: str | None = None,
    shapes: dict | None = None,
    **kw: Any,
) -> tuple[Any, list[np.ndarray], list[Any]]:
    """Zero every batch (lists: host ids, tuples: device ids) on a poisoned cache; check that
    every call donates, and that every leaf equals the NumPy reference of the valid ids."""
    finite = kw.get("kernel") == "triton"
    host = host_cache(names, finite=finite, shapes=shapes)
    caches = [jnp.asarray(a) for a in host]
    z = kp.CacheZeroer(caches, groups, **kw)
    seen: list[int] = []
    for ids in batches:
        old = caches
        batch = jnp.asarray(np.array(ids, np.int32)) if isinstance(ids, tuple) else ids
        caches = z(caches, batch, group=group)
        if len(ids):
            assert all(x.is_deleted() for i, x in enumerate(old) if z.spec.zeroed_mask(group)[i])  # donated
        seen += [b for b in ids if 0 <= b < z.num_blocks]
    ref = [a.copy() for a in host]
    zero_native_numpy(ref, z.spec, seen, group=group)
    exp = expected_zeroed_native(z.spec, seen, group=group)
    for name, got, want, before in zip(z.spec.names, caches, ref, host):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert same_bytes(got, want), name
        assert K.reference.compare_to_ranges(before, np.asarray(got), exp[name]).matches, name
    return z, host, caches


# ---- the TPU kernel (interpret mode) ------------------------------------------------------------
def test_every_shape_in_one_call_host_and_device_ids(compiled_steps: Callable[[object], int]) -> None:
    """All leaves in one kernel call: duplicates, the last page, page 0, device ids."""
    z, _, _ = run(list(SHAPES), [[5, 0, 5], (N - 1, 2, 2), [N - 1]])
    assert z.mode == "tpu-interpret" and z.kernel == "tpu"
    assert compiled_steps(z) == 2  # one host bucket, one device batch shape
    plan = nk.plan_tpu([(s, d) for s, d in SHAPES.values()])
    assert [lp.kind for lp in plan.leaves] == ["page"] * 5 + ["row", "rmw", "rmw", "page", "page"]


def test_bad_device_ids_write_nothing_and_check_raises() -> None:
    names = ["attn_bf16", "rank2_bf16", "v4_nope"]
    z, _, _ = run(names, [(3, N, -1, 3, 2**31 - 1)])
    with pytest.raises(K.BlockIdError, match=r"3 ids outside \[0, 8\); they wrote nothing"):
        z.check()
    z.check()  # reset
    host = host_cache(names)
    caches = z([jnp.asarray(a) for a in host], jnp.array([N, -5], jnp.int32))  # only bad ids: nothing at all
    assert all(same_bytes(c, a) for c, a in zip(caches, host))
    with pytest.raises(K.BlockIdError, match="2 ids outside"):
        z.check()


@pytest.mark.parametrize("ids", [[0, N], [-1], [True], [1.0], np.array([1.5])])
def test_bad_host_ids_run_nothing(ids: Any) -> None:
    host = host_cache(["attn_bf16", "rank2_u8"])
    caches = [jnp.asarray(a) for a in host]
    z = kp.CacheZeroer(caches)
    with pytest.raises(K.BlockIdError):
        z(caches, ids)
    assert not any(c.is_deleted() for c in caches) and all(same_bytes(c, a) for c, a in zip(caches, host))


def test_empty_batches_are_no_ops(compiled_steps: Callable[[object], int]) -> None:
    host = host_cache(["mla", "rank2_f32"])
    caches = [jnp.asarray(a) for a in host]
    z = kp.CacheZeroer(caches)
    out = z(caches, [])
    out = z(out, jnp.zeros((0,), jnp.int32))
    assert out is caches and compiled_steps(z) == 0
    z.check()


def test_per_group_and_overlaid_slot() -> None:
    """Group 'swa' clears its own leaf and the slot shared with 'full'; 'full' stays intact."""
    names = ["attn_bf16", "attn_fp8", "v4_nope"]
    groups = [("full", "swa"), "full", "swa"]
    z, _, _ = run(names, [[1, 6], (6, 3)], groups=groups, group="swa")
    assert z.spec.zeroed_mask("swa") == (True, False, True)
    with pytest.raises(K.SpecError, match="no such group; valid groups: 'full', 'swa'"):
        z([jnp.zeros(SHAPES[n][0], SHAPES[n][1]) for n in names], [1], group="mla")


def test_every_page_of_a_tiny_pool_and_chunked_tiles() -> None:
    """Pages split into chunks (a 2 KiB tile budget): every page, every chunk, exact."""
    shapes = {"big": ((4, 6, 2, 2, 128), "bfloat16"), "big3": ((4, 64, 256), "uint8")}
    z, _, _ = run(list(shapes), [[0, 1, 2, 3]], shapes=shapes, tile_bytes=2048)
    plan = nk.plan_tpu([shapes[n] for n in shapes], tile_bytes=2048)
    assert [len(lp.chunks) for lp in plan.leaves] == [3, 2]


def test_pytree_of_dicts_names_and_group_mapping() -> None:
    shapes = {"k": ((N, 2, 128), "float32"), "v": ((N, 2, 128), "float32")}
    host = {n: poisoned(*shapes[n], seed=i) for i, n in enumerate(shapes)}
    caches = {"layers": [{n: jnp.asarray(host[n]) for n in shapes}]}
    z = kp.CacheZeroer(caches, {"layers.0.v": "late"})
    assert z.spec.names == ("layers.0.k", "layers.0.v") and z.spec.groups == ("", "late")
    out = z(caches, [2, 4], group="late")
    assert same_bytes(out["layers"][0]["k"], host["k"])
    want = host["v"].copy()
    want[[2, 4]] = 0
    assert same_bytes(out["layers"][0]["v"], want)


def test_apply_inside_a_donated_step_then_write_pages() -> None:
    """The tpu-inference pattern: zero the step's new pages, then write new K/V into them
    (finite poison: the step's own scatter runs on XLA:CPU, which quiets bf16 NaNs)."""
    names = ["attn_bf16", "mla"]
    host = host_cache(names, finite=True)
    caches = [jnp.asarray(a) for a in host]
    z = kp.CacheZeroer(caches)

    def step(caches: list[jax.Array], new_ids: jax.Array, slot: jax.Array) -> tuple[list, jax.Array]:
        caches, bad = z.apply(caches, new_ids)
        k = caches[0]
        caches[0] = k.at[slot, 0].set(jnp.ones(k.shape[2:], k.dtype))  # token 0 of the first new page
        return caches, bad

    f = jax.jit(step, donate_argnums=0)
    out, bad = f(caches, jnp.array([3, 6, 3], jnp.int32), jnp.int32(3))
    assert int(bad) == 0 and caches[0].is_deleted()
    want = [a.copy() for a in host]
    zero_native_numpy(want, z.spec, [3, 6])
    want[0][3, 0] = 1
    assert all(same_bytes(o, w) for o, w in zip(out, want))
    hlo = f.lower(out, jnp.array([1], jnp.int32), jnp.int32(1)).as_text()
    assert hlo.count("tf.aliasing_output") >= 2  # both leaves donated into the step


def test_wide_ids_never_wrap() -> None:
    """int64 ids (x64 on): 2**32 + 3 is out of range, not block 3."""
    with jax.enable_x64(True):
        host = host_cache(["rank3_i32"])
        caches = [jnp.asarray(a) for a in host]
        z = kp.CacheZeroer(caches)
        out = z(caches, jnp.array([2**32 + 3, 1], jnp.int64))
        want = host[0].copy()
        want[1] = 0
        assert same_bytes(out[0], want)
        with pytest.raises(K.BlockIdError, match="1 ids outside"):
            z.check()


def test_validation() -> None:
    host = host_cache(["attn_bf16", "rank2_f32"])
    caches = [jnp.asarray(a) for a in host]
    z = kp.CacheZeroer(caches)
    with pytest.raises(K.LayoutBufferError, match="must have the structure"):
        z(caches[:1], [0])
    with pytest.raises(K.LayoutBufferError, match=r"leaf '1' = float32\(8, 100\): must be float32\(8, 200\)"):
        z([caches[0], jnp.zeros((N, 100), jnp.float32)], [0])
    with pytest.raises(K.LayoutBufferError, match="must be bfloat16"):
        z([caches[0].astype(jnp.float16), caches[1]], [0])
    with pytest.raises(K.BlockIdError, match="1-D integer array"):
        z(caches, jnp.zeros((2, 2), jnp.int32))
    with pytest.raises(K.SpecError, match="same number of pages"):
        kp.CacheZeroer([jnp.zeros((4, 8)), jnp.zeros((5, 8))])
    with pytest.raises(K.SpecError, match="rank 2 to 32"):
        kp.CacheZeroer([jnp.zeros((4,))])
    with pytest.raises(K.LayoutBufferError, match="multiple of 8"):
        odd = [jnp.zeros((6, 256), jnp.bfloat16)]
        kp.CacheZeroer(odd, kernel="tpu")(odd, [1])
    with pytest.raises(K.BackendError, match="valid kernels"):
        kp.CacheZeroer(caches, kernel="cuda")
    with pytest.raises(K.BackendError, match="power of two"):
        kp.CacheZeroer(caches, box_elements=1000)
    # each launch option within what the hardware can take (num_warps=2**40 was accepted)
    for name, lo, hi in (("tile_bytes", 1024, 1 << 26), ("max_inflight", 1, 1 << 16),
                         ("box_elements", 1, 1 << 20), ("num_warps", 1, 32)):
        for v in (lo - 1, 2 * hi, 2**40, True, 4.0):
            with pytest.raises(K.BackendError) as e:
                kp.CacheZeroer(caches, **{name: v})
            assert (e.value.field, e.value.value) == (name, v)
            assert str(e.value).endswith(f"must be an integer from {lo} to {hi:,}")
        assert getattr(kp.CacheZeroer(caches, **{name: hi}), name) == hi
    with pytest.raises(K.LayoutBufferError, match="needs a mesh"):
        kp.CacheZeroer(caches, partition_specs=[None, None])
    assert not any(c.is_deleted() for c in caches)


# ---- the Pallas-Triton kernel (interpreted) -----------------------------------------------------
def test_triton_every_shape_host_device_and_bad_ids() -> None:
    z, _, _ = run(list(SHAPES), [[5, 0, 5], (N - 1, 2, N, -3)], kernel="triton", interpret=True)
    assert z.mode == "triton-interpret"
    with pytest.raises(K.BlockIdError, match="2 ids outside"):
        z.check()


def test_triton_per_group_overlaid_and_odd_shapes() -> None:
    """Odd page axes: boxes overlap at the end of an axis (zeros twice, never outside)."""
    shapes = {
        "odd": ((5, 3, 7, 20), "float32"),
        "slot": ((5, 6, 2, 128), "bfloat16"),
        "other": ((5, 12), "int32"),
    }
    run(
        list(shapes),
        [[4, 0], (2, 2)],
        shapes=shapes,
        groups=[("a", "b"), "a", "b"],
        group="b",
        kernel="triton",
        interpret=True,
        box_elements=64,
    )


# ---- NumPy models of both kernels ----------------------------------------------------------------
shape_st = st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple)
dtype_st = st.sampled_from(["float32", "bfloat16", "uint8", "int16"])


@given(shape_st, dtype_st, st.integers(4096, 2**16), st.lists(st.integers(-2, 9), max_size=6))
@settings(max_examples=60)
def test_tpu_plan_model_equals_page_assignment(page: tuple, dtype: str, tile_bytes: int, ids: list) -> None:
    size = jnp.dtype(dtype).itemsize
    n = 8
    page = (*page[:-1], page[-1] * max(1, 4 // size))  # whole 32-bit words per page
    shape = (n, *page)
    plan = nk.plan_tpu([(shape, dtype)], tile_bytes=tile_bytes)
    a = poisoned(shape, dtype, 1)
    b = a.copy()
    nk.run_plan_numpy([a], plan, ids)
    nk.zero_pages_numpy([b], ids, n)
    assert same_bytes(a, b)
    lp = plan.leaves[0]
    if lp.kind == "page":  # chunks tile the first page axis exactly
        assert [s for s, _ in lp.chunks] == list(range(0, shape[1], lp.chunk))
        assert sum(c for _, c in lp.chunks) == shape[1]


@given(shape_st, st.sampled_from([1, 2, 8, 64, 8192]), st.lists(st.integers(-2, 9), max_size=6))
@settings(max_examples=60)
def test_triton_box_model_equals_page_assignment(page: tuple, box_elements: int, ids: list) -> None:
    shape = (8, *page)
    (bp,) = nk.plan_triton([(shape, "float32")], box_elements)
    assert all(b & (b - 1) == 0 and b <= d for b, d in zip(bp.box, page))
    assert np.prod(bp.box) <= box_elements
    a = poisoned(shape, "float32", 2)
    b = a.copy()
    nk.run_boxes_numpy([a], [bp], ids)
    nk.zero_pages_numpy([b], ids, 8)
    assert same_bytes(a, b)


# ---- the real Mosaic compiler ---------------------------------------------------------------------
def test_mosaic_compiles_aliased_with_no_copy_of_any_leaf() -> None:
    """v5e and v6e: every leaf aliased input to output; no copy/transpose/bitcast-convert/reshape
    of a leaf anywhere in the optimised HLO (tests/native_hlo.py reads it); the same for the
    sharded program on a v5e 2x2 mesh, without a collective. Never skipped."""
    out = run_check("native")
    lines = [x for x in out.splitlines() if x.startswith("compiled")]
    assert len(lines) == 2, out
    for line in lines:
        assert "'aliased': 7, 'touched': [], 'custom_calls': 1, 'forbidden_ops': []" in line, line
    odd = [x for x in out.splitlines() if x.startswith("odd")]
    assert len(odd) == 2, out
    for line in odd:
        kinds = "[('page', True), ('rmw', False), ('row', False)]"
        facts = "{'aliased': 6, 'touched': [], 'custom_calls': 1, 'forbidden_ops': []}"
        assert f"{kinds} {facts}" in line, line
    # the sharded SPMD program on a v5e 2x2 mesh: local shapes, no collective, still no copy;
    # one kernel call for the leaves with pages over dp, one for those with whole page axes
    sharded = "sharded {'aliased': 7, 'touched': [], 'custom_calls': 2, 'forbidden_ops': []} [] True"
    assert sharded in out, out
    # the old flat path on the same kind of cache: relayout copies of the whole cache (README)
    assert "flat ['bitcast-convert', 'copy', 'reshape'] 48" in out, out
    assert "native [] True" in out, out


def test_triton_kernel_lowers_for_cuda_on_the_cpu() -> None:
    """The GPU path's real lowering (Pallas -> Triton IR) runs without a GPU through jax.export
    for ``cuda``: one Triton call over every leaf, each leaf aliased, grid (ids, units)."""
    import re

    from jax import export

    shapes = [*(s for s in SHAPES.values()), ((N, 3, 7, 20), "float32")]
    caches = [jax.ShapeDtypeStruct(s, jnp.dtype(d)) for s, d in shapes]
    z = kp.CacheZeroer(caches, kernel="triton", interpret=False)
    ids = jax.ShapeDtypeStruct((4096,), jnp.int32)
    triton = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
    text = export.export(z._jitted, platforms=["cuda"], disabled_checks=[triton])(caches, ids).mlir_module()
    assert re.findall(r"stablehlo.custom_call @([\w$.]+)", text) == ["__gpu$xla.gpu.triton"]
    assert text.count("output_operand_alias<output_tuple_indices") == len(caches)
    units = sum(bp.units for bp in nk.plan_triton(shapes))
    assert re.findall(r"grid_x = (\d+) : i32, grid_y = (\d+)", text) == [("4096", str(units))]


@pytest.mark.parametrize("name", ["attn_bf16", "mla", "v4_indexer", "rank2_bf16", "rank3_i32"])
def test_conformance_harness_on_each_leaf(name: str) -> None:
    """Section 9: a leaf is a one-row buffer, so ``run_case`` checks it byte for byte, guard
    bands included, like any backend on any table."""
    from kvlayout.conformance import run_case
    from kvlayout.native import NativeLeaf

    leaf = NativeLeaf(name, *SHAPES[name], group="g")
    res = run_case(kp.native.leaf_backend(leaf), leaf.table(), [N - 1, 0, 3, 3])
    assert res.mode == "tpu-interpret" and res.ok, res.check.describe()


def test_zeroer_from_a_spec_names_groups_and_cold_leaves() -> None:
    """A NativeCacheSpec (e.g. built from a model config) names the leaves and their groups;
    a leaf marked ``zeroed=False`` is never written."""
    from kvlayout.native import NativeCacheSpec, NativeLeaf

    names = ["attn_bf16", "rank3_i32"]
    spec = NativeCacheSpec(
        (
            NativeLeaf("k0", *SHAPES[names[0]], group="full"),
            NativeLeaf("state", *SHAPES[names[1]], zeroed=False),
        )
    )
    host = host_cache(names)
    caches = [jnp.asarray(a) for a in host]
    z = kp.CacheZeroer(caches, spec=spec)
    assert z.spec is spec
    out = z(caches, [1, 6])
    want = host[0].copy()
    want[[1, 6]] = 0
    assert same_bytes(out[0], want) and same_bytes(out[1], host[1])
    with pytest.raises(K.LayoutBufferError, match=r"spec.leaves\[1\] = 'state': is int32\(8, 3, 40\)"):
        kp.CacheZeroer([caches[0], jnp.zeros((N, 3, 41), jnp.int32)], spec=spec)
    with pytest.raises(K.LayoutBufferError, match="not both"):
        kp.CacheZeroer(out, "g", spec=spec)


def test_rank2_row_groups_full_and_tail() -> None:
    """Rank-2 8/16-bit leaves: ids in whole row groups and in the tail group, neighbours kept."""
    shapes = {"bf16": ((40, 256), "bfloat16"), "u8": ((40, 512), "uint8")}
    plan = nk.plan_tpu(list(shapes.values()))
    assert [(lp.kind, lp.chunk, lp.groups) for lp in plan.leaves] == [
        ("rmw", 16, (32, 8)),
        ("rmw", 32, (32, 8)),
    ]
    run(list(shapes), [[3, 17, 33, 39, 0, 31], (32, 16, 15)], shapes=shapes)


def test_standalone_call_is_one_jitted_step(compiled_steps: Callable[[object], int]) -> None:
    """Issue 26: on the GPU kernel a call is one dispatch of the zeroer's jitted step: the
    kernel takes the ids as they come and counts the bad ones itself (no sort, no reduce),
    the running count stays on the device (no device-to-host read), host batches of 1 to 8
    ids share a compile; duplicates and bad ids stay exact."""
    names = ["attn_bf16", "rank2_bf16", "rank6_f16"]
    batches = [[1], [2, 3, 4, 5, 6, 7, 0], (5, 5, N, -1), [6, 6]]
    z, _, caches = run(names, batches, kernel="triton", interpret=True)
    assert compiled_steps(z) == 2  # one host bucket, one device batch shape
    with pytest.raises(K.BlockIdError, match=r"2 ids outside \[0, 8\)"):
        z.check()
    for ids in ([0], [1, 2, 3, 4, 5], jnp.array([1, 2, 3, 4], jnp.int32), [7, 6, 5, 4, 3, 2, 1, 0]):
        caches = z(caches, ids)
    assert compiled_steps(z) == 2  # batches of 1 to 8 ids never retrace
    host = host_cache(names, finite=True)
    caches = [jnp.asarray(a) for a in host]
    with jax.transfer_guard_device_to_host("disallow"):
        caches = z(caches, [3])
        caches = z(caches, jnp.array([4, -2, 4], jnp.int32))
    with pytest.raises(K.BlockIdError, match="1 ids outside"):
        z.check()
    abstract = [jax.ShapeDtypeStruct(SHAPES[n][0], jnp.dtype(SHAPES[n][1])) for n in names]
    g = kp.CacheZeroer(abstract, kernel="triton", interpret=False)
    leaves = list(g.abstract_caches())
    ids, acc = jax.ShapeDtypeStruct((8,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32)
    text = str(g._step.trace(leaves, ids, acc).lower(lowering_platforms=("cuda",)).as_text())
    assert text.count("__gpu$xla.gpu.triton") == 1 and "stablehlo.add" in text
    assert not re.search(r"stablehlo\.(sort|reduce|concatenate|compare)", text)


def test_host_batches_pad_with_nothing_to_write() -> None:
    """Issue 26: a host batch is padded to its bucket with -1, not with copies of a real id
    (a 1-id call wrote its block 8 times on the GPU); the padding is skipped by both kernels
    and not counted as bad ids (the host already refused those)."""
    pad = kp.native._host_bucket(np.array([5], np.int64))
    assert pad.dtype == np.int32 and pad.tolist() == [5] + [-1] * 7
    assert kp.native._host_bucket(np.arange(9)).tolist() == list(range(9)) + [-1] * 7
    for kw in ({}, {"kernel": "triton", "interpret": True}):
        z, _, _ = run(["attn_bf16", "rank2_bf16"], [[3], [N - 1, 0, 4]], **kw)
        z.check()  # no bad id: the 7 and 5 padding slots were not counted
    # the host step carries no running count: its outputs are the donated leaves alone
    names = ["attn_bf16", "rank2_bf16"]
    abstract = [jax.ShapeDtypeStruct(SHAPES[n][0], jnp.dtype(SHAPES[n][1])) for n in names]
    g = kp.CacheZeroer(abstract, kernel="triton", interpret=False)
    traced = g._host_step.trace(list(g.abstract_caches()), jax.ShapeDtypeStruct((8,), jnp.int32))
    assert len(jax.tree.leaves(traced.out_info)) == len(names)


def test_donated_caches_passed_again_name_the_leaf() -> None:
    """Calling with caches an earlier call donated raised JAX's raw RuntimeError: now a
    LayoutBufferError naming the first deleted leaf."""
    host = host_cache(["attn_bf16", "rank2_f32"])
    caches = [jnp.asarray(a) for a in host]
    z = kp.CacheZeroer(caches)
    new = z(caches, [1])
    for ids in ([2], jnp.array([2], jnp.int32)):
        with pytest.raises(K.LayoutBufferError) as e:
            z(caches, ids)
        assert e.value.field == "leaf '0'" and "pass the caches that call returned" in str(e.value)
    assert all(not x.is_deleted() for x in new)
