"""Hostile pass 25 (/tmp/h25): each finding checked against vLLM 0.33's own construction where it is a model
rule (tests/test_models_hybrid_vllm.py's driver, one batched call), each test failing on the code before
its fix.

M1: Qwen2-MoE of one layer with ``use_sliding_window`` true, no ``layer_types`` and ``max_window_layers``
0 was planned sliding; ``Qwen2MoeConfig`` derives ``["full_attention"]`` (layers slide only below
``max_window_layers``), so the engine's one window is withheld and vLLM builds full attention."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from tests.test_hostile_s24_models import QWEN2_MOE
from tests.test_models_hybrid_vllm import _kvlayout, vllm_answers

#: one decoder layer, the flag on, no layer_types: the window counts only below max_window_layers
ONE = {**QWEN2_MOE, "num_hidden_layers": 1, "sliding_window": 64}


def _kinds(cfg: dict[str, Any], **kw: Any) -> set[str]:
    ms = M.from_config(cfg, **kw)
    assert isinstance(ms, M.ModelSpec)
    return set(ms.kinds.values())


def test_m1_qwen2_moe_one_layer_below_no_window_layers_is_full() -> None:
    assert _kinds({**ONE, "max_window_layers": 0}) == {"full"}
    assert _kinds({**ONE, "max_window_layers": 1}) == {"sliding"}
    # left out: the class's 28 (the default reader reads it through Qwen2MoeConfig, as vLLM does)
    assert _kinds({k: v for k, v in ONE.items() if k != "max_window_layers"}) == {"sliding"}


def test_m1_is_vllms_construction() -> None:
    pytest.importorskip("vllm")
    cases = {
        f"mwl{m}": {
            "config": {**ONE, "max_window_layers": m}, "tp": 1, "kv_cache_dtype": "auto", "gpu_backend": True
        }
        for m in (0, 1)
    }
    answers = vllm_answers(cases)
    assert answers["mwl0"]["windows"] == {} and len(answers["mwl1"]["windows"]) == 1
    for cid, case in cases.items():
        got, want = _kvlayout(case), answers[cid]
        for key in ("block_size", "layers", "blocks", "windows", "groups", "bytes_per_block"):
            assert got[key] == want[key], (cid, key, got[key], want[key])
