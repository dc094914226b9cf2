"""Shared fixtures: keep JAX on the CPU and quiet, give every test a poisoned buffer helper."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "thorough", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _compiled_steps(zeroer: object) -> int:
    """Shapes a zeroer's own ``jax.jit`` steps were traced and compiled for (its retrace count)."""
    return sum(f._cache_size() for f in vars(zeroer).values() if hasattr(f, "_cache_size"))


@pytest.fixture
def compiled_steps() -> Callable[[object], int]:
    """Counts a zeroer's compiled step variants, read from JAX's own jit caches (so the
    production classes carry no test counters)."""
    return _compiled_steps
