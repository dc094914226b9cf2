"""Byte maps (:func:`byte_map`), table maps (:func:`table_map`), the table view and :func:`zero_diff`."""

from __future__ import annotations

import math
import numbers
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import LayoutBufferError, SpecError, TableError, bad_value, short, spec_error
from ..planner import Layout
from ..ranges import merge_ranges
from ..spec import (
    KVCacheSpec,
)
from ..table import Segment, SegmentTable, check_table
from ..validate import check_int
from .common import (
    BLOCK_GAP,
    EDGE_COLOR,
    HEADER,
    KIND_COLORS,
    LANE_BG,
    LANE_H,
    LANE_IN,
    LAYER_PALETTE,
    MAX_PLOT_LANES,
    MAX_PLOT_ROWS,
    MAX_PLOT_STRIPS,
    PAD_COLOR,
    UNSAFE_COLOR,
    Box,
    Geometry,
    Lane,
    MapInfo,
    _as_layout,
    _color_mode,
    _comma_formatter,
    _count,
    _fmt,
    _lane_colors,
    _meeting,
    _short,
    _shown_blocks,
    _table_of,
    _wrong_type,
    check_count,
    check_offset,
    group_lanes,
    layer_kind,
)


def check_xmax(xmax: Any) -> float | None:
    """A byte map's right edge: ``None`` or a finite positive number (not a bool), as a float."""
    if xmax is None:
        return None
    if isinstance(xmax, numbers.Real) and not isinstance(xmax, (bool, np.bool_)):
        try:
            x = float(xmax)
        except (ArithmeticError, ValueError, TypeError):  # an integer past float's range
            x = math.inf
        if math.isfinite(x) and x > 0:
            return x
    raise spec_error("xmax", xmax, "must be a finite positive number of bytes (or None)")


# --------------------------------------------------------------------------- the byte map
def _draw_lanes(
    ax: Any,
    geo: Geometry,
    lanes: Sequence[Lane],
    colors: Sequence[dict[str, str]],
    block: int,
    y: float,
    *,
    labels: bool,
    ghost: bool = False,
) -> list[float]:
    """Draw the lanes of one block from ``y`` down; returns their tops."""
    from matplotlib.patches import Rectangle

    tops = []
    for lane, cols in zip(lanes, colors):
        if not ghost:
            ax.add_patch(Rectangle((0, y), geo.width, LANE_H, facecolor=LANE_BG, lw=0, zorder=0, gid="lane"))
        shift = geo.width if ghost else 0
        for b in lane.boxes:
            layer = b.placement.layer
            kw: dict[str, Any] = {"alpha": 0.35} if ghost else {}
            hatch = "...." if not layer.zeroed else None
            ax.add_patch(
                Rectangle(
                    (b.x + shift, y),
                    b.span,
                    LANE_H,
                    facecolor=cols[layer.name],
                    edgecolor="white",
                    lw=0.4,
                    hatch=hatch,
                    zorder=1,
                    gid=f"layer:{layer.name}",
                    **kw,
                )
            )
            if b.gap:
                ax.add_patch(
                    Rectangle(
                        (b.x + b.span + shift, y),
                        b.gap,
                        LANE_H,
                        facecolor=PAD_COLOR,
                        edgecolor="#777777",
                        hatch="///",
                        lw=0,
                        zorder=1,
                        gid=f"gap:{layer.name}",
                        **kw,
                    )
                )
            lo, hi = ax.get_xlim()
            if labels and not ghost and b.span >= 0.07 * (hi - lo):
                text = _short(layer.name) if len(lane.groups) == 1 else layer_kind(layer)
                ax.text(
                    b.x + b.span / 2,
                    y + LANE_H / 2,
                    f"{text} {_fmt(b.span)} B",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black",
                    clip_on=True,
                    zorder=3,
                )
        tops.append(y)
        y += 1.0
    return tops


def _legend_handles(
    lanes: Sequence[Lane], colors: Sequence[dict[str, str]], mode: str, packed: bool
) -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = []
    layers = [b.placement.layer for lane in lanes for b in lane.boxes]
    if mode == "layer":
        seen: set[str] = set()
        for lane, cols in zip(lanes, colors):
            for b in lane.boxes:
                layer = b.placement.layer
                if layer.name not in seen:
                    seen.add(layer.name)
                    handles.append(
                        Patch(facecolor=cols[layer.name], label=f"{_short(layer.name)} ({layer_kind(layer)})")
                    )
    else:
        kinds = [k for k in KIND_COLORS if any(layer_kind(layer) == k for layer in layers)]
        for k in kinds:
            label = "Mamba state (never zeroed)" if k == "mamba" else k
            handles.append(Patch(facecolor=KIND_COLORS[k][0], label=label))
    if any(b.gap for lane in lanes for b in lane.boxes):
        handles.append(
            Patch(
                facecolor=PAD_COLOR,
                hatch="///",
                edgecolor="#777777",
                lw=0,
                label="alignment gap (never zeroed)",
            )
        )
    if packed:
        handles.append(Line2D([], [], color=EDGE_COLOR, ls="--", lw=1, label="next block starts"))
    handles.append(Line2D([], [], color=EDGE_COLOR, lw=2.5, label="end of buffer"))
    return handles


