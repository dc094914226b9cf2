"""Hybrid rules of kvlayout.models (Granite 4.0-H, LFM2, LFM2-MoE, OLMo hybrid, Zamba2 and the Mamba2
state they share), each value computed here by the rule's formula and each refusal pinned by its whole
message (issue 25: mutation coverage of kvlayout.models). vLLM's own construction of the same models is
tests/test_models_hybrid_vllm.py (too slow to run per mutant); these call the functions in-process."""

from __future__ import annotations

from typing import Any

import pytest

from kvlayout.errors import SpecError
from kvlayout.models.base import Ctx
from kvlayout.models.config import Config
from kvlayout.models.hybrid import _zamba2_attention, _zamba2_attention_names, mamba_layers
from kvlayout.spec import DTYPE_SIZES, FullAttentionSpec, MambaSpec
from tests import json_reader as J

HINT = "; reader='transformers' fills the config class's defaults, as vLLM does"

_GRANITE: dict[str, Any] = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 512,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
    "layer_types": ["mamba", "linear_attention", "mamba", "attention", "mamba", "mamba", "full_attention",
                    "mamba"],
    "mamba_n_heads": 16, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4,
    "mamba_expand": 2,
}
_LFM2: dict[str, Any] = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "hidden_size": 512, "num_hidden_layers": 6,
    "num_attention_heads": 8, "num_key_value_heads": 8, "conv_dim": 768, "conv_L_cache": 3,
    "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention"],
    "torch_dtype": "bfloat16",
}
_ZAMBA2: dict[str, Any] = {
    "architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "hidden_size": 256,
    "num_hidden_layers": 6, "layers_block_type": ["mamba", "mamba", "hybrid", "mamba", "mamba", "hybrid"],
    "hybrid_layer_ids": [2, 5], "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_ngroups": 1, "n_mamba_heads": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
    "attention_hidden_size": 512, "attention_head_dim": 64, "num_mem_blocks": 1, "torch_dtype": "bfloat16",
}
_OLMO: dict[str, Any] = {
    "architectures": ["OlmoHybridForCausalLM"], "model_type": "olmo_hybrid", "hidden_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "linear_num_key_heads": 8,
    "linear_num_value_heads": 8, "linear_key_head_dim": 64, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}


def _ctx(
    data: dict[str, Any], family: str, tp: int = 1, dtype: str = "bfloat16", ssm: str | None = None
) -> Ctx:
    cfg = Config(data, "config")
    return Ctx(
        top=cfg, cfg=cfg, family=family, tp=tp, dtype=dtype, kv_cache_dtype=None, block_size=None,
        mamba_ssm_cache_dtype=ssm, prefix="model.layers", notes=[], kinds={},
    )


def _msg(fn: Any, *args: Any, **kw: Any) -> str:
    with pytest.raises(SpecError) as e:
        fn(*args, **kw)
    return str(e.value)


def _without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


