"""Hostile pass 26's model findings (/tmp/h26/REPORT.md), each against vLLM 0.33's own code on the CPU.

- F2: a checkpoint's ``quantization_config`` decides an ``auto`` KV cache (ModelOpt's ``kv_cache_quant_algo``
  / ``kv_cache_scheme`` through ``resolve_kv_cache_dtype_string``; compressed-tensors' ``kv_cache_scheme``
  in ``Attention.__init__``).
- F3 / F3b: FLASH_ATTN's fixed FlashAttention 4 pages (128 tokens on Blackwell for head size 256, 64 on
  Hopper for an fp8 cache and head size 512), read from vLLM's ``FlashAttentionBackend`` with the GPU
  stood in (its device capability; the flash-attention extensions the wheel ships but the CPU cannot load).
- F1: IQuest-Coder Loop's ``loop_num`` times the layers is bounded before the layers are built.
- F5 / F7: DomynEdge's ``per_layer_config`` key of thousands of digits, ``layer_types`` vLLM refuses.
- F8: the json reader's unknown ``model_type``.
- F9: float16 Gemma 2 / Gemma 3 / GLM-4 checkpoints run in bfloat16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from tests.test_models_domyn_edge import _cfg as _domyn

ROOT = Path(__file__).resolve().parents[1]
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "torch_dtype": "bfloat16",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 2,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
}


def _plan(cfg: dict[str, Any], **kw: Any) -> M.ModelSpec:
    ms = M.from_config(cfg, reader="json", **kw)
    assert isinstance(ms, M.ModelSpec)
    return ms


def _refused(cfg: dict[str, Any], **kw: Any) -> SpecError:
    with pytest.raises(SpecError) as e:
        _plan(cfg, **kw)
    return e.value


# --------------------------------------------------------------------------- F2: quantization_config
_FP8_SCHEME = {"num_bits": 8, "type": "float", "dynamic": False}
def _mo(algo: Any, method: str = "modelopt", weights: str = "FP8") -> dict[str, Any]:
    """ModelOpt's published form: ``quantization`` holding ``kv_cache_quant_algo``."""
    return {"quant_method": method, "quantization": {"quant_algo": weights, "kv_cache_quant_algo": algo}}


def _flat(**kv: Any) -> dict[str, Any]:
    """ModelOpt's compressed-tensors-style form: the fields at the top."""
    return {"quant_method": "modelopt", "quant_algo": "FP8", **kv}


#: name -> quantization_config (ModelOpt's two forms, and what vLLM does not map)
QUANT: dict[str, dict[str, Any]] = {
    "modelopt": _mo("FP8"),
    "modelopt_lower": _mo("fp8"),
    "modelopt_flat": _flat(kv_cache_quant_algo="FP8"),
    "modelopt_scheme": _flat(kv_cache_scheme=_FP8_SCHEME),
    "modelopt_fp4": _mo("FP8", "modelopt_fp4", "NVFP4"),
    "modelopt_none": _mo(None),
    "modelopt_nvfp4": _mo("NVFP4", weights="NVFP4"),
    "modelopt_nvfp4_scheme": _flat(kv_cache_scheme={"num_bits": 4, "type": "float"}),
    "modelopt_int8": _mo("INT8"),
    "modelopt_dynamic": _flat(kv_cache_scheme={**_FP8_SCHEME, "dynamic": True}),
    "fp8_weights": {"quant_method": "fp8", "activation_scheme": "dynamic"},
}
#: what kvlayout plans for an auto cache: the cache dtype, or None where it refuses (NVFP4, unmapped)
KV_OF: dict[str, str | None] = {
    "modelopt": "float8_e4m3fn", "modelopt_lower": "float8_e4m3fn", "modelopt_flat": "float8_e4m3fn",
    "modelopt_scheme": "float8_e4m3fn", "modelopt_fp4": "float8_e4m3fn", "modelopt_none": "bfloat16",
    "modelopt_nvfp4": None, "modelopt_nvfp4_scheme": None, "modelopt_int8": None, "modelopt_dynamic": None,
    "fp8_weights": "bfloat16",
}
_CT_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def _quant(name: str) -> dict[str, Any]:
    return {**_LLAMA, "quantization_config": QUANT[name]}


