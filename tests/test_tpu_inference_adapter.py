"""kvlayout.integrations.tpu_inference on tpu-inference-shaped runner objects, in process (issue 24).

tests/test_tpu_inference_truth.py runs the adapter on the objects tpu-inference 0.32.0 itself
builds (its KVCacheConfig, layer_name_to_kvcache_index and kv_caches, on a mesh); here the same
attributes are given by hand, on one CPU device, to pin each rule: an array shared by layers of
two groups belongs to both, Mamba state tuples are never touched, bad input names its field.
"""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import numpy as np
import pytest

import kvlayout as K

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from kvlayout.integrations.tpu_inference import TpuInferenceZeroer, array_groups  # noqa: E402

PAGES = 4


def runner() -> Any:
    """Two groups (full: f0, f1; sliding: s0, s1) whose j-th layers share array j, a Mamba tuple at
    index 2 (the state of layer m0 of a third group), and a layer of group 0 with its own array 3."""
    groups = [NS(layer_names=["f0", "f1", "f2"]), NS(layer_names=["s0", "s1"]), NS(layer_names=["m0"])]
    index = {"f0": 0, "s0": 0, "f1": 1, "s1": 1, "m0": 2, "f2": 3}
    rng = np.random.default_rng(0)

    def arr(shape: tuple[int, ...]) -> jax.Array:
        return jnp.asarray(rng.integers(1, 255, shape, dtype=np.uint8))

    mamba = (jnp.ones((3, 8), jnp.float32), jnp.ones((3, 2, 4), jnp.float32))
    caches = [arr((PAGES, 8, 4, 128)), arr((PAGES, 8, 4, 128)), mamba, arr((PAGES, 2, 4, 128))]
    return NS(kv_caches=caches, kv_cache_config=NS(kv_cache_groups=groups), layer_name_to_kvcache_index=index)


def host(caches: list[Any]) -> list[Any]:
    return [x if isinstance(x, tuple) else np.asarray(x).reshape(PAGES, -1).copy() for x in caches]


def test_groups_come_from_the_runner_mapping() -> None:
    r = runner()
    assert array_groups(r.kv_caches, r.kv_cache_config, r.layer_name_to_kvcache_index) == [
        ("0", "1"),
        ("0", "1"),
        None,
        ("0",),
    ]
    z = TpuInferenceZeroer.from_runner(r)
    assert z.groups == ("0", "1", "2") and z.arrays == (0, 1, 3)
    assert [leaf.group for leaf in z.spec.leaves] == [("0", "1"), ("0", "1"), "0"]
    assert z.spec.zeroed_mask("1") == (True, True, False)


def test_zero_one_group_clears_every_array_it_uses_and_nothing_else() -> None:
    r = runner()
    z = TpuInferenceZeroer.from_runner(r)
    before = host(r.kv_caches)
    out = z(r.kv_caches, [1, 3], group="1")  # the sliding group: arrays 0 and 1 (shared), not 3
    after = host(out)
    assert out[2] is r.kv_caches[2]  # the Mamba tuple is passed through, untouched
    for k in (0, 1):
        want = before[k].copy()
        want[[1, 3]] = 0
        assert np.array_equal(after[k], want), k
    assert np.array_equal(after[3], before[3])
    z.check()


def test_zero_scheduled_takes_new_block_ids_to_zero() -> None:
    r = runner()
    z = TpuInferenceZeroer.from_runner(r)
    before = host(r.kv_caches)
    same = z.zero_scheduled(r.kv_caches, NS(new_block_ids_to_zero=None))
    assert all(a is b for a, b in zip(same, r.kv_caches))  # vLLM sends none for uniform caches
    out = z.zero_scheduled(r.kv_caches, NS(new_block_ids_to_zero=[2]))
    after = host(out)
    for k in (0, 1, 3):
        want = before[k].copy()
        want[2] = 0
        assert np.array_equal(after[k], want), k


def test_apply_in_a_jitted_donated_step() -> None:
    r = runner()
    z = TpuInferenceZeroer.from_runner(r)
    before = host(r.kv_caches)
    step = jax.jit(lambda c, i: z.apply(c, i), donate_argnums=0)
    out, bad = step(r.kv_caches, jnp.asarray([0, PAGES], jnp.int32))  # one id outside the pool
    assert int(bad) == 1
    after = host(out)
    for k in (0, 1, 3):
        want = before[k].copy()
        want[0] = 0
        assert np.array_equal(after[k], want), k


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: r.layer_name_to_kvcache_index.pop("s1"), "layer_name_to_kvcache_index"),
        (lambda r: r.layer_name_to_kvcache_index.update(f2=9), "layer_name_to_kvcache_index['f2']"),
        (lambda r: setattr(r.kv_cache_config, "kv_cache_groups", []), "kv_cache_config.kv_cache_groups"),
        (
            lambda r: setattr(r.kv_cache_config.kv_cache_groups[1], "layer_names", "s0"),
            "kv_cache_config.kv_cache_groups[1].layer_names",
        ),
        (lambda r: r.kv_caches.append(jnp.zeros((PAGES, 8, 128), jnp.uint8)), "kv_caches[4]"),
        (lambda r: setattr(r, "layer_name_to_kvcache_index", [0, 1]), "layer_name_to_kvcache_index"),
        (lambda r: r.layer_name_to_kvcache_index.update(f2=True), "layer_name_to_kvcache_index['f2']"),
    ],
)
def test_bad_runner_objects_name_the_field(change: Any, field: str) -> None:
    r = runner()
    change(r)
    with pytest.raises(K.LayoutBufferError) as e:
        TpuInferenceZeroer.from_runner(r)
    assert e.value.field == field


def test_bad_calls_write_nothing() -> None:
    r = runner()
    z = TpuInferenceZeroer.from_runner(r)
    with pytest.raises(K.LayoutBufferError, match="valid group ids: 0, 1, 2") as e:
        z(r.kv_caches, [1], group="full")
    assert e.value.field == "group"
    with pytest.raises(K.LayoutBufferError) as e:
        z(r.kv_caches[:3], [1])
    assert e.value.field == "kv_caches"
    with pytest.raises(K.BlockIdError):
        z(r.kv_caches, [PAGES])
    assert all(not x.is_deleted() for x in r.kv_caches if not isinstance(x, tuple))
