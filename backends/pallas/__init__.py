"""kvlayout_pallas: the ``pallas`` backend, a TPU DMA zeroer that is exact on unaligned layouts.

On TPUs the Mosaic kernel runs natively; on NVIDIA GPUs the same API runs through the
Pallas Triton lowering; on the CPU the TPU kernel runs in Pallas's TPU interpret mode.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import Any, ClassVar


def _quiet_platforms() -> None:
    """Without a TPU attached, keep JAX from probing libtpu (seconds of noise on stderr).

    Only when the user has not chosen ``JAX_PLATFORMS`` and JAX is not yet imported.
    """
    if "jax" in sys.modules or "JAX_PLATFORMS" in os.environ:
        return
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return
    cuda = any(importlib.util.find_spec(p) is not None for p in ("jax_cuda13_plugin", "jax_cuda12_plugin"))
    os.environ["JAX_PLATFORMS"] = "cuda,cpu" if cuda else "cpu"


_quiet_platforms()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from kvlayout.backend import Backend  # noqa: E402
from kvlayout.errors import LayoutBufferError  # noqa: E402
from kvlayout.table import SegmentTable  # noqa: E402

from .plan import LANES, ROW_BYTES, RowPlan, plan_rows, zero_rows_numpy  # noqa: E402
from .sharded import ShardedPallasZeroer  # noqa: E402
from .zeroer import PallasZeroer, default_kernel, zero_blocks  # noqa: E402

__all__ = [
    "PallasBackend",
    "PallasZeroer",
    "RowPlan",
    "ShardedPallasZeroer",
    "default_kernel",
    "plan_rows",
    "zero_blocks",
    "zero_rows_numpy",
]


class PallasBackend(Backend):
    """Backend protocol adapter: holds the current buffer and swaps in each donated result."""

    name: ClassVar[str] = "pallas"
    extra: ClassVar[str | None] = "pallas"

    def __init__(self, table: SegmentTable, buffer: Any, *, offset: int = 0, **kwargs: Any) -> None:
        self.table = table
        self.offset = offset
        self.zeroer = PallasZeroer(table, offset=offset, **kwargs)
        self.zeroer._check_buffer(buffer)
        self.buffer = buffer
        self._nbytes: int | None = None

    @property
    def mode(self) -> str:
        return self.zeroer.mode

    def zero(self, block_ids: Any) -> None:
        self.buffer = self.zeroer(self.buffer, block_ids)

    @classmethod
    def from_host(cls, table: SegmentTable, data: np.ndarray, *, offset: int = 0, **kwargs: Any) -> PallasBackend:
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if raw.size % 4:
            raise LayoutBufferError(f"host bytes = {raw.size}: must be a multiple of 4", field="buffer.nbytes", value=raw.size)
        rows = -(-raw.size // ROW_BYTES)
        padded = np.zeros(rows * ROW_BYTES, np.uint8)
        padded[: raw.size] = raw
        be = cls(table, jnp.asarray(padded.view(np.int32).reshape(rows, LANES)), offset=offset, **kwargs)
        be._nbytes = raw.size
        return be

    def to_host(self) -> np.ndarray:
        self.zeroer.check()
        out = np.asarray(jax.device_get(self.buffer)).reshape(-1).view(np.uint8)
        return out[: self._nbytes].copy() if self._nbytes is not None else out.copy()