def test_f2_modelopt_fp8_is_planned_as_vllm_resolves_it() -> None:
    """The reviewer's config: 65,536 B per block (fp8), not the bf16 131,072; the note names the field."""
    ms = _plan(_quant("modelopt"))
    assert (ms.kv_cache_dtype, ms.bytes_per_block) == ("float8_e4m3fn", 65_536)
    assert any("config.quantization_config.quantization.kv_cache_quant_algo" in n for n in ms.notes)
    assert "KV cache float8_e4m3fn" in M.summary(ms, proof=False)
    assert _plan(_quant("modelopt"), kv_cache_dtype="bfloat16").bytes_per_block == 131_072  # the user's wins


@pytest.mark.parametrize("name", sorted(QUANT))
def test_f2_each_form(name: str) -> None:
    want = KV_OF[name]
    if want is None:
        e = _refused(_quant(name))
        assert e.field.startswith("config.quantization_config.") and "kv_cache" in e.field, e
    else:
        assert _plan(_quant(name)).kv_cache_dtype == want


def test_f2_compressed_tensors() -> None:
    """compressed-tensors' scheme: fp8 for standard attention; one vLLM refuses, refused by name; MLA (whose
    layers vLLM's Attention hook does not reach) refused by name."""
    qc = {"quant_method": "compressed-tensors", "format": "float-quantized", "kv_cache_scheme": _CT_SCHEME}
    ms = _plan({**_LLAMA, "quantization_config": qc})
    assert (ms.kv_cache_dtype, ms.bytes_per_block) == ("float8_e4m3fn", 65_536)
    assert any("kv_cache_scheme" in n for n in ms.notes)
    bad = {**qc, "kv_cache_scheme": {**_CT_SCHEME, "num_bits": 4}}
    field = _refused({**_LLAMA, "quantization_config": bad}).field
    assert field == "config.quantization_config.kv_cache_scheme"
    mla = json.loads((ROOT / "tests" / "fixtures" / "published" / "deepseek_v2_lite.json").read_text())
    e = _refused({**mla, "quantization_config": qc})
    assert e.field == "config.quantization_config.kv_cache_scheme" and "MLA" in str(e), e


def test_f2_malformed_quantization_config_is_refused_by_name() -> None:
    for qc, field in (
        ("fp8", "config.quantization_config"),
        ({"quant_method": 3}, "config.quantization_config.quant_method"),
        ({"quant_method": "modelopt", "quantization": None}, "config.quantization_config.quantization"),
        # pass 28: at the top vLLM reads no algorithm from an 8 (the model's dtype); ModelOpt's config
        # refuses it under quantization
        (_mo(8), "config.quantization_config.quantization.kv_cache_quant_algo"),
    ):
        assert _refused({**_LLAMA, "quantization_config": qc}).field == field


# --------------------------------------------------------------------------- F3: FlashAttention 4's pages
def _llama_head(head: int, **extra: Any) -> dict[str, Any]:
    return {**_LLAMA, "head_dim": head, **extra}


#: (case id, config, device, kv cache dtype, user block size)
FA_CASES: list[tuple[str, dict[str, Any], str, str, int | None]] = [
    ("hd256-bw", _llama_head(256), "blackwell", "auto", None),
    ("hd256-bw-block256", _llama_head(256), "blackwell", "auto", 256),
    ("hd256-bw-block16", _llama_head(256), "blackwell", "auto", 16),
    ("hd256-hopper", _llama_head(256), "hopper", "auto", None),
    ("hd256-ampere", _llama_head(256), "ampere", "auto", None),
    ("hd256-bw-softcap", _llama_head(256, attn_logit_softcapping=50.0), "blackwell", "auto", None),
    ("hd256-bw-fp8", _llama_head(256), "blackwell", "fp8", None),
    ("hd512-hopper-fp8", _llama_head(512), "hopper", "fp8", None),
    ("hd512-hopper-fp8e4m3", _llama_head(512), "hopper", "fp8_e4m3", None),
    ("hd512-hopper-bf16", _llama_head(512), "hopper", "auto", None),
    ("hd512-bw-fp8", _llama_head(512), "blackwell", "fp8", None),
    ("hd320-hopper-fp8", _llama_head(320), "hopper", "fp8", None),
    ("hd128-bw-fp8", _llama_head(128), "blackwell", "fp8", None),
    ("hd128-hopper-fp8", _llama_head(128), "hopper", "fp8", None),
    ("hd100-hopper", _llama_head(100), "hopper", "auto", None),
]
_CAPS = {"hopper": (9, 0), "blackwell": (10, 0), "ampere": (8, 0)}


