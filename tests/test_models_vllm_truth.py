"""Ground truth per architecture (issue 23): small configs of each rule kind, and of the architectures
the issue names, run through vLLM 0.33's own code on the CPU, at tp 1, 2 and 8, bf16 and fp8 caches,
with the block size of Hopper's and Blackwell's attention backends.

The vLLM side is tests/test_models.py's driver (``--vllm-driver``, one subprocess): vLLM's
``get_config`` and ModelConfig rules for head size, KV heads and dtype, the model classes' Mamba state
classmethods and ``Platform._align_hybrid_block_size``, and ``get_kv_cache_groups`` /
``_pool_bytes_per_block`` on the specs vLLM's layers make. kvlayout supplies the layer names and kinds in
model order and the non-hybrids' block size (its backend choice, which tests/test_models_backends.py
checks against vLLM's priority lists and backend classes). The configs are written here, in the shape
of the published ones, small so that vLLM's grouping runs in milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.models.backends import BACKENDS
from kvlayout.spec import FullAttentionSpec, MambaSpec

_BASE = {"torch_dtype": "bfloat16", "vocab_size": 1024, "max_position_embeddings": 4096}

#: rule kind, family label, config
CONFIGS: dict[str, dict[str, Any]] = {
    # plain attention (the generic head size / KV heads rule): Llama, Qwen3-MoE (no window unless
    # use_sliding_window), Phi-3 (the config's window on every layer)
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "intermediate_size": 2048,
    },
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "intermediate_size": 2048,
    },
    "phi3": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "sliding_window": 2047,
        "intermediate_size": 2048,
    },
    "qwen3_moe_sw": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "use_sliding_window": True,
        "sliding_window": 4096,
        "max_window_layers": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "intermediate_size": 2048,
    },
    # Qwen2: every layer slides (max_window_layers 0); a window on some layers only is refused
    "qwen2_sw": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "use_sliding_window": True,
        "sliding_window": 4096,
        "max_window_layers": 0,
        "intermediate_size": 2048,
    },
    # chunked local attention (Llama 4): the RoPE layers, a NoPE (full) layer every fourth
    "llama4": {
        "architectures": ["Llama4ForCausalLM"],
        "model_type": "llama4_text",
        "hidden_size": 1024,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "attention_chunk_size": 8192,
        "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0],
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "intermediate_size": 2048,
        "intermediate_size_mlp": 2048,
    },
    # Llama 4 Scout's multimodal shape: its text model (Llama4ForCausalLM) from text_config, named
    # under language_model (vLLM's mllama4.py); no_rope_layers empty: one NoPE layer every interval
    "llama4_mm": {
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            "hidden_size": 1024,
            "num_hidden_layers": 8,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "attention_chunk_size": 8192,
            "no_rope_layers": [],
            "no_rope_layer_interval": 4,
            "num_local_experts": 4,
            "num_experts_per_tok": 1,
            "intermediate_size": 2048,
            "intermediate_size_mlp": 2048,
            "vocab_size": 1024,
        },
        "vision_config": {"model_type": "llama4_vision_model"},
    },
    # sliding window, per layer
    "gemma2": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "sliding_window": 4096,
        "intermediate_size": 2048,
    },
    # MLA
    "deepseek_v2": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": 2048,
        "num_hidden_layers": 3,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "q_lora_rank": None,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "first_k_dense_replace": 1,
        "intermediate_size": 2048,
    },
    # Mamba2 hybrid with parallel attention
    "falcon_h1": {
        "architectures": ["FalconH1ForCausalLM"],
        "model_type": "falcon_h1",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "mamba_d_ssm": 1024,
        "mamba_n_heads": 16,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 128,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "intermediate_size": 2048,
    },
}

_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"


def _fixture(family: str, **changes: Any) -> dict[str, Any]:
    """A published config of tests/fixtures/models/, cut to a few layers."""
    data: dict[str, Any] = json.loads((_FIXTURES / family / "config.json").read_text())
    return {**data, **changes}


# the hybrids and DeepSeek-V4, from the published configs, cut to 8 (V4: 4) layers
CONFIGS.update(
    {
        "jamba": _fixture("jamba", num_hidden_layers=8),
        "nemotron_h": _fixture("nemotron_h", num_hidden_layers=8, hybrid_override_pattern="M-M*M-M*"),
        # one B/C group: vLLM replicates it to every rank (tp 16: conv (3, 768), 266,752 B per state)
        "nemotron_h_g1": _fixture(
            "nemotron_h", num_hidden_layers=8, hybrid_override_pattern="M-M*M-M*", n_groups=1
        ),
        "qwen3_next": _fixture(
            "qwen3_next", num_hidden_layers=8, layer_types=_fixture("qwen3_next")["layer_types"][:8]
        ),
        # the padding tie of vLLM's packer: ratios [0, 4, 4, 4] (groups swa 4, compressed 6, c4_states 6)
        "deepseek_v4": _fixture("deepseek_v4", num_hidden_layers=4, compress_ratios=[0, 4, 4, 4]),
    }
)
# Llama with a window and no layer_types: LlamaAttention passes none, so every layer takes the engine's
# (issue 25's eighth pass: kvlayout labelled them full)
CONFIGS["llama_sw"] = {**CONFIGS["llama"], "sliding_window": 512}
_TPS = {"gemma2": (1, 2), "nemotron_h_g1": (1, 16), "llama4_mm": (1, 8), "llama_sw": (1,)}

#: (case id, family, from_config keyword arguments, device)
CASES: list[tuple[str, str, dict[str, Any], str]] = [
    (f"{fam}-tp{tp}-{kv}-{dev}", fam, {"tp": tp, **({"kv_cache_dtype": "fp8"} if kv == "fp8" else {})}, dev)
    for fam in CONFIGS
    for tp in _TPS.get(fam, (1, 2, 8))
    for kv in ("bf16", "fp8")
    for dev in ("hopper", "blackwell")
]


def _model(case_id: str, root: Path) -> M.ModelSpec:
    fam, kwargs, dev = next((f, kw, d) for c, f, kw, d in CASES if c == case_id)
    ms = M.from_config(root / fam / "config.json", device=dev, **kwargs)
    assert isinstance(ms, M.ModelSpec)
    return ms


@pytest.fixture(scope="module")
def truth(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("configs")
    for fam, cfg in CONFIGS.items():
        (root / fam).mkdir()
        (root / fam / "config.json").write_text(json.dumps({**_BASE, **cfg}))
    request = []
    for case_id, fam, kwargs, _ in CASES:
        ms = _model(case_id, root)
        request.append(
            {
                "id": case_id,
                "family": fam.removesuffix("_g1"),
                "dir": str(root / fam),
                "tp": kwargs.get("tp", 1),
                "kv_cache_dtype": kwargs.get("kv_cache_dtype", "auto"),
                "mamba_ssm_cache_dtype": "auto",
                "block_size": None,
                "default_block_size": ms.block_size,
                "layers": list(ms.kinds.items()),
            }
        )
    here = Path(__file__).resolve()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = str(here.parents[1])
    res = subprocess.run(
        [sys.executable, str(here.parent / "test_models.py"), "--vllm-driver"],
        input=json.dumps({"cases": request, "backends": list(BACKENDS)}),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return root, json.loads(res.stdout)


def test_every_case_equals_vllm(truth: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    root, answers = truth
    assert len(answers) == len(CASES) + 1 >= 100  # + the backend answers
    for case_id, fam, _, _ in CASES:
        got, ms = answers[case_id], _model(case_id, root)
        assert "error" not in got, (case_id, got.get("error"))
        assert got["dtype"] == ms.dtype, case_id
        attention = [x for _, x in ms.spec.layers if isinstance(x, FullAttentionSpec)]
        for x in attention:  # sliding layers included (a subclass)
            assert (x.head_size, x.num_kv_heads) == (got["head_size"], got["kv_heads"]), case_id
        assert got["use_mla"] == (fam in ("deepseek_v2", "deepseek_v4")), case_id
        if fam in (
            "llama",
            "llama_sw",
            "phi3",
            "qwen3_moe",
            "qwen3_moe_sw",
            "qwen2_sw",
        ):  # which layers slide, by vLLM's config
            slides = [k == "sliding" for k in ms.kinds.values()]
            per_layer = got["layer_types"] if fam in ("llama", "llama_sw", "phi3") else None
            if per_layer is not None:
                assert slides == [t == "sliding_attention" for t in per_layer], case_id
            else:
                assert slides == [got["global_window"] is not None] * len(slides), case_id
        if fam in ("falcon_h1", "jamba", "nemotron_h", "nemotron_h_g1", "qwen3_next"):
            states = {x for _, x in ms.spec.layers if isinstance(x, MambaSpec)}
            assert {x.real_page for x in states} == {got["mamba_page"]}, case_id
            assert ms.block_size == got["block_size"], case_id
        assert [[x.name for x in g.layers] for g in ms.spec.groups] == got["groups"], case_id
        assert {x.name: [x.real_page, x.page] for _, x in ms.spec.layers} == got["pages"], case_id
        assert ms.bytes_per_block == got["bytes_per_block"], case_id


def test_the_cases_move_what_they_should(truth: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    """Hand-computed anchors, so the comparison cannot pass on two equal wrong answers."""
    root, answers = truth
    # MLA: 3 layers * 576 * 2 B * 16 tokens (FLASH_ATTN_MLA, Hopper) / 32 tokens (FLASHINFER_MLA, Blackwell)
    assert answers["deepseek_v2-tp1-bf16-hopper"]["bytes_per_block"] == 3 * 16 * 576 * 2 == 55_296
    assert answers["deepseek_v2-tp8-bf16-blackwell"]["bytes_per_block"] == 3 * 32 * 576 * 2
    assert answers["deepseek_v2-tp2-fp8-hopper"]["bytes_per_block"] == 3 * 64 * 576  # FlashMLA, 64 tokens
    # Phi-3: the window on every layer; Qwen3-MoE: no window
    assert _model("phi3-tp1-bf16-hopper", root).kinds == {
        f"model.layers.{i}.self_attn.attn": "sliding" for i in range(4)
    }
    assert set(_model("qwen3_moe-tp1-bf16-hopper", root).kinds.values()) == {"full"}
    assert set(_model("qwen2_sw-tp1-bf16-hopper", root).kinds.values()) == {"sliding"}
    # FalconH1 at tp 8: one group replicated to 8, conv (3, (1024 + 2 * 8 * 128) / 8 = 384) bf16
    # + ssm (16 / 8, 64, 128) bf16 = 2,304 + 32,768 = 35,072 B
    assert answers["falcon_h1-tp8-bf16-hopper"]["mamba_page"] == 35_072
    assert answers["nemotron_h_g1-tp16-bf16-hopper"]["mamba_shapes"][0] == [3, 768]
    assert answers["nemotron_h_g1-tp16-bf16-hopper"]["mamba_page"] == 266_752
    # Llama 4: 6 chunked layers in 3 groups of 2 (every third), the 2 NoPE layers full; a block row is
    # two pages of 16 tokens * 8 KV heads * 128 * 2 (K, V) * 2 B = 65,536 B
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(8)]
    llama4 = answers["llama4-tp1-bf16-hopper"]
    assert llama4["groups"] == [[layers[i], layers[i + 4]] for i in range(4)]
    assert llama4["bytes_per_block"] == 2 * 16 * 8 * 128 * 2 * 2 == 131_072
    # Scout's multimodal shape: the same groups under language_model.
    mm = answers["llama4_mm-tp1-bf16-hopper"]
    assert mm["groups"] == [[f"language_model.{x}" for x in g] for g in llama4["groups"]]
    assert mm["bytes_per_block"] == llama4["bytes_per_block"]
    assert [len(g) for g in answers["deepseek_v4-tp1-bf16-hopper"]["groups"]] == [4, 6, 6]
    assert answers["deepseek_v4-tp1-bf16-hopper"]["bytes_per_block"] == 149_760


def test_llama4_multimodal_builds_its_text_model_as_language_model() -> None:
    """vLLM 0.33's Llama4ForConditionalGeneration builds Llama4ForCausalLM from text_config under
    ``language_model`` (read from its source: the module needs torchvision, not installed), which is
    what kvlayout's WRAPPERS says; the text model's layers are shown by construction
    (tests/test_models_generic.py)."""
    import importlib.util

    from kvlayout.models.attention import WRAPPERS

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    src = (root / "model_executor" / "models" / "mllama4.py").read_text()
    body = " ".join(src.split())
    assert (
        "self.language_model = initialize_model( vllm_config=vllm_config.with_hf_config( "
        'config.text_config, ["LlamaForCausalLM"] ), prefix=maybe_prefix(prefix, "language_model"), '
        "model_class=Llama4ForCausalLM, )"
    ) in body
    assert WRAPPERS == {"Llama4ForConditionalGeneration": "Llama4ForCausalLM"}


def test_backend_table_and_priority_lists_are_vllms(truth: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    from tests.test_models_backends import check_backend_table, check_priority_lists

    answers = truth[1]["__backends__"]
    check_backend_table(answers)
    check_priority_lists(answers)
