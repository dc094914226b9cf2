"""The cuda zeroer's host code at full mutation score (issue 25): CPU rules and the native paths.

Two halves. The rules that run here anyway (option checks, id staging, plans, ``zero_into``,
routing bounds, ``check()``) are checked on poisoned buffers with guard bands on both sides
(the layout sits at ``offset`` inside a larger buffer: bytes outside it must never change).
The native host logic (graph capture and replay, pinned staging, slots, events, streams) is
run on the CPU through :class:`FakeCuda`, a test double of the few ``torch.cuda`` objects the
zeroer uses, injected by monkeypatch into ``backends/cuda/zeroer.py`` only, with ``MODE`` set to
``"native"``; the Triton kernels still run under the interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvlayout as K

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")
Z = pytest.importorskip("kvlayout.backends.cuda.zeroer")

pytestmark = pytest.mark.skipif(kc.MODE == "native", reason="CPU rules and the CUDA double: interpreter only")

GUARD = 64  # poisoned bytes before and after the layout


def tiny(num_blocks: int = 6, groups: bool = False) -> K.SegmentTable:
    """One 512 B page per block and layer; ``groups``: g holds layers a and c, h holds b."""
    layer = [
        K.FullAttentionSpec(name=n, block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")
        for n in "abc"
    ]
    gs = (K.GroupSpec("g", (layer[0], layer[2])), K.GroupSpec("h", (layer[1],))) if groups else None
    return K.plan(K.KVCacheSpec(num_blocks, "BLHNC", gs or (K.GroupSpec("g", (layer[0],)),)))


class Case:
    """A poisoned buffer holding ``table`` at ``GUARD`` with guard bands, and its expected bytes."""

    def __init__(self, table: K.SegmentTable, seed: int = 3) -> None:
        self.table = table
        self.data = K.poison_pattern(table.total_bytes + 2 * GUARD, seed=seed)
        self.buf = torch.from_numpy(self.data.copy())
        self.done: list[tuple[list[int], str | None]] = []

    def zeroer(self, **kw: Any) -> Any:
        kw.setdefault("graphs", False)
        return kc.CudaZeroer(self.table, self.buf, offset=GUARD, **kw)

    def expect(self, ids: list[int], group: str | None = None) -> None:
        """Add ``ids`` (of ``group``) to what must be zero and compare every byte, guards included."""
        self.done.append((list(ids), group))
        want = self.data.copy()
        for done, g in self.done:
            K.zero_blocks_numpy(want[GUARD : GUARD + self.table.total_bytes], self.table, done, group=g)
        got = self.buf.numpy()
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"bytes differ at {bad[:8].tolist()} (layout at {GUARD})"


def raises(exc: type[Exception], call: Callable[[], Any], field: str, value: Any, message: str) -> None:
    with pytest.raises(exc) as info:
        call()
    assert str(info.value) == message
    assert (info.value.field, info.value.value) == (field, value)  # type: ignore[attr-defined]


class Recorder:
    """Stands in for a Triton kernel object: records ``kernel[grid](*args, **kwargs)``, runs nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *a, **kw: self.calls.append((grid, a, kw))


# ---- the two reported defects ---------------------------------------------------------------


def test_routed_batches_past_int32_offsets_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """route_ids_kernel indexes ids with int32 offsets: 2**31 ids are refused, 2**31 - 1 launch."""
    c = Case(tiny())
    z = c.zeroer(max_batch=4)
    route, units = Recorder(), Recorder()
    monkeypatch.setattr(Z, "route_ids_kernel", route)
    monkeypatch.setattr(Z, "zero_units_kernel", units)
    huge = torch.zeros(1, dtype=torch.int64).expand(2**31)  # 2**31 ids, 8 bytes of memory
    raises(
        K.BlockIdError,
        lambda: z.launch_routed(huge, 6, 18),
        "block_ids",
        2**31,
        f"block_ids: {2**31} ids in a routed batch: at most {2**31 - 1} (int32 offsets)",
    )
    assert route.calls == [] and units.calls == [] and len(z._slots) == 1 and not z._slots[0].busy
    # the largest batch that fits still launches (a routed buffer as large as the batch, no memory)
    edge = huge[: 2**31 - 1]
    z._slots[0].routed = edge
    z.launch_routed(edge, 6, 18)
    (grid, args, _), = route.calls
    assert grid == (2**21,) and args[4] == 2**31 - 1  # cdiv(2**31 - 1, 1024) programs, n
    assert units.calls[0][1][1].numel() == 2**31 - 1
    c.expect([])


def test_check_names_the_bound_of_routed_launches() -> None:
    """After a routed launch, a bad id is one outside [0, id_limit) (the global pool), not num_blocks."""
    c = Case(tiny())
    z = c.zeroer()
    z.launch_routed(torch.tensor([18, 8, -1, 13]), 6, 18)  # 8 and 13 are local 2 and 7 (other shard)
    with pytest.raises(K.BlockIdError) as info:
        z.check()
    assert str(info.value).startswith("device block_ids: 2 work items had an id outside [0, 18) (e.g. ")
    assert info.value.value in (18, -1)
    c.expect([2])
    z.check()  # reported once
    z._launch(torch.tensor([6]))  # a launch of this buffer's own ids: its bound is num_blocks
    with pytest.raises(K.BlockIdError, match=r"outside \[0, 6\) or \[0, 18\) \(e\.g\. 6\)"):
        z.check()
    fresh = c.zeroer()
    fresh._launch(torch.tensor([7, 0]))
    raises(
        K.BlockIdError,
        fresh.check,
        "block_ids",
        7,
        "device block_ids: 1 work items had an id outside [0, 6) (e.g. 7); they wrote nothing",
    )
    c.expect([0])