def _fa_driver() -> None:
    """vLLM 0.33's FlashAttentionBackend for each of :data:`FA_CASES` (stdin: [config, capability, kv,
    block]), on the CPU with the GPU stood in: what it accepts (``supports_head_size``,
    ``supports_kv_cache_dtype``, ``supports_combination``, ``supports_block_size``), its preferred block size
    (``Platform._preferred_block_size_for_backends``) and a layer's kernel block sizes."""
    import tempfile
    import types

    import vllm

    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    here = os.path.join(os.path.dirname(vllm.__file__), "vllm_flash_attn")
    # the wheel ships FA2 and FA3 as CUDA extensions (they need libcuda to load) and FA4 as cute/interface.py:
    # on a GPU host each is available; here only the capability check of each decides, as vLLM's own does
    for so in ("_vllm_fa2_C.abi3.so", "_vllm_fa3_C.abi3.so", "cute/interface.py"):
        assert os.path.exists(os.path.join(here, so)), so
    pkg = types.ModuleType("vllm.vllm_flash_attn")
    pkg.__path__ = [here]  # its __init__ refuses without the extensions; its interface module is the real one
    sys.modules["vllm.vllm_flash_attn"] = pkg
    import vllm.vllm_flash_attn.flash_attn_interface as fai

    assert fai.FA4_AVAILABLE and not fai.FA2_AVAILABLE, "FA2 loads on the CPU: the stub below is not needed"
    fai.FA2_AVAILABLE = fai.FA3_AVAILABLE = True
    from tests.test_models import _stub_compressed_tensors

    _stub_compressed_tensors()
    import torch
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config

    from tests.driver import cpu_registry_in_process

    cpu_registry_in_process()
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability, Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    assert not current_platform.is_cuda() and not current_platform.is_xpu() and not current_platform.is_rocm()
    out = []
    payload = json.load(sys.stdin)
    for cfg, cap, kv, block in payload["cases"]:
        d = tempfile.mkdtemp()
        Path(d, "config.json").write_text(json.dumps(cfg))
        mc = ModelConfig(model=d, tokenizer=None, skip_tokenizer_init=True, dtype="auto")
        vc = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=16, cache_dtype=kv))
        assert vc.cache_config.cache_dtype == kv
        type(current_platform).get_device_capability = classmethod(  # type: ignore[method-assign]
            lambda cls, device_id=0, cap=tuple(cap): DeviceCapability(*cap)
        )
        assert fai.is_fa_version_supported(2) and fai.is_fa_version_supported(4) == (cap[0] in (9, 10))
        assert fai.is_fa_version_supported(3) == (cap[0] == 9)
        fa = FlashAttentionBackend
        with set_current_vllm_config(vc):
            h = mc.get_head_size()
            reasons = fa.validate_configuration(  # what vLLM's backend selector asks of it
                head_size=h, dtype=torch.bfloat16, kv_cache_dtype=kv, block_size=block, use_mla=False,
                has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
                device_capability=DeviceCapability(*cap), attn_type="decoder", has_sliding_window=False,
            )
            why = "; ".join(reasons) or None
            preferred = Platform._preferred_block_size_for_backends([fa], 16, vc)
            spec = FullAttentionSpec(  # a layer's, as Attention.get_kv_cache_spec makes it
                block_size=block or preferred, num_kv_heads=8, head_size=h,
                dtype=torch.float8_e4m3fn if kv.startswith("fp8") else torch.bfloat16,
                kv_quant_mode=get_kv_quant_mode(kv),
            )
            kernel = [getattr(s, "base", s) for s in fa.get_supported_kernel_block_sizes(spec)]
        out.append({"refused": why, "block": block or preferred, "kernel": kernel})
    # Gemma 4 (head sizes 256 and 512) on Hopper: vLLM's Gemma4Config hook, and the model runner's kernel
    # block for a 512-head fp8 layer's block (select_common_block_size)
    from vllm.v1.worker.utils import select_common_block_size

    type(current_platform).get_device_capability = classmethod(  # type: ignore[method-assign]
        lambda cls, device_id=0: DeviceCapability(9, 0)
    )
    d = tempfile.mkdtemp()
    Path(d, "config.json").write_text(json.dumps(payload["gemma4"]))
    g4: dict[str, Any] = {}
    for kv in ("fp8", "auto"):
        mc = ModelConfig(model=d, tokenizer=None, skip_tokenizer_init=True, dtype="auto")
        vc = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=16, cache_dtype=kv))
        g4[f"flash_attn_version-{kv}"] = vc.attention_config.flash_attn_version
        g4[f"head_size-{kv}"] = mc.get_head_size()
    vc = VllmConfig(
        model_config=ModelConfig(model=d, tokenizer=None, skip_tokenizer_init=True, dtype="auto"),
        cache_config=CacheConfig(block_size=16, cache_dtype="fp8"),
    )
    g4["preferred-fp8"] = Platform._preferred_block_size_for_backends([FlashAttentionBackend], 16, vc)
    with set_current_vllm_config(vc):
        for head in (256, 512):  # each layer's backend: FLASH_ATTN, unless the user's block is 32
            for block in (None, 32, 64):
                reasons = FlashAttentionBackend.validate_configuration(
                    head_size=head, dtype=torch.bfloat16, kv_cache_dtype="fp8", block_size=block,
                    use_mla=False, has_sink=False, use_sparse=False, use_mm_prefix=False,
                    use_per_head_quant_scales=False,
                    device_capability=DeviceCapability(9, 0), attn_type="decoder", has_sliding_window=True,
                )
                g4[f"valid-{head}-{block}"] = "; ".join(reasons) or None
        for head, block in ((512, 32), (512, 128), (256, 64), (256, 32)):  # a group's block: its kernel's
            spec = FullAttentionSpec(
                block_size=block, num_kv_heads=2, head_size=head, dtype=torch.float8_e4m3fn,
                kv_quant_mode=get_kv_quant_mode("fp8"),
            )
            try:
                kernel = select_common_block_size(block, [FlashAttentionBackend], [spec])
                g4[f"kernel-{head}-{block}"] = kernel
            except ValueError as e:
                g4[f"kernel-{head}-{block}"] = f"ValueError: {e}"
    real_stdout.write(json.dumps({"cases": out, "gemma4": g4}) + "\n")
    real_stdout.flush()
    os._exit(0)


