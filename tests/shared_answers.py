"""One vLLM driver process for the cases of several single-architecture test files (issue 23): each file
registers its cases when pytest imports it; the first fixture that asks for answers runs every case then
registered for that driver in one subprocess (one vLLM import, about 10 s of CPU, instead of one per file),
and each file reads back its own. A file run alone registers only its own cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Cases = dict[str, dict[str, Any]]
_REGISTERED: dict[str, Cases] = {}
_ANSWERS: dict[str, Cases] = {}


def register(driver: str, owner: str, cases: Cases) -> None:
    """Add ``owner``'s ``cases`` to the next run of ``driver`` (ids prefixed by the owner)."""
    _REGISTERED.setdefault(driver, {}).update({f"{owner}/{k}": v for k, v in cases.items()})


def answers(driver: str, owner: str, cases: Cases, run: Callable[[Cases], Cases]) -> Cases:
    """vLLM's answers to ``owner``'s ``cases``: every registered case of ``driver`` not yet answered is run
    by ``run`` in one go (the driver's subprocess)."""
    register(driver, owner, cases)
    got = _ANSWERS.setdefault(driver, {})
    prefix = f"{owner}/"
    if any(k not in got for k in _REGISTERED[driver] if k.startswith(prefix)):
        got.update(run({k: v for k, v in _REGISTERED[driver].items() if k not in got}))
    return {k[len(prefix):]: v for k, v in got.items() if k.startswith(prefix)}


def grid(
    configs: dict[str, dict[str, Any]], tps: tuple[int, ...], kvs: tuple[str, ...],
    per_name_tps: dict[str, tuple[int, ...]] | None = None, **fields: Any,
) -> Cases:
    """One case ``{name}-tp{tp}-{kv}`` per config, tensor-parallel size (``per_name_tps`` where a config
    has its own) and cache dtype, each with ``fields`` (the driver's options)."""
    return {
        f"{name}-tp{tp}-{kv}": {"config": cfg, "tp": tp, "kv_cache_dtype": kv, **fields}
        for name, cfg in configs.items()
        for tp in (per_name_tps or {}).get(name, tps)
        for kv in kvs
    }


def differing(answers: Cases, cases: Cases) -> set[str]:
    """The config names (case ids before their first ``-``) whose plan differs from vLLM's answer on a
    device (``tests.test_models_hybrid_vllm.differences``)."""
    from tests.test_models_hybrid_vllm import differences

    return {case_id.split("-")[0] for case_id, _ in differences(answers, cases)}
