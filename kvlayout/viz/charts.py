"""Step charts: bytes one step writes with per-group against all-group zeroing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import BlockIdError, TableError, bad_value
from ..planner import Layout
from ..ranges import MAX_BLOCKS
from ..reference import union_of_rows
from ..spec import (
    KVCacheSpec,
)
from ..table import Segment, SegmentTable
from ..validate import check_int
from .common import (
    KIND_COLORS,
    _comma_formatter,
    _fmt,
    _table_of,
    check_blocks,
    group_lanes,
    group_pattern,
)


# --------------------------------------------------------------------------- bytes written per step
def _union_bytes(rows: Sequence[Segment], ids: Sequence[int]) -> int:
    if not rows or not len(ids):
        return 0
    idx = np.unique(np.asarray(ids, np.int64))
    bases = np.array([s.base for s in rows], np.int64)
    strides = np.array([s.stride for s in rows], np.int64)
    spans = np.array([s.span for s in rows], np.int64)
    merged = union_of_rows(bases, strides, spans, idx)  # O(ranges), not rows x ids (2.1 GB; issue 25)
    return int((merged[:, 1] - merged[:, 0]).sum())


#: Most group shapes :func:`bytes_per_step` draws (a bar pair each).
MAX_STEP_SHAPES = 64


def _rows_by_group(table: SegmentTable) -> dict[str, list[Segment]]:
    """Each group's rows (a row merged across groups is each one's), in one pass: a scan of every row per
    group made 10,000 one-row groups take 59 s (issue 25, fifth pass)."""
    out: dict[str, list[Segment]] = {}
    for s in table.segments:
        for g in dict.fromkeys(s.group.split("+")):
            out.setdefault(g, []).append(s)
    return out


def step_bytes(table: SegmentTable, allocations: Mapping[str, Sequence[int]]) -> tuple[int, int]:
    """Bytes one step writes: ``(per_group, all_groups)``.

    ``allocations`` maps a group to the block ids newly given to it this step. Per-group
    zeroing (GEOMETRY.md section 7) clears, for each group, the union of its own rows over its
    ids; all-group zeroing (today) clears every row over all the ids. Computed from the rows'
    ``group`` provenance (rows merged across groups count for each of their groups).
    """
    if not isinstance(allocations, Mapping):
        raise bad_value(BlockIdError, "allocations", allocations, "must map group names to block ids")
    allocations = {g: check_blocks(ids, table.num_blocks).tolist() for g, ids in allocations.items()}
    rows = _rows_by_group(table)
    per = sum(_union_bytes(rows.get(g, []), ids) for g, ids in allocations.items())
    every = sorted({int(i) for ids in allocations.values() for i in ids})
    return per, _union_bytes(table.segments, every)


def _table_classes(table: SegmentTable, layout: Layout | None) -> list[tuple[str, list[str]]]:
    """``(label, groups)`` of groups with the same footprint, for the chart's rows."""
    if layout is not None:
        return [(lane.label.replace("\u00d7 ", ""), list(lane.groups)) for lane in group_lanes(layout)]
    sig: dict[tuple[Any, ...], list[str]] = {}
    for g, rows in _rows_by_group(table).items():
        key = tuple(sorted((s.base, s.stride, s.span) for s in rows))
        sig.setdefault(key, []).append(g)
    return [
        (gs[0] if len(gs) == 1 else f"{len(gs)} groups like {group_pattern(gs)}", gs) for gs in sig.values()
    ]


def bytes_per_step(source: SegmentTable | Layout | KVCacheSpec, new_blocks: int = 16, ax: Any = None) -> Any:
    """Bar chart: bytes written per step with all-group zeroing (today) and per-group zeroing.

    One step per group shape (a group gets ``new_blocks`` new block ids), and a mixed step in
    which every group gets its own ``new_blocks`` ids (fewer when the pool is small).
    ``ax.kvlayout_steps`` holds ``(label, per_group, all_groups)`` for each bar pair.
    """
    new_blocks = check_int(BlockIdError, "new_blocks", new_blocks, lo=1, hi=MAX_BLOCKS)  # an int: never wraps
    table, layout = _table_of(source, "source")
    classes = _table_classes(table, layout)
    if len(classes) > MAX_STEP_SHAPES:  # a bar pair each: more is unreadable (and was hours to draw)
        why = f"a step chart draws at most {MAX_STEP_SHAPES} group shapes (kvlayout plot draws 64 groups)"
        raise bad_value(TableError, "groups", len(classes), why)
    n = table.num_blocks
    k = max(1, min(new_blocks, n))
    steps: list[tuple[str, dict[str, list[int]]]] = [
        (f"{label}: {k} new blocks", {groups[0]: list(range(k))}) for label, groups in classes
    ]
    all_groups = [g for _, gs in classes for g in gs]
    each = min(new_blocks, n // max(1, len(all_groups)))
    if each and len(all_groups) > 1:
        steps.append(
            (
                f"mixed: {each} new blocks for each of {len(all_groups)} groups",
                {g: list(range(i * each, (i + 1) * each)) for i, g in enumerate(all_groups)},
            )
        )
    data = [(label, *step_bytes(table, alloc)) for label, alloc in steps]
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 1.2 + 0.55 * len(data)), layout="constrained")
    else:
        fig = ax.figure
    ys = np.arange(len(data))
    per = [d[1] for d in data]
    every = [d[2] for d in data]
    ax.barh(ys - 0.2, every, 0.38, color="#7f7f7f", label="all groups (today: every row of every group)")
    ax.barh(
        ys + 0.2,
        per,
        0.38,
        color=KIND_COLORS["attention"][0],
        label="per group (section 7: the group's own rows)",
    )
    top = max(every + per + [1])
    for y, (_, p, e) in zip(ys, data):
        ax.text(e, y - 0.2, f" {_fmt(e)} B", va="center", fontsize=7)
        ax.text(
            p,
            y + 0.2,
            f" {_fmt(p)} B ({100 * p / e:.1f} %)" if e else f" {_fmt(p)} B",
            va="center",
            fontsize=7,
        )
    ax.set_yticks(ys, [d[0] for d in data], fontsize=8)
    ax.set_ylim(len(data) - 0.4, -0.6)
    ax.set_xlim(0, top * 1.25)
    ax.xaxis.set_major_formatter(_comma_formatter())
    ax.set_xlabel("bytes written by zeroing in one step", fontsize=8)
    ax.legend(fontsize=8, loc="upper right")  # the first rows are short bars: that corner is free
    ax.set_title("bytes written per step: all-group against per-group zeroing", fontsize=9, loc="left")
    ax.kvlayout_steps = data
    return fig
