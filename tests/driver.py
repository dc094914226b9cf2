"""A test file that runs part of itself in a second Python process (a vLLM import with its own
environment), started at import so that its imports overlap the test process's."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any


def start_driver(script: Path, name: str, env: Mapping[str, str]) -> subprocess.Popen[str] | None:
    """``python script --driver`` with ``env`` added, or None inside that driver (or a script run)."""
    if name == "__main__" or os.environ.get("KVLAYOUT_VLLM_DRIVER"):
        return None
    full = {**os.environ, **env, "KVLAYOUT_VLLM_DRIVER": "1", "PYTHONPATH": str(script.parents[1])}
    proc = subprocess.Popen(
        [sys.executable, str(script), "--driver"], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    atexit.register(lambda: proc.poll() is None and proc.kill())
    return proc


def ground_truth() -> ModuleType:
    """tests/test_vllm_ground_truth.py's vLLM builders, imported without starting its interpreter
    driver here (the file that borrows them runs in the test process, not in a driver)."""
    name = "tests.test_vllm_ground_truth"
    if name not in sys.modules:
        before = os.environ.get("KVLAYOUT_VLLM_DRIVER")
        os.environ["KVLAYOUT_VLLM_DRIVER"] = "1"
        try:
            root = str(Path(__file__).resolve().parents[1])
            if root not in sys.path:
                sys.path.insert(0, root)
            __import__(name)
        finally:
            if before is None:
                del os.environ["KVLAYOUT_VLLM_DRIVER"]
            else:
                os.environ["KVLAYOUT_VLLM_DRIVER"] = before
    return sys.modules[name]


def cpu_registry_in_process() -> None:
    """vLLM's registry inspects each model class here, not in a fresh Python. ``ModelConfig`` asks the
    registry for the class's ``_ModelInfo``; on a miss in ``$VLLM_CACHE_ROOT/modelinfos`` (every class, on a
    fresh CI machine) the registry imports the class in a subprocess (``_run_in_subprocess``, so a GPU parent
    never initialises CUDA): about 6 s each, some 390 s for tests/test_models_generic.py's table alone.
    A CPU driver has no CUDA to protect, so the same ``_ModelInfo.from_model_cls`` runs in the driver."""
    import vllm.model_executor.models.registry as registry

    def here(fn: Any) -> Any:
        return fn()

    registry._run_in_subprocess = here


def cpu_attention_takes_fp8() -> None:
    """Stub: vLLM 0.33's CPU attention backend refuses an fp8 cache on a host without AVX-512 or AMX (its
    kernel's instruction set: ``CPUAttentionBackend.supports_kv_cache_dtype``), where a GPU backend takes
    it. The cache spec its layers build does not depend on the host, so on such a host the check takes
    what the backend lists (the stub's assumption, asserted: fp8 is listed and the ISA is the only cause)."""
    import torch
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    listed = [str(d) for d in CPUAttentionBackend.supported_kv_cache_dtypes]
    assert "fp8" in listed or "fp8_e4m3" in listed, listed
    if torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_supported():
        return  # vLLM's own check passes here: nothing stubbed

    def supports(cls: type, kv_cache_dtype: object) -> bool:
        listed_here = cls.supported_kv_cache_dtypes  # type: ignore[attr-defined]
        return kv_cache_dtype in (None, "auto", "bfloat16", "float16") or kv_cache_dtype in listed_here

    patched = classmethod(supports)
    CPUAttentionBackend.supports_kv_cache_dtype = patched  # type: ignore[method-assign,assignment]


def cpu_mla_takes_fp8() -> None:
    """Stub: vLLM 0.33's CPU platform refuses an fp8 cache for MLA layers (its CPU MLA kernels:
    ``CpuPlatform.get_attn_backend_cls``), where a GPU's MLA backends take it (FlashMLA on Hopper). The
    layer's cache spec takes its dtype from the cache config, not from the backend, so the CPU backend is
    chosen as for a bf16 cache (asserted: the refusal names the dtype and MLA, and bf16 is chosen)."""
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.get_attn_backend_cls.__func__  # type: ignore[attr-defined]

    def choose(
        cls: type, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        config = attn_selector_config
        if config.use_mla and config.kv_cache_dtype not in (None, "auto", "bfloat16", "float16"):
            try:
                original(cls, selected_backend, config, num_heads)
            except ValueError as e:  # the refusal this stub stands in for, and no other
                assert "not supported by MLA attention on CPU" in str(e), e
            config = config._replace(kv_cache_dtype="auto")
        return str(original(cls, selected_backend, config, num_heads))

    CpuPlatform.get_attn_backend_cls = classmethod(choose)  # type: ignore[method-assign,assignment]


def cpu_sparse_mla() -> None:
    """Stub: vLLM 0.33's CPU platform has no sparse MLA backend (``CpuPlatform.get_attn_backend_cls``
    raises for DeepSeek-V3.2's layers), so a sparse layer gets CUDA's FlashMLA sparse backend, whose
    constructor takes a workspace: the workspace manager starts on the CPU, and the accelerator cache it
    empties is none here. The layers' cache specs come from the cache config and the config (the indexer's
    head size, the latent) and the case's block size (the one kvlayout resolves for the GPU:
    tests/test_models_backends.py), not from the backend; asserted: the CPU's refusal is the one for
    sparse attention, and nothing else is stood in for."""
    import torch
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.workspace import init_workspace_manager

    original = CpuPlatform.get_attn_backend_cls.__func__  # type: ignore[attr-defined]
    sparse = AttentionBackendEnum.FLASHMLA_SPARSE.get_path()

    def choose(
        cls: type, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        if attn_selector_config.use_sparse:
            try:
                original(cls, selected_backend, attn_selector_config, num_heads)
            except NotImplementedError as e:  # the refusal this stub stands in for, and no other
                assert "Sparse Attention is not supported on CPU" in str(e), e
            return str(sparse)
        return str(original(cls, selected_backend, attn_selector_config, num_heads))

    CpuPlatform.get_attn_backend_cls = classmethod(choose)  # type: ignore[method-assign,assignment]
    assert not torch.cuda.is_available()
    init_workspace_manager(torch.device("cpu"))
    torch.accelerator.empty_cache = lambda: None  # type: ignore[assignment]  # no accelerator: none to free


def cpu_fp8_block_linear() -> None:
    """Stub: vLLM 0.33 has no FP8 block-scaled matmul kernel for a CPU without AMX
    (``init_fp8_linear_kernel`` raises for the linear layers of a checkpoint quantized ``fp8`` in its
    published config: DeepSeek-V3's, Kimi-K2's), where a GPU picks one. The linear layers hold weights,
    not cache, and their quantization method builds its weights before it asks for a kernel, which
    construction never calls: the layer is built with none (asserted: the refusal is the one for the
    kernel, and no other). Attention keeps the config's own method (``Fp8KVCacheMethod``; its cache spec
    is the cache config's), and the routed experts take the CPU's own answer (no FP8 MoE backend)."""
    import vllm.model_executor.layers.quantization.fp8 as F

    chosen = F.init_fp8_linear_kernel

    def kernel(**kwargs: Any) -> Any:
        try:
            return chosen(**kwargs)
        except ValueError as e:  # the refusal this stub stands in for, and no other
            assert "Failed to find a kernel that can implement the ScaledMM linear layer" in str(e), e
        return None

    F.init_fp8_linear_kernel = kernel  # type: ignore[assignment]


def cpu_ungated_experts() -> None:
    """Stub: vLLM 0.33's MoE config refuses experts of an ungated activation on a CPU
    (``FusedMoEConfig.__post_init__`` raises, last, for ``is_act_and_mul=False``: Nemotron-3 Nano's
    relu2 experts), where CUDA takes them. The experts hold weights, not cache: the refusal is let pass
    (asserted: it is that refusal, and no other; it is the last thing the method does, so the config is
    the one a GPU would have)."""
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig

    original = FusedMoEConfig.__post_init__

    def post_init(self: Any) -> None:
        try:
            original(self)
        except NotImplementedError as e:  # the refusal this stub stands in for, and no other
            assert "is_act_and_mul=False is supported only for CUDA" in str(e), e

    FusedMoEConfig.__post_init__ = post_init  # type: ignore[method-assign]


def cpu_mxfp4_experts() -> None:
    """Stub: vLLM 0.33 has no MXFP4 MoE kernel for a CPU (``select_mxfp4_moe_backend`` raises for gpt-oss's
    experts, quantized ``mxfp4`` in the published config), where a GPU picks one. The experts hold weights,
    not cache: the quantization gives attention layers no method (``Mxfp4Config.get_quant_method`` returns
    None for them; their cache spec is the cache config's), so the experts are built unquantized (asserted:
    the refusal is the one for the MXFP4 kernel, and nothing but the routed experts is stood in for; where
    the CPU's unquantized kernel refuses the experts' shard as well, they are built with no kernel)."""
    import vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method as U
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
    from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4Config

    original = Mxfp4Config.get_quant_method

    def method(self: Any, layer: Any, prefix: str) -> Any:
        if not isinstance(layer, RoutedExperts):
            return original(self, layer, prefix)
        try:
            return original(self, layer, prefix)
        except NotImplementedError as e:  # the refusal this stub stands in for, and no other
            assert "No MXFP4 MoE backend supports" in str(e), e
        return UnquantizedFusedMoEMethod(layer.moe_config)

    def backend(moe_config: Any) -> Any:
        # the CPU's unquantized kernel refuses some expert shards too (gpt-oss at tp 8: 2,880 / 8 wide);
        # the method then has no kernel, which construction does not call
        try:
            return chosen(moe_config=moe_config)
        except NotImplementedError as e:  # the refusal this stub stands in for, and no other
            assert "No Unquantized MoE backend supports" in str(e), e
        return None, None

    chosen = U.select_unquantized_moe_backend
    U.select_unquantized_moe_backend = backend
    Mxfp4Config.get_quant_method = method  # type: ignore[method-assign]


def cpu_kimi_linear() -> None:
    """Stubs for Kimi-Linear (vLLM 0.33's ``vllm/models/kimi_k3``, its CUDA build) on the CPU. (1) Its model
    creates an auxiliary CUDA stream for MLA's output gate (``torch.cuda.Stream()``), which a CPU build of
    torch refuses: a placeholder is made instead (asserted: torch has no CUDA here); construction only
    stores it (Kimi-Linear's MLA layers, without ``q_lora_rank``, not even that); no cache depends on it.
    (2) ``VLLM_KIMI_K3_GEMM_AR=0``: the flag (on by default) picks a fused GEMM + all-reduce kernel for
    ``o_proj`` (cute DSL, whose ``cutlass`` import the CPU install lacks); it changes how ``o_proj`` runs,
    not the cache.
    (3) The CPU platform turns prefix caching off for MLA models (``CpuPlatform.check_and_update_config``:
    its MLA kernels), after the hybrid hook set ``mamba_block_size`` for it, which VllmConfig then refuses;
    a GPU keeps vLLM's default (prefix caching on, ``mamba_cache_mode`` ``align``): for an MLA hybrid the
    three fields that rule sets are put back (asserted: it set exactly those). Bailing MoE V3's MLA hybrid
    takes (3); (1) and (2) do not reach its model."""
    import torch
    from vllm.platforms.cpu import CpuPlatform

    assert not torch.cuda.is_available()
    os.environ["VLLM_KIMI_K3_GEMM_AR"] = "0"

    class CpuStandInStream:
        """A CUDA stream's place holder: construction stores it, nothing runs on it."""

    torch.cuda.Stream = CpuStandInStream  # type: ignore[misc,assignment]
    original = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def check(cls: type, vllm_config: Any) -> None:
        mc, cache, sched = vllm_config.model_config, vllm_config.cache_config, vllm_config.scheduler_config
        before = (cache.enable_prefix_caching, sched.enable_chunked_prefill, sched.max_num_batched_tokens)
        original(cls, vllm_config)
        if mc is None or not (mc.use_mla and mc.is_hybrid) or not before[0]:
            return
        after = (cache.enable_prefix_caching, sched.enable_chunked_prefill, sched.max_num_batched_tokens)
        if after == before:  # a CPU with AMX runs MLA with prefix caching: nothing to put back
            return
        assert after[:2] == (False, False), after  # the MLA rule ran, and only it changed these
        cache.enable_prefix_caching, sched.enable_chunked_prefill, sched.max_num_batched_tokens = before

    CpuPlatform.check_and_update_config = classmethod(check)  # type: ignore[method-assign,assignment]
