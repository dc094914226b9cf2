"""Kimi-Linear (``KimiLinearForCausalLM``) by vLLM 0.33's own construction (issue 23): KDA states on the
layers ``linear_attn_config.kda_layers`` numbers (1-based), MLA on the others, all named
``model.layers.{i}.self_attn``; the block aligned as vLLM aligns an MLA hybrid's (a multiple of 128 tokens
large enough that one MLA page holds a KDA state, the state padded to it).

vLLM reads the config with its own ``KimiLinearConfig`` (no stand-in). Each small config, in the published
one's structure, is built by tests/test_models_hybrid_vllm.py's driver as one rank of tp 1, 2 and 8 with a
bf16 and an fp8 cache: the model class constructed on the CPU, then, as vLLM's GPU platform does after
loading the model (``Platform.update_block_size_for_backend``), the block size set for the MLA backend
kvlayout resolves for Hopper and for Blackwell (its preferred block, or the block a user sets, then
``_align_hybrid_block_size``), then the layers' own ``get_kv_cache_spec`` and vLLM's grouping. The driver's
stubs (tests/driver.py): the CPU platform's MLA refusal of fp8 (``cpu_mla_takes_fp8``) and Kimi-Linear's
(``cpu_kimi_linear``: a CUDA stream's placeholder, the o_proj kernel flag, the CPU's prefix-caching rule for
MLA put back to a GPU's default). Layers, state bytes, pages (real and padded), blocks, groups and bytes per
block must equal kvlayout's plan on each device whose case it is; where kvlayout refuses, vLLM fails too.

AliceAI (``AliceAIForCausalLM``) builds the same KDA layer beside Qwen3-Next's gated standard attention: its
small configs go through the driver's default hybrid path (the standard alignment, as the hybrids of
tests/test_models_hybrid_vllm.py), its remote-code config stood in for by the fields as written.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import kimi_linear as K
from kvlayout.models.backends import BACKENDS, resolve

#: moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json in its structure (tests/fixtures/published/), small:
#: 8 layers, every fourth MLA; KDA 8 heads of 32, conv 4; MLA latent 64 + RoPE 16, qk_nope_head_dim 64
BASE: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "dtype": "bfloat16",
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 32,
    "kv_lora_rank": 64,
    "q_lora_rank": None,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "mla_use_nope": True,
    "linear_attn_config": {
        "full_attn_layers": [4, 8],
        "head_dim": 32,
        "kda_layers": [1, 2, 3, 5, 6, 7],
        "num_heads": 8,
        "short_conv_kernel_size": 4,
    },
    "num_experts": 4,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 64,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def _lin(**kw: Any) -> dict[str, Any]:
    return {**BASE, "linear_attn_config": {**BASE["linear_attn_config"], **kw}}


CONFIGS: dict[str, dict[str, Any]] = {
    "base": BASE,
    # the first layer MLA (its group first); full_attn_layers not the complement and a number past the
    # layers (vLLM reads only kda_layers, and builds nothing for 9)
    "mla_first": {**_lin(kda_layers=[2, 3, 4, 6, 7, 8, 9], full_attn_layers=[1]), "num_hidden_layers": 8},
    # a larger state (16 heads of 64: 2.6 MLA pages of 128 tokens at tp 1), qk_nope_head_dim 128 (published)
    "big_state": {**_lin(num_heads=16, head_dim=64), "qk_nope_head_dim": 128},
    # qk_nope_head_dim 32: CUTLASS_MLA on Blackwell (kernel blocks of 128)
    "nope32": {**BASE, "qk_nope_head_dim": 32},
    # no KDA layer: still aligned (the model is hybrid; the state from the config)
    "no_kda": _lin(kda_layers=[], full_attn_layers=list(range(1, 9))),
    # no MLA layer: no attention backend, nothing aligned, 16-token blocks
    "all_kda": _lin(kda_layers=list(range(1, 9)), full_attn_layers=[]),
    # a conv kernel of 2 (one step kept), and 4 KDA heads (tp 8 refused: vLLM asserts heads % tp)
    "conv2_heads4": _lin(short_conv_kernel_size=2, num_heads=4),
}
TPS = (1, 2, 8)
KVS = ("auto", "fp8")
DEVICES = ("hopper", "blackwell")
#: (config, tp, kv, device, user block size, mamba_ssm_cache_dtype) beyond the grid: a block the user sets
#: (raised to 128 tokens and more), and a bfloat16 ssm dtype: the alignment's state (which it halves) and
#: the layers' (float32): planned where the padded page still holds the state, refused where not
EXTRA: tuple[tuple[str, int, str, str, int | None, str | None], ...] = (
    ("base", 1, "auto", "hopper", 64, None),
    ("base", 2, "fp8", "hopper", 512, None),
    ("big_state", 1, "auto", "blackwell", 96, None),
    ("all_kda", 1, "auto", "hopper", 32, None),
    ("base", 1, "auto", "hopper", None, "bfloat16"),
    ("base", 1, "auto", "hopper", None, "float32"),
    ("big_state", 1, "auto", "hopper", None, "bfloat16"),
    ("big_state", 8, "fp8", "hopper", None, "bfloat16"),
)


def _plan(cfg: dict[str, Any], tp: int, kv: str, device: str, block: int | None, ssm: str | None) -> Any:
    """kvlayout's plan, or the SpecError it refuses with."""
    try:
        return M.from_config(
            cfg, tp=tp, kv_cache_dtype=None if kv == "auto" else kv, device=device, block_size=block,
            mamba_ssm_cache_dtype=ssm,
        )
    except SpecError as e:
        return e