def _vllm(flag: str, payload: Any) -> Any:
    env = {**os.environ, **_ENV, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, __file__, flag], input=json.dumps(payload), capture_output=True, text=True, env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def fa_answers() -> dict[str, dict[str, Any]]:
    cases = [[cfg, _CAPS[dev], kv, block] for _, cfg, dev, kv, block in FA_CASES]
    got = _vllm("--fa-driver", {"cases": cases, "gemma4": _GEMMA4_26B_TEXT})
    out = {case[0]: ans for case, ans in zip(FA_CASES, got["cases"], strict=True)}
    out["gemma4"] = got["gemma4"]
    return out


def test_f3_flash_attn_pages_equal_vllms(fa_answers: dict[str, dict[str, Any]]) -> None:
    """FLASH_ATTN named: refused where vLLM's backend refuses the model, else vLLM's block size (its
    preference, or the user's), which each layer's kernel block divides."""
    for case_id, cfg, dev, kv, block in FA_CASES:
        got = fa_answers[case_id]
        kw: dict[str, Any] = {"device": dev, "attention_backend": "FLASH_ATTN", "block_size": block}
        kw["kv_cache_dtype"] = None if kv == "auto" else kv
        if got["refused"] is not None:
            with pytest.raises(SpecError) as e:
                _plan(cfg, **kw)
            assert e.value.field in ("attention_backend", "block_size"), (case_id, e.value)
            continue
        ms = _plan(cfg, **kw)
        assert ms.block_size == got["block"], (case_id, ms.block_size, got)
        assert all(ms.block_size % k == 0 for k in got["kernel"]), (case_id, got)
        assert {x.block_size for _, x in ms.spec.layers} == {got["block"]}, case_id


