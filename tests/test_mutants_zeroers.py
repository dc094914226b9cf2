"""Host-side rules of the cuda zeroer that mutation testing found unpinned (issue 25).

The Python around the Triton kernels (``backends/cuda/zeroer.py``): every refusal's full
``field = value: why``, the id paths of ``_fill`` (lists of every length, tuples, arrays),
``zero_into`` on a copy of the buffer, the handle registry, the batch buckets and the
small-batch plans. A tiny table (one 512 B page a block), so the interpreter runs fast.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")
Z = pytest.importorskip("kvlayout.backends.cuda.zeroer")

NATIVE = kc.MODE == "native"


def tiny(num_blocks: int = 6) -> K.SegmentTable:
    layer = K.FullAttentionSpec(name="a", block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")
    return K.plan(K.KVCacheSpec(num_blocks, "BLHNC", (K.GroupSpec("g", (layer,)),)))


def make(num_blocks: int = 6, **kw: Any) -> tuple[K.SegmentTable, np.ndarray, torch.Tensor, Any]:
    t = tiny(num_blocks)
    data = K.poison_pattern(t.total_bytes, seed=num_blocks)
    buf = torch.from_numpy(data.copy()).to(kc.DEVICE_TYPE)
    return t, data, buf, kc.CudaZeroer(t, buf, graphs=False, **kw)


def expect(t: K.SegmentTable, data: np.ndarray, ids: list[int]) -> np.ndarray:
    out = data.copy()
    K.zero_blocks_numpy(out, t, ids)
    return out


def refused(exc: type[Exception], call: Any, field: str, value: Any, message: str) -> None:
    with pytest.raises(exc) as info:
        call()
    assert str(info.value) == message
    assert (info.value.field, info.value.value) == (field, value)  # type: ignore[attr-defined]


def test_buffer_and_id_tensor_refusals() -> None:
    t = tiny()
    refused(
        K.LayoutBufferError,
        lambda: kc.CudaZeroer(t, np.zeros(4096, np.uint8)),
        "buffer",
        "ndarray",
        "buffer type = ndarray: must be a torch.Tensor",
    )
    if not NATIVE:
        meta = torch.zeros(4096, dtype=torch.uint8, device="meta")
        refused(
            K.LayoutBufferError,
            lambda: kc.CudaZeroer(t, meta),
            "buffer.device",
            "meta",
            "buffer device = meta: must be on the CPU (Triton interpreter: no CUDA device here)",
        )
    strided = torch.zeros(8192, dtype=torch.uint8, device=kc.DEVICE_TYPE)[::2]
    refused(
        K.LayoutBufferError,
        lambda: kc.CudaZeroer(t, strided),
        "buffer",
        "non-contiguous",
        "buffer: must be contiguous",
    )
    odd = torch.zeros(8192, dtype=torch.uint8, device=kc.DEVICE_TYPE)[1:4097]
    refused(
        K.LayoutBufferError,
        lambda: kc.CudaZeroer(t, odd),
        "buffer.data_ptr",
        odd.data_ptr(),
        f"buffer data_ptr = {odd.data_ptr():#x}: must be 4-byte aligned",
    )
    ids = torch.zeros(2, dtype=torch.int16)
    refused(
        K.BlockIdError,
        lambda: Z.check_id_tensor(ids),
        "block_ids.dtype",
        "torch.int16",
        "block_ids dtype = torch.int16: must be int32 or int64",
    )
    refused(
        K.BlockIdError,
        lambda: Z.check_id_tensor(torch.zeros(2, 2, dtype=torch.int64)),
        "block_ids",
        (2, 2),
        "block_ids shape = (2, 2): must be 1-D",
    )
    Z.check_id_tensor(torch.zeros(3, dtype=torch.int32))


def test_option_refusals() -> None:
    t, data, buf, _ = make()
    for bad in (0, True, 2.0, 2**31):
        refused(
            K.BlockIdError,
            lambda bad=bad: kc.CudaZeroer(t, buf, max_batch=bad),
            "max_batch",
            bad,
            f"max_batch = {bad!r}: must be a positive integer, at most {2**31 - 1}",
        )
    assert kc.CudaZeroer(t, buf, max_batch=np.int64(3), graphs=False).max_batch == 3
    assert kc.CudaZeroer(t, buf, graphs=False).max_batch == 1 << 16
    refused(
        K.BackendError,
        lambda: kc.CudaZeroer(t, buf, cache_modifier=".x"),
        "cache_modifier",
        ".x",
        f"cache_modifier = '.x': must be one of {Z.CACHE_MODIFIERS}",
    )
    refused(
        K.BackendError,
        lambda: kc.CudaZeroer(t, buf, eviction_policy=1),
        "eviction_policy",
        1,
        f"eviction_policy = 1: must be one of {Z.EVICTION_POLICIES}",
    )
    for name in ("graphs", "small_batch"):
        refused(
            K.BackendError,
            lambda name=name: kc.CudaZeroer(t, buf, **{name: 1}),
            name,
            1,
            f"{name} = 1: must be True or False",
        )
    z = kc.CudaZeroer(t, buf, graphs=False, max_programs=5, cache_modifier=".cg", eviction_policy="")
    assert (z.max_programs, z.cache_modifier, z.eviction_policy, z.offset) == (5, ".cg", "", 0)
    assert z.max_programs == 5 and kc.CudaZeroer(t, buf, graphs=False).max_programs == (
        z.max_programs if NATIVE else 64
    )
    assert np.array_equal(buf.cpu().numpy(), data)


def test_fill_paths_stage_exactly_and_refuse_naming_the_element() -> None:
    t, data, buf, z = make(num_blocks=6000, max_batch=6000)
    n = t.num_blocks
    dst = np.zeros(6000, np.int64)
    for ids in (
        [3, 1],
        (4, 4, 0),
        [2] * 65,
        [n - 1] * 100,
        [5, 1] + [2] * 98,
        [7] * 5000,
        list(range(4097)),
        np.array([9, 8], np.int32),
        [np.int64(3), 4],
    ):
        k = z._fill(dst, ids)
        assert k == len(ids) and dst[:k].tolist() == [int(i) for i in ids], type(ids)
    assert z._fill(dst, []) == 0 and z._fill(dst, ()) == 0
    for ids, where in (
        ([0] * 70 + [1], None),
        ([1] * 70 + [True], 70),
        ([2] * 66 + [-1], 66),
        ([2] * 66 + [n], 66),
        ([3] * 4100 + [n], 4100),
        ([3] * 4100 + [2**64], 4100),
        ([1] * 3 + [n], 3),
        ([-2, 1], 0),
        ([2**64], 0),
        ([0, 1.0], 1),
    ):
        if where is None:
            assert z._fill(dst, ids) == len(ids)  # 0 and 1 are ids, not bools
            continue
        with pytest.raises(K.BlockIdError, match=rf"^block_ids\[{where}\]"):
            z._fill(dst, ids)
    small = kc.CudaZeroer(t, buf, graphs=False, max_batch=4)
    for ids in ([1] * 5, (1,) * 5, np.ones(5, np.int64), [1] * 70):
        refused(
            K.BlockIdError,
            lambda ids=ids: small._fill(dst, ids),
            "block_ids",
            5 if len(ids) == 5 else 70,
            f"block_ids: batch of {len(ids)} exceeds max_batch 4",
        )
    refused(
        K.BlockIdError,
        lambda: small.zero_validated(np.ones(5, np.int64)),
        "block_ids",
        5,
        "block_ids: batch of 5 exceeds max_batch 4",
    )


def test_zero_into_a_copy_and_the_handle_registry() -> None:
    t, data, buf, z = make()
    copy = torch.from_numpy(data.copy()).to(kc.DEVICE_TYPE)
    z.zero_into(copy, torch.tensor([2, 4]))
    assert np.array_equal(copy.cpu().numpy(), expect(t, data, [2, 4]))
    assert np.array_equal(buf.cpu().numpy(), data)  # the zeroer's own buffer untouched
    z.zero_into(buf, torch.tensor([1]), "g")  # its own buffer: the per-step path
    assert np.array_equal(buf.cpu().numpy(), expect(t, data, [1]))
    refused(
        K.BlockIdError,
        lambda: z.zero_into(copy, [1]),
        "block_ids",
        "list",
        "block_ids type = list: must be a tensor",
    )
    with pytest.raises(K.BlockIdError, match=r"^block_ids\[0\]"):
        z.zero_into(copy, torch.tensor([t.num_blocks]))
    z.zero_into(copy, torch.tensor([], dtype=torch.int64))
    assert np.array_equal(copy.cpu().numpy(), expect(t, data, [2, 4]))
    h = z.handle
    assert h == z.handle and Z.zeroer_for_handle(h) is z
    other = kc.CudaZeroer(t, copy, graphs=False)
    assert other.handle != h and Z.zeroer_for_handle(other.handle) is other
    refused(
        K.BackendError,
        lambda: Z.zeroer_for_handle(-5),
        "handle",
        -5,
        "handle = -5: no live CudaZeroer has this handle",
    )


def test_buckets_and_small_batch_plans() -> None:
    assert [Z._bucket(k, 64) for k in (1, 2, 3, 5, 64, 65, 1000)] == [1, 2, 4, 8, 64, 64, 64]
    t, data, buf, z = make(num_blocks=64, max_programs=64, chunk_words=64)
    assert z.plan_for_batch(1).plan.chunk_words == 64  # no small chunk below the chunk itself
    refused(
        K.TableError, lambda: z._plan_for(3), "group", "3", "group = 3: must be a group name (str) or None"
    )
    z.zero([5, 6], "g")
    z.zero(np.array([7]))
    z.zero(torch.tensor([8], dtype=torch.int32))
    z.check()
    assert np.array_equal(buf.cpu().numpy(), expect(t, data, [5, 6, 7, 8]))


def test_check_reports_bad_device_ids_once() -> None:
    t, data, buf, z = make()
    z._launch(torch.tensor([t.num_blocks, 1, -1]))
    with pytest.raises(K.BlockIdError) as info:
        z.check()
    assert str(info.value).startswith("device block_ids: ") and f"outside [0, {t.num_blocks})" in str(
        info.value
    )
    assert info.value.field == "block_ids"
    z.check()  # reported once
    assert np.array_equal(buf.cpu().numpy(), expect(t, data, [1]))


def test_launch_routed_zeroes_the_local_ids_of_a_global_batch() -> None:
    """Shard ``[6, 12)`` of a global pool of 18 blocks: its ids are local ``id - 6``, others skip."""
    t, data, buf, z = make(max_batch=2)
    z.capture()  # no replay graphs here: nothing to capture (graphs=False, or the interpreter)
    ids = torch.tensor([7, 2, 11, 16, 7], device=kc.DEVICE_TYPE)  # more ids than max_batch: grows
    z.launch_routed(ids, 6, 18)
    z.launch_routed(torch.tensor([9], device=kc.DEVICE_TYPE), 6, 18, "g")
    z.check()  # every id inside [0, 18): none is bad
    assert np.array_equal(buf.cpu().numpy(), expect(t, data, [1, 3, 5]))
    z.launch_routed(torch.tensor([18, 8, -1], device=kc.DEVICE_TYPE), 6, 18)
    bound = r"^device block_ids: \d+ work items had an id outside \[0, 18\)"  # the global pool
    with pytest.raises(K.BlockIdError, match=bound):
        z.check()
    assert np.array_equal(buf.cpu().numpy(), expect(t, data, [1, 2, 3, 5]))


class _Exporter:
    """Memory owned elsewhere, exported only through ``__dlpack__`` (any keyword it is given)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kw: Any) -> Any:
        return self.array.__dlpack__(**kw)

    def __dlpack_device__(self) -> Any:
        return self.array.__dlpack_device__()