def _arrow(ax: Any, x0: float, x1: float, y: float, text: str, color: str = EDGE_COLOR) -> None:
    ax.annotate(
        "",
        xy=(x1, y),
        xytext=(x0, y),
        arrowprops={
            "arrowstyle": "<|-|>",
            "color": color,
            "lw": 1,
            "shrinkA": 0,
            "shrinkB": 0,
            "mutation_scale": 8,
        },
    )
    lo, hi = ax.get_xlim()
    narrow = (x1 - x0) < 0.25 * (hi - lo)
    ax.text(
        x0 if narrow else (x0 + x1) / 2,
        y - 0.12,
        text,
        ha="left" if narrow else "center",
        va="bottom",
        fontsize=8,
        color=color,
        gid="arrow",
    )


def _gap_box(lanes: Sequence[Lane]) -> Box | None:
    """The first alignment gap of a zeroed layer in the widest lane (else of any lane, any layer)."""
    ordered = sorted(lanes, key=lambda la: -la.end)
    for zeroed_only in (True, False):
        for lane in ordered:
            gaps = sorted(
                (b for b in lane.boxes if b.gap and (b.placement.layer.zeroed or not zeroed_only)),
                key=lambda b: b.x,
            )
            if gaps:
                return gaps[0]
    return None


def _header(ax: Any, geo: Geometry, lanes: Sequence[Lane]) -> None:
    """Stride, page and span arrows above the lanes."""
    gb = _gap_box(lanes)
    first = gb or min((b for lane in lanes for b in lane.boxes), key=lambda b: b.x)
    if geo.packed:
        _arrow(ax, 0, geo.width, -2.35, f"stride {_fmt(geo.width)} B: block b starts at b \u00d7 stride")
    else:
        where = (
            "head h of slot j of block b at region(j) + (h \u00d7 num_blocks + b) \u00d7 N\u00b7C"
            if any(geo.head_pitch)
            else "slot j of block b at region(j) + b \u00d7 page(j)"
        )
        text = f"one block: {len(geo.slot_x)} slot pages, {_fmt(geo.width)} B ({where})"
        _arrow(ax, 0, geo.width, -2.35, text)
    x0 = first.x
    what = {"k": "K half: ", "v": "V half: "}.get(first.part, "")
    if first.part.startswith("head"):  # LHBNC/BHLNC: one of H runs of the page
        heads = first.placement.layer.heads
        _arrow(
            ax,
            x0,
            x0 + first.span,
            -0.75,
            f"head {first.part[4:]}: span {_fmt(first.span)} B, 1 of {heads} runs of the "
            f"{_fmt(first.placement.layer.real_page)} B page ({_short(first.placement.layer.name)})",
        )
        return
    if first.gap:
        _arrow(
            ax,
            x0,
            x0 + first.padded,
            -1.55,
            f"page {_fmt(first.padded)} B = span + {_fmt(first.gap)} B gap "
            f"({_short(first.placement.layer.name)})",
        )
        _arrow(ax, x0, x0 + first.span, -0.75, f"span {_fmt(first.span)} B: what zeroing clears")
    else:
        _arrow(
            ax,
            x0,
            x0 + first.span,
            -0.75,
            f"{what}span = page {_fmt(first.span)} B, no gap ({_short(first.placement.layer.name)})",
        )


@dataclass(frozen=True)
class _Inset:
    letter: str
    block: int
    lo: float
    hi: float
    title: str
    marks: tuple[tuple[int, str], ...]  # (x in the row, label)
    ghost: bool = False


