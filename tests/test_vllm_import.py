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


PLUGIN_CHECK = """
import os, sys
import kvlayout.integrations.vllm_plugin as P
assert P.installed_mode() is None and not any(isinstance(f, P._AfterImport) for f in sys.meta_path)
assert "KVLAYOUT_VLLM_MODE" not in os.environ
heavy = sorted(m for m in ("vllm", "torch", "jax", "triton") if m in sys.modules)
assert not heavy, heavy
P.install("verify")  # vLLM's worker code not imported yet: a one-shot hook waits for it
assert any(isinstance(f, P._AfterImport) for f in sys.meta_path) and "vllm" not in sys.modules
P.uninstall()
assert not any(isinstance(f, P._AfterImport) for f in sys.meta_path)
"""


def test_importing_the_plugin_changes_nothing() -> None:
    """The plugin module patches nothing until vLLM calls it; install() imports no vLLM."""
    res = subprocess.run([sys.executable, "-c", PLUGIN_CHECK], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
