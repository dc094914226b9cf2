"""Pictures of layouts (``notebook`` extra: matplotlib; the explorer also needs ipywidgets).

- :func:`byte_map`: the bytes of a block, one lane per (block, group shape). Overlaid groups of
  one shape share a lane ("x 11 groups like c4.*"); layers are coloured one by one when there
  are few and by kind (attention, compressed, indexer, sliding window, Mamba) when there are
  many, with a legend; alignment gaps are hatched; stride, page and span arrows, the block
  boundary and the end of the buffer are marked; insets show the gaps at byte scale.
- :func:`table_map`: what each table row clears. Red only where the verifier's invariants
  break (bytes of two blocks, past the buffer, in padding), with the first spill at byte scale.
- :func:`compare_maps` (two layouts, tp degrees, dtypes), :func:`bytes_per_step` (per-group
  against all-group zeroing), :func:`zero_diff`, :func:`describe_at` (what lies at a byte),
  :func:`attach_hover` and :class:`Explorer` (ipywidgets).

matplotlib and ipywidgets are imported inside the functions that need them: importing this
module is cheap, so the CLI validates ``--compare`` (:func:`parse_compare`) before loading them.
"""

from __future__ import annotations

import io
import os
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .errors import KVLayoutError, SpecError, spec_error
from .planner import Layout, Placement, plan_layout
from .presets import PRESETS, preset
from .ranges import merge_ranges
from .spec import (
    ALL_LAYOUTS,
    DTYPE_SIZES,
    FP8_DS_MLA,
    FullAttentionSpec,
    GroupSpec,
    KVCacheSpec,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
    layout_order,
)
from .table import Segment, SegmentTable
from .validate import read_json_file

#: Alignment gaps (hatched).
PAD_COLOR = "#bbbbbb"
#: The row a lane's group owns but does not fill (other groups do).
LANE_BG = "#f2f2f2"
#: Block boundaries and the end of the buffer. Red is kept for what is unsafe.
EDGE_COLOR = "#222222"
#: Bytes that break an invariant (two blocks, out of bounds, padding written).
UNSAFE_COLOR = "#ff0000"
#: Layer kinds of the legend: (colour, lighter shade for every other layer of a lane).
KIND_COLORS: Mapping[str, tuple[str, str]] = {
    "attention": ("#1f77b4", "#8fbce0"),
    "compressed": ("#ff7f0e", "#ffc285"),
    "indexer": ("#2ca02c", "#98d98e"),
    "sliding window": ("#9467bd", "#c9b3e0"),
    "mamba": ("#8c564b", "#d2a99e"),
}
#: One colour per layer when a map shows few layers: tab20 without its reds and greys.
LAYER_PALETTE = (
    "#1f77b4",
    "#aec7e8",
    "#ff7f0e",
    "#ffbb78",
    "#2ca02c",
    "#98df8a",
    "#9467bd",
    "#c5b0d5",
    "#8c564b",
    "#c49c94",
    "#e377c2",
    "#f7b6d2",
    "#bcbd22",
    "#dbdb8d",
    "#17becf",
    "#9edae5",
)
#: Most distinct layers a map colours one by one; beyond, it colours by kind.
MAX_LAYER_COLORS = 8
#: Lane height and the gap between blocks, in lane units; inches per lane unit.
LANE_H, BLOCK_GAP, LANE_IN = 0.8, 0.6, 0.27
#: Room above the lanes for the stride/page/span arrows (lane units).
HEADER = 3.0


def _fmt(n: int) -> str:
    return f"{n:,}"


def _count(k: int, what: str) -> str:
    return f"{_fmt(k)} {what}{'' if k == 1 else 's'}"


def _short(name: str) -> str:
    """``model.layers.3.self_attn`` -> ``layers.3.self_attn``."""
    return name[6:] if name.startswith("model.") else name


# --------------------------------------------------------------------------- layer kinds and lanes
def layer_kind(layer: LayerSpec) -> str:
    """The legend kind of a layer: mamba, indexer, sliding window, compressed or attention."""
    name = layer.name.lower()
    if isinstance(layer, MambaSpec):
        return "mamba"
    if "indexer" in name:
        return "indexer"
    if isinstance(layer, SlidingWindowSpec) or re.search(r"(^|[._/-])(swa|sliding)", name):
        return "sliding window"
    if isinstance(layer, MLASpec) and layer.ratio > 1:
        return "compressed"
    return "attention"


def group_pattern(names: Sequence[str]) -> str:
    """A name for several groups: their common prefix up to a separator, then ``*`` (``c4.*``)."""
    if len(names) == 1:
        return names[0]
    prefix = os.path.commonprefix(list(names))
    m = re.match(r"^(.*[._/:-])", prefix)
    return f"{m[1]}*" if m else f"{names[0]}..."


@dataclass(frozen=True)
class Box:
    """One layer part in a lane: ``span`` zeroed bytes at ``x``, padded to ``padded`` bytes."""

    x: int
    span: int
    padded: int
    placement: Placement
    part: str

    @property
    def gap(self) -> int:
        return self.padded - self.span


