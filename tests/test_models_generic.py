"""The generic attention rules against vLLM 0.33's own model construction (issue 23).

For every architecture of vLLM's registry (kvlayout/models/registry_vllm.py) of kind ``attention`` or
``sliding-window`` that no named family covers, small configs (2 layers, hidden 256) are built into
vLLM's model class on the CPU in one subprocess (vLLM's ModelConfig from the config.json, its
VllmConfig with the cache's one window set as ``EngineArgs.create_engine_config`` sets it, the model
class from its registry, constructed under ``set_current_vllm_config`` in a 1-rank gloo group), and
each attention layer's ``get_kv_cache_spec`` (kind, KV heads, head size, head size of V, window,
dtype) and name is compared with kvlayout's plan of the same config by the generic rules. Variants:
the config class's defaults (read through transformers by both), ``head_dim`` written unlike
``hidden_size // heads``, a window with ``layer_types`` (sliding then full), a window without
``layer_types`` (both readers, json and transformers, on the complete variants). An architecture is
covered iff it constructs and agrees on every variant; the others stay refused with the first
difference or error as the reason. kvlayout/models/vllm_checked.py is this test's output
(``python tests/test_models_generic.py --write``); the test fails when it is not.

Not checked here: tp > 1 (faking a 2-rank group costs a second process); the generic tp rule is
vLLM's ModelConfig.get_num_kv_heads, checked at tp 1/2/8/16 by tests/test_models.py. No stub: the
harness imports only what the CPU install has (an architecture whose module fails is refused with it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "kvlayout" / "models" / "vllm_checked.py"
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
_BASE: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
}
#: variant -> (extra fields, json reader compared too)
VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "defaults": ({}, False),
    "head_dim": ({"head_dim": 64}, True),
    "layer_types": (
        {"head_dim": 64, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]},
        True,
    ),
    "window": ({"head_dim": 64, "sliding_window": 128}, True),
}


def candidates() -> tuple[dict[str, str], dict[str, str]]:
    """(architecture -> transformers model_type) for the harness, and architecture -> why it has none."""
    from transformers.models.auto import modeling_auto as ma

    from kvlayout.models.families import NAMED_FAMILIES
    from kvlayout.models.registry_vllm import TEXT_GENERATION

    model_type: dict[str, str] = {}
    for names in (ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES):
        for mt, cls in names.items():
            for c in [cls] if isinstance(cls, str) else cls:
                model_type.setdefault(c, mt)
    ok, none = {}, {}
    for arch, (_, kind, _) in sorted(TEXT_GENERATION.items()):
        if kind not in ("attention", "sliding-window") or arch in NAMED_FAMILIES:
            continue
        if arch in model_type:
            ok[arch] = model_type[arch]
        else:
            none[arch] = (
                "no transformers config class names it (its config needs vLLM's own config class or "
                "remote code), so the harness builds no config for it"
            )
    return ok, none


def _configs(arch: str, model_type: str) -> dict[str, dict[str, Any]]:
    return {
        v: {**_BASE, **extra, "architectures": [arch], "model_type": model_type}
        for v, (extra, _) in VARIANTS.items()
    }


def vllm_answers(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    env = {**os.environ, **_ENV, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, __file__, "--driver"],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    out: dict[str, dict[str, Any]] = json.loads(res.stdout.splitlines()[-1])
    return out


def _kvlayout(config: dict[str, Any], reader: str, names: tuple[str, str]) -> list[list[Any]]:
    """kvlayout's generic plan of ``config`` as vLLM's answer's rows (the architecture planned as
    ``generic`` with vLLM's layer names)."""
    import kvlayout.models as M
    from kvlayout.models import families, vllm_checked

    arch = config["architectures"][0]
    fam = dict(families.FAMILIES)
    gen = dict(vllm_checked.GENERIC_ATTENTION)
    from kvlayout.models.registry_vllm import TEXT_GENERATION

    family = "generic" if TEXT_GENERATION[arch][1] == "attention" else "generic_sw"
    fam[arch], gen[arch] = family, names
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(families, "FAMILIES", fam)
        mp.setattr(vllm_checked, "GENERIC_ATTENTION", gen)
        mp.setattr("kvlayout.models.attention.GENERIC_ATTENTION", gen)
        mp.setattr("kvlayout.models.build.GENERIC_ATTENTION", gen)
        ms = M.from_config(config, reader=reader, block_size=16)
    assert isinstance(ms, M.ModelSpec)
    rows = []
    for _, layer in ms.spec.layers:
        window = getattr(layer, "window", None)
        kind = "SlidingWindowSpec" if window else "FullAttentionSpec"
        v = getattr(layer, "head_size_v", None) or layer.head_size
        dtype = f"torch.{layer.dtype}"
        rows.append([layer.name, kind, layer.num_kv_heads, layer.head_size, v, window, dtype])
    return rows


