"""tpu-inference 0.32 adapter: a :class:`~kvlayout.backends.pallas.CacheZeroer` over a runner's caches.

tpu-inference keeps the KV cache as ``runner.kv_caches``, a list of global ``jax.Array`` s (one
per physical slot, each sharded with its own ``NamedSharding``), and maps layers to them with
``runner.layer_name_to_kvcache_index``; its cache groups are ``runner.kv_cache_config.
kv_cache_groups`` (vLLM's ``KVCacheGroupSpec``: layer names per group, the group's index is its
id). It never zeroes a recycled page: its caches are zeroed once, at allocation
(``tpu_inference/runner/kv_cache.py`` line 101, in ``_get_kv_cache_allocator``: ``return jnp.zeros(
shape=cache_shape, dtype=cache_dtype)`` under ``jax.jit(out_shardings=sharding)``), and the
scheduler's ``new_block_ids_to_zero`` is read nowhere in tpu-inference 0.32.0 (both checked on its
installed source by tests/test_tpu_inference_truth.py).

:class:`TpuInferenceZeroer` reads those objects (nothing is re-derived from shapes): array ``i``
belongs to every group one of whose layers maps to it (an array shared by layers of several
groups belongs to each, GEOMETRY.md section 9), groups are named by their index (``"0"``,
``"1"``, ...), and Mamba state tuples (addressed by request slot) are left alone. The few lines
a tpu-inference user adds, after ``runner.initialize_kv_cache`` and in the step::

    from kvlayout.integrations.tpu_inference import TpuInferenceZeroer

    zeroer = TpuInferenceZeroer.from_runner(runner)
    ...
    # each step, before the model runs on runner.kv_caches:
    runner.kv_caches = zeroer.zero_scheduled(runner.kv_caches, scheduler_output)

or, inside the user's own jitted, donated model step, ``kv_caches, bad = zeroer.apply(kv_caches,
ids)`` on device ids. tpu-inference is not imported here: only its objects' attributes are read.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import LayoutBufferError, bad_value
from ..validate import is_int


def _layers_of(group: Any, i: int) -> list[str]:
    names = getattr(group, "layer_names", None)
    if not isinstance(names, (list, tuple)) or not all(isinstance(x, str) for x in names):
        raise bad_value(
            LayoutBufferError,
            f"kv_cache_config.kv_cache_groups[{i}].layer_names",
            names,
            "must be a list of layer names",
        )
    # each the plain str it holds: a str subclass's own __hash__ / __eq__ found another layer's array, and
    # zeroing group 0 cleared group 1's (pass 33)
    return [str.__str__(x) for x in names]


def array_groups(
    kv_caches: Sequence[Any], kv_cache_config: Any, layer_to_index: Mapping[str, int]
) -> list[tuple[str, ...] | None]:
    """Per entry of ``kv_caches``: the ids (``"0"``, ``"1"``, ...) of the groups whose layers use
    it, ``None`` for a Mamba state tuple (never zeroed by block id)."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if not isinstance(groups, (list, tuple)) or not groups:
        raise bad_value(
            LayoutBufferError,
            "kv_cache_config.kv_cache_groups",
            groups,
            "must be a non-empty list (tpu-inference's KVCacheConfig)",
        )
    if not isinstance(layer_to_index, Mapping):
        why = "must map layer names to kv_caches indices (the runner's layer_name_to_kvcache_index)"
        raise bad_value(LayoutBufferError, "layer_name_to_kvcache_index", type(layer_to_index).__name__, why)
    # read once, as a plain dict of plain str keys (a mapping's own __contains__ / keys may lie: pass 33)
    layer_to_index = {str.__str__(k): v for k, v in dict(layer_to_index).items() if isinstance(k, str)}
    owners: list[list[str]] = [[] for _ in kv_caches]
    for g, group in enumerate(groups):
        for layer in _layers_of(group, g):
            if layer not in layer_to_index:
                raise bad_value(
                    LayoutBufferError, "layer_name_to_kvcache_index", layer, f"group {g}'s layer has no array"
                )
            i = layer_to_index[layer]
            if not is_int(i) or not 0 <= int(i) < len(kv_caches):
                why = f"must index kv_caches (0 .. {len(kv_caches) - 1})"
                raise bad_value(LayoutBufferError, f"layer_name_to_kvcache_index[{layer!r}]", i, why)
            if str(g) not in owners[int(i)]:
                owners[int(i)].append(str(g))
    out: list[tuple[str, ...] | None] = []
    for i, (x, who) in enumerate(zip(kv_caches, owners)):
        if isinstance(x, tuple):
            out.append(None)
        elif not (hasattr(x, "shape") and hasattr(x, "dtype")):  # a list of state arrays, None: its .shape
            why = "must be a page array or a tuple of state arrays (tpu-inference's Mamba state)"
            kind = type(x).__name__  # raised raw (pass 35)
            raise bad_value(LayoutBufferError, f"kv_caches[{i}]", kind, why, shown=kind)
        elif not who:
            raise bad_value(
                LayoutBufferError, f"kv_caches[{i}]", "unused", "no layer of any group maps to it"
            )
        else:
            out.append(tuple(who))
    return out


