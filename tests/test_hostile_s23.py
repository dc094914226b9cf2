"""Hostile pass 23 (/tmp/h23: the cuda zeroer's host side run under the interpreter, the vLLM adapter and
plugin, sharding, the reference helpers): one regression test per finding, each failing on the code before
its fix (2817fc0). No finding wrote bytes out of place; these were raw errors, memory taken on a lying
argument, a silent no-op, and a write through a storage freed behind the zeroer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BackendError, BlockIdError, LayoutBufferError, TableError
from kvlayout.sharding import ShardedLayout
from kvlayout.table import Segment, SegmentTable

TABLE = SegmentTable(
    total_bytes=2048, num_blocks=64, segments=(Segment(0, 32, 8, "a", "L0"), Segment(16, 32, 8, "b", "L1"))
)


class Lie(int):
    """An int subclass whose value is 8 and whose ``int()`` / ``__index__()`` say ``i``."""

    i = 0

    def __new__(cls, value: int, i: int) -> Lie:
        obj = super().__new__(cls, value)
        obj.i = i
        return obj

    def __int__(self) -> int:
        return self.i

    def __index__(self) -> int:
        return self.i


@pytest.mark.parametrize("table", ["t", None, {}])
def test_m4_reference_helpers_name_a_table_that_is_none(table: Any) -> None:
    """M4 (MEDIUM): the reference helpers read ``for_group`` / ``total_bytes`` of any object (raw
    AttributeError); the zeroers already refused it by name."""
    img = np.zeros(8, np.uint8)
    calls = [
        lambda: K.expected_zeroed(table, [0]),
        lambda: K.reference.compare_to_contract(img, img.copy(), table, [0]),
        lambda: K.zero_blocks_numpy(img.copy(), table, [0]),
        lambda: K.reference.range_count_bound(table, [0]),
    ]
    for call in calls:
        with pytest.raises(TableError, match=r"^table type = \w+: must be a kvlayout\.SegmentTable"):
            call()


def test_l8_zero_reference_names_a_buffer_that_is_no_array() -> None:
    """L8 (LOW): a torch tensor of exactly the gathered size was refused as too small ("needs" its own
    size); it is refused as no NumPy array."""
    torch = pytest.importorskip("torch")
    page = {"block_size": 1, "num_kv_heads": 4, "head_size": 2, "dtype": "float32"}
    groups = [{"name": "g", "layers": [{"name": "f", "kind": "full", **page}]}]
    spec = K.KVCacheSpec.from_dict({"num_blocks": 6, "layout": "packed", "groups": groups})
    lay = ShardedLayout.from_local(spec, {"dp": 2}, block_axes=("dp",))
    t = torch.zeros(lay.gathered_bytes, dtype=torch.uint8)
    with pytest.raises(LayoutBufferError, match=r"^gathered type = Tensor: must be a NumPy array"):
        lay.zero_reference(t, [0])  # type: ignore[arg-type]
    assert not t.any()
    img = K.poison_pattern(lay.gathered_bytes)
    lay.zero_reference(img, [0])
    assert (img[:32] == 0).all()


def test_l7_plugin_step_ids_refuse_objects_that_are_no_integers() -> None:
    """L7 (LOW): in verify mode an object that is no int but has ``__index__`` (3) and ``__int__`` (5) was
    taken as block 3 (torch reads ``__index__``); the replace path refused it."""
    pytest.importorskip("torch")
    from kvlayout.integrations.vllm_plugin import checked_step_ids

    class Idx:
        def __index__(self) -> int:
            return 3

        def __int__(self) -> int:
            return 5

    said = r"^block_ids\[\d\] = .*: must be an integer \(nothing was written\)"
    for bad in ([1, Idx()], [1, None], [1, "2"], [np.timedelta64(3)]):
        with pytest.raises(BlockIdError, match=said):
            checked_step_ids(bad, 8)  # type: ignore[arg-type]
    assert checked_step_ids([1, np.int64(3), np.int32(2)], 8).tolist() == [1, 3, 2]


# ---- the cuda zeroer's host side (the interpreter) --------------------------------------------------
def _cuda() -> Any:
    pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    if kc.MODE == "native":
        pytest.skip("CPU rules: interpreter only")
    return kc


def test_m1_m2_l5_lying_constructor_integers_are_refused() -> None:
    """M1, M2, L5: ``chunk_words`` and ``max_batch`` were checked by their value (8) and then used as
    ``int()``: 0 words a unit (a raw NumPy error), 2**27 id slots (1 GiB taken), a zeroer that refused
    every batch. Such ints are refused by name before anything is allocated."""
    kc = _cuda()
    import torch

    buf = torch.from_numpy(K.poison_pattern(TABLE.total_bytes).copy())
    with pytest.raises(BackendError, match=r"^chunk_words = 8: must be a positive multiple of 4"):
        kc.CudaZeroer(TABLE, buf, chunk_words=Lie(8, 0))
    for i in (0, 1 << 27):
        with pytest.raises(BlockIdError, match=r"^max_batch = 8: must be a positive integer"):
            kc.CudaZeroer(TABLE, buf, max_batch=Lie(8, i))
    assert kc.CudaZeroer(TABLE, buf, max_batch=np.int64(8), chunk_words=np.int32(8)).max_batch == 8


def test_m3_l6_meta_ids_are_refused_on_every_path() -> None:
    """M3 (MEDIUM): ``zero_into`` another buffer with meta ids raised torch's NotImplementedError; L6 (LOW):
    the ``kvlayout::zero_blocks`` op with them returned without a word (torch ran the fake kernel). Both
    refuse by name, the buffer untouched."""
    kc = _cuda()
    import torch

    data = K.poison_pattern(TABLE.total_bytes)
    z = kc.CudaZeroer(TABLE, torch.from_numpy(data.copy()))
    other = torch.from_numpy(data.copy())
    ids = torch.tensor([1, 2]).to("meta")
    said = r"^block_ids = torch\.int64 .*tensor on meta: must be a dense integer tensor holding data"
    with pytest.raises(BlockIdError, match=said):
        z.zero_into(other, ids)
    with pytest.raises(BlockIdError, match=said):
        torch.ops.kvlayout.zero_blocks(other, ids, z.handle)
    assert np.array_equal(other.numpy(), data)
    torch.ops.kvlayout.zero_blocks(other, torch.tensor([1]), z.handle)  # real ids still zero
    ref = data.copy()
    K.zero_blocks_numpy(ref, TABLE, [1])
    assert np.array_equal(other.numpy(), ref)


def test_l9_a_storage_freed_behind_the_zeroer_is_refused() -> None:
    """L9 (LOW): after ``buffer.untyped_storage().resize_(0)`` the zeroer wrote through its old pointer
    (natively: freed device memory). Every call checks the storage still holds the layout."""
    kc = _cuda()
    import torch

    buf = torch.tensor(K.poison_pattern(TABLE.total_bytes))  # torch's own storage (NumPy's cannot resize)
    z = kc.CudaZeroer(TABLE, buf)
    z.zero([1])
    buf.untyped_storage().resize_(0)
    said = r"^buffer storage = 0 B: the zeroer writes up to byte 2048"
    for call in (lambda: z.zero([1, 63]), lambda: z.zero(torch.tensor([2])),
                 lambda: z.zero_validated(np.array([3], np.int64))):
        with pytest.raises(LayoutBufferError, match=said):
            call()
