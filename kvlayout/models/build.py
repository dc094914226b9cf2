"""vLLM's reading of a config: the family rule applied to the resolved config (:func:`build`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import short, spec_error
from ..spec import FullAttentionSpec, KVCacheSpec, MLASpec
from ..validate import is_int
from .attention import CAUSAL_LM_TYPES, WRAPPERS
from .backends import (
    BACKENDS,
    DEVICES,
    SM90_FA4_FP8_PAGE,
    Resolved,
    check_device,
    flash_attn_page,
    flash_attn_refuses,
    head_size_refused,
)
from .base import Ctx, ModelSpec
from .config import (
    MODEL_DTYPES,
    READERS,
    Config,
    MissingField,
    check_kv_cache_dtype,
    check_model_type,
    check_tp,
    check_with_transformers,
    kv_quant_layers,
    load_config,
    quantized_kv_cache,
    resolve_model_dtype,
    text_config,
    through_transformers,
    transformers_installed,
    written_aliases,
)
from .families import architecture, family_rule, text_architecture
from .longcat_flash import with_model_type
from .vllm_checked import GENERIC_ATTENTION


class OtherClass(MissingField):
    """A ``model_type`` whose transformers config class is not the architecture's own (a Llama config
    with ``"model_type": "mistral"``): that class's defaults fill what config.json leaves out (the ``auto``
    reader reads it through that class)."""


def _remote(data: Mapping[str, Any]) -> bool:
    """Whether config.json names a remote-code config class (``auto_map.AutoConfig``)."""
    auto_map = data.get("auto_map")
    return isinstance(auto_map, Mapping) and "AutoConfig" in auto_map


def _known_model_type(mt: str) -> bool:
    """Whether a table of kvlayout's (read from transformers and vLLM 0.33) names ``mt``."""
    from . import config_aliases as A
    from .config import HEADS_DIVIDE_HIDDEN, REMOTE_PARENTS
    from .longcat_flash import ARCHITECTURE_MODEL_TYPES

    tables: tuple[Any, ...] = (
        CAUSAL_LM_TYPES, A.ALIASES, A.NOT_NULL, A.TEXT_TYPES, A.DEFAULTS, A.VLLM_TYPES,
        A.VLLM_TRANSFORMERS_CLASSES, A.VLLM_ALIASES, REMOTE_PARENTS, HEADS_DIVIDE_HIDDEN,
    )
    named = (*A.TEXT_TYPES.values(), *ARCHITECTURE_MODEL_TYPES.values())
    return any(mt in t for t in tables) or mt in named


def _class_of_model_type(top: Config, arch: str) -> None:
    """Refuse, for the reader as written, a ``model_type`` that selects another architecture's config
    class: transformers' AutoConfig, hence vLLM 0.33 (``HFConfigParser.parse``), builds the config with the
    class ``model_type`` names, whose defaults differ (``MistralConfig``'s ``sliding_window`` 4096 where
    ``LlamaConfig`` has none), while vLLM builds the model ``architectures`` names. The json reader holds
    only the architecture's rules; the default reader reads it through that class (issue 25, sixteenth
    pass, F3)."""
    mt = top.data.get("model_type")
    own = [t for t, a in CAUSAL_LM_TYPES.items() if a == arch]
    if own and isinstance(mt, str) and mt not in own and not _known_model_type(mt) and not _remote(top.data):
        # a type no table of kvlayout's names (issue 26, F8: "lla\x00ma" was planned as Llama): AutoConfig,
        # hence vLLM 0.33, refuses a type transformers does not know; the json reader cannot tell
        why = (
            f"{arch}'s own model_type is {own[0]!r}, and kvlayout knows no config class of this one: vLLM "
            "0.33 builds the config with the class model_type names (transformers' AutoConfig refuses an "
            "unknown one)"
        )
        field = top.field("model_type")
        hint = "; reader='transformers' (or the default, auto) asks transformers' AutoConfig, as vLLM does"
        raise OtherClass(f"{field} = {short(mt)}: {why}{hint}", field=field, value=mt)
    if not own or not isinstance(mt, str) or mt in own or mt not in CAUSAL_LM_TYPES:
        return
    why = (
        f"{arch}'s own model_type is {own[0]!r}: vLLM 0.33 builds {arch} with the config class of {mt!r} "
        f"({CAUSAL_LM_TYPES[mt]}'s), whose defaults fill what config.json leaves out"
    )
    if top.final:
        raise spec_error(top.field("model_type"), mt, why)
    hint = "; reader='transformers' (or the default, auto) reads it through that class, as vLLM does"
    field = top.field("model_type")
    raise OtherClass(f"{field} = {mt!r}: {why}{hint}", field=field, value=mt)


