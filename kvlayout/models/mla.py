"""Multi-head latent attention: DeepSeek V2, V3 and V3.2 (vLLM 0.33), and ``generic_mla``: the MLA
architectures whose cache vLLM 0.33's own model construction shows to be DeepSeek-V2's (one latent
head per layer under the layer names of :mod:`.vllm_checked`; tests/test_models_generic.py).

The cache holds one latent head of ``kv_lora_rank + qk_rope_head_dim`` per token, on every
rank. DeepSeek-V3.2 adds an indexer cache (``index_head_dim + index_head_dim // 128 * 4`` bytes per
token) on each layer its IndexCache schedule runs an indexer on (every layer without one) and
stores an fp8 cache as ``fp8_ds_mla``, 656 B per token (512 fp8 + 4 fp32 scales + 64 bf16 RoPE
values). Every layer is an MLA spec, so the model is one group. The sparse backends pad a block
stride to whole token rows or 64-token kernel blocks (their ``customize_spec``), but none declares a
layout, so vLLM 0.33 resolves ``LBNHC`` and pads each layer's stride alone; a page of a whole number of
64-token blocks already is one, so the plan takes the sum of the pages, vLLM's bytes per block (a
block-outermost layout, which vLLM takes only under ``VLLM_KV_CACHE_LAYOUT``, would round the row up).
Multi-token-prediction layers (``num_nextn_predict_layers``) get no cache: vLLM allocates
them only with speculative decoding.
"""

from __future__ import annotations

from ..errors import spec_error
from ..spec import FP8_DS_MLA, GroupSpec, LayerSpec, MLASpec
from .base import Ctx
from .config import MAX_CONFIG_INT, resolve_kv_dtype
from .vllm_checked import GENERIC_ATTENTION


def _not_null(c: Ctx, keys: tuple[str, ...]) -> None:
    """DeepSeek-V3.2's fields vLLM 0.33 reads by ``hasattr`` / ``getattr`` with a default: a ``null``
    written is not absent there (``DeepseekV2MLAAttention``: an indexer with no top-k, ``layer % None``),
    and the model fails to build."""
    for key in keys:
        if key in c.cfg.data and c.cfg.data[key] is None:
            why = (
                "vLLM 0.33 reads the field wherever it is written (hasattr/getattr, not a default) and "
                "fails to build DeepSeek-V3.2's indexer on null: write an integer, or leave the field out"
            )
            raise spec_error(c.cfg.field(key), None, why)


def mla_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    n = c.num_layers()
    heads = c.cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(c.cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    rank = c.cfg.req_int("kv_lora_rank", "the MLA latent (head size kv_lora_rank + qk_rope_head_dim)")
    rope = c.cfg.req_int("qk_rope_head_dim", "the MLA RoPE part (head size kv_lora_rank + qk_rope_head_dim)")
    head = rank + rope
    c.mla_dims = (rank, rope)
    v32 = c.family == "deepseek_v32" or "index_topk" in c.cfg.data
    _not_null(c, ("index_topk", "index_topk_freq", "index_skip_topk_offset") if v32 else ())
    raw = "auto" if c.kv_cache_dtype is None else c.kv_cache_dtype
    nope = c.cfg.opt_int("qk_nope_head_dim", lo=0)
    r = c.backend(mla=True, sparse=v32, qk_nope_head_dim=1 if nope is None else nope)
    bs = c.block(r.block_size)
    layers: list[LayerSpec] = []
    if v32:
        if c.top.data["architectures"][0] == "DeepseekV32ForCausalLM":
            # vLLM 0.33's config hook asserts it (DeepseekV32ForCausalLM.verify_and_update_config: its layers
            # build the indexer where hasattr(config, "index_topk")); its config class fills none
            c.cfg.req_int("index_topk", "vLLM 0.33 asserts it for DeepseekV32ForCausalLM")
        full = _indexer_layers(c, n)
        idx_dim = c.cfg.req_int(
            "index_head_dim", "the DeepSeek-V3.2 indexer key (index_head_dim + 4 B per 128)"
        )
        idx_bytes = idx_dim + idx_dim // 128 * 4
        fp8 = raw.startswith("fp8")
        kv = FP8_DS_MLA if fp8 else resolve_kv_dtype(raw, c.dtype)
        ds_bytes = rank + rank // 128 * 4 + 2 * rope  # 512 fp8 + 16 B scales + 128 B bf16 RoPE = 656
        for i in range(n):
            if i in full:  # a layer the schedule shares has no indexer, and no indexer cache
                idx_name = c.name(i, "self_attn.indexer.k_cache")
                idx = MLASpec(name=idx_name, block_size=bs, head_size=idx_bytes, dtype="uint8")
                c.kinds[idx.name] = "indexer"
                layers.append(idx)
            if fp8:
                att = MLASpec(
                    name=c.name(i, "self_attn.attn"),
                    block_size=bs,
                    head_size=head,
                    cache_dtype=FP8_DS_MLA,
                    token_bytes=ds_bytes,
                )
            else:
                att = MLASpec(
                    name=c.name(i, "self_attn.attn"),
                    block_size=bs,
                    head_size=head,
                    dtype=kv,
                )
            c.kinds[att.name] = "mla"
            layers.append(att)
    else:
        kv = resolve_kv_dtype(raw, c.dtype)
        arch = c.top.data["architectures"][0]
        tail = GENERIC_ATTENTION[arch][1] if c.family == "generic_mla" else "self_attn.attn"
        for i in range(n):
            att = MLASpec(name=c.name(i, tail), block_size=bs, head_size=head, dtype=kv)
            c.kinds[att.name] = "mla"
            layers.append(att)
    return (GroupSpec("mla", tuple(layers)),), kv, bs


def _indexer_layers(c: Ctx, n: int) -> frozenset[int]:
    """The backbone layers that hold an indexer cache under DeepSeek-V3.2's IndexCache schedule, as vLLM 0.33
    builds them (``DeepseekV2MLAAttention``): an ``index_topk_pattern`` names each layer ``F`` (full: its
    own indexer) or ``S`` (shared: it reuses an earlier layer's top-k and has no indexer; layers past the
    pattern are full); without one, layer ``i`` is full where ``max(i - offset + 1, 0)`` is a multiple of
    ``index_topk_freq`` (default 1: every layer), ``offset`` being ``index_skip_topk_offset`` (default 2)."""
    if c.cfg.has("index_topk_pattern"):
        pattern = c.cfg.data["index_topk_pattern"]
        if not isinstance(pattern, (str, list)):
            raise spec_error(
                c.cfg.field("index_topk_pattern"), pattern, "must be a string of F and S per layer"
            )
        return frozenset(i for i in range(n) if i >= len(pattern) or pattern[i] != "S")
    freq = c.cfg.opt_int("index_topk_freq")
    offset = c.cfg.opt_int("index_skip_topk_offset", lo=-MAX_CONFIG_INT)
    freq = 1 if freq is None else freq
    offset = 2 if offset is None else offset
    return frozenset(i for i in range(n) if max(i - offset + 1, 0) % freq == 0)
