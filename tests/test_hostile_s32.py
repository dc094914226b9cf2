"""Hostile pass 32 (/tmp/h32), on pass 31's fixes: each test failing on the code before its fix.

Pass 31 disabled torch functions through every public entry of the cuda zeroers; a caller's
TorchDispatchMode still answered the aten ops beneath them: ``aten.slice`` of the staged host ids (blocks
[0, 1, 2] zeroed for [1, 2]) and of the buffer's bytes at construction (every later call, with no mode on,
wrote one block further on, past the table). ``zeroer.plain_ops`` now disables dispatch too where a mode
is on the stack, and the buffer's view is proved to be its bytes at the offset."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout as K
from tests.hostile_cases import cuda, eight, to_dev, to_host, zeroed_blocks


def _modes() -> tuple[Any, Any]:
    """Two TorchDispatchModes: one widening a slice of int64 ids to four, one shifting a byte slice by
    a block."""
    torch, _ = cuda()
    from torch.utils._python_dispatch import TorchDispatchMode

    class Widen(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten.slice.Tensor and args[0].dtype == torch.int64 and args[0].numel() >= 4:
                args = (args[0], 0, 0, 4)
            return func(*args, **(kwargs or {}))

    class Shift(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten.slice.Tensor and args[0].dtype == torch.uint8:
                args = (args[0], args[1], args[2] + 256, args[3] + 256, *args[4:])
            return func(*args, **(kwargs or {}))

    return Widen, Shift


def test_a_dispatch_mode_cannot_widen_the_ids() -> None:
    torch, kc = cuda()
    widen, _ = _modes()
    for ids in ([1, 2], to_dev(torch.tensor([1, 2])), to_dev(torch.tensor([1, 2, 5, 6]))[:2]):
        host = K.poison_pattern(eight().total_bytes)
        buf = to_dev(torch.from_numpy(host.copy()))
        z = kc.CudaZeroer(eight(), buf, max_batch=8, graphs=False)
        with widen():
            z.zero(ids)
        z.check()
        assert zeroed_blocks(host, to_host(buf)) == [1, 2], ids


def test_a_dispatch_mode_at_construction_cannot_move_the_buffer() -> None:
    torch, kc = cuda()
    _, shift = _modes()
    t = eight()
    host = K.poison_pattern(t.total_bytes + 512)  # the table, then 512 guard bytes
    buf = to_dev(torch.from_numpy(host.copy()))
    with shift():
        z = kc.CudaZeroer(t, buf, graphs=False)
    z.zero([0, 7])  # no mode now
    assert K.changed_ranges(host, to_host(buf)).tolist() == K.expected_zeroed(t, [0, 7]).tolist()
    target = to_dev(torch.from_numpy(host.copy()))
    with shift():
        z.zero_into(target, to_dev(torch.tensor([7])))
    assert K.changed_ranges(host, to_host(target)).tolist() == K.expected_zeroed(t, [7]).tolist()


def test_the_buffer_view_is_proved_to_be_the_buffers_bytes() -> None:
    """``_buffer_words`` (the checks, without the guard) under the shifting mode: its view is refused."""
    torch, kc = cuda()
    from kvlayout.backends.cuda import zeroer

    from kvlayout.errors import LayoutBufferError

    _, shift = _modes()
    t = eight()
    buf = to_dev(torch.from_numpy(K.poison_pattern(t.total_bytes + 512).copy()))
    with shift(), pytest.raises(LayoutBufferError, match="buffer view: does not view the buffer's 2048 B"):
        zeroer._buffer_words(buf, t, 0)
    assert zeroer._buffer_words(buf, t, 256).data_ptr() == buf.data_ptr() + 256


def test_the_vllm_zeroers_warmup_runs_without_modes() -> None:
    """The warmup launches with an id past the pool, which writes nothing; a dispatch mode answering its
    ``aten.full`` with block 3 had it zeroed."""
    torch, _ = cuda()
    from torch.utils._python_dispatch import TorchDispatchMode

    from kvlayout.integrations.vllm import KVBlockZeroer

    class Three(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten.full.default and args[1] == 8:
                args = (args[0], 3, *args[2:])
            return func(*args, **(kwargs or {}))

    host = K.poison_pattern(eight().total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = KVBlockZeroer._from_table(eight(), buf, graphs=False)
    with Three():
        z.warmup()
    assert zeroed_blocks(host, to_host(buf)) == []
    z.zero_block_ids([5])
    assert zeroed_blocks(host, to_host(buf)) == [5]


def test_ids_standing_for_more_than_int32_max_are_refused_before_any_copy() -> None:
    """A stride-0 view (8 B of memory for 2**40 ids) had ``contiguous()`` / ``numpy()`` raise the
    allocator's raw error; a broadcast NumPy array a 1 TiB mask. Now a BlockIdError naming the count, the
    buffer untouched."""
    torch, kc = cuda()
    import numpy as np

    from kvlayout.errors import BlockIdError
    from kvlayout.sharding import shard_spec

    t = eight()
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = kc.CudaZeroer(t, buf, graphs=False)
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(8), {"dp": 2}, block_axes=("dp",))
    shard_host = [K.poison_pattern(lay.shard_bytes, s) for s in (1, 2)]
    shards = [to_dev(torch.from_numpy(h.copy())) for h in shard_host]
    sz = kc.ShardedCudaZeroer(lay, shards)
    huge = to_dev(torch.zeros(1, dtype=torch.int64)).expand(2**40)
    calls = {
        "zero": lambda: z.zero(huge),
        "zero_into": lambda: z.zero_into(to_dev(torch.from_numpy(host.copy())), huge),
        "launch_routed": lambda: z.launch_routed(huge, 0, 8),
        "sharded": lambda: sz.zero(huge),
        "numpy": lambda: z.zero(np.broadcast_to(np.int64(0), (2**40,))),
        "contract": lambda: K.expected_zeroed(t, np.broadcast_to(np.int64(0), (2**31,))),
    }
    refused = r"(2147483648|1099511627776)(.*at most 2147483647 ids| exceeds max_batch)|a broadcast view"
    for name, call in calls.items():
        with pytest.raises(BlockIdError, match=refused):
            call()
        assert zeroed_blocks(host, to_host(buf)) == [], name
    assert all((to_host(s) == h).all() for s, h in zip(shards, shard_host, strict=True))
    z.zero(to_dev(torch.tensor([3, 9, 4]))[::2])  # a strided view holds its ids: [3, 4]
    assert zeroed_blocks(host, to_host(buf)) == [3, 4]


class _Below(int):
    """An int whose comparisons all answer as if it were in range (``-4 >= 0``, ``-512 < 0`` False)."""

    def __lt__(self, other: object) -> bool:
        return False

    def __ge__(self, other: object) -> bool:
        return True

    def __le__(self, other: object) -> bool:
        return True

    def __gt__(self, other: object) -> bool:
        return True


def test_an_int_whose_comparisons_lie_is_no_integer() -> None:
    """``launch_routed``'s ``id_lo`` of such an int -4 zeroed block 4 for global id 0; a PallasZeroer's
    offset -512 planned block 0 before its buffer; cuda options -1 or 0 raised torch's and NumPy's raw
    errors. Every operator of int must be int's own; an IntEnum keeps them and stays an integer."""
    import enum

    import numpy as np

    from kvlayout.errors import BackendError, BlockIdError, KVLayoutError, LayoutBufferError
    from kvlayout.validate import is_int

    class Page(enum.IntEnum):
        THREE = 3

    class Wide(np.int64):
        def __lt__(self, other: object) -> bool:
            return False

    assert is_int(Page.THREE) and is_int(np.int64(3)) and is_int(3)
    assert not is_int(_Below(-4)) and not is_int(Wide(-4)) and not is_int(enum.IntFlag("F", "A").A)
    torch, kc = cuda()
    t = eight()
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = kc.CudaZeroer(t, buf, graphs=False)
    for call, exc in (
        (lambda: z.launch_routed(to_dev(torch.tensor([0])), _Below(-4), 8), BlockIdError),
        (lambda: z.launch_routed(to_dev(torch.tensor([0])), 0, _Below(0)), BlockIdError),
        (lambda: kc.CudaZeroer(t, buf, max_batch=_Below(-1)), BlockIdError),
        (lambda: kc.CudaZeroer(t, buf, chunk_words=_Below(-4)), BackendError),
        (lambda: kc.CudaZeroer(t, buf, sub_words=_Below(0)), BackendError),
        (lambda: kc.CudaZeroer(t, buf, max_programs=_Below(-3)), BackendError),
        (lambda: kc.CudaZeroer(t, buf, offset=_Below(-256)), LayoutBufferError),
    ):
        with pytest.raises(exc):
            call()
    assert zeroed_blocks(host, to_host(buf)) == []
    z.launch_routed(to_dev(torch.tensor([0])), Page.THREE, 11)  # global id 0 is not this buffer's (3..10)
    z.launch_routed(to_dev(torch.tensor([4])), Page.THREE, 11)
    z.check()
    assert zeroed_blocks(host, to_host(buf)) == [1]
    pytest.importorskip("jax")
    from kvlayout.backends.pallas import PallasZeroer

    with pytest.raises(KVLayoutError, match="offset"):
        PallasZeroer(t, offset=_Below(-512), kernel="triton", interpret=True)


