"""The planner: specs -> :class:`Layout` -> :class:`SegmentTable` (GEOMETRY.md section 2).

This is the only place that decides where a layer's block lives. Backends get the table
from here and never re-derive it from tensor strides, which is the class of bug
(vLLM #50276, #52709) kvlayout exists to end.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import spec_error
from .ranges import MAX_BYTES
from .spec import GroupSpec, KVCacheSpec, LayerSpec
from .table import Segment, SegmentTable


@dataclass(frozen=True)
class Part:
    """One contiguous per-block piece of a layer: the page, or its K or V half."""

    name: str  # "page", "k" or "v"
    base: int  # byte offset of block 0
    stride: int  # bytes between consecutive block ids
    span: int  # real bytes per block (what zeroing clears)
    padded: int  # padded bytes per block (span + alignment gap)


@dataclass(frozen=True)
class Placement:
    """Where one layer lives: its slot, offset and parts."""

    group: str
    layer: LayerSpec
    slot: int  # index of the layer in its group (the layer_major slot)
    offset: int  # byte offset of block 0's first byte
    stride: int  # bytes between consecutive blocks of the layer's page
    parts: tuple[Part, ...]

    @property
    def real_page(self) -> int:
        return self.layer.real_page

    @property
    def page(self) -> int:
        return self.layer.page


@dataclass(frozen=True)
class Layout:
    """A planned layout: every layer's placement and the buffer size."""

    spec: KVCacheSpec
    total_bytes: int
    placements: tuple[Placement, ...]
    #: packed: bytes per block row; layer_major: ``None``.
    block_stride: int | None
    #: layer_major: padded bytes per block of each slot; packed: ``()``.
    slot_pages: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        return self.spec.num_blocks

    def placement(self, layer_name: str) -> Placement:
        for p in self.placements:
            if p.layer.name == layer_name:
                return p
        raise KeyError(layer_name)

    def table(self) -> SegmentTable:
        """The segment table of this layout (uncoalesced, full provenance)."""
        return build_table(self)


def _split_parts(layer: LayerSpec, base: int, stride: int, region_half: int) -> tuple[Part, ...]:
    if layer.split_kv:
        half_real, half_pad = layer.real_page // 2, layer.page // 2
        return (
            Part("k", base, stride, half_real, half_pad),
            Part("v", base + region_half, stride, half_real, half_pad),
        )
    return (Part("page", base, stride, layer.real_page, layer.page),)