def _names(layers: list[list[Any]]) -> tuple[str, str] | None:
    """(prefix, tail) such that layer i is named ``{prefix}.{i}.{tail}``, or None."""
    if not layers:
        return None
    first = layers[0][0]
    for cut in range(len(first)):
        if first[cut:].startswith(".0."):
            prefix, tail = first[:cut], first[cut + 3:]
            if [row[0] for row in layers] == [f"{prefix}.{i}.{tail}" for i in range(len(layers))]:
                return prefix, tail
    return None


def judge(
    arch: str, answers: dict[str, dict[str, Any]], configs: dict[str, dict[str, Any]]
) -> str | tuple[str, str]:
    """(prefix, tail) when vLLM's construction agrees with kvlayout on every variant, else why not."""
    names = None
    for variant, config in configs.items():
        got = answers[f"{arch}/{variant}"]
        if "error" in got:
            return f"vLLM's construction of a 2-layer config ({variant}) failed: {got['error']}"
        n = _names(got["layers"])
        if n is None or len(got["layers"]) != config["num_hidden_layers"]:
            shown = [row[0] for row in got["layers"]][:3]
            return f"its attention layers are not one per decoder layer under one name ({variant}: {shown})"
        names = names or n
        if n != names:
            return f"its layer names change with the config ({variant})"
        for reader in ("transformers", "json") if VARIANTS[variant][1] else ("transformers",):
            try:
                mine = _kvlayout(config, reader, names)
            except Exception as e:  # noqa: BLE001  # kvlayout refuses what vLLM built: recorded
                return f"kvlayout's generic rules refuse the {variant} config ({reader}): {e}"
            if mine != got["layers"]:
                diff = next((a, b) for a, b in zip(mine, got["layers"], strict=True) if a != b)
                return (
                    f"vLLM's layers differ from the generic rules ({variant}, reader {reader}): "
                    f"vLLM {diff[1]}, generic {diff[0]} (name, kind, KV heads, head size, V, window, dtype)"
                )
    assert names is not None
    return names


def _str_lines(key: str, text: str, width: int = 110) -> list[str]:
    """``key: text,`` as table lines of at most ``width`` characters (tests/test_line_length.py):
    a long text is split at spaces into adjacent literals that concatenate back to it."""
    one = f"    {key!r}: {json.dumps(text)},"
    if len(one) <= width:
        return [one]
    parts = textwrap.wrap(text, width - 12, drop_whitespace=False, break_on_hyphens=False,
                          replace_whitespace=False, expand_tabs=False, break_long_words=True)
    if "".join(parts) != text:
        raise ValueError(f"cannot split the reason of {key} exactly")
    return [f"    {key!r}: (", *(f"        {json.dumps(p)}" for p in parts), "    ),"]


def generate() -> str:
    ok, none = candidates()
    cases = {f"{a}/{v}": c for a, mt in ok.items() for v, c in _configs(a, mt).items()}
    answers = vllm_answers(cases)
    generic, refused = {}, dict(none)
    for arch, mt in ok.items():
        verdict = judge(arch, answers, _configs(arch, mt))
        if isinstance(verdict, tuple):
            generic[arch] = verdict
        else:
            refused[arch] = verdict
    lines = [
        '"""Which of vLLM 0.33\'s plain and sliding-window attention architectures follow the generic',
        "rules, by vLLM's own model construction on the CPU (tests/test_models_generic.py, which",
        'generates this file with ``--write`` and fails when it is stale; do not edit)."""',
        "",
        "from __future__ import annotations",
        "",
        "from collections.abc import Mapping",
        "",
        "#: architecture -> (layer-name prefix, tail): layer i is ``{prefix}.{i}.{tail}``",
        "GENERIC_ATTENTION: Mapping[str, tuple[str, str]] = {",
        *(f"    {a!r}: {v!r}," for a, v in sorted(generic.items())),
        "}",
        "#: architecture -> why the generic rules are not taken for it",
        "NOT_GENERIC: Mapping[str, str] = {",
        *(line for a, v in sorted(refused.items()) for line in _str_lines(a, v)),
        "}",
        "",
    ]
    return "\n".join(lines)


