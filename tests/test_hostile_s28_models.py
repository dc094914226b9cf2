"""Hostile pass 28 (/tmp/h28), the model-config findings: plans unlike vLLM 0.33's. Each test fails on the
code before its fix (9db1ccd's models).

- Q1: ``quantization_config`` was read as written; vLLM's ModelConfig first normalises it
  (``_normalize_quantization_config``): a ModelOpt producer (``producer.name``, or the legacy
  ``quantization.modelopt_quant_config``) sets ``quant_method`` from ``quant_algo``, ``quant_method`` is
  lowercased and ``compressed_tensors`` spelled with a hyphen, ``compression_config`` stands in where no
  ``quantization_config`` is, and a multimodal ``text_config``'s is read where the top config has none.
  kvlayout planned a bf16 cache where vLLM's is fp8 (2x the bytes).
- Q2: ``kv_cache_dtype='fp8_e5m2'`` beside an fp8 / ModelOpt / compressed-tensors-KV checkpoint: vLLM's
  ``_init_kv_cache_quant`` raises; kvlayout planned it.
- L1: a ModelOpt ``kv_cache_quant_algo`` neither string nor object. The reviewer's claim (vLLM quietly keeps
  the model's dtype) holds only at the top of the config: under ``quantization`` vLLM's ModelOpt config
  raises 'kv_cache_quant_algo must be a string' (the driver shows it), so kvlayout refuses that one, now
  saying why, and plans the other.
- L2: Beam ``head_dim`` false / 0.0 (vLLM's ``or`` takes the fallback) and openPangu
  ``interleaved_sliding_window: true`` (a window of 1: ``isinstance(True, int)``) are built by vLLM.
  ``false`` stays refused: vLLM builds a SlidingWindowSpec of window False (0 tokens; asserted below).
- L3: a ``layer_types`` string: vLLM's ``EngineArgs`` (Step 1, openPangu) and ``Rnj1Attention`` read its
  characters, so no layer slides (the empty string: every layer takes the engine's window).

vLLM's answers come from the shared drivers (tests/shared_answers.py): the hybrid one (the CPU's own
construction; compressed-tensors cannot be built there, so those forms are pinned by vLLM's source) and
the TRITON_ATTN one for Step 1 and Rnj-1.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from tests import shared_answers
from tests.test_models_beam import BASE as BEAM
from tests.test_models_openpangu import EMBEDDED as PANGU
from tests.test_models_rnj1 import BASE as RNJ1
from tests.test_models_step1 import BASE as STEP1

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
    "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 8,
    "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 8192, "head_dim": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
}
CT = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
Q = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
FP8_BLOCK, BF16_BLOCK = 65536, 131072  # 2 layers x 2 (K, V) x 16 tokens x 8 heads x 128 x 1 or 2 bytes

#: quantization forms whose KV cache vLLM 0.33 stores as fp8 (the reviewer's ModelConfig run; the ModelOpt
#: ones also built below by the hybrid driver)
FP8_FORMS: dict[str, dict[str, Any]] = {
    "modelopt_upper": {"quantization_config": {"quant_method": "ModelOpt", "quantization": Q}},
    "producer_no_method": {"quantization_config": {"producer": {"name": "modelopt"}, "quantization": Q}},
    "producer_method_fp8": {
        "quantization_config": {"quant_method": "fp8", "producer": {"name": "modelopt"}, "quantization": Q},
    },
    "legacy_modelopt": {"quantization_config": {"quantization": {**Q, "modelopt_quant_config": {}}}},
    "ct_underscore": {"quantization_config": {"quant_method": "compressed_tensors", "kv_cache_scheme": CT}},
    "ct_upper": {"quantization_config": {"quant_method": "Compressed-Tensors", "kv_cache_scheme": CT}},
    "compression_config": {
        "compression_config": {"quant_method": "compressed-tensors", "kv_cache_scheme": CT},
    },
    "null_then_compression": {
        "quantization_config": None,
        "compression_config": {"quant_method": "compressed-tensors", "kv_cache_scheme": CT},
    },
}
_FP8_CKPT = {"quant_method": "fp8", "activation_scheme": "dynamic"}
_MO_TOP5 = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": 5}
_MO_IN5 = {"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": 5}}


def _hybrid_cases() -> dict[str, dict[str, Any]]:
    def llama(qc: dict[str, Any], kv: str = "auto") -> dict[str, Any]:
        return {"config": {**LLAMA, **qc}, "tp": 1, "kv_cache_dtype": kv}

    def model(cfg: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return {"config": cfg, "tp": 1, "kv_cache_dtype": "auto", "gpu_backend": True, **kw}

    return {
        # Q2: vLLM refuses e5m2 with these
        "q2_fp8_ckpt": llama({"quantization_config": _FP8_CKPT}, "fp8_e5m2"),
        "q2_producer": llama(FP8_FORMS["producer_no_method"], "fp8_e5m2"),
        # L1: a non-string kv_cache_quant_algo under quantization (ModelOpt's from_config refuses it)
        "l1_inner": llama({"quantization_config": _MO_IN5}),
        # L2
        "l2_beam_false": model({**BEAM, "head_dim": False}),
        "l2_beam_float0": model({**BEAM, "head_dim": 0.0}),
        "l2_pangu_true": model({**PANGU, "interleaved_sliding_window": [True, None]}, stand_in=True),
        "l2_pangu_false": model({**PANGU, "interleaved_sliding_window": False}, stand_in=True),
        # L3
        "l3_pangu_str": model(
            {**PANGU, "sliding_window": 64, "layer_types": "sliding_attention"}, stand_in=True
        ),
    }


def _triton_cases() -> dict[str, dict[str, Any]]:
    def model(cfg: dict[str, Any]) -> dict[str, Any]:
        return {
            "config": cfg, "tp": 1, "kv_cache_dtype": "auto", "stand_in": True,
            "attention_backend": "TRITON_ATTN",
        }

    return {
        "l3_step1_str": model({**STEP1, "sliding_window": 64, "layer_types": "sliding_attention"}),
        "l3_step1_empty": model({**STEP1, "sliding_window": 64, "layer_types": ""}),
        "l3_rnj1_str": model({**RNJ1, "layer_types": "chunked_attention"}),
    }


shared_answers.register("hybrid", __name__, _hybrid_cases())
shared_answers.register("triton", __name__, _triton_cases())


@pytest.fixture(scope="module")
def hybrid() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.test_models_hybrid_vllm import vllm_answers

    return shared_answers.answers("hybrid", __name__, _hybrid_cases(), vllm_answers)


@pytest.fixture(scope="module")
def triton() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.triton_driver import triton_answers

    return shared_answers.answers("triton", __name__, _triton_cases(), triton_answers)


def _model_config_driver() -> None:
    """vLLM's ModelConfig of each config on stdin: its quantization, the engine's resolved cache dtype,
    and whether compressed-tensors' config holds a KV scheme (stdout: one JSON line)."""
    import json
    import sys
    import tempfile

    from tests.test_models import _stub_compressed_tensors

    _stub_compressed_tensors()
    from vllm.config import ModelConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.utils.torch_utils import resolve_kv_cache_dtype_string

    from tests.driver import cpu_registry_in_process

    cpu_registry_in_process()
    out = {}
    for name, cfg in json.loads(sys.stdin.read()).items():
        d = tempfile.mkdtemp()
        Path(d, "config.json").write_text(json.dumps(cfg))
        mc = ModelConfig(model=d, tokenizer=None, skip_tokenizer_init=True, dtype="auto")
        qc = mc.model_arch_config.quantization_config
        ct = mc.quantization == "compressed-tensors"
        scheme = ct and CompressedTensorsConfig.from_config(qc).kv_cache_scheme is not None
        out[name] = {
            "quantization": mc.quantization, "engine": resolve_kv_cache_dtype_string("auto", mc),
            "scheme": scheme,
        }
    print(json.dumps(out))