def _grid() -> list[tuple[str, int, str, str, int | None, str | None]]:
    grid = [(n, tp, kv, d, None, None) for n in CONFIGS for tp in TPS for kv in KVS for d in DEVICES]
    return [*grid, *EXTRA]


@functools.cache
def _cases() -> dict[str, dict[str, Any]]:
    """Kimi-Linear's driver cases (:func:`_mla_cases`)."""
    return _mla_cases(CONFIGS, _grid())


def _mla_cases(
    configs: dict[str, dict[str, Any]], grid: list[tuple[str, int, str, str, int | None, str | None]]
) -> dict[str, dict[str, Any]]:
    """One driver case per config, tp, cache dtype, starting block, MLA backend and ssm dtype (made once: a
    wrong rule patched in later changes kvlayout's plans, not the cases); ``devices``: whose case it is.
    The starting block is the MLA backend's preferred one (or the user's), the backend the one kvlayout
    resolves (tests/test_models_backends.py checks both against vLLM's); for a plan kvlayout refuses, those
    of the same config at tp 1 with the default ssm dtype (refused too: the device's MLA backend)."""
    out: dict[str, dict[str, Any]] = {}
    for name, tp, kv, device, user, ssm in grid:
        ms = _plan(configs[name], tp, kv, device, user, ssm)
        if not isinstance(ms, M.ModelSpec):
            ms = _plan(configs[name], 1, kv, device, user, None)
        if isinstance(ms, M.ModelSpec):  # no MLA layer: no backend, nothing aligned (the name is not used)
            backend = ms.attention_backend or "FLASH_ATTN_MLA"
            start = user or (BACKENDS[backend].preferred_block_size() if ms.attention_backend else 16)
        else:  # refused at tp 1 too: the MLA backend of the device, the cache and the config
            nope = configs[name]["qk_nope_head_dim"]
            r = resolve(mla=True, device=device, kv_cache_dtype=kv, qk_nope_head_dim=nope, block_size=user)
            backend, start = r.backend.name, user or r.block_size
        key = f"{name}-tp{tp}-{kv}-{backend}-b{start}" + (f"-u{user}" if user else "")
        key += f"-{ssm}" if ssm else ""
        case = out.setdefault(key, {
            "config": configs[name], "tp": tp, "kv_cache_dtype": kv, "block_size": start,
            "align_backend": backend, "devices": [],
        })
        if user:
            case["user_block_size"] = user
        if ssm:
            case["mamba_ssm_cache_dtype"] = ssm
        case["devices"].append(device)
    return out


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.test_models_hybrid_vllm import vllm_answers

    cases = {**_cases(), **_alice_cases(), **_bailing_cases()}
    return vllm_answers({k: {x: v for x, v in c.items() if x != "devices"} for k, c in cases.items()})


