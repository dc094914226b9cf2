"""MiMo-V2 (Xiaomi's MiMo-V2-Flash; vLLM 0.33's ``mimo_v2.py``): two attentions of different shapes.

- Layer ``i`` is sliding-window attention when ``hybrid_layer_pattern[i] == 1`` (vLLM's
  ``is_compressed_softmax_layer``), else full attention; ``layer_types`` is not read.
- A sliding layer takes ``swa_num_attention_heads``, ``swa_num_key_value_heads``, ``swa_head_dim``
  and ``swa_v_head_dim`` (absent: ``swa_head_dim``), window ``sliding_window_size``; a full layer
  ``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` and ``v_head_dim`` (transformers'
  ``MiMoV2FlashConfig`` defaults it to 128). KV heads per rank ``max(1, total // tp)``.
- V heads narrower than K (``*_v_head_dim < *_head_dim``) run on vLLM's ``*_DIFFKV`` backends, whose
  kernel blocks are their parents' (FlashAttention, Triton: multiples of 16); a page is
  ``block * kv_heads * (head + v_head) * dtype bytes``.
- The two pages differ, so vLLM 0.33 unifies them (``unify_kv_cache_spec_page_size``; the DIFFKV
  backends declare no layout, so the mixed heads resolve to ``LBNHC``, which is not block-outermost,
  and the packing path is not taken): a smaller page that divides the largest takes a block that many
  times larger, another is padded to it. Then the layers split into groups as any sliding-window
  model's (:func:`.grouping.vllm_groups`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from .attention import Attention
from .base import Ctx
from .config import Config, resolve_kv_dtype
from .grouping import vllm_groups


def _attention(cfg: Config, tp: int, pre: str) -> tuple[Attention, int]:
    """One kind's heads (per rank) and head size, and its V head size (vLLM's ``MiMoV2Attention``)."""
    what = "a sliding-window layer's" if pre else "a full-attention layer's"
    heads = cfg.req_int(f"{pre}num_attention_heads", f"{what} query heads")
    if heads % tp:
        raise spec_error(cfg.field(f"{pre}num_attention_heads"), heads, f"not divisible by tp = {tp}")
    total = cfg.req_int(f"{pre}num_key_value_heads", f"{what} KV heads")
    if total >= tp and total % tp or total < tp and tp % total:
        why = f"not divisible by tp = {tp}" if total >= tp else f"tp = {tp} is not a multiple of it"
        raise spec_error(cfg.field(f"{pre}num_key_value_heads"), total, why)
    if (heads // tp) % max(1, total // tp):  # vLLM's Attention asserts num_heads % num_kv_heads == 0 per
        # rank: 16 KV heads beside 8 query heads were planned (issue 25, twentieth pass)
        why = f"the {heads // tp} query heads per rank are not a multiple of its {max(1, total // tp)}"
        why += " (vLLM's Attention asserts it)"
        raise spec_error(cfg.field(f"{pre}num_key_value_heads"), total, why)
    head = cfg.req_int(f"{pre}head_dim", f"{what} K head size")
    if pre:  # vLLM: getattr(config, "swa_v_head_dim", None), None meaning the K head size
        v_head = cfg.opt_int("swa_v_head_dim") or head
    else:
        v_head = cfg.req_int("v_head_dim", f"{what} V head size (MiMoV2FlashConfig's default is 128)")
    return Attention(heads, max(1, total // tp), head), v_head


def _pattern(cfg: Config, n: int) -> list[bool]:
    """Which layers slide: ``hybrid_layer_pattern[i] == 1`` (0 or 1 each; vLLM reads the first n)."""
    marks = cfg.req_list("hybrid_layer_pattern", "1 marks a sliding-window layer, 0 a full one", n, int)
    for i, m in enumerate(marks):
        if m not in (0, 1):
            where = f"{cfg.field('hybrid_layer_pattern')}[{i}]"
            raise spec_error(where, m, "must be 0 (full) or 1 (sliding)")
    return [m == 1 for m in marks]


def unify_pages(layers: list[FullAttentionSpec], notes: list[str]) -> list[FullAttentionSpec]:
    """vLLM's ``unify_kv_cache_spec_page_size``: every page made the largest one."""
    top = max(x.page for x in layers)
    out: list[FullAttentionSpec] = []
    done: set[tuple[str, int]] = set()
    for x in layers:
        page = x.page
        if page == top:
            out.append(x)
            continue
        if top % page == 0:
            y = replace(x, block_size=x.block_size * (top // page))
            how = f"{y.block_size}-token blocks"
        else:
            y = replace(x, padded_page=top)
            how = f"pages padded to {top:,} B"
        if (x.kind, page) not in done:
            done.add((x.kind, page))
            notes.append(
                f"{'sliding' if isinstance(x, SlidingWindowSpec) else 'full'}-attention pages of {page:,} B "
                f"under the largest ({top:,} B): vLLM 0.33 gives them {how} (unify_kv_cache_spec_page_size)"
            )
        out.append(y)
    return out


def mimo_v2_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    n = c.num_layers()
    slides = _pattern(c.cfg, n)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    kinds: dict[bool, tuple[Attention, int]] = {False: _attention(c.cfg, c.tp, "")} if not all(slides) else {}
    if any(slides):
        kinds[True] = _attention(c.cfg, c.tp, "swa_")
    if any(v != att.head_size for att, v in kinds.values()):
        if c.attention_backend is not None:
            why = "MiMo-V2's layers with V heads of another size run on vLLM's *_DIFFKV backends, not modeled"
            raise spec_error("attention_backend", c.attention_backend, why)
        c.notes.append(
            "V heads of another size than K: vLLM runs FLASH_ATTN_DIFFKV (TRITON_ATTN_DIFFKV without FA3), "
            "blocks as FlashAttention's"
        )
    bs = c.block(c.backend(mla=False).block_size)
    window = c.cfg.req_int("sliding_window_size", "the sliding layers' window") if any(slides) else 0
    layers: list[FullAttentionSpec] = []
    for i, slide in enumerate(slides):
        att, v = kinds[slide]
        full = FullAttentionSpec(
            name=c.name(i, "self_attn.attn"),
            block_size=bs,
            num_kv_heads=att.kv_heads,
            head_size=att.head_size,
            dtype=kv,
            head_size_v=None if v == att.head_size else v,
        )
        fields = {f.name: getattr(full, f.name) for f in dataclasses.fields(full)}
        layers.append(SlidingWindowSpec(**fields, window=window) if slide else full)
    bucket: dict[str, list[LayerSpec]] = {}
    for layer, slide in zip(unify_pages(layers, c.notes), slides, strict=True):
        c.add("sliding" if slide else "full", layer, bucket)
    return vllm_groups(list(bucket.items())), kv, bs
