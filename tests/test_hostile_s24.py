"""Hostile pass 24 (/tmp/h24: the cuda zeroer and its sharded form under the interpreter, the sharded NumPy
reference, the model rules of the pass-22 audit against vLLM 0.33's construction): one regression test per
finding fixed here, each failing on the code before its fix (b341dc1). Two of them wrote bytes outside the
buffer handed in: array and tensor subclasses whose own size readings lie. The model findings are
reported, not fixed here (kvlayout/models is another helper's)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import LayoutBufferError
from kvlayout.sharding import ShardedLayout


def _cuda() -> Any:
    pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    if kc.MODE == "native":
        pytest.skip("CPU rules: interpreter only")
    return kc


def _sharded() -> ShardedLayout:
    return K.sharding.shard_spec(K.preset("dsv4-test"), {"dp": 2}, block_axes=("dp",))


class _BigArray(np.ndarray):
    """An ndarray subclass whose ``nbytes`` says 1 TiB, whatever it holds."""

    @property
    def nbytes(self) -> int:
        return 1 << 40


class _Flags:
    c_contiguous = True
    writeable = True


class _ContiguousArray(np.ndarray):
    """An ndarray subclass whose ``flags`` say C-contiguous and writeable, whatever it is."""

    @property
    def flags(self) -> Any:
        return _Flags()


def test_h1_sharded_reference_reads_a_subclass_as_a_plain_array() -> None:
    """H1 (HIGH): ``ShardedLayout.zero_reference`` took a subclass's own ``nbytes``: one saying 1 TiB over
    4 KiB passed the size check, and its strided views zeroed 37,376 B past the buffer's end."""
    lay = _sharded()
    parent = np.full(lay.gathered_bytes, 7, np.uint8)
    with pytest.raises(LayoutBufferError, match=rf"^gathered bytes = 4096: needs {lay.gathered_bytes}$"):
        lay.zero_reference(parent[:4096].view(_BigArray), [99])
    assert (parent == 7).all()


def test_h2_sharded_reference_refuses_a_strided_array_that_says_contiguous() -> None:
    """H2 (HIGH): a subclass whose ``flags`` said C-contiguous over every other byte of its parent was viewed
    at its own strides by the byte-strided rows: bytes between its elements (not its own) were zeroed."""
    lay = _sharded()
    raw = np.full(2 * lay.gathered_bytes, 7, np.uint8)
    with pytest.raises(LayoutBufferError, match=r"^buffer = 'non-contiguous': must be C-contiguous"):
        lay.zero_reference(raw[::2].view(_ContiguousArray), [5])
    assert (raw == 7).all()
    # an honest subclass is still zeroed as a plain array (numpy.matrix: tests/test_hostile_s10.py)
    ok = K.poison_pattern(lay.gathered_bytes)
    lay.zero_reference(ok.view(_BigArray), [5])
    want = lay.expected_zeroed([5]).tolist()
    assert K.changed_ranges(K.poison_pattern(lay.gathered_bytes), ok).tolist() == want


def _lying_tensor_class() -> type:
    import torch

    class BigElements(torch.Tensor):
        """A tensor subclass whose bfloat16 elements say they are 1 MiB each."""

        def element_size(self) -> int:
            return 1 << 20 if self.dtype == torch.bfloat16 else int(super().element_size())

    return BigElements


