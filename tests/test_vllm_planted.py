"""vLLM's historical zeroer bugs, planted (issue 14): the conformance battery rejects each one.

The backends of :data:`kvlayout.planted.PLANTED_VLLM` build vLLM's segment list from kvlayout's
rows (one segment per row, deduplicated by address) as the named release did; the control,
vLLM 0.33's algorithm, passes the same battery.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K
from kvlayout.conformance import Case, battery, run_battery
from kvlayout.planted import PLANTED, PLANTED_VLLM, VLLM_033, vllm_zeroer_ranges
from kvlayout.presets import indexer_first


def _cases() -> list[Case]:
    return [c for c in battery(quick=True) if getattr(c, "group", None) is None]


def test_battery_has_vllm_cases() -> None:
    names = {c.name for c in battery(quick=True)}
    assert "vllm-0.28:indexer-group-first" in names
    assert {f"random:{o}:0" for o in ("LBNHC", "LHBNC", "BLNHC", "BHLNC")} <= names


def test_vllm_033_control_passes() -> None:
    failures, _ = run_battery(VLLM_033, _cases())
    assert not failures, "\n".join(f.format() for f in failures)


@pytest.mark.parametrize(
    ("bug", "case"),
    [
        ("vllm-0.27-span-is-stride", "dsv4-test:first-odd-last"),
        ("vllm-0.28-first-span-kept", "vllm-0.28:indexer-group-first"),
        ("vllm-52709-offset-twice", "dsv4-test:first-odd-last"),
    ],
)
def test_each_vllm_bug_is_rejected(bug: str, case: str) -> None:
    assert PLANTED[bug] is PLANTED_VLLM[bug]
    failures, _ = run_battery(PLANTED_VLLM[bug], _cases())
    failed = {f.case for f in failures}
    assert case in failed, sorted(failed)
    text = next(f for f in failures if f.case == case).format()
    assert f"backend=planted:{bug}" in text and "kvlayout zero spec.json --blocks" in text


def test_0_28_leaves_the_attention_page_stale() -> None:
    """Indexer first: vLLM 0.28 cleared 8,448 B of each row, not the 37,376 B attention page."""
    t = K.plan(indexer_first(6))
    ids = np.array([3])
    good = vllm_zeroer_ranges(t, ids)
    bad = vllm_zeroer_ranges(t, ids, first_span_kept=True)
    assert good == [(3 * 37_440, 3 * 37_440 + 37_376)]
    assert bad == [(3 * 37_440, 3 * 37_440 + 8_448)]


def test_52709_runs_past_the_buffer_on_the_last_block() -> None:
    t = K.plan(K.preset("dsv4-test"))
    ends = [b for _, b in vllm_zeroer_ranges(t, np.array([99]), offset_twice=True)]
    assert max(ends) == 99 * 149_760 + 2 * 112_320 + 37_376 > t.total_bytes
    assert (
        max(b for _, b in vllm_zeroer_ranges(t, np.array([99]), span_is_stride=True))
        == 100 * 149_760 + 112_320
    )