def test_f3_hand_computed(fa_answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's answers by hand: FA4's 128-token pages for head size 256 on Blackwell (8x the bytes of 16
    tokens), 64 on Hopper with fp8 and head size 512, 16 elsewhere; and the default choice on Hopper."""
    assert fa_answers["hd256-bw"] == {"refused": None, "block": 128, "kernel": [128]}
    assert fa_answers["hd512-hopper-fp8"] == {"refused": None, "block": 64, "kernel": [64]}
    assert fa_answers["hd256-hopper"]["block"] == fa_answers["hd256-bw-softcap"]["block"] == 16
    assert fa_answers["hd256-bw-fp8"]["refused"] is not None
    ms = _plan(_llama_head(256), device="blackwell", attention_backend="FLASH_ATTN")
    assert ms.bytes_per_block == 2 * 2 * 128 * 8 * 256 * 2  # 2 layers, K and V, 128 tokens, 8 heads of 256
    ms = _plan(_llama_head(512), device="hopper", kv_cache_dtype="fp8")  # vLLM's default: FLASH_ATTN first
    assert (ms.attention_backend, ms.block_size) == ("FLASH_ATTN", 64)
    assert "FlashAttention 4" in ms.backend_reason
    assert _plan(_llama_head(256), device="blackwell").attention_backend == "FLASHINFER"  # default: 16
    e = _refused(_llama_head(512), device="hopper", kv_cache_dtype="fp8", block_size=16)
    assert e.field == "block_size"


_GEMMA4_26B = json.loads((ROOT / "tests" / "fixtures" / "published" / "gemma4_26b_a4b.json").read_text())
#: its language model alone (vLLM's Gemma4ForCausalLM: the same Gemma4Config hook, no vision modules)
_GEMMA4_26B_TEXT = {
    **_GEMMA4_26B["text_config"], "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
    "torch_dtype": "bfloat16",
}


def test_f3_gemma4_hopper_fp8(fa_answers: dict[str, dict[str, Any]]) -> None:
    """The reviewer's lead, with vLLM's own code: the published Gemma 4 26B (head sizes 256 and 512) on Hopper
    with an fp8 cache keeps vLLM's per-layer FA3/FA4 choice (``Gemma4Config`` leaves ``flash_attn_version``
    unset; FA4 for every layer with bf16), the model's head size is its largest, 512, and FLASH_ATTN's
    preferred block is FA4's SM90 fp8 page, 64 tokens: every group's block (64 or 128 once pages are
    unified) has its kernel block, where the 32-token full-layer block of kvlayout's former 16-token plan has
    none (``select_common_block_size`` raises). A block size of 32 set by the user makes FLASH_ATTN refuse
    (the model's kernel block is 64): vLLM picks another backend, not modeled, so kvlayout refuses it."""
    g4 = fa_answers["gemma4"]
    assert g4["flash_attn_version-fp8"] is None and g4["flash_attn_version-auto"] == 4
    assert g4["head_size-fp8"] == 512 and g4["preferred-fp8"] == 64
    assert g4["valid-256-None"] is g4["valid-512-None"] is g4["valid-512-64"] is None
    assert g4["valid-256-32"] == g4["valid-512-32"] == "block_size not supported"
    assert g4["kernel-512-128"] == 64 and g4["kernel-256-64"] == 64 and g4["kernel-256-32"] == 32
    assert str(g4["kernel-512-32"]).startswith("ValueError: No common block size")
    kw: dict[str, Any] = {"device": "hopper", "kv_cache_dtype": "fp8"}
    for tp in (1, 2, 8):
        ms = _plan(_GEMMA4_26B, tp=tp, **kw)
        assert (ms.block_size, ms.attention_backend) == (64, "FLASH_ATTN")
        blocks = {x.head_size: x.block_size for _, x in ms.spec.layers}
        assert blocks == ({256: 128, 512: 64} if tp == 8 else {256: 64, 512: 128}), (tp, blocks)
    for block in (16, 32):
        assert _refused(_GEMMA4_26B, block_size=block, **kw).field == "block_size"
    assert _plan(_GEMMA4_26B, block_size=128, **kw).block_size == 128
    assert _plan(_GEMMA4_26B, device="hopper").block_size == 16  # bf16: FA4 on every layer, MultipleOf(16)
    assert _plan(_GEMMA4_26B, device="blackwell", kv_cache_dtype="fp8").block_size == 16


# --------------------------------------------------------------------------- F1, F5, F7, F8
def _iquest(layers: int, loops: int) -> dict[str, Any]:
    return {
        "architectures": ["IQuestLoopCoderForCausalLM"], "model_type": "iquest_loopcoder",
        "auto_map": {"AutoConfig": "configuration_iquest_loopcoder.IQuestLoopCoderConfig"},
        "torch_dtype": "bfloat16", "vocab_size": 1024, "max_position_embeddings": 4096, "hidden_size": 512,
        "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
        "num_hidden_layers": layers, "loop_num": loops, "loop_window_size": 64,
    }


_F1_CASES = [(3, 10**6), (3, 10**9), (4000, 4000), (1, 2**53)]


def _f1_child() -> None:
    """Each of :data:`_F1_CASES` planned under a 2 GiB address-space limit (the code before the fix built
    every layer: 10**6 loops took 220 s and 1.9 GB): (field, value, seconds, message) per case."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    out = []
    for layers, loops in _F1_CASES:
        t = time.perf_counter()
        try:
            _plan(_iquest(layers, loops))
            out.append(["planned", None, time.perf_counter() - t, ""])
        except SpecError as e:
            out.append([e.field, e.value, time.perf_counter() - t, str(e)])
    print(json.dumps(out))


def test_f1_loop_num_capped_up_front() -> None:
    """Refused naming config.loop_num and its value, each within a second (in a child process bounded in
    memory and time, so that a rule building the layers fails the test instead of the host)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, __file__, "--f1-child"], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    for (layers, loops), (field, value, seconds, msg) in zip(
        _F1_CASES, json.loads(res.stdout.splitlines()[-1]), strict=True
    ):
        assert (field, value) == ("config.loop_num", loops), (layers, loops, field, msg)
        assert seconds < 1.0 and "10,000" in msg, (layers, loops, seconds)