def test_h3_cuda_zeroer_refuses_a_tensor_subclass() -> None:
    """H3 (HIGH): ``CudaZeroer`` sized its buffer by the tensor's own ``numel() * element_size()``: a
    subclass saying 1 MiB elements over an 8 KiB view passed, and zeroing block 99 of dsv4-test wrote
    149,504 B past it (in its parent here; anywhere natively). ``zero_into`` and the custom op took the
    same subclass. A buffer is a plain tensor (or a Parameter)."""
    kc = _cuda()
    import torch

    table = K.plan(K.preset("dsv4-test"))
    parent = torch.full((table.total_bytes // 2,), 3.0, dtype=torch.bfloat16)
    small = parent[:4096].as_subclass(_lying_tensor_class())
    said = r"^buffer type = BigElements: must be a plain torch\.Tensor"
    with pytest.raises(LayoutBufferError, match=said):
        kc.CudaZeroer(table, small, graphs=False)
    z = kc.CudaZeroer(table, parent, graphs=False)
    before = parent.clone()
    for call in (
        lambda: z.zero_into(small, torch.tensor([99])),
        lambda: torch.ops.kvlayout.zero_blocks(small, torch.tensor([99]), z.handle),
    ):
        with pytest.raises(LayoutBufferError, match=said):
            call()
    assert torch.equal(parent.view(torch.uint8), before.view(torch.uint8))
    # a Parameter is a plain tensor's memory: still taken
    p = torch.nn.Parameter(torch.tensor(K.poison_pattern(table.total_bytes)), requires_grad=False)
    kc.CudaZeroer(table, p, graphs=False).zero([1])
    want = K.expected_zeroed(table, [1])
    assert K.changed_ranges(K.poison_pattern(table.total_bytes), p.detach().numpy()).tolist() == want.tolist()


TABLE = K.SegmentTable(
    total_bytes=2048,
    num_blocks=64,
    segments=(K.Segment(0, 32, 8, "a", "L0"), K.Segment(16, 32, 8, "b", "L1")),
)


def test_h4_a_storage_moved_behind_the_zeroer_is_refused() -> None:
    """H4 (HIGH natively): a storage grown behind the zeroer (``resize_``) moves, and the replay graphs
    captured at construction keep the old address: on an H100 (/tmp/h24/h24_native.py), ``zero([5])`` of
    dsv4-test then zeroed 149,504 B of another tensor that took the freed block, and none of the buffer.
    Every call checks the buffer is still where it was (under the interpreter: refused the same way)."""
    kc = _cuda()
    import torch

    buf = torch.tensor(K.poison_pattern(TABLE.total_bytes))
    z = kc.CudaZeroer(TABLE, buf)
    z.zero([1])
    at = buf.data_ptr()
    buf.untyped_storage().resize_(1 << 22)
    if buf.data_ptr() == at:
        pytest.skip("the allocator grew the storage in place")
    said = r"^buffer data_ptr = 0x[0-9a-f]+: the storage moved from 0x[0-9a-f]+ after the zeroer was made"
    for call in (lambda: z.zero([2]), lambda: z.zero(torch.tensor([2])),
                 lambda: z.zero_validated(np.array([3], np.int64))):
        with pytest.raises(LayoutBufferError, match=said):
            call()


def test_m1_sharded_zeroer_checks_every_storage_before_writing() -> None:
    """M1 (MEDIUM): ``ShardedCudaZeroer``'s device ids (a CPU tensor under the interpreter) launched through
    a shard storage freed behind its zeroer (``_launch`` / ``launch_routed`` skip pass 23's check), and its
    host ids zeroed shard 0 before shard 1 refused its freed storage."""
    kc = _cuda()
    import torch

    lay = _sharded()
    bufs = [torch.tensor(K.poison_pattern(lay.local_table.total_bytes)) for _ in range(2)]
    z = kc.ShardedCudaZeroer(lay, bufs, graphs=False)
    bufs[1].untyped_storage().resize_(0)
    before = bufs[0].clone()
    said = rf"^buffer storage = 0 B: the zeroer writes up to byte {lay.local_table.total_bytes}"
    for ids in ([0, 99], torch.tensor([0, 99])):
        with pytest.raises(LayoutBufferError, match=said):
            z.zero(ids)
    assert torch.equal(bufs[0], before)
    with pytest.raises(LayoutBufferError, match=said):  # public: checked on its own too
        z.zeroers[1].launch_routed(torch.tensor([0, 99]), id_lo=50, id_limit=100)


class _LyingTable(K.SegmentTable):
    """A SegmentTable subclass whose ``coalesced()`` (the kernels' rows) is another table: ``OTHER``."""

    other: K.SegmentTable | None = None

    def coalesced(self) -> K.SegmentTable:
        assert self.other is not None
        return self.other


def _lying(other_rows: tuple[K.Segment, ...], total: int) -> _LyingTable:
    t = _LyingTable(total_bytes=2048, num_blocks=64, segments=(K.Segment(0, 32, 8, "a", "L0"),))
    object.__setattr__(t, "other", K.SegmentTable(total_bytes=total, num_blocks=64, segments=other_rows))
    return t


def test_h5_cuda_zeroer_refuses_a_table_subclass() -> None:
    """H5 (HIGH): the table was verified, then its own ``coalesced()`` gave the rows the kernel wrote: a
    subclass returning a row at byte 4,096 of a 1 MiB table zeroed 8 B past a 2 KiB buffer."""
    kc = _cuda()
    import torch

    t = _lying((K.Segment(4096, 32, 8, "a", "L0"),), 1 << 20)
    parent = torch.full((1 << 20,), 7, dtype=torch.uint8)
    said = r"^table type = _LyingTable: must be a kvlayout\.SegmentTable itself"
    with pytest.raises(K.TableError, match=said):
        kc.CudaZeroer(t, parent[:2048], graphs=False)
    with pytest.raises(K.TableError, match=said):
        kc.CudaZeroer.from_dlpack(parent[:2048], t, graphs=False)
    assert (parent == 7).all()


def test_h6_pallas_zeroer_refuses_a_table_subclass() -> None:
    """H6 (HIGH): the same subclass through the Pallas backend zeroed [40, 48) for block 1, where the
    verified table's contract is [32, 40): another block's bytes."""
    pytest.importorskip("jax")
    kp = pytest.importorskip("kvlayout.backends.pallas")
    t = _lying((K.Segment(8, 32, 8, "a", "L0"),), 2048)
    said = r"^table type = _LyingTable: must be a kvlayout\.SegmentTable itself"
    with pytest.raises(K.TableError, match=said):
        kp.PallasZeroer(t)
    with pytest.raises(K.TableError, match=said):
        kp.PallasBackend.from_host(t, K.poison_pattern(2048))


def test_h7_vllm_adapter_refuses_view_subclasses() -> None:
    """H7 (HIGH): ``KVBlockZeroer.from_kv_caches`` placed the cache by the views' own ``storage_offset()``:
    views of a subclass saying 1,024 elements (2 KiB) further on were taken, and zeroing block 0 cleared
    storage bytes [6144, 8192), block 1's, where the views' block 0 is [4096, 6144)."""
    _cuda()
    pytest.importorskip("vllm")
    import torch

    from kvlayout.errors import SpecError
    from kvlayout.integrations.vllm import KVBlockZeroer
    from tests.test_vllm_hostile import CONFIG, _storage_views

    class Shifted(torch.Tensor):
        def storage_offset(self) -> int:
            return int(super().storage_offset()) + 1024

    storage, views = _storage_views()
    before = storage.clone()
    lying = {name: v.as_subclass(Shifted) for name, v in views.items()}
    said = r"^kv_caches = a Shifted: must be plain torch\.Tensor views, as vLLM's are"
    with pytest.raises(SpecError, match=said):
        KVBlockZeroer.from_kv_caches(CONFIG, lying)
    assert torch.equal(storage, before)
    KVBlockZeroer.from_kv_caches(CONFIG, views).zero_block_ids([0])  # vLLM's own views: as before
    assert K.changed_ranges(before.numpy(), storage.numpy()).tolist() == [[4096, 6144]]


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"id_lo": 0.5}, r"^id_lo = 0\.5: must be an integer in \[0, 2147483647\]"),
        ({"id_lo": True}, r"^id_lo = True: must be an integer"),
        ({"id_lo": -64}, r"^id_lo = -64: must be an integer in \[0, "),
        ({"id_limit": 2**70}, r"^id_limit = 1180591620717411303424: must be an integer in \[1, "),
        ({"id_limit": None}, r"^id_limit = None: must be an integer"),
        ({"id_lo": 32}, r"^id_lo = 32: this buffer's blocks \[32, 96\) must lie in the pool \[0, 64\)"),
        ({"ids": [1, 2]}, r"^block_ids type = list: must be a tensor"),
        ({"ids": "float"}, r"^block_ids dtype = torch\.float32: must be int32 or int64"),
        ({"ids": "2-D"}, r"^block_ids shape = \(1, 2\): must be 1-D"),
        ({"ids": "meta"}, r"^block_ids device = meta: must be cpu"),
    ],
)
def test_m2_launch_routed_checks_its_arguments(kwargs: dict[str, Any], said: str) -> None:
    """M2 (MEDIUM): ``CudaZeroer.launch_routed`` (public; the sharded zeroer's device path) took its
    arguments unchecked: ``id_lo=0.5`` zeroed blocks 0 and 1 for ids 1 and 2, float and 2-D id tensors were
    launched on, a list raised AttributeError, ``id_limit=2**70`` raised OverflowError and stayed in the
    zeroer's bounds, after which every ``check()`` raised TypeError (it sorts them)."""
    kc = _cuda()
    import torch

    buf = torch.tensor(K.poison_pattern(TABLE.total_bytes))
    before = buf.clone()
    z = kc.CudaZeroer(TABLE, buf, graphs=False)
    made = {
        "float": torch.tensor([1.0, 2.0]),
        "2-D": torch.tensor([[1, 2]]),
        "meta": torch.tensor([1, 2], device="meta"),
    }
    ids: Any = kwargs.get("ids", torch.tensor([1, 2]))
    ids = made[ids] if isinstance(ids, str) else ids
    args = {"id_lo": 0, "id_limit": 64, **{k: v for k, v in kwargs.items() if k != "ids"}}
    with pytest.raises(K.BlockIdError, match=said):
        z.launch_routed(ids, **args)
    assert torch.equal(buf, before)
    z.check()  # nothing flagged, and the bounds still sort
    z.launch_routed(torch.tensor([1, 2, 99]), id_lo=0, id_limit=64)  # the good call still runs
    with pytest.raises(K.BlockIdError, match=r"outside \[0, 64\)"):
        z.check()
