"""tests/test_models_hybrid_vllm.py's driver for Flint, whose layers vLLM 0.33 builds only on FlashInfer
(``FlintAttention`` asserts ``FlashInferImpl``), which the CPU install lacks.

Stubs, each asserted:

- ``flashinfer`` is not installed: a stand-in package whose every name is a placeholder that raises when
  called, so vLLM's FlashInfer backend module (and Flint's kernels' modules) import, and nothing of
  FlashInfer runs unnoticed;
- the FlashInfer backend stands in for the CPU backend vLLM's selector picks for each layer (asserted: it
  picked CPU_ATTN), the backend a GPU builds Flint's layers with;
- ``FlashInferImpl`` allocates a counter buffer for TRT-LLM's kernels on the CUDA device (its size from two
  FlashInfer calls): no buffer is made (asserted: there is no CUDA device). The buffer is the kernels'
  scratch, not the KV cache; the cache spec comes from the layer, the block size from the cache config.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}


def flashinfer_answers(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """vLLM 0.33's construction of ``cases`` (the hybrid driver's shape) with FlashInfer standing in."""
    env = {**os.environ, **_ENV, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, __file__, "--driver"], input=json.dumps(cases), capture_output=True, text=True,
        env=env, timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    out: dict[str, dict[str, Any]] = json.loads(res.stdout.splitlines()[-1])
    return out


class _Absent:
    """A FlashInfer name of the stand-in package: construction never calls it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the flashinfer stand-in was called: construction ran FlashInfer code")


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``flashinfer`` and its submodules as :class:`_StandInModule` packages."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "flashinfer" or name.startswith("flashinfer."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandInModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


def flashinfer_for_cpu_attention() -> None:
    """The stubs of the module docstring."""
    import torch

    assert importlib.util.find_spec("flashinfer") is None  # not installed: nothing real is shadowed
    assert not torch.cuda.is_available()
    sys.meta_path.insert(0, _StandInFinder())
    import vllm.model_executor.layers.attention.attention as A
    import vllm.v1.attention.backends.flashinfer as FI

    def no_buffer(min_bytes: int, device: torch.device) -> None:
        assert device.type == "cuda", device  # the buffer FlashInferImpl makes on the GPU

    FI._get_multi_ctas_kv_counter_buffer = no_buffer  # type: ignore[assignment]
    FI.get_device_sm_count = lambda device: 0  # its size's inputs, FlashInfer calls
    FI.get_trtllm_gen_multi_ctas_kv_counter_bytes = lambda *args: 0
    chosen = A.get_attn_backend

    def backend(*args: Any, **kwargs: Any) -> Any:
        b = chosen(*args, **kwargs)
        assert b.get_name() == "CPU_ATTN", b.get_name()  # only the CPU's own backend is stood in for
        head = kwargs["head_size"] if "head_size" in kwargs else args[0]
        # vLLM validates the head size on a GPU (validate_configuration; pass 27)
        if not FI.FlashInferBackend.supports_head_size(head):
            raise ValueError(f"head size {head} not supported by {FI.FlashInferBackend.get_name()}")
        return FI.FlashInferBackend

    A.get_attn_backend = backend


if __name__ == "__main__" and "--driver" in sys.argv:
    sys.path.insert(0, str(ROOT))
    flashinfer_for_cpu_attention()
    from tests.test_models_hybrid_vllm import _driver

    _driver()
