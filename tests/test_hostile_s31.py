"""Hostile pass 31 (/tmp/h31), on pass 30's fixes: each test failing on the code before its fix.

Pass 30 guarded only the buffer's checks, the ids' densifying and the launches against a caller's
TorchFunctionMode; the ids' count (``numel()``), the host ids' staging and the device plans (``.to()``) were
still read under it, so ids [1, 2] zeroed blocks [1, 2, 5, 6], and a plan built under a mode was kept.
Every public entry of the cuda zeroers now runs with torch functions disabled (``zeroer.plain_torch``)."""

from __future__ import annotations

from typing import Any

import numpy as np

import kvlayout as K
from kvlayout.table import Segment, SegmentTable
from tests.hostile_cases import cuda, to_dev, to_host


def _two_groups() -> SegmentTable:
    return SegmentTable(256 * 8, 8, (Segment(0, 256, 128, "a", "la"), Segment(128, 256, 128, "b", "lb")))


def _zeroed(before: np.ndarray, after: np.ndarray) -> list[list[int]]:
    return K.changed_ranges(before, after).tolist()


def test_a_mode_cannot_change_the_id_count() -> None:
    torch, kc = cuda()
    from torch.overrides import TorchFunctionMode

    class Lie(TorchFunctionMode):
        def __init__(self, ids: Any) -> None:
            super().__init__()
            self.ids = ids

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            return 4 if func is torch.Tensor.numel and args and args[0] is self.ids else out

    t = _two_groups()
    for call in ("zero", "zero_into", "launch_routed"):
        host = K.poison_pattern(t.total_bytes)
        buf = to_dev(torch.from_numpy(host.copy()))
        z = kc.CudaZeroer(t, buf, graphs=False)
        ids = to_dev(torch.tensor([1, 2, 5, 6]))[:2]  # device ids, as under the interpreter
        target = to_dev(torch.from_numpy(host.copy())) if call == "zero_into" else buf
        with Lie(ids):
            if call == "zero":
                z.zero(ids)
            elif call == "zero_into":
                z.zero_into(target, ids)
            else:
                z.launch_routed(ids, 0, 8)
        z.check()
        assert _zeroed(host, to_host(target)) == [[256, 768]], call


def test_a_plan_built_under_a_mode_writes_the_planned_bytes() -> None:
    torch, kc = cuda()
    from torch.overrides import TorchFunctionMode

    class Shift(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            return out + 64 if func is torch.Tensor.to and out.dtype == torch.int64 else out

    t = _two_groups()
    for call in ("construct", "group", "zero_into"):
        host = K.poison_pattern(t.total_bytes)
        buf = to_dev(torch.from_numpy(host.copy()))
        target = to_dev(torch.from_numpy(host.copy())) if call == "zero_into" else buf
        ids = to_dev(torch.tensor([1, 2]))  # made outside the mode: it shifts .to()'s int64 results
        if call == "construct":
            with Shift():
                z = kc.CudaZeroer(t, buf, graphs=False)
            z.zero(ids)
            want = [[256, 768]]
        else:
            z = kc.CudaZeroer(t, buf, graphs=False)
            with Shift():
                if call == "group":
                    z.zero(ids, "a")
                else:
                    z.zero_into(target, ids, "a")
            want = [[256, 384], [512, 640]]
        z.check()
        assert _zeroed(host, to_host(target)) == want, call
