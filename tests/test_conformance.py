"""The conformance harness accepts the real backends and rejects every planted bug."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvlayout as K
from kvlayout.cli import main
from kvlayout.conformance import battery, run_battery, run_conformance
from kvlayout.planted import PLANTED


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_every_planted_bug_is_rejected(bug: str) -> None:
    failures, _ = run_battery(PLANTED[bug], battery(quick=True))
    assert failures, f"planted bug {bug} passed the battery"
    text = failures[0].format()
    assert (
        f"backend=planted:{bug}" in text and "replay:" in text and "kvlayout zero spec.json --blocks" in text
    )


def test_full_battery_real_backends_agree_byte_for_byte() -> None:
    backends = {"reference": K.ReferenceBackend}
    for name in ("cuda", "pallas"):
        try:
            backends[name] = K.load_backend(name)
        except K.BackendError as e:  # CI installs both: make a missing extra loud
            pytest.fail(str(e))
    failures = run_conformance(backends)
    assert not failures, "\n".join(f.format() for f in failures)


def test_cross_backend_mismatch_is_reported() -> None:
    failures = run_conformance({"reference": K.ReferenceBackend, "planted": PLANTED["overrun-4"]}, quick=True)
    assert any("differs from reference's" in f.detail for f in failures)


def test_cli_conformance_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--backend", "reference", "--quick"]) == 0
    assert "all passed" in capsys.readouterr().out
    assert main(["conformance", "--backend", "kvlayout.planted:ReferenceBackend", "--quick"]) == 0
    capsys.readouterr()


def test_replay_names_the_backend_as_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``module:Class`` backend's replay command names it so, not by the class's own ``name`` (which
    ``kvlayout zero --backend`` cannot load)."""
    (tmp_path / "my_backends.py").write_text(
        "from kvlayout.planted import PLANTED\nBad = PLANTED['overrun-4']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["conformance", "--backend", "my_backends:Bad", "--quick"]) == 1
    out = capsys.readouterr().out
    replays = [line for line in out.splitlines() if "replay:" in line]
    assert replays and all("--backend my_backends:Bad" in line for line in replays), replays[:2]
    assert "backend=my_backends:Bad" in out


def test_pytest_fixture(kvlayout_conformance) -> None:  # type: ignore[no-untyped-def]
    kvlayout_conformance("reference", quick=True)
    with pytest.raises(pytest.fail.Exception, match="stride-as-span"):
        kvlayout_conformance(PLANTED["stride-as-span"], quick=True)