def _only_attention(field: str, family: str, groups: tuple[Any, ...]) -> None:
    """Refuse compressed-tensors' fp8 cache where a layer is not vLLM's standard ``Attention`` (MLA, state,
    a model's own cache), or a config hook reads the cache dtype before the layers set it (Gemma 4's
    ``Gemma4Config``): vLLM's engine config keeps ``auto`` and only ``Attention.__init__`` makes it fp8."""
    other = next(
        (x for g in groups for x in g.layers if not isinstance(x, FullAttentionSpec)), None
    )
    if other is None and family != "gemma4":
        return
    what = f"layer {other.name} ({type(other).__name__})" if other is not None else "Gemma 4's config hook"
    why = (
        f"vLLM 0.33 makes only its standard Attention layers' auto cache fp8, and {what} is not one of them "
        "(or reads the cache dtype first): not modeled; pass kv_cache_dtype (--kv-cache-dtype)"
    )
    raise spec_error(field, "set", why)


def _refuse_e5m2(data: Mapping[str, Any], groups: tuple[Any, ...]) -> None:
    """vLLM 0.33 refuses an ``fp8_e5m2`` cache where the checkpoint's quant config gives an attention layer
    a KV-cache method (``_init_kv_cache_quant``; ``config.kv_quant_layers`` says which layers take one)."""
    found = kv_quant_layers(data)
    if found is None:
        return
    mla, method = found
    kinds = (FullAttentionSpec, MLASpec) if mla else (FullAttentionSpec,)
    layer = next((x for g in groups for x in g.layers if isinstance(x, kinds)), None)
    if layer is None:
        return
    why = (
        f"vLLM 0.33 refuses it with a {method} checkpoint, whose quant config gives layer {layer.name} a "
        "KV-cache method ('fp8_e5m2 kv-cache is not supported with fp8 checkpoints'); valid: auto, fp8, "
        "fp8_e4m3, or the model's dtype"
    )
    raise spec_error("kv_cache_dtype", "fp8_e5m2", why)


def _model_head_size(text: Config) -> int | None:
    """vLLM 0.33's ``ModelConfig.get_head_size`` for standard attention (``head_dim`` above 0, else
    ``hidden_size_per_head``, else ``hidden_size // num_attention_heads``); None where the fields are not
    integers (the layers' own sizes then decide nothing here)."""
    d: Mapping[str, Any] = text.data
    head: Any = d.get("head_dim")
    if is_int(head) and head > 0:
        return int(head)
    per: Any = d.get("hidden_size_per_head")
    if per is not None:
        return int(per) if is_int(per) else None
    hidden: Any = d.get("hidden_size")
    heads: Any = d.get("num_attention_heads")
    if is_int(hidden) and is_int(heads) and heads > 0:
        return int(hidden) // int(heads)
    return None


#: model types vLLM 0.33 reads as multimodal prefix LMs where the config class says nothing
#: (``ModelArchConfigConvertorBase.is_mm_prefix_lm``'s ``MM_PREFIX_LM_MODELS``)
_MM_PREFIX_LM = ("bagel", "gemma3", "molmo2", "moondream3", "paligemma")


