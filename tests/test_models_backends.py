"""kvlayout.models.backends (issue 23): the attention backend vLLM 0.33 resolves, and its block size.

Pinned numbers from the issue (DeepSeek-V2-Lite: 27 MLA layers, head 512 + 64); the check of
kvlayout's backend table and priority lists against the installed vLLM 0.33 is defined here and
run in tests/test_models_vllm_truth.py's vLLM process (the backend classes that import on a CPU are
asked directly; the others, which need the GPU build of flash-attn, FlashInfer or CUTLASS to import,
are read from their source with ``ast``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import backends as B

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"

#: DeepSeek-V2-Lite's cache fields (its published config.json; the other fields play no part)
V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "hidden_size": 2048,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
}


def _mla(device: str, kv: str | None = None, **kw: Any) -> M.ModelSpec:
    ms = M.from_config(V2_LITE, device=device, kv_cache_dtype=kv, **kw)
    assert isinstance(ms, M.ModelSpec)
    return ms


def test_mla_block_size_follows_the_backend() -> None:
    cases = [
        # device, kv dtype, backend, tokens, page B (tokens * 576 * itemsize), bytes per block (27 pages)
        ("hopper", None, "FLASH_ATTN_MLA", 16, 18_432, 497_664),
        ("hopper", "fp8", "FLASHMLA", 64, 36_864, 995_328),
        ("blackwell", None, "FLASHINFER_MLA", 32, 36_864, 995_328),
        ("blackwell", "fp8", "FLASHINFER_MLA", 32, 18_432, 497_664),
        ("ampere", None, "TRITON_MLA", 16, 18_432, 497_664),
    ]
    for device, kv, backend, tokens, page, per_block in cases:
        ms = _mla(device, kv)
        got = (ms.attention_backend, ms.block_size, ms.spec.layers[0][1].page, ms.bytes_per_block)
        assert got == (backend, tokens, page, per_block), (device, kv)
    assert _mla("hopper").device == "hopper"  # the default


def test_backend_rules_that_move_the_choice() -> None:
    # FlashInfer-MLA needs qk_nope_head_dim in (64, 128, 192): else TOKENSPEED (R1 dims) and CUTLASS (128)
    odd = {**V2_LITE, "qk_nope_head_dim": 96}
    ms = M.from_config(odd, device="blackwell")
    assert isinstance(ms, M.ModelSpec) and (ms.attention_backend, ms.block_size) == ("CUTLASS_MLA", 128)
    assert "qk_nope_head_dim 96" in ms.backend_reason
    # a block size the first backend does not take moves to the next one, as --block-size does in vLLM
    ms = _mla("hopper", "fp8", block_size=16)
    assert (ms.attention_backend, ms.block_size) == ("TRITON_MLA", 16)
    # the user's backend
    ms = _mla("hopper", attention_backend="FLASHMLA")
    assert (ms.attention_backend, ms.block_size, ms.backend_reason) == (
        "FLASHMLA",
        64,
        "--attention-backend FLASHMLA",
    )
    # standard attention: FlashAttention on Hopper, FlashInfer on Blackwell, 16-token blocks either way
    for device, backend in (("hopper", "FLASH_ATTN"), ("blackwell", "FLASHINFER"), ("ampere", "FLASH_ATTN")):
        ms = M.from_config(FIXTURES / "llama" / "config.json", device=device)
        assert isinstance(ms, M.ModelSpec) and (ms.attention_backend, ms.block_size) == (backend, 16)
    # DeepSeek-V3.2 (sparse): FLASH_ATTN_MLA_SPARSE, 64-token blocks, pages of whole 1,152 B token rows
    ms = M.from_config(FIXTURES / "deepseek_v32" / "config.json")
    assert isinstance(ms, M.ModelSpec) and ms.attention_backend == "FLASH_ATTN_MLA_SPARSE"
    # 61 * (73,728 + 8,448): vLLM's LBNHC pads each layer's stride to whole 1,152 B rows, which a page is
    assert ms.bytes_per_block == 5_012_736 == 61 * (64 * 1_152 + 64 * 132)


def test_refusals_name_the_field() -> None:
    bad = [
        ({"device": "volta"}, "device"),
        ({"device": 9}, "device"),
        ({"attention_backend": "FLASH_ATTN"}, "attention_backend"),  # not an MLA backend
        ({"attention_backend": "FLASH_ATTN_MLA", "device": "blackwell"}, "attention_backend"),  # Hopper only
        ({"attention_backend": "FLASH_ATTN_MLA", "kv_cache_dtype": "fp8"}, "attention_backend"),  # bf16 only
        ({"device": "ampere", "kv_cache_dtype": "fp8"}, "kv_cache_dtype"),  # TritonMLAImpl: fp8 needs SM89
        ({"kv_cache_dtype": "fp8_e5m2"}, "kv_cache_dtype"),  # no MLA backend stores e5m2
        ({"engine": "tpu-inference", "device": "blackwell"}, "device"),
    ]
    for kwargs, field in bad:
        with pytest.raises(SpecError) as e:
            M.from_config(V2_LITE, **kwargs)
        assert e.value.field == field, kwargs
    with pytest.raises(SpecError) as e:  # sparse MLA off Hopper is not modeled without a named backend
        M.from_config(FIXTURES / "deepseek_v32" / "config.json", device="blackwell")
    assert e.value.field == "device"


@pytest.mark.parametrize("family", ["deepseek_v32", "deepseek_v4", "deepseek_v3", "llama"])
def test_kv_cache_dtype_must_be_one_vllm_takes(family: str) -> None:
    """Issue 25: DeepSeek V3.2/V4 took any ``fp8...`` string, and a non-string raised AttributeError."""
    for value in ("fp8_bogus_dtype", 3, ["fp8"], "FP8"):
        with pytest.raises(SpecError) as e:
            M.from_config(FIXTURES / family / "config.json", kv_cache_dtype=value)
        assert e.value.field == "kv_cache_dtype"


def test_summary_says_which_backend_and_why() -> None:
    text = M.summary(_mla("hopper", "fp8"), proof=False)
    assert "attention backend FLASHMLA on hopper: first valid MLA backend on hopper" in text
    assert "FLASH_ATTN_MLA: kv_cache_dtype fp8 not supported" in text


def test_cli_device_and_backend_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(V2_LITE))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "kvlayout.cli", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    r = run("plan", "--config", str(cfg), "--device", "blackwell")
    assert r.returncode == 0 and "32-token blocks" in r.stdout and "FLASHINFER_MLA on blackwell" in r.stdout
    r = run("plan", "--config", str(cfg), "--attention-backend", "TRITON_MLA", "--kv-cache-dtype", "fp8")
    assert r.returncode == 0 and "bytes per block 248,832" in r.stdout  # 27 * 16 * 576
    for args in (
        ("--device", "tpu"),
        ("--attention-backend", "NOPE"),
        ("--kv-cache-dtype", "fp8_bogus_dtype"),
    ):
        r = run("check", "--config", str(cfg), *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run("plan", "--preset", "llama-8b", "--device", "hopper")
    assert r.returncode == 2 and "--device applies with --config" in r.stderr


# --------------------------------------------------------------------------- against the installed vLLM
# Run inside tests/test_models.py's vLLM driver (one vLLM import for every comparison), from
# tests/test_models_vllm_truth.py, which checks the answers against BACKENDS and _PRIORITY.
def backend_answers(names: list[str]) -> dict[str, Any]:
    """vLLM's own answers for the backends ``names`` and its priority lists (in the driver process).

    vllm/platforms/cuda.py imports its compiled ops (libcuda) only to register them; the priority
    lists read none of them. The stub is an empty module, and the assertion is that cuda.py's import
    of it is the bare registration line. Backend classes that need the GPU build of flash-attn,
    FlashInfer or CUTLASS to import are read from their source with ``ast``."""
    import ast
    import types

    import vllm

    cuda_src = (Path(vllm.__file__).parent / "platforms" / "cuda.py").read_text()
    assert "\nimport vllm._C_stable_libtorch  # noqa\n" in cuda_src
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.platforms.cuda import _get_backend_priorities
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E

    caps = {m: DeviceCapability(m, 0) for m in (8, 9, 10, 12)}

    def sizes(xs: Any) -> list[list[Any]]:
        return [[x.base, True] if isinstance(x, MultipleOf) else [x, False] for x in xs]

    def from_source(name: str) -> dict[str, Any]:
        module, cls = E[name].value.rsplit(".", 1)
        src = Path(vllm.__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py").read_text()
        node = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef) and n.name == cls)
        out: dict[str, Any] = {"source": True}
        for item in node.body:
            if (
                isinstance(item, ast.AnnAssign)
                and getattr(item.target, "id", "") == "supported_kv_cache_dtypes"
            ):
                out["kv"] = ast.literal_eval(item.value)  # type: ignore[arg-type]
            if isinstance(item, ast.FunctionDef) and item.name == "get_supported_kernel_block_sizes":
                rets = [
                    r for r in ast.walk(item) if isinstance(r, ast.Return) and isinstance(r.value, ast.List)
                ]
                env = {"MultipleOf": MultipleOf}
                trees = [ast.Expression(r.value) for r in rets]  # type: ignore[arg-type]
                exprs = [compile(t, "<src>", "eval") for t in trees]
                out["sizes_options"] = [sizes(eval(e, env)) for e in exprs]
            if isinstance(item, ast.FunctionDef) and item.name == "supports_compute_capability":
                ret = next(r for r in ast.walk(item) if isinstance(r, ast.Return))
                expr = compile(ast.Expression(ret.value), "<src>", "eval")  # type: ignore[arg-type]
                g = {"DeviceCapability": DeviceCapability}
                out["majors"] = [m for m, cap in caps.items() if eval(expr, g, {"capability": cap})]
        return out

    answers: dict[str, Any] = {"backends": {}, "priorities": {}}
    for name in names:
        try:
            c = E[name].get_class()
            answers["backends"][name] = {
                "source": False,
                "kv": list(c.supported_kv_cache_dtypes),
                "sizes_options": [sizes(c.get_supported_kernel_block_sizes())],
                "majors": [m for m, cap in caps.items() if c.supports_compute_capability(cap)],
                "mla": c.is_mla(),
                "sparse": c.is_sparse(),
            }
        except (ImportError, AssertionError, OSError):
            answers["backends"][name] = from_source(name)
    for mla in (False, True):
        for major in (8, 9, 10):
            for kv in ("auto", "fp8"):
                got = _get_backend_priorities(
                    mla, caps[major], num_heads=128, kv_cache_dtype=kv, head_size=576
                )
                answers["priorities"][f"{mla}-{major}-{kv}"] = [b.name for b in got]
    return answers


def check_backend_table(answers: dict[str, Any]) -> None:
    """kvlayout's backend table is vLLM's (kv dtypes kvlayout takes, kernel block sizes, GPUs)."""
    accepted = {"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla"}
    for name, b in B.BACKENDS.items():
        got = answers["backends"][name]
        assert set(b.kv_dtypes) == set(got["kv"]) & accepted, name
        assert [list(x) for x in b.block_sizes] in got["sizes_options"], name
        majors = [m for m in (8, 9, 10, 12) if (m >= 8 if b.majors is None else m in b.majors)]
        assert majors == got["majors"], name
        if not got["source"]:
            assert (b.mla, b.sparse) == (got["mla"], got["sparse"]), name
    assert any(x["source"] for x in answers["backends"].values())  # the ast path ran


def check_priority_lists(answers: dict[str, Any]) -> None:
    """kvlayout's priority lists are cuda.py's, restricted to the backends it models."""
    for (mla, major), mine in B._PRIORITY.items():
        for kv in ("auto", "fp8"):
            theirs = [n for n in answers["priorities"][f"{mla}-{major}-{kv}"] if n in B.BACKENDS]
            if mla and major == 10:  # sparse MLA on Blackwell is refused (not modeled): dense part only
                theirs = [n for n in theirs if not B.BACKENDS[n].sparse]
            assert list(mine) == theirs, (mla, major, kv)
