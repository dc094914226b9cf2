"""Mamba-only models (issue 23, eighteenth session): vLLM 0.33 registers MambaForCausalLM,
FalconMambaForCausalLM and Mamba2ForCausalLM attention-free, yet each layer holds a Mamba state per
block; kvlayout refused them as having no cache. vLLM's own construction of small and published configs
is compared in tests/test_models_hybrid_vllm.py and tests/test_models_published_s16.py; here the rule's
reading of the config and its refusals, without vLLM."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.spec import MambaSpec

BASE: dict[str, Any] = {"torch_dtype": "bfloat16", "hidden_size": 256, "num_hidden_layers": 3,
                        "state_size": 16, "conv_kernel": 4, "expand": 2}
MAMBA = {**BASE, "architectures": ["MambaForCausalLM"], "model_type": "mamba"}
MAMBA2 = {**BASE, "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "num_heads": 8,
          "head_dim": 64, "n_groups": 1, "state_size": 64}


def _states(cfg: dict[str, Any], **kw: Any) -> list[int]:
    ms = M.from_config(cfg, reader="json", **kw)
    assert isinstance(ms, M.ModelSpec)
    return [x.state_bytes for _, x in ms.spec.layers if isinstance(x, MambaSpec)]


def test_mamba1_inner_size_is_expand_unless_written() -> None:
    # conv (3, 512 / tp) + ssm (512 / tp, 16), bf16
    assert _states(MAMBA) == [3 * 512 * 2 + 512 * 16 * 2] * 3
    assert _states(MAMBA, tp=2) == [3 * 256 * 2 + 256 * 16 * 2] * 3
    # a written intermediate_size stands (falcon-mamba-7b: 8192 beside expand 16)
    falcon = {**MAMBA, "architectures": ["FalconMambaForCausalLM"], "model_type": "falcon_mamba",
              "expand": 16, "intermediate_size": 128}
    assert _states(falcon) == [3 * 128 * 2 + 128 * 16 * 2] * 3
    # the ssm state dtype asked for (float32 states)
    assert _states(MAMBA, mamba_ssm_cache_dtype="float32") == [3 * 512 * 2 + 512 * 16 * 4] * 3


def test_mamba_only_spec_names_groups_and_nothing_zeroed() -> None:
    ms = M.from_config(MAMBA2, reader="json", tp=8)
    assert isinstance(ms, M.ModelSpec)
    assert ms.block_size == 16 and ms.family == "mamba2" and ms.attention_backend == ""
    assert [x.name for _, x in ms.spec.layers] == [f"backbone.layers.{i}.mixer" for i in range(3)]
    assert len(ms.spec.groups) == 1 and set(ms.kinds.values()) == {"mamba"}
    # one group replicated to 8 ranks: conv (3, (512 + 2 * 8 * 64) / 8), ssm (1, 64, 64)
    state = 3 * (512 + 2 * 8 * 64) // 8 * 2 + 64 * 64 * 2
    assert ms.bytes_per_block == 3 * state
    table = K.plan(ms.spec)
    assert K.verify(table).ok and len(table.segments) == 0  # states are never zeroed
    assert any("Mamba only" in n for n in ms.notes)
    assert M.from_config(MAMBA2, reader="json", block_size=64).block_size == 64  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({**MAMBA2, "num_heads": 4}, "config.num_heads"),  # 4 * 64 != 2 * 256: Mamba2Config refuses
        ({**MAMBA2, "n_groups": 2}, "config.n_groups"),  # 2 groups on 8 ranks: vLLM asserts
        ({**MAMBA, "expand": 3, "hidden_size": 3}, "config.intermediate_size"),  # 9 channels on 2 ranks
        ({k: v for k, v in MAMBA.items() if k != "state_size"}, "config.state_size"),
        ({**MAMBA, "conv_kernel": 0}, "config.conv_kernel"),
    ],
)
def test_mamba_only_refusals_name_the_field(cfg: dict[str, Any], field: str) -> None:
    tp = 8 if "n_groups" in cfg and cfg["n_groups"] == 2 else 2
    with pytest.raises(SpecError, match=f"^{field}"):
        M.from_config(cfg, reader="json", tp=tp)
