"""The Pallas zeroer's host-id paths added by issue 25's fourth and fifth passes (``step_ids`` for ids
that are neither NumPy nor a list of ints, host ids beside JAX values) and
``check_num_ids``: every refusal's field, value and message, and the int32 bounds."""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K

jax = pytest.importorskip("jax")
Z = pytest.importorskip("kvlayout.backends.pallas.zeroer")
import jax.numpy as jnp  # noqa: E402

WHY = "must be a 1-D integer array of block ids (nothing was written)"
LO, HI = -(2**31), 2**31 - 1


def _err(fn: object, *args: object) -> K.BlockIdError:
    with pytest.raises(K.BlockIdError) as e:
        fn(*args)  # type: ignore[operator]
    return e.value


def test_a_bool_beside_ints_is_named_with_its_value() -> None:
    e = _err(Z.step_ids, [True, 5])
    assert (e.field, e.value) == ("block_ids[0]", True)


def test_host_ids_beside_jax_values_fit_int32_or_become_minus_one() -> None:
    one = jnp.asarray(1, jnp.int32)
    ids = [one, np.int64(LO), np.int64(HI), np.int64(LO - 1), np.int64(HI + 1), 7]
    assert Z.step_ids(ids).tolist() == [1, LO, HI, -1, -1, 7]
    e = _err(Z.step_ids, [one, 1.5])  # a float id: refused by its index (hostile pass 16, L2)
    assert (e.field, e.value) == ("block_ids[1]", 1.5)
    assert str(e) == "block_ids[1] = 1.5: must be an integer block id"
    e = _err(Z.step_ids, [one, "x"])
    assert (e.field, e.value) == ("block_ids[1]", "x")
    assert str(e) == "block_ids[1] = 'x': must be an integer block id"


def test_a_list_jax_cannot_convert_is_named() -> None:
    bad = [jnp.asarray([1, 2], jnp.int32), 3]  # ragged: JAX's ValueError
    e = _err(Z.step_ids, bad)
    assert (e.field, e.value) == ("block_ids", bad) and str(e).endswith(f": {WHY}")
    assert type(e) is K.BlockIdError


def test_host_ids_numpy_cannot_convert_are_named() -> None:
    ragged = [[1], [1, 2]]  # a list in the list: refused by its index before NumPy sees it (hostile pass 16)
    e = _err(Z.step_ids, ragged)
    assert (e.field, e.value) == ("block_ids[0]", [1])
    assert str(e) == "block_ids[0] = [1]: must be an integer block id"
    assert type(e) is K.BlockIdError


def test_check_num_ids_bounds() -> None:
    assert Z.check_num_ids(0) == 0 and Z.check_num_ids(HI) == HI and Z.check_num_ids(np.int64(5)) == 5
    cases = ((-1, "must be at least 0"), (HI + 1, "must be at most 2**31 - 1"), (1.5, "must be an integer"))
    for bad, why in cases:
        e = _err(Z.check_num_ids, bad)
        assert type(e) is K.BlockIdError and (e.field, e.value) == ("num_ids", bad) and why in str(e), str(e)