@dataclass(frozen=True)
class Lane:
    """Groups whose layers have the same shape, drawn once: its boxes are the first group's."""

    groups: tuple[str, ...]
    boxes: tuple[Box, ...]

    @property
    def label(self) -> str:
        if len(self.groups) == 1:
            return self.groups[0]
        return f"\u00d7 {len(self.groups)} groups like {group_pattern(self.groups)}"

    @property
    def short_label(self) -> str:
        return group_pattern(self.groups)

    @property
    def end(self) -> int:
        return max(b.x + b.padded for b in self.boxes)


class Geometry:
    """Block-row coordinates of a layout: packed rows, or a block's slot pages side by side."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.packed = layout.block_stride is not None
        pages = layout.slot_pages
        self.slot_x = [sum(pages[:j]) for j in range(len(pages))]
        self.regions = [sum(pages[:j]) * layout.num_blocks for j in range(len(pages))]
        self.split = [
            any(p.layer.split_kv for p in layout.placements if p.slot == j) for j in range(len(pages))
        ]
        self.width = int(layout.block_stride) if layout.block_stride is not None else sum(pages)
        # LHBNC: the head slots of a block lie num_blocks * N*C apart; pitch N*C per slot (else 0)
        self.head_pitch = [0] * len(pages)
        if layout.order == "LHBNC":
            for p in layout.placements:
                if p.layer.heads > 1:
                    self.head_pitch[p.slot] = pages[p.slot] // p.layer.heads

    def box_x(self, p: Placement, part: str, base: int) -> int:
        """Where a part starts in the row (LHBNC: head ``h`` at ``h * N*C`` of its slot page)."""
        if self.packed:
            return base
        if part.startswith("head"):
            return self.slot_x[p.slot] + int(part[4:]) * self.head_pitch[p.slot]
        return self.slot_x[p.slot] + (self.layout.slot_pages[p.slot] // 2 if part == "v" else 0)

    def to_buffer(self, block: int, x: int) -> int:
        """The buffer offset of byte ``x`` of ``block``'s row."""
        if self.packed:
            return block * self.width + x
        n = self.layout.num_blocks
        j = max(k for k, sx in enumerate(self.slot_x) if sx <= x) if x >= 0 else 0
        sp, within = self.layout.slot_pages[j], x - self.slot_x[j]
        if self.head_pitch[j]:
            h, r = divmod(within, self.head_pitch[j])
            return self.regions[j] + (h * n + block) * self.head_pitch[j] + r
        if self.split[j]:
            half = sp // 2
            if within < half:
                return self.regions[j] + block * half + within
            return self.regions[j] + half * n + block * half + within - half
        return self.regions[j] + block * sp + within

    def to_row(self, offset: int) -> tuple[int, int, int] | None:
        """``(block, x, slot)`` of a buffer offset (slot 0 for packed), ``None`` outside the buffer."""
        lay = self.layout
        n = lay.num_blocks
        if not 0 <= offset < lay.total_bytes or n == 0:
            return None
        if self.packed:
            b, x = divmod(offset, self.width)
            return b, x, 0
        for j, sp in enumerate(lay.slot_pages):
            rel = offset - self.regions[j]
            if 0 <= rel < sp * n:
                if self.head_pitch[j]:
                    pitch = self.head_pitch[j]
                    h, rem = divmod(rel, n * pitch)
                    b, r = divmod(rem, pitch)
                    return b, self.slot_x[j] + h * pitch + r, j
                if self.split[j]:
                    half = sp // 2
                    upper = rel >= half * n
                    b, r = divmod(rel - (half * n if upper else 0), half)
                    return b, self.slot_x[j] + (half if upper else 0) + r, j
                b, r = divmod(rel, sp)
                return b, self.slot_x[j] + r, j
        return None


def group_lanes(layout: Layout, collapse: bool = True) -> list[Lane]:
    """One lane per group, or with ``collapse`` one per distinct group shape (first-seen order)."""
    geo = Geometry(layout)
    shapes: dict[tuple[Any, ...], tuple[list[str], tuple[Box, ...]]] = {}
    for g in layout.spec.groups:
        boxes = tuple(
            Box(geo.box_x(p, part.name, part.base), part.span, part.padded, p, part.name)
            for p in layout.placements
            if p.group == g.name
            for part in p.parts
        )
        key: tuple[Any, ...] = tuple(
            (b.x, b.span, b.padded, b.part, layer_kind(b.placement.layer)) for b in boxes
        )
        if not collapse:
            key = (g.name, *key)
        shapes.setdefault(key, ([], boxes))[0].append(g.name)
    return [Lane(tuple(names), boxes) for names, boxes in shapes.values()]


def _color_mode(lanes: Sequence[Lane], color_by: str) -> str:
    if color_by in ("layer", "kind"):
        return color_by
    if color_by != "auto":
        raise spec_error("color_by", color_by, "valid: auto, layer, kind")
    layers = {b.placement.layer.name for lane in lanes for b in lane.boxes}
    return "layer" if len(layers) <= MAX_LAYER_COLORS else "kind"


def _lane_colors(lanes: Sequence[Lane], mode: str) -> list[dict[str, str]]:
    """Per lane: layer name -> colour. Kind mode alternates two shades along a lane."""
    out: list[dict[str, str]] = []
    k = 0
    for lane in lanes:
        colors: dict[str, str] = {}
        for b in lane.boxes:
            name = b.placement.layer.name
            if name in colors:
                continue
            if mode == "layer":
                colors[name] = LAYER_PALETTE[k % len(LAYER_PALETTE)]
                k += 1
            else:
                colors[name] = KIND_COLORS[layer_kind(b.placement.layer)][len(colors) % 2]
        out.append(colors)
    return out


