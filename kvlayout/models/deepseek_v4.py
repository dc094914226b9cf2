"""DeepSeek-V4's compressed, sliding-window and state caches (vLLM 0.33).

Rules from ``vllm/models/deepseek_v4/attention.py`` and ``compressor.py``,
``vllm/v1/attention/backends/mla/sparse_swa.py`` and FlashMLA's fp8_ds_mla layout:
``compress_ratios[i]`` (``0``/``1``: window only, ``4``, ``128``) per layer. Every layer has a
sliding-window MLA cache (``swa_cache``, 64-token blocks); a compressed layer has its
compressed cache (256-token blocks) and its compressor state (``2 * coff * head_dim``
float32 values per token, ``coff = 2`` for ratio 4, blocks of 4 or 8 tokens); a ratio-4
layer adds the indexer cache (``index_head_dim + index_head_dim // 128 * 4`` bytes per
stored token) and the indexer's compressor state. Every page is padded to 576 B; the cache
is fp8 only, 584 B per stored token.

The pages differ per kind, so vLLM groups them with its block-outermost packer
(:func:`~.grouping.vllm_packed_groups`): layers fall into uniform-type buckets (the window
cache; the compressed caches with the indexer, one block size; the ratio-4 compressor
states, window 8; the ratio-128 ones, window 128). The fixture gives vLLM's five groups
(window cache 22 + 21, compressed 62, ratio-4 states 42, ratio-128 states 20) and its
1,002,240 B per block; tests/test_models.py checks both against vLLM's
``get_kv_cache_groups``. Not modeled: vLLM's cap on Mamba and circular-buffer state buckets
(no DeepSeek-V4 bucket is one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import spec_error
from ..spec import FP8_DS_MLA, GroupSpec, LayerSpec, MLASpec
from .backends import BACKENDS
from .base import Ctx
from .grouping import vllm_packed_groups

#: vLLM's tokens per block of DeepSeek-V4's compressed layers.
DSV4_BLOCK_SIZE = 256
#: DeepSeek-V4's fixed blocks: the sliding-window cache and the compressor states (tokens).
DSV4_SWA_BLOCK_SIZE = 64
DSV4_STATE_BLOCK_SIZE = {4: 4, 128: 8}
#: FlashMLA's page alignment for DeepSeek-V4 (bytes).
DSV4_ALIGN = 576


#: DeepSeek-V4's layers hold up to five caches each (window, compressed, state, indexer, its state):
#: its bound on layers is the general one over four, so that planning stays within about a second
#: (10,000 layers, 38,178 caches, took 2.9-4.3 s to plan and prove; issue 25).
DSV4_MAX_LAYERS = 2_500


def dsv4_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    n = c.num_layers()
    if n > DSV4_MAX_LAYERS:
        why = f"must be at most {DSV4_MAX_LAYERS:,} for DeepSeek-V4 (up to five caches a layer)"
        raise spec_error(c.cfg.field("num_hidden_layers"), n, why)
    heads = c.cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(c.cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    ab = c.attention_backend  # vLLM's _select_dsv4_attn_cls: FlashMLA unless FlashInfer's DSv4 path is named
    if ab is not None and not (isinstance(ab, str) and ab in (*BACKENDS, "FLASHMLA_SPARSE_DSV4")):
        why = (
            "valid: FLASHMLA_SPARSE_DSV4 or a name in kvlayout.models.backends.BACKENDS (vLLM 0.33 gives "
            "DeepSeek-V4 the FlashMLA cache modeled here for each); FlashInfer's DSv4 cache is not modeled"
        )
        raise spec_error("attention_backend", ab, why)
    raw = "auto" if c.kv_cache_dtype is None else c.kv_cache_dtype
    if raw != "auto" and not raw.startswith("fp8"):
        raise spec_error(
            "kv_cache_dtype", c.kv_cache_dtype, "DeepSeek-V4 has only an fp8 KV cache (fp8_ds_mla) in vLLM"
        )
    head = c.cfg.req_int("head_dim", "the MLA head (NoPE + RoPE)")
    rope = c.cfg.req_int("qk_rope_head_dim", "the RoPE part of the MLA head")
    if rope >= head:
        raise spec_error(c.cfg.field("qk_rope_head_dim"), rope, f"must be below head_dim {head}")
    nope = head - rope
    token = nope + 2 * rope + nope // 64 + 1  # fp8 NoPE, bf16 RoPE, UE8M0 scales, 1 pad: 584
    tb = None if token == 584 else token
    c.cfg.req_int("sliding_window", "the window of every layer's sliding-window cache")
    written = c.cfg.req_list("compress_ratios", "one compression ratio per layer", n, int)
    for i, r in enumerate(written):
        if r not in (0, 1, 4, 128):  # checked as written: a negative ratio is not "window only"
            raise spec_error(
                f"{c.cfg.field('compress_ratios')}[{i}]", r, "valid: 0 or 1 (window only), 4, 128"
            )
    ratios = [max(1, r) for r in written]
    bs = c.block(DSV4_BLOCK_SIZE)
    for r in sorted(set(ratios) - {1}):
        if bs % r:
            raise spec_error("block_size", bs, f"must be a multiple of the compression ratio {r}")
    idx_dim = c.cfg.req_int("index_head_dim", "the indexer key of ratio-4 layers") if 4 in ratios else 0

    def mla(name: str, block: int, ratio: int | None = None) -> MLASpec:
        return MLASpec(
            name=name,
            block_size=block,
            head_size=head,
            cache_dtype=FP8_DS_MLA,
            compress_ratio=ratio,
            token_bytes=tb,
            alignment=DSV4_ALIGN,
        )

    def state(name: str, ratio: int, dim: int) -> MLASpec:
        coff = 2 if ratio == 4 else 1
        return MLASpec(
            name=name,
            block_size=DSV4_STATE_BLOCK_SIZE[ratio],
            head_size=2 * coff * dim,
            dtype="float32",
            alignment=DSV4_ALIGN,
        )

    bucket: dict[str, list[LayerSpec]] = {}
    for i, r in enumerate(ratios):
        a = c.name(i, "attn")
        if r == 4:
            c.add(
                "c4_indexer",
                MLASpec(
                    name=f"{a}.indexer.k_cache",
                    block_size=bs,
                    head_size=idx_dim + idx_dim // 128 * 4,
                    dtype="uint8",
                    compress_ratio=4,
                    alignment=DSV4_ALIGN,
                ),
                bucket,
            )
            c.add("c4_indexer_state", state(f"{a}.indexer.compressor.state_cache", 4, idx_dim), bucket)
        c.add("swa", mla(f"{a}.swa_cache", DSV4_SWA_BLOCK_SIZE), bucket)
        if r > 1:
            c.add(f"c{r}", mla(a, bs, r), bucket)
            c.add(f"c{r}_state", state(f"{a}.compressor.state_cache", r, head), bucket)
    # vLLM's uniform-type buckets (named here): one spec type, block size and window each; the
    # window of a compressor state is coff * ratio (8 for ratio 4, 128 for ratio 128)
    window = c.cfg.data["sliding_window"]
    compressed = ("compressed", "full", bs, None)
    c4_states = ("c4_states", "sliding", DSV4_STATE_BLOCK_SIZE[4], 8)
    keys = {
        "swa": ("swa", "sliding", DSV4_SWA_BLOCK_SIZE, window),
        "c4": compressed,
        "c128": compressed,
        "c4_indexer": compressed,
        "c4_state": c4_states,
        "c4_indexer_state": c4_states,
        "c128_state": ("c128_states", "sliding", DSV4_STATE_BLOCK_SIZE[128], 128),
    }
    return vllm_packed_groups([(keys[c.kinds[x.name]], x) for x in model_order(c, bucket)]), FP8_DS_MLA, bs


def model_order(c: Ctx, bucket: Mapping[str, Sequence[LayerSpec]]) -> list[LayerSpec]:
    """The layers of ``bucket`` in the order the model creates them (``c.kinds`` keeps it)."""
    by_name = {x.name: x for layers in bucket.values() for x in layers}
    return [by_name[n] for n in c.kinds if n in by_name]