def test_f1_cap_is_the_product() -> None:
    assert len(_plan(_iquest(5000, 2)).spec.layers) == 10_000
    assert _refused(_iquest(5001, 2)).field == "config.loop_num"


def _cli(cfg: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return subprocess.run(
        [sys.executable, "-m", "kvlayout", "plan", "--config", str(path), "--reader", "json"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
    )


def test_f5_long_per_layer_key(tmp_path: Path) -> None:
    """A key of 5,000 digits (past Python's 4,300-digit int() limit): one line, exit 2, naming the field."""
    cfg = _domyn([0, 0, 0, 0], 64)
    for key in ("1" * 5000, "0" * 5000, "0000000001"):
        cfg["per_layer_config"] = {key: {"head_dim": 128}}
        e = _refused(cfg)
        assert e.field == "config.per_layer_config" and len(str(e)) < 400, e
    cfg["per_layer_config"] = {"1" * 5000: {"head_dim": 128}}
    p = _cli(cfg, tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "config.per_layer_config" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    cfg["per_layer_config"] = {"000000001": {"head_dim": 128}}  # 9 digits: read as layer 1, as int() reads it
    assert [x.head_size for _, x in _plan(cfg).spec.layers] == [64, 128, 64, 64]


def test_f7_layer_types_vllm_refuses() -> None:
    """vLLM's Qwen2Model asserts on ``len(set(layer_types))``: "ab" and [1, "1", 1, 1] (two types) refused."""
    base = _domyn([0, 0, 0, 0], 64)
    for types, mwl in (("ab", 4), ("ab", None), ([1, "1", 1, 1], 2), ([[1], [1], [1], [1]], 4)):
        cfg = {**base, "layer_types": types, **({"max_window_layers": mwl} if mwl is not None else {})}
        assert _refused(cfg).field == "config.layer_types", types
    # one type (set of one), or mixed with max_window_layers == num_hidden_layers: vLLM builds them
    _plan({**base, "layer_types": [1, 1, 1, 1]})
    _plan({**base, "layer_types": ["full_attention"] * 4})
    _plan({**base, "layer_types": [1, "1", 1, 1], "max_window_layers": 4})


def test_f8_json_reader_refuses_an_unknown_model_type() -> None:
    e = _refused({**_LLAMA, "model_type": "lla\u0000ma"})
    assert e.field == "config.model_type" and e.value == "lla\u0000ma"
    assert _plan({**_LLAMA, "model_type": "llama"}).architecture == "LlamaForCausalLM"


# --------------------------------------------------------------------------- F9: float16 Gemma 2/3, GLM-4
def _gemma2(**extra: Any) -> dict[str, Any]:
    return {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "torch_dtype": "float16",
        "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 4096,
        "sliding_window": 128, "query_pre_attn_scalar": 64, **extra,
    }


def test_f9_float16_checkpoints_run_in_bfloat16() -> None:
    ms = _plan(_gemma2())
    assert (ms.dtype, ms.kv_cache_dtype) == ("bfloat16", "bfloat16")
    assert any("_FLOAT16_NOT_SUPPORTED_MODELS" in n for n in ms.notes)
    assert _plan(_gemma2(), kv_cache_dtype="bfloat16").kv_cache_dtype == "bfloat16"
    assert _refused(_gemma2(), kv_cache_dtype="float16").field == "kv_cache_dtype"
    assert _refused(_gemma2(), dtype="float16").field == "dtype"
    assert _plan({**_LLAMA, "torch_dtype": "float16"}).dtype == "float16"  # a type vLLM runs in float16


def _dtype_driver() -> None:
    """vLLM 0.33's model dtype for each config (stdin), dtype auto, and whether its VllmConfig takes each
    explicit cache dtype, on the CPU (whose supported dtypes are asserted equal to CUDA's)."""
    import tempfile

    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    from tests.test_models import _stub_compressed_tensors

    _stub_compressed_tensors()
    import torch
    from vllm.config import CacheConfig, ModelConfig, VllmConfig
    from vllm.platforms import current_platform

    from tests.driver import cpu_registry_in_process

    cpu_registry_in_process()

    assert current_platform.supported_dtypes == [torch.bfloat16, torch.float16, torch.float32]
    out = []
    for cfg in json.load(sys.stdin):
        d = tempfile.mkdtemp()
        Path(d, "config.json").write_text(json.dumps(cfg))
        mc = ModelConfig(model=d, tokenizer=None, skip_tokenizer_init=True, dtype="auto")
        took = {}
        for kv in ("float16", "bfloat16"):
            try:
                VllmConfig(model_config=mc, cache_config=CacheConfig(cache_dtype=kv))
                took[kv] = True
            except Exception:  # noqa: BLE001  # vLLM's refusal
                took[kv] = False
        try:
            ModelConfig(model=d, tokenizer=None, skip_tokenizer_init=True, dtype="float16")
            fp16 = True
        except Exception:  # noqa: BLE001
            fp16 = False
        out.append({"dtype": str(mc.dtype).removeprefix("torch."), "takes": took, "float16": fp16})
    real_stdout.write(json.dumps(out) + "\n")
    real_stdout.flush()
    os._exit(0)


def _quant_driver() -> None:
    """vLLM 0.33's ``resolve_kv_cache_dtype_string("auto", ...)`` for each quantization_config (stdin)."""
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    from types import SimpleNamespace as NS

    from vllm.utils.torch_utils import resolve_kv_cache_dtype_string

    out = [resolve_kv_cache_dtype_string("auto", NS(hf_config=NS(quantization_config=qc))) for qc in
           json.load(sys.stdin)]
    real_stdout.write(json.dumps(out) + "\n")
    real_stdout.flush()
    os._exit(0)


_GLM4 = {
    "architectures": ["Glm4ForCausalLM"], "model_type": "glm4", "torch_dtype": "float16", "hidden_size": 512,
    "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 4096, "partial_rotary_factor": 0.5,
}
_GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "torch_dtype": "float16",
    "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 4096,
    "sliding_window": 128, "query_pre_attn_scalar": 64, "sliding_window_pattern": 2,
}


def test_f2_f9_against_vllm() -> None:
    """vLLM's own resolution: each ModelOpt form's cache dtype (kvlayout plans fp8 where vLLM's is fp8_e4m3,
    the model's where vLLM keeps auto from a config that sets none, and refuses nvfp4 and the unmapped), and
    each float16 checkpoint's model dtype and the explicit cache dtypes its VllmConfig takes."""
    names = sorted(QUANT)
    got = dict(zip(names, _vllm("--quant-driver", [QUANT[n] for n in names]), strict=True))
    for name in names:
        want = KV_OF[name]
        if want == "float8_e4m3fn":
            assert got[name] == "fp8_e4m3", name
        elif want is None:  # refused: NVFP4 (vLLM's nvfp4) or one vLLM falls back from with a warning
            assert got[name] in ("nvfp4", "auto"), name
        else:
            assert got[name] == "auto", name
    assert got["modelopt_nvfp4"] == "nvfp4" and got["modelopt_int8"] == "auto"
    configs = [_gemma2(), _GEMMA3, _GLM4, {**_LLAMA, "torch_dtype": "float16"}]
    for cfg, ans in zip(configs, _vllm("--dtype-driver", configs), strict=True):
        ms = _plan(cfg)
        assert ms.dtype == ans["dtype"], (cfg["model_type"], ans)
        for kv, ok in ans["takes"].items():
            if ok:
                assert _plan(cfg, kv_cache_dtype=kv).kv_cache_dtype == kv
            else:
                assert _refused(cfg, kv_cache_dtype=kv).field == "kv_cache_dtype"
        if ans["float16"]:
            assert _plan(cfg, dtype="float16").dtype == "float16"
        else:
            assert _refused(cfg, dtype="float16").field == "dtype"


def test_f2_compressed_tensors_rule_is_vllms() -> None:
    """The compressed-tensors rule read from vLLM 0.33's source (``compressed_tensors`` is not installed, so
    its config cannot be built here): an auto cache becomes fp8 in ``Attention.__init__`` where the quant
    config has a ``kv_cache_scheme``, and the KV cache method refuses all but 8-bit float, symmetric, per
    tensor or per head."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    base = Path(spec.origin).parent / "model_executor" / "layers"
    attention = (base / "attention" / "attention.py").read_text()
    assert (
        'kv_cache_scheme = getattr(quant_config, "kv_cache_scheme", None)\n'
        '        if kv_cache_scheme is not None and kv_cache_dtype == "auto":\n'
        '            kv_cache_dtype = "fp8"'
    ) in attention
    mla = (base / "attention" / "mla_attention.py").read_text()
    assert "kv_cache_scheme" not in mla  # MLA layers keep auto: refused by kvlayout
    ct = (base / "quantization" / "compressed_tensors" / "compressed_tensors.py").read_text()
    for line in (
        'kv_cache_scheme=config.get("kv_cache_scheme")',
        'if type_ != "float" or num_bits != 8:',
        "QuantizationStrategy.TENSOR,\n            QuantizationStrategy.ATTN_HEAD,",
        'is_symmetric = kv_cache_scheme.get("symmetric")\n        if not is_symmetric:',
    ):
        assert line in ct, line


def test_f2_modelopt_built_by_vllm() -> None:
    """vLLM's construction of the ModelOpt-FP8 Llama with the cache dtype its EngineArgs resolves
    (fp8_e4m3): bytes per block equal kvlayout's plan of the config left auto."""
    from tests.test_models_hybrid_vllm import vllm_answers

    cfg = {**_quant("modelopt"), "hidden_size": 512, "intermediate_size": 1024, "vocab_size": 1024}
    got = vllm_answers({"modelopt": {"config": cfg, "tp": 1, "kv_cache_dtype": "fp8_e4m3"}})["modelopt"]
    assert "error" not in got, got
    ms = _plan(cfg)
    assert ms.bytes_per_block == got["bytes_per_block"] == 2 * 16 * 8 * 128 * 2  # 2 layers, K and V, 1 B


if __name__ == "__main__" and "--f1-child" in sys.argv:
    _f1_child()
if __name__ == "__main__" and "--fa-driver" in sys.argv:
    _fa_driver()
if __name__ == "__main__" and "--dtype-driver" in sys.argv:
    _dtype_driver()
if __name__ == "__main__" and "--quant-driver" in sys.argv:
    _quant_driver()