@pytest.fixture(scope="module")
def model_config() -> dict[str, dict[str, Any]]:
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("vllm")
    cases = {name: {**LLAMA, **extra} for name, extra in FP8_FORMS.items()}
    cases["l1_top"] = {**LLAMA, "quantization_config": _MO_TOP5}
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run(
        [sys.executable, __file__, "--model-config-driver"], input=json.dumps(cases), capture_output=True,
        text=True, env=env, timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    got: dict[str, dict[str, Any]] = json.loads(res.stdout.splitlines()[-1])
    return got


def _vllm_source(rel: str) -> str:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vllm is not installed")
    return (Path(spec.origin).parent / rel).read_text()


def _agree(answers: dict[str, dict[str, Any]], cases: dict[str, dict[str, Any]], names: list[str]) -> None:
    """kvlayout's plan of each named case equals vLLM's construction (Hopper and Blackwell)."""
    assert shared_answers.differing(answers, {k: cases[k] for k in names}) == set()


# Q1 ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FP8_FORMS))
def test_q1_quantization_forms_normalised_as_vllm(name: str) -> None:
    ms = M.from_config({**LLAMA, **FP8_FORMS[name]}, reader="json")
    assert (ms.kv_cache_dtype, ms.bytes_per_block) == ("float8_e4m3fn", FP8_BLOCK), name


def test_q1_vllm_model_config_reads_fp8(model_config: dict[str, dict[str, Any]]) -> None:
    """vLLM's own ModelConfig on each form: the engine's cache dtype (resolve_kv_cache_dtype_string, as
    EngineArgs resolves auto) is fp8_e4m3 for ModelOpt, and compressed-tensors' config holds the scheme
    that makes Attention's auto cache fp8 (test_hostile_s26 pins that rule, and its
    test_f2_modelopt_built_by_vllm the bytes vLLM builds for fp8_e4m3)."""
    for name in FP8_FORMS:
        got = model_config[name]
        assert got["engine"] == "fp8_e4m3" or got["scheme"], (name, got)
    assert model_config["l1_top"] == {"quantization": "modelopt", "engine": "auto", "scheme": False}


def test_q1_vllm_source_normalises() -> None:
    """The rules the compressed-tensors forms rest on (the CPU cannot build compressed-tensors)."""
    src = _vllm_source("transformers_utils/model_arch_config_convertor.py")
    for line in (
        'quant_cfg = getattr(config, "compression_config", None)',
        'quant_method = quant_cfg.get("quant_method", "").lower()',
        '"compressed_tensors", "compressed-tensors"',
        'quant_cfg = self._normalize_quantization_config(text_config)',
        'if producer_name == "modelopt" or is_legacy_modelopt:',
    ):
        assert line in src, line
    loader = _vllm_source("model_executor/model_loader/weight_utils.py")
    assert 'hf_quant_config = getattr(hf_text_config, "quantization_config", None)' in loader


def test_q1_text_config_scheme() -> None:
    """A compressed-tensors scheme written only in a multimodal text config makes vLLM's Attention fp8
    (get_quantization_config and get_quant_config both fall back to text_config's)."""
    from tests.test_models_vl import CONFIGS

    cfg = CONFIGS["llava"]
    text = {**cfg["text_config"], "quantization_config": {"quant_method": "compressed-tensors",
                                                          "kv_cache_scheme": CT}}
    plain = M.from_config(cfg, reader="json")
    ms = M.from_config({**cfg, "text_config": text}, reader="json")
    assert ms.kv_cache_dtype == "float8_e4m3fn"
    assert ms.bytes_per_block * 2 == plain.bytes_per_block
    # ModelOpt there: only the top config's sets the engine's cache (resolve_kv_cache_dtype_string)
    mo = {**cfg["text_config"], "quantization_config": {"quant_method": "modelopt", "quantization": Q}}
    assert M.from_config({**cfg, "text_config": mo}, reader="json").kv_cache_dtype == plain.kv_cache_dtype


def test_q1_malformed_forms_refused_by_name() -> None:
    cases = {
        "config.quantization_config.quantization.quant_algo": {
            "quantization_config": {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "INT4"}},
        },
        "config.quantization_config.producer": {"quantization_config": {"producer": None}},
        "config.compression_config": {"compression_config": "compressed-tensors"},
        "config.compression_config.quant_method": {"compression_config": {"quant_method": 3}},
    }
    for field, extra in cases.items():
        with pytest.raises(SpecError) as e:
            M.from_config({**LLAMA, **extra}, reader="json")
        assert e.value.field == field, (field, e.value)


