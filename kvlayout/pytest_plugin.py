"""pytest plugin: ``kvlayout_conformance`` runs the conformance battery on a backend in one line.

    def test_my_backend(kvlayout_conformance):
        kvlayout_conformance(MyBackend)          # or "my_pkg.mod:MyBackend"

Registered through the ``pytest11`` entry point, so installing kvlayout makes it available.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from . import registry
from .backend import Backend
from .conformance import battery, run_battery


@pytest.fixture
def kvlayout_conformance() -> Callable[..., None]:
    """Run the battery (``quick=True`` for fewer random specs); fail with the full report."""

    def run(backend: type[Backend] | str, *, quick: bool = False) -> None:
        cls: Any = registry.load(backend) if isinstance(backend, str) else backend
        failures, _ = run_battery(cls, battery(quick))
        if failures:
            pytest.fail("\n".join(f.format() for f in failures), pytrace=False)

    return run
