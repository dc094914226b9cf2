"""Torch-side test helpers for GPU runs: on-device poison and an independent torch reference.

``device_poison`` generates exactly :func:`kvlayout.poison_pattern`'s bytes on the device
(splitmix64 in wrapping int64 arithmetic), so multi-GB buffers need no host copy.
``torch_reference_zero`` zeroes with strided views and index assignment, a path that shares
no code with the Triton kernel, and is what big buffers are compared against on the device.
"""

from __future__ import annotations

import torch

from kvlayout.table import SegmentTable

_M = (1 << 64) - 1


def _i64(x: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    x &= _M
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def device_poison(
    nbytes: int, device: torch.device | str, seed: int = 0x5EED, chunk_words: int = 1 << 26
) -> torch.Tensor:
    """uint8 ``[nbytes]`` equal to ``kvlayout.poison_pattern(nbytes, seed)``, made on ``device``."""
    words = -(-nbytes // 8)
    out = torch.empty(words * 8, dtype=torch.uint8, device=device)
    out64 = out.view(torch.int64)
    for start in range(0, words, chunk_words):
        n = min(chunk_words, words - start)
        z = torch.arange(start, start + n, dtype=torch.int64, device=device) + seed
        z = z * _i64(0x9E3779B97F4A7C15)
        z = (z ^ _shr(z, 30)) * _i64(0xBF58476D1CE4E5B9)
        z = (z ^ _shr(z, 27)) * _i64(0x94D049BB133111EB)
        z = z ^ _shr(z, 31)
        out64[start : start + n] = z
    out[out == 0] = 0xA5
    return out[:nbytes]


def torch_reference_zero(words: torch.Tensor, table: SegmentTable, ids: torch.Tensor) -> None:
    """Zero ``ids`` in the int32 view ``words`` row by row with strided views (no Triton)."""
    n = table.num_blocks
    for s in table.segments:
        view = words.as_strided((n, s.span // 4), (s.stride // 4, 1), words.storage_offset() + s.base // 4)
        view[ids] = 0
