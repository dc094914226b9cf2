"""Issue 25's fresh hostile pass over the fifth session's changes: one regression test per defect found.

- A config whose ``hidden_size`` is below ``num_attention_heads`` (head size ``hidden // heads`` = 0)
  crashed every hybrid family (Jamba, Granite 4.0-H, LFM2, LFM2-MoE, OLMo hybrid) with a raw
  ``ZeroDivisionError`` in the block alignment (``state // (unit * 0)``), a traceback from the CLI.
- A backend target naming a relative module (``--backend ..:x``, ``.x:y``) reached
  ``importlib.import_module``, whose ``TypeError`` escaped as a traceback (zero and conformance).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.cli import main

from .test_models_hybrid_vllm import CONFIGS as HYBRIDS

_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"


def _hybrid_configs() -> dict[str, dict[str, Any]]:
    names = ("granitemoehybrid", "lfm2", "lfm2_moe", "olmo_hybrid")
    out = {name: {"torch_dtype": "bfloat16", **HYBRIDS[name]} for name in names}
    out["jamba"] = json.loads((_FIXTURES / "jamba" / "config.json").read_text())
    return out


def test_head_size_zero_is_a_spec_error_naming_hidden_size(tmp_path: Path, capsys: Any) -> None:
    """hidden_size < num_attention_heads: refused naming hidden_size (was ZeroDivisionError)."""
    for name, cfg in _hybrid_configs().items():
        for engine in ("vllm", "tpu-inference"):
            with pytest.raises(K.SpecError, match=r"hidden_size = 1: .*head size") as e:
                M.from_config({**cfg, "hidden_size": 1}, engine=engine)
            assert e.value.field.endswith("hidden_size"), name
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_hybrid_configs()["lfm2"], "hidden_size": 3}))
    assert main(["plan", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.hidden_size = 3" in err and "Traceback" not in err


def test_relative_backend_target_is_a_backend_error(capsys: Any) -> None:
    """``module:attr`` with a relative module: one line, exit 2 (was a raw TypeError)."""
    for target in ("..:x", ".x:y", ".:Backend"):
        with pytest.raises(K.BackendError, match=r"must be 'module:attr' \(an absolute module\)"):
            K.registry.load(target)
        assert main(["zero", "--preset", "dsv4-test", "--blocks", "0", "--backend", target]) == 2
        assert main(["conformance", "--backend", target]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 2 and f"backend target = {target!r}" in err
