"""What lies at a byte (:func:`describe_at`), hover on a byte map and the ipywidgets :class:`Explorer`."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from ..errors import KVLayoutError, SpecError, spec_error
from ..planner import Layout, plan_layout
from ..presets import PRESETS, preset
from ..spec import (
    ALL_LAYOUTS,
    KVCacheSpec,
)
from ..table import Segment, SegmentTable
from ..validate import plain_str, read_json_file
from .common import (
    EDGE_COLOR,
    LANE_H,
    Geometry,
    MapInfo,
    _count,
    _covering,
    _fmt,
    _short,
    _table_of,
    check_drawable,
    check_offset,
    group_pattern,
    layer_kind,
)
from .compare import (
    VARIANT_DTYPES,
    variant,
)
from .maps import (
    byte_map,
    table_view,
)


# --------------------------------------------------------------------------- what lies at a byte
def describe_at(source: SegmentTable | Layout | KVCacheSpec, byte_offset: int, *, limit: int = 8) -> str:
    """What lies at a byte of the buffer: block, layer, group, part, offsets and sizes, one per line.

    For a layout (or spec): the block and its row offset, every group's layer part there
    (overlaid groups of one shape on one line), alignment gaps and Mamba state. For a table:
    the rows that clear the byte and for which blocks; two blocks or a byte past the buffer
    are flagged UNSAFE. The explorer calls this for the byte under its cursor.
    """
    off = check_offset("byte_offset", byte_offset)
    table, layout = _table_of(source, "source")
    n, total = table.num_blocks, table.total_bytes
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
        self._from_config = _models()
        sources = [*PRESETS, "spec file", *(["model config"] if self._from_config else [])]
        source, path = plain_str(source), plain_str(path)
        if not isinstance(source, str) or source not in sources:  # checked before ipywidgets sees it
            why = f"valid: {', '.join(sources)} (a JSON file: source='spec file', path=...)"
            raise spec_error("source", source, why)
        if not isinstance(path, str):
            raise spec_error("path", path, "must be a string (the path of a spec or model config JSON)")
        import ipywidgets as w

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
        from ..verify import verify

        self._busy = True
        try:
            spec = self.current_spec(reset_blocks=reset_blocks)
            check_drawable(spec)  # a spec too large to draw: said in the status line, before it is planned
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
