"""Whether kvlayout's Triton kernels run natively or under Triton's interpreter.

Decided once, from the hardware probe and the user's ``TRITON_INTERPRET`` (read, never
written): without a CUDA device the interpreter is used. :func:`jit` defines kvlayout's own
kernels accordingly, so no process-wide setting changes and other Triton code is unaffected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import triton

from kvlayout.errors import BackendError
from kvlayout.hardware import torch_cuda, triton_interpret_setting


def _decide() -> str:
    forced = triton_interpret_setting()
    if forced:
        return "interpreter"
    if torch_cuda():
        return "native"
    if forced is False:
        raise BackendError(
            "backend 'cuda': TRITON_INTERPRET=0 but torch sees no CUDA device; "
            "unset it to run under Triton's interpreter",
            field="TRITON_INTERPRET",
            value="0",
        )
    return "interpreter"


MODE = _decide()
#: torch device buffers must live on: CUDA natively, the CPU under the interpreter.
DEVICE_TYPE = "cuda" if MODE == "native" else "cpu"


#: Triton's interpreter keeps the grid position and its patches of ``triton.language`` in
#: process-wide state, so two interpreted launches from different threads would corrupt each
#: other: every launch of kvlayout's kernels holds this lock under the interpreter.
_INTERPRETER_LOCK = threading.Lock()


def launch_guard() -> AbstractContextManager[Any]:
    """Held around every kernel launch: the interpreter's lock, nothing natively."""
    return _INTERPRETER_LOCK if MODE != "native" else nullcontext()


def jit(**kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
    """``triton.jit`` natively; an interpreted kernel of the same source otherwise."""

    def define(fn: Callable[..., Any]) -> Any:
        if MODE == "native":
            return triton.jit(fn, **kwargs)
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn, **kwargs)

    return define