def _mismatches(
    answers: dict[str, dict[str, Any]], cases: dict[str, dict[str, Any]] | None = None
) -> list[tuple[str, str, str]]:
    """(case, device, why) where kvlayout's plan differs from vLLM's construction, or only one refuses
    (``cases``: Kimi-Linear's unless given)."""
    from tests.test_models_hybrid_vllm import _kvlayout

    bad = []
    for case_id, case in (_cases() if cases is None else cases).items():
        got = answers[case_id]
        for device in case["devices"]:
            try:
                mine = _kvlayout({**case, "device": device})
            except SpecError as e:
                if "error" not in got:
                    bad.append((case_id, device, f"kvlayout refuses, vLLM builds: {e}"))
                continue
            if "error" in got:
                bad.append((case_id, device, f"vLLM fails: {got['error']}"))
            elif mine != {k: got[k] for k in mine}:
                bad.append((case_id, device, "differs"))
    return bad


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers) == set(_cases()) | set(_alice_cases()) | set(_bailing_cases())
    assert _mismatches(answers) == []
    # the cases vLLM fails are the ones kvlayout refuses: KDA heads not divisible by tp, and the bfloat16
    # ssm states whose padded page cannot hold the layers' float32 state
    failed = sorted(k for k in _cases() if "error" in answers[k])
    assert failed and all(k.startswith("conv2_heads4-tp8") or k.endswith("-bfloat16") for k in failed), failed
    built = set(_cases()) - set(failed)
    assert any(k.endswith("-bfloat16") for k in failed) and any(k.endswith("-bfloat16") for k in built)


def test_a_wrong_rule_fails_the_comparison(answers: dict[str, dict[str, Any]], monkeypatch: Any) -> None:
    """The comparison can fail: the standard hybrid's 16-token unit for the MLA one's 128, kda_layers read
    0-based, or the recurrent state in the ssm dtype the alignment takes, each differ from vLLM's."""
    monkeypatch.setattr(K, "MLA_HYBRID_UNIT", 16)
    assert len(_mismatches(answers)) > 20
    monkeypatch.undo()

    real = K.kda_layers

    def zero_based(c: Any, lin: Any, n: int) -> list[bool]:
        return [i in {int(x) for x in lin.data["kda_layers"]} for i in range(n)]

    monkeypatch.setattr(K, "kda_layers", zero_based)
    assert len(_mismatches(answers)) > 20
    monkeypatch.setattr(K, "kda_layers", real)

    monkeypatch.setattr(K, "_kda_state", lambda c, lin: (lambda s: (s[1], s[1]))(real_state(c, lin)))
    bad = _mismatches(answers)
    assert bad and all(case.endswith("-bfloat16") for case, _, _ in bad), bad


