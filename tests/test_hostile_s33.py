"""Hostile pass 33 (/tmp/h33), on pass 32's fixes: each test failing on the code before its fix."""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError
from tests.hostile_cases import eight


def test_jax_apply_refuses_ids_counted_past_int32_max_before_any_mask() -> None:
    """``apply`` with a broadcast host array of 2**40 ids raised NumPy's 1 TiB MemoryError (``__call__``
    refused them by name)."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from kvlayout.backends.pallas import PallasZeroer
    from kvlayout.backends.pallas.native import CacheZeroer

    huge = np.broadcast_to(np.int64(1), (2**40,))
    z = PallasZeroer(eight(), kernel="triton", interpret=True)
    buf = jnp.asarray(K.poison_pattern(z.rows * 128 * 4).view(np.int32).reshape(z.rows, 128))
    zc = CacheZeroer({"k": jnp.zeros((8, 128), jnp.float32)}, kernel="triton", interpret=True)
    for call in (lambda: z.apply(buf, huge), lambda: zc.apply({"k": jnp.zeros((8, 128), jnp.float32)}, huge)):
        with pytest.raises(BlockIdError, match="block_ids.size = 1099511627776: at most 2147483647 ids"):
            call()


def test_a_broadcast_view_of_device_ids_is_refused() -> None:
    """8 B standing for 2**31 - 1 ids (under the count bound) had ``contiguous()`` ask 16 GiB: the
    allocator's raw error, or 16 GiB taken natively."""
    from tests.hostile_cases import cuda, to_dev, to_host, zeroed_blocks

    torch, kc = cuda()
    t = eight()
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = kc.CudaZeroer(t, buf, graphs=False)
    for n in (2**31 - 1, 3):
        ids = to_dev(torch.tensor([1])).expand(n)
        for call in (lambda ids=ids: z.zero(ids), lambda ids=ids: z.launch_routed(ids, 0, 8),
                     lambda ids=ids: z.zero_into(to_dev(torch.from_numpy(host.copy())), ids)):
            with pytest.raises(BlockIdError, match=r"block_ids = a broadcast view \(stride 0\)"):
                call()
    z.zero(to_dev(torch.tensor([2])).expand(1))  # one id: nothing overlaps
    assert zeroed_blocks(host, to_host(buf)) == [2]


def test_an_object_whose_class_says_int_is_no_integer() -> None:
    """``isinstance`` believes an object's own ``__class__``: ``honest_int`` then raised a raw ValueError
    (and the error message's formatting an AttributeError) wherever an integer is taken."""
    from kvlayout.errors import short
    from kvlayout.validate import block_ids, is_int

    class Fake:
        __class__ = property(lambda self: int)  # type: ignore[assignment]

    f = Fake()
    assert isinstance(f, int) and not is_int(f)
    assert short(f).startswith("<")
    with pytest.raises(BlockIdError, match=r"block_ids\[1\] = .*: must be an integer \(nothing was"):
        block_ids([1, f], 8)
    from tests.hostile_cases import cuda, to_dev

    torch, kc = cuda()
    z = kc.CudaZeroer(eight(), to_dev(torch.from_numpy(K.poison_pattern(eight().total_bytes))), graphs=False)
    with pytest.raises(BlockIdError, match=r"block_ids\[1\]"):
        z.zero([1, f])


def test_the_plugins_verify_step_checks_without_a_callers_mode() -> None:
    """A TorchFunctionMode answering ``aminmax`` with (0, 1) had id 5000 of an 8-block pool reach vLLM's
    unbounded kernel in verify mode."""
    from tests.hostile_cases import cuda, verifying_zeroer

    torch, _ = cuda()
    from torch.overrides import TorchFunctionMode

    z, launches = verifying_zeroer()

    class Small(TorchFunctionMode):
        def __torch_function__(self, func: object, types: object, args: object = (), kwargs: object = None
                               ) -> object:
            if func is torch.aminmax:
                return torch.tensor(0), torch.tensor(1)
            return func(*args, **(kwargs or {}))  # type: ignore[operator, arg-type]

    with Small(), pytest.raises(BlockIdError, match=r"block_ids\[1\] = 5000: outside \[0, 8\)"):
        z.zero_block_ids([1, 5000])
    assert launches == []


