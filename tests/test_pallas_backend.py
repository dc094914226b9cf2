"""The ``pallas`` backend on CPU: TPU interpret mode, the Triton kernel interpreted, Mosaic compile."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlayout as K
from kvlayout.conformance import run_case
from kvlayout.testing import random_spec
from tests.mosaic_compile import run_check

jax = pytest.importorskip("jax")
chex = pytest.importorskip("chex")
kp = pytest.importorskip("kvlayout.backends.pallas")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


def backend(**kw: Any) -> type[K.Backend]:
    class B(kp.PallasBackend):
        def __init__(self, table: K.SegmentTable, buffer: Any, *, offset: int = 0) -> None:
            super().__init__(table, buffer, offset=offset, **kw)

    return B


def test_registered_and_mode() -> None:
    assert K.load_backend("pallas") is kp.PallasBackend
    z = kp.PallasZeroer(K.plan(K.preset("dsv4-test")))
    assert z.mode == "tpu-interpret" and z.kernel == "tpu"


def test_dsv4_test_is_unaligned_with_two_phases() -> None:
    z = kp.PallasZeroer(K.plan(K.preset("dsv4-test")))
    assert z.plan.period == 2 and not z.plan.aligned
    # rows per block: 292.5, so odd blocks start mid-row
    assert z.plan.rmw_row.size > 0


@pytest.mark.parametrize("ids", [[0], [1], [0, 1], [98, 99], [99], [4, 4, 7, 4], list(range(0, 100, 9))])
def test_dsv4_test_both_parities(ids: list[int]) -> None:
    res = run_case(kp.PallasBackend, K.plan(K.preset("dsv4-test")), ids)
    assert res.mode == "tpu-interpret"
    assert res.ok, res.check.describe()


def test_dsv4_full_preset_and_empty() -> None:
    t = K.plan(K.preset("dsv4"))
    assert run_case(kp.PallasBackend, t, [0, 33, 99]).ok
    res = run_case(kp.PallasBackend, t, [])
    assert res.ok and res.check.zeroed_bytes == 0


def test_aligned_fast_path() -> None:
    t = K.plan(K.preset("llama-8b").with_num_blocks(6))
    z = kp.PallasZeroer(t)
    assert z.plan.aligned and z.plan.period == 1
    assert run_case(kp.PallasBackend, t, [0, 5, 2]).ok


def test_all_blocks_small_pool() -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(6))
    assert run_case(kp.PallasBackend, t, list(range(6))).ok


@given(st.integers(0, 2**32 - 1), st.data())
@settings(max_examples=12)
def test_random_specs_tpu_interpret(seed: int, data: st.DataObject) -> None:
    spec = random_spec(seed, max_blocks=6)
    t = K.plan(spec)
    ids = data.draw(st.lists(st.integers(0, spec.num_blocks - 1), max_size=4))
    res = run_case(kp.PallasBackend, t, ids)
    assert res.ok, res.check.describe()


@given(st.integers(0, 2**32 - 1), st.integers(0, 3))
@settings(max_examples=40)
def test_numpy_model_of_row_plan(seed: int, off_rows: int) -> None:
    spec = random_spec(seed)
    t = K.plan(spec).coalesced()
    offset = off_rows * 512 + 4 * (seed % 7)
    plan = kp.plan_rows(t, offset, tile_rows=8)
    data = K.poison_pattern((plan.rows_needed + 1) * 512)
    rows = data.view(np.int32).reshape(-1, 128).copy()
    ids = np.arange(0, spec.num_blocks, 2)
    kp.zero_rows_numpy(rows, plan, ids)
    assert K.reference.compare_to_contract(data, rows, t, ids, origin=offset).matches


@pytest.mark.parametrize("name", ["dsv4-test", "dsv4", "llama-8b"])
def test_triton_kernel_interpreted_on_cpu(name: str) -> None:
    t = K.plan(K.preset(name).with_num_blocks(4 if name == "llama-8b" else 100))
    n = t.num_blocks
    res = run_case(backend(kernel="triton", interpret=True), t, [0, 1, n - 1, 1])
    assert res.mode == "triton-interpret"
    assert res.ok, res.check.describe()


@pytest.mark.parametrize(("name", "nb"), [("dsv4-test", 100), ("dsv4", 4)])
def test_triton_persistent_kernel_interpreted_on_cpu(name: str, nb: int) -> None:
    """The persistent variant (fixed programs striding over live items), more items than programs."""
    t = K.plan(K.preset(name).with_num_blocks(nb))
    for ids in ([nb - 1], [1, nb - 1, 1, 0]):
        res = run_case(backend(kernel="triton", interpret=True, programs=7, chunk_rows=8), t, ids)
        assert res.ok, res.check.describe()
    z = kp.PallasZeroer(t, kernel="triton", interpret=True, programs=5)
    data = K.poison_pattern(z.buffer_shape[0] * 512)
    buf = jnp.asarray(data.view(np.int32).reshape(z.buffer_shape))
    ids = jnp.array([3, 1, 3, 2, 1, 0], jnp.int32) % nb
    out = jax.jit(z.apply_masked)(
        buf, ids, jnp.array([True, False, True, False, True, True])
    )  # invalid slots: never visited
    got = np.asarray(out).reshape(-1).view(np.uint8)
    assert K.reference.compare_to_contract(data, got, t, np.unique(np.array([3, 3, 1, 0]) % nb)).matches


def test_triton_kernel_random_spec() -> None:
    for seed in range(6):
        spec = random_spec(seed, max_blocks=5)
        t = K.plan(spec)
        res = run_case(
            backend(kernel="triton", interpret=True, chunk_rows=2), t, list(range(spec.num_blocks))
        )
        assert res.ok, (seed, res.check.describe())


@pytest.mark.parametrize("ids", [[0, 100], [-1], [True], np.array([1.5])])
def test_bad_host_ids_run_nothing(ids: object) -> None:
    t = K.plan(K.preset("dsv4-test"))
    z = kp.PallasZeroer(t)
    buf = jnp.ones(z.buffer_shape, jnp.int32)
    with pytest.raises(K.BlockIdError):
        z(buf, ids)
    assert bool((buf == 1).all())  # not donated, not changed


@pytest.mark.parametrize("kernel", ["tpu", "triton"])
def test_device_ids_checked_in_kernel(kernel: str) -> None:
    t = K.plan(K.preset("dsv4-test"))
    data = K.poison_pattern(t.total_bytes)
    z = kp.PallasZeroer(t, kernel=kernel, interpret=True)
    buf = jnp.asarray(data.view(np.int32).reshape(z.buffer_shape))
    out = z(buf, jnp.array([3, 100, -7, 3], jnp.int32))
    got = np.asarray(out).reshape(-1).view(np.uint8)
    assert K.reference.compare_to_contract(data, got, t, [3]).matches  # only block 3 written
    with pytest.raises(K.BlockIdError, match=r"2 ids outside \[0, 100\)"):
        z.check()
    z.check()


def test_no_retrace_and_chex_traces(compiled_steps: Callable[[object], int]) -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(8))
    z = kp.PallasZeroer(t)
    buf = jnp.zeros(z.buffer_shape, jnp.int32)
    for ids in ([1], [2, 3], [7, 0, 5], [4]):
        buf = z(buf, ids)
    assert compiled_steps(z) == 1  # all batches fall in the same 8-id bucket
    f = jax.jit(chex.assert_max_traces(lambda b, i: z.apply(b, i)[0], n=1), donate_argnums=0)
    for i in range(3):
        buf = f(buf, jnp.array([i, i + 1], jnp.int32))
    chex.assert_shape(buf, z.buffer_shape)
    chex.assert_type(buf, jnp.int32)


def test_callable_inside_user_jit_and_aliasing() -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(8))
    z = kp.PallasZeroer(t)

    @jax.jit
    def step(buf: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        buf, bad = z.apply(buf, ids)
        return buf + 0, bad

    data = K.poison_pattern(z.buffer_shape[0] * 512)
    out, bad = step(jnp.asarray(data.view(np.int32).reshape(z.buffer_shape)), jnp.array([2, 6], jnp.int32))
    assert int(bad) == 0
    got = np.asarray(out).reshape(-1).view(np.uint8)
    assert K.reference.compare_to_contract(data, got, t, [2, 6]).matches
    text = z.lower(4).as_text()
    assert re.search(
        r"x128xi32> \{tf\.aliasing_output = \d", text
    )  # the donated buffer is the output: no copy


def test_buffer_validation() -> None:
    t = K.plan(K.preset("dsv4-test"))
    z = kp.PallasZeroer(t)
    rows = z.buffer_shape[0]
    with pytest.raises(K.LayoutBufferError, match="dtype = float32"):
        z(jnp.zeros((rows, 128), jnp.float32), [0])
    with pytest.raises(K.LayoutBufferError, match=r"shape = \(29250, 64\)"):
        z(jnp.zeros((rows, 64), jnp.int32), [0])
    with pytest.raises(K.LayoutBufferError, match="the layout needs 29250 rows"):
        z(jnp.zeros((rows - 1, 128), jnp.int32), [0])
    with pytest.raises(K.LayoutBufferError, match="must be a jax.Array"):
        z(np.zeros((rows, 128), np.int32), [0])
    with pytest.raises(K.TableError, match="unsafe table"):
        from tests.test_verify import prefix_table

        kp.PallasZeroer(prefix_table())


def test_mosaic_compiles_for_v5e_and_v6e() -> None:
    """The real TPU compiler (libtpu, no TPU needed) accepts the kernel. Never skipped."""
    out = run_check("flat")
    lines = [x for x in out.splitlines() if x.startswith("compiled")]
    assert len(lines) == 6, out
    assert "compiled v5e=2x2 llama-8b fast-path" in lines and "compiled v6e=2x2 dsv4-test rmw" in lines


def test_apply_masked_skips_invalid_slots_and_duplicates() -> None:
    """The routing primitive for sharded caches: slots marked invalid write nothing, no error."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(6))
    z = kp.PallasZeroer(t)
    data = K.poison_pattern(z.buffer_shape[0] * 512)
    buf = jnp.asarray(data.view(np.int32).reshape(z.buffer_shape))
    ids = jnp.array([4, 1, 4, 2, 1, 4], jnp.int32)
    valid = jnp.array([True, False, True, False, True, False])
    out = jax.jit(z.apply_masked)(buf, ids, valid)
    got = np.asarray(out).reshape(-1).view(np.uint8)
    assert K.reference.compare_to_contract(data, got, t, [1, 4]).matches


