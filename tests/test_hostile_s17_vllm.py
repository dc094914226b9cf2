"""The seventeenth hostile pass's findings in the vLLM adapter and plugin (issue 25), each pinned.

F3: a sparse tensor among the views (``untyped_storage()`` raised NotImplementedError), non-tensors in a
layer's cache (silently skipped), a forward context binding no tensor (IndexError) and a ``num_blocks``
that is no integer (ValueError, or 4.5 read as 4). F4: a group index whose comparisons lie (IndexError).
Each refused naming the field, with nothing written. vLLM 0.33.0's own objects on the CPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.driver import ground_truth

ground_truth()

import torch  # noqa: E402

from kvlayout.errors import BlockIdError, SpecError  # noqa: E402
from kvlayout.integrations import vllm as V  # noqa: E402
from kvlayout.integrations import vllm_plugin as P  # noqa: E402
from tests.oracles import LyingInt  # noqa: E402
from tests.test_mutants_vllm import ATTN, CONFIG, NAMES, views_of  # noqa: E402


def _untouched(storage: torch.Tensor, call: Any, exc: type[Exception], field: str, words: str) -> None:
    before = storage.clone()
    with pytest.raises(exc) as info:
        call()
    assert info.value.field == field, info.value  # type: ignore[attr-defined]
    assert words in str(info.value), str(info.value)
    assert torch.equal(storage, before)


def test_f3_a_sparse_view_is_refused_naming_the_layer() -> None:
    storage, views = views_of(CONFIG, ATTN)
    for name in NAMES:  # first or later
        bad = {**views, name: views[name].to_sparse()}
        where = f"kv_caches[{name!r}]"
        _untouched(
            storage, lambda b=bad: V.KVBlockZeroer.from_kv_caches(CONFIG, b), SpecError, where, "dense"
        )


def test_f3_non_tensors_in_a_layers_cache_are_refused() -> None:
    storage, views = views_of(CONFIG, ATTN)
    for junk in (None, "x", 3):
        bad = {**views, NAMES[1]: (views[NAMES[1]], junk)}
        where = f"kv_caches[{NAMES[1]!r}]"
        _untouched(
            storage, lambda b=bad: V.KVBlockZeroer.from_kv_caches(CONFIG, b), SpecError, where, "tensors"
        )
    V.KVBlockZeroer.from_kv_caches(CONFIG, views)  # the views themselves: built


def test_f3_the_plugins_zeroer_refuses_an_empty_context_and_a_bad_num_blocks() -> None:
    dev = torch.device("cpu")
    with pytest.raises(SpecError) as info:
        P.ReplacedKVBlockZeroer(dev, [], [16], {}, 4, kv_cache_config=CONFIG)
    assert info.value.field == "static_forward_context" and "binds no tensor" in str(info.value)
    with pytest.raises(SpecError) as info:  # vLLM's is a dict (eighteenth pass: a raw AttributeError)
        P.ReplacedKVBlockZeroer(dev, [], [16], [], 4, kv_cache_config=CONFIG)
    assert info.value.field == "static_forward_context" and info.value.value == "list"
    for bad in ("x", 4.5, True, None):
        with pytest.raises(SpecError) as info:
            P.ReplacedKVBlockZeroer(dev, [], [16], {}, bad, kv_cache_config=CONFIG)
        assert info.value.field == "num_blocks" and info.value.value is bad, info.value


def test_f4_a_group_index_whose_comparisons_lie_is_refused() -> None:
    storage, views = views_of(CONFIG, ATTN)
    z = V.KVBlockZeroer.from_kv_caches(CONFIG, views)
    assert z.group_name(0) == z.group_names[0]
    for g in (LyingInt(7), LyingInt(-1), LyingInt(0)):  # no integer at all (pass 32: is_int)
        _untouched(storage, lambda g=g: z.zero_block_ids([0], group=g), BlockIdError, "group", "cache group")
