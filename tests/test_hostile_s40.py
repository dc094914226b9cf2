"""Hostile pass 40 (/tmp/h40), the vLLM adapter on the CPU: each test failing on the code before its fix."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.driver import ground_truth

G = ground_truth()

import torch  # noqa: E402
from vllm.v1 import kv_cache_interface as I  # noqa: E402

import kvlayout as K  # noqa: E402
from kvlayout.errors import BlockIdError, SpecError, TableError  # noqa: E402
from kvlayout.integrations.vllm import (  # noqa: E402
    KVBlockZeroer,
    check_views_against_layout,
    spec_from_kv_cache_config,
    table_from_block_zeroer,
)
from tests.test_vllm_hostile import ATTN, CONFIG, GUARD, NAMES, TENSOR, _storage_views  # noqa: E402

GROUPS = [I.KVCacheGroupSpec(NAMES, ATTN)]


def test_from_kv_caches_builds_the_zeroer_from_the_spec_it_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The config was read twice: a num_blocks of 4 for the views' check, 8 for the zeroer (the config
    changed between, here right after the check), and block 5 was zeroed at bytes past every view."""
    import kvlayout.integrations.vllm as V

    big = I.KVCacheTensor(size=16384, layers=NAMES, layer_stride=1024, block_stride=2048)

    class Flaky:
        kv_cache_tensors = [big]
        kv_cache_groups = GROUPS
        kv_cache_layout = "BLHNC"
        num_blocks = 4

    checked = V.check_views_against_layout

    def then_changed(*args: Any, **kwargs: Any) -> Any:
        out = checked(*args, **kwargs)
        Flaky.num_blocks = 8
        return out

    monkeypatch.setattr(V, "check_views_against_layout", then_changed)

    poison = K.poison_pattern(GUARD + 16384 + GUARD, seed=3)
    storage = torch.from_numpy(poison.copy())
    raw = storage.view(torch.int8)[GUARD : GUARD + 16384]
    full = I.create_kv_cache_views(raw, ATTN, 8, I.KVCacheLayout.BLHNC, big)
    z = KVBlockZeroer.from_kv_caches(Flaky(), {n: v[:4] for n, v in zip(NAMES, full)})
    assert z.num_blocks == 4
    with pytest.raises(BlockIdError, match=r"block_ids\[0\] = 5: outside \[0, 4\)"):
        z.zero_block_ids([5])
    z.zero_block_ids([3])
    assert K.changed_ranges(poison, storage.numpy()).tolist() == [[GUARD + 3 * 2048, GUARD + 4 * 2048]]


def test_a_layers_cache_of_too_many_tensors_is_refused_at_once() -> None:
    """15 lists of 10 shared references stood for 10**15 tensors (ran on and on); a flat tuple of 100,000
    references took over 10 s."""
    storage, views = _storage_views()
    deep: Any = views[NAMES[1]]
    for _ in range(15):
        deep = [deep] * 10
    lay = K.plan_layout(spec_from_kv_cache_config(CONFIG))
    for v in (deep, (views[NAMES[1]],) * 100_000):
        start = time.perf_counter()
        with pytest.raises(SpecError, match=r"^kv_caches\['model.layers.1.attn'\] = over 1024 items"):
            KVBlockZeroer.from_kv_caches(CONFIG, {**views, NAMES[1]: v})
        with pytest.raises(SpecError, match=r"^kv_caches\['model.layers.1.attn'\] = over 1024 items"):
            check_views_against_layout(lay, {**views, NAMES[1]: v}, storage.untyped_storage().nbytes())
        assert time.perf_counter() - start < 2.0


def test_a_meta_of_too_many_segments_is_refused_before_it_is_read() -> None:
    """10**6 segments were read into Python ints and rows (7 s, 829 MB) before the table refused them."""
    n = 1_000_000
    meta = (torch.arange(n, dtype=torch.int64) * 4096 + 1000, torch.full((n,), 1024, dtype=torch.int64),
            torch.full((n,), 256, dtype=torch.int64), 1, 256, n)
    start = time.perf_counter()
    with pytest.raises(TableError, match=r"^zeroer._meta\[0\] \(seg_addrs\) = 1000000 entries: at most"):
        table_from_block_zeroer(SimpleNamespace(_meta=meta), 1000, 8192, 4)
    assert time.perf_counter() - start < 0.5


def test_a_huge_stride_on_a_one_block_view_is_named() -> None:
    """A dim 0 of one block with a stride of 2**62 (torch allows any there) raised NumPy's raw
    OverflowError."""
    storage, views = _storage_views()
    one = I.KVCacheTensor(size=2048, layers=NAMES, layer_stride=1024, block_stride=2048)
    cfg1 = I.KVCacheConfig(num_blocks=1, kv_cache_tensors=[one], kv_cache_groups=GROUPS,
                           kv_cache_layout="BLHNC")
    huge = {n: v.as_strided((1, *v.shape[1:]), (2**62, *v.stride()[1:]), v.storage_offset())
            for n, v in views.items()}
    lay = K.plan_layout(spec_from_kv_cache_config(cfg1))
    with pytest.raises(SpecError, match=r"^kv_caches\['model.layers.0.attn'\].stride = \(46116860"):
        check_views_against_layout(lay, huge, storage.untyped_storage().nbytes())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("none", r"^kv_cache_config.num_blocks = missing: a NoneType is no vLLM KVCacheConfig"),
        ("tensors", r"^kv_cache_config.kv_cache_tensors = None: must be a list"),
        ("groups", r"^kv_cache_config.kv_cache_groups = None: must be a list"),
        ("layer_names", r"^kv_cache_groups\[0\].layer_names = None: must be a list of layer names"),
        ("size", r"^kv_cache_tensors\[0\].size = '8192': must be an integer"),
        ("kernel", r"^kernel_block_sizes = 'generator': must be a list"),
    ],
)
def test_the_configs_fields_are_named_when_of_another_type(change: str, message: str) -> None:
    """A None config, None lists, a str size and a generator of kernel block sizes raised raw errors."""
    cfg: Any = SimpleNamespace(num_blocks=4, kv_cache_tensors=[TENSOR],
                               kv_cache_groups=[I.KVCacheGroupSpec(NAMES, ATTN)], kv_cache_layout="BLHNC")
    kw: dict[str, Any] = {}
    if change == "none":
        cfg = None
    elif change == "tensors":
        cfg.kv_cache_tensors = None
    elif change == "groups":
        cfg.kv_cache_groups = None
    elif change == "layer_names":
        cfg.kv_cache_groups = [SimpleNamespace(layer_names=None, kv_cache_spec=ATTN)]
    elif change == "size":
        cfg.kv_cache_tensors = [SimpleNamespace(size="8192", layers=NAMES, offset=0, layer_stride=1024)]
    else:
        kw["kernel_block_sizes"] = (x for x in [16])
    with pytest.raises(SpecError, match=message):
        spec_from_kv_cache_config(cfg, "BLHNC", **kw)
    assert np.array_equal(spec_from_kv_cache_config(CONFIG).num_blocks, 4)