def _insets(geo: Geometry, lanes: Sequence[Lane], shown: Sequence[int]) -> list[_Inset]:
    """Where the story is: the first gap, the block boundary, the end of the buffer."""
    out: list[_Inset] = []
    n = geo.layout.num_blocks
    if n == 0:
        return out
    b0 = shown[0]
    gb = _gap_box(lanes)
    if gb is not None:
        a, e = gb.x + gb.span, gb.x + gb.padded
        w = max(3 * gb.gap, 160)
        name = _short(gb.placement.layer.name)
        out.append(
            _Inset(
                "A",
                b0,
                a - w,
                e + w,
                f"alignment gap after {name} (block {b0})",
                (
                    (a, f"{_fmt(geo.to_buffer(b0, a))}\nspan ends"),
                    (e, f"{_fmt(geo.to_buffer(b0, e))}\npage ends"),
                ),
            )
        )
    widest = max(lanes, key=lambda la: la.end)
    last = max(widest.boxes, key=lambda b: b.x + b.padded)
    tail = last.x + last.span
    if tail >= geo.width:  # no gap before the boundary: nothing to zoom on
        return out
    w = max(3 * (geo.width - tail), 160)
    if geo.packed and n >= 2 and b0 + 1 < n:
        out.append(
            _Inset(
                "B",
                b0,
                tail - w,
                geo.width + w,
                f"block {b0} \u2192 block {b0 + 1} (stride boundary)",
                (
                    (tail, f"{_fmt(geo.to_buffer(b0, tail))}\nlast span ends"),
                    (geo.width, f"{_fmt(geo.to_buffer(b0 + 1, 0))}\nblock {b0 + 1} starts"),
                ),
                ghost=True,
            )
        )
    out.append(
        _Inset(
            "C",
            n - 1,
            tail - w,
            geo.width + w,
            f"end of the buffer (block {n - 1})",
            (
                (tail, f"{_fmt(geo.to_buffer(n - 1, tail))}\nlast span ends"),
                (geo.width, f"{_fmt(geo.layout.total_bytes)}\n= total_bytes"),
            ),
        )
    )
    return out


def _draw_inset(
    ax: Any, geo: Geometry, lanes: Sequence[Lane], colors: Sequence[dict[str, str]], ins: _Inset
) -> None:
    from matplotlib.patches import Rectangle

    ax.set_xlim(ins.lo, ins.hi)
    tops = _draw_lanes(ax, geo, lanes, colors, ins.block, 0.0, labels=False)
    n = geo.layout.num_blocks
    if ins.ghost and ins.block + 1 < n:
        _draw_lanes(ax, geo, lanes, colors, ins.block + 1, 0.0, labels=False, ghost=True)
    bottom = tops[-1] + LANE_H
    if ins.block == n - 1:
        ax.add_patch(
            Rectangle(
                (geo.width, -1.6),
                ins.hi - geo.width,
                bottom + 1.6,
                facecolor="white",
                edgecolor="#999999",
                hatch="xx",
                lw=0,
                zorder=2,
                gid="outside",
            )
        )
        ax.plot([geo.width, geo.width], [-1.6, bottom], color=EDGE_COLOR, lw=2.5, zorder=4)
    for k, (x, text) in enumerate(ins.marks):
        ax.plot([x, x], [-1.6, bottom], color=EDGE_COLOR, lw=0.8, ls=":", zorder=4)
        left = k == 0 and len(ins.marks) > 1
        ax.text(
            x,
            -1.65,
            text,
            ha="right" if left else "left",
            va="bottom",
            fontsize=7,
            zorder=5,
            multialignment="right" if left else "left",
            gid="mark",
        )
    xs = [x for x, _ in ins.marks]
    if len(xs) == 2 and xs[1] > xs[0]:
        _arrow(ax, xs[0], xs[1], -0.25, f"{_fmt(xs[1] - xs[0])} B")
    ax.set_xlim(ins.lo, ins.hi)
    ax.set_ylim(bottom + 0.1, -3.3)
    ax.set_yticks([t + LANE_H / 2 for t in tops], [lane.short_label for lane in lanes], fontsize=7)
    ax.set_xticks([])
    ax.set_title(f"{ins.letter}: {ins.title}", fontsize=8)
    ax.set_xlabel(
        f"a {_fmt(int(ins.hi - ins.lo))} B window of the buffer (byte offsets as marked)", fontsize=7
    )


