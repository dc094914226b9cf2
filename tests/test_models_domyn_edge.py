"""DomynEdge (``DomynEdgeForCausalLM``, model_type ``domyn_edge``) by vLLM 0.33's own construction (issue 23):
layer i's head size is ``per_layer_config[i].head_dim`` and its window ``window_sizes[i][0] + 1`` (none
where 0), ``model.layers.{i}.attention.attn``.

vLLM ships no config class for the type (the checkpoint's is remote code, not fetched offline): the driver's
plain stand-in (``tests/test_models_hybrid_vllm.py``'s ``_stand_ins``, which asserts neither transformers
nor vLLM has a class for it) holds the fields as written; ``per_layer_config`` (layer index -> overrides) is
transformers' own heterogeneous config, which ``PreTrainedConfig`` itself reads, so the stand-in's
``per_layer_config[i].head_dim`` is what the remote class's would be. Each small config is built as
one rank of tp 1, 2 and 8 (where its heads allow) with a bf16 and an fp8 cache, and its layers, pages,
blocks, windows, groups and bytes per block must equal kvlayout's Hopper and Blackwell plans.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import domyn_edge


def _cfg(
    wins: list[int],
    head: int | None = 64,
    per_layer: dict[str, Any] | None = None,
    *,
    kv: int = 2,
    q: int = 8,
) -> dict[str, Any]:
    """A small config: layer i's window wins[i], the global head_dim head, per_layer's head_dim overrides."""
    n = len(wins)
    out = {
        "architectures": ["DomynEdgeForCausalLM"],
        "model_type": "domyn_edge",
        "auto_map": {"AutoConfig": "configuration_domyn_edge.DomynEdgeConfig"},
        "torch_dtype": "bfloat16",
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_attention_heads": q,
        "num_key_value_heads": kv,
        "num_hidden_layers": n,
        "head_dim": head,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "position_layers": ["rope", "nope"] * (n // 2) + ["rope"] * (n % 2),
        "window_sizes": [[w, 0] for w in wins],
    }
    if head is None:
        del out["head_dim"]
    if per_layer is not None:
        out["per_layer_config"] = {k: {"head_dim": h} for k, h in per_layer.items()}
    return out


CONFIGS: dict[str, dict[str, Any]] = {
    # one head size, every layer full (window 0)
    "uniform": _cfg([0] * 4),
    # mixed head sizes, all full: layers 1 and 3 override the global head_dim (one group of per-layer pages)
    "mixed_heads": _cfg([0] * 4, 64, {"1": 128, "3": 128}),
    # one head size, sliding (window 63: 64 tokens) beside full layers
    "windows": _cfg([63, 63, 0, 63, 63, 0], 128),
    # mixed head sizes and windows, every layer's head_dim its own (no global one): pages unified
    "mixed_both": _cfg([127, 0, 127, 0], None, {"0": 64, "1": 128, "2": 128, "3": 64}),
    # two window sizes, every layer sliding; an override equal to the global head_dim
    "two_windows": _cfg([31, 63, 31, 63], 64, {"2": 64}),
    # pages that do not divide the largest (head sizes 96 and 64): padded, not re-blocked
    "padded": _cfg([63, 0, 63, 0], None, {"0": 96, "1": 64, "2": 64, "3": 96}),
    # 8 KV heads split over the ranks
    "kv8": _cfg([0, 15], kv=8, q=16),
}
TPS = (1, 2, 8)
KVS = ("auto", "fp8")


def _cases() -> dict[str, dict[str, Any]]:
    return {
        f"{name}-tp{tp}-{kv}": {
            "config": cfg,
            "tp": tp,
            "kv_cache_dtype": kv,
            "stand_in": True,
            "gpu_backend": True,
        }
        for name, cfg in CONFIGS.items()
        for tp in TPS
        for kv in KVS
    }


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.test_models_hybrid_vllm import vllm_answers

    return vllm_answers(_cases())


def _differences(answers: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    from tests.test_models_hybrid_vllm import differences

    return differences(answers, _cases())


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers) == set(_cases())
    assert _differences(answers) == []


def test_a_wrong_rule_fails_the_comparison(
    answers: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison can fail: windows of w (not w + 1), or one head size for all, differ from vLLM."""
    right = domyn_edge.windows
    monkeypatch.setattr(
        domyn_edge, "windows", lambda cfg, n: [None if w is None else w - 1 for w in right(cfg, n)]
    )
    bad = {c.split("-")[0] for c, _ in _differences(answers)}
    assert bad == {"windows", "mixed_both", "two_windows", "padded", "kv8"}
    monkeypatch.setattr(domyn_edge, "windows", right)
    sizes = domyn_edge.head_sizes
    monkeypatch.setattr(domyn_edge, "head_sizes", lambda cfg, n: [sizes(cfg, n)[0]] * n)
    assert {c.split("-")[0] for c, _ in _differences(answers)} == {"mixed_heads", "mixed_both", "padded"}


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    name = "model.layers.{}.attention.attn".format
    page = 2 * 64 * 2 * 16 * 2  # 2 KV heads of 64, K and V, 16 tokens, bf16
    u = answers["uniform-tp1-auto"]
    assert u["layers"][name(0)] == ["FullAttentionSpec", page, page] and len(u["groups"]) == 1
    m = answers["mixed_heads-tp1-auto"]
    assert m["layers"][name(1)][1] == 2 * page and len(m["groups"]) == 1 and m["bytes_per_block"] == 6 * page
    w = answers["windows-tp1-auto"]
    assert w["windows"] == {name(i): 64 for i in (0, 1, 3, 4)}
    assert answers["two_windows-tp1-auto"]["windows"] == {name(i): 32 + 32 * (i % 2) for i in range(4)}
    b = answers["mixed_both-tp1-auto"]  # sliding 64 and full 128 under 2 * page: 32-token blocks, 4 groups
    assert b["blocks"] == {name(0): 32, name(1): 16, name(2): 16, name(3): 32} and len(b["groups"]) == 4
    assert b["windows"] == {name(0): 128, name(2): 128} and b["bytes_per_block"] == 2 * page
    assert answers["kv8-tp8-fp8"]["layers"][name(0)][1] == 1 * 64 * 2 * 16