def test_a_zeroer_made_in_inference_mode_works_outside_it() -> None:
    """Its own tensors (id slots, counts) were inference tensors: ``launch_routed`` outside the mode raised
    torch's "Inplace update to inference tensor outside InferenceMode"; the sharded zeroer's device ids
    too."""
    torch, kc = cuda()
    from kvlayout.sharding import shard_spec

    t = eight()
    host = K.poison_pattern(t.total_bytes)
    with torch.inference_mode():
        buf = to_dev(torch.from_numpy(host.copy())).clone()  # the cache itself made there too
        z = kc.CudaZeroer(t, buf, graphs=False)
        z.launch_routed(to_dev(torch.tensor([1])), 0, 8)
    z.launch_routed(to_dev(torch.tensor([3])), 0, 8)
    z.zero([5])
    with torch.inference_mode():
        z.zero(to_dev(torch.tensor([6])))
    z.check()
    assert zeroed_blocks(host, to_host(buf)) == [1, 3, 5, 6]
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(8), {"dp": 2}, block_axes=("dp",))
    shard_host = [K.poison_pattern(lay.shard_bytes, s) for s in (1, 2)]
    with torch.inference_mode():
        shards = [to_dev(torch.from_numpy(h.copy())) for h in shard_host]
        sz = kc.ShardedCudaZeroer(lay, shards, graphs=False)
    sz.zero(to_dev(torch.tensor([1, 5])))
    sz.check()
    for k, h in enumerate(shard_host):
        got = to_host(sz.zeroers[k].words).view("uint8")
        want = K.expected_zeroed(lay.local_table, [1])
        assert K.changed_ranges(h, got).tolist() == want.tolist(), k