class _OldExporter(_Exporter):
    def __dlpack__(self, stream: Any = None) -> Any:  # no max_version: an unversioned capsule
        return self.array.__dlpack__()


def test_read_only_memory_is_found_and_refused() -> None:
    frozen = np.zeros(4096, np.uint8)
    frozen.flags.writeable = False
    free = np.zeros(4096, np.uint8)
    ro = Z._dlpack_read_only
    assert ro(frozen) and ro(_Exporter(frozen)) and ro(frozen.__dlpack__(max_version=(1, 0)))
    assert not ro(free) and not ro(_Exporter(free)) and not ro(free.__dlpack__()) and not ro(object())
    assert not ro(_OldExporter(free)) and not ro(torch.zeros(4))
    t = tiny()
    refused(
        K.LayoutBufferError,
        lambda: kc.CudaZeroer.from_dlpack(_Exporter(frozen), t),
        "buffer",
        "read-only",
        "buffer = _Exporter (read-only): zeroing writes in place; pass writeable memory",
    )
    with pytest.raises(K.LayoutBufferError) as info:
        kc.CudaZeroer.from_dlpack(object(), t)
    assert str(info.value).startswith("buffer type = object: not importable through DLPack (")
    assert (info.value.field, info.value.value) == ("buffer", "object")
    if not NATIVE:  # host memory is the interpreter's device memory
        data = K.poison_pattern(t.total_bytes, seed=1)
        mem = data.copy()
        z = kc.CudaZeroer.from_dlpack(_Exporter(mem), t, graphs=False, max_batch=4)
        assert z.max_batch == 4
        z.zero([3])
        assert np.array_equal(mem, expect(t, data, [3]))


