"""Step charts: bytes one step writes with per-group against all-group zeroing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import BlockIdError, TableError, bad_value, short
from ..planner import Layout
from ..reference import _coalesce_rows, union_of_rows
from ..spec import (
    KVCacheSpec,
)
from ..table import Segment, SegmentTable, check_table
from .common import (
    KIND_COLORS,
    MAX_PLOT_IDS,
    _comma_formatter,
    _fmt,
    _table_of,
    check_blocks,
    check_count,
    group_lanes,
    group_pattern,
)

# --------------------------------------------------------------------------- bytes written per step
#: Most (row, block-id run) ranges one :func:`step_bytes` call or one :func:`bytes_per_step` chart builds
#: (rows of one stride that touch joined first, as :func:`~kvlayout.reference.union_of_rows` does):
#: 2**23 take about 2 s; 64 rows of llama-8b times 1,000,000 ids took 59 s (pass 35).
MAX_STEP_RANGES = 1 << 23


def _union_cost(rows: Sequence[Segment], ids: np.ndarray) -> int:
    """How many ranges :func:`_union_bytes` builds for ``rows`` over sorted unique ``ids``: a run of
    consecutive ids is one range of a row as wide as its stride, else one range per id."""
    if not rows or not ids.size:
        return 0
    _, strides, spans = _coalesce_rows(
        np.array([s.base for s in rows], np.int64),
        np.array([s.stride for s in rows], np.int64),
        np.array([s.span for s in rows], np.int64),
    )
    dense = int(np.count_nonzero(spans >= np.abs(strides)))
    runs = 1 + int(np.count_nonzero(np.diff(ids) != 1))
    return dense * runs + (len(spans) - dense) * int(ids.size)


def _union_bytes(rows: Sequence[Segment], ids: np.ndarray) -> int:
    if not rows or not ids.size:
        return 0
    bases = np.array([s.base for s in rows], np.int64)
    strides = np.array([s.stride for s in rows], np.int64)
    spans = np.array([s.span for s in rows], np.int64)
    merged = union_of_rows(bases, strides, spans, ids)  # O(ranges), not rows x ids (2.1 GB; issue 25)
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

    ``allocations`` maps a group to the block ids newly given to it this step (each at most
    :data:`~kvlayout.viz.common.MAX_PLOT_IDS`; a ``range`` is checked by its ends first). Per-group
    zeroing (GEOMETRY.md section 7) clears, for each group, the union of its own rows over its
    ids; all-group zeroing (today) clears every row over all the ids. Computed from the rows'
    ``group`` provenance (rows merged across groups count for each of their groups). At most
    :data:`MAX_STEP_RANGES` ranges are built, counted before any is.
    """
    table = check_table(table)
    if not isinstance(allocations, Mapping):
        raise bad_value(BlockIdError, "allocations", allocations, "must map group names to block ids")
    groups = _rows_by_group(table)
    for g in allocations:  # a name of no group was counted as 0 bytes (pass 37)
        if type(g) is not str or g not in groups:
            shown = ", ".join(repr(x) for x in list(groups)[:8]) + (", ..." if len(groups) > 8 else "")
            why = f"no group of the table's rows (groups: {shown}; a group without rows writes nothing)"
            raise bad_value(BlockIdError, "allocations key", g, why)
    return _step_bytes(table, [allocations], "allocations", allocations)[0]


def _step_bytes(
    table: SegmentTable, steps: Sequence[Mapping[str, Any]], field: str, value: Any
) -> list[tuple[int, int]]:
    """:func:`step_bytes` of each step of a checked table. Past :data:`~kvlayout.viz.common.MAX_PLOT_IDS`
    ids or :data:`MAX_STEP_RANGES` ranges in all, a ``field = value`` error before any range is built."""
    if sum(len(alloc) for alloc in steps) > MAX_PLOT_IDS:
        raise bad_value(BlockIdError, field, value, f"at most {_fmt(MAX_PLOT_IDS)} groups in all")
    rows = _rows_by_group(table)
    n, total, cost = table.num_blocks, 0, 0
    done: list[tuple[dict[str, np.ndarray], np.ndarray]] = []
    for alloc in steps:
        ids: dict[str, np.ndarray] = {}
        for g, v in alloc.items():
            asked = check_blocks(v, n, f"allocations[{short(g)}]")
            total += asked.size
            if total > MAX_PLOT_IDS:  # {g: range(10**6) for 5,000 g} would list 40 GB
                why = f"at most {_fmt(MAX_PLOT_IDS)} block ids in all"
                raise bad_value(BlockIdError, field, value, why)
            ids[g] = asked if isinstance(v, range) and v.step > 0 else np.unique(asked)
        every = np.unique(np.concatenate([np.zeros(0, np.int64), *ids.values()]))
        cost += _union_cost(table.segments, every)
        cost += sum(_union_cost(rows.get(g, []), i) for g, i in ids.items())
        done.append((ids, every))
    if cost > MAX_STEP_RANGES:  # rows x ids took a minute
        why = f"{_fmt(cost)} (row, block) ranges to merge; step_bytes merges at most {_fmt(MAX_STEP_RANGES)}"
        raise bad_value(BlockIdError, field, value, why)
    out = []
    for ids, every in done:
        per = sum(_union_bytes(rows.get(g, []), i) for g, i in ids.items())
        out.append((per, _union_bytes(table.segments, every)))
    return out


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
    new_blocks = check_count(BlockIdError, "new_blocks", new_blocks, MAX_PLOT_IDS, "ids a drawing takes")
    table, layout = _table_of(source, "source")
    classes = _table_classes(table, layout)
    if len(classes) > MAX_STEP_SHAPES:  # a bar pair each: more is unreadable (and was hours to draw)
        why = f"a step chart draws at most {MAX_STEP_SHAPES} group shapes (kvlayout plot draws 64 groups)"
        raise bad_value(TableError, "groups", len(classes), why)
    n = table.num_blocks
    k = max(1, min(new_blocks, n))
    steps: list[tuple[str, dict[str, range]]] = [
        (f"{label}: {k} new blocks", {groups[0]: range(k)}) for label, groups in classes
    ]
    all_groups = [g for _, gs in classes for g in gs]
    each = min(new_blocks, n // max(1, len(all_groups)))
    if each and len(all_groups) > 1:
        steps.append(
            (
                f"mixed: {each} new blocks for each of {len(all_groups)} groups",
                {g: range(i * each, (i + 1) * each) for i, g in enumerate(all_groups)},
            )
        )
    counts = _step_bytes(table, [alloc for _, alloc in steps], "new_blocks", new_blocks)
    data = [(label, *c) for (label, _), c in zip(steps, counts)]
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