def test_shards_sharing_memory_are_refused() -> None:
    """Shard 1 given a view of shard 0's buffer: zeroing its block 1 cleared shard 0's block 1 as well."""
    torch, kc = cuda()
    from kvlayout.errors import LayoutBufferError
    from kvlayout.sharding import shard_spec

    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(8), {"dp": 2}, block_axes=("dp",))
    buf = to_dev(torch.from_numpy(K.poison_pattern(lay.shard_bytes * 2)))
    for second in (buf[:], buf[4:], buf[lay.shard_bytes - 4 :]):
        with pytest.raises(LayoutBufferError, match=r"buffers\[1\]: share memory with shard 0's"):
            kc.ShardedCudaZeroer(lay, {0: buf, 1: second}, graphs=False)
    kc.ShardedCudaZeroer(lay, {0: buf[: lay.shard_bytes], 1: buf[lay.shard_bytes :]}, graphs=False)


def test_plan_for_batch_checks_its_count() -> None:
    """A float raised AttributeError, a str or None TypeError; -7 and 2**80 were cached under a bucket."""
    torch, kc = cuda()
    from kvlayout.errors import BlockIdError

    z = kc.CudaZeroer(eight(), to_dev(torch.from_numpy(K.poison_pattern(eight().total_bytes))), graphs=False)
    for bad in (2.5, "3", None, -7, 2**80, True, _Below(-1)):
        with pytest.raises(BlockIdError, match=r"num_ids = .*: must be an integer in \[0, 2147483647\]"):
            z.plan_for_batch(bad)  # type: ignore[arg-type]
    assert z.plan_for_batch(0) is z.plan_for_batch(1) and z.plan_for_batch(2**31 - 1) is not None