def byte_map(
    spec_or_layout: KVCacheSpec | Layout,
    blocks: Sequence[int] | None = None,
    ax: Any = None,
    *,
    collapse: bool = True,
    insets: bool | None = None,
    color_by: str = "auto",
    max_lanes: int = 24,
    xmax: float | None = None,
    title: str | None = None,
) -> Any:
    """Draw the block byte map; returns the matplotlib Figure.

    Lanes: one per (shown block, group shape); ``collapse=False`` gives every group its own.
    Insets (default: when ``ax`` is not given) zoom on the first alignment gap, the stride
    boundary and the end of the buffer. ``ax.kvlayout`` holds a :class:`MapInfo`.
    """
    layout = _as_layout(spec_or_layout, "spec_or_layout", drawn=True)  # its size checked before it is planned
    max_lanes = check_count(SpecError, "max_lanes", max_lanes, MAX_PLOT_LANES, "lanes a byte map draws")
    xmax = check_xmax(xmax)
    import matplotlib.pyplot as plt

    spec, geo = layout.spec, Geometry(layout)
    n = spec.num_blocks
    lanes = group_lanes(layout, collapse)
    mode = _color_mode(lanes, color_by)
    colors = _lane_colors(lanes, mode)
    shown, sampled = _shown_blocks(n, blocks, len(lanes), max_lanes, sum(len(la.boxes) for la in lanes))
    height = len(shown) * len(lanes) + BLOCK_GAP * (len(shown) - 1) + HEADER
    ins = _insets(geo, lanes, shown) if (insets if insets is not None else ax is None) else []
    if ax is None:
        main_in = 1.1 + max(0.2, min(LANE_IN, 6.5 / height)) * height  # lanes thinner past ~24 rows
        fig = plt.figure(figsize=(13, main_in + (2.6 if ins else 0) + 0.6), layout="constrained")
        grid = fig.add_gridspec(
            2 if ins else 1, max(1, len(ins)), height_ratios=[main_in, 2.6] if ins else [1]
        )
        ax = fig.add_subplot(grid[0, :])
        inset_axes = [fig.add_subplot(grid[1, i]) for i in range(len(ins))]
    else:
        fig, inset_axes = ax.figure, []
        ins = []
    ax.set_xlim(0, xmax if xmax is not None else geo.width * 1.075)
    y, info_lanes, ticks, labels = 0.0, [], [], []
    for b in shown:
        tops = _draw_lanes(ax, geo, lanes, colors, b, y, labels=b == shown[0])
        for t, lane in zip(tops, lanes):
            info_lanes.append((t, b, lane))
            ticks.append(t + LANE_H / 2)
            name = "row layout (0 blocks)" if n == 0 else f"block {b}"
            labels.append(f"{name} \u00b7 {lane.label}" if len(lanes) > 1 else name)
        top, bottom = tops[0] - 0.1, tops[-1] + LANE_H + 0.1
        if n and b == n - 1:
            ax.plot([geo.width, geo.width], [top, bottom], color=EDGE_COLOR, lw=2.5, zorder=4, gid="end")
            ax.text(
                geo.width,
                (top + bottom) / 2,
                f" end of buffer\n {_fmt(layout.total_bytes)} B",
                fontsize=7,
                va="center",
                ha="left",
                color=EDGE_COLOR,
            )
        elif n and geo.packed:
            ax.plot(
                [geo.width, geo.width],
                [top, bottom],
                color=EDGE_COLOR,
                lw=1,
                ls="--",
                zorder=4,
                gid="boundary",
            )
            ax.text(
                geo.width, (top + bottom) / 2, f" block {b + 1}\n starts", fontsize=7, va="center", ha="left"
            )
        if not geo.packed:
            for sx in geo.slot_x[1:]:
                ax.plot([sx, sx], [top, bottom], color="#999999", lw=0.4, zorder=2)
        for i in ins:
            if i.block == b:
                xc = (i.lo + i.hi) / 2
                ax.text(
                    xc,
                    top - 0.02,
                    i.letter,
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    fontweight="bold",
                    zorder=6,
                    bbox={"boxstyle": "circle,pad=0.15", "fc": "white", "ec": EDGE_COLOR, "lw": 0.8},
                )
        y = tops[-1] + 1.0 + BLOCK_GAP
    _header(ax, geo, lanes)
    ax.set_ylim(y - BLOCK_GAP, -HEADER)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.tick_params(axis="y", length=0)
    ax.xaxis.set_major_formatter(_comma_formatter())
    ax.set_xlabel(
        "byte offset in the block row"
        if geo.packed
        else "byte offset in the block's slot pages, slots side by side"
        + (" (K half, then V half)" if any(geo.split) else ""),
        fontsize=8,
    )
    text = (
        f"{spec.layout}: {_count(len(spec.groups), 'group')}, {_count(len(spec.layers), 'layer')}, "
        f"{_count(n, 'block')}, {_fmt(layout.total_bytes)} B buffer"
    )
    if len(lanes) < len(spec.groups):
        text += f"; {len(spec.groups)} groups drawn as {len(lanes)} lanes of equal shape"
    if sampled:
        text += f" (showing blocks {', '.join(map(str, shown))} of {n})"
    if title is not None:
        text = f"{title}\n{text}"
    ax.set_title(text, fontsize=9, loc="left", pad=4)
    ax.legend(
        handles=_legend_handles(lanes, colors, mode, geo.packed),
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        fontsize=7,
        frameon=False,
    )
    for iax, i in zip(inset_axes, ins):
        _draw_inset(iax, geo, lanes, colors, i)
    ax.kvlayout = MapInfo(layout, geo, info_lanes, [i.letter for i in ins])
    return fig


