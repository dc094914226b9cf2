"""kvlayout.cli's session-16 paths: a backend class that fails as it runs is one BackendError naming it
and the exception (the traceback logged at INFO for ``-v``), a KVLayoutError or MemoryError passes
through as it is."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import kvlayout as K
import kvlayout.cli as C
from kvlayout.reference import ReferenceBackend


class Broken(ReferenceBackend):
    """A backend whose zeroing fails as a user's class might."""

    def zero(self, block_ids: Any, group: str | None = None) -> None:
        raise TypeError("broken\non purpose " + "x" * 200)


class Refusing(ReferenceBackend):
    def zero(self, block_ids: Any, group: str | None = None) -> None:
        raise K.BlockIdError("block_ids: refused here", field="block_ids", value=None)


class OutOfMemory(ReferenceBackend):
    def zero(self, block_ids: Any, group: str | None = None) -> None:
        raise MemoryError("no room")


def _table() -> K.SegmentTable:
    return K.plan(K.preset("dsv4-test").with_num_blocks(4))


def test_a_backend_that_fails_is_one_backend_error(caplog: pytest.LogCaptureFixture) -> None:
    t = _table()
    with caplog.at_level(logging.INFO, logger="kvlayout"), pytest.raises(K.BackendError) as e:
        C._run_zero_with("tests.mine:Broken", Broken, t, np.array([1]))
    cause = K.errors.short("broken\non purpose " + "x" * 200)[1:-1]
    assert str(e.value) == f"backend = 'tests.mine:Broken': failed as it ran: TypeError: {cause}"
    assert e.value.field == "backend" and e.value.value == "tests.mine:Broken"
    assert e.value.__cause__ is None and e.value.__suppress_context__
    rec = [r for r in caplog.records if r.name == "kvlayout"]
    assert len(rec) == 1 and rec[0].levelno == logging.INFO
    assert rec[0].getMessage() == "backend tests.mine:Broken raised"
    assert rec[0].exc_info is not None and rec[0].exc_info[0] is TypeError


def test_library_errors_and_memory_errors_pass_through(caplog: pytest.LogCaptureFixture) -> None:
    t = _table()
    with caplog.at_level(logging.INFO, logger="kvlayout"):
        with pytest.raises(K.BlockIdError, match="^block_ids: refused here$"):
            C._run_zero_with("x:Refusing", Refusing, t, np.array([1]))
        with pytest.raises(MemoryError, match="^no room$"):
            C._run_zero_with("x:OutOfMemory", OutOfMemory, t, np.array([1]))
    assert not [r for r in caplog.records if r.name == "kvlayout"]
    rep = C._run_zero_with("reference", ReferenceBackend, t, np.array([1]))
    assert rep["backend"] == "reference" and rep["matches_contract"] is True

