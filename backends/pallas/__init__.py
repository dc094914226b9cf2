"""kvlayout_pallas: the Pallas backend (filled in by the Pallas backend issue)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from kvlayout.backend import Backend
from kvlayout.errors import BackendError
from kvlayout.table import SegmentTable


class PallasBackend(Backend):
    """Placeholder until the Pallas kernel lands: always refuses, never fakes a result."""

    name: ClassVar[str] = "pallas"
    extra: ClassVar[str | None] = "pallas"

    def __init__(self, table: SegmentTable, buffer: Any, *, offset: int = 0) -> None:
        raise BackendError("backend 'pallas' is not implemented yet", field="backend", value="pallas")

    @property
    def mode(self) -> str:  # pragma: no cover
        return "unavailable"

    def zero(self, block_ids: Any) -> None:  # pragma: no cover
        raise BackendError("backend 'pallas' is not implemented yet", field="backend", value="pallas")

    @classmethod
    def from_host(cls, table: SegmentTable, data: np.ndarray, *, offset: int = 0) -> PallasBackend:
        return cls(table, data, offset=offset)

    def to_host(self) -> np.ndarray:  # pragma: no cover
        raise BackendError("backend 'pallas' is not implemented yet", field="backend", value="pallas")