# --------------------------------------------------------------------------- segment table view
class TableView:
    """The segment table with per-row checks: HTML in notebooks, text in the terminal."""

    COLS = (
        "row",
        "group/layer/part",
        "base",
        "stride",
        "span",
        "span/stride",
        "alignment",
        "last byte",
        "verdict",
    )

    def __init__(self, table: Any) -> None:
        from ..verify import verify

        table = _table_of(table, "table", TableError)[0]  # a spec or layout: its planned table
        self.table = table
        self.report = verify(table)
        bad: dict[int, list[int]] = {}
        for v in self.report.violations:
            for r in v.rows:
                bad.setdefault(r, []).append(v.invariant)
        n, total = table.num_blocks, table.total_bytes
        self.rows = []
        for i, s in enumerate(table.segments):
            align = 1
            while align < 4096 and s.base % (align * 2) == 0 and s.stride % (align * 2) == 0:
                align *= 2
            end = s.base + (n - 1) * s.stride + s.span
            verdict = "ok" if i not in bad else "BROKEN " + ",".join(str(x) for x in sorted(set(bad[i])))
            self.rows.append(
                (
                    i,
                    s.label,
                    s.base,
                    s.stride,
                    s.span,
                    f"{s.span / s.stride:.3f}" if s.stride else "-",
                    f"{align} B",
                    f"{end} / {total}",
                    verdict,
                )
            )

    def __str__(self) -> str:
        widths = [max(len(str(c)), *(len(str(r[k])) for r in self.rows)) for k, c in enumerate(self.COLS)]
        line = lambda r: "  ".join(str(x).rjust(w) for x, w in zip(r, widths))  # noqa: E731
        return "\n".join(
            [line(self.COLS), *(line(r) for r in self.rows), self.report.format().splitlines()[0]]
        )

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{c}</th>" for c in self.COLS)
        body = "".join(
            "<tr>"
            + "".join(f"<td style='color:{'red' if 'BROKEN' in str(r[-1]) else 'black'}'>{x}</td>" for x in r)
            + "</tr>"
            for r in self.rows
        )
        return f"<table><tr>{head}</tr>{body}</table><p>{self.report.format().splitlines()[0]}</p>"


def table_view(table: SegmentTable | Layout | KVCacheSpec) -> TableView:
    """The table (of a spec or layout: planned) with a verdict per row (``print`` it, or show it in a
    notebook)."""
    return TableView(table)