def test_native_spec_and_leaf_subclasses_are_refused() -> None:
    """A NativeCacheSpec subclass whose ``zeroed_mask`` said every leaf, or a NativeLeaf subclass whose
    ``group_names`` said ("a", "b"), had zeroing group a clear group b's leaf (the contract agreeing)."""
    from kvlayout.errors import LayoutBufferError, SpecError
    from kvlayout.native import NativeCacheSpec, NativeLeaf, native_tables, verify_native

    class Lying(NativeCacheSpec):
        def zeroed_mask(self, group: str | None = None) -> tuple[bool, ...]:
            return tuple(True for _ in self.leaves)

    class AllGroups(NativeLeaf):
        @property
        def group_names(self) -> tuple[str, ...]:
            return ("a", "b")

    k, v = NativeLeaf("k", (8, 128), "float32", "a"), NativeLeaf("v", (8, 128), "float32", "b")
    with pytest.raises(SpecError, match=r"leaves\[1\] = 'AllGroups': must be a NativeLeaf itself"):
        NativeCacheSpec((k, AllGroups("v", (8, 128), "float32", "b")))
    lying = Lying((k, v))
    for call in (native_tables, verify_native):
        with pytest.raises(SpecError, match="spec = 'Lying': must be a kvlayout.native.NativeCacheSpec itse"):
            call(lying)
    assert sorted(native_tables(NativeCacheSpec((k, v)), "a")["v"].segments) == []  # the plain one
    pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np
    from kvlayout.backends.pallas.native import CacheZeroer

    caches = {n: jnp.asarray(np.ones((8, 128), np.float32)) for n in ("k", "v")}
    with pytest.raises(LayoutBufferError, match="spec = 'Lying': must be"):
        CacheZeroer(caches, spec=lying)


def test_sharded_layout_subclasses_are_refused() -> None:
    """A ShardedLayout subclass whose ``block_shard`` said 0 for every shard had global id 1 (shard 0's
    local 1) clear shard 1's local block 1 too."""
    torch, kc = cuda()
    from kvlayout.errors import TableError
    from kvlayout.sharding import ShardedLayout, shard_spec

    good = shard_spec(K.preset("dsv4-test").with_num_blocks(8), {"dp": 2}, block_axes=("dp",))

    class Lying(ShardedLayout):
        def block_shard(self, shard: int) -> int:
            return 0

    lay = Lying(good.local_spec, good.mesh_axes, good.block_axes, good.shard_axes)
    bufs = [to_dev(torch.from_numpy(K.poison_pattern(lay.shard_bytes, s))) for s in (1, 2)]
    with pytest.raises(TableError, match="layout type = Lying: must be a kvlayout.ShardedLayout itself"):
        kc.ShardedCudaZeroer(lay, bufs, graphs=False)
    with pytest.raises(TableError, match="layout type = list: must be a kvlayout.ShardedLayout$"):
        kc.ShardedCudaZeroer([], bufs, graphs=False)  # type: ignore[arg-type]
    pytest.importorskip("jax")
    from kvlayout.backends.pallas.sharded import ShardedPallasZeroer

    with pytest.raises(TableError, match="layout type = Lying: must be a kvlayout.ShardedLayout itself"):
        ShardedPallasZeroer(lay, None)  # type: ignore[arg-type]


