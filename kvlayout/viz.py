"""Pictures of layouts (``notebook`` extra: matplotlib). Started: the block byte map.

``byte_map`` draws one lane per (block, group): x is the byte offset inside the block's
row (packed) or inside the concatenated per-block slot pages (layer_major); each layer part
has its own colour, alignment padding is hatched grey. Real layouts with many blocks are
sampled (first, second, middle, last) and the figure says so.
"""

from __future__ import annotations

from typing import Any

from .planner import Layout, plan_layout
from .spec import KVCacheSpec

PAD_COLOR = "#bbbbbb"


def _blocks(n: int, blocks: list[int] | None, limit: int = 6) -> tuple[list[int], bool]:
    if blocks is not None:
        return sorted(set(blocks))[:limit], len(set(blocks)) > limit
    pick = sorted({0, min(1, n - 1), n // 2, n - 1})
    return pick, len(pick) < n


def layer_colors(layout: Layout) -> dict[str, Any]:
    """A colour per layer name (tab20 cycle)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {p.layer.name: cmap(i % 20) for i, p in enumerate(layout.placements)}


def byte_map(spec_or_layout: KVCacheSpec | Layout, blocks: list[int] | None = None, ax: Any = None) -> Any:
    """Draw the block byte map; returns the matplotlib Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    layout = spec_or_layout if isinstance(spec_or_layout, Layout) else plan_layout(spec_or_layout)
    spec = layout.spec
    shown, sampled = _blocks(spec.num_blocks, blocks)
    groups = [g.name for g in spec.groups]
    colors = layer_colors(layout)
    if layout.block_stride:
        width = layout.block_stride
        slot_x = None
    else:
        slot_x = [sum(layout.slot_pages[:j]) for j in range(len(layout.slot_pages))]
        width = sum(layout.slot_pages)
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 0.6 + 0.45 * len(shown) * len(groups)))
    else:
        fig = ax.figure
    lane = 0
    yticks, ylabels = [], []
    for b in shown:
        for g in groups:
            y = lane
            for p in layout.placements:
                if p.group != g:
                    continue
                x0 = p.offset if slot_x is None else slot_x[p.slot]
                real, page = p.layer.real_page, p.layer.page
                ax.add_patch(Rectangle((x0, y), real, 0.8, color=colors[p.layer.name], lw=0))
                if page > real:
                    ax.add_patch(Rectangle((x0 + real, y), page - real, 0.8, facecolor=PAD_COLOR, hatch="///", lw=0))
            yticks.append(y + 0.4)
            ylabels.append(f"block {b} / {g}" if len(groups) > 1 else f"block {b}")
            lane += 1
        if slot_x is None and b == spec.num_blocks - 1:
            end = layout.total_bytes - b * width  # end of the buffer in this row's coordinates
            ax.axvline(end, color="red", lw=1.5)
            ax.text(end, lane - 0.2, " end of buffer", color="red", fontsize=8, va="top")
    ax.set_xlim(0, width * 1.02)
    ax.set_ylim(lane, -0.2)
    ax.set_yticks(yticks, ylabels, fontsize=7)
    ax.set_xlabel("byte offset in the block row" if slot_x is None else "byte offset in the block's slot pages (slots concatenated)")
    title = f"{spec.layout}: {len(spec.layers)} layers, {spec.num_blocks} blocks"
    if sampled:
        title += f" (showing {len(shown)} of {spec.num_blocks} blocks)"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- segment table view
class TableView:
    """The segment table with per-row checks: HTML in notebooks, text in the terminal."""

    COLS = ("row", "group/layer/part", "base", "stride", "span", "span/stride", "alignment", "last byte", "verdict")

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
            self.rows.append((i, s.label, s.base, s.stride, s.span, f"{s.span / s.stride:.3f}" if s.stride else "-",
                              f"{align} B", f"{end} / {total}", verdict))

    def __str__(self) -> str:
        widths = [max(len(str(c)), *(len(str(r[k])) for r in self.rows)) for k, c in enumerate(self.COLS)]
        line = lambda r: "  ".join(str(x).rjust(w) for x, w in zip(r, widths))  # noqa: E731
        return "\n".join([line(self.COLS), *(line(r) for r in self.rows), self.report.format().splitlines()[0]])

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{c}</th>" for c in self.COLS)
        body = "".join(
            "<tr>" + "".join(f"<td style='color:{'red' if 'BROKEN' in str(r[-1]) else 'black'}'>{x}</td>" for x in r) + "</tr>"
            for r in self.rows
        )
        return f"<table><tr>{head}</tr>{body}</table><p>{self.report.format().splitlines()[0]}</p>"


def table_view(table: Any) -> TableView:
    return TableView(table)


# --------------------------------------------------------------------------- a table drawn, bad ones too
def table_map(table: Any, blocks: list[int] | None = None, ax: Any = None) -> Any:
    """Draw what each row clears per block in block-row coordinates (width = largest stride).

    Bytes a block clears past its own row (spill into the next block) are red; bytes past
    the end of the buffer are red and cross-hatched. Use it on a table the verifier rejects.
    """
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n, total = table.num_blocks, table.total_bytes
    width = int(max(table.strides.max(), 1)) if len(table) else 1
    shown, sampled = _blocks(n, blocks)
    cmap = matplotlib.colormaps["tab20"]
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 0.8 + 0.5 * len(shown)))
    else:
        fig = ax.figure
    xmax = width
    for lane, b in enumerate(shown):
        for r, s in enumerate(table.segments):
            a = s.base + b * s.stride - b * width
            e = a + s.span
            y = lane + 0.1 + 0.7 * r / max(1, len(table))
            h = 0.7 / max(1, len(table))
            own = min(e, width)
            if own > a:
                ax.add_patch(Rectangle((a, y), own - a, h, color=cmap(r % 20), lw=0))
            if e > width:
                ax.add_patch(Rectangle((width, y), e - width, h, color="red", lw=0))
            past = total - b * width
            if e > past:
                ax.add_patch(Rectangle((max(a, past), y), e - max(a, past), h, facecolor="red", edgecolor="black", hatch="xx", lw=0))
            xmax = max(xmax, e)
        if total - b * width < xmax * 2:
            ax.axvline(total - b * width, color="red", lw=1) if b == n - 1 else None
    ax.axvline(width, color="black", lw=0.8, ls="--")
    ax.set_xlim(0, xmax * 1.02)
    ax.set_ylim(len(shown), 0)
    ax.set_yticks([i + 0.45 for i in range(len(shown))], [f"block {b}" for b in shown], fontsize=7)
    ax.set_xlabel("byte offset in the block row (dashed: next block starts; red: spill / past the end)")
    ok = table_view(table).report.ok
    title = f"{len(table)} rows, {n} blocks: {'SAFE' if ok else 'UNSAFE'}"
    if sampled:
        title += f" (showing {len(shown)} of {n} blocks)"
    ax.set_title(title, fontsize=9, color="black" if ok else "red")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- zeroing diff
def zero_diff(before: Any, afters: dict[str, Any], table: Any, block_ids: Any, origin: int = 0,
              region: tuple[int, int] | None = None, ax: Any = None) -> Any:
    """One strip per backend over a byte region: grey untouched, green cleared as the contract
    says, red written outside the contract, orange contract bytes left uncleared."""
    import matplotlib.pyplot as plt
    import numpy as np

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