class TpuInferenceZeroer:
    """Zero block ids in a tpu-inference runner's ``kv_caches``, in place, by its group ids.

    ``zeroer`` is the :class:`~kvlayout.backends.pallas.CacheZeroer` over the page arrays (leaf
    ``kv_caches[i]`` named ``str(i)``; with a mesh, each array's own sharding); ``groups`` the
    group ids; ``arrays`` the indices of ``kv_caches`` it zeroes (Mamba tuples excluded).
    ``kwargs`` go to the CacheZeroer (``kernel``, ``interpret``, ...).
    """

    def __init__(
        self,
        kv_caches: Sequence[Any],
        kv_cache_config: Any,
        layer_name_to_kvcache_index: Mapping[str, int],
        *,
        mesh: Any = None,
        **kwargs: Any,
    ) -> None:
        from kvlayout.backends.pallas import CacheZeroer
        from kvlayout.native import NativeCacheSpec, NativeLeaf, dtype_name

        if not isinstance(kv_caches, (list, tuple)) or not kv_caches:
            raise bad_value(
                LayoutBufferError,
                "kv_caches",
                type(kv_caches).__name__,
                "must be the runner's non-empty list of arrays",
            )
        owners = array_groups(kv_caches, kv_cache_config, layer_name_to_kvcache_index)
        self.arrays: tuple[int, ...] = tuple(i for i, o in enumerate(owners) if o is not None)
        if not self.arrays:
            raise bad_value(LayoutBufferError, "kv_caches", "only state tuples", "has no page array to zero")
        self.num_entries = len(kv_caches)
        self.num_groups = len(kv_cache_config.kv_cache_groups)
        self.groups: tuple[str, ...] = tuple(str(g) for g in range(self.num_groups))
        self.array_groups: dict[int, tuple[str, ...]] = {i: o for i, o in enumerate(owners) if o is not None}
        leaves = []
        for i in self.arrays:
            a, who = kv_caches[i], self.array_groups[i]
            leaves.append(
                NativeLeaf(str(i), tuple(a.shape), dtype_name(a.dtype), who[0] if len(who) == 1 else who)
            )
        self.spec = NativeCacheSpec(tuple(leaves))
        page_arrays = [kv_caches[i] for i in self.arrays]
        if mesh is None:
            mesh = getattr(getattr(page_arrays[0], "sharding", None), "mesh", None)
            if mesh is not None and getattr(mesh, "size", 1) == 1:
                mesh = None
        self.zeroer = CacheZeroer(page_arrays, mesh=mesh, spec=self.spec, **kwargs)
        self.num_blocks = self.spec.num_blocks

    @classmethod
    def from_runner(cls, runner: Any, **kwargs: Any) -> TpuInferenceZeroer:
        """From a ``TPUModelRunner`` after ``initialize_kv_cache``: its ``kv_caches``,
        ``kv_cache_config`` and ``layer_name_to_kvcache_index``."""
        return cls(runner.kv_caches, runner.kv_cache_config, runner.layer_name_to_kvcache_index, **kwargs)

    def _check_group(self, group: Any) -> str | None:
        """The group id as the CacheZeroer names it: ``"1"``, or vLLM's index ``1`` (any integer type,
        NumPy's too, as KVBlockZeroer takes it); ``None``: every group."""
        if is_int(group):  # a lying int's int() chose group 1's array for its value 0 (pass 33)
            name: Any = str(int.__int__(operator.index(group)))  # type: ignore[call-overload]
        elif group is None or isinstance(group, str):
            name = None if group is None else str.__str__(group)
        else:
            raise bad_value(LayoutBufferError, "group", group, f"valid group ids: {', '.join(self.groups)}")
        if name is not None and name not in self.groups:
            raise bad_value(LayoutBufferError, "group", group, f"valid group ids: {', '.join(self.groups)}")
        return name

    def _split(self, kv_caches: Sequence[Any]) -> list[Any]:
        if not isinstance(kv_caches, (list, tuple)) or len(kv_caches) != self.num_entries:
            got = len(kv_caches) if isinstance(kv_caches, (list, tuple)) else type(kv_caches).__name__
            why = f"must be the runner's list the zeroer was built from ({self.num_entries} entries)"
            raise bad_value(LayoutBufferError, "kv_caches", got, why)
        return [kv_caches[i] for i in self.arrays]

    def _join(self, kv_caches: Sequence[Any], new: Sequence[Any]) -> list[Any]:
        out = list(kv_caches)
        for i, x in zip(self.arrays, new):
            out[i] = x
        return out

    def __call__(self, kv_caches: Sequence[Any], block_ids: Any, group: str | None = None) -> list[Any]:
        """Zero ``block_ids`` in every page array (of group id ``group``, when given); the arrays
        are donated and come back in a new list (assign it to ``runner.kv_caches``)."""
        name = self._check_group(group)
        if self._state_only(name):  # ids checked (a bad host id raises, device ids counted), nothing written
            self._split(kv_caches)
            self._check_ids(block_ids)
            return list(kv_caches)
        return self._join(kv_caches, self.zeroer(self._split(kv_caches), block_ids, group=name))

    def _state_only(self, name: str | None) -> bool:
        """A group id whose layers are all Mamba state (no page array): one of :attr:`groups`, refused by the
        CacheZeroer as no group of its leaves (pass 35). Zeroing it checks the ids and writes nothing, as
        vLLM's adapter does for a group without rows."""
        return name is not None and name not in self.zeroer.spec.groups

    def _check_ids(self, block_ids: Any) -> None:
        """Check ``block_ids`` as a call would, writing nothing: host ids validated (a bad one raises), device
        ids' out-of-pool count added to what :meth:`check` reports."""
        import jax
        import jax.numpy as jnp

        from kvlayout.backends.pallas.zeroer import check_id_array, ids_in_range
        from kvlayout.validate import block_ids as normalize_block_ids

        if isinstance(block_ids, jax.Array):
            check_id_array(block_ids)
            _, ok = ids_in_range(block_ids, self.num_blocks)
            self.zeroer._bad.add(jnp.sum(~ok).astype(jnp.int32))
        else:
            normalize_block_ids(block_ids, self.num_blocks)

    def apply(
        self, kv_caches: Sequence[Any], block_ids: Any, group: str | None = None
    ) -> tuple[list[Any], Any]:
        """Traceable, for a jitted, donated model step: ``(kv_caches, number of ids outside the pool)``."""
        name = self._check_group(group)
        if self._state_only(name):  # no page array: nothing to write, the ids still counted
            import jax.numpy as jnp

            from kvlayout.backends.pallas.zeroer import check_id_array, ids_in_range, step_ids

            self._split(kv_caches)
            ids = step_ids(block_ids)
            check_id_array(ids)
            _, ok = ids_in_range(ids, self.num_blocks)
            return list(kv_caches), jnp.sum(~ok).astype(jnp.int32)
        new, bad = self.zeroer.apply(self._split(kv_caches), block_ids, group=name)
        return self._join(kv_caches, new), bad

    def zero_scheduled(self, kv_caches: Sequence[Any], scheduler_output: Any) -> list[Any]:
        """Zero the blocks vLLM's scheduler allocated this step (``new_block_ids_to_zero``, one flat
        list for every group, as vLLM's own zeroer takes it); nothing when it has none."""
        ids = getattr(scheduler_output, "new_block_ids_to_zero", None)
        if ids is None or (isinstance(ids, (list, tuple)) and not ids):
            return list(kv_caches)
        # no truth test on arrays: ``not np.array([0])`` is True (block 0 would be skipped) and
        # ``not`` of a longer array raises; the zeroer validates whatever else arrives
        return self(kv_caches, list(ids) if isinstance(ids, tuple) else ids)

    def check(self) -> None:
        """Raise if any device id so far was outside the pool (see CacheZeroer.check)."""
        self.zeroer.check()


def zeroer_for_runner(
    kv_caches: Sequence[Any],
    kv_cache_config: Any,
    layer_name_to_kvcache_index: Mapping[str, int],
    **kwargs: Any,
) -> TpuInferenceZeroer:
    """:class:`TpuInferenceZeroer` from the three runner objects."""
    return TpuInferenceZeroer(kv_caches, kv_cache_config, layer_name_to_kvcache_index, **kwargs)


__all__ = ["TpuInferenceZeroer", "array_groups", "zeroer_for_runner"]