def test_the_committed_table_is_vllms_construction() -> None:
    """Every candidate constructs in vLLM and agrees, or is refused with the recorded reason (vLLM
    missing is a failure: scripts/test.sh installs it)."""
    assert TABLE.read_text() == generate()


def test_covered_architectures_plan_through_from_config() -> None:
    """A covered architecture plans without the harness's patching, with vLLM's layer names, and a
    refused one names the reason."""
    import kvlayout.models as M
    from kvlayout.errors import SpecError
    from kvlayout.models.vllm_checked import GENERIC_ATTENTION, NOT_GENERIC

    assert GENERIC_ATTENTION and NOT_GENERIC
    arch = next(iter(GENERIC_ATTENTION))
    ok, _ = candidates()
    config = _configs(arch, ok[arch])["layer_types"]
    ms = M.from_config(config)
    assert isinstance(ms, M.ModelSpec) and ms.family in ("generic", "generic_sw")
    prefix, tail = GENERIC_ATTENTION[arch]
    assert sorted(layer.name for _, layer in ms.spec.layers) == [f"{prefix}.0.{tail}", f"{prefix}.1.{tail}"]
    refused = next(iter(NOT_GENERIC))
    with pytest.raises(SpecError, match="not shown to hold by vLLM's model construction"):
        M.from_config({**config, "architectures": [refused]})


# --------------------------------------------------------------------------- the vLLM side
def _driver() -> None:
    """Build each case's model class in vLLM and print its attention layers' KV cache specs."""
    import contextlib
    import io
    import tempfile

    cases = json.load(sys.stdin)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # vLLM's prints stay off the answer
    import torch
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.models.registry import ModelRegistry

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world_size=1, rank=0, distributed_init_method="tcp://127.0.0.1:0", local_rank=0, backend="gloo"
        )
        initialize_model_parallel(1, 1)
    out: dict[str, Any] = {}
    for case_id, config in cases.items():
        d = tempfile.mkdtemp()
        Path(d, "config.json").write_text(json.dumps(config))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                mc = ModelConfig(model=d, tokenizer=None, skip_tokenizer_init=True, dtype="auto")
                types = getattr(mc.hf_text_config, "layer_types", None)
                window = (  # EngineArgs.create_engine_config's rule for the cache's one window
                    mc.get_sliding_window()
                    if types is None or all(t == "sliding_attention" for t in types)
                    else None
                )
                cache = CacheConfig(block_size=16, sliding_window=window)
                vc = VllmConfig(model_config=mc, cache_config=cache)
                with set_current_vllm_config(vc), torch.device("cpu"):
                    cls, _ = ModelRegistry.resolve_model_cls(config["architectures"], mc)
                    model = cls(vllm_config=vc, prefix="")
            layers = []
            for name, mod in model.named_modules():
                if isinstance(mod, AttentionLayerBase):
                    s = mod.get_kv_cache_spec(vc)
                    fields = ("num_kv_heads", "head_size", "head_size_v", "sliding_window")
                    layers.append([
                        name, type(s).__name__, *(getattr(s, f, None) for f in fields),
                        str(getattr(s, "dtype", None)),
                    ])  # not the block size: the CPU backend's (CUDA's: tests/test_models_backends.py)
            out[case_id] = {"layers": layers}
        except Exception as e:  # noqa: BLE001  # recorded as the architecture's refusal
            out[case_id] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    real_stdout.write(json.dumps(out) + "\n")
    real_stdout.flush()
    os._exit(0)  # skip vLLM's teardown of the gloo group


if __name__ == "__main__" and "--driver" in sys.argv:
    _driver()
elif __name__ == "__main__" and "--write" in sys.argv:
    TABLE.write_text(generate())