def _user_block(c: Ctx, page: int, why: str, named: bool) -> None:
    """Refuse a block size the user set that FA4's fixed ``page`` does not divide: vLLM's backend selector
    then refuses FLASH_ATTN (``supports_block_size`` of the model's kernel sizes) and, unless it was named,
    passes over it to another backend, which kvlayout does not resolve here."""
    user = c.block(page)
    if user % page:
        what = "refuses FLASH_ATTN (block_size not supported)" if named else (
            "passes over FLASH_ATTN to a backend kvlayout does not resolve here"
        )
        raise spec_error("block_size", user, f"{why}, a block size vLLM {what}")


def _gemma4_page(c: Ctx, kv: str, heads: list[int]) -> tuple[int, str] | None:
    """Gemma 4 of differing head sizes on Hopper with an fp8 cache: vLLM 0.33's ``Gemma4Config`` keeps
    FLASH_ATTN with per-layer FA3/FA4 there (``flash_attn_version`` unset), and the model's head size is its
    largest (``ModelArchitectureConfig.from_layers`` takes the max of per-layer fields). With 512, FA4's SM90
    fp8 kernel's 64-token page is vLLM's block size (``get_preferred_block_size``), which every layer's
    unified block is a multiple of; a 512-head layer at 32 tokens (the 16 planned before) has no kernel
    block (``select_common_block_size`` raises). Other head sizes above 256 are refused (FLASH_ATTN takes an
    fp8 cache there only for 512)."""
    device = c.device or ""
    if DEVICES[device][0] != 9 or kv not in ("fp8", "fp8_e4m3") or max(heads) <= 256 or max(heads) > 512:
        return None  # elsewhere vLLM's Gemma4Config runs FA4 (or TRITON_ATTN) on every layer: MultipleOf(16)
    if max(heads) != 512 or any(256 < h < 512 for h in heads):
        why = (
            f"Gemma 4's head sizes {heads} on Hopper with an fp8 cache: vLLM 0.33's FLASH_ATTN takes it "
            "above head size 256 only for 512 (FlashAttention 4), and its choice of another backend is not "
            "modeled"
        )
        raise spec_error("kv_cache_dtype", kv, why)
    why = (
        f"Gemma 4's head sizes {heads} on Hopper with an fp8 cache: vLLM 0.33's Gemma4Config keeps "
        "FLASH_ATTN with per-layer FA3/FA4, and FlashAttention 4's SM90 fp8 kernel for the model's head size "
        f"512 fixes {SM90_FA4_FP8_PAGE}-token blocks"
    )
    if c.block_size is not None:
        _user_block(c, SM90_FA4_FP8_PAGE, why, False)
        return None
    return SM90_FA4_FP8_PAGE, why


def _check_head_sizes(c: Ctx, groups: tuple[Any, ...]) -> None:
    """FLASHINFER or TRITON_ATTN, named (or Flint's only backend), refuses a layer's head size as vLLM
    0.33's ``validate_configuration`` does (``supports_head_size``; pass 27: Flint with heads of 32, Step 1
    and Rnj-1 with heads of 16 were planned, and no GPU builds them). Chosen by vLLM's priority list, a
    backend that refuses the head size is passed over for another of the same 16-token blocks."""
    r = c.resolved
    if c.device is None or r is None or (c.attention_backend is None and c.family != "flint"):
        return
    for h in sorted({x.head_size for g in groups for x in g.layers if isinstance(x, FullAttentionSpec)}):
        bad = head_size_refused(r.backend.name, h)
        if bad is not None:
            why = f"vLLM 0.33 refuses it on {c.device}: {bad}"
            raise spec_error("attention_backend", r.backend.name, why)


