"""Kimi-Linear (``KimiLinearForCausalLM``: moonshotai/Kimi-Linear-48B-A3B-Instruct) by vLLM 0.33's
``vllm/models/kimi_k3`` (the CUDA build, ``nvidia/model.py``: ``KimiDecoderLayer``).

- Layer ``i`` (``model.layers.{i}.self_attn``) is Kimi delta attention (KDA, linear attention) where
  ``i + 1`` is in ``linear_attn_config.kda_layers`` (1-based; ``KimiLinearConfig.is_kda_layer``), else MLA
  (``MultiHeadLatentAttention``); ``full_attn_layers`` is only asserted non-null by the config class.
- KDA (``KimiGatedDeltaNetAttention``): a Mamba-like state per block, conv ``(k - 1, 3 * heads * head_dim /
  tp)`` in the model dtype and recurrent ``(heads / tp, head_dim, head_dim)`` in float32
  (``MambaStateShapeCalculator.kda_state_shape``; the layer's ``get_state_dtype`` passes no ssm dtype, so
  ``kda_state_dtype`` gives float32 whatever ``mamba_ssm_cache_dtype`` says); ``heads``, ``head_dim``,
  ``k`` from ``linear_attn_config`` (``num_heads``, ``head_dim``, ``short_conv_kernel_size``).
- MLA: one latent head of ``kv_lora_rank + qk_rope_head_dim`` on every rank (``num_attention_heads`` split
  by tp), NoPE only (``mla_use_nope`` asserted), the MLA backend vLLM picks (:mod:`.backends`).
- Block size (``Platform.update_block_size_for_backend``, then ``_align_hybrid_block_size``): the MLA
  backend's block (or the user's), then, because the model is hybrid and uses MLA, ``unit = max(the
  backend's smallest kernel block, that block, 128)`` and the block becomes ``unit * ceil(state / (unit *
  token bytes))`` rounded to the kernel block, ``token bytes`` one MLA token; the KDA page is padded to the
  MLA page. The alignment's state takes the model's ``get_mamba_state_dtype_from_config``, which does pass
  ``mamba_ssm_cache_dtype`` (bfloat16 there, float32 in the layer: where the padded page then cannot hold
  the layer's state vLLM fails, and kvlayout refuses). With no MLA layer vLLM finds no attention backend
  and aligns nothing: the cache's block (16 tokens unless given), states unpadded.
- Prefix caching is on by default on a GPU (``mamba_cache_mode`` ``align``); KDA layers export no prefill
  checkpoints, so nothing more aligns the block. Groups as any hybrid's (:func:`.grouping.vllm_groups`).
- Multi-token-prediction layers get no cache: only with speculative decoding.

AliceAI (``AliceAIForCausalLM``: yandex/AliceAI-Foundation-80B-A3B, vLLM 0.33's ``alice_ai.py``) builds the
same KDA layer (``KimiGatedDeltaNetAttention``, ``model.layers.{i}.linear_attn``) on the ``linear_attention``
layers of ``layer_types``, from ``linear_num_key_heads`` of ``linear_key_head_dim`` (the value heads and size
must equal them: vLLM raises) and ``linear_conv_kernel_dim``, beside Qwen3-Next's gated standard attention
(``model.layers.{i}.self_attn.attn``) on the ``full_attention`` ones: a standard hybrid, aligned by
:func:`.hybrid.hybrid_family` (:func:`alice_ai_layers` gives its layers and state). Its alignment's state
dtype, as its layers', takes no ssm dtype: the recurrent state is float32 whatever ``mamba_ssm_cache_dtype``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import spec_error
from ..spec import DTYPE_SIZES, GroupSpec, LayerSpec, MambaSpec, MLASpec
from ..validate import is_int
from .backends import VLLM_BLOCK_SIZE
from .base import Ctx
from .config import Config, resolve_kv_dtype
from .grouping import vllm_groups

MODEL_TYPE = "kimi_linear"
#: vLLM 0.33's MLA hybrid alignment: the block a multiple of 128 tokens (TRTLLM / FlashInfer MLA decode)
MLA_HYBRID_UNIT = 128
#: ssm dtypes vLLM 0.33's ``kda_state_dtype`` takes (``auto`` is float32); others raise ValueError
KDA_SSM_DTYPES = ("auto", "float32", "bfloat16")


def _linear_config(c: Ctx) -> Config:
    """``linear_attn_config`` as vLLM's KimiLinearConfig holds it (a JSON object, asserted keys)."""
    cfg = c.cfg
    raw = cfg.data.get("linear_attn_config")
    where = cfg.field("linear_attn_config")
    if raw is None:
        raise cfg.missing(
            "linear_attn_config",
            "vLLM 0.33's block alignment reads its num_heads (a TypeError without it)",
        )
    if not isinstance(raw, Mapping):
        raise spec_error(where, raw, "must be a JSON object (vLLM 0.33 reads its keys)")
    return Config(raw, where, model_type=MODEL_TYPE, notes=c.notes, final=cfg.final)