# Q2 ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "qc",
    [_FP8_CKPT, {"quant_method": "FP8"}, FP8_FORMS["producer_no_method"]["quantization_config"],
     {"quant_method": "compressed-tensors", "kv_cache_scheme": CT}],
    ids=["fp8", "fp8_upper", "modelopt_producer", "ct_scheme"],
)
def test_q2_e5m2_refused_with_fp8_checkpoints(qc: dict[str, Any]) -> None:
    with pytest.raises(SpecError) as e:
        M.from_config({**LLAMA, "quantization_config": qc}, reader="json", kv_cache_dtype="fp8_e5m2")
    assert (e.value.field, e.value.value) == ("kv_cache_dtype", "fp8_e5m2")


def test_q2_e5m2_kept_where_vllm_keeps_it() -> None:
    """A weight-only compressed-tensors checkpoint (no kv_cache_scheme) and no checkpoint keep e5m2
    (vLLM's comment in _init_kv_cache_quant: 'the only fp8 KV dtype usable on Ampere')."""
    for extra in ({}, {"quantization_config": {"quant_method": "compressed-tensors"}}):
        ms = M.from_config({**LLAMA, **extra}, reader="json", kv_cache_dtype="fp8_e5m2")
        assert (ms.kv_cache_dtype, ms.bytes_per_block) == ("float8_e5m2", FP8_BLOCK)
    src = _vllm_source("model_executor/layers/attention/attention.py")
    assert "not isinstance(quant_method, CompressedTensorsKVCacheMethod) or" in src


