"""The cuda zeroer's lines that mutation session 28 (bench/results/mutation.md) found unpinned (issue 25).

Survivors of ``scripts/mutation.sh cuda-zeroer`` on the sources of 715e5a6 (backends/cuda/zeroer.py of
9ba3621): hostile passes 28 to 30 tested their refusals of ids (tests/test_hostile_s28.py to _s30.py) by a
word of the message and ``field`` only. Here, in ``check_id_tensor``, the whole message, ``field`` and
``value`` of the subclass, vmap, ZeroTensor and negative-view refusals, and the exact reach of the storage
check (one element short is refused, an empty view or meta ids are not measured); in ``dense_ids``, what
``contiguous()`` returned is checked again (another tensor, another shape, still strided); in
``check_apart``, the exact bounds of the buffer's bytes (ids at its first byte, across its start, next to
either end) and ids that cannot be in it (none, or on another device); in ``_check_storage``, pass 28's
refusal of a buffer re-pointed after the zeroer was made, and in ``_buffer_words`` pass 29's of a ZeroTensor
buffer (the whole message, ``value``); in ``zero_into`` (a survivor of the @plain_torch entries, which
mutmut mutates only on a copy staged without the decorator: mutation.md, session 28), ids stored in its own
target are refused, after their values. Interpreter only (host memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError, LayoutBufferError

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")
Z = pytest.importorskip("kvlayout.backends.cuda.zeroer")

pytestmark = pytest.mark.skipif(kc.MODE == "native", reason="host memory: interpreter only")

GUARD = 64  # bytes before and after the layout in the zeroer's buffer
# eight blocks of 256 B, group a's one row covering each whole
TABLE = K.SegmentTable(256 * 8, 8, (K.Segment(0, 256, 256, "a", "la"),))
APART = "they lie in the buffer being zeroed (the kernel would clear them while reading them)"


def _refused(call: Any, message: str, value: Any, field: str = "block_ids") -> None:
    with pytest.raises(BlockIdError) as e:
        call()
    assert str(e.value) == message
    assert e.value.field == field
    assert type(e.value.value) is type(value) and e.value.value == value


def _zeroer() -> tuple[Any, Any, np.ndarray]:
    """A zeroer of TABLE at GUARD in a poisoned buffer: (zeroer, buffer, the buffer's bytes before)."""
    host = K.poison_pattern(TABLE.total_bytes + 2 * GUARD)
    buf = torch.from_numpy(host.copy())
    return kc.CudaZeroer(TABLE, buf, offset=GUARD, graphs=False), buf, host


def _zeroed(before: np.ndarray, buf: Any) -> list[int]:
    """The layout's 256 B blocks that changed; the guard bands must not have."""
    after = buf.numpy()
    assert np.array_equal(after[:GUARD], before[:GUARD]) and np.array_equal(after[-GUARD:], before[-GUARD:])
    lay = slice(GUARD, GUARD + TABLE.total_bytes)
    ranges = K.changed_ranges(before[lay], after[lay]).tolist()
    return sorted({blk for a, b in ranges for blk in range(a // 256, (b - 1) // 256 + 1)})


def test_an_ids_subclass_is_named_by_its_type() -> None:
    """A tensor subclass: the whole message, ``value`` its type's name, from zero and launch_routed."""

    class Ids(torch.Tensor):
        pass

    z, buf, host = _zeroer()
    ids = torch.tensor([1, 2]).as_subclass(Ids)
    why = "must be a plain torch.Tensor (a subclass may hand the kernel other memory than its ids)"
    for call in (lambda: z.zero(ids), lambda: z.launch_routed(ids, 0, 8)):
        _refused(call, f"block_ids type = Ids: {why}", "Ids")
    assert np.array_equal(buf.numpy(), host)


def test_ids_without_storage_zero_tensors_and_negative_views_are_named() -> None:
    """Ids under vmap, a ZeroTensor and a negative view: each refusal's whole message and ``value``."""
    z, buf, host = _zeroer()
    with pytest.raises(BlockIdError) as e:
        torch.func.vmap(lambda x: (z.launch_routed(x, 0, 8), x)[1])(torch.tensor([[1, 2], [3, 4]]))
    assert str(e.value) == "block_ids = a tensor without storage (vmap?): must hold its ids in memory"
    assert (e.value.field, e.value.value) == ("block_ids", "no storage")
    zt = torch._efficientzerotensor(2, dtype=torch.int64)
    _refused(lambda: z.launch_routed(zt, 0, 8), "block_ids = a ZeroTensor: must hold memory", "ZeroTensor")
    neg = torch._neg_view(torch.tensor([-1, -2]))
    msg = "block_ids = a negative view: call resolve_neg() first"
    _refused(lambda: z.launch_routed(neg, 0, 8), msg, "negative view")
    assert np.array_equal(buf.numpy(), host)


def test_the_storage_check_reaches_exactly_the_last_id() -> None:
    """int32 ids at storage offset 1, stride 2, four of them: their last element ends at byte 32. A
    storage of 32 B is enough (blocks 1 to 4 zeroed); 28 B, one element short, is refused naming 28."""
    z, buf, host = _zeroer()
    base = torch.tensor([9, 1, 9, 2, 9, 3, 9, 4, 9, 9], dtype=torch.int32)
    ids = base[1:9:2]
    base.untyped_storage().resize_(32)
    z.launch_routed(ids, 0, 8)
    z.check()
    assert _zeroed(host, buf) == [1, 2, 3, 4]
    base.untyped_storage().resize_(28)
    msg = "block_ids storage = 28 B: holds fewer bytes than the ids' 32 B reach (resized?)"
    _refused(lambda: z.launch_routed(ids, 0, 8), msg, 28)


def test_empty_views_and_meta_ids_are_not_measured() -> None:
    """An empty view past the end of a storage shrunk to 0 B reaches nothing: zeroed as no ids. Meta ids
    whose storage was shrunk are named as meta ids (by the device check, by ``host_ids``), not by size."""
    z, buf, host = _zeroer()
    base = torch.arange(4)
    empty = base[2:2]
    base.untyped_storage().resize_(0)
    z.launch_routed(empty, 0, 8)
    z.zero(empty)
    assert np.array_equal(buf.numpy(), host)
    meta = torch.empty(4, dtype=torch.int64, device="meta")
    meta.untyped_storage().resize_(0)
    msg = "block_ids device = meta: must be cpu"
    _refused(lambda: z.launch_routed(meta, 0, 8), msg, "meta", field="block_ids.device")
    kind = "torch.int64 torch.strided tensor on meta"
    other = torch.from_numpy(host.copy())
    msg = f"block_ids = {kind}: must be a dense integer tensor holding data"
    _refused(lambda: z.zero_into(other, meta), msg, kind)
    assert np.array_equal(buf.numpy(), host) and np.array_equal(other.numpy(), host)


def test_what_contiguous_returned_is_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """``contiguous()`` answering a ZeroTensor, a dense tensor of another shape, or the strided view
    itself: each refused before any launch (the whole message and ``value``)."""
    z, buf, host = _zeroer()
    ids = torch.tensor([1, 7, 2, 7])[::2]
    shape = "block_ids: contiguous() did not give dense ids of the same shape"
    answers = {
        "zero tensor": (
            lambda self: torch._efficientzerotensor(2, dtype=torch.int64),
            "block_ids = a ZeroTensor: must hold memory",
            "ZeroTensor",
        ),
        "another shape": (lambda self: torch.tensor([1]), shape, (1,)),
        "itself": (lambda self: self, shape, (2,)),
    }
    for answer, message, value in answers.values():
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "contiguous", lambda self, *a, answer=answer, **k: answer(self))
            _refused(lambda: z.launch_routed(ids, 0, 8), message, value)
    assert np.array_equal(buf.numpy(), host)


def _ids_at(buf: Any, start: int, values: list[int]) -> Any:
    """int64 ids stored in ``buf``'s own bytes from byte ``start``."""
    ids = buf[start : start + 8 * len(values)].view(torch.int64)
    ids.copy_(torch.tensor(values, dtype=torch.int64))
    return ids


def test_ids_at_or_across_the_layouts_first_byte_are_refused() -> None:
    """Ids at the layout's first byte, and two ids across its start (one before, one in it): refused
    naming their address; nothing written."""
    z, buf, _ = _zeroer()
    end = GUARD + TABLE.total_bytes
    for start in (GUARD, GUARD - 8, end - 8):
        ids = _ids_at(buf, start, [1, 2])
        before = buf.numpy().copy()
        _refused(lambda ids=ids: z.zero(ids), f"block_ids at {ids.data_ptr():#x}: {APART}", ids.data_ptr())
        assert np.array_equal(buf.numpy(), before)


def test_ids_next_to_either_end_of_the_layout_are_read() -> None:
    """Ids in the guard bands, ending at the layout's first byte or starting at its end: zeroed."""
    z, buf, _ = _zeroer()
    end = GUARD + TABLE.total_bytes
    for start, want in ((GUARD - 16, [1, 2]), (end, [5, 6])):
        ids = _ids_at(buf, start, want)
        before = buf.numpy().copy()
        z.zero(ids)
        assert _zeroed(before, buf) == want


def test_ids_that_cannot_lie_in_the_buffer_pass() -> None:
    """No ids (an empty view inside the layout) reach no byte of it; ids on another device than the buffer
    are apart whatever their addresses (a meta buffer of 2**48 B at address 0 covers every host address)."""
    z, buf, host = _zeroer()
    empty = buf[GUARD + 64 : GUARD + 64].view(torch.int64)
    z.zero(empty)
    assert np.array_equal(buf.numpy(), host)
    words = torch.empty(2**46, dtype=torch.int32, device="meta")
    ids = torch.tensor([1, 2])
    assert words.data_ptr() < ids.data_ptr() < 2**48
    Z.check_apart(ids, words)
    with pytest.raises(BlockIdError):  # the same bytes on one device: refused
        Z.check_apart(ids, ids.view(torch.int32))


def test_a_re_pointed_buffer_is_named_by_both_addresses() -> None:
    """A buffer re-pointed (``set_``) after the zeroer was made: the whole message, ``value`` the new
    address; the new memory is not written."""
    z, buf, host = _zeroer()
    old = buf.data_ptr()
    buf.set_(torch.from_numpy(host.copy()).untyped_storage(), 0, buf.shape)
    new = buf.data_ptr()
    msg = (
        f"buffer data_ptr = {new:#x}: the tensor was re-pointed from {old:#x} after the zeroer was made "
        "(set_ or .data =): the zeroer writes the old memory: make a new zeroer"
    )
    with pytest.raises(LayoutBufferError) as e:
        z.zero([1])
    assert str(e.value) == msg
    assert e.value.field == "buffer.data_ptr" and type(e.value.value) is int and e.value.value == new
    assert np.array_equal(buf.numpy(), host)


def test_a_zero_tensor_buffer_is_named() -> None:
    """A ZeroTensor as the buffer (pass 29), to the constructor and to ``zero_into``: the whole message,
    ``field`` ``buffer``, ``value`` ``ZeroTensor``."""
    z, buf, host = _zeroer()
    zt = torch._efficientzerotensor(TABLE.total_bytes + 2 * GUARD, dtype=torch.uint8)
    msg = "buffer = a ZeroTensor tensor: must be a plain strided tensor (its bytes are the layout's)"
    for call in (
        lambda: kc.CudaZeroer(TABLE, zt, offset=GUARD, graphs=False),
        lambda: z.zero_into(zt, torch.tensor([1])),
    ):
        with pytest.raises(LayoutBufferError) as e:
            call()
        assert str(e.value) == msg and (e.value.field, e.value.value) == ("buffer", "ZeroTensor")
    assert np.array_equal(buf.numpy(), host)


def test_zero_into_reads_its_ids_apart_from_its_own_target() -> None:
    """``zero_into`` a copy of the buffer, with ids stored in that copy's layout: valid ones are refused as
    lying in the buffer being zeroed (its address), out-of-range ones by their value first (host ids are
    validated before anything else is read); the copy is not written."""
    z, _, host = _zeroer()
    other = torch.from_numpy(host.copy())
    ids = _ids_at(other, GUARD + 256, [1, 2])
    _refused(lambda: z.zero_into(other, ids), f"block_ids at {ids.data_ptr():#x}: {APART}", ids.data_ptr())
    ids.copy_(torch.tensor([99, 2]))
    before = other.numpy().copy()
    msg = "block_ids[0] = 99: outside [0, 8) (1 bad ids; nothing was written)"
    _refused(lambda: z.zero_into(other, ids), msg, 99, field="block_ids[0]")
    assert np.array_equal(other.numpy(), before)