real_state = K._kda_state


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    names = [f"model.layers.{i}.self_attn" for i in range(8)]
    b = answers["base-tp1-auto-FLASH_ATTN_MLA-b16"]
    # KDA: conv (4 - 1, 3 * 8 * 32) bf16 = 4,608 B + recurrent (8, 32, 32) float32 = 32,768 B; MLA one latent
    # head of 64 + 16 bf16 = 160 B a token: 128-token units of 20,480 B, two hold the state: 256 tokens
    assert b["states"][names[0]] == [[[3, 768], [8, 32, 32]], ["torch.bfloat16", "torch.float32"]]
    assert b["block_size"] == 256 and b["blocks"] == {names[3]: 256, names[7]: 256}
    assert b["layers"][names[0]] == ["MambaSpec", 37_376, 40_960]
    assert b["layers"][names[3]] == ["MLAAttentionSpec", 40_960, 40_960]
    # 6 KDA layers (0-2, 4-6) and 2 MLA: groups of 2, three of KDA (every third KDA layer) and one of MLA
    assert b["groups"] == [[names[i], names[i + 4]] for i in range(4)]
    assert b["bytes_per_block"] == 2 * 40_960
    # fp8 (FlashMLA): 80 B a token, 10,240 B a unit; 4 units: 512 tokens; tp 8: (3, 96) + (1, 32, 32) float32
    assert answers["base-tp1-fp8-FLASHMLA-b64"]["block_size"] == 512
    t8 = answers["base-tp8-auto-FLASH_ATTN_MLA-b16"]
    assert t8["states"][names[0]][0] == [[3, 96], [1, 32, 32]] and t8["block_size"] == 128
    # the MLA layer first: its group first; layer 9 of kda_layers builds nothing
    m = answers["mla_first-tp1-auto-FLASH_ATTN_MLA-b16"]
    assert m["groups"][0] == [names[0], names[4]] and len(m["layers"]) == 8
    # no MLA layer: 16-token blocks, states unpadded, one group
    a = answers["all_kda-tp1-auto-FLASH_ATTN_MLA-b16"]
    assert a["block_size"] == 16 and a["layers"][names[0]] == ["MambaSpec", 37_376, 37_376]
    assert a["groups"] == [names] and a["bytes_per_block"] == 8 * 37_376
    # no KDA layer: the block aligned all the same (256 tokens), one group of MLA layers
    n = answers["no_kda-tp1-auto-FLASH_ATTN_MLA-b16"]
    assert n["block_size"] == 256 and n["groups"] == [names]
    # a user's 512 tokens stand (already a multiple of 128 holding the state: 8 units at fp8, tp 2)
    assert answers["base-tp2-fp8-FLASHMLA-b512-u512"]["block_size"] == 512
    # bfloat16 ssm: aligned to 4,608 + 16,384 B (two units), the float32 state 37,376 B padded to 40,960 B
    s = answers["base-tp1-auto-FLASH_ATTN_MLA-b16-bfloat16"]
    assert s["block_size"] == 256 and s["layers"][names[0]] == ["MambaSpec", 37_376, 40_960]
    assert "error" in answers["big_state-tp1-auto-FLASH_ATTN_MLA-b16-bfloat16"]


def _refused(cfg: dict[str, Any], field: str, match: str, **kw: Any) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, reader="json", **kw)
    assert e.value.field == field, str(e.value)


def test_published_kimi_linear_48b() -> None:
    """moonshotai/Kimi-Linear-48B-A3B-Instruct (tests/fixtures/published/): 20 KDA layers (32 heads of 128,
    conv 4) and 7 MLA (512 + 64); tp 1, bf16, Hopper: a 2,170,880 B state, 1,152 B an MLA token: 15 units of
    128 tokens (1,920), 2,211,840 B pages, groups of 7: 15,482,880 B a block."""
    path = "tests/fixtures/published/kimi_linear_48b_a3b_instruct.json"
    ms = M.from_config(path)
    assert isinstance(ms, M.ModelSpec) and ms.family == "kimi_linear" and ms.block_size == 1920
    assert ms.bytes_per_block == 7 * 1920 * 1152 == 15_482_880
    kda = [x for _, x in ms.spec.layers if ms.kinds[x.name] == "kda"]
    assert len(kda) == 20 and kda[0].real_page == 3 * 12_288 * 2 + 32 * 128 * 128 * 4
    assert kda[0].page == 2_211_840
    tp8 = M.from_config(path, tp=8, kv_cache_dtype="fp8")
    assert isinstance(tp8, M.ModelSpec) and tp8.block_size == 512 and tp8.attention_backend == "FLASHMLA"
    with pytest.raises(SpecError, match="KDA states beside MLA layers") as e:
        M.spec_from_config(path, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"


def test_refusals_name_the_field() -> None:
    lin = "config.linear_attn_config"
    for key in ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                "num_attention_heads"):
        _refused({k: v for k, v in BASE.items() if k != key}, f"config.{key}", "own config class")
    _refused({k: v for k, v in BASE.items() if k != "linear_attn_config"}, lin, "num_heads")
    _refused({**BASE, "linear_attn_config": [1, 2]}, lin, "JSON object")
    for key in ("num_heads", "head_dim", "short_conv_kernel_size", "kda_layers", "full_attn_layers"):
        left = {k: v for k, v in BASE["linear_attn_config"].items() if k != key}
        cfg = {**BASE, "linear_attn_config": left}
        _refused(cfg, f"{lin}.{key}", "missing")
    _refused(_lin(kda_layers=[1, "2"]), f"{lin}.kda_layers[1]", "an integer")
    _refused(_lin(kda_layers=3), f"{lin}.kda_layers", "a list")
    _refused(_lin(num_heads=6), f"{lin}.num_heads", "not divisible by tp = 4", tp=4)
    _refused(_lin(use_full_rank_gate=True), f"{lin}.use_full_rank_gate", "KimiK3DeltaAttention")
    _refused({**BASE, "num_attention_heads": 6}, "config.num_attention_heads", "divisible by tp = 4", tp=4)
    _refused({**BASE, "mla_use_nope": False}, "config.mla_use_nope", "asserts it is true")
    _refused({**BASE, "model_type": "kimi_k3"}, "config.model_type", "KimiLinearConfig")
    for ssm in ("float16", "fp8"):
        with pytest.raises(SpecError) as e:
            M.from_config(BASE, mamba_ssm_cache_dtype=ssm)
        assert e.value.field == "mamba_ssm_cache_dtype"
    _refused(CONFIGS["big_state"], "mamba_ssm_cache_dtype", "does not hold", mamba_ssm_cache_dtype="bfloat16")
    # kvlayout's notes: where the block was raised, and the lists vLLM reads only in part
    ms = M.from_config(CONFIGS["mla_first"], block_size=64)
    assert isinstance(ms, M.ModelSpec) and ms.block_size == 256
    said = " ".join(ms.notes)
    assert "raised to 256" in said and "outside 1..8" in said and "reads only kda_layers" in said


