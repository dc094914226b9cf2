"""Planted-bug backends: each is a real past bug class; the conformance harness must reject all.

They write through NumPy on host buffers, clipped to the buffer, so a bug that runs past
the layout lands in the guard bands (where the harness sees it) instead of crashing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from .reference import ReferenceBackend, normalize_block_ids
from .table import SegmentTable

Ranges = list[tuple[int, int]]


def _rows(table: SegmentTable, ids: np.ndarray, *, stride_as_span: bool = False, extra_base: int = 0,
          span_round: int = 0, drop_row: int | None = None, overrun: int = 0) -> Ranges:
    out: Ranges = []
    for r, s in enumerate(table.segments):
        if r == drop_row:
            continue
        span = s.stride if stride_as_span else s.span
        if span_round:
            span = -(-span // span_round) * span_round
        for b in ids.tolist():
            start = s.base + extra_base + b * s.stride
            out.append((start, start + span + overrun))
    return out


class PlantedBackend(ReferenceBackend):
    """Zeroes the ranges its ``bug`` function returns (relative to the layout start)."""

    name: ClassVar[str] = "planted"
    bug: ClassVar[Callable[[SegmentTable, np.ndarray], Ranges]]
    validates_ids: ClassVar[bool] = True

    def zero(self, block_ids: Any) -> None:
        n = self.table.num_blocks
        ids = normalize_block_ids(block_ids, n) if self.validates_ids else np.asarray(block_ids, np.int64) % n
        data = self.buffer.reshape(-1).view(np.uint8)
        for a, b in type(self).bug(self.table, ids):
            a, b = max(0, self.offset + a), min(data.size, self.offset + b)
            if a < b:
                data[a:b] = 0


def _make(name: str, bug: Callable[[SegmentTable, np.ndarray], Ranges], validates: bool = True) -> type[PlantedBackend]:
    return type(name, (PlantedBackend,), {"name": f"planted:{name}", "bug": staticmethod(bug), "validates_ids": validates})


PLANTED: dict[str, type[PlantedBackend]] = {
    "stride-as-span": _make("stride-as-span", lambda t, i: _rows(t, i, stride_as_span=True)),  # vLLM #50276
    "offset-twice": _make("offset-twice", lambda t, i: _rows(t, i, extra_base=4096)),  # #52709: data_ptr offset added again
    "skip-last-id": _make("skip-last-id", lambda t, i: _rows(t, i[:-1])),
    "span-rounded-512": _make("span-rounded-512", lambda t, i: _rows(t, i, span_round=512)),  # padding overwritten
    "drop-one-row": _make("drop-one-row", lambda t, i: _rows(t, i, drop_row=len(t.segments) - 1)),
    "overrun-4": _make("overrun-4", lambda t, i: _rows(t, i, overrun=4)),
    "ids-modulo": _make("ids-modulo", lambda t, i: _rows(t, i), validates=False),
}