def kda_layers(c: Ctx, lin: Config, n: int) -> list[bool]:
    """Per layer, whether it is KDA: ``i + 1`` in ``kda_layers`` (``KimiLinearConfig.is_kda_layer``)."""
    if not lin.has("kda_layers"):
        raise lin.missing("kda_layers", "the 1-based KDA layers (KimiLinearConfig asserts it)")
    raw = lin.data["kda_layers"]
    if not isinstance(raw, list):
        raise spec_error(lin.field("kda_layers"), raw, "must be a list of 1-based layer numbers")
    for j, x in enumerate(raw):
        if not is_int(x):  # vLLM's membership test would pass over it: a layer numbered as a string
            raise spec_error(f"{lin.field('kda_layers')}[{j}]", x, "must be an integer (a 1-based layer)")
    if not lin.has("full_attn_layers"):
        raise lin.missing("full_attn_layers", "KimiLinearConfig asserts it is written (it is not read)")
    kda = set(int(x) for x in raw)
    outside = sorted(x for x in kda if not 1 <= x <= n)
    if outside:
        c.notes.append(
            f"{lin.field('kda_layers')} lists {outside[:5]} outside 1..{n}: vLLM builds no layer for them"
        )
    full = lin.data["full_attn_layers"]
    rest = [i + 1 for i in range(n) if i + 1 not in kda]
    if not isinstance(full, list) or sorted(x for x in full if is_int(x)) != rest or len(full) != len(rest):
        c.notes.append(
            f"{lin.field('full_attn_layers')} is not the layers kda_layers leaves out ({rest[:8]}...): vLLM "
            "0.33 reads only kda_layers"
        )
    return [i + 1 in kda for i in range(n)]


def _kda_state(c: Ctx, lin: Config) -> tuple[int, int]:
    """The KDA state's bytes per rank: the layer's (recurrent float32) and the alignment's (recurrent in
    ``mamba_ssm_cache_dtype``), conv in the model dtype both."""
    tp = c.tp
    heads = lin.req_int("num_heads", "the KDA heads (split by tp)")
    hdim = lin.req_int("head_dim", "the KDA head size")
    k = lin.req_int("short_conv_kernel_size", "the KDA conv state keeps short_conv_kernel_size - 1 steps")
    if heads % tp:  # KimiGatedDeltaNetAttention asserts num_heads % tp_size == 0
        raise spec_error(lin.field("num_heads"), heads, f"not divisible by tp = {tp} (vLLM asserts it)")
    if lin.data.get("use_full_rank_gate"):
        why = (
            "vLLM 0.33 builds Kimi-K3's KimiK3DeltaAttention for it, whose state kvlayout has not checked "
            "against vLLM's construction"
        )
        raise spec_error(lin.field("use_full_rank_gate"), lin.data["use_full_rank_gate"], why)
    ssm = c.mamba_ssm_cache_dtype or "auto"
    if ssm not in KDA_SSM_DTYPES:
        why = f"vLLM 0.33's kda_state_dtype raises for it (valid: {', '.join(KDA_SSM_DTYPES)})"
        raise spec_error("mamba_ssm_cache_dtype", ssm, why)
    aligned = "float32" if ssm == "auto" else ssm
    return kda_state_bytes(c, heads, hdim, k), kda_state_bytes(c, heads, hdim, k, aligned)