# --------------------------------------------------------------------------- AliceAI
#: yandex/AliceAI-Foundation-80B-A3B's structure (its remote-code config, stood in for by the driver as the
#: fields written: vLLM 0.33 has no class of its own), small: 3 KDA layers to 1 gated full attention
ALICE: dict[str, Any] = {
    "architectures": ["AliceAIForCausalLM"],
    "model_type": "alice_ai",
    "auto_map": {"AutoConfig": "configuration_alice_ai.AliceAIConfig"},
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "block_attn_res_block_size": 2,
    "kda_allow_negative_eigenvalues": False,
    "router_score_function": "sigmoid",
    "router_bias_correction": True,
    "partial_rotary_factor": 0.25,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
}
ALICE_CONFIGS: dict[str, dict[str, Any]] = {
    "alice": ALICE,
    # 8 KV heads (one a rank at tp 8), the first layer full attention, a larger state (16 heads of 64)
    "alice_kv8": {
        **ALICE, "num_key_value_heads": 8, "layer_types": ["full_attention"] + ALICE["layer_types"][1:],
        "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
    },
    # 4 KDA heads: tp 8 refused (vLLM asserts heads % tp)
    "alice_heads4": {**ALICE, "linear_num_key_heads": 4, "linear_num_value_heads": 4},
    # value heads unlike the key heads: vLLM's AliceAI raises (kvlayout refuses at every tp)
    "alice_vheads": {**ALICE, "linear_num_value_heads": 16},
}
#: beyond the grid: a block the user sets, and a bfloat16 ssm dtype (AliceAI's KDA state stays float32)
ALICE_EXTRA = (("alice", 1, "auto", 32, None), ("alice", 2, "fp8", None, "bfloat16"))


@functools.cache
def _alice_cases() -> dict[str, dict[str, Any]]:
    """AliceAI's driver cases (the hybrid driver's default path: the standard hybrid alignment before the
    model is built, as tests/test_models_hybrid_vllm.py's hybrids), each for Hopper and Blackwell (16-token
    standard attention on both)."""
    grid = [(n, tp, kv, None, None) for n in ALICE_CONFIGS for tp in TPS for kv in KVS]
    out: dict[str, dict[str, Any]] = {}
    for name, tp, kv, user, ssm in [*grid, *ALICE_EXTRA]:
        key = f"{name}-tp{tp}-{kv}" + (f"-u{user}" if user else "") + (f"-{ssm}" if ssm else "")
        case: dict[str, Any] = {
            "config": ALICE_CONFIGS[name], "tp": tp, "kv_cache_dtype": kv, "stand_in": True,
            "devices": list(DEVICES),
        }
        if user:
            case.update(block_size=user, user_block_size=user)
        if ssm:
            case["mamba_ssm_cache_dtype"] = ssm
        out[key] = case
    return out