def _flash_attn_page(c: Ctx, top: Config, groups: tuple[Any, ...]) -> tuple[int, str] | None:
    """FlashAttention 4's fixed page where vLLM 0.33 runs the model's attention on FLASH_ATTN with it
    (:func:`.backends.flash_attn_page`), and the note that says so; None where FLASH_ATTN takes
    ``MultipleOf(16)``. vLLM's block size is the backend's preference for the model's head size
    (``get_preferred_block_size``, ``ModelConfig.get_head_size``), and each layer's kernel page must divide
    it (``select_common_block_size``): exact where every layer is standard attention of that head size;
    refused, by name, where a layer's size or kind differs, where FLASH_ATTN named refuses a layer, or where
    a block size set is not a multiple of the page. Gemma 4: :func:`_gemma4_page`."""
    r = c.resolved
    if c.device is None or r is None:
        return None
    kv = "auto" if c.kv_cache_dtype is None else c.kv_cache_dtype
    text = c.cfg
    mt = top.data.get("model_type")
    prefix_lm = top.data.get("is_mm_prefix_lm")
    fallback = bool(text.data.get("attn_logit_softcapping")) or top.data.get("rswa_window") is not None or (
        bool(prefix_lm) if "is_mm_prefix_lm" in top.data else mt in _MM_PREFIX_LM
    )
    layers = [x for g in groups for x in g.layers]
    heads = sorted({x.head_size for x in layers if isinstance(x, FullAttentionSpec)})
    device = c.device
    if c.family == "gemma4" and len(heads) > 1:
        return _gemma4_page(c, kv, heads)
    if r.backend.name != "FLASH_ATTN":
        return None
    named = c.attention_backend == "FLASH_ATTN"
    for h in heads:
        bad = flash_attn_refuses(device, h, kv, hd256_fallback=fallback)
        if bad is not None and named:
            raise spec_error("attention_backend", "FLASH_ATTN", f"vLLM 0.33 refuses it on {device}: {bad}")
    # the model's head size: the config's, or the largest layer's where they differ (a per-layer config)
    model_heads = {_model_head_size(text), *heads[-1:]}
    pages = {h: flash_attn_page(device, h, kv, hd256_fallback=fallback) for h in {*heads, *model_heads} if h}
    if not any(pages.values()):
        return None
    other = next((x for x in layers if not isinstance(x, FullAttentionSpec)), None)
    if len(heads) != 1 or model_heads != set(heads) or other is not None:
        what = f"layer {other.name} is {type(other).__name__}" if other is not None else (
            f"the layers' head sizes {heads} against the model's {sorted(h for h in model_heads if h)}"
        )
        why = (
            f"vLLM 0.33's FLASH_ATTN on {device} takes FlashAttention 4's fixed pages here, and {what}: "
            "not modeled; name another backend with attention_backend (--attention-backend)"
        )
        raise spec_error("attention_backend", c.attention_backend or "FLASH_ATTN (vLLM's choice)", why)
    page = pages[heads[0]]
    if page is None:
        return None
    kernel = "SM90 fp8" if page == SM90_FA4_FP8_PAGE else "Blackwell head-size-256"
    why = (
        f"FLASH_ATTN runs FlashAttention 4's {kernel} kernel for head size {heads[0]}: its fixed "
        f"{page}-token pages are vLLM 0.33's block size"
    )
    if c.block_size is not None:
        _user_block(c, page, why, named)
        return None  # the page divides the block the user set: planned as it is
    return page, why


