"""The vLLM adapter's lines that the twenty-sixth session's mutation run found unpinned (issue 25).

Survivors of ``scripts/mutation.sh vllm`` on the sources of 7ccd0e3 (kvlayout/integrations/vllm.py of
ff1c461): hostile pass 24's refusal of tensor-subclass views in ``KVBlockZeroer.from_kv_caches`` and pass
25's ``_read_once`` were tested only in tests/test_hostile_s24.py and tests/test_hostile_s25.py (not in the
module's fast list), and there by message. Here the refusal's ``field``, ``value`` and whole message, and
the depth at which ``_read_once`` names a nesting (as ``_walk_tensors`` does: 16 lists deep read, 17
refused).
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout as K
from kvlayout.errors import SpecError

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from kvlayout.integrations.vllm import MAX_VIEW_DEPTH, KVBlockZeroer, _read_once  # noqa: E402
from tests.test_vllm_hostile import CONFIG, _storage_views  # noqa: E402


class Shifted(torch.Tensor):  # type: ignore[misc]
    """A view whose ``storage_offset()`` says 1,024 elements (2 KiB) further on than it is."""

    def storage_offset(self) -> int:
        return int(super().storage_offset()) + 1024


def _nested(depth: int, leaf: Any) -> Any:
    """``leaf`` inside ``depth`` lists: ``[[...[leaf]...]]``."""
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


def test_subclass_views_are_refused_by_field_value_and_message() -> None:
    """A subclass view: ``SpecError`` on ``kv_caches`` with the subclass's name as the value, nothing
    written; vLLM's own (plain) views of the same storage still build and zero block 0 only."""
    storage, views = _storage_views()
    before = storage.clone()
    lying = {name: v.as_subclass(Shifted) for name, v in views.items()}
    with pytest.raises(SpecError) as e:
        KVBlockZeroer.from_kv_caches(CONFIG, lying)
    assert e.value.field == "kv_caches"
    assert type(e.value.value) is str and e.value.value == "Shifted"
    assert str(e.value) == (
        "kv_caches = a Shifted: must be plain torch.Tensor views, as vLLM's are "
        "(a subclass may report another placement)"
    )
    assert torch.equal(storage, before)
    # one subclass view among plain ones is found too (the first one that is not plain)
    mixed = dict(views)
    last = list(mixed)[-1]
    mixed[last] = mixed[last].as_subclass(Shifted)
    with pytest.raises(SpecError) as e:
        KVBlockZeroer.from_kv_caches(CONFIG, mixed)
    assert (e.value.field, e.value.value) == ("kv_caches", "Shifted")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    if kc.MODE == "native":
        pytest.skip("CPU views: interpreter only")
    KVBlockZeroer.from_kv_caches(CONFIG, views).zero_block_ids([0])
    assert K.changed_ranges(before.numpy(), storage.numpy()).tolist() == [[4096, 6144]]


def test_read_once_reads_sixteen_lists_deep_and_names_the_seventeenth() -> None:
    """``_read_once`` turns lists into tuples down to ``MAX_VIEW_DEPTH`` (16) lists, as ``_walk_tensors``
    walks them; one more is a ``SpecError`` naming the layer and the depth 17."""
    assert MAX_VIEW_DEPTH == 16
    got = _read_once("kv_caches", {"L0": _nested(16, 5), "L1": [1, (2, [3])], "L2": 7})
    want = 5
    for _ in range(16):
        want = (want,)
    assert got == {"L0": want, "L1": (1, (2, (3,))), "L2": 7}
    assert type(got) is dict and type(got["L1"][1][1]) is tuple
    with pytest.raises(SpecError) as e:
        _read_once("kv_caches", {"L0": 1, "deep": _nested(17, 5)})
    assert e.value.field == "kv_caches['deep']"
    assert type(e.value.value) is int and e.value.value == 17
    said = "kv_caches['deep'] = lists nested 17 deep: nests lists/tuples more than 16"
    assert str(e.value).startswith(said)