def test_64_bit_jax_ids_made_with_x64_on_are_refused_with_it_off() -> None:
    """Id 2**32 + 3 made while x64 was on and zeroed after it was off: JAX narrowed it to 3 at kvlayout's
    own jit, and block 3 was zeroed with no bad id counted (``__call__``, ``apply``, CacheZeroer, a list)."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from kvlayout.backends.pallas import PallasZeroer
    from kvlayout.backends.pallas.native import CacheZeroer

    jax.config.update("jax_enable_x64", True)
    try:
        ids = jnp.asarray(np.array([2**32 + 3], np.int64))
    finally:
        jax.config.update("jax_enable_x64", False)
    z = PallasZeroer(eight(), kernel="triton", interpret=True)
    buf = jnp.asarray(np.full(z.buffer_shape, 7, np.int32))
    zc = CacheZeroer({"k": jnp.ones((8, 128), jnp.float32)}, kernel="triton", interpret=True)
    for call in (lambda: z(buf, ids), lambda: z.apply(buf, ids), lambda: z.apply(buf, [ids[0], 1]),
                 lambda: zc({"k": jnp.ones((8, 128), jnp.float32)}, ids)):
        with pytest.raises(BlockIdError, match="64-bit ids with jax_enable_x64 off"):
            call()
    from kvlayout.backends.pallas import zeroer as Z

    ids32, ok = Z.masked_ids(np.array([2**32 + 3, 2], np.int64), np.ones(2, bool), 8)  # NumPy: host-narrowed
    assert np.asarray(ids32).tolist()[1] == 2 and np.asarray(ok).tolist() == [False, True]
    out = np.asarray(z(buf, jnp.asarray([3], jnp.int32)))  # int32 ids: as ever
    assert (out == 0).any() and z.check() is None


def test_the_tpu_inference_adapter_reads_groups_and_layer_names_plainly() -> None:
    """A group ``Lie(0)`` whose ``int()`` said 1 zeroed group 1's array; a str subclass layer name hashing
    as another layer's found that layer's array (group 0's zeroing cleared group 1's)."""
    import types

    pytest.importorskip("jax")
    import jax.numpy as jnp

    from kvlayout.errors import LayoutBufferError
    from kvlayout.integrations.tpu_inference import TpuInferenceZeroer

    class Lie(int):
        def __int__(self) -> int:
            return 1

    class Alias(str):
        def __hash__(self) -> int:
            return hash("l1")

        def __eq__(self, o: object) -> bool:
            return str.__eq__("l1", o)

    caches = [jnp.zeros((8, 16, 2, 8), jnp.float32) for _ in range(2)]

    def cfg(*names: list[str]) -> object:
        return types.SimpleNamespace(kv_cache_groups=[types.SimpleNamespace(layer_names=n) for n in names])

    z = TpuInferenceZeroer(caches, cfg(["l0"], ["l1"]), {"l0": 0, "l1": 1})
    for g in (Lie(0), np.timedelta64(1), 1.0, True):
        with pytest.raises(LayoutBufferError, match="group = "):
            z._check_group(g)
    assert z._check_group(np.int64(1)) == "1" and z._check_group("0") == "0" and z._check_group(None) is None
    with pytest.raises(LayoutBufferError, match="'lX': group 0's layer has no array"):
        TpuInferenceZeroer(caches, cfg(["l0", Alias("lX")], ["l1"]), {"l0": 0, "l1": 1})


def test_sharded_host_batches_meet_max_batch_before_their_values() -> None:
    """A broadcast view of 2**27 ids was validated for 5 s and 1 GB, then taken."""
    import time

    from kvlayout.sharding import shard_spec
    from tests.hostile_cases import cuda, to_dev

    torch, kc = cuda()
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(8), {"dp": 2}, block_axes=("dp",))
    bufs = [to_dev(torch.from_numpy(K.poison_pattern(lay.shard_bytes, s))) for s in (1, 2)]
    sz = kc.ShardedCudaZeroer(lay, bufs, max_batch=8, graphs=False)
    start = time.perf_counter()
    with pytest.raises(BlockIdError, match="batch of 134217728: more than max_batch on some shard"):
        sz.zero(np.broadcast_to(np.int64(1), (2**27,)))
    assert time.perf_counter() - start < 0.5
    sz.zero(np.arange(8, dtype=np.int64))  # 8 ids over two shards of max_batch 8: fine


def test_ids_in_shared_memory_mapped_again_as_the_buffer() -> None:
    """Ids in a ``share_memory_()`` storage (torch's own, ``resizable()``), the buffer a second mapping of
    those pages: the ids were cleared while the kernel read them (blocks [0, 1] for [1, 2])."""
    import mmap

    from tests.hostile_cases import cuda, zeroed_blocks

    torch, kc = cuda()
    if kc.DEVICE_TYPE != "cpu":
        pytest.skip("host shared memory: the interpreter's buffers")
    t = eight()
    shared = torch.from_numpy(K.poison_pattern(t.total_bytes)).clone().share_memory_()
    fd, size = shared.untyped_storage()._share_fd_cpu_()[:2]
    mm = mmap.mmap(fd, size)
    buf = torch.from_numpy(np.frombuffer(mm, np.uint8)[: t.total_bytes])
    ids = shared[256:272].view(torch.int64)
    ids.copy_(torch.tensor([1, 2]))
    before = buf.numpy().copy()
    kc.CudaZeroer(t, buf, graphs=False).zero(ids)
    assert zeroed_blocks(before, buf.numpy()) == [1, 2]


def test_a_shard_given_twice_is_refused() -> None:
    """An int subclass owning only ``__hash__`` (an integer to ``is_int``) gave shard 0 twice as two keys,
    and sorting them raised torch's raw error."""
    from kvlayout.errors import LayoutBufferError
    from kvlayout.sharding import shard_spec
    from tests.hostile_cases import cuda, to_dev

    torch, kc = cuda()

    class H(int):
        def __hash__(self) -> int:
            return 12345

    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(8), {"dp": 2}, block_axes=("dp",))
    a, b = (to_dev(torch.from_numpy(K.poison_pattern(lay.shard_bytes, s))) for s in (1, 2))
    with pytest.raises(LayoutBufferError, match="buffers: a shard is given twice"):
        kc.ShardedCudaZeroer(lay, {0: a, H(0): b}, graphs=False)
    assert kc.ShardedCudaZeroer(lay, {H(1): b}, graphs=False).shards == (1,)