def layer_colors(layout: Layout, color_by: str = "auto") -> dict[str, str]:
    """The colour :func:`byte_map` gives every layer (a collapsed group takes its lane's colours)."""
    lanes = group_lanes(layout)
    per_lane = _lane_colors(lanes, _color_mode(lanes, color_by))
    out: dict[str, str] = {}
    for lane, colors in zip(lanes, per_lane):
        firsts = list(dict.fromkeys(b.placement.layer.name for b in lane.boxes))
        for g in lane.groups:
            names = [p.layer.name for p in layout.placements if p.group == g]
            for mine, first in zip(names, firsts):
                out[mine] = colors[first]
    return out


def _as_layout(source: KVCacheSpec | Layout) -> Layout:
    return source if isinstance(source, Layout) else plan_layout(source)


def _shown_blocks(
    n: int, blocks: Sequence[int] | None, per_block: int, max_lanes: int
) -> tuple[list[int], bool]:
    """Blocks to draw: the asked ones, else first/second/middle/last, within ``max_lanes`` lanes."""
    limit = max(1, max_lanes // max(1, per_block))
    if n == 0:
        return [0], False
    if blocks is not None:
        asked = sorted({int(b) for b in blocks if 0 <= int(b) < n}) or [0]
        return asked[:limit], len(asked) > limit
    for pick in ({0, min(1, n - 1), n // 2, n - 1}, {0, n - 1}, {0}):
        if len(pick) <= limit:
            return sorted(pick), len(pick) < n
    return [0], n > 1


# --------------------------------------------------------------------------- the byte map
@dataclass
class MapInfo:
    """What a drawn map shows, for :func:`attach_hover` and tests: lanes by their y extent."""

    layout: Layout
    geometry: Geometry
    lanes: list[tuple[float, int, Lane]]  # (y of the lane's top, block, lane)
    insets: list[str]


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
    import matplotlib.pyplot as plt

    layout = _as_layout(spec_or_layout)
    spec, geo = layout.spec, Geometry(layout)
    n = spec.num_blocks
    lanes = group_lanes(layout, collapse)
    mode = _color_mode(lanes, color_by)
    colors = _lane_colors(lanes, mode)
    shown, sampled = _shown_blocks(n, blocks, len(lanes), max_lanes)
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


def _comma_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: _fmt(int(v)))


# --------------------------------------------------------------------------- what lies at a byte
def _meeting(s: Segment, lo: int, hi: int, n: int) -> range:
    """Block ids ``b`` in ``[0, n)`` whose ``[base + b*stride, + span)`` meets ``[lo, hi)``."""
    if s.span <= 0 or n <= 0 or hi <= lo:
        return range(0)
    if s.stride == 0:
        return range(n) if s.base < hi and lo < s.base + s.span else range(0)
    if s.stride > 0:
        b_lo, b_hi = (lo - s.base - s.span) // s.stride + 1, (hi - 1 - s.base) // s.stride
    else:
        t = -s.stride
        b_lo, b_hi = -((hi - 1 - s.base) // t), -((lo - s.base - s.span) // t) - 1
    return range(max(b_lo, 0), min(b_hi, n - 1) + 1)


def _covering(s: Segment, offset: int, n: int) -> range:
    """Block ids ``b`` in ``[0, n)`` with ``offset`` in ``[base + b*stride, + span)``."""
    return _meeting(s, offset, offset + 1, n)


def _table_of(source: SegmentTable | Layout | KVCacheSpec) -> tuple[SegmentTable, Layout | None]:
    if isinstance(source, SegmentTable):
        return source, None
    layout = _as_layout(source)
    return layout.table(), layout


def describe_at(source: SegmentTable | Layout | KVCacheSpec, byte_offset: int, *, limit: int = 8) -> str:
    """What lies at a byte of the buffer: block, layer, group, part, offsets and sizes, one per line.

    For a layout (or spec): the block and its row offset, every group's layer part there
    (overlaid groups of one shape on one line), alignment gaps and Mamba state. For a table:
    the rows that clear the byte and for which blocks; two blocks or a byte past the buffer
    are flagged UNSAFE. The explorer calls this for the byte under its cursor.
    """
    table, layout = _table_of(source)
    off, n, total = int(byte_offset), table.num_blocks, table.total_bytes
    lines = [f"byte {_fmt(off)} of a {_fmt(total)} B buffer"]
    geo = Geometry(layout) if layout is not None else None
    where = geo.to_row(off) if geo is not None else None
    if not 0 <= off < total:
        lines[0] += ": outside the buffer"
    elif geo is not None and where is not None:
        b, x, slot = where
        if geo.packed:
            lines[0] += f": block {b}, byte {_fmt(x)} of its {_fmt(geo.width)} B row"
        else:
            sx = geo.slot_x[slot]
            lines[0] += (
                f": slot {slot}, block {b}, byte {_fmt(x - sx)} of the block's "
                f"{_fmt(geo.layout.slot_pages[slot])} B slot page"
            )
    items: list[tuple[str, Segment]] = [("zeroed", s) for s in table.segments]
    items += [("gap", s) for s in table.padding]
    if layout is not None:
        items += [
            ("state", Segment(part.base, part.stride, part.span, p.group, p.layer.name, part.name))
            for p in layout.placements
            if not p.layer.zeroed
            for part in p.parts
        ]
    owner = {p.layer.name: p.group for p in layout.placements} if layout is not None else {}
    kinds = {p.layer.name: layer_kind(p.layer) for p in layout.placements} if layout is not None else {}
    found: dict[tuple[Any, ...], list[tuple[str, str]]] = {}
    blocks_seen: set[int] = set()
    for i, (what, s) in enumerate(items):
        for b in _covering(s, off, n)[:64]:
            within = off - (s.base + b * s.stride)
            group = s.group or owner.get(s.layer, "")
            kind = kinds.get(s.layer, "")
            key = (what, b, s.part, s.virtual_index, within, s.span, kind, -1 if layout is not None else i)
            found.setdefault(key, []).append((group, s.layer))
            if what == "zeroed":
                blocks_seen.add(b)
    if not found:
        lines.append(
            "  no layer part: bytes of the row that no group uses"
            if layout is not None and 0 <= off < total
            else "  no row clears it"
        )
    for k, ((what, b, part, vi, within, span, kind, row), who) in enumerate(found.items()):
        if k == limit:
            lines.append(f"  ... and {len(found) - limit} more")
            break
        groups = [g for g, _ in who]
        gtext = (
            f"group {groups[0]}"
            if len(who) == 1
            else f"{len(who)} groups like {group_pattern(sorted(set(groups)))}"
        )
        layer = _short(who[0][1]) + (f" (and {len(who) - 1} more)" if len(who) > 1 else "")
        layer += f" [{kind}]" if kind else ""
        pv = part + (f"[{vi}]" if vi else "")
        desc = {
            "zeroed": f"byte {_fmt(within)} of its {_fmt(span)} B span, zeroed with block {b}",
            "gap": f"byte {_fmt(within)} of a {_fmt(span)} B alignment gap (block {b}): never zeroed",
            "state": f"byte {_fmt(within)} of its {_fmt(span)} B state (block {b}): never zeroed",
        }[what]
        rows = f"row {row} " if row >= 0 and what == "zeroed" else ""
        lines.append(
            f"  {rows}{gtext}, {layer} {pv}: {desc}" if groups[0] else f"  {rows}{layer} {pv}: {desc}"
        )
    if len(blocks_seen) > 1:
        ids = sorted(blocks_seen)
        both = f"{ids[0]} and {ids[1]} both" if len(ids) == 2 else f"{', '.join(map(str, ids[:6]))} all"
        lines.append(f"  UNSAFE: blocks {both} clear this byte (invariant 3)")
    if blocks_seen and not 0 <= off < total:
        lines.append("  UNSAFE: a row clears this byte outside the buffer (invariant 2)")
    if any(k[0] == "gap" for k in found) and blocks_seen:
        lines.append("  UNSAFE: a row clears alignment padding (invariant 4)")
    return "\n".join(lines)


def attach_hover(fig: Any) -> int:
    """Show :func:`describe_at` of the byte under the mouse (interactive backends: ``%matplotlib widget``).

    Returns the callback id. Works on figures from :func:`byte_map`; the annotation is also
    updated when a ``motion_notify_event`` is sent by hand (how the tests drive it).
    """
    axes = [a for a in fig.axes if isinstance(getattr(a, "kvlayout", None), MapInfo)]
    if not axes:
        raise ValueError("attach_hover needs a figure drawn by byte_map")
    ax = axes[0]
    info: MapInfo = ax.kvlayout
    note = ax.annotate(
        "",
        xy=(0, 0),
        xytext=(12, -12),
        textcoords="offset points",
        fontsize=7,
        va="top",
        bbox={"boxstyle": "round", "fc": "#ffffe8", "ec": "#888888"},
        zorder=10,
        visible=False,
    )

    def on_move(event: Any) -> None:
        if event.inaxes is not ax or event.xdata is None:
            note.set_visible(False)
            return
        text = hover_text(info, event.xdata, event.ydata)
        note.set_visible(text is not None)
        if text is not None:
            note.xy = (event.xdata, event.ydata)
            note.set_text(text)
        fig.canvas.draw_idle()

    ax.kvlayout_note = note
    return int(fig.canvas.mpl_connect("motion_notify_event", on_move))


def hover_text(info: MapInfo, x: float, y: float) -> str | None:
    """:func:`describe_at` for a point of a drawn byte map (``None`` off the lanes or the row)."""
    for top, block, _ in info.lanes:
        if top <= y <= top + LANE_H and 0 <= x < info.geometry.width:
            return describe_at(info.layout, info.geometry.to_buffer(block, int(x)), limit=4)
    return None


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
        from .verify import verify

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


def table_view(table: Any) -> TableView:
    """The table with a verdict per row (``print`` it, or show it in a notebook)."""
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
    table: SegmentTable,
    blocks: Sequence[int] | None = None,
    ax: Any = None,
    *,
    inset: bool | None = None,
    max_rows: int = 24,
) -> Any:
    """Draw what each row clears per block, in block-0 coordinates of the row (``base + offset``).

    Red: bytes that another block also clears, alignment padding, or (cross-hatched) bytes past
    the end of the buffer, so red appears only on a table the verifier rejects. Tables of
    more than ``max_rows`` rows are drawn coalesced (same bytes). For an unsafe table an
    inset (default: when ``ax`` is not given) draws the first spill at byte scale.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    from .verify import verify

    report = verify(table)
    draw = table if len(table) <= max_rows else table.coalesced()
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
def zero_diff(
    before: Any,
    afters: dict[str, Any],
    table: Any,
    block_ids: Any,
    origin: int = 0,
    region: tuple[int, int] | None = None,
    ax: Any = None,
) -> Any:
    """One strip per backend over a byte region: grey untouched, green cleared as the contract
    says, red written outside the contract, orange contract bytes left uncleared."""
    import matplotlib.pyplot as plt

    from .reference import expected_zeroed, ranges_to_mask

    b0 = np.asarray(before).reshape(-1).view(np.uint8)
    lo, hi = region if region is not None else (0, b0.size - origin)
    exp = ranges_to_mask(expected_zeroed(table, block_ids), b0.size, origin)[origin + lo : origin + hi]
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 0.6 + 0.5 * len(afters)))
    else:
        fig = ax.figure
    bins = min(2000, hi - lo)
    img = np.zeros((len(afters), bins, 3))
    for k, (_, after) in enumerate(afters.items()):
        a = np.asarray(after).reshape(-1).view(np.uint8)[origin + lo : origin + hi]
        changed = a != b0[origin + lo : origin + hi]
        state = np.full(changed.shape, 0)
        state[changed & exp] = 1
        state[changed & ~exp] = 2
        state[~changed & exp] = 3
        edges = np.linspace(0, state.size, bins + 1).astype(int)
        worst = np.maximum.reduceat(state, edges[:-1])  # a bin shows its worst byte
        palette = np.array([[0.85, 0.85, 0.85], [0.2, 0.7, 0.3], [1.0, 0.0, 0.0], [1.0, 0.6, 0.0]])
        img[k] = palette[worst]
    ax.imshow(img, aspect="auto", extent=(lo, hi, len(afters), 0), interpolation="nearest")
    ax.set_yticks([k + 0.5 for k in range(len(afters))], list(afters), fontsize=8)
    ax.set_xlabel("byte offset (green: cleared per contract, red: outside the contract, orange: missed)")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- variants: layout, tp, dtype
#: Keys of ``kvlayout plot --compare KEY=VALUE[,KEY=VALUE]``.
COMPARE_KEYS = ("layout", "tp", "dtype", "num_blocks", "preset", "spec")
#: Cache dtypes a variant may set (``fp8_ds_mla`` only on ``mla`` layers).
VARIANT_DTYPES = (*DTYPE_SIZES, FP8_DS_MLA)


def _bad(key: str, value: object, why: str) -> SpecError:
    return spec_error(f"--compare {key}", value, why)


def parse_compare(text: str) -> list[tuple[str, str]]:
    """``"layout=layer_major,tp=2"`` -> ``[("layout", "layer_major"), ("tp", "2")]``, every value checked.

    Raises :class:`~kvlayout.SpecError` (one line) before anything is planned or drawn.
    """
    out: list[tuple[str, str]] = []
    if len(text) > 4096:
        raise _bad("", text, "longer than 4096 characters")
    for tok in (t.strip() for t in text.split(",")):
        m = re.fullmatch(r"([a-z_]+)=(.+)", tok)
        if not m or m[1] not in COMPARE_KEYS:
            raise _bad(
                "item",
                tok,
                f"must be KEY=VALUE with KEY one of {', '.join(COMPARE_KEYS)} "
                "(e.g. layout=layer_major, tp=2, dtype=bfloat16)",
            )
        key, value = m[1], m[2].strip()
        if any(k == key for k, _ in out):
            raise _bad(key, value, "given twice")
        if key == "layout" and value not in ALL_LAYOUTS:
            raise _bad(key, value, f"valid: {', '.join(ALL_LAYOUTS)}")
        if key in ("tp", "num_blocks") and not re.fullmatch(r"[0-9]{1,10}", value):
            raise _bad(key, value, "must be a decimal integer")
        if key == "tp" and not 1 <= int(value) <= 4096:
            raise _bad(key, value, "must lie in [1, 4096]")
        if key == "dtype" and value not in VARIANT_DTYPES:
            raise _bad(key, value, f"valid: {', '.join(VARIANT_DTYPES)}")
        if key == "preset" and value not in PRESETS:
            raise _bad(key, value, f"valid: {', '.join(PRESETS)}")
        out.append((key, value))
    if any(k in ("preset", "spec") for k, _ in out) and sum(k in ("preset", "spec") for k, _ in out) > 1:
        raise _bad("preset", text, "give preset= or spec=, not both")
    return out


def with_layout(spec: KVCacheSpec, layout: str) -> KVCacheSpec:
    """The same layers in another layout (any of GEOMETRY.md section 6's names; ``kv_split`` halves
    exist under ``layer_major``/``LBHNC`` only, so every other layout keeps K and V together)."""
    if layout not in ALL_LAYOUTS:
        raise spec_error("layout", layout, f"valid layouts: {', '.join(ALL_LAYOUTS)}")
    groups = spec.groups
    if layout_order(layout) != "LBHNC":
        groups = tuple(
            GroupSpec(
                g.name,
                tuple(replace(x, kv_split=None) if isinstance(x, FullAttentionSpec) else x for x in g.layers),
                g.kernel_block_size,
            )
            for g in spec.groups
        )
    return KVCacheSpec(num_blocks=spec.num_blocks, layout=layout, groups=groups, version=spec.version)


def with_dtype(spec: KVCacheSpec, dtype: str) -> KVCacheSpec:
    """Every attention and MLA layer stored as ``dtype`` (MLA: its cache dtype; Mamba state unchanged)."""
    if dtype not in VARIANT_DTYPES:
        raise spec_error("dtype", dtype, f"valid: {', '.join(VARIANT_DTYPES)}")
    groups = []
    for g in spec.groups:
        layers: list[LayerSpec] = []
        for x in g.layers:
            if isinstance(x, FullAttentionSpec):
                if dtype == FP8_DS_MLA:
                    raise spec_error(f"{x.where}.dtype", dtype, "fp8_ds_mla applies to mla layers only")
                x = replace(x, dtype=dtype)
            elif isinstance(x, MLASpec):
                x = (
                    replace(x, cache_dtype=dtype, token_bytes=None)
                    if dtype == FP8_DS_MLA or x.cache_dtype
                    else replace(x, dtype=dtype, token_bytes=None)
                )
            layers.append(x)
        groups.append(GroupSpec(g.name, tuple(layers), g.kernel_block_size))
    return KVCacheSpec(
        num_blocks=spec.num_blocks, layout=spec.layout, groups=tuple(groups), version=spec.version
    )


def variant(spec: KVCacheSpec, changes: Sequence[tuple[str, str]] | Mapping[str, Any]) -> KVCacheSpec:
    """``spec`` changed by ``changes`` (the keys of :data:`COMPARE_KEYS`): preset/spec replace it,
    then layout, dtype, tp (:func:`~kvlayout.split_heads`) and num_blocks apply in that order."""
    from .sharding import split_heads

    ch = dict(changes.items() if isinstance(changes, Mapping) else changes)
    unknown = sorted(set(ch) - set(COMPARE_KEYS))
    if unknown:
        raise _bad(unknown[0], ch[unknown[0]], f"valid keys: {', '.join(COMPARE_KEYS)}")
    if "preset" in ch:
        spec = preset(str(ch["preset"]))
    if "spec" in ch:
        spec = KVCacheSpec.from_dict(read_json_file(SpecError, "--compare spec", str(ch["spec"])))
    if "layout" in ch:
        spec = with_layout(spec, str(ch["layout"]))
    if "dtype" in ch:
        spec = with_dtype(spec, str(ch["dtype"]))
    if "tp" in ch:
        spec = split_heads(spec, int(ch["tp"]), axis="tp")
    if "num_blocks" in ch:
        spec = spec.with_num_blocks(int(ch["num_blocks"]))
    return spec


def describe_changes(changes: Sequence[tuple[str, str]] | Mapping[str, Any]) -> str:
    """``layout=layer_major, tp=2``."""
    items = changes.items() if isinstance(changes, Mapping) else changes
    return ", ".join(f"{k}={os.path.basename(str(v)) if k == 'spec' else v}" for k, v in items)


# --------------------------------------------------------------------------- comparisons
def _summary(layout: Layout) -> str:
    from .verify import verify

    table = layout.table()
    geo = Geometry(layout)
    row = (
        f"stride {_fmt(geo.width)} B"
        if geo.packed
        else f"{len(geo.slot_x)} slots, {_fmt(geo.width)} B per block"
    )
    safe = "SAFE" if verify(table).ok else "UNSAFE"
    return (
        f"{layout.spec.layout}, {row}, {_fmt(layout.total_bytes)} B buffer, {len(table)} rows, "
        f"{_fmt(table.bytes_per_block)} B zeroed per block: {safe}"
    )


def _ratio(a: int, b: int) -> str:
    return f"{b / a:.2f}x" if a else "-"


def compare_maps(
    a: KVCacheSpec | Layout,
    b: KVCacheSpec | Layout,
    labels: Sequence[str] = ("A", "B"),
    blocks: Sequence[int] | None = None,
    *,
    max_lanes: int = 12,
) -> Any:
    """Two byte maps one above the other on one byte scale (same model, two layouts/tp/dtypes).

    Each panel's title gives its stride, buffer, rows, bytes per block and verdict; the
    figure's title the ratios of B to A.
    """
    import matplotlib.pyplot as plt

    la, lb = _as_layout(a), _as_layout(b)
    ga, gb = Geometry(la), Geometry(lb)
    xmax = max(ga.width, gb.width) * 1.075
    heights = []
    for lay in (la, lb):
        lanes = group_lanes(lay)
        shown, _ = _shown_blocks(
            lay.num_blocks, blocks or sorted({0, max(0, lay.num_blocks - 1)}), len(lanes), max_lanes
        )
        heights.append(1.3 + LANE_IN * (len(shown) * len(lanes) + BLOCK_GAP * (len(shown) - 1) + HEADER))
    fig = plt.figure(figsize=(13, sum(heights) + 0.8), layout="constrained")
    axes = fig.subplots(2, 1, height_ratios=heights)
    for ax, lay, label in zip(axes, (la, lb), labels):
        ends = blocks if blocks is not None else sorted({0, max(0, lay.num_blocks - 1)})
        byte_map(
            lay, ends, ax, insets=False, xmax=xmax, max_lanes=max_lanes, title=f"{label}: {_summary(lay)}"
        )
    ta, tb = la.table(), lb.table()
    fig.suptitle(
        f"{labels[1]} against {labels[0]}: buffer {_ratio(la.total_bytes, lb.total_bytes)}, "
        f"block row {_ratio(ga.width, gb.width)}, bytes zeroed per block "
        f"{_ratio(ta.bytes_per_block, tb.bytes_per_block)}, rows {len(ta)} \u2192 {len(tb)}",
        fontsize=10,
    )
    return fig


# --------------------------------------------------------------------------- bytes written per step
def _union_bytes(rows: Sequence[Segment], ids: Sequence[int]) -> int:
    if not rows or not len(ids):
        return 0
    idx = np.asarray(sorted(set(int(i) for i in ids)), np.int64)
    bases = np.array([s.base for s in rows], np.int64)[:, None]
    strides = np.array([s.stride for s in rows], np.int64)[:, None]
    spans = np.array([s.span for s in rows], np.int64)[:, None]
    starts = (bases + idx[None, :] * strides).ravel()
    merged = merge_ranges(starts, starts + np.repeat(spans.ravel(), idx.size))
    return int((merged[:, 1] - merged[:, 0]).sum())


def _in_group(s: Segment, group: str) -> bool:
    return group in s.group.split("+")


def step_bytes(table: SegmentTable, allocations: Mapping[str, Sequence[int]]) -> tuple[int, int]:
    """Bytes one step writes: ``(per_group, all_groups)``.

    ``allocations`` maps a group to the block ids newly given to it this step. Per-group
    zeroing (GEOMETRY.md section 7) clears, for each group, the union of its own rows over its
    ids; all-group zeroing (today) clears every row over all the ids. Computed from the rows'
    ``group`` provenance (rows merged across groups count for each of their groups).
    """
    per = sum(
        _union_bytes([s for s in table.segments if _in_group(s, g)], ids) for g, ids in allocations.items()
    )
    every = sorted({int(i) for ids in allocations.values() for i in ids})
    return per, _union_bytes(table.segments, every)


def _table_classes(table: SegmentTable, layout: Layout | None) -> list[tuple[str, list[str]]]:
    """``(label, groups)`` of groups with the same footprint, for the chart's rows."""
    if layout is not None:
        return [(lane.label.replace("\u00d7 ", ""), list(lane.groups)) for lane in group_lanes(layout)]
    sig: dict[tuple[Any, ...], list[str]] = {}
    names = list(dict.fromkeys(g for s in table.segments for g in s.group.split("+")))
    for g in names:
        key = tuple(sorted((s.base, s.stride, s.span) for s in table.segments if _in_group(s, g)))
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
    import matplotlib.pyplot as plt

    table, layout = _table_of(source)
    classes = _table_classes(table, layout)
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


# --------------------------------------------------------------------------- interactive explorer
def _models() -> Callable[..., KVCacheSpec] | None:
    """``kvlayout.models.spec_from_config`` where that module exists."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("kvlayout.models") is None:
        return None
    fn = getattr(importlib.import_module("kvlayout.models"), "spec_from_config", None)
    return fn if callable(fn) else None


class Explorer:
    """An ipywidgets explorer: pick a preset, spec file or model config, layout, tp and dtype.

    The table, the proof and the byte map update on every change; the block and byte
    controls read :func:`describe_at` of the byte under the cursor (drawn as a line on the
    map). Every widget is an attribute, so a notebook can set values and read the results
    (``image.value``, ``proof.value``, ``info.value``, ``status.value``). Display the
    explorer itself, or ``explorer.widget``.
    """

    def __init__(self, source: str = "dsv4-test", path: str = "") -> None:
        import ipywidgets as w

        self._from_config = _models()
        sources = [*PRESETS, "spec file", *(["model config"] if self._from_config else [])]
        self.source = w.Dropdown(options=sources, value=source, description="source")
        self.path = w.Text(
            value=path,
            description="file",
            placeholder="spec JSON (or model config JSON)",
            continuous_update=False,
        )
        self.layout = w.Dropdown(options=["as spec", *ALL_LAYOUTS], value="as spec", description="layout")
        self.tp = w.Dropdown(options=[1, 2, 4, 8], value=1, description="tp")
        self.dtype = w.Dropdown(options=["as spec", *VARIANT_DTYPES], value="as spec", description="dtype")
        self.num_blocks = w.BoundedIntText(value=100, min=0, max=2**31 - 1, description="blocks")
        self.block = w.BoundedIntText(value=0, min=0, max=99, description="block")
        self.offset = w.IntSlider(
            value=0,
            min=0,
            max=1,
            description="byte in row",
            continuous_update=False,
            layout=w.Layout(width="70%"),
        )
        self.image = w.Image(format="png")
        self.proof, self.table, self.info, self.status = w.HTML(), w.HTML(), w.HTML(), w.HTML()
        self.spec: KVCacheSpec | None = None
        self.layout_obj: Layout | None = None
        self._fig: Any = None
        self._cursor: Any = None
        self._busy = False
        tabs = w.Tab(children=[self.proof, self.table])
        tabs.titles = ("proof", "segment table")
        self.widget = w.VBox(
            [
                w.HBox([self.source, self.path]),
                w.HBox([self.layout, self.tp, self.dtype, self.num_blocks]),
                self.status,
                self.image,
                w.HBox([self.block, self.offset]),
                self.info,
                tabs,
            ]
        )
        for c in (self.source, self.path):
            c.observe(lambda _: self._rebuild(reset_blocks=True), names="value")
        for c in (self.layout, self.tp, self.dtype, self.num_blocks):
            c.observe(lambda _: self._rebuild(reset_blocks=False), names="value")
        for c in (self.block, self.offset):
            c.observe(lambda _: self._point(), names="value")
        self._rebuild(reset_blocks=True)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _base_spec(self) -> KVCacheSpec:
        """The chosen preset or file; a model config is read at the chosen tp."""
        src = self.source.value
        if src in PRESETS:
            return preset(src)
        if not self.path.value:
            raise SpecError(
                f"source {src!r}: type the path of the JSON file in 'file'", field="path", value=""
            )
        data = read_json_file(SpecError, "file", self.path.value)
        if src == "model config" and self._from_config is not None:
            return self._from_config(data, tp=self.tp.value)
        return KVCacheSpec.from_dict(data)

    def current_spec(self, *, reset_blocks: bool) -> KVCacheSpec:
        """The spec the controls describe."""
        spec = self._base_spec()
        changes: list[tuple[str, Any]] = []
        if self.layout.value != "as spec":
            changes.append(("layout", self.layout.value))
        if self.dtype.value != "as spec":
            changes.append(("dtype", self.dtype.value))
        if self.tp.value != 1 and self.source.value != "model config":  # a config is read per tp rank
            changes.append(("tp", self.tp.value))
        if not reset_blocks:
            changes.append(("num_blocks", self.num_blocks.value))
        return variant(spec, changes)

    def _rebuild(self, *, reset_blocks: bool) -> None:
        if self._busy:
            return
        from .verify import verify

        self._busy = True
        try:
            spec = self.current_spec(reset_blocks=reset_blocks)
            layout = plan_layout(spec)
            table = layout.table()
            report = verify(table)
        except (KVLayoutError, OSError) as e:
            self.status.value = f"<span style='color:red'>{_html(str(e))}</span>"
            self._busy = False
            return
        try:
            self.spec, self.layout_obj = spec, layout
            self.num_blocks.value = spec.num_blocks
            self.block.max = max(0, spec.num_blocks - 1)
            self.block.value = min(self.block.value, self.block.max)
            geo = Geometry(layout)
            self.offset.max = max(1, geo.width - 1)
            self.offset.value = min(self.offset.value, self.offset.max)
            color = "green" if report.ok else "red"
            self.proof.value = f"<pre style='color:{color}'>{_html(report.format())}</pre>"
            self.table.value = (
                f"<div style='max-height:320px;overflow:auto'>{table_view(table)._repr_html_()}</div>"
            )
            self.status.value = (
                f"{_html(spec.layout)}: {_count(len(spec.groups), 'group')}, "
                f"{_count(len(table), 'row')}, {_fmt(layout.total_bytes)} B buffer"
            )
            import matplotlib.pyplot as plt

            if self._fig is not None:
                plt.close(self._fig)
            self._fig = byte_map(layout)
            self._cursor = None
        finally:
            self._busy = False
        self._point()

    def _point(self) -> None:
        """Describe the byte under the cursor and draw the cursor on the map."""
        if self._busy or self.layout_obj is None:
            return
        geo = Geometry(self.layout_obj)
        b, x = int(self.block.value), int(self.offset.value)
        offset = geo.to_buffer(b, x)
        self.info.value = f"<pre>{_html(describe_at(self.layout_obj, offset))}</pre>"
        ax = self._fig.axes[0]
        if self._cursor is None:
            self._cursor = ax.axvline(x, color=EDGE_COLOR, lw=1.2, ls="-.", zorder=8)
        self._cursor.set_xdata([x, x])
        buf = io.BytesIO()
        self._fig.savefig(buf, format="png", dpi=72)
        self.image.value = buf.getvalue()

    def describe(self) -> str:
        """The text of :attr:`info` without HTML."""
        return (
            describe_at(
                self.layout_obj, Geometry(self.layout_obj).to_buffer(self.block.value, self.offset.value)
            )
            if self.layout_obj is not None
            else ""
        )


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def explorer(source: str = "dsv4-test", path: str = "") -> Explorer:
    """An :class:`Explorer` (needs ipywidgets)."""
    return Explorer(source, path)


__all__ = [
    "Box",
    "Explorer",
    "Geometry",
    "KIND_COLORS",
    "Lane",
    "MapInfo",
    "TableView",
    "attach_hover",
    "byte_map",
    "bytes_per_step",
    "compare_maps",
    "describe_at",
    "describe_changes",
    "explorer",
    "group_lanes",
    "group_pattern",
    "hover_text",
    "layer_colors",
    "layer_kind",
    "parse_compare",
    "step_bytes",
    "table_map",
    "table_view",
    "variant",
    "with_dtype",
    "with_layout",
    "zero_diff",
]
