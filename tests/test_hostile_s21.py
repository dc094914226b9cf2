"""Hostile pass 21 (/tmp/h21): one regression test per fixed finding, each failing on the code before its
fix (7ba5130). What vLLM 0.33 builds or refuses was shown by its own construction
(tests/test_models_hybrid_vllm.py's driver; ``granite_all_mamba_kv3`` there at tp 1 and 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.errors import LayoutBufferError, SpecError
from kvlayout.reference import compare_to_ranges
from tests.test_hostile_s20 import MAMBA, MAMBA2
from tests.test_models_hybrid_vllm import _BASE, CONFIGS


@pytest.mark.parametrize("cfg", [MAMBA, MAMBA2], ids=["mamba", "mamba2"])
def test_h2_a_null_intermediate_size_is_refused(cfg: dict[str, Any]) -> None:
    """H2 (HIGH): ``"intermediate_size": null`` was read as absent and planned from expand * hidden_size;
    vLLM's Mamba layers read the attribute and fail (None + int, None % int)."""
    said = r"^config\.intermediate_size = None: vLLM 0\.33's Mamba layers read it"
    with pytest.raises(SpecError, match=said):
        M.from_config({**cfg, "intermediate_size": None}, reader="json")


def test_m1_reference_arguments_are_checked() -> None:
    """M1 (MEDIUM): changed_ranges' origin and compare_to_ranges' layout_bytes were not checked (raw
    OverflowError / TypeError, a uint64 origin wrapped); float, string and reversed ranges were coerced."""
    b = K.poison_pattern(64)
    a = b.copy()
    a[8:16] = 0
    for origin in (2**64, np.uint64(2**63), 1.5):
        with pytest.raises(LayoutBufferError, match=r"^origin = "):
            K.changed_ranges(b, a, origin)  # type: ignore[arg-type]
    with pytest.raises(LayoutBufferError, match=r"^layout_bytes = "):
        compare_to_ranges(b, a, [[8, 16]], layout_bytes="x")  # type: ignore[arg-type]
    for exp in ([[8.7, 16.2]], [["8", "16"]], [[30, 20]]):
        with pytest.raises(LayoutBufferError, match=r"^expected = .*: must be \[k, 2\] integer"):
            compare_to_ranges(b, a, exp)  # type: ignore[arg-type]
    assert compare_to_ranges(b, a, [[8, 16]], layout_bytes=64).matches
    assert K.changed_ranges(b, a, 8).tolist() == [[0, 8]]


@pytest.mark.parametrize(("kv", "tp"), [(3, 2), (3, 4), (6, 4)])
def test_l1_a_hybrid_without_attention_layers_takes_kv_heads_tp_does_not_divide(kv: int, tp: int) -> None:
    """L1 (LOW): an all-Mamba Granite 4.0-H with KV heads tp does not divide was refused; vLLM builds no
    attention layer there and its alignment takes max(1, KV heads // tp)."""
    cfg = {**_BASE, **CONFIGS["granite_all_mamba"], "num_key_value_heads": kv}
    ms = M.from_config(cfg, reader="json", tp=tp)
    assert isinstance(ms, M.ModelSpec) and set(ms.kinds.values()) == {"mamba"}
    with pytest.raises(SpecError, match=r"^config\.num_key_value_heads"):  # with an attention layer: refused
        M.from_config({**cfg, "layer_types": ["attention"] + cfg["layer_types"][1:]}, reader="json", tp=tp)


def test_l3_tpu_inference_names_a_hybrid_without_attention_layers() -> None:
    """L3 (LOW): an all-Mamba Granite 4.0-H on tpu-inference failed deep inside on an empty leaf list."""
    cfg = {**_BASE, **CONFIGS["granite_all_mamba"]}
    res = subprocess.run(
        [sys.executable, "-m", "kvlayout", "plan", "--config", "/dev/stdin", "--engine", "tpu-inference"],
        input=json.dumps(cfg), capture_output=True, text=True,
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "GraniteMoeHybridForCausalLM without an attention layer are not read" in res.stderr
