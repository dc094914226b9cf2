"""Host-side row planning for the Pallas zeroer (NumPy only).

The TPU kernel views the buffer as ``int32[rows, 128]``: one row is 512 B, and 32-bit
(8, 128) tiles over exactly 128 lanes are linear in HBM, so a DMA can start at any row.
Spans need not be row aligned (DeepSeek-V4: stride 149,760 B = 292.5 rows), so which
lanes of a row belong to a span depends on the block id. With ``P`` the smallest power of
two such that ``P * stride`` is a whole number of rows for every segment, block
``b = c + P*q`` has phase class ``c`` and every byte of it sits at a fixed position relative
to rows shifted by ``q * P * stride / 512``. So per phase class the host lists

- *full* items: runs of whole rows (at most ``tile_rows`` each), cleared by DMA from a
  zeroed VMEM tile;
- *rmw* items: partial rows with a lane mask, cleared by read-modify-write of whole words.

Row of an item for block ``b``: ``row + (b // P) * qstride``. All in int32 rows (no x64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvlayout.errors import LayoutBufferError, TableError, bad_value
from kvlayout.ranges import INT32_MAX
from kvlayout.table import SegmentTable
from kvlayout.verify import overlaps_within_block

LANES = 128
ROW_BYTES = 4 * LANES


@dataclass(frozen=True)
class RowPlan:
    """Per-phase-class items for one (table, offset); CSR over classes ``[0, period)``."""

    period: int
    full_start: np.ndarray  # int32 [P+1]
    full_row: np.ndarray  # int32 [F] first row for q = 0
    full_qstride: np.ndarray  # int32 [F] rows added per q
    full_rows: np.ndarray  # int32 [F] rows in the run (1..tile_rows)
    rmw_start: np.ndarray  # int32 [P+1]
    rmw_row: np.ndarray  # int32 [R]
    rmw_qstride: np.ndarray  # int32 [R]
    rmw_mask: np.ndarray  # int32 [R] index into masks
    masks: np.ndarray  # int32 [M, 128]: 1 where the word is cleared
    tile_rows: int
    rows_needed: int  # rows the buffer must have
    num_blocks: int

    @property
    def aligned(self) -> bool:
        """No partial rows at all: the DMA-only fast path."""
        return self.rmw_row.size == 0

    def items_per_block(self) -> tuple[float, float]:
        """Mean (full DMAs, rmw rows) per block id over the phase classes."""
        return self.full_row.size / self.period, self.rmw_row.size / self.period


def check_rows_disjoint_per_block(table: SegmentTable) -> None:
    """Reject tables whose rows overlap within one block (a full-row DMA could race an RMW)."""
    hits = overlaps_within_block(table)
    if hits:
        i, j, b = hits[0]
        raise TableError(
            f"segments[{i}] and segments[{j}] overlap inside block {b}: the pallas backend needs "
            "per-block disjoint rows (coalesce the table)",
            field="table",
            value=(i, j),
        )


def plan_rows(table: SegmentTable, offset: int = 0, tile_rows: int = 64) -> RowPlan:
    """Cut every (coalesced) row of ``table``, shifted by ``offset`` bytes, into row items."""
    if offset % 4:
        raise TableError(f"offset = {offset}: must be a multiple of 4", field="offset", value=offset)
    words = [(int(s.base + offset) // 4, int(s.stride) // 4, int(s.span) // 4) for s in table.segments]
    period = 1
    for _, st, _ in words:
        need = LANES // math.gcd(st, LANES) if st else 1
        period = max(period, need)  # powers of two: the max is the lcm
    full: list[list[tuple[int, int, int]]] = [[] for _ in range(period)]
    rmw: list[list[tuple[int, int, int]]] = [[] for _ in range(period)]
    masks: dict[bytes, int] = {}
    mask_rows: list[np.ndarray] = []

    def mask_id(lo: int, hi: int) -> int:
        m = np.zeros(LANES, np.int32)
        m[lo:hi] = 1
        key = m.tobytes()
        if key not in masks:
            masks[key] = len(mask_rows)
            mask_rows.append(m)
        return masks[key]

    for base, stride, span in words:
        qstride = period * stride // LANES
        for c in range(min(period, table.num_blocks)):
            w0 = base + c * stride
            w1 = w0 + span
            r0, a = divmod(w0, LANES)
            r1, e = divmod(w1, LANES)  # r1: row holding the word after the span
            if r0 == r1:  # inside one row
                rmw[c].append((r0, qstride, mask_id(a, e)))
                continue
            fs, fe = r0, r1
            if a:
                rmw[c].append((r0, qstride, mask_id(a, LANES)))
                fs = r0 + 1
            if e:
                rmw[c].append((r1, qstride, mask_id(0, e)))
            for r in range(fs, fe, tile_rows):
                full[c].append((r, qstride, min(tile_rows, fe - r)))
    last_word = max((b + (table.num_blocks - 1) * st + sp for b, st, sp in words), default=0)
    rows_needed = -(-max(last_word, (offset + table.total_bytes) // 4) // LANES)
    alone = -(-max(last_word - offset // 4, table.total_bytes // 4) // LANES)  # the table at offset 0
    if rows_needed > INT32_MAX and offset and alone <= INT32_MAX:  # the offset's fault: name it
        raise bad_value(
            LayoutBufferError, "offset", offset,
            f"the layout ({table.total_bytes} B) at this byte offset needs a buffer of {rows_needed} rows "
            f"of {ROW_BYTES} B, beyond int32 row offsets (at most {INT32_MAX})",
        )
    if rows_needed > INT32_MAX:
        raise TableError(
            f"buffer of {rows_needed} rows exceeds int32 row offsets",
            field="table.total_bytes",
            value=table.total_bytes,
        )

    def csr(items: list[list[tuple[int, int, int]]]) -> tuple[np.ndarray, ...]:
        start = np.zeros(period + 1, np.int32)
        start[1:] = np.cumsum([len(x) for x in items])
        flat = [t for x in items for t in x]
        cols = np.array(flat, np.int64).reshape(-1, 3)
        return (start, *(cols[:, k].astype(np.int32) for k in range(3)))

    fs_, fr, fq, fn = csr(full)
    rs_, rr, rq, rm = csr(rmw)
    m = np.stack(mask_rows) if mask_rows else np.zeros((1, LANES), np.int32)
    return RowPlan(period, fs_, fr, fq, fn, rs_, rr, rq, rm, m, tile_rows, int(rows_needed), table.num_blocks)


def zero_rows_numpy(rows: np.ndarray, plan: RowPlan, ids: np.ndarray) -> None:
    """NumPy model of the TPU kernel over ``int32[rows, 128]``: the same items, in order."""
    for b in np.unique(ids).tolist():
        if not 0 <= b < plan.num_blocks:
            continue
        c, q = b % plan.period, b // plan.period
        for k in range(plan.full_start[c], plan.full_start[c + 1]):
            r = plan.full_row[k] + q * plan.full_qstride[k]
            rows[r : r + plan.full_rows[k]] = 0
        for k in range(plan.rmw_start[c], plan.rmw_start[c + 1]):
            r = plan.rmw_row[k] + q * plan.rmw_qstride[k]
            rows[r] = np.where(plan.masks[plan.rmw_mask[k]] != 0, 0, rows[r])