def build(
    config: Mapping[str, Any] | str | Path,
    tp: int,
    dtype: str | None,
    kv_cache_dtype: str | None,
    block_size: int | None,
    num_blocks: int,
    mamba_ssm_cache_dtype: str | None,
    *,
    device: str | None = None,
    attention_backend: str | None = None,
    reader: str = "json",
) -> tuple[ModelSpec, Ctx]:
    """vLLM's spec for ``config`` and the context it was read in. ``device`` None (tpu-inference):
    no CUDA backend is resolved, attention takes 16-token blocks and MLA 64."""
    if reader == "auto":  # as written; where config.json leaves out a field, as transformers fills it
        config = load_config(config)  # read once: a pipe (--config /dev/stdin) reads empty the second time
        args = (config, tp, dtype, kv_cache_dtype, block_size, num_blocks, mamba_ssm_cache_dtype)
        kw: dict[str, Any] = {"device": device, "attention_backend": attention_backend}
        try:
            ms, c = build(*args, **kw, reader="json")
            # vLLM reads every config through its class: what that class refuses, vLLM refuses (issue 25,
            # sixteenth pass, F2); transformers is imported only where it is installed
            skipped = check_with_transformers(config)
            if skipped is not None:
                c.notes.append(skipped)
                ms = replace(ms, notes=(*ms.notes, skipped))
            return ms, c
        except MissingField as e:
            if not transformers_installed():
                raise MissingField(
                    f"{e}; or install transformers: pip install 'kvlayout[models]'", field=e.field, value=None
                ) from None
            ms, c = build(*args, **kw, reader="transformers")
            note = f"config.json has no {e.field}: read through transformers' config class (reader auto)"
            if isinstance(e, OtherClass):
                note = (
                    f"{e.field} = {e.value!r} is another architecture's: read through that transformers "
                    "config class, as vLLM 0.33 reads it (reader auto)"
                )
            c.notes.insert(0, note)
            return replace(ms, notes=(note, *ms.notes)), c
    tp = check_tp(tp)
    if device is not None:
        device = check_device(device)
    if reader not in READERS:
        raise spec_error("reader", reader, f"valid: {', '.join(READERS)}")
    ssm = mamba_ssm_cache_dtype
    if ssm is not None and not (isinstance(ssm, str) and ssm in ("auto", *MODEL_DTYPES)):  # any model
        raise spec_error("mamba_ssm_cache_dtype", ssm, f"valid: auto, {', '.join(MODEL_DTYPES)}")
    notes: list[str] = []
    written = with_model_type(load_config(config), notes)  # vLLM's model type by architecture (LongCat)
    check_model_type(written)
    if reader == "transformers":  # refuse an unknown architecture before importing transformers (seconds)
        architecture(Config(written, "config"))
        data, completed = through_transformers(written, notes)
    else:
        data, completed = written_aliases(written, notes), False
    # the transformers reader ran: no hint to use it again
    top = Config(data, "config", completed=completed, notes=notes, final=reader == "transformers")
    arch, family = architecture(top)
    if not completed:
        _class_of_model_type(top, arch)
    text = text_config(top)
    if text is not top and not arch.endswith("ForConditionalGeneration"):
        # transformers' get_text_config hands vLLM a text model only where the class nests one; a plain
        # dict then has no num_attention_heads and vLLM refuses the config (issue 25, eighth pass)
        why = (
            f"{arch}'s config nests no text model: vLLM 0.33 refuses a config that writes one "
            "(get_hf_text_config: no num_attention_heads); remove it or name the multimodal architecture"
        )
        raise spec_error(top.field("text_config"), "an object", why)
    if text.data.get("sliding_window") == 0 and not isinstance(text.data["sliding_window"], bool):
        # vLLM's ModelConfig reads a window of 0 as none (hf_text_config.sliding_window = None)
        text.data = {**text.data, "sliding_window": None}
        notes.append("sliding_window 0: vLLM reads it as no window")
    text_arch = ""
    if family == "text_config":  # a wrapper whose language model is the text config's own architecture
        text_arch, family = text_architecture(arch, top, text)
        notes.append(f"the language model is {text_arch}, built as language_model")
    model_dtype = resolve_model_dtype(top, text, dtype, notes)
    quant = quantized_kv_cache(top.data)  # refused, naming the field, where kvlayout cannot plan it
    attention_only = ""  # the field whose fp8 only vLLM's standard Attention layers take (compressed-tensors)
    if quant is not None and kv_cache_dtype in (None, "auto") and quant[2] and family == "inkling":
        # Inkling's attention is its own layer reading the engine's cache dtype, which compressed-tensors
        # leaves auto: only vLLM's standard Attention.__init__ takes the scheme (pass 29: planned fp8, half
        # the bytes vLLM allocates)
        notes.append(f"{quant[2]}: Inkling's own attention layers do not read compressed-tensors' KV scheme")
    elif quant is not None and kv_cache_dtype in (None, "auto"):
        # vLLM 0.33: an auto cache is the checkpoint's (EngineArgs' resolve_kv_cache_dtype_string for
        # ModelOpt; Attention.__init__ for compressed-tensors); a dtype the user names wins
        kv_cache_dtype = quant[0]
        notes.append(quant[1])
        attention_only = quant[2]
    if arch == "GlmMoeDsaForCausalLM" and device == "blackwell" and kv_cache_dtype in (None, "auto"):
        # vLLM 0.33's GlmMoeDsaForCausalLM.verify_and_update_config (model_executor/models/config.py): on
        # SM10x an auto cache is fp8_e4m3
        kv_cache_dtype = "fp8_e4m3"
        notes.append("GLM-5 on blackwell: vLLM 0.33 sets an auto KV cache to fp8_e4m3 (its config hook)")
    prefix = "language_model.model.layers" if arch.endswith("ForConditionalGeneration") else "model.layers"
    if family in ("generic", "generic_sw", "generic_mla"):  # vLLM's names for it (models/vllm_checked.py)
        prefix = GENERIC_ATTENTION[text_arch or WRAPPERS.get(arch, arch)][0]
        if arch in WRAPPERS or text_arch:  # the text model is built as the wrapper's language_model
            prefix = f"language_model.{prefix}"
    if family == "deepseek_v3" and "index_topk" in text.data:  # written, even null: vLLM's hasattr
        family = "deepseek_v32"
    c = Ctx(
        top,
        text,
        family,
        tp,
        model_dtype,
        check_kv_cache_dtype(kv_cache_dtype, family),
        block_size,
        mamba_ssm_cache_dtype,
        prefix,
        notes,
        {},
        device=device,
        attention_backend=attention_backend,
        text_arch=text_arch,
    )
    noted = len(notes)
    groups, kv, bs = family_rule(family)(c)
    if attention_only:
        _only_attention(attention_only, family, groups)
    if kv_cache_dtype == "fp8_e5m2" and family != "inkling":  # Inkling's layers take no KV-cache method
        _refuse_e5m2(top.data, groups)
    fa4 = None
    if family != "inkling":  # Inkling's conv states are no attention heads; inkling.py checks FLASH_ATTN's
        _check_head_sizes(c, groups)
        fa4 = _flash_attn_page(c, top, groups)
    if fa4 is not None:  # FA4's fixed page is vLLM's preferred block size: the family planned again with it
        page, why = fa4
        del notes[noted:]
        c = replace(c, block_size=page, kinds={}, resolved=None, mla_dims=None)
        groups, kv, bs = family_rule(family)(c)
        notes.append(why)
        if c.family == "gemma4":  # vLLM runs its layers on FLASH_ATTN there, not TRITON_ATTN
            c.resolved = Resolved(BACKENDS["FLASH_ATTN"], page, why)
        elif c.resolved is not None:
            c.resolved = replace(c.resolved, block_size=page, reason=f"{c.resolved.reason}; {why}")
    spec = KVCacheSpec(num_blocks=num_blocks, layout="packed", groups=groups)
    r = c.resolved
    ms = ModelSpec(
        spec,
        arch,
        family,
        "vllm",
        tp,
        model_dtype,
        kv,
        bs,
        dict(c.kinds),
        tuple(notes),
        device or "",
        r.backend.name if r else "",
        r.reason if r else "",
    )
    return ms, c
