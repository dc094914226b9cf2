"""Backend registry: names -> lazily imported ``"module:attr"`` targets.

Built-in backends are registered through the ``kvlayout.backends`` entry-point group in
``pyproject.toml``, exactly as a third-party plugin would be; the table below is only the
fallback for a source checkout without installed metadata. Nothing is imported until a
backend is asked for, so ``import kvlayout`` stays free of torch and JAX.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from importlib import metadata
from typing import Any

from . import hardware
from .backend import Backend
from .errors import BackendError, bad_value, short

ENV_VAR = "KVLAYOUT_BACKEND"
ENTRY_POINT_GROUP = "kvlayout.backends"
log = logging.getLogger("kvlayout")

#: name -> (target, extra that installs its dependencies)
BUILTIN: dict[str, tuple[str, str | None]] = {
    "reference": ("kvlayout.reference:ReferenceBackend", None),
    "cuda": ("kvlayout.backends.cuda:CudaBackend", "cuda"),
    "pallas": ("kvlayout.backends.pallas:PallasBackend", "pallas"),
}
#: third-party modules each extra brings, to turn an ImportError into an install hint
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "cuda": ("torch", "triton"),
    "pallas": ("jax", "jaxlib", "chex"),
}

_announced: set[str] = set()


def registered() -> dict[str, tuple[str, str | None]]:
    """Every known backend name with its target and extra (entry points override built-ins)."""
    out = dict(BUILTIN)
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # pragma: no cover - broken metadata must not break import
        eps = ()  # type: ignore[assignment]
    for ep in eps:
        extra = BUILTIN.get(ep.name, (None, None))[1]
        out[ep.name] = (ep.value, extra)
    return out


def valid_options() -> str:
    """``auto, reference, cuda (pip install 'kvlayout[cuda]'), ...`` for error messages."""
    parts = ["auto"]
    for name, (_, extra) in registered().items():
        parts.append(f"{name} (pip install 'kvlayout[{extra}]')" if extra else name)
    parts.append("or module:attr")
    return ", ".join(parts)


def requested_name(name: str | None = None) -> tuple[str, str]:
    """The backend asked for and where from: the argument, else ``KVLAYOUT_BACKEND``, else auto.

    A name that is not a ``str`` (``3``, ``b"cuda"``) is refused here, naming it: it raised
    ``TypeError`` from a ``in`` test further on."""
    if name is not None:
        if not isinstance(name, str):
            why = f"must be a backend name (a str: {valid_options()}) or None"
            raise bad_value(BackendError, "backend", name, why)
        return name, "argument"
    env = os.environ.get(ENV_VAR, "").strip()
    if env:  # set but empty is unset, as KVLAYOUT_VLLM_MODE and vLLM's own variables read it
        return env, ENV_VAR
    return "auto", "default"


def _missing(e: ImportError, target: str, mod_name: str, name: str, extra: str | None) -> BackendError:
    """Turn an ImportError into the ``pip install 'kvlayout[extra]'`` that fixes it, when one does."""
    missing = getattr(e, "name", None) or ""
    hint_extra = extra
    if hint_extra is None:
        for ex, mods in EXTRA_MODULES.items():
            if missing.split(".")[0] in mods:
                hint_extra = ex
    if hint_extra and (missing.split(".")[0] in EXTRA_MODULES.get(hint_extra, ()) or missing == mod_name):
        return BackendError(
            f"backend {short(name)} needs the {hint_extra!r} extra (missing module {short(missing)}): "
            f"pip install 'kvlayout[{hint_extra}]'",
            field="backend",
            value=name,
        )
    why = short(str(e))[1:-1]  # the import error names the module: cut like the rest
    return BackendError(
        f"backend {short(name)}: cannot import {short(target)}: {why}", field="backend", value=name
    )


def _import_target(target: str, name: str, extra: str | None) -> type[Backend]:
    mod_name, _, attr = target.partition(":")
    if not mod_name or not attr or mod_name.startswith("."):  # a relative import raised TypeError (issue 25)
        raise BackendError(
            f"backend target = {short(target)}: must be 'module:attr' (an absolute module)", field="backend",
            value=target,
        )
    try:
        mod = importlib.import_module(mod_name)
        cls = getattr(mod, attr)  # lazy packages import their dependencies here
    except ImportError as e:
        raise _missing(e, target, mod_name, name, extra) from None
    except AttributeError:
        raise BackendError(
            f"backend {short(name)}: module {short(mod_name)} has no attribute {short(attr)}",
            field="backend",
            value=name,
        ) from None
    except Exception as e:  # noqa: BLE001  # a module failing as it runs: SyntaxError, RuntimeError
        raise BackendError(
            f"backend {short(name)}: importing module {short(mod_name)} failed: {type(e).__name__}: "
            f"{short(str(e))}",
            field="backend",
            value=name,
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendError(
            f"backend {short(name)}: {short(target)} is not a kvlayout.Backend subclass",
            field="backend",
            value=name,
        )
    if inspect.isabstract(cls):  # kvlayout.backend:Backend itself: from_host returned None (issue 25)
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise BackendError(
            f"backend {short(name)}: {short(target)} is abstract (it does not implement {missing})",
            field="backend",
            value=name,
        )
    return cls


def _auto() -> tuple[str, str]:
    """Pick a backend from the hardware: CUDA via torch, then TPU/GPU via JAX, else NumPy."""
    if hardware.installed("triton") and hardware.torch_cuda():
        return "cuda", "torch sees a CUDA device"
    if hardware.jax_may_have_accelerator():
        plat = hardware.jax_platform()
        if plat in ("tpu", "gpu", "cuda"):
            return "pallas", f"JAX's default device is a {plat}"
    return (
        "reference",
        "no CUDA device seen by torch+triton and no TPU/GPU seen by JAX (or those extras are not installed)",
    )


def resolve(name: str | None = None) -> tuple[str, str]:
    """Validate the requested name and resolve ``auto``; returns (name, why)."""
    req, source = requested_name(name)
    known = registered()
    if req == "auto":
        chosen, why = _auto()
        if chosen not in _announced:
            log.info("kvlayout: backend auto -> %s (%s)", chosen, why)
            _announced.add(chosen)
        return chosen, f"auto: {why}"
    if req in known or (":" in req and not req.startswith(":")):
        return req, source
    where = f" for {ENV_VAR}" if source == ENV_VAR else " for backend"  # the field, named (issue 25)
    raise BackendError(
        f"Invalid value {short(req)}{where}. Valid options: {valid_options()}", field="backend", value=req
    )


def load(name: str | None = None) -> type[Backend]:
    """The backend class for ``name`` (or ``KVLAYOUT_BACKEND``, or auto), imported now."""
    chosen, _ = resolve(name)
    known = registered()
    if chosen in known:
        target, extra = known[chosen]
        return _import_target(target, chosen, extra)
    return _import_target(chosen, chosen, None)


def create(table: Any, buffer: Any, *, backend: str | None = None, offset: int = 0) -> Backend:
    """Construct the chosen backend over ``buffer`` for ``table``."""
    return load(backend)(table, buffer, offset=offset)
