"""vLLM 0.33's split of a model's layers into KV-cache groups (``vllm/v1/core/kv_cache_planning.py``).

- ``get_kv_cache_groups``: a model whose layers all have one spec is one group; DeepSeek
  V2/V3/V3.2 (every layer an MLA spec, the V3.2 indexer included) is one group; otherwise
  (``_get_kv_cache_groups_uniform_page_size``) layers are split by spec kind, ``size`` = the
  fewest layers of a kind (the most, when that is under 1.5x the fewest), and a kind of ``n``
  layers becomes ``k = ceil(n / size)`` groups taking every ``k``-th layer. Groups share block
  ids and overlay one another.
- Layers with different pages (DeepSeek-V4) are grouped by vLLM's block-outermost packer
  (``_get_packed_kv_cache_groups``), :func:`vllm_packed_groups`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..spec import GroupSpec, LayerSpec


def vllm_groups(kinds: Sequence[tuple[str, Sequence[LayerSpec]]]) -> tuple[GroupSpec, ...]:
    """vLLM's split of layers of several spec kinds into groups of (about) one size."""
    kinds = [(k, list(ls)) for k, ls in kinds if ls]
    if len(kinds) == 1:
        return (GroupSpec(kinds[0][0], tuple(kinds[0][1])),)
    counts = [len(ls) for _, ls in kinds]
    size = min(counts)
    if max(counts) * 2 < size * 3:  # max < 1.5 * min: one group per kind, padded
        size = max(counts)
    groups = []
    for kind, layers in kinds:
        n = -(-len(layers) // size)
        for j in range(n):
            groups.append(GroupSpec(kind if n == 1 else f"{kind}.{j}", tuple(layers[j::n])))
    return tuple(groups)


def _least_padding_chunk(values: Sequence[int], lo: int) -> int:
    """The chunk ``d >= lo`` that pads ``values`` up to multiples of ``d`` the least (ties: larger)."""
    best, best_pad = lo, None
    for d in range(lo, max(max(values), lo) + 1):
        pad = sum(-x % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def vllm_packed_groups(
    layers: Sequence[tuple[tuple[str, str, int, int | None], LayerSpec]],
) -> tuple[GroupSpec, ...]:
    """vLLM 0.33's grouping of layers with different pages for a block-outermost layout
    (``_get_packed_kv_cache_groups``). ``layers`` are ``(kind, bucket key, layer)`` in model
    order; a layer joins the first bucket of its key (one spec type, block size and window).
    A bucket whose page sizes have equal layer counts is "balanced": it repeats one layer of
    each page, and balanced buckets are split into groups of ``r`` repeats, ``r`` the chunk
    (at least the repeats of the largest mixed-page balanced bucket) that pads the repeat
    counts least. Other buckets stay whole. No bucket here holds Mamba states, so vLLM's
    state-bucket cap does not apply."""
    buckets: dict[tuple[str, str, int, int | None], list[LayerSpec]] = {}
    for key, layer in layers:
        buckets.setdefault(key, []).append(layer)
    info = []
    for (name, *_), members in buckets.items():
        by_page: dict[int, list[LayerSpec]] = {}
        for layer in members:
            by_page.setdefault(layer.page, []).append(layer)
        counts = {len(v) for v in by_page.values()}
        info.append((name, members, by_page, len(counts) == 1, max(len(v) for v in by_page.values())))
    floor = max((reps for *_, by_page, bal, reps in info if bal and len(by_page) > 1), default=0)
    per_group = _least_padding_chunk([reps for *_, bal, reps in info if bal], floor) if floor else None
    groups = []
    for name, members, by_page, balanced, reps in info:
        n = -(-reps // per_group) if balanced and per_group else 1
        if n == 1:
            groups.append(GroupSpec(name, tuple(members)))
            continue
        repeats = list(zip(*by_page.values()))
        for j in range(n):
            groups.append(GroupSpec(f"{name}.{j}", tuple(x for rep in repeats[j::n] for x in rep)))
    return tuple(groups)
