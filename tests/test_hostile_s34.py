"""Hostile pass 34 (/tmp/h34), on passes 32 and 33's fixes: each test failing on the code before its fix."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError, SpecError, TableError
from tests.hostile_cases import cuda, to_dev, to_host, zeroed_blocks


def _replicated() -> Any:
    from kvlayout.sharding import ShardedLayout

    return ShardedLayout.from_local(K.preset("llama-8b").with_num_blocks(8), {"tp": 1})


def _row0_blocks(t: K.SegmentTable, before: np.ndarray, after: np.ndarray) -> list[int]:
    s = t.segments[0]
    return [b for b in range(t.num_blocks)
            if not np.array_equal(before[s.base + b * s.stride:][:64], after[s.base + b * s.stride:][:64])]


def test_sharded_replicated_ids_read_through_a_second_mapping_of_a_shard(tmp_path: Any) -> None:
    """The replicated sharded zeroer launched on the caller's ids as they were: ids [1, 2] kept in row 0's
    block 1 of a file mapped twice were cleared while read (blocks [0, 1] zeroed in every row)."""
    torch, kc = cuda()
    if kc.DEVICE_TYPE != "cpu":
        pytest.skip("host mappings: the interpreter's buffers (device memory mapped twice needs CUDA VMM)")
    lay = _replicated()
    t = lay.local_table
    at = t.segments[0].base + t.segments[0].stride
    path = tmp_path / "shard.bin"
    K.poison_pattern(lay.shard_bytes).tofile(path)
    m_buf = np.memmap(path, dtype=np.uint8, mode="r+")
    m_ids = np.memmap(path, dtype=np.uint8, mode="r+")
    m_ids[at:at + 16] = np.array([1, 2], np.int64).view(np.uint8)
    before = np.array(m_buf)
    kc.ShardedCudaZeroer(lay, [torch.from_numpy(m_buf)], graphs=False).zero(
        torch.from_numpy(m_ids[at:at + 16].view(np.int64)))
    after = np.array(m_buf)
    assert _row0_blocks(t, before, after) == [1, 2]
    mask = np.zeros(after.size, bool)
    for a, e in K.expected_zeroed(t, [1, 2]).tolist():
        mask[a:e] = True
    assert not after[mask].any() and np.array_equal(after[~mask], before[~mask])


def test_sharded_replicated_ids_in_shared_memory_mapped_again_as_a_shard() -> None:
    """Ids in a ``share_memory_()`` storage whose pages are also a shard's buffer: cleared while read."""
    torch, kc = cuda()
    if kc.DEVICE_TYPE != "cpu":
        pytest.skip("host shared memory: the interpreter's buffers")
    lay = _replicated()
    t = lay.local_table
    at = t.segments[0].base + t.segments[0].stride
    shared = torch.from_numpy(K.poison_pattern(lay.shard_bytes)).clone().share_memory_()
    fd, size = shared.untyped_storage()._share_fd_cpu_()[:2]
    mm = mmap.mmap(fd, size)
    buf = torch.from_numpy(np.frombuffer(mm, np.uint8)[: lay.shard_bytes])
    ids = shared[at:at + 16].view(torch.int64)
    ids.copy_(torch.tensor([1, 2]))
    before = buf.numpy().copy()
    kc.ShardedCudaZeroer(lay, [buf], graphs=False).zero(ids)
    assert _row0_blocks(t, before, buf.numpy()) == [1, 2]


def test_the_core_api_names_the_wrong_object() -> None:
    """``plan("dsv4")``, ``plan_layout(table)``, ``verify(spec)`` and ``verify(None)`` raised raw
    AttributeErrors."""
    from kvlayout.planner import plan_layout

    spec = K.preset("dsv4-test")
    with pytest.raises(SpecError, match=r"^spec type = str: must be a kvlayout.KVCacheSpec \(kvlayout.pre"):
        K.plan("dsv4")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^spec type = SegmentTable: must be a kvlayout.KVCacheSpec$"):
        plan_layout(K.plan(spec))  # type: ignore[arg-type]
    with pytest.raises(TableError, match=r"^table type = KVCacheSpec: must be a kvlayout.SegmentTable \("):
        K.verify(spec)  # type: ignore[arg-type]
    with pytest.raises(TableError, match=r"^table type = NoneType: must be a kvlayout.SegmentTable$"):
        K.verify(None)  # type: ignore[arg-type]
    assert K.verify(K.plan(spec)).ok


def test_mesh_axis_names_are_checked_names_held_as_plain_strs() -> None:
    """A newline in a mesh axis name forged lines of ``describe()``; a str subclass equal to every name was
    each axis of ``block_axes``."""
    from kvlayout.sharding import shard_spec

    spec = K.preset("dsv4-test")
    with pytest.raises(SpecError, match="mesh_axes name = .*must not contain control characters"):
        shard_spec(spec, {"dp\nlocal table: SAFE": 1})

    class Every(str):
        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return 0

    with pytest.raises(SpecError, match="is not a mesh axis"):
        shard_spec(spec, {"dp": 2, "tp": 1}, block_axes=(Every("nope"),))
    lay = shard_spec(spec, {Every("dp"): 2}, block_axes=("dp",))
    assert [type(n) for n, _ in lay.mesh_axes] == [str] and lay.block_axes == ("dp",)
    with pytest.raises(SpecError, match=r"block_axes = <1000000000000 names>: 0 is not a mesh axis"):
        shard_spec(spec, {"dp": 2}, block_axes=range(10**12))  # type: ignore[arg-type]


class _Lie(np.int64):
    """Holds 2; its own readings say 7."""

    def __index__(self) -> int:
        return 7

    def __int__(self) -> int:
        return 7


def test_a_subclass_of_a_numpy_int_is_no_block_id() -> None:
    """``validate.block_ids`` took a subclass of NumPy's int64 and read it by its own ``__index__``: the cuda
    zeroer cleared block 7 for a stored 2 (Pallas refused the same list)."""
    from kvlayout.validate import block_ids

    with pytest.raises(BlockIdError, match=r"^block_ids\[1\] = .*must be an integer of NumPy's own types"):
        block_ids([1, _Lie(2)], 8)
    assert block_ids([np.int64(2), np.uint8(3), 4], 8).tolist() == [2, 3, 4]
    torch, kc = cuda()
    t = K.SegmentTable(256 * 8, 8, (K.Segment(0, 256, 256, "a", "la"),))
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    with pytest.raises(BlockIdError):
        kc.CudaZeroer(t, buf, graphs=False).zero([_Lie(2)])
    assert zeroed_blocks(host, to_host(buf)) == []


def test_the_plugins_step_ids_refuse_a_numpy_int_subclass() -> None:
    """The vLLM plugin's ``checked_step_ids`` checked honesty of ``int`` subclasses only."""
    pytest.importorskip("torch")
    from kvlayout.integrations.vllm_plugin import checked_step_ids

    with pytest.raises(BlockIdError, match=r"^block_ids\[0\] = .*must be an integer"):
        checked_step_ids([_Lie(2)], 8)
    assert checked_step_ids([np.int64(2), 3], 8).tolist() == [2, 3]
