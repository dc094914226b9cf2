"""Seeded random specs, shared by the hypothesis strategies and the conformance battery.

``random_spec(seed)`` always returns a spec the planner accepts (it retries on the rare
invalid draw), small enough for interpreters: a few groups, a few layers, tiny pages.
"""

from __future__ import annotations

import random

from .errors import SpecError
from .planner import plan_layout
from .spec import FullAttentionSpec, GroupSpec, KVCacheSpec, LayerSpec, MambaSpec, MLASpec, SlidingWindowSpec

_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "uint8")
_ALIGNS = (None, None, 64, 96, 128, 512, 576)


def _layer(rng: random.Random, name: str, layout: str) -> LayerSpec:
    kind = rng.choice(("full", "full", "sliding_window", "mla", "mla", "mamba"))
    align = rng.choice(_ALIGNS)
    if kind == "mamba":
        return MambaSpec(name=name, state_bytes=4 * rng.randint(1, 96), alignment=align)
    bs = rng.choice((4, 8, 16))
    if kind == "mla":
        ratio = rng.choice((1, 1, 2, 4))
        if rng.random() < 0.3:
            return MLASpec(name=name, block_size=bs, head_size=8, cache_dtype="fp8_ds_mla", compress_ratio=ratio, alignment=align)
        if rng.random() < 0.3:
            return MLASpec(name=name, block_size=bs, head_size=8, dtype="uint8", compress_ratio=ratio, token_bytes=4 * rng.randint(1, 40), alignment=align)
        return MLASpec(name=name, block_size=bs, head_size=4 * rng.randint(1, 33), dtype=rng.choice(_DTYPES), compress_ratio=ratio, alignment=align)
    kw = dict(
        name=name,
        block_size=bs,
        num_kv_heads=rng.randint(1, 2),
        head_size=rng.choice((4, 8, 12, 16)),
        dtype=rng.choice(_DTYPES),
        alignment=align,
        kv_split=True if (layout == "layer_major" and rng.random() < 0.4) else None,
    )
    if kind == "sliding_window":
        return SlidingWindowSpec(window=rng.randint(1, 64), **kw)  # type: ignore[arg-type]
    return FullAttentionSpec(**kw)  # type: ignore[arg-type]


def random_spec(seed: int, *, layout: str | None = None, max_blocks: int = 12) -> KVCacheSpec:
    """A valid random spec of ``layout`` (random if ``None``), determined by ``seed``."""
    rng = random.Random(seed)
    for _ in range(1000):
        lay = layout or rng.choice(("packed", "layer_major"))
        groups = []
        li = 0
        for g in range(rng.randint(1, 3)):
            layers = []
            for _ in range(rng.randint(1, 4)):
                layers.append(_layer(rng, f"L{li}", lay))
                li += 1
            kbs = None
            if rng.random() < 0.25:
                bss = {lyr.logical_block_size for lyr in layers if lyr.logical_block_size}
                if bss:
                    kbs = min(bss) // rng.choice((1, 2, 4))
            groups.append(GroupSpec(f"g{g}", tuple(layers), kernel_block_size=kbs))
        try:
            spec = KVCacheSpec(num_blocks=rng.randint(1, max_blocks), layout=lay, groups=tuple(groups))
            plan_layout(spec).table()
        except SpecError:
            continue
        return spec
    raise RuntimeError(f"no valid spec found for seed {seed}")  # pragma: no cover
