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






# ============================================================================ 3. sharded host validation


# ============================================================================ 4. read-only memory
def _readonly_numpy(n: int) -> np.ndarray:
    a = K.poison_pattern(n)
    a.flags.writeable = False
    return a








# ============================================================================ 5. tables without rows




# ============================================================================ 6. int32 limits
def _lane_table(num_blocks: int) -> SegmentTable:
    """Stride 127 words: 127 lanes per block, the worst case of the Pallas-Triton lane arithmetic."""
    return SegmentTable(508 * num_blocks, num_blocks, (Segment(0, 508, 4),))


TRITON_MAX_BLOCKS = (2**31 - 1) // 127 + 1  # 16,909,321: lane0 = 127 * (num_blocks - 1) <= 2**31 - 1








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
