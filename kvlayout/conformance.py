"""Cross-backend conformance: run a backend on poisoned, guard-banded buffers and compare.

``run_case`` is the one primitive: fill ``guard + total_bytes + guard`` bytes with a
pattern that has no zero byte, hand them to the backend with the layout at ``offset =
guard``, zero a batch, read the bytes back and compare every byte with the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .backend import Backend
from .reference import ZeroCheck, compare_to_contract, normalize_block_ids, poison_pattern
from .table import SegmentTable

#: Untouched bytes on both sides of the layout; whole 512 B rows for TPU views.
GUARD_BYTES = 4096


@dataclass(frozen=True)
class CaseResult:
    """One backend run: how it ran, the bytes after, and the comparison with the contract."""

    backend: str
    mode: str
    block_ids: np.ndarray
    after: np.ndarray
    check: ZeroCheck

    @property
    def ok(self) -> bool:
        return self.check.matches


def run_case(
    backend: type[Backend],
    table: SegmentTable,
    block_ids: Any,
    *,
    guard: int = GUARD_BYTES,
    seed: int = 0x5EED,
    extra_bytes: int = 0,
) -> CaseResult:
    """Zero ``block_ids`` with ``backend`` on a poisoned buffer and compare with the contract.

    ``extra_bytes`` makes the buffer larger than the layout (beyond the trailing guard).
    Ids are validated before any buffer is made, so bad ids raise and write nothing.
    """
    ids = normalize_block_ids(block_ids, table.num_blocks)
    data = poison_pattern(guard + table.total_bytes + guard + extra_bytes, seed)
    be = backend.from_host(table, data, offset=guard)
    be.zero(ids)
    after = be.to_host()
    return CaseResult(backend.name, be.mode, ids, after, compare_to_contract(data, after, table, ids, origin=guard))
