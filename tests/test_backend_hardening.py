"""Backend hardening: threads, x64, empty tables, int32 limits, read-only memory, API misuse.

Every zeroing check is byte-exact against the contract (``compare_to_contract``) on poisoned
buffers with guard bands. The cuda tests run under Triton's interpreter in CPU CI and
natively on a GPU (tensors on ``kc.DEVICE_TYPE``); the pallas tests use TPU interpret mode
and the Pallas-Triton kernel in interpret mode.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.sharding import ShardedLayout, shard_spec
from kvlayout.table import Segment, SegmentTable

try:
    import kvlayout.backends.cuda as kc
    import torch
except ImportError:  # pragma: no cover - the cuda extra is part of the test environment
    torch = kc = None  # type: ignore[assignment]
try:
    import jax
    import jax.numpy as jnp
    import kvlayout.backends.pallas as kp
    from jax.experimental.pallas import tpu as pltpu
except ImportError:  # pragma: no cover - the pallas extra is part of the test environment
    jax = jnp = pltpu = kp = None  # type: ignore[assignment]

needs_cuda = pytest.mark.skipif(kc is None, reason="needs the cuda extra (torch, triton)")
needs_pallas = pytest.mark.skipif(kp is None, reason="needs the pallas extra (jax)")

GUARD = 512


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    if pltpu is not None:
        pltpu.reset_tpu_interpret_mode_state()


def mamba_only() -> SegmentTable:
    """A table without rows: ``mamba`` layers occupy space and are never zeroed."""
    spec = K.KVCacheSpec(
        num_blocks=4, layout="packed", groups=(K.GroupSpec("m", (K.MambaSpec("m0", state_bytes=1024),)),)
    )
    t = K.plan(spec)
    assert len(t) == 0 and t.total_bytes == 4096
    return t


def run_in_threads(n_threads: int, rounds: int, step: Callable[[int, int], None]) -> None:
    """Run ``step(thread, round)`` in ``n_threads`` threads, every round started together."""
    barrier = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for r in range(rounds):
                barrier.wait(timeout=120)
                step(k, r)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    assert not real, repr(real[0])


# ----------------------------------------------------------------------------- cuda helpers
def on_device(data: np.ndarray) -> Any:
    return torch.from_numpy(data.copy()).to(kc.DEVICE_TYPE)


def host(buf: Any) -> np.ndarray:
    return buf.cpu().numpy()


def thread_stream() -> contextlib.AbstractContextManager[Any]:
    """Natively each thread launches on its own stream (the hard case); nothing under the interpreter."""
    return torch.cuda.stream(torch.cuda.Stream()) if kc.MODE == "native" else contextlib.nullcontext()


def sync() -> None:
    if kc.MODE == "native":
        torch.cuda.synchronize()


# ============================================================================ 1. threads
@needs_cuda
def test_cuda_zeroer_threads_zero_disjoint_ids_exactly() -> None:
    """4 threads x 8 rounds through one CudaZeroer, each thread its own ids (host lists and
    device tensors): every id is zeroed, nothing else (8 blocks are never zeroed)."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(40))
    data = K.poison_pattern(t.total_bytes + 2 * GUARD)
    buf = on_device(data)
    z = kc.CudaZeroer(t, buf, offset=GUARD, max_programs=4)
    n_threads, rounds = 4, 8

    def ids_of(k: int, r: int) -> int:
        return k * rounds + r  # thread k owns [8k, 8k + 8)

    def step(k: int, r: int) -> None:
        with thread_stream():
            b = ids_of(k, r)
            z.zero(torch.tensor([b], device=kc.DEVICE_TYPE) if k % 2 else [b])
            sync()

    run_in_threads(n_threads, rounds, step)
    sync()
    z.check()
    done = [ids_of(k, r) for k in range(n_threads) for r in range(rounds)]
    chk = K.reference.compare_to_contract(data, host(buf), t, done, origin=GUARD)
    assert chk.matches, chk.describe()


def shard_buffers(lay: ShardedLayout) -> tuple[list[np.ndarray], list[Any]]:
    datas, bufs = [], []
    for k in range(lay.num_shards):
        d = K.poison_pattern(lay.shard_bytes + 2 * GUARD, seed=k + 1)
        datas.append(d)
        bufs.append(on_device(d))
    return datas, bufs


def check_shards(lay: ShardedLayout, datas: list[np.ndarray], bufs: list[Any], ids: list[int]) -> None:
    for k, local in enumerate(lay.route(ids)):
        chk = K.reference.compare_to_contract(datas[k], host(bufs[k]), lay.local_table, local, origin=GUARD)
        assert chk.matches, (k, chk.describe())


