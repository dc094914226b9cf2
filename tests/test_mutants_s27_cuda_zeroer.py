"""The cuda zeroer's lines that the twenty-seventh session's mutation run found unpinned (issue 25).

Survivors of ``scripts/mutation.sh cuda-zeroer`` on the sources of 7c1af0f (backends/cuda/zeroer.py of
9ac153b): hostile passes 25 and 26 tested their fixes in tests/test_hostile_s25.py and _s26.py, which are
not in the module's fast list, and by ``field`` and ``value`` only. Here pass 26's refusals of a storage
shrunk behind the buffer (``_as_words``: the whole message, and a view at a storage offset of 4-byte
elements, whose bytes before it count) and of nested ids (``check_id_tensor``, through every public call
that takes device ids); and pass 25's reading of a ``str`` subclass group as its plain str in each lookup
keyed by the group (``_plan_for``, ``plan_for_batch``, and ``zero`` before the replay lookup, natively,
through tests/test_mutants_cuda_zeroer.py's :class:`FakeCuda`). Interpreter only (host memory).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError, LayoutBufferError

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")

from .test_mutants_cuda_zeroer import Case, FakeCuda, cuda, tiny  # noqa: E402, F401

pytestmark = pytest.mark.skipif(kc.MODE == "native", reason="host memory: interpreter only")

# 64 blocks of two 8-byte rows, block stride 32: block b's rows are [32b, 32b + 8) (group a) and
# [32b + 16, 32b + 24) (group b)
TABLE = K.SegmentTable(
    total_bytes=2048,
    num_blocks=64,
    segments=(K.Segment(0, 32, 8, "a", "L0"), K.Segment(16, 32, 8, "b", "L1")),
)


def _liar(name: str, like: str) -> str:
    """A group name holding ``name``, equal to every string and hashing as ``like``: a lookup keyed by it
    finds ``like``'s entry unless the name is read as its plain str first."""

    class _Liar(str):
        def __eq__(self, other: object) -> bool:
            return True

        def __ne__(self, other: object) -> bool:
            return False

        def __hash__(self) -> int:
            return hash(like)

    return _Liar(name)


def _refused(exc: type[Exception], call: Any, message: str, field: str, value: Any) -> None:
    with pytest.raises(exc) as e:
        call()
    assert str(e.value) == message
    assert e.value.field == field  # type: ignore[attr-defined]
    assert type(e.value.value) is type(value) and e.value.value == value  # type: ignore[attr-defined]


def test_a_shrunk_storage_is_refused_with_its_size() -> None:
    """A buffer whose storage was resized to 64 B behind it: refused when a zeroer is made over it and as
    ``zero_into``'s buffer, the whole message, ``field`` ``buffer`` and the storage's size as ``value``."""
    z = kc.CudaZeroer(TABLE, torch.zeros(TABLE.total_bytes, dtype=torch.uint8), graphs=False)
    victim = torch.full((TABLE.total_bytes,), 7, dtype=torch.uint8)
    victim.untyped_storage().resize_(64)
    msg = "buffer storage = 64 B: holds fewer bytes than the tensor's 2048 B at its storage offset (resized?)"
    _refused(LayoutBufferError, lambda: kc.CudaZeroer(TABLE, victim, graphs=False), msg, "buffer", 64)
    _refused(LayoutBufferError, lambda: z.zero_into(victim, torch.tensor([63])), msg, "buffer", 64)


def test_the_bytes_before_a_view_count_in_elements_of_its_size() -> None:
    """An int32 view at storage offset 16 (64 B) needs 64 + 2,048 B of storage: exactly that is taken and
    zeroed; 2,056 B (more than 16 / 4 + 2,048, fewer than 16 * 4 + 2,048) is refused naming 2,056."""
    base = torch.full((TABLE.total_bytes // 4 + 16,), -1, dtype=torch.int32)
    view = base[16:]
    assert base.untyped_storage().nbytes() == 64 + TABLE.total_bytes
    kc.CudaZeroer(TABLE, view, graphs=False).zero([2])  # block 2's rows: words 16, 17 (a) and 20, 21 (b)
    assert torch.nonzero(base == 0).flatten().tolist() == [32, 33, 36, 37]
    base.untyped_storage().resize_(TABLE.total_bytes + 8)
    msg = (
        "buffer storage = 2056 B: holds fewer bytes than the tensor's 2048 B at its storage offset (resized?)"
    )
    _refused(LayoutBufferError, lambda: kc.CudaZeroer(TABLE, view, graphs=False), msg, "buffer", 2056)


def test_nested_ids_are_refused_by_every_call_that_takes_device_ids() -> None:
    """Nested-tensor ids: ``zero``, ``zero_into`` and ``launch_routed`` refuse them, the whole message,
    ``field`` ``block_ids``, ``value`` ``nested``; nothing is written."""
    buf = torch.full((TABLE.total_bytes,), 7, dtype=torch.uint8)
    z = kc.CudaZeroer(TABLE, buf, graphs=False)
    with warnings.catch_warnings():  # torch's prototype warning for nested tensors (once a process)
        warnings.simplefilter("ignore", UserWarning)
        ids = torch.nested.nested_tensor([torch.tensor([1, 2])])
    msg = "block_ids layout = nested: must be dense"
    for call in (lambda: z.zero(ids), lambda: z.zero_into(buf, ids), lambda: z.launch_routed(ids, 0, 64)):
        _refused(BlockIdError, call, msg, "block_ids", "nested")
    assert bool((buf == 7).all())


def test_plan_lookups_read_a_str_subclass_group_as_its_plain_str() -> None:
    """With group b's plans cached, a name holding ``a`` that hashes as ``b`` and equals every string gets
    group a's plans (the same objects as ``a`` gets), from ``_plan_for``, ``plan_for_batch`` and the
    routed launch, which zeroes group a's row of block 3 only."""
    poison = K.poison_pattern(TABLE.total_bytes)
    buf = torch.from_numpy(poison.copy())
    z = kc.CudaZeroer(TABLE, buf, graphs=False)
    b_plan, b_batch = z._plan_for("b"), z.plan_for_batch(1, "b")
    a_plan, a_batch = z._plan_for("a"), z.plan_for_batch(1, "a")
    assert a_plan is not b_plan and a_batch is not b_batch
    assert z._plan_for(_liar("a", "b")) is a_plan
    assert z.plan_for_batch(1, _liar("a", "b")) is a_batch
    z.launch_routed(torch.tensor([3]), 0, 64, _liar("a", "b"))
    z.check()
    assert K.changed_ranges(poison, buf.numpy()).tolist() == [[96, 104]]


def test_zero_reads_a_str_subclass_group_before_the_replay_lookup(cuda: FakeCuda) -> None:  # noqa: F811
    """Natively, with graphs captured for group h: a name holding ``g`` that hashes as ``h`` and equals
    every string is group g, which has no graphs of its own: launched eagerly, g's rows of block 3 only
    (h's graph replayed would zero h's)."""
    c = Case(tiny(groups=True))
    z = c.zeroer(graphs=True, max_batch=1)
    z.capture("h")
    n = len(cuda.log)
    z.zero([3], _liar("g", "h"))
    assert "replay" not in [e[0] for e in cuda.log[n:]]
    c.expect([3], "g")
