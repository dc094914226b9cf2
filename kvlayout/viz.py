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
