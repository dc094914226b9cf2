"""A test file that runs part of itself in a second Python process (a vLLM import with its own
environment), started at import so that its imports overlap the test process's."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


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