def test_functorch_transforms_and_fake_tensors_leave_no_plan_behind() -> None:
    """Inside ``torch.func.functionalize`` the ids are functional wrappers: torch's raw "invalid python
    storage", and the plan then built there was cached, so every later call raised it too. Under a
    FakeTensorMode one call cached a FakeTensor plan the same way. Now the wrapper is refused by name and
    plans are built outside every transform and mode."""
    torch, kc = cuda()
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kvlayout.errors import BlockIdError

    t = eight()
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = kc.CudaZeroer(t, buf, graphs=False)

    def step(ids: Any) -> Any:
        z.zero(ids)
        return ids

    with pytest.raises(BlockIdError, match="block_ids = a functional tensor"):
        torch.func.functionalize(step)(to_dev(torch.tensor([3])))
    torch.func.functionalize(step)([4])  # host ids: staged outside the transform, written
    with FakeTensorMode():
        z.zero([5])  # kvlayout's own work runs outside the caller's modes: the bytes are written
    z.zero(to_dev(torch.tensor([1])))
    z.zero([2])
    z.check()
    assert zeroed_blocks(host, to_host(buf)) == [1, 2, 4, 5]
    assert all(type(p.base) is torch.Tensor for p in z._plans.values())


def test_a_call_inside_torch_compile_runs_eagerly() -> None:
    """``z.zero(ids)`` in a ``torch.compile``d step raised Dynamo's fake-tensor error (Triton's under the
    interpreter); every public entry now runs outside the graph."""
    torch, kc = cuda()
    t = eight()
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = kc.CudaZeroer(t, buf, graphs=False)

    @torch.compile(backend="eager")
    def step(ids: Any) -> Any:
        z.zero(ids)
        return ids + 1

    assert step(to_dev(torch.tensor([1]))).tolist() == [2]
    step(to_dev(torch.tensor([2, 3])))
    z.check()
    assert zeroed_blocks(host, to_host(buf)) == [1, 2, 3]


def test_the_plugins_verify_mode_launches_on_the_ids_it_checked() -> None:
    """The verify mode checked the ids of ``torch.tensor(block_ids)`` and launched vLLM's unbounded kernel
    on a grid of ``len(block_ids)``, read again: a list subclass reading 2 then 4,096 had 4,094 programs
    read ids past the checked ones. The grid is the checked tensor's now, and the list must be plain."""
    import types

    torch, _ = cuda()
    from kvlayout.errors import BlockIdError
    from kvlayout.integrations import vllm_plugin as P

    launches = []

    class Kernel:
        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kw: launches.append((grid, args[3].numel()))

    cls = P._verifying_class(type("VLLMBase", (), {}), types.SimpleNamespace(_zero_kv_blocks_kernel=Kernel()))
    z = cls.__new__(cls)
    z._meta = (*(torch.zeros(1, dtype=torch.int64) for _ in range(3)), 1, 1024, 1)
    z.kvlayout_num_blocks, z.kvlayout_pin_memory, z.device = 8, False, torch.device("cpu")

    class Longer(list):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 4096

    z.zero_block_ids([1, 2])
    with pytest.raises(BlockIdError, match="block_ids = 'Longer': must be a plain list or tuple"):
        z.zero_block_ids(Longer([1, 2]))
    assert launches == [((2, 1, 1), 2)]


def test_from_dlpack_checks_the_capsule_torch_imports() -> None:
    """A producer that refused the first ask (kvlayout's read-only check) and answered torch's second with
    NumPy's read-only export of an immutable bytes object had that bytes object zeroed."""
    torch, kc = cuda()
    import numpy as np

    from kvlayout.errors import LayoutBufferError

    t = eight()
    data = bytes(K.poison_pattern(t.total_bytes))
    ro = np.frombuffer(data, dtype=np.uint8)

    class TwoFaced:
        asked = 0

        def __dlpack_device__(self) -> Any:
            return ro.__dlpack_device__()

        def __dlpack__(self, **kw: Any) -> Any:
            TwoFaced.asked += 1
            if TwoFaced.asked == 1:
                raise TypeError("busy")
            return ro.__dlpack__(**kw)

    with pytest.raises(LayoutBufferError, match=r"buffer = TwoFaced \(its DLPack export is read-only\)"):
        kc.CudaZeroer.from_dlpack(TwoFaced(), t, graphs=False)
    assert data == bytes(K.poison_pattern(t.total_bytes))
    if kc.DEVICE_TYPE == "cpu":  # a writeable NumPy array still goes in place (the same memory)
        rw = K.poison_pattern(t.total_bytes)
        kc.CudaZeroer.from_dlpack(rw, t, graphs=False).zero([2])
        assert zeroed_blocks(K.poison_pattern(t.total_bytes), rw) == [2]


