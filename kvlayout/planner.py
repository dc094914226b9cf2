"""The planner: specs -> :class:`Layout` -> :class:`SegmentTable` (GEOMETRY.md sections 2 and 6).

This is the only place that decides where a layer's block lives. Backends get the table
from here and never re-derive it from tensor strides, which is the class of bug
(vLLM #50276, #52709) kvlayout exists to end.

Design note: vLLM 0.33's layout algebra, as read from its source
----------------------------------------------------------------

vLLM 0.33 (``vllm/v1/kv_cache_layout.py``) names the physical order of the logical axes
``[L, B, H, N, C]`` of a cache group: layer slot, block, head slot, state (token) in the
block, content bytes of one (head, state) cell, K and V together. A layer's page is
``H * N * C`` (``AttentionSpec``: ``H = num_head_slots or num_kv_heads``, ``N = block_size //
tokens_per_state``, ``C = state_content_bytes or (head_size + head_size_v) * itemsize``),
padded to ``page_size_padded`` when set (MLA: ``round_up(page, alignment)``). The six orders
fall into two families, and kvlayout plans them as follows (``core/kv_cache_planning.py``,
``kv_cache_interface.py``: ``get_kv_cache_config_from_groups``, ``compute_layout_strides``):

In every order a group's layers are placed in placement order (:func:`placement_order`): each
geometry's layers together, as vLLM keeps a group's layers of one spec in one ``KVCacheTensor``.

- **Block-outermost** (``BLHNC`` = ``packed``, ``BLNHC``, ``BHLNC``): every group lays its layers
  side by side in one block row and groups overlay from byte 0. The block stride is the widest
  group's sum of (padded) pages, rounded up to the lcm of every layer's
  ``block_stride_alignment`` (vLLM's ``_get_kv_cache_bytes_per_block``; for a ``MultipleOf(k)``
  kernel-block constraint that is the page of a ``k``-token block). A layer starts where the
  previous pages of its group end. Under ``BLHNC``/``BLNHC`` a layer's page is one contiguous
  run per block (the two differ only inside the page), so it is one row. Under ``BHLNC`` the
  head axis sits outside the layer axis: the layers of equal geometry form a run
  (vLLM's ``KVCacheTensor`` of same-spec layers), and head ``h`` of the ``i``-th of ``k``
  layers of a run sits at ``run + h * k * N*C + i * N*C``: ``H`` rows per layer.
- **Layer-outermost** (``LBHNC`` = ``layer_major``, ``LBNHC``, ``LHBNC``): each layer slot owns a
  region of ``num_blocks`` blocks; groups overlay slot by slot (vLLM: layer ``j`` of every group
  at the same offset, which vLLM only allows for uniform pages or one group; kvlayout takes the
  largest page of the slot, so it agrees wherever vLLM plans). A layer's block stride is its
  page rounded up to its ``block_stride_alignment`` (``_get_layer_block_stride``). Under
  ``LBHNC``/``LBNHC`` a block is one run per layer; under ``LHBNC`` the heads sit outside the
  blocks: head ``h`` of block ``b`` is at ``region + h * num_blocks * N*C + b * N*C``, one row
  per head slot.

vLLM refuses what its strides cannot express and so does kvlayout, with the field named:
padding with several head slots outside ``B`` (``LHBNC``/``BHLNC``: ``compute_layout_strides``
asserts a single head), a block stride rounded past the page under ``LHBNC`` ("cannot pad
pages"), and virtual block splitting of padded pages. Where vLLM would plan an unsafe
overlay (``LHBNC`` slots whose layers differ in head slots or page, where block ``b`` of one
group shares bytes with another block of the other) kvlayout refuses the spec instead.

Zeroing block ``b`` of a layer clears every logical byte of it (``H * N * C``, never the
padding). vLLM's ``KVBlockZeroer`` builds one segment per index of an axis physically
outside ``B`` (the heads under ``LHBNC``, and virtual sub-blocks), and under ``BHLNC`` one
segment per layer spanning from its head 0 to the end of its head ``H-1``, over the other
layers of its run; kvlayout's rows are per head run instead, so the union is the same
when every layer of the run is zeroed and kvlayout never clears a layer that is not.
The ``kv_split`` halves of section 2 (the older FlashAttention ``[2, B, ...]`` form) remain
available in ``layer_major``/``LBHNC`` only.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from .errors import SpecError, bad_value, spec_error
from .ranges import MAX_BYTES, round_up
from .spec import KVCacheSpec, LayerSpec
from .table import MAX_TABLE_ROWS, Segment, SegmentTable

#: Orders whose outermost axis is the block (one block row holds every layer).
BLOCK_OUTER = ("BLHNC", "BLNHC", "BHLNC")
#: Orders whose outermost axis is the layer slot (one region of blocks per slot).
LAYER_OUTER = ("LBHNC", "LBNHC", "LHBNC")


@dataclass(frozen=True)
class Part:
    """One contiguous per-block piece of a layer: the page, or its K or V half."""

    name: str  # "page", "k", "v" or "head<h>" (one head slot of LHBNC/BHLNC)
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
    #: The ``[L, B, H, N, C]`` order the layout was planned as (``packed`` -> ``BLHNC``).
    order: str = ""

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


def _page_parts(layer: LayerSpec, base: int, stride: int, region_half: int, padded: int) -> tuple[Part, ...]:
    """One row for the whole page, or K and V halves (``kv_split``)."""
    if layer.split_kv:
        half_real, half_pad = layer.real_page // 2, layer.page // 2
        return (
            Part("k", base, stride, half_real, half_pad),
            Part("v", base + region_half, stride, half_real, half_pad),
        )
    return (Part("page", base, stride, layer.real_page, padded),)


def _head_parts(layer: LayerSpec, base: int, head_pitch: int, stride: int, padded: int) -> tuple[Part, ...]:
    """One row per head slot: head ``h`` at ``base + h * head_pitch`` (``LHBNC``/``BHLNC``)."""
    h = layer.heads
    span = layer.real_page // h
    if span % 4:
        raise spec_error(
            f"{layer.where}.real_page",
            layer.real_page,
            f"one head slot holds {span} B (N*C), not a multiple of 4: its rows cannot be zeroed in words",
        )
    if h == 1:
        return (Part("page", base, stride, span, padded),)
    return tuple(Part(f"head{i}", base + i * head_pitch, stride, span, span) for i in range(h))


def _refuse_padding_with_heads(layer: LayerSpec, order: str) -> None:
    """vLLM pads a page only where its heads are inside the block (``compute_layout_strides``)."""
    if layer.heads > 1 and layer.page != layer.real_page:
        field, value = (
            ("padded_page", layer.padded_page_bytes)
            if layer.padded_page_bytes
            else ("alignment", layer.alignment_bytes)
        )
        raise spec_error(
            f"{layer.where}.{field}",
            value,
            f"{order} cannot pad a page of {layer.heads} head slots (heads lie outside the page; vLLM "
            "allows padding there only with one head slot)",
        )


def _refuse_kv_split(spec: KVCacheSpec, order: str) -> None:
    allowed = order == "LBHNC"
    for _, layer in spec.layers:
        if layer.split_kv and not allowed:
            raise spec_error(
                f"{layer.where}.kv_split",
                True,
                f"kv_split is an error in the {spec.layout} layout",
            )


def _runs(layers: tuple[LayerSpec, ...]) -> list[list[LayerSpec]]:
    """A group's layers by geometry: one run per distinct geometry, in the order each geometry
    first appears, its layers in listed order (vLLM 0.33's ``KVCacheTensor`` per spec).

    vLLM's ``get_kv_cache_config_from_groups`` collects a group's layers into a dict keyed by
    their spec and lays the tensors out one after the other, in every layout order: layers of
    heads 8, 2, 8, 4 sit as 0, 2, 1, 3 (issue 23, item 6).
    """
    runs: dict[tuple[tuple[str, object], ...], list[LayerSpec]] = {}
    for layer in layers:
        runs.setdefault(layer.geometry_key, []).append(layer)
    return list(runs.values())


def placement_order(layers: tuple[LayerSpec, ...]) -> tuple[LayerSpec, ...]:
    """The order a group's layers are placed in, in every layout (:func:`_runs` flattened)."""
    return tuple(layer for run in _runs(layers) for layer in run)


def _block_stride(spec: KVCacheSpec) -> int:
    """Widest group's pages, rounded up to the lcm of every block-stride alignment (vLLM 0.33)."""
    widest = max(sum(layer.page for layer in g.layers) for g in spec.groups)
    lcm = 1
    for _, layer in spec.layers:
        lcm = math.lcm(lcm, layer.stride_alignment)
        if lcm >= MAX_BYTES:
            raise spec_error(
                f"{layer.where}.block_stride_alignment",
                layer.stride_alignment,
                f"the lcm of the block-stride alignments reaches {lcm}: the limit is 2**62 - 1 (section 8)",
            )
    stride = round_up(widest, lcm)
    if stride % 4:
        culprit = next(layer for _, layer in spec.layers if layer.stride_alignment % 4)
        raise spec_error(
            f"{culprit.where}.block_stride_alignment",
            culprit.stride_alignment,
            f"aligns the block stride to {stride} B, not a multiple of 4",
        )
    return _bounded(stride, spec)


def _plan_block_outer(spec: KVCacheSpec, order: str) -> Layout:
    _refuse_kv_split(spec, order)
    n = spec.num_blocks
    stride = _block_stride(spec)
    placements: list[Placement] = []
    for g in spec.groups:
        if order != "BHLNC":
            off = 0
            for j, layer in enumerate(placement_order(g.layers)):
                parts = _page_parts(layer, off, stride, 0, layer.page)
                placements.append(Placement(g.name, layer, j, off, stride, parts))
                off += layer.page
            continue
        run_off, j = 0, 0
        for run in _runs(g.layers):
            first = run[0]
            _refuse_padding_with_heads(first, order)
            pitch = first.page // first.heads  # N*C, or the padded page of a single head slot
            for i, layer in enumerate(run):
                base = run_off + i * pitch
                parts = _head_parts(layer, base, len(run) * pitch, stride, layer.page)
                placements.append(Placement(g.name, layer, j, base, stride, parts))
                j += 1
            run_off += len(run) * first.page
    return Layout(spec, _bounded(stride * n, spec), tuple(placements), stride, (), order)


def _layer_stride(layer: LayerSpec, order: str) -> int:
    """A layer's own block stride in a layer-outer order: its page rounded to its alignment."""
    stride = round_up(layer.page, layer.stride_alignment)
    if stride % 4:
        raise spec_error(
            f"{layer.where}.block_stride_alignment",
            layer.stride_alignment,
            f"aligns the block stride to {stride} B, not a multiple of 4",
        )
    if order == "LHBNC" and stride != layer.page:
        raise spec_error(
            f"{layer.where}.block_stride_alignment",
            layer.stride_alignment,
            f"LHBNC cannot pad the page of {layer.page} B to a block stride of {stride} B (heads lie "
            "outside the blocks; vLLM refuses it too)",
        )
    return stride


def _plan_layer_outer(spec: KVCacheSpec, order: str) -> Layout:
    _refuse_kv_split(spec, order)
    n = spec.num_blocks
    num_slots = max(len(g.layers) for g in spec.groups)
    ordered = [placement_order(g.layers) for g in spec.groups]
    slots: list[list[LayerSpec]] = [[] for _ in range(num_slots)]
    for layers in ordered:  # O(layers), not O(slots * groups)
        for j, layer in enumerate(layers):
            slots[j].append(layer)
    slot_pages = []
    for j, in_slot in enumerate(slots):
        slot_pages.append(_bounded(max(_layer_stride(layer, order) for layer in in_slot), spec))
        splits = {layer.split_kv for layer in in_slot}
        if len(splits) > 1:
            bad = next(layer for layer in in_slot if layer.split_kv)
            raise spec_error(
                f"{bad.where}.kv_split",
                True,
                f"every layer of slot {j} must agree on kv_split "
                "(halves and whole pages of one region overlap across blocks)",
            )
        if order == "LHBNC":
            for layer in in_slot:
                _refuse_padding_with_heads(layer, order)
            shapes = {(layer.heads, layer.page) for layer in in_slot}
            if len(shapes) > 1 and any(layer.heads > 1 for layer in in_slot):
                bad = next(
                    layer
                    for layer in in_slot
                    if (layer.heads, layer.page) != (in_slot[0].heads, in_slot[0].page)
                )
                raise spec_error(
                    f"{bad.where}.heads",
                    bad.heads,
                    f"every layer of slot {j} must agree on head slots and page under LHBNC (got "
                    f"{sorted(shapes)}: block b of one group would share bytes with another block "
                    "of the other)",
                )
    placements: list[Placement] = []
    region = 0
    regions = []
    for sp in slot_pages:
        regions.append(region)
        region = _bounded(region + sp * n, spec)
    for g, layers in zip(spec.groups, ordered):
        for j, layer in enumerate(layers):
            sp = slot_pages[j]
            own = _layer_stride(layer, order)
            if order == "LHBNC":
                pitch = sp // layer.heads  # N*C per head slot (the whole slot page with one head)
                parts = _head_parts(layer, regions[j], pitch * n, pitch, own)
                placements_stride = pitch
            elif layer.split_kv:
                if sp % 2 or layer.real_page % 2:
                    raise spec_error(
                        f"{layer.where}.kv_split",
                        True,
                        f"needs an even slot page ({sp}) and real page ({layer.real_page})",
                    )
                if (sp // 2) % 4 or (layer.real_page // 2) % 4:
                    raise spec_error(
                        f"{layer.where}.kv_split",
                        True,
                        f"half pages ({sp // 2} B stride, {layer.real_page // 2} B span) "
                        "must be multiples of 4",
                    )
                parts = _page_parts(layer, regions[j], sp // 2, sp // 2 * n, own)
                placements_stride = sp // 2
            else:
                parts = _page_parts(layer, regions[j], sp, 0, own)
                placements_stride = sp
            placements.append(Placement(g.name, layer, j, regions[j], placements_stride, parts))
    return Layout(spec, region, tuple(placements), None, tuple(slot_pages), order)


def _check_spec_type(spec: object) -> None:
    """A :class:`KVCacheSpec`, named where it is not: ``plan("dsv4")`` read ``.order`` of a str (pass 34)."""
    if not isinstance(spec, KVCacheSpec):
        kind = type(spec).__name__
        hint = " (kvlayout.preset(name) gives a preset's spec)" if isinstance(spec, str) else ""
        raise bad_value(SpecError, "spec type", kind, f"must be a kvlayout.KVCacheSpec{hint}", shown=kind)


def plan_layout(spec: KVCacheSpec) -> Layout:
    """Lay out every layer of ``spec`` in one flat buffer."""
    _check_spec_type(spec)
    order = spec.order
    _check_row_count(spec, order)
    if order in BLOCK_OUTER:
        return _plan_block_outer(spec, order)
    return _plan_layer_outer(spec, order)


def _check_row_count(spec: KVCacheSpec, order: str) -> None:
    """Refuse, before any row exists, a spec whose table would pass MAX_TABLE_ROWS: a row per head slot
    (LHBNC, BHLNC) and per virtual sub-block (2**30 heads, or blocks of 2**30 tokens split into
    1-token kernel blocks, ran out of memory; issue 25)."""
    per_head = order in ("LHBNC", "BHLNC")
    n = 0
    for g in spec.groups:
        for layer in g.layers:
            parts = layer.heads if per_head else 2 if layer.split_kv else 1
            ratio = g.split_ratio(layer)  # as build_table splits them (1 for Mamba state: no tokens)
            n += parts * ratio
            if n > MAX_TABLE_ROWS:
                why = (
                    f"its table would pass {MAX_TABLE_ROWS:,} rows at {layer.where} ({parts} rows a block, "
                    f"{ratio} virtual sub-blocks each; GEOMETRY.md section 8)"
                )
                raise spec_error("spec", f"{n} rows or more", why)


def _bounded(total_bytes: int, spec: KVCacheSpec) -> int:
    """Refuse layouts whose buffer would reach 2**62 bytes (GEOMETRY.md section 8)."""
    if total_bytes >= MAX_BYTES:
        raise spec_error(
            "num_blocks",
            spec.num_blocks,
            f"the layout would need {total_bytes} B; the limit is 2**62 - 1 (section 8)",
        )
    return total_bytes


def build_table(layout: Layout) -> SegmentTable:
    """Rows for every zeroed layer part and virtual sub-block, plus the padding ranges."""
    rows: list[Segment] = []
    group_of = {g.name: g for g in layout.spec.groups}  # one lookup per placement, not a scan
    for p in layout.placements:
        layer = p.layer
        if not layer.zeroed:
            continue
        group = group_of[p.group]
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
    stride = layout.block_stride
    if stride is not None and layout.placements:
        # block-stride alignment: the tail of every block row beyond the widest group
        widest = max(sum(layer.page for layer in g.layers) for g in layout.spec.groups)
        if stride > widest:
            by_stride.setdefault(stride, ([], []))[0].append((widest, stride, ""))
    out: list[Segment] = []
    for stride, (gaps, reals) in by_stride.items():
        starts, ends = _union(reals)
        for g0, g1, name in gaps:
            pieces = _minus(g0, g1, starts, ends)
            out.extend(Segment(a, stride, b - a, "", name, "padding", 0) for a, b in pieces)
            if len(out) > MAX_TABLE_ROWS:  # overlaid groups cut each padded gap into many pieces
                why = (
                    f"its padding would pass {MAX_TABLE_ROWS:,} ranges (a gap of {name or 'the block row'} "
                    "is cut by the layers of groups overlaid on it; GEOMETRY.md section 8)"
                )
                raise spec_error("spec", f"{len(out)} padding ranges or more", why)
    return tuple(out)


def _union(ranges: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Sorted, disjoint starts and ends of the union of non-empty ``ranges`` (touching ones joined)."""
    starts: list[int] = []
    ends: list[int] = []
    for a, b in sorted(ranges):
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return starts, ends


def _minus(g0: int, g1: int, starts: list[int], ends: list[int]) -> list[tuple[int, int]]:
    """The pieces of ``[g0, g1)`` outside the union ``starts``/``ends``, ascending.

    Binary search finds the first union range that can reach ``g0``; the walk then visits
    only the ranges that meet the gap, so padding costs O(n log n) plus its output, where
    subtracting every real range from every gap was quadratic (issue 25).
    """
    pieces = []
    i = max(bisect.bisect_right(starts, g0) - 1, 0)
    a = g0
    while i < len(starts) and starts[i] < g1:
        if ends[i] > a:
            if starts[i] > a:
                pieces.append((a, starts[i]))
            a = ends[i]
            if a >= g1:
                return pieces
        i += 1
    pieces.append((a, g1))
    return pieces


def plan(spec: KVCacheSpec, *, coalesce: bool = False) -> SegmentTable:
    """Plan ``spec`` and return its segment table (coalesced for kernels if asked)."""
    _check_spec_type(spec)
    if not isinstance(coalesce, bool):  # "no" is truthy: a string would coalesce
        raise spec_error("coalesce", coalesce, "must be True or False")
    table = plan_layout(spec).table()
    return table.coalesced() if coalesce else table
