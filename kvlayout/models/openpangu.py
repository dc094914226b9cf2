"""openPangu Embedded and Pro-MoE-V2 (``PanguEmbeddedForCausalLM``, ``PanguProMoEV2ForCausalLM``; vLLM 0.33's
``openpangu.py``; the config class is the checkpoint's remote code), standard attention.

- ``OpenPanguDecoderLayer`` picks the attention by the fields the config holds: MLA where
  ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim`` and ``kv_lora_rank`` all are (its backend then
  depends on the model type: not checked, refused), sink attention where ``param_sink_number`` is above 0
  (``StaticSinkAttention``: sink tokens held in the pool, not modeled, refused), else standard attention
  (``OpenPanguEmbeddedAttention``), the published openPangu-Embedded-7B's, which is planned here.
- Standard attention: one per layer, named ``model.layers.{i}.self_attn.attn``; ``num_key_value_heads`` KV
  heads, per rank ``max(1, kv // tp)`` (split when more than ``tp``, else replicated), head size ``head_dim``
  where written, else ``hidden_size // num_attention_heads``.
- Layer ``i``'s window: ``interleaved_sliding_window`` where the config holds it, an integer for every layer
  or a list taken at ``i % len``; a null entry (or the field left out) takes the engine's one window
  (``sliding_window`` where ``layer_types`` is absent or all ``sliding_attention``, else none).
- vLLM's ``getattr`` default for the KV heads (the query heads) holds only where the remote class lacks the
  field: kvlayout reads it as written and refuses a config that leaves it out. ``is_causal`` false (encoder
  attention, no cache) is refused; so is a Pro-MoE-V2 without a MoE layer (vLLM raises).
- Groups as vLLM's ``get_kv_cache_groups``: one page for every layer; a bucket per distinct spec (full, or
  each window), first seen first, split as any hybrid's (:func:`.grouping.vllm_groups`).
"""

from __future__ import annotations

from typing import Any

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from ..validate import is_int
from .attention import kv_per_rank
from .base import Ctx
from .config import MAX_CONFIG_INT, Config, resolve_kv_dtype
from .grouping import vllm_groups
from .step1 import engine_window

_REMOTE = "the config class is the checkpoint's remote code, which kvlayout does not run: write it"
#: the fields whose presence makes vLLM's OpenPanguDecoderLayer build MLA attention
MLA_FIELDS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")


def _refuse_other_kinds(cfg: Config) -> None:
    """Refuse the configs whose layers vLLM builds as MLA, sink or encoder attention."""
    if all(k in cfg.data for k in MLA_FIELDS):
        why = (
            f"with {', '.join(MLA_FIELDS)} all written vLLM's OpenPanguDecoderLayer builds MLA attention, "
            "whose backend depends on the model type (is_deepseek_mla): not checked against vLLM's "
            "construction for openPangu"
        )
        raise spec_error(cfg.field("kv_lora_rank"), cfg.data["kv_lora_rank"], why)
    if "param_sink_number" in cfg.data:
        sinks = cfg.data["param_sink_number"]
        if not is_int(sinks):
            why = "must be an integer (vLLM compares it to 0)"
            raise spec_error(cfg.field("param_sink_number"), sinks, why)
        if sinks > 0:
            why = (
                "above 0 vLLM builds sink attention (StaticSinkAttention, SinkFullAttentionSpec: sink tokens "
                "held in the pool), which kvlayout does not model"
            )
            raise spec_error(cfg.field("param_sink_number"), sinks, why)
    if "is_causal" in cfg.data and cfg.data["is_causal"] is not True:
        why = "only true is planned: vLLM builds encoder-only attention otherwise (no KV cache)"
        raise spec_error(cfg.field("is_causal"), cfg.data["is_causal"], why)