def two_groups(num_blocks: int = 6) -> K.SegmentTable:
    a = K.FullAttentionSpec(name="a", block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")
    b = K.FullAttentionSpec(name="b", block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")
    c = K.FullAttentionSpec(name="c", block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")
    # groups overlay their layers slot by slot: g's second layer has bytes of its own
    return K.plan(K.KVCacheSpec(num_blocks, "BLHNC", (K.GroupSpec("g", (a, c)), K.GroupSpec("h", (b,)))))


def test_every_entry_point_zeroes_only_the_named_group() -> None:
    t = two_groups()
    data = K.poison_pattern(t.total_bytes, seed=11)

    def fresh(**kw: Any) -> tuple[torch.Tensor, Any]:
        buf = torch.from_numpy(data.copy()).to(kc.DEVICE_TYPE)
        return buf, kc.CudaZeroer(t, buf, graphs=False, **kw)

    def only(ids: list[int], group: str) -> np.ndarray:
        out = data.copy()
        K.zero_blocks_numpy(out, t, ids, group=group)
        return out

    assert not np.array_equal(only([1], "h"), only([1], "g"))  # the groups' bytes differ

    for kw in ({}, {"small_batch": False}):
        buf, z = fresh(**kw)
        z.zero(torch.tensor([2], device=kc.DEVICE_TYPE), "h")  # device ids
        assert np.array_equal(buf.cpu().numpy(), only([2], "h")), kw
    buf, z = fresh()
    z.zero_into(buf, torch.tensor([3], device=kc.DEVICE_TYPE), "h")  # its own buffer
    assert np.array_equal(buf.cpu().numpy(), only([3], "h"))
    copy = torch.from_numpy(data.copy()).to(kc.DEVICE_TYPE)
    z.zero_into(copy, torch.tensor([4], device=kc.DEVICE_TYPE), "g")  # a copy of it
    assert np.array_equal(copy.cpu().numpy(), only([4], "g"))
    buf, z = fresh(max_batch=2)
    z.zero_validated(np.array([1, 5]), "h")  # exactly max_batch ids
    assert np.array_equal(buf.cpu().numpy(), only([1, 5], "h"))
    buf, z = fresh()
    z.launch_routed(torch.tensor([9], device=kc.DEVICE_TYPE), 6, 12, "g")
    assert np.array_equal(buf.cpu().numpy(), only([3], "g"))


def test_routed_ids_past_float_precision_and_bad_device_ids() -> None:
    t, data, buf, z = make()
    lo = 2**24 + 6  # global ids past 2**24 (not exact in float32) route to the right local block
    z.launch_routed(torch.tensor([lo + 1, lo + 4], device=kc.DEVICE_TYPE), lo, 2**25)
    z.check()
    assert np.array_equal(buf.cpu().numpy(), expect(t, data, [1, 4]))
    if not NATIVE:  # CPU tensors are host ids under the interpreter: refused before anything runs
        with pytest.raises(K.BlockIdError, match=r"^block_ids\[1\]"):
            z.zero(torch.tensor([0, t.num_blocks]))
        assert np.array_equal(buf.cpu().numpy(), expect(t, data, [1, 4]))
    z._launch(torch.tensor([t.num_blocks + 3], device=kc.DEVICE_TYPE))
    with pytest.raises(K.BlockIdError) as info:
        z.check()
    assert info.value.value == t.num_blocks + 3