# --------------------------------------------------------------------------- GPU kernel options (issue 15)
#: option sets of the Pallas-Triton kernel: each must zero exactly the contract's bytes
TRITON_OPTIONS = [
    {"dedup": False},
    {"dedup": False, "vector": True},
    {"dedup": False, "vector": True, "unit_major": True},
    {"dedup": False, "vector": True, "chunk_rows": 32, "evict_first": True},
    {"dedup": False, "vector": True, "programs": 7, "chunk_rows": 8},
    {"dedup": True, "vector": True, "programs": 7},
    {"dedup": True, "vector": True, "unit_major": True},
]


def option_id(kw: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("kw", TRITON_OPTIONS, ids=option_id)
@pytest.mark.parametrize("guard", [4096, 4100])  # 4100: the layout 4 B past a 16 B boundary
def test_triton_options_exact_on_guarded_buffers(kw: dict[str, Any], guard: int) -> None:
    """Host ids (padded with duplicates to the bucket) on a poisoned buffer with guard bands."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(12))
    res = run_case(backend(kernel="triton", interpret=True, **kw), t, [11, 0, 5, 1], guard=guard)
    assert res.mode == "triton-interpret"
    assert res.ok, res.check.describe()


def guarded(z: Any, offset: int, seed: int = 0x5EED) -> tuple[np.ndarray, jax.Array]:
    """Poisoned bytes (4 KiB trailing guard) and the buffer holding them, layout at ``offset``."""
    rows = z.buffer_shape[0] + 8
    data = K.poison_pattern(rows * 512, seed)
    return data, jnp.asarray(data.view(np.int32).reshape(rows, 128))


@pytest.mark.parametrize("kw", TRITON_OPTIONS, ids=option_id)
def test_triton_options_device_ids_duplicates_and_bad_ids(kw: dict[str, Any]) -> None:
    """Device ids in a user's jit: duplicates, ids out of range both ways, the bad count exact."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(10))
    z = kp.PallasZeroer(t, offset=4096, kernel="triton", interpret=True, **kw)
    data, buf = guarded(z, 4096)
    ids = jnp.array([7, 9, -3, 7, 10, 0, 2**31 - 1, 9, 7], jnp.int32)
    out, bad = jax.jit(z.apply, donate_argnums=0)(buf, ids)
    assert int(bad) == 3
    got = np.asarray(out).reshape(-1).view(np.uint8)
    assert K.reference.compare_to_contract(data, got, t, [0, 7, 9], origin=4096).matches


@pytest.mark.parametrize("kw", [TRITON_OPTIONS[i] for i in (0, 1, 2, 4)], ids=option_id)
def test_triton_options_apply_masked(kw: dict[str, Any]) -> None:
    """The sharded zeroer's primitive: invalid slots write nothing and are not errors (the
    persistent grid keeps the sorted path there, so it walks only the live slots)."""
    t = K.plan(K.preset("dsv4").with_num_blocks(6))
    z = kp.PallasZeroer(t, kernel="triton", interpret=True, **kw)
    data, buf = guarded(z, 0)
    ids = jnp.array([4, 1, 4, 2, 1, 5, 4], jnp.int32)
    valid = jnp.array([True, False, True, False, True, False, True])
    out = jax.jit(z.apply_masked)(buf, ids, valid)
    got = np.asarray(out).reshape(-1).view(np.uint8)
    assert K.reference.compare_to_contract(data, got, t, [1, 4]).matches


def test_triton_direct_wide_id_dtype_not_wrapped() -> None:
    """uint32 ids beyond int32 take the range check before narrowing: counted, never wrapped."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(8))
    z = kp.PallasZeroer(t, kernel="triton", interpret=True, dedup=False, vector=True)
    data, buf = guarded(z, 0)
    ids = jnp.array([2**32 - 1, 3, 2**31 + 3, 8], jnp.uint32)
    out, bad = jax.jit(z.apply)(buf, ids)
    assert int(bad) == 3
    got = np.asarray(out).reshape(-1).view(np.uint8)
    assert K.reference.compare_to_contract(data, got, t, [3]).matches


def test_triton_vector_width_only_when_16_byte_aligned() -> None:
    """16-byte stores need every span to start and end on a 4-lane group, whatever the id."""
    dsv4 = K.plan(K.preset("dsv4"))
    assert kp.PallasZeroer(dsv4, kernel="triton", vector=True).vector_width == 4
    assert kp.PallasZeroer(dsv4, kernel="triton", vector=False).vector_width == 1
    assert kp.PallasZeroer(dsv4, kernel="triton", vector=True, offset=4).vector_width == 1
    assert kp.PallasZeroer(dsv4, kernel="tpu", vector=True).vector_width == 1
    widths = set()
    for seed in range(8):  # random tables: some unaligned spans or strides; vector must stay exact
        spec = random_spec(seed, max_blocks=5)
        t = K.plan(spec)
        z = kp.PallasZeroer(t, kernel="triton", interpret=True, vector=True, dedup=False, chunk_rows=2)
        widths.add(z.vector_width)
        ids = list(range(spec.num_blocks))
        res = run_case(
            backend(kernel="triton", interpret=True, vector=True, dedup=False, chunk_rows=2), t, ids
        )
        assert res.ok, (seed, res.check.describe())
    assert widths == {1, 4}


@pytest.mark.parametrize("name", ["flag", "value"])
def test_triton_option_validation(name: str) -> None:
    t = K.plan(K.preset("dsv4-test"))
    bad: dict[str, Any] = {"dedup": 1} if name == "flag" else {"evict_first": "yes"}
    with pytest.raises(K.BackendError, match=f"{next(iter(bad))} = "):
        kp.PallasZeroer(t, kernel="triton", **bad)


def cuda_lowering(z: Any, n: int) -> str:
    """StableHLO of ``z.apply`` lowered for an NVIDIA GPU (no GPU needed)."""
    buf = jax.ShapeDtypeStruct(z.buffer_shape, jnp.int32)
    ids = jax.ShapeDtypeStruct((n,), jnp.int32)
    return str(jax.jit(z.apply).trace(buf, ids).lower(lowering_platforms=("cuda",)).as_text())


def test_triton_direct_step_is_one_kernel() -> None:
    """``dedup=False`` (the default): the step lowers to the Triton call alone (no sort, take or
    count ops); ``dedup=True`` sorts around it."""
    t = K.plan(K.preset("dsv4"))
    direct = cuda_lowering(kp.PallasZeroer(t, kernel="triton", interpret=False), 64)
    sorted_ = cuda_lowering(kp.PallasZeroer(t, kernel="triton", interpret=False, dedup=True), 64)
    assert direct.count("__gpu$xla.gpu.triton") == 1 and sorted_.count("__gpu$xla.gpu.triton") == 1
    assert "stablehlo.sort" in sorted_ and "stablehlo.sort" not in direct
    assert not re.search(r"stablehlo\.(reduce|concatenate|select|compare)", direct)


def triton_ptx(z: Any, n: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """PTX of the zeroer's Pallas-Triton kernel for sm_90: JAX's Triton IR, compiled by Triton."""
    triton = pytest.importorskip("triton")
    pytest.importorskip("triton.backends.nvidia")
    from jax._src.pallas.triton import pallas_call_registration as reg
    from triton.backends.compiler import GPUTarget

    modules: list[str] = []
    lower = reg.lowering.lower_jaxpr_to_triton_module

    def keep(*a: Any, **k: Any) -> Any:
        res = lower(*a, **k)
        modules.append(res.module.operation.get_asm(enable_debug_info=False))
        return res

    monkeypatch.setattr(reg.lowering, "lower_jaxpr_to_triton_module", keep)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    cuda_lowering(z, n)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"kvlayout_pallas_{os.getpid()}.ttir")
    with open(path, "w") as f:
        f.write(modules[-1])
    opts = {"num_warps": z.num_warps, "num_stages": 1}
    return str(triton.compile(path, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"])


def test_triton_vector_option_emits_16_byte_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hypothesis behind ``vector``: the per-lane mask gives 4-byte stores, the per-group one
    16-byte stores (Triton's own compiler, sm_90, on the CPU)."""
    t = K.plan(K.preset("dsv4"))
    per_lane = triton_ptx(kp.PallasZeroer(t, kernel="triton", interpret=False, vector=False), 64, monkeypatch)
    grouped = triton_ptx(kp.PallasZeroer(t, kernel="triton", interpret=False), 64, monkeypatch)  # default
    assert "st.global.v4.b32" not in per_lane and len(re.findall(r"st\.global\.b32", per_lane)) >= 16
    # 16 rows x 128 lanes / 128 threads = 4 vectors each; one 4-byte store is the bad-id count
    assert len(re.findall(r"st\.global\.v4\.b32", grouped)) == 4
    assert len(re.findall(r"st\.global\.b32", grouped)) == 1


@pytest.mark.parametrize("n", [1, 5, 4096, 9000])
def test_triton_bad_id_count_over_several_blocks(n: int) -> None:
    """The direct kernel's bad-id count: masked loads in blocks of 4,096 ids, tail included."""
    from functools import partial

    from jax.experimental import pallas as pl
    from kvlayout.backends.pallas import kernels as kk

    rng = np.random.default_rng(n)
    ids = rng.integers(-50, 150, size=n).astype(np.int32)
    ids[rng.integers(0, n)] = 2**31 - 1
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    call = pl.pallas_call(
        partial(kk._count_bad, n=n, num_blocks=100),
        grid=(1,),
        in_specs=[any_spec],
        out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
        interpret=True,
    )
    got = int(call(jnp.asarray(ids))[0])
    assert got == int(np.sum((ids < 0) | (ids >= 100)))


def test_standalone_call_is_one_jitted_step(compiled_steps: Callable[[object], int]) -> None:
    """Issue 26: a call is one dispatch of the zeroer's jitted step (kernel and running bad-id
    count together), with no device-to-host read; host batches of 1 to 8 ids share a compile."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(8))
    z = kp.PallasZeroer(t, kernel="triton", interpret=True)
    data = K.poison_pattern(z.buffer_shape[0] * 512)
    buf = jnp.asarray(data.view(np.int32).reshape(z.buffer_shape))
    with jax.transfer_guard_device_to_host("disallow"):
        for ids in ([1], [2, 3, 4, 5, 6, 7, 0, 1], jnp.array([5, 9, -1], jnp.int32), [6]):
            buf = z(buf, ids)
    assert compiled_steps(z) == 2  # one host bucket, one device batch shape
    with pytest.raises(K.BlockIdError, match=r"2 ids outside \[0, 8\)"):
        z.check()
    got = np.asarray(buf).reshape(-1).view(np.uint8)
    assert K.reference.compare_to_contract(data, got, t, list(range(8))).matches
    g = kp.PallasZeroer(t, kernel="triton", interpret=False)
    shapes = (jax.ShapeDtypeStruct(g.buffer_shape, jnp.int32), jax.ShapeDtypeStruct((8,), jnp.int32))
    acc = jax.ShapeDtypeStruct((), jnp.int32)
    text = str(g._step.trace(*shapes, acc).lower(lowering_platforms=("cuda",)).as_text())
    assert text.count("__gpu$xla.gpu.triton") == 1 and "stablehlo.add" in text
    assert not re.search(r"stablehlo\.(sort|reduce|concatenate|compare)", text)
