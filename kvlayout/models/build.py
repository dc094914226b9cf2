"""vLLM's reading of a config: the family rule applied to the resolved config (:func:`build`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import spec_error
from ..spec import KVCacheSpec
from .attention import CAUSAL_LM_TYPES, WRAPPERS
from .backends import check_device
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
    load_config,
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


def _class_of_model_type(top: Config, arch: str) -> None:
    """Refuse, for the reader as written, a ``model_type`` that selects another architecture's config
    class: transformers' AutoConfig, hence vLLM 0.33 (``HFConfigParser.parse``), builds the config with the
    class ``model_type`` names, whose defaults differ (``MistralConfig``'s ``sliding_window`` 4096 where
    ``LlamaConfig`` has none), while vLLM builds the model ``architectures`` names. The json reader holds
    only the architecture's rules; the default reader reads it through that class (issue 25, sixteenth
    pass, F3)."""
    mt = top.data.get("model_type")
    own = [t for t, a in CAUSAL_LM_TYPES.items() if a == arch]
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
    groups, kv, bs = family_rule(family)(c)
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
