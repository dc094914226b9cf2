"""One hardware probe for the whole package: which accelerators torch and JAX can reach.

Every decision that depends on the machine (``auto`` backend, Triton native or interpreted,
which Pallas kernel) asks here. Nothing here writes ``os.environ`` or imports torch or JAX
unless they are installed and the question needs them.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import sys

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def torch_cuda() -> bool:
    """Whether torch sees a CUDA device (False without torch)."""
    if not installed("torch"):
        return False
    import torch

    return bool(torch.cuda.is_available())


def triton_interpret_setting() -> bool | None:
    """The user's ``TRITON_INTERPRET`` choice: True, False, or None when unset (read, never written)."""
    v = os.environ.get("TRITON_INTERPRET", "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    return None


def tpu_device_nodes() -> bool:
    """Whether this host exposes TPU device nodes."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def jax_may_have_accelerator() -> bool:
    """Whether asking JAX for its default device can answer TPU or GPU.

    Importing JAX with libtpu installed but no TPU spends seconds probing, so JAX is asked
    only when it is already imported, a CUDA plugin is installed, or a TPU device node exists.
    """
    if "jax" in sys.modules:
        return True
    if not installed("jax"):
        return False
    plugins = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")
    return any(installed(p) for p in plugins) or tpu_device_nodes()


def jax_platform() -> str:
    """JAX's default platform (``cpu``, ``gpu``/``cuda``, ``tpu``); imports JAX."""
    import jax

    return str(jax.default_backend())
