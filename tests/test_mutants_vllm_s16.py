"""The vLLM adapter's refusals that the sixteenth session's mutation run found unpinned (issue 25).

Each test pins what a surviving mutant of ``scripts/mutation.sh vllm`` changed: the full
``field = value: why`` and the ``value`` attribute of the refusals of ``runner_only_attn_layers``
(``_check_names``), of a ``kv_caches`` that is not a mapping, of views nested too deep
(``_walk_tensors``, its default ``where`` included) and of a cache starting off a 4-byte word
(``KVBlockZeroer.from_kv_caches``). vLLM 0.33.0's own objects on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from tests.driver import ground_truth

ground_truth()

import torch  # noqa: E402
from vllm.v1 import kv_cache_interface as I  # noqa: E402

import kvlayout as K  # noqa: E402
from kvlayout.errors import LayoutBufferError, SpecError  # noqa: E402
from kvlayout.integrations import vllm as V  # noqa: E402

# the fixture of tests/test_mutants_vllm.py: two layers, one tensor at storage byte LEAD
from tests.test_mutants_vllm import ATTN, CONFIG, LEAD, NAMES, TENSOR, refused  # noqa: E402


def views(lead: int = LEAD) -> tuple[torch.Tensor, dict[str, Any]]:
    """vLLM's BLHNC views of CONFIG's one tensor, ``lead`` bytes into a poisoned uint8 storage."""
    storage = torch.from_numpy(K.poison_pattern(lead + TENSOR.size + 4096, seed=3))
    raw = storage.view(torch.int8)[lead : lead + TENSOR.size]
    got = I.create_kv_cache_views(raw, ATTN, CONFIG.num_blocks, I.KVCacheLayout.BLHNC, TENSOR)
    return storage, dict(zip(NAMES, got))


def nested(x: Any, depth: int) -> Any:
    for _ in range(depth):
        x = [x]
    return x


# --------------------------------------------------------------------------- _check_names
def test_runner_only_layers_as_one_name_are_refused_with_the_name() -> None:
    why = "must be a collection of layer names (a set, list or tuple), not a single name"
    for bad in ("layer.1", b"layer.1"):
        refused(
            SpecError,
            lambda bad=bad: V.spec_from_kv_cache_config(CONFIG, runner_only_attn_layers=bad),
            "runner_only_attn_layers",
            bad,
            f"runner_only_attn_layers = {bad!r}: {why}",
        )
    refused(
        SpecError,
        lambda: V.KVBlockZeroer(CONFIG, torch.zeros(8192, dtype=torch.uint8), runner_only_attn_layers=7),
        "runner_only_attn_layers",
        7,
        f"runner_only_attn_layers = 7: {why}",
    )


def test_runner_only_layers_holding_a_non_name_are_refused_at_its_index() -> None:
    for bad, shown in ((3, "3"), (None, "None"), (b"x", "b'x'")):
        refused(
            SpecError,
            lambda bad=bad: V.spec_from_kv_cache_config(CONFIG, runner_only_attn_layers=["shared", bad]),
            "runner_only_attn_layers[1]",
            bad,
            f"runner_only_attn_layers[1] = {shown}: must be a layer name (str)",
        )


# --------------------------------------------------------------------------- _check_views_mapping
def test_views_that_are_not_a_mapping_are_refused_by_type_name() -> None:
    _, vs = views()
    layout = K.plan_layout(V.spec_from_kv_cache_config(CONFIG))
    why = "must map layer names to their tensors (the dict vLLM's allocate_kv_cache returns)"
    for bad in (list(vs.values()), tuple(vs.values())):
        kind = type(bad).__name__
        refused(
            SpecError,
            lambda bad=bad: V.KVBlockZeroer.from_kv_caches(CONFIG, bad),
            "kv_caches",
            kind,
            f"kv_caches = {kind}: {why}",
        )
        refused(
            SpecError,
            lambda bad=bad: V.check_views_against_layout(layout, bad, 1 << 16, where="caches"),
            "caches",
            kind,
            f"caches = {kind}: {why}",
        )


# --------------------------------------------------------------------------- _walk_tensors
def test_views_nested_too_deep_name_the_depth_as_the_value() -> None:
    _, vs = views()
    deep = nested(vs[NAMES[1]], V.MAX_VIEW_DEPTH + 1)
    why = f"nests lists/tuples more than {V.MAX_VIEW_DEPTH} deep (vLLM's caches nest at most two)"
    depth = V.MAX_VIEW_DEPTH + 1
    refused(
        SpecError,
        lambda: V.KVBlockZeroer.from_kv_caches(CONFIG, {**vs, NAMES[1]: deep}),
        f"kv_caches[{NAMES[1]!r}]",
        depth,
        f"kv_caches[{NAMES[1]!r}] = lists nested {depth} deep: {why}",
    )
    # the default place named is the whole kv_caches
    refused(
        SpecError,
        lambda: list(V._walk_tensors(deep)),
        "kv_caches",
        depth,
        f"kv_caches = lists nested {depth} deep: {why}",
    )
    assert list(V._walk_tensors(nested(vs[NAMES[0]], V.MAX_VIEW_DEPTH))) == [vs[NAMES[0]]]


class Rebuilt(Mapping[str, Any]):
    """A mapping that builds a layer's value on every read (a lazy view of vLLM's caches): the
    second read of ``NAMES[1]`` nests its tensor too deep (from_kv_caches reads it once since hostile
    pass 25: tests/test_hostile_s25.py's V1; ``deep_first`` nests it too deep on the first read)."""

    def __init__(self, vs: dict[str, Any], deep_first: bool = False) -> None:
        self.vs, self.reads, self.deep_first = vs, 0, deep_first

    def __getitem__(self, name: str) -> Any:
        if name == NAMES[1]:
            self.reads += 1
            deep = self.deep_first or self.reads > 1
            return nested(self.vs[name], V.MAX_VIEW_DEPTH + 1 if deep else 1)
        return self.vs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.vs)

    def __len__(self) -> int:
        return len(self.vs)