def _mla(c: Ctx) -> tuple[int, int, int]:
    """The MLA layers' (kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim), as vLLM's layer asserts them."""
    cfg = c.cfg
    heads = cfg.req_int("num_attention_heads", "the MLA query heads (split by tp)")
    if heads % c.tp:  # MultiHeadLatentAttention asserts num_heads % tp_size == 0
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    rank = cfg.req_int("kv_lora_rank", "the MLA latent (head size kv_lora_rank + qk_rope_head_dim)")
    rope = cfg.req_int("qk_rope_head_dim", "the MLA RoPE part (head size kv_lora_rank + qk_rope_head_dim)")
    nope = cfg.req_int("qk_nope_head_dim", "the MLA backend vLLM picks depends on it", lo=0)
    cfg.req_int("v_head_dim", "KimiDecoderLayer asserts it for its MLA layers")
    use_nope: Any = cfg.data.get("mla_use_nope")
    if use_nope is not True:  # KimiDecoderLayer: assert mla_use_nope ("NoPE-only"); the class default False
        raise spec_error(cfg.field("mla_use_nope"), use_nope, "vLLM 0.33 asserts it is true for MLA layers")
    return rank, rope, nope


def kimi_linear_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    """KDA states and MLA layers, the block aligned as vLLM aligns an MLA hybrid's (module docstring)."""
    mt = c.top.data.get("model_type")
    if mt != MODEL_TYPE:
        why = f"vLLM 0.33 reads Kimi-Linear with its own KimiLinearConfig (model_type {MODEL_TYPE!r})"
        raise spec_error(c.top.field("model_type"), mt, why)
    n = c.num_layers()
    lin = _linear_config(c)
    is_kda = kda_layers(c, lin, n)
    state, aligned_state = _kda_state(c, lin)
    mla = None if all(is_kda) else _mla(c)
    return _mla_hybrid(c, is_kda, state, aligned_state, mla, "self_attn")