def test_ids_read_through_a_second_mapping_of_the_buffer(tmp_path: Any) -> None:
    """The cache file mapped twice: ids [1, 2] kept in block 1, read through the other mapping, passed
    the address check and were cleared while the kernel read them (blocks [0, 1] zeroed). Ids in memory
    torch did not allocate are copied first. (Under the interpreter: a file mapping is host memory.)"""
    torch, kc = cuda()
    import numpy as np

    if kc.DEVICE_TYPE != "cpu":
        pytest.skip("host mappings: the interpreter's buffers (device memory mapped twice needs CUDA VMM)")
    t = eight()
    path = tmp_path / "cache.bin"
    K.poison_pattern(t.total_bytes).tofile(path)
    m_buf = np.memmap(path, dtype=np.uint8, mode="r+")
    m_ids = np.memmap(path, dtype=np.uint8, mode="r+")
    assert m_buf.ctypes.data != m_ids.ctypes.data
    m_ids[256:272] = np.array([1, 2], np.int64).view(np.uint8)
    before = np.array(m_buf)
    z = kc.CudaZeroer(t, torch.from_numpy(m_buf), graphs=False)
    z.zero(torch.from_numpy(m_ids[256:272].view(np.int64)))
    assert zeroed_blocks(before, np.array(m_buf)) == [1, 2]


def test_check_keeps_the_id_limits_of_launches_since_the_last_check_only() -> None:
    """Every id_limit ever given was kept: after 2,000 routed launches of distinct limits one bad id named
    them all (25,000 characters)."""
    torch, kc = cuda()
    from kvlayout.errors import BlockIdError

    z = kc.CudaZeroer(eight(), to_dev(torch.from_numpy(K.poison_pattern(eight().total_bytes))), graphs=False)
    empty = to_dev(torch.zeros(0, dtype=torch.int64))
    for limit in range(8, 40):
        z.launch_routed(empty, 0, limit)
    z.launch_routed(to_dev(torch.tensor([99])), 0, 50)
    with pytest.raises(BlockIdError) as info:
        z.check()
    assert str(info.value) == (
        "device block_ids: 1 work items had an id outside its launch's [0, id_limit) (id_limit 8 to 50 since "
        "the last check) (e.g. 99); they wrote nothing"
    )
    assert len(z._bounds) <= kc.zeroer.NAMED_BOUNDS
    z.launch_routed(to_dev(torch.tensor([12])), 0, 12)
    with pytest.raises(BlockIdError, match=r"outside \[0, 12\) \(e.g. 12\)"):
        z.check()  # the earlier limits are gone


