"""Built-in specs for ``--preset``: DeepSeek-V4 geometries and a Llama-8B cache."""

from __future__ import annotations

from collections.abc import Callable

from .errors import SpecError
from .spec import FullAttentionSpec, GroupSpec, KVCacheSpec, LayerSpec, MLASpec

#: DeepSeek-V4 pages are padded to multiples of 576 B.
DSV4_ALIGN = 576


def _c4_attn(name: str) -> MLASpec:
    """C4 attention: 256 tokens / 4 = 64 stored x 584 B = 37,376 B, padded to 37,440 B."""
    return MLASpec(
        name=name,
        block_size=256,
        head_size=512,
        cache_dtype="fp8_ds_mla",
        compress_ratio=4,
        alignment=DSV4_ALIGN,
    )


def _c128_attn(name: str) -> MLASpec:
    """C128 attention: 256 / 128 = 2 stored x 584 B = 1,168 B, padded to 1,728 B."""
    return MLASpec(
        name=name,
        block_size=256,
        head_size=512,
        cache_dtype="fp8_ds_mla",
        compress_ratio=128,
        alignment=DSV4_ALIGN,
    )


def _c4_indexer(name: str) -> MLASpec:
    """C4 indexer: 64 stored x 132 B (uint8) = 8,448 B, padded to 8,640 B."""
    return MLASpec(
        name=name, block_size=256, head_size=132, dtype="uint8", compress_ratio=4, alignment=DSV4_ALIGN
    )


def _swa(name: str) -> MLASpec:
    """Sliding-window MLA with 64-token blocks: 64 x 584 B = 37,376 B, padded to 37,440 B."""
    return MLASpec(name=name, block_size=64, head_size=512, cache_dtype="fp8_ds_mla", alignment=DSV4_ALIGN)


def dsv4_test(num_blocks: int = 100) -> KVCacheSpec:
    """The regression geometry of vLLM #50276: four C4 layers in one 149,760 B row."""
    layers = tuple(_c4_attn(f"model.layers.{i}.self_attn") for i in range(4))
    return KVCacheSpec(
        num_blocks=num_blocks, layout="packed", groups=(GroupSpec("mla", layers, kernel_block_size=256),)
    )


def dsv4(num_blocks: int = 100) -> KVCacheSpec:
    """A realistic DeepSeek-V4 mix: 46 overlaid groups, 181 rows in one 149,760 B block row.

    11 groups of (C4 attention, C4 indexer) x 2, 10 groups of 4 C128 attention layers, and
    25 groups of sliding-window MLA (24 of 4 layers, one of 1).
    """
    groups: list[GroupSpec] = []
    li = 0

    def nxt(make: Callable[[str], MLASpec], tag: str) -> LayerSpec:
        nonlocal li
        li += 1
        return make(f"model.layers.{li - 1}.{tag}")

    for g in range(11):
        groups.append(
            GroupSpec(
                f"c4.{g}",
                (
                    nxt(_c4_attn, "attn"),
                    nxt(_c4_indexer, "indexer"),
                    nxt(_c4_attn, "attn"),
                    nxt(_c4_indexer, "indexer"),
                ),
            )
        )
    for g in range(10):
        groups.append(GroupSpec(f"c128.{g}", tuple(nxt(_c128_attn, "attn") for _ in range(4))))
    for g in range(25):
        count = 4 if g < 24 else 1
        groups.append(
            GroupSpec(f"swa.{g}", tuple(nxt(_swa, "swa") for _ in range(count)), kernel_block_size=64)
        )
    return KVCacheSpec(num_blocks=num_blocks, layout="packed", groups=tuple(groups))


def indexer_first(num_blocks: int = 100) -> KVCacheSpec:
    """vLLM 0.28's overlay bug geometry: a C4 indexer group listed before a C4 attention group.

    Both start at byte 0 of every 37,440 B block row; a zeroer that deduplicates rows by
    address keeping the first span (8,448 B) leaves 28,928 B of every attention page stale.
    """
    return KVCacheSpec(
        num_blocks=num_blocks,
        layout="packed",
        groups=(
            GroupSpec("indexer", (_c4_indexer("model.layers.0.indexer"),), kernel_block_size=256),
            GroupSpec("attn", (_c4_attn("model.layers.0.self_attn"),), kernel_block_size=256),
        ),
    )


def llama_8b(num_blocks: int = 64) -> KVCacheSpec:
    """Llama-3-8B: 32 full-attention layers, 8 KV heads x 128, bf16, 16-token blocks, K/V halves."""
    layers = tuple(
        FullAttentionSpec(
            name=f"model.layers.{i}.self_attn",
            block_size=16,
            num_kv_heads=8,
            head_size=128,
            dtype="bfloat16",
            kv_split=True,
        )
        for i in range(32)
    )
    return KVCacheSpec(num_blocks=num_blocks, layout="layer_major", groups=(GroupSpec("attn", layers),))


PRESETS: dict[str, Callable[[], KVCacheSpec]] = {
    "dsv4-test": dsv4_test,
    "dsv4": dsv4,
    "llama-8b": llama_8b,
}


def preset(name: str) -> KVCacheSpec:
    """The preset spec called ``name``."""
    if name not in PRESETS:
        raise SpecError(
            f"preset = {name!r}: unknown; valid: {', '.join(PRESETS)}", field="preset", value=name
        )
    return PRESETS[name]()