def test_alice_ai_equals_vllms_construction(answers: dict[str, dict[str, Any]], monkeypatch: Any) -> None:
    """AliceAI: layers, states, pages, blocks, groups and bytes per block as vLLM builds them; the cases vLLM
    fails (4 KDA heads at tp 8, value heads unlike the key heads) are those kvlayout refuses; vLLM's numbers
    by hand; a wrong rule (the recurrent state in the model dtype, as the gated delta net's) fails it."""
    cases = _alice_cases()
    assert _mismatches(answers, cases) == []
    failed = sorted(k for k in cases if "error" in answers[k])
    assert failed == sorted(
        [f"alice_heads4-tp8-{kv}" for kv in KVS] + [f"alice_vheads-tp{tp}-{kv}" for tp in TPS for kv in KVS]
    ), failed
    names = [f"model.layers.{i}.linear_attn" for i in (0, 1, 2, 4, 5, 6)]
    a = answers["alice-tp1-auto"]
    # KDA conv (3, 768) bf16 + (8, 32, 32) float32 = 37,376 B; attention 2 KV heads of 64, K and V, bf16:
    # 512 B a token: 16 * ceil(37,376 / 8,192) = 80 tokens, 40,960 B pages; groups of 2 as Kimi-Linear's
    assert a["states"][names[0]] == [[[3, 768], [8, 32, 32]], ["torch.bfloat16", "torch.float32"]]
    assert a["block_size"] == 80 and a["layers"][names[0]] == ["MambaSpec", 37_376, 40_960]
    assert a["layers"]["model.layers.3.self_attn.attn"] == ["FullAttentionSpec", 40_960, 40_960]
    assert a["bytes_per_block"] == 2 * 40_960
    # the bfloat16 ssm dtype leaves the state float32 (AliceAI's alignment and layers take none)
    assert answers["alice-tp2-fp8-bfloat16"]["states"][names[0]][1] == ["torch.bfloat16", "torch.float32"]
    monkeypatch.setattr(K, "kda_state_bytes", lambda c, h, d, k, ssm="float32": real_kda(c, h, d, k, c.dtype))
    assert len(_mismatches(answers, cases)) > 10


real_kda = K.kda_state_bytes