# --------------------------------------------------------------------------- a table drawn, bad ones too
def _conflicts(table: SegmentTable, block: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes of ``[lo, hi)`` (cleared for ``block``) that break an invariant: ``(shared, outside)``.

    ``shared``: also cleared for another block, or alignment padding of any block (merged
    ``[k, 2]`` ranges); ``outside``: past the buffer. At most 64 blocks per row are looked at;
    beyond, the covered hull is marked.
    """
    starts, ends = [], []
    for what, rows in (("row", table.segments), ("pad", table.padding)):
        for s in rows:
            meet = _meeting(s, lo, hi, table.num_blocks)
            if len(meet) > 64:  # a hull: some other block is among them, so the table is unsafe here
                a, e = s.base + meet[0] * s.stride, s.base + meet[-1] * s.stride
                starts.append(max(min(a, e), lo))
                ends.append(min(max(a, e) + s.span, hi))
                continue
            for b in meet:
                if what == "row" and b == block:
                    continue
                a = s.base + b * s.stride
                if a < hi and lo < a + s.span:
                    starts.append(max(a, lo))
                    ends.append(min(a + s.span, hi))
    shared = merge_ranges(np.array(starts, np.int64), np.array(ends, np.int64))
    out = [(a, e) for a, e in ((lo, min(hi, 0)), (max(lo, table.total_bytes), hi)) if e > a]
    return shared, np.array(out, np.int64).reshape(-1, 2)


def _row_colors(k: int) -> list[str]:
    return [LAYER_PALETTE[i % len(LAYER_PALETTE)] for i in range(k)]


def table_map(
    table: SegmentTable | Layout | KVCacheSpec,
    blocks: Sequence[int] | None = None,
    ax: Any = None,
    *,
    inset: bool | None = None,
    max_rows: int = 24,
) -> Any:
    """Draw what each row clears per block, in block-0 coordinates of the row (``base + offset``).

    Red: bytes that another block also clears, alignment padding, or (cross-hatched) bytes past
    the end of the buffer, so red appears only on a table the verifier rejects. Tables of
    more than ``max_rows`` rows are drawn coalesced (same bytes), at most :data:`MAX_PLOT_ROWS`
    rows. For an unsafe table an inset (default: when ``ax`` is not given) draws the first spill
    at byte scale. A spec or layout draws its planned table.
    """
    from ..verify import verify

    table = _table_of(table, "table", TableError)[0]
    max_rows = check_int(TableError, "max_rows", max_rows, lo=1)
    draw = table if len(table) <= max_rows else table.coalesced()
    if len(draw) > MAX_PLOT_ROWS:  # before matplotlib: each row is drawn against every other row
        coalesced = f" (coalesced from {len(table)})" if draw is not table else ""
        why = f"a table map draws at most {MAX_PLOT_ROWS} rows{coalesced}"
        raise bad_value(TableError, "rows", len(draw), why)
    report = verify(table)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    n, total = draw.num_blocks, draw.total_bytes
    shown, sampled = _shown_blocks(n, blocks, 1, 6)
    strides = {s.stride for s in draw.segments}
    one = strides.pop() if len(strides) == 1 else None
    # rows side by side in block 0's row when they live within about one block row, else each row
    # in its own frame (x = bytes from the row's base in its block): layer-major tables
    reach = max((s.base + s.span for s in draw.segments), default=0) - min(
        (s.base for s in draw.segments), default=0
    )
    own = reach > 2 * max((abs(s.stride) for s in draw.segments), default=0)
    first = _first_spill(report)
    want_inset = (inset if inset is not None else ax is None) and first is not None and n > 0
    if ax is None:
        main_in = 1.3 + 0.55 * len(shown)
        fig = plt.figure(figsize=(13, main_in + (2.8 if want_inset else 0) + 0.4), layout="constrained")
        grid = fig.add_gridspec(
            2 if want_inset else 1, 1, height_ratios=[main_in, 2.8] if want_inset else [1]
        )
        ax = fig.add_subplot(grid[0])
        iax = fig.add_subplot(grid[1]) if want_inset else None
    else:
        fig, iax = ax.figure, None
    colors = _row_colors(len(draw))
    xs = [0]
    h = 0.75 / max(1, len(draw))
    for lane, b in enumerate(shown if n else []):
        for r, s in enumerate(draw.segments):
            a = s.base + b * s.stride
            shift = b * s.stride + (s.base if own else 0)
            y = lane + 0.1 + 0.75 * r / max(1, len(draw))
            if own and s.stride:
                ax.plot([abs(s.stride)] * 2, [y, y + h], color=EDGE_COLOR, lw=1, ls="--", gid="boundary")
            ax.add_patch(Rectangle((a - shift, y), s.span, h, facecolor=colors[r], lw=0, gid=f"row:{r}"))
            shared, outside = _conflicts(draw, b, a, a + s.span)
            for c0, c1 in shared.tolist():
                ax.add_patch(
                    Rectangle((c0 - shift, y), c1 - c0, h, facecolor=UNSAFE_COLOR, lw=0, gid="unsafe")
                )
            for c0, c1 in outside.tolist():
                ax.add_patch(
                    Rectangle(
                        (c0 - shift, y),
                        c1 - c0,
                        h,
                        facecolor=UNSAFE_COLOR,
                        edgecolor="black",
                        hatch="xx",
                        lw=0,
                        gid="outside",
                    )
                )
            xs += [a - shift, a - shift + s.span]
        if one is not None and one > 0 and not own:
            end = total - b * one
            if b == n - 1:
                ax.plot([end, end], [lane, lane + 0.95], color=EDGE_COLOR, lw=2.5, gid="end")
            else:
                ax.plot([one, one], [lane, lane + 0.95], color=EDGE_COLOR, lw=1, ls="--", gid="boundary")
    width = max(xs)
    ax.set_xlim(min(0, min(xs)), max(width, abs(one or 0)) * 1.03 or 1)
    ax.set_ylim(max(1, len(shown)), 0)
    ax.set_yticks([i + 0.47 for i in range(len(shown))], [f"block {b}" for b in shown], fontsize=8)
    ax.xaxis.set_major_formatter(_comma_formatter())
    ax.set_xlabel(
        "bytes from each row's own base in its block (dashed: the row's stride, where its next block starts)"
        if own
        else "byte offset in block 0's row (each block's rows shifted back by b \u00d7 stride); "
        "dashed: next block starts; thick: end of buffer",
        fontsize=8,
    )
    handles = [
        Patch(facecolor=c, label=f"row {r}: {_row_name(s)}")
        for r, (c, s) in enumerate(zip(colors, draw.segments))
    ][:8]
    if not report.ok:
        handles += [
            Patch(facecolor=UNSAFE_COLOR, label="bytes of two blocks / padding"),
            Patch(facecolor=UNSAFE_COLOR, hatch="xx", edgecolor="black", label="past the end of the buffer"),
        ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False)
    title = f"{_count(len(table), 'row')}, {_count(n, 'block')}: {'SAFE' if report.ok else 'UNSAFE'}"
    if draw is not table:
        title += (
            f" (drawn coalesced: {len(draw)} rows, the same bytes)"
            if len(draw) < len(table)
            else f" ({len(draw)} rows in each block's lane)"
        )
    if sampled:
        title += f" (showing blocks {', '.join(map(str, shown))} of {n})"
    ax.set_title(title, fontsize=9, loc="left", color="black" if report.ok else UNSAFE_COLOR)
    if iax is not None and first is not None:
        _spill_inset(iax, draw, first, colors)
    return fig


def _row_name(s: Segment) -> str:
    """A row's layer, short: ``layers.0.attn`` or, for coalesced rows, ``layers.0.attn + 35 more``."""
    names = [n for n in s.layer.split("+") if n] or [s.label]
    return _short(names[0])[:40] + (f" + {len(names) - 1} more" if len(names) > 1 else "")


def _first_spill(report: Any) -> Any:
    """The first violation with bytes: block isolation first, then bounds, then padding."""
    for inv in (3, 2, 4):
        for v in report.by_invariant(inv):
            if v.byte_range is not None:
                return v
    return None


def _spill_inset(ax: Any, table: SegmentTable, v: Any, colors: Sequence[str]) -> None:
    """The bytes around the start of a violation, in buffer offsets, one lane per (block, row)."""
    from matplotlib.patches import Rectangle

    start = int(v.byte_range[0])
    w = 256
    lo, hi = start - w, start + w
    lanes: list[tuple[int, int, int]] = []  # (block, row, start)
    for r, s in enumerate(table.segments):
        lanes += [(b, r, s.base + b * s.stride) for b in _meeting(s, lo, hi, table.num_blocks)[:4]]
    lanes = sorted(lanes)[:8]
    marks: set[int] = set()
    for k, (b, r, a) in enumerate(lanes):
        s = table.segments[r]
        ax.add_patch(Rectangle((a, k + 0.1), s.span, 0.8, facecolor=colors[r], lw=0))
        shared, outside = _conflicts(table, b, a, a + s.span)
        for c0, c1 in [*shared.tolist(), *outside.tolist()]:
            ax.add_patch(Rectangle((c0, k + 0.1), c1 - c0, 0.8, facecolor=UNSAFE_COLOR, lw=0, gid="unsafe"))
        marks.update(x for x in (a, a + s.span) if lo < x < hi)
    strides = {s.stride for s in table.segments}
    stride = strides.pop() if len(strides) == 1 and min(s.base for s in table.segments) == 0 else 0
    for x in sorted(marks):
        ax.axvline(x, color=EDGE_COLOR, lw=0.8, ls=":")
        starts = f"\nblock {x // stride} starts" if stride > 0 and x % stride == 0 else ""
        ax.text(x, -0.05, _fmt(x) + starts, ha="center", va="bottom", fontsize=7, gid="mark")
    if lo < table.total_bytes < hi:
        ax.axvline(table.total_bytes, color=EDGE_COLOR, lw=2.5)
    ax.set_xlim(lo, hi)
    ax.set_ylim(max(1, len(lanes)), -0.6)
    ax.set_yticks(
        [k + 0.5 for k in range(len(lanes))],
        [f"block {b}, row {r} ({_row_name(table.segments[r])})" for b, r, _ in lanes],
        fontsize=7,
    )
    ax.xaxis.set_major_formatter(_comma_formatter())
    ax.tick_params(axis="x", labelsize=7)
    msg = "\n".join(textwrap.wrap(f"first spill at byte scale (invariant {v.invariant}): {v.message}", 170))
    ax.set_title(msg, fontsize=8, color=UNSAFE_COLOR, loc="left")
    ax.set_xlabel(f"buffer byte offset ({_fmt(hi - lo)} B window)", fontsize=8)


# --------------------------------------------------------------------------- zeroing diff
def _buffer_bytes(field: str, value: Any) -> np.ndarray:
    """A buffer's bytes, flat (any dtype is read as its raw bytes); an array of objects, or anything
    NumPy cannot read as an array, is a :class:`~kvlayout.LayoutBufferError` naming ``field``."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:  # a ragged list
        raise _wrong_type(LayoutBufferError, field, value, f"must be an array of bytes ({e})") from None
    if arr.dtype.hasobject or arr.dtype.itemsize == 0:
        why = "must be an array of bytes (a NumPy array of a numeric dtype)"
        raise _wrong_type(LayoutBufferError, field, value, why)
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def _check_region(region: Any, size: int) -> tuple[int, int]:
    """``region``: two byte offsets ``lo < hi`` from the origin, within the ``size`` bytes after it."""
    if isinstance(region, (str, bytes)) or not isinstance(region, (tuple, list)) or len(region) != 2:
        raise bad_value(LayoutBufferError, "region", region, "must be (lo, hi): two byte offsets")
    lo = check_int(LayoutBufferError, "region[0]", region[0], lo=0)
    hi = check_int(LayoutBufferError, "region[1]", region[1], lo=0)
    if not lo < hi <= size:
        why = f"must have lo < hi <= {_fmt(size)} (the bytes of before from origin)"
        raise bad_value(LayoutBufferError, "region", (lo, hi), why)
    return lo, hi


def zero_diff(
    before: Any,
    afters: Mapping[str, Any],
    table: Any,
    block_ids: Any,
    origin: int = 0,
    region: tuple[int, int] | None = None,
    ax: Any = None,
) -> Any:
    """One strip per backend over a byte region: grey untouched, green cleared as the contract
    says, red written outside the contract, orange contract bytes left uncleared.

    ``before`` holds the table's buffer at byte ``origin`` (guard bytes may lie around it);
    ``afters`` maps a backend's name to its buffer after zeroing (as many bytes as ``before``, at most
    :data:`MAX_PLOT_STRIPS`); ``region`` is ``(lo, hi)`` from the origin (default: to the end of
    ``before``). Each is checked before anything is drawn (:class:`~kvlayout.LayoutBufferError`).
    """
    from ..reference import expected_zeroed, ranges_to_mask

    table = check_table(table)
    b0 = _buffer_bytes("before", before)
    origin = check_offset("origin", origin)
    if origin + table.total_bytes > b0.size:
        why = f"before holds {_fmt(b0.size)} B: too few for the table's {_fmt(table.total_bytes)} B at origin"
        raise bad_value(LayoutBufferError, "origin", origin, why)
    if not isinstance(afters, Mapping):
        why = "must map backend names to buffers after zeroing"
        raise _wrong_type(LayoutBufferError, "afters", afters, why)
    if not 1 <= len(afters) <= MAX_PLOT_STRIPS:
        why = f"must name 1 to {MAX_PLOT_STRIPS} buffers after zeroing (a strip each)"
        raise bad_value(LayoutBufferError, "len(afters)", len(afters), why)
    strips: list[tuple[str, np.ndarray]] = []
    for name, after in afters.items():
        if not isinstance(name, str):
            raise _wrong_type(LayoutBufferError, "afters key", name, "must be a string (the strip's label)")
        field = f"afters[{short(name)}]"
        a = _buffer_bytes(field, after)
        if a.size != b0.size:
            why = f"holds {_fmt(a.size)} B; before holds {_fmt(b0.size)} B (the same buffer, after zeroing)"
            raise bad_value(LayoutBufferError, f"{field}.nbytes", a.size, why)
        strips.append((name, a))
    lo, hi = (0, b0.size - origin) if region is None else _check_region(region, b0.size - origin)
    if hi <= lo:
        raise bad_value(LayoutBufferError, "region", (lo, hi), "an empty region (the table has 0 bytes)")
    import matplotlib.pyplot as plt

    exp = ranges_to_mask(expected_zeroed(table, block_ids), b0.size, origin)[origin + lo : origin + hi]
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 0.6 + 0.5 * len(strips)))
    else:
        fig = ax.figure
    bins = min(2000, hi - lo)
    img = np.zeros((len(strips), bins, 3))
    for k, (_, after_bytes) in enumerate(strips):
        a = after_bytes[origin + lo : origin + hi]
        changed = a != b0[origin + lo : origin + hi]
        state = np.zeros(changed.shape, np.int8)  # a byte per byte (int64 made the pool's 8x; issue 25)
        state[changed & exp] = 1
        state[changed & ~exp] = 2
        state[~changed & exp] = 3
        edges = np.linspace(0, state.size, bins + 1).astype(int)
        worst = np.maximum.reduceat(state, edges[:-1])  # a bin shows its worst byte
        palette = np.array([[0.85, 0.85, 0.85], [0.2, 0.7, 0.3], [1.0, 0.0, 0.0], [1.0, 0.6, 0.0]])
        img[k] = palette[worst]
    ax.imshow(img, aspect="auto", extent=(lo, hi, len(strips), 0), interpolation="nearest")
    ax.set_yticks([k + 0.5 for k in range(len(strips))], [name for name, _ in strips], fontsize=8)
    ax.set_xlabel("byte offset (green: cleared per contract, red: outside the contract, orange: missed)")
    fig.tight_layout()
    return fig
