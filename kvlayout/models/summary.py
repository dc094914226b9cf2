"""The one-screen summary of a spec made from a config."""

from __future__ import annotations

from .base import ModelSpec, fmt_int, summary_head
from .tpu_inference import NativeModelSpec, native_summary


def summary(ms: ModelSpec | NativeModelSpec, *, proof: bool = True) -> str:
    """Groups, layers per group, page and padding per kind, bytes per block, blocks per GiB, the proof."""
    if isinstance(ms, NativeModelSpec):
        return native_summary(ms, proof=proof)
    spec = ms.spec
    blocks = f"{ms.block_size}-token blocks, layout {spec.layout}, {spec.num_blocks} blocks"
    lines = summary_head(ms, "cache", blocks)
    if ms.attention_backend:
        lines.insert(2, f"attention backend {ms.attention_backend} on {ms.device}: {ms.backend_reason}")
    ng = len(spec.groups)
    lines.append(
        f"{ng} group{'s' * (ng != 1)}, {len(spec.layers)} layers (groups share block ids and overlay):"
    )
    for g in spec.groups:
        kinds = dict.fromkeys(ms.kinds.get(layer.name, layer.kind) for layer in g.layers)
        pages = sum(layer.page for layer in g.layers)
        kinds_text = "+".join(kinds)
        lines.append(
            f"  {g.name:<20} {len(g.layers):>4} layers {fmt_int(pages):>14} B per block  {kinds_text}"
        )
    lines.append(
        f"  {'kind':<20} {'layers':>6} {'tokens':>7} {'real page B':>14} {'page B':>14} {'padding B':>10}"
    )
    per_kind: dict[tuple[str, int | None, int, int], int] = {}
    for _, layer in spec.layers:
        key = (ms.kinds.get(layer.name, layer.kind), layer.logical_block_size, layer.real_page, layer.page)
        per_kind[key] = per_kind.get(key, 0) + 1
    for (kind, tokens, real, page), count in per_kind.items():
        shown = "-" if tokens is None else str(tokens)
        lines.append(
            f"  {kind:<20} {count:>6} {shown:>7} {fmt_int(real):>14} {fmt_int(page):>14} "
            f"{fmt_int(page - real):>10}"
        )
    bpb = ms.bytes_per_block
    lines.append(f"bytes per block {fmt_int(bpb)}; blocks per GiB {fmt_int(ms.blocks_per_gib)}")
    if proof:
        from ..verify import verify

        report = verify(ms.layout.table())
        lines.append(f"zeroing table: {report.format().splitlines()[0]}")
    return "\n".join(lines)
