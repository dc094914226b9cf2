"""Llama-Nemotron NAS (``DeciLMForCausalLM``, model_type ``nemotron-nas``) by vLLM 0.33's own construction
(issue 23): per-layer KV heads ``num_attention_heads // block_configs[i].attention.n_heads_in_group``, no
attention (no cache) where ``no_op``, and vLLM's grouping of layers whose pages differ.

The config class is the checkpoints' remote code (``configuration_decilm.DeciLMConfig``: a ``LlamaConfig``
whose ``block_configs`` dicts become frozen ``BlockConfig`` dataclasses, ``block_config.py``), not fetched
offline: :class:`DeciLMStandIn` stands in for it, doing what vLLM's model depends on (the sub-blocks as
objects with the dataclasses' defaults, ``n_heads_in_group`` nulled for a no-op or linear attention and
asserted otherwise, ``ffn_mult`` likewise, the count of blocks asserted; ``num_key_value_heads`` and
``intermediate_size`` set to null after LlamaConfig's fields). Its assumptions are asserted on the vLLM
side: vLLM 0.33 has no class of its own for the type (``_stand_ins``), and the layers the model registers are
exactly the attention blocks'.

Each small config is built as one rank of tp 1, 2 and 8, with a bf16 and an fp8 cache, by
tests/test_models_hybrid_vllm.py's driver (layers on the backend a Hopper GPU picks: ``gpu_backend``), and
its groups, pages, block sizes, windows and bytes per block must equal kvlayout's plan on Hopper and on
Blackwell (16-token blocks on both); configs vLLM fails to build must be refused by kvlayout, naming the
field.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError

try:  # the stand-in is a transformers config class (the driver registers it; vLLM installs transformers)
    from transformers import PretrainedConfig
except ImportError:  # pragma: no cover - the unit tests below run without it
    PretrainedConfig = object  # type: ignore[assignment,misc]

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- the remote config class, stood in
@dataclasses.dataclass(frozen=True, kw_only=True)
class _Attention:
    """The remote ``AttentionConfig``: defaults, and ``n_heads_in_group`` nulled or required."""

    no_op: bool = False
    replace_with_linear: bool = False
    sparsify: Any = None
    n_heads_in_group: int | None = None
    window_length: int | None = None
    num_sink_tokens: int | None = None
    use_prefill_window_in_sink_attention: bool = False
    unshifted_sink: bool = False

    def __post_init__(self) -> None:
        if self.no_op and self.replace_with_linear:
            raise ValueError("a sub-block is not both no_op and replace_with_linear")
        if self.no_op or self.replace_with_linear:
            for key in ("n_heads_in_group", "window_length", "num_sink_tokens"):
                object.__setattr__(self, key, None)
        elif self.n_heads_in_group is None:
            raise ValueError("n_heads_in_group is required for attention")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _FFN:
    """The remote ``FFNConfig``: ``ffn_mult`` nulled for a no-op or linear FFN, else required."""

    no_op: bool = False
    replace_with_linear: bool = False
    sparsify: Any = None
    ffn_mult: float | None = None

    def __post_init__(self) -> None:
        if self.no_op and self.replace_with_linear:
            raise ValueError("a sub-block is not both no_op and replace_with_linear")
        if self.no_op or self.replace_with_linear:
            object.__setattr__(self, "ffn_mult", None)
        elif self.ffn_mult is None:
            raise ValueError("ffn_mult is required for an FFN")
        else:
            object.__setattr__(self, "ffn_mult", round(self.ffn_mult, 6))


def _sub(cls: type, raw: dict[str, Any]) -> Any:
    """A sub-block from its dict, unknown keys dropped (as ``BlockConfig.__post_init__`` drops them)."""
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in raw.items() if k in known})


@dataclasses.dataclass(frozen=True)
class _Block:
    attention: Any
    ffn: Any


class DeciLMStandIn(PretrainedConfig):  # type: ignore[misc,valid-type]
    """Stands in for the checkpoints' remote ``DeciLMConfig`` (registered by the driver's ``_stand_ins``)."""

    model_type = "nemotron-nas"

    def __init__(
        self,
        block_configs: list[dict[str, Any]] | None = None,
        vocab_size: int = 32000,
        hidden_size: int = 4096,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        rope_scaling: dict[str, Any] | None = None,
        attention_bias: bool = False,
        mlp_bias: bool = False,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        # LlamaConfig's fields (transformers 4.44.2's class, copied into the checkpoint), set before
        # PretrainedConfig's init as that class sets them
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.intermediate_size = None
        self.num_key_value_heads = None
        blocks = None
        if block_configs is not None:
            if len(block_configs) != num_hidden_layers:
                raise ValueError("one block config per layer")
            blocks = [_Block(_sub(_Attention, b["attention"]), _sub(_FFN, b["ffn"])) for b in block_configs]
        self.block_configs = blocks

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = super().to_dict()
        if self.block_configs is not None:
            out["block_configs"] = [dataclasses.asdict(b) for b in self.block_configs]
        return out


# --------------------------------------------------------------------------- the configs
def _attn(group: int | None) -> dict[str, Any]:
    """An attention sub-block as published (Llama-3.3-Nemotron-Super-49B's keys); None: no_op."""
    return {
        "n_heads_in_group": group,
        "no_op": group is None,
        "num_sink_tokens": None,
        "replace_with_linear": False,
        "sparsify": None,
        "unshifted_sink": False,
        "use_prefill_window_in_sink_attention": False,
        "window_length": None,
    }


def _blocks(groups: list[int | None], ffn_no_op: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    ffn = {"no_op": False, "replace_with_linear": False, "sparsify": None}
    return [
        {
            "attention": _attn(g),
            "ffn": {**ffn, "no_op": True, "ffn_mult": None} if i in ffn_no_op else {**ffn, "ffn_mult": 2.625},
        }
        for i, g in enumerate(groups)
    ]


BASE: dict[str, Any] = {
    "architectures": ["DeciLMForCausalLM"],
    "model_type": "nemotron-nas",
    "auto_map": {"AutoConfig": "configuration_decilm.DeciLMConfig"},
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": None,
    "intermediate_size": None,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "num_hidden_layers": 6,
}
#: name -> config: 8 query heads of 64; n_heads_in_group 1, 2, 8 give 8, 4, 1 KV heads
CONFIGS: dict[str, dict[str, Any]] = {
    # the 49B shape: one KV-head count, no-op attention between (and a no-op FFN)
    "uniform": {**BASE, "block_configs": _blocks([2, None, 2, 2, None, 2], ffn_no_op=(4,))},
    # KV heads differing by layer: one group of per-layer pages
    "mixed": {**BASE, "block_configs": _blocks([1, None, 2, 8, None, 2])},
    # head_dim written unlike hidden_size // heads
    "head_dim": {**BASE, "head_dim": 128, "block_configs": _blocks([1, 2, None, 8])}
    | {"num_hidden_layers": 4},
    # n_heads_in_group not dividing the heads: 8 // 3 = 2 KV heads
    "floor": {**BASE, "block_configs": _blocks([3, 3, None, 1, 3, 3])},
    # window_length (sliding in transformers' remote model) is not read by vLLM: full attention
    "window_length": {
        **BASE,
        "block_configs": [
            {**b, "attention": {**b["attention"], "window_length": 64}} if i in (0, 2) else b
            for i, b in enumerate(_blocks([2, None, 8, 2, None, 1]))
        ],
    },
    # the engine's one window on every attention layer (no layer_types): sliding pages of mixed KV heads
    "engine_window": {**BASE, "sliding_window": 128, "block_configs": _blocks([1, None, 2, 8, None, 2])},
    # layer_types mixing sliding and full layers of mixed KV heads: pages unified, then grouped by spec
    "layer_types": {
        **BASE,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 3,
        "block_configs": _blocks([2, 1, 2, 8, 2, 2]),
    },
}
# pages that do not divide: 12 heads, sliding layers of 12 // 4 = 3 KV heads beside full ones of 12 // 3 = 4;
# the 3-head pages padded to the 4-head ones (tp 1 only: 3 KV heads do not split over 2)
CONFIGS["layer_types_padded"] = {
    **CONFIGS["layer_types"],
    "num_attention_heads": 12,
    "hidden_size": 768,
    "block_configs": _blocks([4, 3, 4, 3, 4, 3]),
}
TPS = (1, 2, 8)
#: name -> its tensor-parallel sizes where not TPS
_TPS = {"layer_types_padded": (1,)}
KVS = ("auto", "fp8")
#: name -> (config, what kvlayout's refusal names, what vLLM's construction raises): vLLM fails to build them
REFUSED: dict[str, tuple[dict[str, Any], str, str]] = {
    "linear_attention": (
        {
            **BASE,
            "block_configs": [
                {**b, "attention": {**_attn(None), "no_op": False, "replace_with_linear": True}}
                if i == 1
                else b
                for i, b in enumerate(_blocks([2, 2, 2, 2, 2, 2]))
            ],
        },
        "config.block_configs[1].attention.replace_with_linear",
        "TypeError",
    ),
    "linear_ffn": (
        {
            **BASE,
            "block_configs": [
                {**b, "ffn": {"no_op": False, "replace_with_linear": True, "ffn_mult": None}} if i == 2 else b
                for i, b in enumerate(_blocks([2, 2, 2, 2, 2, 2]))
            ],
        },
        "config.block_configs[2].ffn.replace_with_linear",
        "TypeError",
    ),
    "all_no_op": (
        {**BASE, "block_configs": _blocks([None] * 6)},
        "config.block_configs",
        "RuntimeError",
    ),
    "group_above_heads": (
        {**BASE, "block_configs": _blocks([2, None, 16, 2, None, 2])},
        "config.block_configs[2].attention.n_heads_in_group",
        "ZeroDivisionError",
    ),
}


def _cases() -> dict[str, dict[str, Any]]:
    cases = {
        f"{name}-tp{tp}-{kv}": {
            "config": cfg,
            "tp": tp,
            "kv_cache_dtype": kv,
            "stand_in": True,
            "gpu_backend": True,
        }
        for name, cfg in CONFIGS.items()
        for tp in _TPS.get(name, TPS)
        for kv in KVS
    }
    for name, (cfg, _, _) in REFUSED.items():
        cases[f"{name}-tp1-auto"] = {
            "config": cfg,
            "tp": 1,
            "kv_cache_dtype": "auto",
            "stand_in": True,
            "gpu_backend": True,
        }
    return cases


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.test_models_hybrid_vllm import vllm_answers

    return vllm_answers(_cases())


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    from tests.test_models_hybrid_vllm import differences

    assert set(answers) == set(_cases())
    built = {case_id: case for case_id, case in _cases().items() if case_id.split("-")[0] not in REFUSED}
    assert differences(answers, built) == []
    for case_id, case in built.items():
        got = answers[case_id]
        # the stand-in's assumption: vLLM registers an attention layer for exactly the attention blocks
        blocks = case["config"]["block_configs"]
        expected = {
            f"model.layers.{i}.self_attn.attn" for i, b in enumerate(blocks) if not b["attention"]["no_op"]
        }
        assert set(got["layers"]) == expected, case_id


def test_vllm_fails_where_kvlayout_refuses(answers: dict[str, dict[str, Any]]) -> None:
    for name, (cfg, field, raised) in REFUSED.items():
        got = answers[f"{name}-tp1-auto"]
        assert got.get("error", "").startswith(raised), (name, got)
        with pytest.raises(SpecError) as e:
            M.from_config(cfg, reader="json")
        assert e.value.field == field, (name, str(e.value))


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    page = {kv: kv * 64 * 2 * 16 * 2 for kv in (1, 2, 4, 8)}  # K and V of 16 tokens, bf16, heads of 64
    u = answers["uniform-tp1-auto"]  # 4 attention layers of 4 KV heads; one group
    assert u["groups"] == [[f"model.layers.{i}.self_attn.attn" for i in (0, 2, 3, 5)]]
    assert u["bytes_per_block"] == 4 * page[4] == 65_536
    m = answers["mixed-tp1-auto"]  # 8, 4, 1, 4 KV heads: one group, each layer its own page
    assert len(m["groups"]) == 1 and m["layout"] == "LBNHC"
    assert m["layers"]["model.layers.3.self_attn.attn"] == ["FullAttentionSpec", page[1], page[1]]
    assert m["bytes_per_block"] == page[8] + page[4] + page[1] + page[4] == 69_632
    # tp 8: 8 KV heads split to 1, 4 and 1 replicated: 1 head a rank on every layer; fp8 halves the page
    assert answers["mixed-tp8-fp8"]["bytes_per_block"] == 4 * page[1] // 2
    assert answers["head_dim-tp1-auto"]["layers"]["model.layers.0.self_attn.attn"][1] == 8 * 128 * 2 * 16 * 2
    assert answers["floor-tp1-auto"]["layers"]["model.layers.0.self_attn.attn"][1] == page[2]
    assert answers["window_length-tp1-auto"]["windows"] == {}
    ew = answers["engine_window-tp2-auto"]  # sliding layers of 4, 2, 1, 2 KV heads a rank: one group
    assert set(ew["windows"].values()) == {128} and len(ew["groups"]) == 1
    # layer_types: sliding layers 0, 2, 4 of 4 KV heads, full layers 1 (8), 3 (1), 5 (4): every page made
    # the 8-head one (32-token blocks for 4 heads, 128 for 1); one bucket per distinct spec, the sliding one
    # split to the smallest bucket's size: six groups of one layer, a block the largest group's page
    lt = answers["layer_types-tp1-auto"]
    assert lt["blocks"] == {
        f"model.layers.{i}.self_attn.attn": b for i, b in enumerate([32, 16, 32, 128, 32, 32])
    }
    assert lt["groups"] == [[f"model.layers.{i}.self_attn.attn"] for i in (0, 2, 4, 1, 3, 5)]
    assert {p for _, _, p in lt["layers"].values()} == {page[8]} and lt["bytes_per_block"] == page[8]
    # padded: the sliding 3-head pages (6,144 B real) padded to the full 4-head ones (8,192 B), blocks of 16
    pd = answers["layer_types_padded-tp1-fp8"]["layers"]["model.layers.0.self_attn.attn"]
    assert pd == ["SlidingWindowSpec", 3 * 64 * 2 * 16, 4 * 64 * 2 * 16]


# --------------------------------------------------------------------------- the published 49B
def test_published_super_49b() -> None:
    """nvidia/Llama-3_3-Nemotron-Super-49B-v1 as published: 49 attention blocks of 64 // 8 = 8 KV heads of
    8,192 // 64 = 128, 31 no-op ones (pinned against vLLM in tests/fixtures/published/truth.json)."""
    cfg = json.loads((ROOT / "tests/fixtures/published/llama3_3_nemotron_super_49b.json").read_text())
    for tp, heads in ((1, 8), (2, 4), (8, 1)):
        ms = M.from_config(cfg, tp=tp, reader="json")
        layers = [x for _, x in ms.spec.layers]
        assert len(layers) == 49 and {x.num_kv_heads for x in layers} == {heads}
        assert ms.bytes_per_block == 49 * heads * 128 * 2 * 16 * 2
    fp8 = M.from_config(cfg, tp=8, kv_cache_dtype="fp8", device="blackwell")
    assert fp8.bytes_per_block == 49 * 128 * 2 * 16
    # vLLM's own answer, pinned by scripts/gen_published_truth.py through DeciLMStandIn
    truth = json.loads((ROOT / "tests/fixtures/published/truth.json").read_text())
    pin = truth["answers"][truth["cases"]["llama3_3_nemotron_super_49b-tp1-auto-hopper"]]
    assert pin["groups"] == [49] and pin["bytes_per_block"] == 49 * 8 * 128 * 2 * 16 * 2


# --------------------------------------------------------------------------- refusals, by the json reader
def _refused(cfg: dict[str, Any], field: str, match: str, tp: int = 1) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, tp=tp, reader="json")
    assert e.value.field == field, str(e.value)


def _with(i: int, part: str, **fields: Any) -> dict[str, Any]:
    """CONFIGS["mixed"] with block i's ``part`` sub-block changed."""
    blocks = [dict(b) for b in CONFIGS["mixed"]["block_configs"]]
    blocks[i] = {**blocks[i], part: {**blocks[i][part], **fields}}
    return {**CONFIGS["mixed"], "block_configs": blocks}


def test_block_configs_refused_by_name() -> None:
    mixed = CONFIGS["mixed"]
    _refused({**mixed, "block_configs": None}, "config.block_configs", "missing")
    _refused({k: v for k, v in mixed.items() if k != "block_configs"}, "config.block_configs", "missing")
    _refused({**mixed, "block_configs": {"0": {}}}, "config.block_configs", "must be a list")
    _refused(
        {**mixed, "block_configs": mixed["block_configs"][:5]}, "config.block_configs", r"exactly one entry"
    )
    _refused(
        {**mixed, "block_configs": [*mixed["block_configs"][:5], 3]}, "config.block_configs[5]", "an object"
    )
    no_ffn = [dict(b) for b in mixed["block_configs"]]
    del no_ffn[4]["ffn"]
    _refused({**mixed, "block_configs": no_ffn}, "config.block_configs[4].ffn", "must be an object")
    att = "config.block_configs[3].attention"
    for bad in (None, 0, -2, "8", 8.0, True):
        _refused(_with(3, "attention", n_heads_in_group=bad), f"{att}.n_heads_in_group", re.escape(repr(bad)))
    _refused(_with(3, "attention", no_op="false"), f"{att}.no_op", "true or false")
    _refused(_with(3, "attention", no_op=None), f"{att}.no_op", "true or false")
    _refused(
        _with(1, "attention", replace_with_linear=True), "config.block_configs[1].attention.no_op", "both"
    )
    _refused(_with(0, "ffn", ffn_mult=None), "config.block_configs[0].ffn.ffn_mult", "positive number")
    _refused(
        _with(0, "ffn", ffn_mult=float("inf")), "config.block_configs[0].ffn.ffn_mult", "positive number"
    )


def test_no_op_attention_ignores_its_other_fields() -> None:
    """The class nulls a no-op block's n_heads_in_group: whatever is written there is not read."""
    ms = M.from_config(_with(1, "attention", n_heads_in_group="junk"), reader="json")
    assert "model.layers.1.self_attn.attn" not in {x.name for _, x in ms.spec.layers}


def test_kv_heads_per_rank_refused_by_name() -> None:
    where = "config.block_configs[0].attention.n_heads_in_group"
    # 24 heads // 4 = 6 KV heads: not divisible by tp 4
    cfg = {
        **BASE,
        "num_attention_heads": 24,
        "hidden_size": 1536,
        "num_hidden_layers": 1,
        "block_configs": _blocks([4]),
    }
    _refused(cfg, where, r"6 KV heads are not divisible by tp = 4", tp=4)
    # 6 heads // 3 = 2 KV heads at tp 3: not a multiple (replication)
    cfg = {**cfg, "num_attention_heads": 6, "hidden_size": 384, "block_configs": _blocks([3])}
    _refused(cfg, where, r"tp = 3 is not a multiple of the layer's 2 KV heads", tp=3)
    # 10 heads // 3 = 3 KV heads: 10 query heads are not a multiple of 3 (vLLM's Attention asserts it)
    cfg = {**cfg, "num_attention_heads": 10, "hidden_size": 640, "block_configs": _blocks([3])}
    _refused(cfg, where, r"10 query heads per rank are not a multiple", tp=1)
    _refused(CONFIGS["mixed"], "config.num_attention_heads", "not divisible by tp = 3", tp=3)


def test_windows() -> None:
    lt = CONFIGS["layer_types"]
    _refused({**lt, "layer_types": ["sliding", *lt["layer_types"][1:]]}, "config.layer_types[0]", "valid")
    no_window = {k: v for k, v in lt.items() if k != "sliding_window"}
    _refused(no_window, "config.sliding_window", "missing")
    # a null window: every layer full (LlamaAttention passes it), as is layer_types without a sliding layer
    for cfg in ({**lt, "sliding_window": None}, {**lt, "layer_types": ["full_attention"] * 6}):
        ms = M.from_config(cfg, reader="json")
        assert set(ms.kinds.values()) == {"full"} and len(ms.spec.groups) == 1
    ms = M.from_config(CONFIGS["window_length"], reader="json")
    assert any("window_length" in n for n in ms.notes) and set(ms.kinds.values()) == {"full"}


def test_missing_fields_named() -> None:
    for key in ("num_attention_heads", "num_hidden_layers"):
        cfg = {k: v for k, v in CONFIGS["mixed"].items() if k != key}
        with pytest.raises(SpecError) as e:
            M.from_config(cfg, reader="json")
        assert e.value.field == f"config.{key}"
    cfg = {k: v for k, v in CONFIGS["mixed"].items() if k != "hidden_size"}
    with pytest.raises(SpecError) as e:
        M.from_config(cfg, reader="json")
    assert e.value.field == "config.hidden_size"
    assert M.from_config({**cfg, "head_dim": 64}, reader="json").bytes_per_block == 69_632


def test_tpu_inference_refused() -> None:
    """tpu-inference's arrays for these layers are not read from its code: refused, not guessed."""
    with pytest.raises(SpecError, match="per-layer KV heads and no-op layers") as e:
        M.spec_from_config(CONFIGS["mixed"], engine="tpu-inference", reader="json")
    assert e.value.field == "engine"