def _check_moe(cfg: Config, arch: str, n: int) -> None:
    """vLLM's MoE layers read ``first_k_dense_replace`` where ``n_routed_experts`` is set; Pro-MoE-V2's
    model raises without a MoE layer."""
    experts = cfg.data.get("n_routed_experts")
    promoe = arch == "PanguProMoEV2ForCausalLM"
    if experts is None and not promoe:
        return
    dense = cfg.req_int("first_k_dense_replace", "the dense layers before the MoE ones", lo=0)
    if promoe and (experts is None or dense >= n):
        why = (
            "vLLM's Pro-MoE-V2 model needs a MoE layer (n_routed_experts set, first_k_dense_replace below "
            f"the {n} layers): it raises 'No MOE layer found' otherwise"
        )
        raise spec_error(cfg.field("n_routed_experts"), experts, why)


def _window_entry(where: str, w: Any) -> int | None:
    """One window as written: an integer of at least 1, or null (the engine's). ``true`` is a window of 1:
    vLLM's ``isinstance(w, int)`` takes a bool (its SlidingWindowSpec holds True); ``false`` would be a
    window of 0 tokens there, and stays refused."""
    if w is None:
        return None
    if w is True:
        return 1
    if not is_int(w) or not 1 <= w <= MAX_CONFIG_INT:
        raise spec_error(where, w, "a window of at least 1 token (at most 2**53), or null for the engine's")
    return int(w)


def windows(cfg: Config, n: int) -> list[int | None]:
    """Each layer's window (None: full attention), as vLLM 0.33's ``OpenPanguEmbeddedAttention`` and the
    engine give it."""
    engine = engine_window(cfg)
    key = "interleaved_sliding_window"
    if key not in cfg.data:
        return [engine] * n
    raw = cfg.data[key]
    if is_int(raw) or isinstance(raw, bool):  # vLLM's isinstance(x, int): a bool too (_window_entry)
        w = _window_entry(cfg.field(key), raw)
        return [w] * n
    if not isinstance(raw, list) or not raw:
        why = "vLLM takes an integer or a non-empty list (layer i's window at i % its length)"
        raise spec_error(cfg.field(key), raw, why)
    # only the entries a layer reads are checked (vLLM reads no other: pass 27), at most one per layer
    entries = [_window_entry(f"{cfg.field(key)}[{j}]", w) for j, w in enumerate(raw[:n])]
    out = [entries[i % len(raw)] for i in range(n)]
    return [engine if w is None else w for w in out]


def openpangu_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    _refuse_other_kinds(cfg)
    _check_moe(cfg, c.top.data["architectures"][0], n)
    heads = cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    if not cfg.has("num_key_value_heads"):
        why = "vLLM's getattr default (the query heads) holds only where the remote class lacks it"
        raise spec_error(cfg.field("num_key_value_heads"), None, f"missing; {why}; {_REMOTE}")
    total = cfg.req_int("num_key_value_heads", "the KV heads of every layer")
    kv_heads = kv_per_rank(cfg.field("num_key_value_heads"), total, heads, c.tp)
    if cfg.has("head_dim"):
        head = cfg.req_int("head_dim", "the head size")
    else:
        hidden = cfg.req_int("hidden_size", "the head size is hidden_size // num_attention_heads")
        if hidden < heads:
            why = f"below num_attention_heads = {heads}: the head size hidden_size // heads is 0"
            raise spec_error(cfg.field("hidden_size"), hidden, why)
        head = hidden // heads
    wins = windows(cfg, n)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(c.backend(mla=False).block_size)
    bucket: dict[int | None, list[LayerSpec]] = {}
    for i, w in enumerate(wins):
        name = c.name(i, "self_attn.attn")
        layer: LayerSpec
        if w is None:
            layer = FullAttentionSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv
            )
        else:
            layer = SlidingWindowSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv, window=w
            )
        c.kinds[name] = "full" if w is None else "sliding"
        bucket.setdefault(w, []).append(layer)  # vLLM: one bucket per distinct spec, first seen first
    slid = [w for w in bucket if w is not None]
    names = {w: "full" if w is None else ("sliding" if len(slid) == 1 else f"sliding.w{w}") for w in bucket}
    return vllm_groups([(names[w], ls) for w, ls in bucket.items()]), kv, bs
