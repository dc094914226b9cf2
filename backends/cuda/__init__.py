"""kvlayout.backends.cuda: the ``cuda`` backend, a Triton zeroer driven by the planner's table.

Natively on NVIDIA GPUs; without a CUDA device the same kernel runs under Triton's
interpreter (switched on automatically before the kernel is defined). ``mode`` says which.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from kvlayout.backend import Backend
from kvlayout.table import SegmentTable

from . import ops
from ._mode import DEVICE_TYPE, MODE
from .kernel import UnitPlan, launch_grid, plan_units, zero_units_numpy
from .sharded import ShardedCudaZeroer
from .zeroer import CudaZeroer

__all__ = [
    "CudaBackend",
    "CudaZeroer",
    "MODE",
    "ShardedCudaZeroer",
    "UnitPlan",
    "launch_grid",
    "ops",
    "plan_units",
    "zero_units_numpy",
]


class CudaBackend(Backend):
    """Backend protocol adapter over :class:`CudaZeroer`."""

    name: ClassVar[str] = "cuda"
    extra: ClassVar[str | None] = "cuda"

    def __init__(self, table: SegmentTable, buffer: Any, *, offset: int = 0, **kwargs: Any) -> None:
        self.table = table
        self.offset = offset
        self.zeroer = CudaZeroer(table, buffer, offset=offset, **kwargs)

    @property
    def mode(self) -> str:
        return MODE

    def zero(self, block_ids: Any, group: str | None = None) -> None:
        self.zeroer.zero(block_ids, group)

    @classmethod
    def from_host(cls, table: SegmentTable, data: np.ndarray, *, offset: int = 0) -> CudaBackend:
        buf = torch.from_numpy(np.ascontiguousarray(data).reshape(-1).view(np.uint8).copy()).to(DEVICE_TYPE)
        return cls(table, buf, offset=offset)

    def to_host(self) -> np.ndarray:
        self.zeroer.check()
        return self.zeroer.buffer.reshape(-1).view(torch.uint8).cpu().numpy().copy()