def test_alice_ai_refusals_name_the_field() -> None:
    for key, bad in (("kda_allow_negative_eigenvalues", True), ("router_score_function", "softmax"),
                     ("router_bias_correction", False), ("kda_allow_negative_eigenvalues", 0)):
        _refused({**ALICE, key: bad}, f"config.{key}", "serves AliceAI only with")
    for key in ("head_dim", "num_experts", "block_attn_res_block_size", "layer_types",
                "linear_conv_kernel_dim"):
        _refused({k: v for k, v in ALICE.items() if k != key}, f"config.{key}", "missing")
    _refused({**ALICE, "layer_types": ["mamba"] * 8}, "config.layer_types[0]", "valid: linear_attention")
    _refused(ALICE_CONFIGS["alice_vheads"], "config.linear_num_value_heads", "requires 8")
    _refused(ALICE_CONFIGS["alice_heads4"], "config.linear_num_key_heads", "divisible by tp = 8", tp=8)
    _refused({**ALICE, "num_experts": 4}, "config.num_experts", "at least tp = 8", tp=8)  # vLLM raises
    ms = M.from_config(ALICE, mamba_ssm_cache_dtype="bfloat16")
    assert isinstance(ms, M.ModelSpec) and any("stays float32" in x for x in ms.notes)
    with pytest.raises(SpecError, match="KDA states beside gated attention") as e:
        M.spec_from_config(ALICE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"


# --------------------------------------------------------------------------- Bailing MoE V3
#: Bailing MoE V3 (inclusionAI's Ling hybrids) in the shape transformers' BailingHybridConfig reads, small:
#: 6 layers in groups of 4 (layers 3, 4 and 5 MLA: the fourth, and the tail past the last whole group); its
#: head_dim 32 is replaced by qk_rope_head_dim 16 (the class), which vLLM 0.33's KDA layers take
BAILING: dict[str, Any] = {
    "architectures": ["BailingMoeV3ForCausalLM"],
    "model_type": "bailing_hybrid",
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 32,
    "layer_group_size": 4,
    "kv_lora_rank": 64,
    "q_lora_rank": None,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 64,
    "v_head_dim": 32,
    "short_conv_kernel_size": 4,
    "no_kda_lora": True,
    "use_bias": False,
    "num_experts": 8,
    "num_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64,
    "first_k_dense_replace": 1,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
}
BAILING_CONFIGS: dict[str, dict[str, Any]] = {
    "bailing": BAILING,
    # groups of 3 over 7 layers (MLA 2, 5 and the tail 6), 16 heads of 64 (head_dim as written: no note),
    # qk_nope_head_dim 128
    "bailing_g3": {**BAILING, "num_hidden_layers": 7, "layer_group_size": 3, "num_attention_heads": 16,
                   "qk_rope_head_dim": 64, "head_dim": 64, "qk_nope_head_dim": 128},
    # KDA LoRA: vLLM's Bailing V3 KDA raises (kvlayout refuses at every tp)
    "bailing_lora": {**BAILING, "no_kda_lora": False},
}


@functools.cache
def _bailing_cases() -> dict[str, dict[str, Any]]:
    """Bailing MoE V3's driver cases (:func:`_mla_cases`: the block set for the MLA backend after the model
    is built); its config class is transformers' (no stand-in)."""
    grid = [(n, tp, kv, d, None, None) for n in BAILING_CONFIGS for tp in TPS for kv in KVS for d in DEVICES]
    return _mla_cases(BAILING_CONFIGS, [*grid, ("bailing", 1, "auto", "hopper", 256, None)])


def test_bailing_moe_v3_equals_vllms_construction(
    answers: dict[str, dict[str, Any]], monkeypatch: Any
) -> None:
    """Bailing MoE V3: as vLLM builds it; the KDA LoRA cases vLLM fails are those kvlayout refuses; the KDA
    heads of qk_rope_head_dim, the MLA layers and the 128-token alignment by hand; the standard hybrid's
    16-token unit in place of the MLA one's 128 fails the comparison."""
    cases = _bailing_cases()
    assert _mismatches(answers, cases) == []
    failed = {k for k in cases if "error" in answers[k]}
    assert failed == {k for k in cases if k.startswith("bailing_lora-")}, failed
    b = answers["bailing-tp1-auto-FLASH_ATTN_MLA-b16"]
    # KDA conv (3, 3 * 8 * 16) bf16 + (8, 16, 16) float32 = 2,304 + 8,192 B; MLA 64 + 16 bf16 = 160 B a token:
    # one unit of 128 tokens (20,480 B) holds it
    state = [[[3, 384], [8, 16, 16]], ["torch.bfloat16", "torch.float32"]]
    assert b["states"]["model.layers.0.self_attn"] == state
    assert b["block_size"] == 128 and b["layers"]["model.layers.0.self_attn"] == ["MambaSpec", 10_496, 20_480]
    mla = [f"model.layers.{i}.self_attn.attn" for i in (3, 4, 5)]
    assert b["groups"] == [[f"model.layers.{i}.self_attn" for i in range(3)], mla]
    g3 = answers["bailing_g3-tp1-auto-FLASH_ATTN_MLA-b16"]
    # 16 heads of 64: 18,432 + 262,144 B; 128 + 128 latent a token, bf16: 9 units of 128 tokens
    assert g3["block_size"] == 1152 and sorted(n for n in g3["blocks"]) == [
        f"model.layers.{i}.self_attn.attn" for i in (2, 5, 6)]
    ms = M.from_config(BAILING)
    assert isinstance(ms, M.ModelSpec) and any("makes head_dim qk_rope_head_dim (16)" in x for x in ms.notes)
    _refused(BAILING_CONFIGS["bailing_lora"], "config.no_kda_lora", "require it true")
    _refused({**BAILING, "num_attention_heads": 6}, "config.num_attention_heads", "divisible by tp = 4", tp=4)
    _refused({**BAILING, "model_type": "bailing_moe"}, "config.model_type", "BailingHybridConfig")
    _refused({k: v for k, v in BAILING.items() if k != "use_bias"}, "config.use_bias", "AttributeError")
    with pytest.raises(SpecError, match="KDA states beside MLA layers"):
        M.spec_from_config(BAILING, engine="tpu-inference", reader="json")
    monkeypatch.setattr(K, "MLA_HYBRID_UNIT", 16)
    assert len(_mismatches(answers, cases)) > 20