BASE = _cfg([0, 63, 0, 63], 64, {"1": 128, "3": 128})


def _refused(cfg: dict[str, Any], field: str, match: str, tp: int = 1) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, tp=tp, reader="json")
    assert e.value.field == field, str(e.value)


def test_refusals_name_the_field() -> None:
    for key in ("window_sizes", "position_layers"):
        cfg = {k: v for k, v in BASE.items() if k != key}
        _refused(cfg, f"config.{key}", "remote code")
        _refused({**BASE, key: "x"}, f"config.{key}", "must be a list")
        _refused({**BASE, key: BASE[key][:3]}, f"config.{key}", r"one entry per layer \(4\)")
    for bad in (0, -1, "64", 64.0, True, None):
        cfg = copy.deepcopy(BASE)
        cfg["per_layer_config"]["3"]["head_dim"] = bad
        _refused(cfg, "config.per_layer_config[3].head_dim", "positive integer")
    plc = "config.per_layer_config"
    _refused({**BASE, "per_layer_config": [{"head_dim": 64}] * 4}, plc, "layer index -> overrides")
    for key in ("4", "-1", "x", "1.0", " 1"):
        _refused({**BASE, "per_layer_config": {key: {"head_dim": 64}}}, plc, r"layer indices in \[0, 4\)")
    _refused({**BASE, "per_layer_config": {"1": {"head_dim": 64}, "01": {}}}, f"{plc}[01]", "layer 1 again")
    _refused({**BASE, "per_layer_config": {"2": 64}}, f"{plc}[2]", "must be an object")
    for k in ("num_key_value_heads", "skip", "sliding_window"):
        cfg = {**BASE, "per_layer_config": {"2": {"head_dim": 64, k: 4}}}
        _refused(cfg, f"{plc}[2].{k}", "only head_dim per layer")
    # the global head_dim: read by the layers per_layer_config does not cover
    no_head = {k: v for k, v in BASE.items() if k != "head_dim"}
    _refused(no_head, "config.head_dim", "per_layer_config does not give one")
    _refused({**no_head, "per_layer_config": {}}, "config.head_dim", "per_layer_config does not give one")
    for bad_w in ("63", 63.5, True, None):
        cfg = {**BASE, "window_sizes": [[0, 0], [bad_w, 0], [0, 0], [0, 0]]}
        _refused(cfg, "config.window_sizes[1][0]", "an integer")
    cfg = {**BASE, "window_sizes": [[0, 0], 63, [0, 0], [0, 0]]}
    _refused(cfg, "config.window_sizes[1]", "must be a list")
    _refused({**BASE, "position_layers": ["rope", "alibi"] * 2}, "config.position_layers[1]", "rope, nope")
    _refused({**BASE, "sliding_window": 64}, "config.sliding_window", "engine window")
    cfg = {**BASE, "layer_types": ["full_attention", "sliding_attention"] * 2}
    _refused(cfg, "config.layer_types", "max_window")
    for key in ("num_key_value_heads", "num_attention_heads"):
        for reader in ("json", "transformers"):
            cfg = {k: v for k, v in BASE.items() if k != key}
            with pytest.raises(SpecError, match="remote code") as e:
                M.from_config(cfg, reader=reader)
            assert e.value.field == f"config.{key}"
    kv3 = {**BASE, "num_key_value_heads": 3}
    _refused(kv3, "config.num_key_value_heads", "not divisible by tp = 2", tp=2)
    _refused({**BASE, "num_key_value_heads": 3}, "config.num_key_value_heads", "query heads per rank")
    _refused(BASE, "config.num_attention_heads", "not divisible by tp = 3", tp=3)
    with pytest.raises(SpecError, match="per-layer head sizes") as e:
        M.spec_from_config(BASE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"


def test_windows_read_as_vllm_reads_them() -> None:
    """Window w > 0 slides over w + 1 tokens; 0 and below (flash-attn's -1) are full; entries past the last
    layer are not read."""
    cfg = {**BASE, "window_sizes": [[-1, -1], [63, 0], [0, 0], [1, 0], [5, 0]]}
    ms = M.from_config(cfg, reader="json")
    wins = {x.name: getattr(x, "window", None) for _, x in ms.spec.layers}
    name = "model.layers.{}.attention.attn".format
    assert wins == {name(0): None, name(1): 64, name(2): None, name(3): 2}