def test_the_vllm_adapter_reads_the_views_without_a_callers_mode() -> None:
    """A TorchFunctionMode around ``from_kv_caches`` answered the views' ``storage_offset()`` one block
    further on: the views passed the plan on that answer, and ``zero_block_ids([0])`` (no mode on) cleared
    block 1. vLLM 0.33's own views at storage byte 4,096 of a poisoned storage."""
    torch, _ = cuda()
    pytest.importorskip("vllm")
    from tests.driver import ground_truth

    ground_truth()  # vLLM imported as the suite's vLLM tests import it (its CPU platform)
    from torch.overrides import TorchFunctionMode
    from vllm.v1 import kv_cache_interface as I

    from kvlayout.integrations.vllm import KVBlockZeroer

    names = ["model.layers.0.attn", "model.layers.1.attn"]
    attn = I.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)
    tensor = I.KVCacheTensor(size=8192, layers=names, layer_stride=1024, block_stride=2048)
    config = I.KVCacheConfig(
        num_blocks=4, kv_cache_tensors=[tensor], kv_cache_groups=[I.KVCacheGroupSpec(names, attn)],
        kv_cache_layout="BLHNC",
    )
    guard = 4096
    host = K.poison_pattern(guard + tensor.size + guard)
    storage = to_dev(torch.from_numpy(host.copy()))
    raw = storage.view(torch.int8)[guard : guard + tensor.size]
    made = I.create_kv_cache_views(raw, attn, 4, I.KVCacheLayout.BLHNC, tensor)
    views = dict(zip(names, made, strict=True))

    class Shift(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func is torch.Tensor.storage_offset and args[0].dtype == torch.bfloat16:
                return out + 1024  # elements: 2,048 B further on
            return out

    with Shift():
        z = KVBlockZeroer.from_kv_caches(config, views, graphs=False)
    z.zero_block_ids([0])
    got = K.changed_ranges(host, to_host(storage), origin=guard).tolist()
    assert got == K.expected_zeroed(z.table, [0]).tolist() == [[0, 2048]]


def test_host_batches_and_knobs_are_checked_before_any_work() -> None:
    """A broadcast NumPy view of 2**28 ids was validated (3.5 s, 500 MB) before its size met max_batch;
    ``zero_validated`` / ``check_batch`` raised AttributeError / TypeError; CacheZeroer's knobs took a
    lying int's 0 and -4096, and the vLLM table's base address compared one."""
    torch, kc = cuda()
    import time

    import numpy as np

    from kvlayout.errors import BackendError, BlockIdError, TableError

    z = kc.CudaZeroer(eight(), to_dev(torch.from_numpy(K.poison_pattern(eight().total_bytes))), graphs=False)
    start = time.perf_counter()
    with pytest.raises(BlockIdError, match="batch of 268435456 exceeds max_batch"):
        z.zero(np.broadcast_to(np.int64(1), (2**28,)))
    assert time.perf_counter() - start < 0.5
    for call, match in (
        (lambda: z.zero_validated([1, 2]), "block_ids type = list: must be a NumPy array"),
        (lambda: z.check_batch("3"), "batch size = '3': must be a count of ids"),
        (lambda: z.check_batch(None), "batch size = None: must be a count of ids"),
        (lambda: z.check_batch(-1), "batch size = -1: must be a count of ids"),
    ):
        with pytest.raises(BlockIdError, match=match):
            call()
    from kvlayout.integrations.vllm import table_from_block_zeroer

    with pytest.raises(TableError, match="base_address"):
        table_from_block_zeroer(object(), _Below(-4096), 2048, 8)
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from kvlayout.backends.pallas.native import CacheZeroer

    for knob in ({"tile_bytes": _Below(0)}, {"max_inflight": _Below(0)}, {"tile_bytes": _Below(-4096)}):
        with pytest.raises(BackendError, match="must be an integer from"):
            CacheZeroer([jnp.zeros((8, 128), jnp.float32)], **knob)


def test_one_row_stride_classes_are_not_swept_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """100,000 rows each of its own stride took 3.4 s to refuse: every one-row class went through the
    sweep before the cross-class count refused the table. Now the count comes first and a one-row class
    is decided on the spot (it meets itself only where wider than its stride)."""
    import importlib

    from kvlayout.errors import TableError
    from kvlayout.table import Segment, SegmentTable

    V = importlib.import_module("kvlayout.verify")  # the module (kvlayout.verify is also the function)
    swept = []
    real = V._class_isolation
    monkeypatch.setattr(V, "_class_isolation", lambda idx, *a: swept.append(idx.size) or real(idx, *a))
    rows = 2000
    segs = tuple(Segment(4 * i, 8 * (i + 1), 4, "a", f"l{i}") for i in range(rows))
    nb = 4
    total = 4 * rows + (nb - 1) * 8 * rows + 8
    with pytest.raises(TableError, match="pairs of rows with different strides"):
        V.verify(SegmentTable(total, nb, segs))
    assert swept == []
    apart = tuple(Segment(64 * i, 64 * rows + 4 * i, 4, "a", f"l{i}") for i in range(3))  # three classes
    wide = Segment(64 * 3, 8, 16, "a", "wide")  # wider than its stride: meets itself a block on
    report = V.verify(SegmentTable(64 * rows + 4 * 3 + 3 * (64 * rows + 8) + 64, 4, (*apart, wide)))
    assert swept == [] and [v.invariant for v in report.violations] == [3]
    assert report.violations[0].blocks == (0, 1) and report.violations[0].rows == (3,)
