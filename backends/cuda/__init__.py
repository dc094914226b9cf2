"""kvlayout_cuda: the Triton backend (filled in by the CUDA backend issue)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from kvlayout.backend import Backend
from kvlayout.errors import BackendError
from kvlayout.table import SegmentTable


class CudaBackend(Backend):
    """Placeholder until the Triton kernel lands: always refuses, never fakes a result."""

    name: ClassVar[str] = "cuda"
    extra: ClassVar[str | None] = "cuda"

    def __init__(self, table: SegmentTable, buffer: Any, *, offset: int = 0) -> None:
        raise BackendError("backend 'cuda' is not implemented yet", field="backend", value="cuda")

    @property
    def mode(self) -> str:  # pragma: no cover
        return "unavailable"

    def zero(self, block_ids: Any) -> None:  # pragma: no cover
        raise BackendError("backend 'cuda' is not implemented yet", field="backend", value="cuda")

    @classmethod
    def from_host(cls, table: SegmentTable, data: np.ndarray, *, offset: int = 0) -> CudaBackend:
        return cls(table, data, offset=offset)

    def to_host(self) -> np.ndarray:  # pragma: no cover
        raise BackendError("backend 'cuda' is not implemented yet", field="backend", value="cuda")
