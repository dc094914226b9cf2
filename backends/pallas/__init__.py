"""kvlayout.backends.pallas: the ``pallas`` backend, a TPU DMA zeroer exact on unaligned layouts.

On TPUs the Mosaic kernel runs natively; on NVIDIA GPUs the same API runs through the
Pallas Triton lowering; on the CPU the TPU kernel runs in Pallas's TPU interpret mode.
Importing this package imports nothing heavy: JAX loads when a name below is first used
(JAX itself sets a few environment variables when it is imported).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import PallasBackend
    from .native import CacheZeroer
    from .plan import RowPlan, plan_rows, zero_rows_numpy
    from .sharded import ShardedPallasZeroer
    from .zeroer import PallasZeroer, default_kernel, zero_blocks

#: public name -> submodule that defines it (imported on first use)
_LAZY = {
    "PallasBackend": ".backend",
    "PallasZeroer": ".zeroer",
    "default_kernel": ".zeroer",
    "zero_blocks": ".zeroer",
    "RowPlan": ".plan",
    "plan_rows": ".plan",
    "zero_rows_numpy": ".plan",
    "ShardedPallasZeroer": ".sharded",
    "CacheZeroer": ".native",
}

_SUBMODULES = ("backend", "kernels", "native", "native_kernels", "plan", "sharded", "zeroer")

__all__ = [
    "CacheZeroer",
    "PallasBackend",
    "PallasZeroer",
    "RowPlan",
    "ShardedPallasZeroer",
    "default_kernel",
    "plan_rows",
    "zero_blocks",
    "zero_rows_numpy",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
