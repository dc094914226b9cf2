"""Backend selection: argument, KVLAYOUT_BACKEND, auto, and every error path."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

import kvlayout as K
from kvlayout import registry


def test_entry_points_register_builtins() -> None:
    from importlib import metadata

    names = {ep.name for ep in metadata.entry_points(group="kvlayout.backends")}
    assert {"reference", "cuda", "pallas"} <= names


def test_argument_beats_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLAYOUT_BACKEND", "pallas")
    assert registry.resolve("reference")[0] == "reference"
    assert registry.resolve()[0] == "pallas"
    assert registry.load() is K.load_backend("pallas")


def test_unknown_name_lists_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLAYOUT_BACKEND", "tpu")
    with pytest.raises(K.BackendError) as ei:
        registry.load()
    msg = str(ei.value)
    assert msg.startswith(
        "Invalid value 'tpu' for KVLAYOUT_BACKEND. "
        "Valid options: auto, reference, cuda (pip install 'kvlayout[cuda]')"
    )
    assert "pallas (pip install 'kvlayout[pallas]')" in msg
    with pytest.raises(K.BackendError, match="Invalid value 'nope' for backend. Valid"):
        registry.load("nope")


def test_module_attr_errors() -> None:
    with pytest.raises(K.BackendError, match="cannot import 'no_such_mod:X'"):
        registry.load("no_such_mod:X")
    with pytest.raises(K.BackendError, match="has no attribute 'Nope'"):
        registry.load("kvlayout.reference:Nope")
    with pytest.raises(K.BackendError, match="not a kvlayout.Backend subclass"):
        registry.load("kvlayout.reference:normalize_block_ids")
    assert registry.load("kvlayout.reference:ReferenceBackend") is K.ReferenceBackend


@pytest.mark.parametrize("backend, blocked, extra", [("cuda", "torch", "cuda"), ("pallas", "jax", "pallas")])
def test_missing_extra_names_the_install(backend: str, blocked: str, extra: str) -> None:
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\nimport kvlayout\n"
        f"try:\n kvlayout.load_backend({backend!r})\nexcept kvlayout.BackendError as e:\n print(e)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert f"pip install 'kvlayout[{extra}]'" in r.stdout, r.stdout + r.stderr
    assert f"missing module {blocked!r}" in r.stdout


def test_auto_picks_reference_on_cpu_and_logs_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVLAYOUT_BACKEND", raising=False)
    registry._announced.clear()
    with caplog.at_level(logging.INFO, logger="kvlayout"):
        assert registry.resolve()[0] == "reference"
        registry.resolve("auto")
    logs = [r.message for r in caplog.records if "backend auto" in r.message]
    assert len(logs) == 1 and "reference" in logs[0]


def test_create_backend() -> None:
    import numpy as np

    t = K.plan(K.preset("dsv4-test"))
    be = K.create_backend(t, np.zeros(t.total_bytes, np.uint8), backend="reference")
    assert be.mode == "native"
