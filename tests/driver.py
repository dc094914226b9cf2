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