@needs_cuda
def test_sharded_cuda_zeroer_threads() -> None:
    """Host and device batches from 4 threads through one ShardedCudaZeroer (routed kernel path)."""
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 4}, block_axes=("dp",))
    datas, bufs = shard_buffers(lay)
    z = kc.ShardedCudaZeroer(lay, bufs, offset=GUARD, max_programs=4)

    def step(k: int, r: int) -> None:
        with thread_stream():
            b = r * 4 + k  # every round touches every shard; ids 12..15 are never zeroed
            z.zero(torch.tensor([b], device=kc.DEVICE_TYPE) if k % 2 else [b])
            sync()

    run_in_threads(4, 3, step)
    sync()
    z.check()
    check_shards(lay, datas, bufs, list(range(12)))


@needs_cuda
def test_cuda_check_reports_each_bad_device_id_once_across_threads() -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(8))
    data = K.poison_pattern(t.total_bytes)
    buf = on_device(data)
    z = kc.CudaZeroer(t, buf, max_programs=2)
    reported: list[int] = []
    lock = threading.Lock()

    def step(k: int, r: int) -> None:
        with thread_stream():
            z._launch(torch.tensor([k, -1 - r], device=kc.DEVICE_TYPE))  # one good, one bad id
            sync()
        try:
            z.check()
        except K.BlockIdError as e:
            with lock:
                m = re.search(r"(\d+) work items", str(e))
                assert m is not None, str(e)
                reported.append(int(m.group(1)))

    run_in_threads(3, 3, step)
    with contextlib.suppress(K.BlockIdError):
        z.check()  # nothing left: every thread checked after its own launch
    units = z.plan.units_per_block
    assert sum(reported) == 3 * 3 * units
    chk = K.reference.compare_to_contract(data, host(buf), t, [0, 1, 2])
    assert chk.matches, chk.describe()


@needs_pallas
@pytest.mark.parametrize("kernel", ["tpu", "triton"])
def test_pallas_zeroer_threads_own_buffers_and_bad_id_count(kernel: str) -> None:
    """4 threads call one PallasZeroer on their own buffers while one of them checks: every
    buffer gets exactly its ids, and every bad id is reported exactly once."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(6))
    z = kp.PallasZeroer(t, kernel=kernel, interpret=True)
    datas = [K.poison_pattern(z.buffer_shape[0] * 512, seed=k + 1) for k in range(4)]
    bufs = [jnp.asarray(d.view(np.int32).reshape(z.buffer_shape)) for d in datas]
    reported: list[int] = []

    def step(k: int, r: int) -> None:
        bufs[k] = z(bufs[k], jnp.array([(k + r) % 6, -1, 1000 + r], jnp.int32))
        if k == 0:
            try:
                z.check()
            except K.BlockIdError as e:
                reported.append(int(e.value))

    run_in_threads(4, 3, step)
    try:
        z.check()
    except K.BlockIdError as e:
        reported.append(int(e.value))
    assert sum(reported) == 4 * 3 * 2
    for k in range(4):
        got = np.asarray(bufs[k]).reshape(-1).view(np.uint8)
        chk = K.reference.compare_to_contract(datas[k], got, t, [(k + r) % 6 for r in range(3)])
        assert chk.matches, (k, chk.describe())


@needs_pallas
def test_pallas_backend_threads_chain_the_buffer() -> None:
    """Concurrent zero() calls on one PallasBackend: each donated buffer is chained, nothing lost."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(8))
    data = K.poison_pattern(t.total_bytes)
    be = kp.PallasBackend.from_host(t, data)

    run_in_threads(4, 2, lambda k, r: be.zero([k * 2 + r]))
    chk = K.reference.compare_to_contract(data, be.to_host(), t, list(range(8)))
    assert chk.matches, chk.describe()


