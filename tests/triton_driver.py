"""tests/test_models_hybrid_vllm.py's driver for models whose layers vLLM 0.33 builds only on the TRITON_ATTN
backend (Step 1's ``use_alibi_sqrt``, Rnj1's ``chunk_lookback``), which the CPU's own backend refuses.

Stub (asserted): each attention layer's backend is chosen by vLLM's selector as on the CPU (CPU_ATTN, which
lacks ``supports_alibi_sqrt`` and whose implementation takes no ``chunk_lookback``), then TRITON_ATTN stands
in for it, the backend a GPU builds these layers with (``attention_backend='TRITON_ATTN'``). Its
implementation is only constructed (its kernels never run); the cache spec comes from the layer, and the
block size from the cache config (16, which Triton's ``MultipleOf(16)`` takes).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}


def triton_answers(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """vLLM 0.33's construction of ``cases`` (the hybrid driver's shape) with TRITON_ATTN standing in."""
    env = {**os.environ, **_ENV, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, __file__, "--driver"], input=json.dumps(cases), capture_output=True, text=True,
        env=env, timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    out: dict[str, dict[str, Any]] = json.loads(res.stdout.splitlines()[-1])
    return out


def triton_for_cpu_attention() -> None:
    """Stub: TRITON_ATTN for the CPU backend vLLM's selector picks for a layer (module docstring)."""
    import vllm.model_executor.layers.attention.attention as A
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend, TritonAttentionImpl

    # the stub's assumptions: the CPU backend refuses both, Triton takes both
    assert not CPUAttentionBackend.supports_alibi_sqrt() and TritonAttentionBackend.supports_alibi_sqrt()
    assert "chunk_lookback" not in inspect.signature(CPUAttentionBackendImpl.__init__).parameters
    assert "chunk_lookback" in inspect.signature(TritonAttentionImpl.__init__).parameters
    chosen = A.get_attn_backend

    def backend(*args: Any, **kwargs: Any) -> Any:
        b = chosen(*args, **kwargs)
        assert b.get_name() == "CPU_ATTN", b.get_name()  # only the CPU's own backend is stood in for
        head = kwargs["head_size"] if "head_size" in kwargs else args[0]
        # vLLM validates the head size on a GPU (validate_configuration; pass 27)
        if not TritonAttentionBackend.supports_head_size(head):
            raise ValueError(f"head size {head} not supported by {TritonAttentionBackend.get_name()}")
        return TritonAttentionBackend

    A.get_attn_backend = backend


if __name__ == "__main__" and "--driver" in sys.argv:
    sys.path.insert(0, str(ROOT))
    triton_for_cpu_attention()
    from tests.test_models_hybrid_vllm import _driver

    _driver()