def _mamba2_bytes(inner: int, heads: int, hdim: int, groups: int, d_state: int, k: int, tp: int,
                  dtype: str, ssm: str) -> int:
    """MambaStateShapeCalculator.mamba2_state_shape's bytes: one group replicated to tp."""
    if groups % tp:
        groups = tp
    conv = (k - 1) * ((inner + 2 * groups * d_state) // tp) * DTYPE_SIZES[dtype]
    return conv + heads // tp * hdim * d_state * DTYPE_SIZES[ssm]


def test_granite_mamba2_state_layers_and_kinds_by_formula() -> None:
    """GraniteMoeHybrid: Mamba2 with mamba_expand * hidden_size inner channels, mamba_n_heads of
    mamba_d_head ("auto": inner // heads), ssm state in the model dtype unless mamba_ssm_cache_dtype;
    layer_types attention / full_attention are attention, mamba / linear_attention Mamba."""
    want_attn = [t in ("attention", "full_attention") for t in _GRANITE["layer_types"]]
    for tp in (1, 2, 4, 8, 16):
        for groups in (1, 2, 4, 8):
            for dtype, ssm in (("bfloat16", None), ("float32", None), ("bfloat16", "float32")):
                data = {**_GRANITE, "mamba_n_groups": groups}
                c = _ctx(data, "granitemoehybrid", tp, dtype, ssm)
                if groups % tp and groups != 1:
                    assert _msg(mamba_layers, c, 8) == (
                        f"config.mamba_n_groups = {groups}: vLLM needs it divisible by tp = {tp} (or 1)"
                    )
                    continue
                keep, is_attn, state, kind, tail = mamba_layers(c, 8)
                want = _mamba2_bytes(1024, 16, 64, groups, 128, 4, tp, dtype, ssm or dtype)
                assert (keep, is_attn, state, kind, tail) == ([True] * 8, want_attn, want, "mamba", "mixer")
    # mamba_d_head "auto": the inner size over the heads
    for heads in (8, 16, 32):
        c = _ctx({**_GRANITE, "mamba_n_heads": heads, "mamba_d_head": "auto"}, "granitemoehybrid", 2)
        want = _mamba2_bytes(1024, heads, 1024 // heads, 1, 128, 4, 2, "bfloat16", "bfloat16")
        assert mamba_layers(c, 8)[2] == want
    # mamba_d_head * mamba_n_heads must be the inner size, written or "auto"
    c = _ctx({**_GRANITE, "mamba_d_head": 32}, "granitemoehybrid")
    assert _msg(mamba_layers, c, 8) == (
        "config.mamba_d_head = 32: mamba_d_head * mamba_n_heads = 32 * 16: must be mamba_expand * hidden_size"
        " = 1024"
    )
    c = _ctx({**_GRANITE, "mamba_d_head": "auto", "mamba_n_heads": 24}, "granitemoehybrid")
    assert _msg(mamba_layers, c, 8) == (
        "config.mamba_d_head = 'auto': mamba_d_head * mamba_n_heads = 42 * 24: must be mamba_expand *"
        " hidden_size = 1024"
    )
    # per rank: the heads and the conv channels must split over tp, named by their field
    assert _msg(mamba_layers, _ctx(_GRANITE, "granitemoehybrid", 32), 8) == (
        "config.mamba_n_heads = 16: not divisible by tp = 32"
    )
    assert _msg(mamba_layers, _ctx(_GRANITE, "granitemoehybrid", 3), 8) == (
        f"config.mamba_n_groups = 1: conv channels 1024 + 2 * 3 groups * 128 = {1024 + 2 * 3 * 128}: not "
        "divisible by tp = 3"
    )


def test_granite_refusals_name_each_field_and_why() -> None:
    c = _ctx({**_GRANITE, "layer_types": [*_GRANITE["layer_types"][:3], "moe", *_GRANITE["layer_types"][4:]]},
             "granitemoehybrid")
    assert _msg(mamba_layers, c, 8) == (
        "config.layer_types[3] = 'moe': valid: mamba, linear_attention, attention, full_attention"
    )
    c = _ctx({**_GRANITE, "layer_types": _GRANITE["layer_types"][:7]}, "granitemoehybrid")
    assert _msg(mamba_layers, c, 8) == "config.layer_types = '7 items': needs exactly one item per layer (8)"
    c = _ctx({**_GRANITE, "layer_types": [*_GRANITE["layer_types"], "mamba"]}, "granitemoehybrid")
    assert _msg(mamba_layers, c, 8) == "config.layer_types = '9 items': needs exactly one item per layer (8)"
    c = _ctx({**_GRANITE, "layer_types": [1] * 8}, "granitemoehybrid")
    assert _msg(mamba_layers, c, 8) == "config.layer_types[0] = 1: must be a string"
    inner = "the Mamba inner size is mamba_expand * hidden_size"
    for key, why in (
        ("layer_types", "one entry per layer: which layers are attention"),
        ("mamba_n_heads", "the Mamba2 heads"),
        ("mamba_expand", inner),
        ("hidden_size", inner),
        ("mamba_d_head", "the Mamba2 head size"),
        ("mamba_n_groups", "the Mamba2 B/C groups"),
        ("mamba_d_state", "the Mamba2 state size"),
        ("mamba_d_conv", "the Mamba2 conv state keeps mamba_d_conv - 1 steps"),
    ):
        got = _msg(mamba_layers, _ctx(_without(_GRANITE, key), "granitemoehybrid"), 8)
        assert got == f"config.{key} = None: missing; {why}{HINT}", key


def test_lfm2_short_conv_state_by_formula() -> None:
    """LFM2 and LFM2-MoE: a short-conv state (conv_L_cache - 1, channels / tp) in the model dtype, the
    channels LFM2's conv_dim and LFM2-MoE's hidden_size; layer_types full_attention are attention."""
    want_attn = [t == "full_attention" for t in _LFM2["layer_types"]]
    for arch, channels in (("Lfm2ForCausalLM", 768), ("Lfm2MoeForCausalLM", 512)):
        for tp in (1, 2, 4):
            for dtype in ("bfloat16", "float32", "float16"):
                for k in (2, 3, 5):
                    data = {**_LFM2, "architectures": [arch], "conv_L_cache": k}
                    got = mamba_layers(_ctx(data, "lfm2", tp, dtype), 6)
                    want = (k - 1) * (channels // tp) * DTYPE_SIZES[dtype]
                    assert got == ([True] * 6, want_attn, want, "short_conv", "short_conv"), (arch, tp, k)
    # what vLLM reads first: the top config's first architecture
    data = {**_LFM2, "architectures": ["Lfm2MoeForCausalLM", "Lfm2ForCausalLM"]}
    assert mamba_layers(_ctx(data, "lfm2"), 6)[2] == 2 * 512 * 2
    assert _msg(mamba_layers, _ctx(_LFM2, "lfm2", 5), 6) == "config.conv_dim = 768: not divisible by tp = 5"
    data = {**_LFM2, "architectures": ["Lfm2MoeForCausalLM"]}
    assert _msg(mamba_layers, _ctx(data, "lfm2", 3), 6) == "config.hidden_size = 512: not divisible by tp = 3"
    for arch, key, why in (
        ("Lfm2ForCausalLM", "conv_dim", "the short-conv channels"),
        ("Lfm2MoeForCausalLM", "hidden_size", "the short-conv channels"),
        ("Lfm2ForCausalLM", "conv_L_cache", "the short-conv state keeps conv_L_cache - 1 steps"),
        ("Lfm2ForCausalLM", "layer_types", "one entry per layer: which layers are attention"),
    ):
        data = _without({**_LFM2, "architectures": [arch]}, key)
        assert _msg(mamba_layers, _ctx(data, "lfm2"), 6) == f"config.{key} = None: missing; {why}{HINT}", key
    data = {**_LFM2, "layer_types": ["conv", "attention", *_LFM2["layer_types"][2:]]}
    assert _msg(mamba_layers, _ctx(data, "lfm2"), 6) == (
        "config.layer_types[1] = 'attention': valid: conv, full_attention"
    )


def test_zamba2_mamba2_state_by_formula_and_refusals() -> None:
    """Zamba2: a Mamba2 mixer in every layer, inner mamba_expand * hidden_size, n_mamba_heads of
    inner // n_mamba_heads, mamba_ngroups; mamba_headdim, where written, must agree."""
    for tp in (1, 2, 4, 8):
        for heads in (8, 16):
            for dtype, ssm in (("bfloat16", None), ("float32", None), ("bfloat16", "float32")):
                c = _ctx({**_ZAMBA2, "n_mamba_heads": heads}, "zamba2", tp, dtype, ssm)
                got = mamba_layers(c, 6)
                want = _mamba2_bytes(512, heads, 512 // heads, 1, 16, 4, tp, dtype, ssm or dtype)
                assert got == ([True] * 6, [False] * 6, want, "mamba", "mixer"), (tp, heads)
    assert mamba_layers(_ctx({**_ZAMBA2, "mamba_headdim": 64}, "zamba2"), 6)[2] == _mamba2_bytes(
        512, 8, 64, 1, 16, 4, 1, "bfloat16", "bfloat16"
    )
    assert _msg(mamba_layers, _ctx({**_ZAMBA2, "mamba_headdim": 32}, "zamba2"), 6) == (
        "config.mamba_headdim = 32: vLLM's Mamba layers use mamba_expand * hidden_size // n_mamba_heads = 64"
        " and its block alignment this field: they must agree"
    )
    # more heads than inner channels: heads of no channels
    assert _msg(mamba_layers, _ctx({**_ZAMBA2, "n_mamba_heads": 513}, "zamba2"), 6) == (
        "config.n_mamba_heads = 513: more than the Mamba inner size mamba_expand * hidden_size = 512"
    )
    assert mamba_layers(_ctx({**_ZAMBA2, "n_mamba_heads": 512}, "zamba2"), 6)[2] == _mamba2_bytes(
        512, 512, 1, 1, 16, 4, 1, "bfloat16", "bfloat16"
    )
    assert _msg(mamba_layers, _ctx(_ZAMBA2, "zamba2", 16), 6) == (
        "config.n_mamba_heads = 8: not divisible by tp = 16"
    )
    assert _msg(mamba_layers, _ctx({**_ZAMBA2, "mamba_ngroups": 2}, "zamba2", 4), 6) == (
        "config.mamba_ngroups = 2: vLLM needs it divisible by tp = 4 (or 1)"
    )
    inner = "the Mamba inner size is mamba_expand * hidden_size"
    for key, why in (
        ("mamba_expand", inner),
        ("hidden_size", inner),
        ("n_mamba_heads", "the Mamba2 heads"),
        ("mamba_ngroups", "the Mamba2 B/C groups"),
        ("mamba_d_state", "the Mamba2 state size"),
        ("mamba_d_conv", "the Mamba2 conv state keeps mamba_d_conv - 1 steps"),
    ):
        got = _msg(mamba_layers, _ctx(_without(_ZAMBA2, key), "zamba2"), 6)
        assert got == f"config.{key} = None: missing; {why}{HINT}", key


def test_zamba2_attention_and_names_messages() -> None:
    att = _zamba2_attention(Config(_ZAMBA2, "config"), 2)
    assert (att.heads, att.kv_heads, att.head_size) == (8, 4, 64)
    assert _msg(_zamba2_attention, Config(_ZAMBA2, "config"), 16) == (
        "config.num_attention_heads = 8: not divisible by tp = 16"
    )
    assert _msg(_zamba2_attention, Config({**_ZAMBA2, "attention_hidden_size": 500}, "config"), 1) == (
        "config.attention_hidden_size = 500: must be 8 * 64 (vLLM raises)"
    )
    assert _msg(_zamba2_attention, Config({**_ZAMBA2, "num_key_value_heads": 4}, "config"), 1) == (
        "config.num_key_value_heads = 4: vLLM's attention layers take num_attention_heads = 8 KV heads"
        " and its block alignment this field: they must agree"
    )
    for key, why in (
        ("num_attention_heads", "the attention heads (KV heads alike)"),
        ("attention_head_dim", "the attention head size"),
        ("attention_hidden_size", "the attention width, num_attention_heads * attention_head_dim"),
    ):
        got = _msg(_zamba2_attention, Config(_without(_ZAMBA2, key), "config"), 1)
        assert got == f"config.{key} = None: missing; {why}{HINT}", key
    # the layer names: linear_attention is a Mamba layer too
    types = ["linear_attention", "hybrid", "mamba", "hybrid", "mamba", "linear_attention"]
    cfg = Config({**_ZAMBA2, "layers_block_type": types, "hybrid_layer_ids": [1, 3]}, "config")
    assert _zamba2_attention_names(cfg, 6) == ["model.attn.0", "model.attn.1"]
    cfg = Config({**_ZAMBA2, "layers_block_type": types, "hybrid_layer_ids": [1, 3], "num_mem_blocks": 2},
                 "config")
    assert _zamba2_attention_names(cfg, 6) == ["model.attn.0", "model.attn.1"]
    for data, want in (
        ({**_ZAMBA2, "layers_block_type": _ZAMBA2["layers_block_type"][:5]},
         "config.layers_block_type = '5 items': needs exactly one item per layer (6)"),
        ({**_ZAMBA2, "layers_block_type": [*_ZAMBA2["layers_block_type"], "mamba"]},
         "config.layers_block_type = '7 items': needs exactly one item per layer (6)"),
        ({**_ZAMBA2, "layers_block_type": ["mamba", "attn", *_ZAMBA2["layers_block_type"][2:]]},
         "config.layers_block_type[1] = 'attn': valid: hybrid, mamba, linear_attention"),
        ({**_ZAMBA2, "hybrid_layer_ids": [2, 4]},
         "config.hybrid_layer_ids = [2, 4]: must list the hybrid layers of layers_block_type, [2, 5]"),
        (_without(_ZAMBA2, "layers_block_type"),
         "config.layers_block_type = None: missing; one entry per layer: hybrid (attention + Mamba) or mamba"
         + HINT),
        (_without(_ZAMBA2, "hybrid_layer_ids"),
         "config.hybrid_layer_ids = None: missing; the hybrid layers' indices" + HINT),
        (_without(_ZAMBA2, "num_mem_blocks"),
         "config.num_mem_blocks = None: missing; the shared attention blocks" + HINT),
    ):
        assert _msg(_zamba2_attention_names, Config(data, "config"), 6) == want


def _layers(m: Any) -> dict[str, Any]:
    return {layer.name: layer for g in m.spec.groups for layer in g.layers}


def test_hybrid_attention_head_size_is_hidden_over_heads() -> None:
    """Granite 4.0-H, LFM2 and OLMo hybrid: the attention head size is hidden_size // heads; a written
    head_dim must equal it (vLLM's block alignment reads ModelConfig's head_dim)."""
    for base in (_GRANITE, _LFM2, _OLMO):
        for tp in (1, 2):
            m = J.from_config(base, tp=tp)
            attn = [x for x in _layers(m).values() if isinstance(x, FullAttentionSpec)]
            assert attn, base["model_type"]
            assert {(a.num_kv_heads, a.head_size) for a in attn} == {(8 // tp, 64)}, base["model_type"]
            assert _layers(J.from_config({**base, "head_dim": 64}, tp=tp)) == _layers(m)
        with pytest.raises(SpecError) as e:
            J.from_config({**base, "head_dim": 128})
        assert str(e.value) == (
            "config.head_dim = 128: vLLM's layers use hidden_size // num_attention_heads = 64 and its block"
            " alignment this head_dim: they must agree"
        ), base["model_type"]


def test_hybrid_pages_kinds_and_alignment() -> None:
    """Every Mamba / short-conv page is padded to the attention page unless the state fills it exactly;
    the attention layers are kind full, the states their own kind, each named as vLLM names them."""
    m = J.from_config(_GRANITE)
    state = _mamba2_bytes(1024, 16, 64, 1, 128, 4, 1, "bfloat16", "bfloat16")
    per_token = 2 * 8 * 64 * 2
    bs = 16 * -(-state // (16 * per_token))
    assert m.block_size == bs
    for i, t in enumerate(_GRANITE["layer_types"]):
        if t in ("attention", "full_attention"):
            name = f"model.layers.{i}.self_attn.attn"
            assert m.kinds[name] == "full" and isinstance(_layers(m)[name], FullAttentionSpec)
        else:
            name = f"model.layers.{i}.mixer"
            layer = _layers(m)[name]
            assert m.kinds[name] == "mamba" and isinstance(layer, MambaSpec)
            assert (layer.state_bytes, layer.alignment) == (state, bs * per_token)
    m = J.from_config(_LFM2)
    short = _layers(m)["model.layers.0.short_conv"]
    assert (m.kinds["model.layers.0.short_conv"], short.state_bytes, short.alignment) == (
        "short_conv", 2 * 768 * 2, 16 * per_token
    )
    # Zamba2: the shared attention model.attn.{j} (kind full), the mixers {H + i}.mixer
    for dtype, aligned in (("auto", True), ("fp8", False)):
        # 2 heads of 307: 1,228 B a token in fp8, 16 tokens hold the 19,648 B state exactly
        data = {**_ZAMBA2, "num_attention_heads": 2, "num_key_value_heads": 2, "attention_head_dim": 307,
                "attention_hidden_size": 614}
        m = J.from_config(data, kv_cache_dtype=dtype)
        state = _mamba2_bytes(512, 8, 64, 1, 16, 4, 1, "bfloat16", "bfloat16")
        page = m.block_size * 2 * 2 * 307 * (2 if dtype == "auto" else 1)
        assert state == 19_648 and (page == state) is not aligned
        assert list(m.kinds.items()) == [("model.attn.0", "full"), ("model.attn.1", "full")] + [
            (f"{2 + i}.mixer", "mamba") for i in range(6)
        ]
        mixer = _layers(m)["2.mixer"]
        assert (mixer.state_bytes, mixer.alignment) == (state, page if aligned else None), dtype


def test_falcon_h1_inner_size_from_a_float_expand() -> None:
    """FalconH1: without mamba_d_ssm the inner size is int(mamba_expand * hidden_size); one channel is
    taken, under one refused by name (1e-300 gave an inner size of 0: issue 25)."""
    falcon = {
        "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "torch_dtype": "bfloat16",
        "num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 64, "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 16,
        "mamba_d_conv": 3, "mamba_expand": 1 / 1024,
    }
    ms = J.from_config(falcon)
    states = {x.real_page for _, x in ms.spec.layers if isinstance(x, MambaSpec)}
    assert states == {(3 - 1) * (1 + 2 * 16) * 2 + 8 * 64 * 16 * 2}  # conv (2, 33) + ssm (8, 64, 16), bf16
    with pytest.raises(SpecError) as e:
        J.from_config({**falcon, "mamba_expand": 0.5 / 1024})
    assert (e.value.field, e.value.value, str(e.value)) == (
        "config.mamba_expand", 0.5 / 1024,
        f"config.mamba_expand = {0.5 / 1024!r}: mamba_expand * hidden_size = {0.5 / 1024!r} * 1024 is "
        "under 1 channel",
    )
