"""The vLLM adapter's refusals that the twenty-third session's mutation run found unpinned (issue 25).

Each test pins what a surviving mutant of ``scripts/mutation.sh vllm`` (on the sources of a2b3620)
changed: the full ``field = value: why`` and the ``value`` attribute of ``check_views_against_layout``'s
refusal of a layer whose view is no tensor, and of ``_walk_tensors``' refusals of a tensor that is
not dense and strided and (strict) of a value that is no tensor; and that a tensor-like object with
no ``layout`` attribute is taken as strided. vLLM 0.33.0's own objects on the CPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.driver import ground_truth

ground_truth()

import torch  # noqa: E402

import kvlayout as K  # noqa: E402
from kvlayout.errors import SpecError  # noqa: E402
from kvlayout.integrations import vllm as V  # noqa: E402

# the fixture of tests/test_mutants_vllm.py: two layers, one tensor at storage byte LEAD
from tests.test_mutants_vllm import CONFIG, NAMES, refused  # noqa: E402
from tests.test_mutants_vllm_s16 import views  # noqa: E402

NO_TENSOR = "must be a tensor or a list/tuple of tensors, and holds no tensor"
SPARSE = "must be a dense, strided tensor, as vLLM's cache views are"
STRICT = "must hold tensors (or lists/tuples of them) only, as vLLM's caches do"


# --------------------------------------------------------------------------- check_views_against_layout
@pytest.mark.parametrize("bad", [5, "cache", b"\0" * 8, None])
def test_a_single_view_that_is_no_tensor_is_refused_by_type_name(bad: Any) -> None:
    _, vs = views()
    layout = K.plan_layout(V.spec_from_kv_cache_config(CONFIG))
    kind = type(bad).__name__
    field = f"caches[{NAMES[0]!r}]"
    refused(
        SpecError,
        lambda: V.check_views_against_layout(layout, {**vs, NAMES[0]: bad}, 1 << 16, where="caches"),
        field,
        kind,
        f"{field} = {kind!r}: {NO_TENSOR}",
    )


def test_a_list_view_of_no_tensor_is_refused_by_type_name() -> None:
    _, vs = views()
    layout = K.plan_layout(V.spec_from_kv_cache_config(CONFIG))
    field = f"kv_caches[{NAMES[1]!r}]"
    for bad in ([], (), [3, "x"]):
        kind = type(bad).__name__
        refused(
            SpecError,
            lambda bad=bad: V.check_views_against_layout(layout, {**vs, NAMES[1]: bad}, 1 << 16),
            field,
            kind,
            f"{field} = {kind!r}: {NO_TENSOR}",
        )


# --------------------------------------------------------------------------- _walk_tensors
def test_a_sparse_tensor_is_refused_with_its_layout() -> None:
    sparse = torch.zeros(4, 8).to_sparse()
    layout = str(sparse.layout)
    assert layout == "torch.sparse_coo"
    for strict in (False, True):
        refused(
            SpecError,
            lambda strict=strict: list(V._walk_tensors([sparse], "caches['a']", strict=strict)),
            "caches['a']",
            layout,
            f"caches['a'] = a {layout} tensor: {SPARSE}",
        )
    _, vs = views()
    field = f"kv_caches[{NAMES[0]!r}]"
    refused(
        SpecError,
        lambda: V.KVBlockZeroer.from_kv_caches(CONFIG, {**vs, NAMES[0]: sparse}),
        field,
        layout,
        f"{field} = a {layout} tensor: {SPARSE}",
    )


class Storage:
    """A tensor-like object with ``untyped_storage`` and no ``layout``: taken as dense and strided."""

    def untyped_storage(self) -> None:
        return None


def test_a_tensor_without_a_layout_is_taken_as_strided() -> None:
    s = Storage()
    assert list(V._walk_tensors(s)) == [s]
    assert list(V._walk_tensors([s, (s,)], strict=True)) == [s, s]


@pytest.mark.parametrize("bad", [7, "x", None, 2.5])
def test_strict_walks_refuse_what_is_no_tensor_by_type_name(bad: Any) -> None:
    kind = type(bad).__name__
    refused(
        SpecError,
        lambda: list(V._walk_tensors([torch.zeros(2), bad], strict=True)),
        "kv_caches",
        kind,
        f"kv_caches = a {kind}: {STRICT}",
    )
    assert list(V._walk_tensors([bad])) == []  # not strict: skipped
    _, vs = views()
    field = f"kv_caches[{NAMES[1]!r}]"
    refused(
        SpecError,
        lambda: V.KVBlockZeroer.from_kv_caches(CONFIG, {**vs, NAMES[1]: [vs[NAMES[1]], bad]}),
        field,
        kind,
        f"{field} = a {kind}: {STRICT}",
    )