# ============================================================================ 2. x64
@pytest.fixture(params=[False, True], ids=["x32", "x64"])
def x64(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Run with ``jax_enable_x64`` off and on (restored afterwards)."""
    if jax is None:
        pytest.skip("needs the pallas extra (jax)")
    prev = bool(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", request.param)
    try:
        yield request.param
    finally:
        jax.config.update("jax_enable_x64", prev)


@needs_pallas
@pytest.mark.parametrize(("kernel", "programs"), [("tpu", None), ("triton", None), ("triton", 3)])
def test_pallas_kernels_with_and_without_x64(x64: bool, kernel: str, programs: int | None) -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(6))
    z = kp.PallasZeroer(t, kernel=kernel, interpret=True, programs=programs)
    data = K.poison_pattern(z.buffer_shape[0] * 512)
    buf = jnp.asarray(data.view(np.int32).reshape(z.buffer_shape))
    buf = z(buf, [1, 4])  # host ids
    wide = jnp.int64 if x64 else jnp.int32
    ids = jnp.array([5, -1, 2**32 + 3 if x64 else 7], wide)  # 2**32 + 3 must not wrap to block 3
    assert ids.dtype == wide
    buf = z(buf, ids)
    got = np.asarray(buf).reshape(-1).view(np.uint8)
    chk = K.reference.compare_to_contract(data, got, t, [1, 4, 5])
    assert chk.matches, chk.describe()
    with pytest.raises(K.BlockIdError, match=r"device block_ids: 2 ids outside \[0, 6\)"):
        z.check()


@needs_pallas
def test_sharded_pallas_with_x64(x64: bool) -> None:
    from jax.sharding import Mesh

    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(6), {"x": 1}, block_axes=("x",))
    z = kp.ShardedPallasZeroer(lay, Mesh(np.array(jax.devices()[:1]), ("x",)))
    data = K.poison_pattern(lay.gathered_bytes)
    buf = z(z.make_buffer(data), [1])
    wide = jnp.int64 if x64 else jnp.int32
    buf = z(buf, jnp.array([4, 2**32 + 2 if x64 else -2], wide))
    chk = lay.compare(data, z.to_host(buf), [1, 4])
    assert chk.matches, chk.describe()
    with pytest.raises(K.BlockIdError, match="1 ids outside"):
        z.check()


# ============================================================================ 3. sharded host validation
@needs_cuda
@pytest.mark.parametrize("bad", [[1, 5, 16], [-3, 2], [0, 2**40]])
def test_sharded_cuda_cpu_tensor_with_a_bad_id_writes_nothing(bad: list[int]) -> None:
    """A CPU tensor holds host ids in both modes: validated against the global pool before any launch."""
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 4}, block_axes=("dp",))
    datas, bufs = shard_buffers(lay)
    z = kc.ShardedCudaZeroer(lay, bufs, offset=GUARD)
    with pytest.raises(K.BlockIdError, match=r"outside \[0, 16\)"):
        z.zero(torch.tensor(bad))
    sync()
    assert all(np.array_equal(host(b), datas[k]) for k, b in enumerate(bufs))
    z.check()  # nothing was launched: no device-side flag either


# ============================================================================ 4. read-only memory
def _readonly_numpy(n: int) -> np.ndarray:
    a = K.poison_pattern(n)
    a.flags.writeable = False
    return a


@needs_cuda
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_readonly_numpy, id="numpy-writeable-false"),
        pytest.param(lambda n: np.frombuffer(bytes(K.poison_pattern(n)), np.uint8), id="frombuffer-bytes"),
        pytest.param(lambda n: _readonly_numpy(n).__dlpack__(max_version=(1, 0)), id="read-only-capsule"),
    ],
)
def test_from_dlpack_refuses_read_only_memory(make: Callable[[int], Any]) -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(2))
    obj = make(t.total_bytes)
    before = np.array(obj, copy=True) if isinstance(obj, np.ndarray) else None
    with pytest.raises(K.LayoutBufferError, match=r"buffer = \w+ \(read-only\)") as e:
        kc.CudaZeroer.from_dlpack(obj, t)
    assert e.value.field == "buffer"
    if before is not None:
        assert np.array_equal(obj, before)


@needs_cuda
def test_from_dlpack_refuses_objects_without_dlpack() -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(2))
    with pytest.raises(K.LayoutBufferError, match="buffer type = bytes: not importable through DLPack"):
        kc.CudaZeroer.from_dlpack(bytes(t.total_bytes), t)


@needs_cuda
@pytest.mark.skipif(
    kc is None or kc.MODE != "interpreter", reason="host memory is the buffer only under the interpreter"
)
def test_from_dlpack_writeable_numpy_zeroed_in_place() -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(3))
    data = K.poison_pattern(t.total_bytes)
    owner = data.copy()
    kc.CudaZeroer.from_dlpack(owner, t).zero([1])
    chk = K.reference.compare_to_contract(data, owner, t, [1])
    assert chk.matches, chk.describe()


# ============================================================================ 5. tables without rows
@needs_cuda
def test_cuda_table_without_rows() -> None:
    t = mamba_only()
    data = K.poison_pattern(t.total_bytes)
    buf = on_device(data)
    z = kc.CudaZeroer(t, buf)
    z.zero([0, 3])
    z.zero(torch.tensor([1], device=kc.DEVICE_TYPE))
    z._launch(torch.tensor([2, 9], device=kc.DEVICE_TYPE))  # the kernel still bounds-checks device ids
    sync()
    assert np.array_equal(host(buf), data)
    with pytest.raises(K.BlockIdError, match=r"e\.g\. 9"):
        z.check()


@needs_pallas
@pytest.mark.parametrize(("kernel", "programs"), [("tpu", None), ("triton", None), ("triton", 2)])
def test_pallas_table_without_rows(kernel: str, programs: int | None) -> None:
    t = mamba_only()
    z = kp.PallasZeroer(t, kernel=kernel, interpret=True, programs=programs)
    data = K.poison_pattern(z.buffer_shape[0] * 512)
    buf = jnp.asarray(data.view(np.int32).reshape(z.buffer_shape))
    buf = z(buf, [0, 3])
    buf = z(buf, jnp.array([1, 7], jnp.int32))
    assert np.array_equal(np.asarray(buf).reshape(-1).view(np.uint8), data)
    with pytest.raises(K.BlockIdError, match="1 ids outside"):
        z.check()
    res = K.conformance.run_case(kp.PallasBackend, t, [0, 1, 2, 3])
    assert res.ok and res.check.zeroed_bytes == 0


# ============================================================================ 6. int32 limits
def _lane_table(num_blocks: int) -> SegmentTable:
    """Stride 127 words: 127 lanes per block, the worst case of the Pallas-Triton lane arithmetic."""
    return SegmentTable(508 * num_blocks, num_blocks, (Segment(0, 508, 4),))


TRITON_MAX_BLOCKS = (2**31 - 1) // 127 + 1  # 16,909,321: lane0 = 127 * (num_blocks - 1) <= 2**31 - 1


@needs_pallas
def test_pallas_triton_refuses_tables_beyond_int32_lanes() -> None:
    z = kp.PallasZeroer(_lane_table(TRITON_MAX_BLOCKS), kernel="triton", interpret=True)
    assert z.table.num_blocks == TRITON_MAX_BLOCKS
    with pytest.raises(K.TableError, match=f"at most {TRITON_MAX_BLOCKS} blocks") as e:
        kp.PallasZeroer(_lane_table(TRITON_MAX_BLOCKS + 1), kernel="triton", interpret=True)
    assert e.value.field == "table.num_blocks" and e.value.value == TRITON_MAX_BLOCKS + 1
    assert f"table.num_blocks = {TRITON_MAX_BLOCKS + 1}" in str(e.value)
    # the TPU kernel adds whole rows per block (int32 row offsets, checked by the planner): accepted
    assert (
        kp.PallasZeroer(_lane_table(TRITON_MAX_BLOCKS + 1), kernel="tpu", interpret=True).plan.period == 128
    )


@needs_pallas
def test_pallas_triton_refuses_buffers_beyond_int32_rows() -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(4))
    z = kp.PallasZeroer(t, kernel="triton", interpret=True)
    big = jax.ShapeDtypeStruct((2**31, 128), jnp.int32)  # never allocated: traced only
    ids = jax.ShapeDtypeStruct((8,), jnp.int32)
    with pytest.raises(K.LayoutBufferError, match="buffer rows = 2147483648") as e:
        jax.eval_shape(z.apply, big, ids)
    assert e.value.field == "buffer.shape"


@needs_pallas
def test_pallas_host_ids_checked_before_int32_cast() -> None:
    assert kp.zeroer.bucket_ids(np.array([3, 2**31 - 1])).dtype == np.int32
    with pytest.raises(K.BlockIdError, match="id 2147483648 does not fit int32"):
        kp.zeroer.bucket_ids(np.array([3, 2**31]))


# ============================================================================ 7. API misuse
def _assert_names(err: K.KVLayoutError, field: str, value: Any) -> None:
    assert isinstance(err, K.KVLayoutError)
    assert err.field == field, (err.field, str(err))
    assert f"{field} = {value!r}" in str(err), str(err)


PALLAS_MISUSE = [
    ("tile_rows", 0),
    ("tile_rows", True),
    ("ids_per_step", 0),
    ("ids_per_step", -8),
    ("chunk_rows", 0),
    ("chunk_rows", 3),
    ("chunk_rows", 2.0),
    ("num_warps", 0),
    ("num_warps", 3),
    ("programs", 0),
    ("programs", False),
    ("interpret", "yes"),
    ("kernel", "cuda"),
    ("offset", -4),
]


@needs_pallas
@pytest.mark.parametrize(("field", "value"), PALLAS_MISUSE)
def test_pallas_option_misuse(field: str, value: Any) -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(2))
    with pytest.raises(K.KVLayoutError) as e:
        kp.PallasZeroer(t, **{field: value})
    _assert_names(e.value, field, value)


CUDA_MISUSE = [
    ("chunk_words", 3),
    ("chunk_words", 0),
    ("chunk_words", 2**31),
    ("sub_words", 0),
    ("sub_words", 100),
    ("num_warps", 0),
    ("num_warps", 6),
    ("max_programs", 0),
    ("max_programs", 1.5),
    ("max_batch", 0),
    ("max_batch", True),
    ("max_batch", 2.0),
    ("cache_modifier", ".bogus"),
    ("eviction_policy", None),
    ("offset", 2),
]


@needs_cuda
@pytest.mark.parametrize(("field", "value"), CUDA_MISUSE)
def test_cuda_option_misuse(field: str, value: Any) -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(2))
    data = K.poison_pattern(t.total_bytes + 8)
    buf = on_device(data)
    with pytest.raises(K.KVLayoutError) as e:
        kc.CudaZeroer(t, buf, **{field: value})
    _assert_names(e.value, field, value)
    assert np.array_equal(host(buf), data)


@needs_cuda
def test_plan_units_misuse_is_a_kvlayout_error() -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(2))
    with pytest.raises(K.BackendError) as e:
        kc.plan_units(t, chunk_words=6)
    _assert_names(e.value, "chunk_words", 6)


@pytest.mark.parametrize("bad", ["table.json", None, 3, {"segments": []}])
def test_non_table_first_argument(bad: Any) -> None:
    ran = 0
    if kc is not None:
        with pytest.raises(K.TableError) as e:
            kc.CudaZeroer(bad, torch.zeros(64, dtype=torch.uint8, device=kc.DEVICE_TYPE))
        assert e.value.field == "table" and f"table type = {type(bad).__name__}" in str(e.value)
        with pytest.raises(K.TableError, match="layout type = "):
            kc.ShardedCudaZeroer(bad, [])
        ran += 1
    if kp is not None:
        with pytest.raises(K.TableError) as e:
            kp.PallasZeroer(bad)
        assert e.value.field == "table" and f"table type = {type(bad).__name__}" in str(e.value)
        from jax.sharding import Mesh

        with pytest.raises(K.TableError, match="layout type = "):
            kp.ShardedPallasZeroer(bad, Mesh(np.array(jax.devices()[:1]), ("x",)))
        ran += 1
    if not ran:
        pytest.skip("needs a backend extra")


# ============================================================================ plan: per-block overlaps
@needs_pallas
def test_pallas_refuses_rows_overlapping_within_a_block() -> None:
    from kvlayout.backends.pallas.plan import check_rows_disjoint_per_block

    t = K.plan(K.preset("dsv4").with_num_blocks(4))  # overlaid groups share bytes in every block
    with pytest.raises(K.TableError, match=r"segments\[\d+\] and segments\[\d+\] overlap inside block 0"):
        kp.PallasZeroer(t, coalesce=False)
    kp.PallasZeroer(t)  # coalesced: disjoint
    # different strides meeting only in block 8: found exactly, named by the block
    odd = SegmentTable(256, 10, (Segment(0, 16, 8), Segment(64, 8, 4)))
    with pytest.raises(K.TableError, match=r"segments\[0\] and segments\[1\] overlap inside block 8") as e:
        check_rows_disjoint_per_block(odd)
    assert e.value.value == (0, 1)
    check_rows_disjoint_per_block(SegmentTable(256, 10, (Segment(0, 16, 8), Segment(8, 16, 8))))


# ============================================================================ native only: CUDA graphs
@needs_cuda
@pytest.mark.skipif(kc is None or kc.MODE != "native", reason="CUDA graphs need a GPU")
def test_cuda_graph_owns_its_buffers() -> None:
    """A captured routed step keeps its own buffers: later eager calls never overwrite them."""
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 4}, block_axes=("dp",))
    datas, bufs = shard_buffers(lay)
    z = kc.ShardedCudaZeroer(lay, bufs, offset=GUARD)
    static = torch.tensor([1, 6], device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        z.zero(static)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        z.zero(static)
    z.zero(torch.tensor([9, 12], device="cuda"))  # eager, between capture and replay
    static.copy_(torch.tensor([3, 14], device="cuda"))
    graph.replay()
    z.zero([0])
    torch.cuda.synchronize()
    z.check()
    check_shards(lay, datas, bufs, [0, 1, 3, 6, 9, 12, 14])
