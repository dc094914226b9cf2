"""Hostile passes 35 and 36 (/tmp/h35, /tmp/h36), on pass 34's fixes: each test failing on the code before its
fix."""

from __future__ import annotations

import types

import numpy as np
import pytest

from kvlayout.errors import BlockIdError, LayoutBufferError


def _group(*names: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(layer_names=list(names))


def test_a_kv_caches_entry_neither_array_nor_state_tuple_is_named() -> None:
    """A list of Mamba state arrays (or any object) among ``kv_caches`` raised a raw AttributeError
    (``.shape``)."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from kvlayout.integrations.tpu_inference import TpuInferenceZeroer

    cfg = types.SimpleNamespace(kv_cache_groups=[_group("attn"), _group("mamba")])
    for entry, kind in (([jnp.ones((4, 16))], "list"), (object(), "object"), (None, "NoneType")):
        caches = [jnp.ones((8, 4, 128), jnp.float32), entry]
        with pytest.raises(LayoutBufferError, match=rf"^kv_caches\[1\] = {kind}: must be a page array or"):
            TpuInferenceZeroer(caches, cfg, {"attn": 0, "mamba": 1}, kernel="triton", interpret=True)


def test_a_group_of_state_only_checks_its_ids_and_writes_nothing() -> None:
    """A group whose layers are all Mamba state is one of ``zeroer.groups``, yet zeroing it raised "no such
    group" (naming group '0' only)."""
    pytest.importorskip("jax")
    import jax
    import jax.numpy as jnp

    from kvlayout.integrations.tpu_inference import TpuInferenceZeroer

    cfg = types.SimpleNamespace(kv_cache_groups=[_group("attn"), _group("mamba")])
    state = (jnp.ones((4, 16)), jnp.ones((4, 16)))
    caches = [jnp.ones((8, 4, 128), jnp.float32), state]
    z = TpuInferenceZeroer(caches, cfg, {"attn": 0, "mamba": 1}, kernel="triton", interpret=True)
    assert z.groups == ("0", "1")
    out = z(caches, [1, 7], group=1)
    assert out[1] is state and np.array_equal(np.asarray(out[0]), np.ones((8, 4, 128), np.float32))
    with pytest.raises(BlockIdError, match=r"block_ids\[0\] = 8: outside \[0, 8\)"):
        z(out, [8], group="1")
    out = z(out, jnp.array([3, 8, -1], jnp.int32), group=1)  # device ids: counted, nothing written
    assert np.array_equal(np.asarray(out[0]), np.ones((8, 4, 128), np.float32))
    with pytest.raises(BlockIdError, match=r"^device block_ids: 2 ids outside \[0, 8\)"):
        z.check()
    z.check()  # reported once

    @jax.jit
    def step(c0: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        new, bad = z.apply([c0, state], ids, group=1)
        return new[0], bad

    c0, bad = step(out[0], jnp.array([0, 9], jnp.int32))
    assert int(bad) == 1 and np.array_equal(np.asarray(c0), np.ones((8, 4, 128), np.float32))
    new, bad = z.apply(out, [0, 2], group=0)  # the page group still zeroes
    assert int(bad) == 0 and not np.asarray(new[0])[[0, 2]].any() and np.asarray(new[0])[1].all()


def test_a_spec_for_a_dict_cache_is_matched_to_its_leaves_by_name() -> None:
    """Pass 36: a spec written in a dict's own order ({"state": zeroed=False, "kv"}) was paired with the
    leaves by position; the dict flattens in sorted key order, so the state array was zeroed and the KV
    page left stale."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    import kvlayout.backends.pallas as kp

    from kvlayout.native import NativeCacheSpec, NativeLeaf

    spec = NativeCacheSpec((NativeLeaf("state", (8, 256), "float32", zeroed=False),
                            NativeLeaf("kv", (8, 256), "float32")))
    for kernel in ("triton", "tpu"):
        caches = {k: jnp.ones((8, 256), jnp.float32) for k in ("state", "kv")}
        z = kp.CacheZeroer(caches, spec=spec, kernel=kernel, interpret=True)
        assert z.spec.names == ("kv", "state") and z.spec.zeroed_mask() == (True, False)
        out = z(caches, [3])
        kv, state = np.asarray(out["kv"]), np.asarray(out["state"])
        assert not kv[3].any() and kv[[0, 1, 2, 4, 5, 6, 7]].all() and state.all(), kernel
    other = NativeCacheSpec((NativeLeaf("kv", (8, 256), "float32"), NativeLeaf("ssm", (8, 256), "float32")))
    with pytest.raises(LayoutBufferError, match=r"^spec.leaves\[1\].name = .ssm.: names no leaf of"):
        kp.CacheZeroer({k: jnp.ones((8, 256), jnp.float32) for k in ("state", "kv")}, spec=other)


def test_glm4_moe_without_head_dim_is_refused_as_vllm_cannot_build_it() -> None:
    """Pass 36: GLM-4.5 without ``head_dim`` was planned with hidden_size // heads (42 for GLM-4.5-Air);
    vLLM's Glm4MoeDecoderLayer reads ``config.head_dim``, which transformers' config class does not define."""
    import json
    from pathlib import Path

    import kvlayout.models as M
    from kvlayout.errors import SpecError

    transformers = pytest.importorskip("transformers")
    import importlib.util

    # the truth, vLLM 0.33's and transformers' own code: the model reads config.head_dim, the config class
    # has none
    spec = importlib.util.find_spec("vllm.model_executor.models.glm4_moe")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    assert "head_dim=config.head_dim" in Path(spec.origin).read_text()
    assert not hasattr(transformers.Glm4MoeConfig(), "head_dim")
    cfg = json.loads((Path(__file__).parent / "fixtures/published/glm4_5_air.json").read_text())
    assert M.from_config(cfg, tp=1, device="hopper").spec.layers  # as published: planned
    del cfg["head_dim"]
    with pytest.raises(SpecError, match=r"^config.head_dim = None: missing; this model's attention reads it"):
        M.from_config(cfg, tp=1, device="hopper")
