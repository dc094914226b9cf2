"""What every picture shares: colours, lanes of equal shape, block-row geometry, number formats.

No matplotlib here: the drawing modules import it inside their functions.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BlockIdError, KVLayoutError, LayoutBufferError, SpecError, bad_value, spec_error
from ..planner import Layout, Placement, plan_layout
from ..spec import (
    KVCacheSpec,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
)
from ..table import Segment, SegmentTable
from ..validate import block_ids, check_int

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
#: Most table rows a table map draws (:func:`table_map`, ``kvlayout plot``): a figure of more cannot be
#: read, and drawing it took minutes.
MAX_PLOT_ROWS = 2048
#: Most layers of a spec a byte map draws (:func:`byte_map`, :func:`compare_maps`, the explorer,
#: ``kvlayout plot --kind map``): 8,000 layers took 23 s and 368 MB.
MAX_PLOT_LAYERS = 1024
#: Most cache groups a byte map draws (``kvlayout plot`` draws at most this many, any kind).
MAX_PLOT_GROUPS = 64
#: Most lanes a byte map's ``max_lanes`` may ask for (:func:`byte_map`, :func:`compare_maps`): 400 lanes of
#: llama-8b took 22 s and 2,000 took 155 s (pass 35); 128 one-box lanes draw in 0.3 s (and save in 1 s),
#: and :data:`MAX_PLOT_BOXES` bounds lanes of many boxes (128 lanes of llama-8b draw 64 of them, 2.4 s).
MAX_PLOT_LANES = 128
#: Most layer boxes a byte map draws (lanes x boxes per lane; fewer blocks are shown past it, at least
#: one): a box costs about 0.6 ms (16 lanes of a 1,024-layer group took 9 s; 64 would take 35 s).
MAX_PLOT_BOXES = 4096
#: Most block ids a drawing call takes in one list, tuple or array (a ``range`` whose ends lie in the pool
#: is checked by its ends, never listed): a plot draws a few dozen blocks.
MAX_PLOT_IDS = 1 << 20
#: Most strips (backends) :func:`zero_diff` draws.
MAX_PLOT_STRIPS = 64
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


def _by_group(layout: Layout) -> dict[str, list[Placement]]:
    """Each group's placements, in one pass: a scan of every placement per group made a step chart of
    20,000 one-layer groups take 24 s (pass 34)."""
    out: dict[str, list[Placement]] = {}
    for p in layout.placements:
        out.setdefault(p.group, []).append(p)
    return out


def group_lanes(layout: Layout, collapse: bool = True) -> list[Lane]:
    """One lane per group, or with ``collapse`` one per distinct group shape (first-seen order)."""
    geo = Geometry(layout)
    placed = _by_group(layout)
    shapes: dict[tuple[Any, ...], tuple[list[str], tuple[Box, ...]]] = {}
    for g in layout.spec.groups:
        boxes = tuple(
            Box(geo.box_x(p, part.name, part.base), part.span, part.padded, p, part.name)
            for p in placed.get(g.name, ())
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
    placed = _by_group(layout)
    for lane, colors in zip(lanes, per_lane):
        firsts = list(dict.fromkeys(b.placement.layer.name for b in lane.boxes))
        for g in lane.groups:
            names = [p.layer.name for p in placed.get(g, ())]
            for mine, first in zip(names, firsts):
                out[mine] = colors[first]
    return out


def check_drawable(spec: KVCacheSpec) -> None:
    """Refuse, before it is planned or matplotlib is imported, a spec whose byte map is too large to draw
    in seconds or to read: more than :data:`MAX_PLOT_LAYERS` layers or :data:`MAX_PLOT_GROUPS` groups."""
    for what, n, limit in (
        ("layers", len(spec.layers), MAX_PLOT_LAYERS),
        ("groups", len(spec.groups), MAX_PLOT_GROUPS),
    ):
        if n > limit:
            raise spec_error(what, n, f"a byte map draws at most {limit} {what}")


def _wrong_type(cls: type[KVLayoutError], field: str, value: Any, why: str) -> KVLayoutError:
    """``field type = str: why``: an argument of the wrong kind, named by its type."""
    kind = type(value).__name__
    shown = kind if kind.isidentifier() else repr(kind)  # a type's name may hold anything
    return bad_value(cls, f"{field} type", kind, why, shown=shown)


def _hint(value: Any) -> str:
    if isinstance(value, str):
        return " (a preset by name: kvlayout.preset(NAME); a JSON file: KVCacheSpec.from_json)"
    return ""


def _as_layout(source: Any, field: str = "source", *, drawn: bool = False) -> Layout:
    """The layout of a spec (planned) or a layout; ``drawn``: its size is checked first
    (:func:`check_drawable`). Anything else is a :class:`~kvlayout.SpecError` naming its type."""
    if isinstance(source, Layout):
        if drawn:
            check_drawable(source.spec)
        return source
    if isinstance(source, KVCacheSpec):
        if drawn:
            check_drawable(source)
        return plan_layout(source)
    if isinstance(source, SegmentTable):
        why = "must be a KVCacheSpec or Layout (a table has no layout: draw it with table_map)"
    else:
        why = "must be a KVCacheSpec or Layout" + _hint(source)
    raise _wrong_type(SpecError, field, source, why)


def _shown_blocks(
    n: int, blocks: Sequence[int] | None, per_block: int, max_lanes: int, boxes: int = 0
) -> tuple[list[int], bool]:
    """Blocks to draw: the asked ones, else first/second/middle/last, within ``max_lanes`` lanes and
    :data:`MAX_PLOT_BOXES` boxes (``boxes`` per block; at least one block)."""
    limit = max(1, min(max_lanes // max(1, per_block), MAX_PLOT_BOXES // max(1, boxes)))
    if blocks is not None:
        if isinstance(blocks, range):  # by arithmetic: range(10**9) was listed first (1.7 GB; pass 35)
            r = check_range(blocks, n)
            asked: Sequence[int] = r if r.step > 0 else r[::-1]
        else:
            asked = np.unique(check_blocks(blocks, n)).tolist()
        if not asked:
            raise bad_value(BlockIdError, "blocks", blocks, "name at least one block to draw")
        return list(asked[:limit]), len(asked) > limit
    if n == 0:
        return [0], False
    for pick in ({0, min(1, n - 1), n // 2, n - 1}, {0, n - 1}, {0}):
        if len(pick) <= limit:
            return sorted(pick), len(pick) < n
    return [0], n > 1


def check_range(blocks: range, num_blocks: int, field: str = "blocks") -> range:
    """A ``range`` of block ids, checked in O(1) by its ends: both in ``[0, num_blocks)`` bound every id
    (an empty range passes: the caller decides)."""
    if blocks and not (0 <= blocks[0] < num_blocks and 0 <= blocks[-1] < num_blocks):
        end = blocks[0] if not 0 <= blocks[0] < num_blocks else blocks[-1]
        raise bad_value(BlockIdError, field, blocks, f"holds {_short_id(end)}, outside [0, {num_blocks})")
    return blocks


def _short_id(v: int) -> str:
    return str(v) if abs(v) < 10**30 else f"an integer of {v.bit_length():,} bits"


def check_blocks(blocks: Any, num_blocks: int, field: str = "blocks") -> np.ndarray:
    """Block ids a drawing was asked for: integers (not bools, floats or strings) in ``[0, num_blocks)``,
    at most :data:`MAX_PLOT_IDS` of them (a ``range`` included; checked by its ends before it is listed).

    The same rule as zeroing (:func:`kvlayout.validate.block_ids`): a bad id is a
    :class:`~kvlayout.errors.BlockIdError` naming it, never silently dropped or truncated.
    """
    if isinstance(blocks, range):
        r = check_range(blocks, num_blocks, field)
        if len(r) > MAX_PLOT_IDS:  # every id lies in the pool, so len() fits
            why = f"a drawing takes at most {MAX_PLOT_IDS:,} block ids"
            raise bad_value(BlockIdError, f"{field}.size", len(r), why)
        return np.arange(r.start, r.stop, r.step, dtype=np.int64)
    if isinstance(blocks, np.ndarray):
        size = int(blocks.size)
    elif isinstance(blocks, (list, tuple)):
        size = len(blocks)
    else:
        size = 0  # block_ids names the wrong type
    if size > MAX_PLOT_IDS:  # before the ids are read: 10**7 of them took seconds and GBs
        why = f"a drawing takes at most {MAX_PLOT_IDS:,} block ids"
        raise bad_value(BlockIdError, f"{field}.size", size, why)
    return block_ids(blocks, num_blocks)


def check_count(cls: type[KVLayoutError], field: str, value: Any, limit: int, why: str) -> int:
    """A positive integer (not a bool, float or string) of at most ``limit``: ``why`` says what bounds it."""
    n = check_int(cls, field, value, lo=1)
    if n > limit:
        raise bad_value(cls, field, n, f"at most {_fmt(limit)}: {why}")
    return n


def check_offset(field: str, value: Any) -> int:
    """A byte offset: an integer (not a bool, float or string) in ``[0, 2**62)``."""
    return check_int(LayoutBufferError, field, value, lo=0)


@dataclass
class MapInfo:
    """What a drawn map shows, for :func:`attach_hover` and tests: lanes by their y extent."""

    layout: Layout
    geometry: Geometry
    lanes: list[tuple[float, int, Lane]]  # (y of the lane's top, block, lane)
    insets: list[str]


def _comma_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: _fmt(int(v)))


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


def _table_of(
    source: Any, field: str = "source", cls: type[KVLayoutError] = SpecError
) -> tuple[SegmentTable, Layout | None]:
    """The table of a table, spec (planned) or layout, and the layout where there is one; anything else
    is a ``cls`` error naming its type."""
    if isinstance(source, SegmentTable):
        return source, None
    if not isinstance(source, (KVCacheSpec, Layout)):
        raise _wrong_type(cls, field, source, "must be a KVCacheSpec, Layout or SegmentTable" + _hint(source))
    layout = _as_layout(source, field)
    return layout.table(), layout