def test_q2_vllm_refuses(hybrid: dict[str, dict[str, Any]]) -> None:
    for name in ("q2_fp8_ckpt", "q2_producer"):
        error = hybrid[name].get("error", "")
        assert "fp8_e5m2 kv-cache is not supported with fp8 checkpoints" in error, name


# L1 ------------------------------------------------------------------------------------------------------


def test_l1_non_string_algorithm(hybrid: dict[str, dict[str, Any]]) -> None:
    """At the top of the config vLLM reads no algorithm (test_q1_vllm_model_config_reads_fp8: the engine's
    cache stays auto); under quantization ModelOpt's from_config raises (the driver's build)."""
    for algo in (5, ["FP8"]):
        top = {**_MO_TOP5, "kv_cache_quant_algo": algo}
        ms = M.from_config({**LLAMA, "quantization_config": top}, reader="json")
        assert (ms.kv_cache_dtype, ms.bytes_per_block) == ("bfloat16", BF16_BLOCK)
        inner = {**_MO_IN5, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": algo}}
        with pytest.raises(SpecError, match="must be a string") as e:
            M.from_config({**LLAMA, "quantization_config": inner}, reader="json")
        assert e.value.field == "config.quantization_config.quantization.kv_cache_quant_algo"
    assert "kv_cache_quant_algo must be a string" in hybrid["l1_inner"]["error"]


# L2 ------------------------------------------------------------------------------------------------------


def test_l2_beam_falsy_head_dim(hybrid: dict[str, dict[str, Any]]) -> None:
    base = M.from_config({**BEAM, "head_dim": None}, reader="json").bytes_per_block
    for hd in (False, 0.0):
        assert M.from_config({**BEAM, "head_dim": hd}, reader="json").bytes_per_block == base
    _agree(hybrid, _hybrid_cases(), ["l2_beam_false", "l2_beam_float0"])


def test_l2_pangu_bool_window(hybrid: dict[str, dict[str, Any]]) -> None:
    ms = M.from_config({**PANGU, "interleaved_sliding_window": True}, reader="json")
    assert {x.window for g in ms.spec.groups for x in g.layers} == {1}
    _agree(hybrid, _hybrid_cases(), ["l2_pangu_true"])
    # false: vLLM builds sliding layers of window False, 0 tokens; kvlayout refuses it by name
    assert set(hybrid["l2_pangu_false"]["windows"].values()) == {False}
    with pytest.raises(SpecError) as e:
        M.from_config({**PANGU, "interleaved_sliding_window": False}, reader="json")
    assert (e.value.field, e.value.value) == ("config.interleaved_sliding_window", False)


# L3 ------------------------------------------------------------------------------------------------------


def test_l3_layer_types_string(
    hybrid: dict[str, dict[str, Any]], triton: dict[str, dict[str, Any]]
) -> None:
    _agree(hybrid, _hybrid_cases(), ["l3_pangu_str"])
    _agree(triton, _triton_cases(), list(_triton_cases()))
    ms = M.from_config({**STEP1, "sliding_window": 64, "layer_types": "sliding_attention"}, reader="json",
                       attention_backend="TRITON_ATTN")
    assert not triton["l3_step1_str"]["windows"] and any("is a string" in n for n in ms.notes)
    assert set(triton["l3_step1_empty"]["windows"].values()) == {64}
    # shorter than the layers: vLLM's Rnj1Attention indexes past it; refused by name
    with pytest.raises(SpecError) as e:
        M.from_config({**RNJ1, "layer_types": "ab"}, reader="json", attention_backend="TRITON_ATTN")
    assert e.value.field == "config.layer_types"


if __name__ == "__main__" and "--model-config-driver" in __import__("sys").argv:
    _model_config_driver()
