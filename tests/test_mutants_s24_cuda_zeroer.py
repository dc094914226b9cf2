"""The cuda zeroer's refusals that the twenty-fourth session's mutation run found unpinned (issue 25).

Survivors of ``scripts/mutation.sh cuda-zeroer`` on the sources of a8cf73b (backends/cuda/zeroer.py of
540c7b1): ``CudaZeroer.launch_routed``'s argument checks, added by hostile pass 24 (9bd63b2), were
pinned by message only, as were the storage checks of passes 23 and 24 (a storage shrunk or moved behind
the zeroer) and the refusal of a tensor subclass as buffer. Here each refusal's ``field`` and ``value``
too (what callers and the CLI report), and the top of the id range: ``id_lo`` and ``id_limit`` may be
2**31 - 1 itself (the kernel's int32 arguments hold it). Interpreter only (the CPU rules; a CUDA build
checks the same code).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")
Z = pytest.importorskip("kvlayout.backends.cuda.zeroer")

pytestmark = pytest.mark.skipif(kc.MODE == "native", reason="CPU rules: interpreter only")

INT32_MAX = 2**31 - 1
# 64 blocks of two 8-byte rows, block stride 32: block b's bytes are [32b, 32b + 8) and [32b + 16, 32b + 24)
TABLE = K.SegmentTable(
    total_bytes=2048,
    num_blocks=64,
    segments=(K.Segment(0, 32, 8, "a", "L0"), K.Segment(16, 32, 8, "b", "L1")),
)


def _zeroer() -> tuple[Any, Any, Any]:
    """A zeroer over a poisoned buffer, the buffer and a copy of its bytes before any call."""
    buf = torch.tensor(K.poison_pattern(TABLE.total_bytes))
    return kc.CudaZeroer(TABLE, buf, graphs=False), buf, buf.clone()


def _refused(call: Any, message: str, field: str, value: Any) -> None:
    with pytest.raises(K.BlockIdError) as e:
        call()
    assert str(e.value) == message
    assert e.value.field == field
    assert type(e.value.value) is type(value) and e.value.value == value


@pytest.mark.parametrize(
    ("ids", "kind"), [([1, 2], "list"), ((1, 2), "tuple"), (np.array([1, 2]), "ndarray")]
)
def test_ids_that_are_no_tensor_are_refused_with_their_type_as_the_value(ids: Any, kind: str) -> None:
    z, buf, before = _zeroer()
    msg = f"block_ids type = {kind}: must be a tensor"
    _refused(lambda: z.launch_routed(ids, id_lo=0, id_limit=64), msg, "block_ids", kind)
    assert torch.equal(buf, before)


def test_ids_on_another_device_are_refused_with_the_device_as_the_value() -> None:
    z, buf, before = _zeroer()
    ids = torch.tensor([1, 2], device="meta")
    msg = f"block_ids device = meta: must be {z.device}"
    _refused(lambda: z.launch_routed(ids, id_lo=0, id_limit=64), msg, "block_ids.device", "meta")
    assert torch.equal(buf, before)


@pytest.mark.parametrize(
    ("name", "bad", "shown"),
    [
        ("id_lo", 0.5, "0.5"),
        ("id_lo", -64, "-64"),
        ("id_lo", INT32_MAX + 1, str(INT32_MAX + 1)),
        ("id_limit", 2**70, str(2**70)),
        ("id_limit", 0, "0"),
        ("id_limit", "64", "'64'"),
    ],
)
def test_a_bad_id_lo_or_id_limit_is_refused_by_name_with_its_value(name: str, bad: Any, shown: str) -> None:
    z, buf, before = _zeroer()
    least = 0 if name == "id_lo" else 1
    args = {"id_lo": 0, "id_limit": 64, name: bad}
    msg = f"{name} = {shown}: must be an integer in [{least}, {INT32_MAX}]"
    _refused(lambda: z.launch_routed(torch.tensor([1, 2]), **args), msg, name, bad)
    assert torch.equal(buf, before)
    z.check()  # nothing was launched or flagged


def test_a_buffer_outside_the_pool_is_refused_with_id_lo_as_the_value() -> None:
    z, buf, before = _zeroer()
    msg = "id_lo = 32: this buffer's blocks [32, 96) must lie in the pool [0, 64)"
    _refused(lambda: z.launch_routed(torch.tensor([33]), id_lo=32, id_limit=64), msg, "id_lo", 32)
    assert torch.equal(buf, before)


def test_the_pool_may_end_at_int32_max() -> None:
    """The bound is inclusive: a buffer owning the pool's last 64 ids, [2**31 - 65, 2**31 - 1), is
    routed, zeroes its blocks 0 and 63 for global ids id_lo and id_lo + 63, and flags nothing."""
    z, buf, before = _zeroer()
    lo = INT32_MAX - TABLE.num_blocks
    z.launch_routed(torch.tensor([lo, lo + 63, 5]), id_lo=lo, id_limit=INT32_MAX)  # 5: another shard's id
    z.check()
    got = K.changed_ranges(before.numpy(), buf.numpy()).tolist()
    assert got == [[0, 8], [16, 24], [2016, 2024], [2032, 2040]]
    assert bytes(buf.numpy()[[0, 16, 2016, 2032]]) == b"\0\0\0\0"


def test_an_id_at_int32_max_is_outside_a_pool_ending_there() -> None:
    z, buf, before = _zeroer()
    lo = INT32_MAX - TABLE.num_blocks
    z.launch_routed(torch.tensor([INT32_MAX]), id_lo=lo, id_limit=INT32_MAX)
    with pytest.raises(K.BlockIdError, match=rf"outside \[0, {INT32_MAX}\)"):
        z.check()
    assert torch.equal(buf, before)


# --------------------------------------------------------------------------- _check_storage
@pytest.mark.parametrize("left", [0, 1024])
def test_a_storage_shrunk_behind_the_zeroer_is_refused_with_its_bytes_as_the_value(left: int) -> None:
    """Resized to 0 B or to half the layout: every call names the storage's bytes (field ``buffer``,
    value the bytes it has) and the byte the zeroer writes up to, and writes nothing."""
    buf = torch.tensor(K.poison_pattern(TABLE.total_bytes))  # torch's own storage (NumPy's cannot resize)
    z = kc.CudaZeroer(TABLE, buf, graphs=False)
    buf.untyped_storage().resize_(left)
    msg = f"buffer storage = {left} B: the zeroer writes up to byte 2048 (resized?)"
    for call in (lambda: z.zero([1]), lambda: z.zero(torch.tensor([2])),
                 lambda: z.launch_routed(torch.tensor([3]), id_lo=0, id_limit=64)):
        with pytest.raises(K.LayoutBufferError) as e:
            call()
        assert str(e.value) == msg
        assert e.value.field == "buffer" and type(e.value.value) is int and e.value.value == left


def test_a_storage_moved_behind_the_zeroer_is_refused_with_its_new_address_as_the_value() -> None:
    buf = torch.tensor(K.poison_pattern(TABLE.total_bytes))
    z = kc.CudaZeroer(TABLE, buf, graphs=False)
    old = buf.data_ptr()
    buf.untyped_storage().resize_(1 << 22)  # grown: moved to a new block (the old one freed)
    new = buf.data_ptr()
    assert new != old
    with pytest.raises(K.LayoutBufferError) as e:
        z.zero([1])
    assert str(e.value) == (
        f"buffer data_ptr = {new:#x}: the storage moved from {old:#x} after the zeroer was made (resized?); "
        "its captured graphs write the old address: make a new zeroer"
    )
    assert e.value.field == "buffer.data_ptr" and e.value.value == new


# --------------------------------------------------------------------------- _as_words
class _Plain(torch.Tensor):
    """A tensor subclass that overrides nothing: refused all the same (its sizes could lie)."""


def test_a_tensor_subclass_buffer_is_refused_with_its_class_name_as_the_value() -> None:
    buf = torch.tensor(K.poison_pattern(TABLE.total_bytes)).as_subclass(_Plain)
    with pytest.raises(K.LayoutBufferError) as e:
        kc.CudaZeroer(TABLE, buf, graphs=False)
    assert str(e.value) == (
        "buffer type = _Plain: must be a plain torch.Tensor "
        "(a subclass may report sizes its memory does not have)"
    )
    assert e.value.field == "buffer" and e.value.value == "_Plain"
    p = torch.nn.Parameter(torch.tensor(K.poison_pattern(TABLE.total_bytes)), requires_grad=False)
    # a Parameter is plain
    assert kc.CudaZeroer(TABLE, p, graphs=False).words.numel() == TABLE.total_bytes // 4
