"""``import kvlayout`` never imports vLLM (nor torch); the vLLM adapter imports it lazily."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import kvlayout, kvlayout.integrations, kvlayout.integrations.vllm
from kvlayout.integrations.vllm import layout_name
assert layout_name("HND") == "LBHNC"
heavy = sorted(m for m in ("vllm", "torch", "jax", "triton") if m in sys.modules)
assert not heavy, heavy
"""


def test_import_kvlayout_and_the_adapter_without_vllm() -> None:
    res = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