def _mla_hybrid(
    c: Ctx,
    is_kda: list[bool],
    state: int,
    aligned_state: int,
    mla: tuple[int, int, int] | None,
    mla_tail: str,
) -> tuple[tuple[GroupSpec, ...], str, int]:
    """KDA states (``model.layers.{i}.self_attn``) and MLA layers (``mla_tail``) of latent ``mla``
    (kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim; None: no MLA layer), the block set as vLLM's GPU
    platform sets an MLA hybrid's; ``aligned_state``: the state it aligns to, ``state``: the layers'."""
    raw = "auto" if c.kv_cache_dtype is None else c.kv_cache_dtype
    kv = resolve_kv_dtype(raw, c.dtype)
    page: int | None = None
    head = 0  # the MLA layers' latent head (kv_lora_rank + qk_rope_head_dim), where there are any
    if mla is None:  # no attention backend: vLLM's update_block_size_for_backend aligns nothing
        bs = c.block(VLLM_BLOCK_SIZE)
        c.notes.append(f"no MLA layer: vLLM aligns nothing; {bs}-token blocks, KDA states unpadded")
    else:
        rank, rope, nope = mla
        c.mla_dims, head = (rank, rope), rank + rope
        r = c.backend(mla=True, qk_nope_head_dim=nope)
        start = c.block(r.block_size)
        kernel = min(s for s, _ in r.backend.block_sizes)
        token = head * DTYPE_SIZES[kv]
        unit = max(kernel, start, MLA_HYBRID_UNIT)
        bs = unit * -(-aligned_state // (unit * token))
        bs = max(start, kernel * -(-bs // kernel))
        page = bs * token
        if state > page:  # MambaSpec.page_size_bytes asserts page_size_padded >= the state (vLLM fails)
            why = (
                f"vLLM 0.33 aligns to a {aligned_state:,} B state in it but its KDA layers keep a float32 "
                f"recurrent state ({state:,} B), which the {page:,} B page does not hold (vLLM asserts)"
            )
            raise spec_error("mamba_ssm_cache_dtype", c.mamba_ssm_cache_dtype, why)
        if c.block_size is not None and bs > start:
            c.notes.append(f"block_size {start} raised to {bs}: one MLA page must hold a KDA state")
        c.notes.append(
            f"MLA hybrid: {bs}-token blocks (a multiple of {unit}); {page:,} B MLA page >= {state:,} B KDA "
            f"state (+{page - state:,} B padding)"
        )
    bucket: dict[str, list[LayerSpec]] = {}
    for i, kda in enumerate(is_kda):
        if kda:
            padded = page if page is not None and page != state else None
            kda_layer = MambaSpec(name=c.name(i, "self_attn"), state_bytes=state, padded_page=padded)
            c.add("kda", kda_layer, bucket)
        else:
            layer = MLASpec(name=c.name(i, mla_tail), block_size=bs, head_size=head, dtype=kv)
            c.add("mla", layer, bucket)
    return vllm_groups(list(bucket.items())), kv, bs


BAILING_TYPE = "bailing_hybrid"


def bailing_moe_v3_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    """Bailing MoE V3 (vLLM 0.33's ``bailing_moe_v3.py``, read by transformers' ``BailingHybridConfig``):
    layer ``i`` is MLA (``model.layers.{i}.self_attn.attn``) where ``(i + 1) % layer_group_size == 0`` or past
    the last whole group, else KDA (``model.layers.{i}.self_attn``, ``_is_kda_layer``) of
    ``num_attention_heads`` heads of ``qk_rope_head_dim``: the class overwrites ``head_dim`` with it (the
    written one kept as ``linear_head_dim``, which vLLM 0.33 does not read); conv ``short_conv_kernel_size``.
    Both the alignment's state and the layers' are float32 recurrent (no ssm dtype is passed); blocks as
    Kimi-Linear's."""
    cfg = c.cfg
    mt = c.top.data.get("model_type")
    if mt != BAILING_TYPE:
        why = f"vLLM 0.33 reads it with transformers' BailingHybridConfig (model_type {BAILING_TYPE!r})"
        raise spec_error(c.top.field("model_type"), mt, why)
    if "use_bias" not in cfg.data:  # BailingMoeV3MLP reads config.use_bias, which the class does not define
        raise cfg.missing("use_bias", "vLLM 0.33's Bailing V3 MLP reads it (AttributeError without it)")
    n = c.num_layers()
    g = cfg.req_int("layer_group_size", "every layer_group_size-th layer (and the tail) is MLA")
    is_kda = [not ((i + 1) % g == 0 or i >= n // g * g) for i in range(n)]
    if cfg.data.get("no_kda_lora") is not True and any(is_kda):  # BailingMoeV3KimiDeltaAttention raises
        why = "vLLM 0.33's Bailing V3 KDA layers require it true (ValueError otherwise)"
        raise spec_error(cfg.field("no_kda_lora"), cfg.data.get("no_kda_lora"), why)
    heads = cfg.req_int("num_attention_heads", "the KDA heads and the MLA query heads (split by tp)")
    if heads % c.tp:  # BailingMoeV3MLAAttention asserts it; the KDA state shape divides it
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    rope = cfg.req_int("qk_rope_head_dim", "the KDA head size (the class's head_dim) and MLA's RoPE part")
    k = cfg.req_int("short_conv_kernel_size", "the KDA conv state keeps short_conv_kernel_size - 1 steps")
    written = cfg.data.get("head_dim")
    if written is not None and written != rope and not cfg.completed:
        c.notes.append(
            f"{cfg.field('head_dim')} {written!r}: transformers' BailingHybridConfig makes head_dim "
            f"qk_rope_head_dim ({rope}), and vLLM 0.33's KDA layers take that"
        )
    if c.mamba_ssm_cache_dtype not in (None, "auto", "float32"):
        said = f"mamba_ssm_cache_dtype {c.mamba_ssm_cache_dtype}: Bailing V3's KDA state stays float32"
        c.notes.append(said)
    state = kda_state_bytes(c, heads, rope, k)
    mla = None
    if not all(is_kda):
        rank = cfg.req_int("kv_lora_rank", "the MLA latent (head size kv_lora_rank + qk_rope_head_dim)")
        mla = (rank, rope, cfg.req_int("qk_nope_head_dim", "the MLA backend vLLM picks depends on it", lo=0))
    return _mla_hybrid(c, is_kda, state, state, mla, "self_attn.attn")


#: AliceAIForCausalLMConfig (vLLM 0.33's model_executor/models/config.py): fields it requires, as written
_ALICE_REQUIRED = (
    ("kda_allow_negative_eigenvalues", False),
    ("router_score_function", "sigmoid"),
    ("router_bias_correction", True),
)


def kda_state_bytes(c: Ctx, heads: int, hdim: int, k: int, ssm: str = "float32") -> int:
    """One KDA state's bytes per rank (``kda_state_shape``): conv ``(k - 1, 3 * heads * hdim / tp)`` in the
    model dtype, recurrent ``(heads / tp, hdim, hdim)`` in ``ssm``."""
    conv = (k - 1) * 3 * heads * hdim // c.tp * DTYPE_SIZES[c.dtype]
    return conv + heads // c.tp * hdim * hdim * DTYPE_SIZES[ssm]


def alice_ai_layers(c: Ctx, n: int) -> tuple[list[bool], list[bool], int, str, str]:
    """AliceAI's layers for :func:`.hybrid.hybrid_family`: per layer, has a cache and is attention; the KDA
    state's bytes, its kind and name tail (module docstring)."""
    cfg = c.cfg
    for key, want in _ALICE_REQUIRED:  # AliceAIForCausalLMConfig.verify_and_update_model_config raises
        got = cfg.data.get(key)
        if not (got is want if isinstance(want, bool) else got == want):
            raise spec_error(cfg.field(key), got, f"vLLM 0.33 serves AliceAI only with {want!r}")
    experts = cfg.req_int("num_experts", "AliceAIDecoderBlock requires sparse experts")
    if c.tp > experts:  # AliceAISparseMoeBlock raises ValueError
        raise spec_error(cfg.field("num_experts"), experts, f"vLLM 0.33's AliceAI needs at least tp = {c.tp}")
    cfg.req_int("block_attn_res_block_size", "vLLM 0.33's AliceAI requires it (a positive integer)")
    cfg.req_int("head_dim", "Qwen3NextAttention's head size (without it, hidden over the heads per rank)")
    types = cfg.req_list("layer_types", "linear_attention (KDA) or full_attention, one per layer", n, str)
    for i, t in enumerate(types):
        if t not in ("linear_attention", "full_attention"):  # AliceAIDecoderBlock raises ValueError
            raise spec_error(f"{cfg.field('layer_types')}[{i}]", t, "valid: linear_attention, full_attention")
    heads = cfg.req_int("linear_num_key_heads", "the KDA heads (split by tp)")
    hdim = cfg.req_int("linear_key_head_dim", "the KDA head size")
    for key, same in (("linear_num_value_heads", heads), ("linear_value_head_dim", hdim)):
        v = cfg.req_int(key, "AliceAI's KDA requires it equal to the key's")
        if v != same:  # _make_kimi_kda_config raises ValueError
            raise spec_error(cfg.field(key), v, f"vLLM 0.33's AliceAI KDA requires {same}, the key's")
    k = cfg.req_int("linear_conv_kernel_dim", "the KDA conv state keeps linear_conv_kernel_dim - 1 steps")
    if heads % c.tp:  # KimiGatedDeltaNetAttention asserts num_heads % tp_size == 0
        raise spec_error(cfg.field("linear_num_key_heads"), heads, f"not divisible by tp = {c.tp}")
    if c.mamba_ssm_cache_dtype not in (None, "auto", "float32"):
        c.notes.append(f"mamba_ssm_cache_dtype {c.mamba_ssm_cache_dtype}: AliceAI's KDA state stays float32")
    is_attn = [t == "full_attention" for t in types[:n]]
    return [True] * n, is_attn, kda_state_bytes(c, heads, hdim, k), "kda", "linear_attn"
