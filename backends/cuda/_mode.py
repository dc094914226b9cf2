"""Decide, once and before any kernel is defined, whether Triton runs natively or interpreted.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *defined*, so this
module must run before :mod:`kvlayout_cuda.kernel` is imported. Without a CUDA device the
interpreter is switched on automatically (CI, laptops), so the same kernel code runs.
"""

from __future__ import annotations

import os

import torch

from kvlayout.errors import BackendError


def _decide() -> str:
    forced = os.environ.get("TRITON_INTERPRET", "").strip().lower()
    if forced in ("1", "true", "on", "yes"):
        return "interpreter"
    if torch.cuda.is_available():
        return "native"
    if forced in ("0", "false", "off", "no"):
        raise BackendError(
            "backend 'cuda': TRITON_INTERPRET=0 but torch sees no CUDA device; unset it to run under Triton's interpreter",
            field="TRITON_INTERPRET",
            value=forced,
        )
    os.environ["TRITON_INTERPRET"] = "1"
    return "interpreter"


MODE = _decide()
#: torch device buffers must live on: CUDA natively, the CPU under the interpreter.
DEVICE_TYPE = "cuda" if MODE == "native" else "cpu"
