"""plan()'s coalesce check (a non-bool is refused, naming the option), session 17's mutants."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout as K
from kvlayout.errors import SpecError


@pytest.mark.parametrize("bad", ["no", 0, 1, None, 1.0])
def test_plan_refuses_a_coalesce_that_is_not_a_bool(bad: Any) -> None:
    spec = K.preset("dsv4-test").with_num_blocks(4)
    with pytest.raises(SpecError) as e:
        K.plan(spec, coalesce=bad)
    assert str(e.value) == f"coalesce = {bad!r}: must be True or False"
    assert e.value.field == "coalesce" and e.value.value is bad