def test_every_walk_of_the_views_names_the_layer() -> None:
    storage, vs = views()
    before = storage.clone()
    depth = V.MAX_VIEW_DEPTH + 1
    why = f"nests lists/tuples more than {V.MAX_VIEW_DEPTH} deep (vLLM's caches nest at most two)"
    caches = Rebuilt(vs, deep_first=True)
    refused(
        SpecError,
        lambda: V.KVBlockZeroer.from_kv_caches(CONFIG, caches),
        f"kv_caches[{NAMES[1]!r}]",
        depth,
        f"kv_caches[{NAMES[1]!r}] = lists nested {depth} deep: {why}",
    )
    assert caches.reads == 1 and torch.equal(storage, before)
    # read once: the later reads' deeper nesting is never seen (hostile pass 25)
    lazy = Rebuilt(vs)
    V.KVBlockZeroer.from_kv_caches(CONFIG, lazy)
    assert lazy.reads == 1 and torch.equal(storage, before)


# --------------------------------------------------------------------------- from_kv_caches
def test_a_cache_off_a_word_names_its_byte_and_the_first_views_element() -> None:
    storage, vs = views()
    before = storage.clone()

    def by(v: torch.Tensor, elements: int) -> torch.Tensor:
        return v.as_strided(v.shape, v.stride(), v.storage_offset() + elements)

    # the first layer's view in bfloat16, the second's the same bytes in int8: both start 2 B late
    odd = {NAMES[0]: by(vs[NAMES[0]], 1), NAMES[1]: by(vs[NAMES[1]].view(torch.int8), 2)}
    base = LEAD + 2
    refused(
        LayoutBufferError,
        lambda: V.KVBlockZeroer.from_kv_caches(CONFIG, odd),
        "kv_caches.storage_offset",
        base,
        f"kv_caches.storage_offset = {base} B: the views put the cache at storage byte {base} "
        f"(element {base // 2} of their 2-byte dtype): the zeroer writes 4-byte words, so it must "
        "start at a multiple of 4 bytes",
    )
    flipped = {NAMES[1]: odd[NAMES[1]], NAMES[0]: odd[NAMES[0]]}  # the first view is the int8 one
    with pytest.raises(LayoutBufferError, match=rf"\(element {base} of their 1-byte dtype\)"):
        V.KVBlockZeroer.from_kv_caches(CONFIG, flipped)
    assert torch.equal(storage, before)