def plan_layout(spec: KVCacheSpec) -> Layout:
    """Lay out every layer of ``spec`` in one flat buffer."""
    n = spec.num_blocks
    placements: list[Placement] = []
    if spec.layout == "packed":
        for _, layer in spec.layers:
            if layer.split_kv:
                raise spec_error(f"{layer.where}.kv_split", True, "kv_split is an error in the packed layout")
        block_stride = max(sum(layer.page for layer in g.layers) for g in spec.groups)
        for g in spec.groups:
            off = 0
            for j, layer in enumerate(g.layers):
                placements.append(Placement(g.name, layer, j, off, block_stride, _split_parts(layer, off, block_stride, 0)))
                off += layer.page
        return Layout(spec, _bounded(block_stride * n, spec), tuple(placements), block_stride, ())

    # layer_major: slot j holds the j-th layer of every group.
    num_slots = max(len(g.layers) for g in spec.groups)
    slot_pages = []
    for j in range(num_slots):
        in_slot = [g.layers[j] for g in spec.groups if j < len(g.layers)]
        slot_pages.append(max(layer.page for layer in in_slot))
        splits = {layer.split_kv for layer in in_slot}
        if len(splits) > 1:
            bad = next(layer for layer in in_slot if layer.split_kv)
            raise spec_error(
                f"{bad.where}.kv_split",
                True,
                f"every layer of slot {j} must agree on kv_split (halves and whole pages of one region overlap across blocks)",
            )
    region = 0
    regions = []
    for sp in slot_pages:
        regions.append(region)
        region += sp * n
    for g in spec.groups:
        for j, layer in enumerate(g.layers):
            sp = slot_pages[j]
            if layer.split_kv:
                if sp % 2 or layer.real_page % 2:
                    raise spec_error(f"{layer.where}.kv_split", True, f"needs an even slot page ({sp}) and real page ({layer.real_page})")
                if (sp // 2) % 4 or (layer.real_page // 2) % 4:
                    raise spec_error(
                        f"{layer.where}.kv_split",
                        True,
                        f"half pages ({sp // 2} B stride, {layer.real_page // 2} B span) must be multiples of 4",
                    )
                parts = _split_parts(layer, regions[j], sp // 2, sp // 2 * n)
                placements.append(Placement(g.name, layer, j, regions[j], sp // 2, parts))
            else:
                placements.append(Placement(g.name, layer, j, regions[j], sp, _split_parts(layer, regions[j], sp, 0)))
    return Layout(spec, _bounded(region, spec), tuple(placements), None, tuple(slot_pages))


def _bounded(total_bytes: int, spec: KVCacheSpec) -> int:
    """Refuse layouts whose buffer would reach 2**62 bytes (GEOMETRY.md section 8)."""
    if total_bytes >= MAX_BYTES:
        raise spec_error(
            "num_blocks", spec.num_blocks, f"the layout would need {total_bytes} B; the limit is 2**62 - 1 (section 8)"
        )
    return total_bytes


def _group_of(spec: KVCacheSpec, name: str) -> GroupSpec:
    return next(g for g in spec.groups if g.name == name)


def build_table(layout: Layout) -> SegmentTable:
    """Rows for every zeroed layer part and virtual sub-block, plus the padding ranges."""
    rows: list[Segment] = []
    for p in layout.placements:
        layer = p.layer
        if not layer.zeroed:
            continue
        group = _group_of(layout.spec, p.group)
        ratio = group.split_ratio(layer)
        if ratio > 1 and layer.real_page != layer.page:
            raise spec_error(
                f"group {group.name!r}.kernel_block_size",
                group.kernel_block_size,
                f"virtual block splitting needs a dense page, but {layer.where} has real page "
                f"{layer.real_page} B padded to {layer.page} B",
            )
        for part in p.parts:
            if ratio > 1 and part.span % (4 * ratio):
                raise spec_error(
                    f"group {group.name!r}.kernel_block_size",
                    group.kernel_block_size,
                    f"{layer.where} part {part.name!r} of {part.span} B is not a multiple of 4*{ratio}",
                )
            sub = part.span // ratio
            for v in range(ratio):
                rows.append(Segment(part.base + v * sub, part.stride, sub, p.group, layer.name, part.name, v))
    return SegmentTable(layout.total_bytes, layout.num_blocks, tuple(rows), _padding(layout), planned=True)


def _padding(layout: Layout) -> tuple[Segment, ...]:
    """Alignment gaps that no layer's real data covers, as periodic ranges.

    Groups overlay, so a gap of one layer can hold real bytes of another group's layer; those
    bytes are data, not padding. Rows of one stride class share block-0 coordinates (packed:
    one row per block; layer_major: disjoint regions), so the subtraction is done there.
    """
    by_stride: dict[int, tuple[list[tuple[int, int, str]], list[tuple[int, int]]]] = {}
    for p in layout.placements:
        for part in p.parts:
            gaps, reals = by_stride.setdefault(part.stride, ([], []))
            reals.append((part.base, part.base + part.span))
            if part.padded > part.span:
                gaps.append((part.base + part.span, part.base + part.padded, p.layer.name))
    out: list[Segment] = []
    for stride, (gaps, reals) in by_stride.items():
        reals.sort()
        for g0, g1, name in gaps:
            pieces = [(g0, g1)]
            for r0, r1 in reals:
                nxt = []
                for a, b in pieces:
                    if r1 <= a or r0 >= b:
                        nxt.append((a, b))
                        continue
                    if a < r0:
                        nxt.append((a, r0))
                    if r1 < b:
                        nxt.append((r1, b))
                pieces = nxt
            out.extend(Segment(a, stride, b - a, "", name, "padding", 0) for a, b in pieces)
    return tuple(out)


def plan(spec: KVCacheSpec, *, coalesce: bool = False) -> SegmentTable:
    """Plan ``spec`` and return its segment table (coalesced for kernels if asked)."""
    table = plan_layout(spec).table()
    return table.coalesced() if coalesce else table
