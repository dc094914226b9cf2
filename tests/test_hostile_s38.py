"""Hostile passes 38 and 39 (/tmp/h38, /tmp/h39): each test failing on the code before its fix."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError, LayoutBufferError


def test_groups_as_an_array_for_a_dict_of_caches_are_refused_too() -> None:
    """``groups=np.array(["mamba", "attn"])`` dodged pass 37's refusal (a Sequence test): zeroing "attn"
    cleared the state."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from kvlayout.backends.pallas.native import CacheZeroer

    caches = {"state": jnp.ones((8, 2, 16)), "kv": jnp.ones((8, 2, 16))}
    with pytest.raises(LayoutBufferError, match=r"^groups = \['mamba', 'attn'\]: several groups for"):
        CacheZeroer(caches, groups=np.array(["mamba", "attn"]), kernel="triton", interpret=True)


def test_sharded_cuda_buffers_must_be_a_mapping_or_a_list() -> None:
    """A set of shard buffers was numbered in its hash order (a global block zeroed in another shard's
    buffer); a generator raised a raw TypeError."""
    from kvlayout.sharding import shard_spec
    from tests.hostile_cases import cuda, to_dev

    torch, kc = cuda()
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 4}, block_axes=("dp",))
    bufs = [to_dev(torch.from_numpy(K.poison_pattern(lay.shard_bytes, seed=k + 1))) for k in range(4)]
    for given, kind in ((set(bufs), "set"), ((b for b in bufs), "generator"), (frozenset(bufs), "frozenset")):
        with pytest.raises(LayoutBufferError, match=rf"^buffers type = {kind}: must map shard"):
            kc.ShardedCudaZeroer(lay, given, graphs=False)
    assert kc.ShardedCudaZeroer(lay, tuple(bufs), graphs=False).shards == (0, 1, 2, 3)


def test_the_plugins_verify_step_checks_ids_before_any_truth_test() -> None:
    """Verify mode truth-tested the ids first: an array of several ids raised raw, ``np.array([0])`` returned
    with block 0 not zeroed."""
    from tests.hostile_cases import cuda, verifying_zeroer

    torch, _ = cuda()
    z, launches = verifying_zeroer()
    for ids in (np.array([0]), np.array([1, 2]), torch.tensor([0]), torch.tensor([1, 2])):
        with pytest.raises(BlockIdError, match=r"^block_ids = .*must be the scheduler's list of block ids"):
            z.zero_block_ids(ids)
    z.zero_block_ids([])
    z.zero_block_ids([0, 3])
    assert launches == [[0, 3]]


def test_caches_jax_cannot_flatten_are_named_at_every_call() -> None:
    """A dict JAX cannot sort raised raw at ``__call__``, ``apply`` and ``check_caches`` (pass 37 named it at
    construction only); caches nested 1,000 lists deep raised a raw SystemError."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from kvlayout.backends.pallas.native import CacheZeroer

    z = CacheZeroer({"a": jnp.ones((8, 16)), "kv": jnp.ones((8, 16))}, kernel="triton", interpret=True)
    bad = {1: jnp.ones((8, 16)), "kv": jnp.ones((8, 16))}
    for call in (lambda: z(bad, [1]), lambda: z.apply(bad, [1]), lambda: z.check_caches(bad)):
        with pytest.raises(LayoutBufferError, match=r"^caches = dict: must be a pytree JAX can flatten"):
            call()
    deep: object = jnp.ones((8, 16))
    for _ in range(1000):
        deep = [deep]
    with pytest.raises(LayoutBufferError, match=r"^caches = list: must be a pytree JAX can flatten"):
        CacheZeroer(deep, kernel="triton", interpret=True)


def test_a_list_of_partition_specs_for_a_dict_of_caches_is_refused() -> None:
    """A list of specs for ``{"state", "kv"}`` was paired in sorted key order: the first call asked for the
    wrong sharding."""
    pytest.importorskip("jax")
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P
    from kvlayout.backends.pallas.native import CacheZeroer

    mesh = Mesh(np.array(jax.devices()[:1]), ("dp",))
    sds = {k: jax.ShapeDtypeStruct((8, 4, 32), jnp.float32) for k in ("state", "kv")}
    with pytest.raises(LayoutBufferError, match=r"^partition_specs = .*several specs for leaves"):
        CacheZeroer(sds, mesh=mesh, partition_specs=[P(), P("dp")], kernel="triton", interpret=True)
    by_name = {"state": P(), "kv": P("dp")}
    z = CacheZeroer(sds, mesh=mesh, partition_specs=by_name, kernel="triton", interpret=True)
    assert z.pspecs == (P("dp"), P())


def test_listed_groups_are_read_once_as_plain_values() -> None:
    """Pass 39: the refusal read ``len()`` and ``repr()`` of the object given: a Sequence one longer than its
    items, or str subclasses of one repr, dodged it, and zeroing "attn" cleared the state."""
    pytest.importorskip("jax")
    import collections.abc

    import jax.numpy as jnp
    from kvlayout.backends.pallas.native import CacheZeroer

    class Groups(collections.abc.Sequence):  # type: ignore[type-arg]
        def __init__(self, v: list[str]) -> None:
            self.v = v

        def __len__(self) -> int:
            return len(self.v) + 1

        def __getitem__(self, i: Any) -> Any:
            return self.v[i]

    class Same(str):
        def __repr__(self) -> str:
            return "'g'"

    caches = {"state": jnp.ones((8, 2, 16)), "kv": jnp.ones((8, 2, 16))}
    for groups in (Groups(["mamba", "attn"]), [Same("mamba"), Same("attn")]):
        with pytest.raises(LayoutBufferError, match=r"^groups = \['mamba', 'attn'\]: several groups for"):
            CacheZeroer(caches, groups=groups, kernel="triton", interpret=True)
    z = CacheZeroer([jnp.ones((8, 16)), jnp.ones((8, 16))], groups=np.array(["a", "b"]), kernel="triton",
                    interpret=True)
    assert z.spec.groups == ("a", "b") and all(type(g) is str for g in z.spec.groups)
