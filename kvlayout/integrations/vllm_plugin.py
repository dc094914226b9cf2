"""vLLM general plugin: prove vLLM's own ``KVBlockZeroer`` table at start-up, or replace the zeroer.

``pip install 'kvlayout[vllm]'`` registers :func:`register` in vLLM's ``vllm.general_plugins``
entry-point group; vLLM calls it in every process at start-up (``load_general_plugins``,
filtered by ``VLLM_PLUGINS``). One environment variable, :data:`ENV_VAR`, picks the mode:

- ``verify`` (default): vLLM keeps its zeroer. Right after vLLM's constructor, kvlayout reads
  its table (:func:`~kvlayout.integrations.vllm.table_from_block_zeroer`), plans the same cache
  from vLLM's own ``KVCacheConfig``, proves the table safe and equal to the plan, and stops the
  worker with a :class:`ZeroerMismatchError` naming the layer, block and bytes otherwise
  (vLLM 0.27's span = stride, 0.28's overlay bug, #52709's double offset). Each step's ids are
  bounds-checked on the host tensor vLLM builds anyway, before vLLM's kernel runs (it has no
  bounds check: id ``num_blocks`` writes past the buffer).
- ``replace``: kvlayout's drop-in (:class:`~kvlayout.integrations.vllm.KVBlockZeroer`) is built
  from the same constructor arguments: table from kvlayout's planner, checked against the
  per-layer views (never derived from them), ids bounds-checked, one group at a time on request.
- ``off``: nothing is patched.

The hook: vLLM's model runners build the zeroer as ``KVBlockZeroer(device, attn_groups_iter=...,
kernel_block_sizes=..., static_forward_context=..., num_blocks=..., runner_only_attn_layers=...)``
in ``_init_kv_zero_meta``, the name imported from ``vllm.v1.worker.utils``. :func:`install`
replaces that name in ``vllm.v1.worker.utils`` and in the runner modules already imported; if
``vllm.v1.worker.utils`` is not imported yet (the API server process), a one-shot import hook
does it when it is, so no process imports vLLM's worker code because of the plugin. The
``KVCacheConfig`` is the calling runner's ``self.kv_cache_config``. Importing this module
changes nothing; :func:`register` (vLLM's call) and :func:`install` do.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from types import FrameType, ModuleType
from typing import Any

import numpy as np

from ..errors import BlockIdError, SpecError, TableError, bad_value, short
from ..planner import Layout, plan_layout
from ..table import SegmentTable
from ..validate import LYING_INT_WHY, is_int
from ..verify import verify
from .vllm import (
    VLLM_VERSION,
    KVBlockZeroer,
    _walk_tensors,
    check_views_against_layout,
    plain_torch,
    spec_from_kv_cache_config,
    table_from_block_zeroer,
)

log = logging.getLogger("kvlayout")

#: The environment variable that picks the plugin's mode.
ENV_VAR = "KVLAYOUT_VLLM_MODE"
#: Valid modes, the default first.
MODES = ("verify", "replace", "off")
#: Where vLLM 0.33 defines the zeroer, and the runner modules that import its name.
UTILS_MODULE = "vllm.v1.worker.utils"
RUNNER_MODULES = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner")
#: Most blocks compared one by one when two tables' rows differ but may clear the same bytes.
MAX_BLOCKS_COMPARED = 1 << 16


class PluginConfigError(SpecError):
    """The plugin's environment variable holds an unknown mode."""


class ZeroerMismatchError(TableError):
    """vLLM's zeroer table is unsafe or differs from kvlayout's plan (layer, block and bytes named)."""


def mode_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The mode :data:`ENV_VAR` asks for (``verify`` when unset or empty); an unknown value raises."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_VAR, "")
    mode = raw.strip().lower() or MODES[0]
    if mode not in MODES:
        raise PluginConfigError(
            f"Invalid value {short(raw)} for {ENV_VAR}. Valid options: {', '.join(MODES)}",
            field=ENV_VAR,
            value=raw,
        )
    return mode


def register() -> None:
    """vLLM's entry point (``vllm.general_plugins``): install the mode :data:`ENV_VAR` names.

    Raising here stops vLLM's start-up (vLLM catches errors while loading a plugin, not while
    running it), which is what an unknown mode must do.
    """
    mode = mode_from_env()
    if mode == "off":
        uninstall()  # a mode an earlier register() or install() put in this process goes too
        log.info("kvlayout vLLM plugin: %s=off, vLLM's own KVBlockZeroer in place", ENV_VAR)
        return
    install(mode)


# --------------------------------------------------------------------------- patching
_state: dict[str, Any] = {"mode": None, "original": None, "patched": None, "hook": None}


def installed_mode() -> str | None:
    """The mode installed in this process (``None``: not installed)."""
    return _state["mode"]


def install(mode: str) -> None:
    """Make vLLM's runners build the ``mode`` zeroer (``verify`` or ``replace``); idempotent."""
    if mode not in ("verify", "replace"):
        raise PluginConfigError(
            f"install mode = {mode!r}: must be 'verify' or 'replace'", field="mode", value=mode
        )
    uninstall()
    _state["mode"] = mode
    utils = sys.modules.get(UTILS_MODULE)
    if utils is not None:
        _patch(utils)
    else:
        hook = _AfterImport(UTILS_MODULE, _patch)
        _state["hook"] = hook
        sys.meta_path.insert(0, hook)


def uninstall() -> None:
    """Put vLLM's own class back wherever :func:`install` replaced it (tests, ``off``)."""
    hook = _state["hook"]
    if hook is not None and hook in sys.meta_path:
        sys.meta_path.remove(hook)
    original, patched = _state["original"], _state["patched"]
    if original is not None:
        for name in (UTILS_MODULE, *RUNNER_MODULES):
            module = sys.modules.get(name)
            if module is not None and getattr(module, "KVBlockZeroer", None) is patched:
                module.KVBlockZeroer = original  # type: ignore[attr-defined]
    _state.update(mode=None, original=None, patched=None, hook=None)


def _patch(utils: ModuleType) -> None:
    """Replace ``KVBlockZeroer`` in vLLM's utils and in the runner modules that imported it."""
    hook = _state["hook"]
    if hook is not None and hook in sys.meta_path:
        sys.meta_path.remove(hook)
    _state["hook"] = None
    original = utils.KVBlockZeroer
    version = getattr(sys.modules.get("vllm"), "__version__", None)
    if version is not None and not str(version).startswith(VLLM_VERSION.rsplit(".", 1)[0]):
        log.warning("kvlayout vLLM plugin: written for vLLM %s, running on %s", VLLM_VERSION, version)
    patched = _verifying_class(original, utils) if _state["mode"] == "verify" else _replacing_class(original)
    _state.update(original=original, patched=patched)
    for name in (UTILS_MODULE, *RUNNER_MODULES):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "KVBlockZeroer", None) is original:
            module.KVBlockZeroer = patched  # type: ignore[attr-defined]
    log.info("kvlayout vLLM plugin: %s mode installed (%s=%s)", _state["mode"], ENV_VAR, _state["mode"])


class _AfterImport(importlib.abc.MetaPathFinder):
    """One-shot: runs ``after(module)`` once ``name`` has been executed by its own loader."""

    def __init__(self, name: str, after: Callable[[ModuleType], None]) -> None:
        self.name, self.after = name, after

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenLoader(spec.loader, self.after)
                return spec
        return None


class _ThenLoader(importlib.abc.Loader):
    """A module's own loader, then a callback on the executed module."""

    def __init__(self, inner: Any, after: Callable[[ModuleType], None]) -> None:
        self.inner, self.after = inner, after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.after(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... of the real loader
        return getattr(self.inner, name)


# --------------------------------------------------------------------------- what both modes read
def _caller_config(depth: int) -> tuple[Any, Any]:
    """(``KVCacheConfig``, layout) of the model runner whose ``_init_kv_zero_meta`` is calling."""
    frame: FrameType | None = sys._getframe(depth)
    for _ in range(4):
        if frame is None:
            break
        runner: Any = frame.f_locals.get("self")
        config = getattr(runner, "kv_cache_config", None)
        if config is not None and hasattr(config, "kv_cache_tensors"):
            layout = getattr(config, "kv_cache_layout", None)
            if layout is None and hasattr(runner, "cache_config"):
                layout = runner.cache_config.get_resolved_kv_cache_layout()
            return config, layout
        frame = frame.f_back
    raise SpecError(
        "kvlayout vLLM plugin: KVBlockZeroer was built outside a model runner's _init_kv_zero_meta "
        "(no runner with a kv_cache_config called it); pass kv_cache_config= explicitly",
        field="kv_cache_config",
        value=None,
    )


def _runner_only(kv_cache_config: Any, given: Collection[str] | None) -> Collection[str]:
    """Layers that own no ``KVCacheTensor`` (vLLM's KV sharing), when the runner does not say.

    vLLM's v2 runner passes no ``runner_only_attn_layers``: a layer that shares another's cache
    is then in a cache group with no tensor of its own. Its view is the other layer's, so vLLM's
    zeroer deduplicates it by address; were it not, the table comparison would catch it.
    """
    if given is not None:
        return given
    owned = {name for t in kv_cache_config.kv_cache_tensors for name in t.layers}
    return {n for g in kv_cache_config.kv_cache_groups for n in g.layer_names if n not in owned}


def _manager_views(
    groups: Sequence[Any], static_forward_context: Mapping[str, Any], num_blocks: int, layout: Layout
) -> dict[str, Any]:
    """The bound cache of every planned layer that holds tensors, in manager blocks (vLLM's own
    mapping of packed views)."""
    if not isinstance(static_forward_context, Mapping):  # vLLM's is a dict: name -> attention layer
        why = "must be a mapping of layer names to layers (vLLM's static_forward_context)"
        raise bad_value(SpecError, "static_forward_context", type(static_forward_context).__name__, why)
    group_of = {name: g for g in groups for name in g.layer_names}
    views: dict[str, Any] = {}
    for p in layout.placements:
        name = p.layer.name
        kv = getattr(static_forward_context.get(name), "kv_cache", None)
        where = f"static_forward_context[{name!r}].kv_cache"
        if not any(True for _ in _walk_tensors(kv, where)):  # no tensor: vLLM's zeroer skips the layer too,
            continue  # and check_views_against_layout refuses it if kvlayout zeroes rows of it
        g = group_of.get(name)
        if g is not None and bool(getattr(g, "kernel_block_stride", 0)) and hasattr(kv, "as_strided"):
            kv = g.map_kv_cache_to_manager_blocks(kv, num_blocks)
        views[name] = kv
    return views


@plain_torch
def _storage_base(views: Mapping[str, Any], layout: Layout) -> tuple[Any, int]:
    """(uint8 tensor over the views' one storage, byte of the plan's byte 0 in it), views checked."""
    import torch

    tensors = [t for k, v in views.items() for t in _walk_tensors(v, f"kv_caches[{k!r}]")]
    if not tensors:  # vLLM binds every layer's cache before it builds the zeroer
        why = "binds no tensor to any planned layer (kv_cache): nothing to check the plan against"
        raise bad_value(SpecError, "static_forward_context", len(views), why, shown=f"{len(views)} views")
    odd = next((t for t in tensors if type(t) not in (torch.Tensor, torch.nn.Parameter)), None)
    if odd is not None:  # its own storage_offset() / stride() would place the plan (from_kv_caches: pass 24)
        kind = type(odd).__name__
        why = "must be plain torch.Tensor views, as vLLM's are (a subclass may report another placement)"
        raise bad_value(SpecError, "static_forward_context", kind, why, shown=f"a {kind}")
    storage = tensors[0].untyped_storage()
    for name, v in views.items():
        for t in _walk_tensors(v, f"kv_caches[{name!r}]"):
            if t.untyped_storage().data_ptr() != storage.data_ptr():
                raise SpecError(
                    f"static_forward_context[{name!r}].kv_cache: views another storage than "
                    f"{next(iter(views))!r}; vLLM allocates one",
                    field="kv_cache",
                    value=name,
                )
    rows = {s.layer for s in layout.table().segments}
    optional = {p.layer.name for p in layout.placements} - rows  # e.g. Mamba state: no row to zero
    base = check_views_against_layout(
        layout, views, storage.nbytes(), where="static_forward_context", optional=optional
    )
    backing = torch.empty(0, dtype=torch.uint8, device=tensors[0].device).set_(storage)
    return backing, base


# --------------------------------------------------------------------------- verify: the proof
def _owner(layout: Layout, byte: int) -> str:
    """Which planned layer's page (and block) holds ``byte``, for messages."""
    for p in layout.placements:
        for q in p.parts:
            if q.stride > 0 and byte >= q.base:
                b, r = divmod(byte - q.base, q.stride)
                if b < layout.num_blocks and r < q.span:
                    return f"layer {p.layer.name!r} block {b}"
    return "no layer's page (padding or outside the cache)"


def _merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged half-open ranges (Python ints: no wrap)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _block_ranges(table: SegmentTable, b: int) -> list[tuple[int, int]]:
    """Merged byte ranges the table clears for block ``b``."""
    return _merge((s.base + b * s.stride, s.base + b * s.stride + s.span) for s in table.segments)


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Bytes of merged ranges ``a`` not in merged ranges ``b``."""
    out: list[tuple[int, int]] = []
    j = 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k, cur = j, lo
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def _classes(table: SegmentTable) -> dict[int, list[tuple[int, int]]]:
    """Block 0's merged bytes per block stride."""
    by: dict[int, list[tuple[int, int]]] = {}
    for s in table.segments:
        by.setdefault(s.stride, []).append((s.base, s.base + s.span))
    return {k: _merge(v) for k, v in by.items()}


def first_difference(ours: SegmentTable, theirs: SegmentTable) -> tuple[int, str, tuple[int, int]] | None:
    """The first block whose bytes differ: (block, which side clears them, byte range), or ``None``.

    Rows of one block stride clear, for block ``b``, their block-0 bytes shifted by ``b`` strides:
    equal merged block-0 bytes per stride prove every block equal at once. Otherwise blocks are
    compared one by one (0 and the last first), up to :data:`MAX_BLOCKS_COMPARED`.
    """
    if _classes(ours) == _classes(theirs):
        return None
    n = ours.num_blocks
    order = [0, n - 1, *range(1, n - 1)] if n > 1 else [0]
    for b in order[:MAX_BLOCKS_COMPARED]:
        mine, vllm = _block_ranges(ours, b), _block_ranges(theirs, b)
        extra, stale = _minus(vllm, mine), _minus(mine, vllm)
        if extra:
            return b, "vllm", extra[0]
        if stale:
            return b, "kvlayout", stale[0]
    if n > MAX_BLOCKS_COMPARED:
        return -1, "unproven", (0, 0)
    return None


def verify_vllm_table(vt: SegmentTable, layout: Layout, ours: SegmentTable, base_address: int) -> None:
    """Raise :class:`ZeroerMismatchError` unless vLLM's table is safe and clears the plan's bytes."""
    rep = verify(vt)
    if not rep.ok:
        v = rep.violations[0]
        rows = ", ".join(
            f"segment {r} at cache byte {vt.segments[r].base} ({_owner(layout, vt.segments[r].base)})"
            for r in v.rows[:2]
        )
        where = f"block {v.blocks[0]}" if v.blocks else "its blocks"
        what = f"bytes [{v.byte_range[0]}, {v.byte_range[1]})" if v.byte_range else "its rows"
        raise ZeroerMismatchError(
            f"vLLM's KVBlockZeroer is unsafe: {rows}, {where}, {what}: {v.message} "
            f"(cache at address {base_address:#x}; {len(rep.violations)} violations)",
            field="KVBlockZeroer._meta",
            value=v.message,
        )
    diff = first_difference(ours, vt)
    if diff is None:
        return
    b, side, (lo, hi) = diff
    if side == "unproven":
        raise ZeroerMismatchError(
            f"vLLM's KVBlockZeroer rows differ from kvlayout's plan and {ours.num_blocks} blocks are too "
            f"many to compare one by one (limit {MAX_BLOCKS_COMPARED})",
            field="KVBlockZeroer._meta",
            value=ours.num_blocks,
        )
    if side == "vllm":
        why = f"vLLM clears them, kvlayout's plan does not: they belong to {_owner(layout, lo)}"
    else:
        why = f"a page byte of {_owner(layout, lo)} that vLLM leaves stale"
    raise ZeroerMismatchError(
        f"vLLM's KVBlockZeroer differs from kvlayout's plan at block {b}, cache bytes [{lo}, {hi}): {why}",
        field="KVBlockZeroer._meta",
        value=(b, lo, hi),
    )


#: Number types torch turns into an int64 id without a word: floats truncated, bools as 0 and 1.
_NOT_IDS = (bool, float, np.bool_, np.floating, np.timedelta64)


def _not_an_id(x: Any, not_ids: tuple[type, ...]) -> bool:
    """A float, bool or tensor, an ``int`` subclass whose readings disagree (``validate.honest_int``), a
    subclass of a NumPy integer type (its own ``__index__`` read 7 for a stored 2: pass 34), or anything
    else that is no integer (an object with ``__index__`` was read by torch: issue 25, pass 23)."""
    return isinstance(x, not_ids) or not is_int(x)


def checked_step_ids(block_ids: Sequence[int], num_blocks: int, pin_memory: bool = False) -> Any:
    """The host int64 tensor vLLM's step builds from the scheduler's list, its ids bounds-checked.

    vLLM's ``async_tensor_h2d`` makes this tensor anyway (pinned where vLLM pins); the checks are
    one pass over the list's element types (a float or bool is no id: torch would truncate or
    convert it) and one ``aminmax`` over the tensor. An id outside ``[0, num_blocks)`` raises
    :class:`~kvlayout.errors.BlockIdError` naming the first such id, before anything is copied to
    the device or launched.
    """
    import torch

    if type(block_ids) not in (list, tuple):  # a subclass's __len__ read 2 for the check, 4,096 for vLLM's
        why = "must be the scheduler's list of block ids (nothing was written)"  # grid (pass 32)
        if isinstance(block_ids, (list, tuple)):
            why = "must be a plain list or tuple, the scheduler's (a subclass may read differently each time)"
        raise bad_value(BlockIdError, "block_ids", type(block_ids).__name__, why)
    kinds = set(map(type, block_ids))  # one C pass: torch would truncate 2.7 to block 2, take True as 1
    not_ids = (*_NOT_IDS, torch.Tensor)  # tensor(True) was block 1, tensor([3]) block 3 (issue 25)
    # an int subclass must read the same as torch (its stored value) and NumPy (__index__) read it
    if not kinds <= {int}:
        i = next((i for i, x in enumerate(block_ids) if _not_an_id(x, not_ids)), -1)
        if i >= 0:  # else honest int subclasses (IntEnum) and NumPy integers: integers
            lying = issubclass(type(block_ids[i]), int) and not issubclass(type(block_ids[i]), bool)
            why = f"must be an integer{': ' + LYING_INT_WHY if lying else ''} (nothing was written)"
            raise bad_value(BlockIdError, f"block_ids[{i}]", block_ids[i], why)
    try:  # the dtype is given, as vLLM's own step gives it (inferring it doubles the cost at 1,024 ids)
        ids = torch.tensor(block_ids, dtype=torch.int64, pin_memory=pin_memory, device="cpu")
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:  # None, '1', 2**63
        why = f"must be a list of integers (nothing was written): {e}"
        raise bad_value(BlockIdError, "block_ids", block_ids, why) from None
    if ids.ndim != 1:
        why = f"must be a flat list of integers, got shape {tuple(ids.shape)} (nothing was written)"
        raise bad_value(BlockIdError, "block_ids", block_ids, why)
    if ids.numel():
        lo, hi = torch.aminmax(ids)
        if int(lo) < 0 or int(hi) >= num_blocks:
            bad = ((ids < 0) | (ids >= num_blocks)).nonzero()
            i = int(bad[0, 0])
            raise bad_value(
                BlockIdError,
                f"block_ids[{i}]",
                int(ids[i]),
                f"outside [0, {num_blocks}): kvlayout refused the step before vLLM's kernel ran "
                f"({bad.shape[0]} bad ids; nothing was written)",
            )
    return ids


def _verifying_class(original: type, utils: ModuleType) -> type:
    """vLLM's own class, proven at construction and bounds-checking each step's ids."""

    class VerifiedKVBlockZeroer(original):  # type: ignore[misc, valid-type]
        """vLLM's ``KVBlockZeroer``, its table proven by kvlayout; ids checked before its kernel."""

        kvlayout_mode = "verify"

        @plain_torch
        def __init__(
            self,
            device: Any,
            attn_groups_iter: Iterable[Any],
            kernel_block_sizes: list[int],
            static_forward_context: dict[str, Any],
            num_blocks: int,
            runner_only_attn_layers: set[str] | None = None,
            *,
            kv_cache_config: Any = None,
        ) -> None:
            from vllm.utils.torch_utils import PIN_MEMORY

            self.kvlayout_pin_memory = bool(PIN_MEMORY)  # as vLLM's async_tensor_h2d stages ids
            groups = list(attn_groups_iter)  # vLLM's constructor and kvlayout both read them
            super().__init__(
                device,
                groups,
                kernel_block_sizes,
                static_forward_context,
                num_blocks,
                runner_only_attn_layers,
            )
            if kv_cache_config is None:
                kv_cache_config, layout_name = _caller_config(2)
            else:
                layout_name = kv_cache_config.kv_cache_layout
            spec = spec_from_kv_cache_config(
                kv_cache_config,
                layout_name,
                kernel_block_sizes=kernel_block_sizes,
                runner_only_attn_layers=_runner_only(kv_cache_config, runner_only_attn_layers),
            )
            layout = plan_layout(spec)
            views = _manager_views(groups, static_forward_context, num_blocks, layout)
            backing, base = _storage_base(views, layout)
            address = backing.data_ptr() + base
            vt = table_from_block_zeroer(self, address, layout.total_bytes, num_blocks)
            ours = layout.table()
            verify_vllm_table(vt, layout, ours, address)
            self.kvlayout_table = ours
            self.kvlayout_num_blocks = int(num_blocks)
            log.info(
                "kvlayout vLLM plugin: vLLM's KVBlockZeroer proven (%d segments, %d layers, %d blocks, %s)",
                len(vt),
                len(layout.placements),
                num_blocks,
                layout.order,
            )

        @plain_torch
        def zero_block_ids(self, block_ids: list[int]) -> None:
            """vLLM's step (its host tensor, copy and kernel), with the ids bounds-checked first (no caller's
            mode between: one answering ``aminmax`` had id 5000 of an 8-block pool reach vLLM's unbounded
            kernel, pass 33)."""
            if self._meta is None:
                return
            # checked before any truth test: an array's truth value raised raw, np.array([0]) returned with
            # block 0 not zeroed (pass 38); an empty list is nothing to do
            ids = checked_step_ids(block_ids, self.kvlayout_num_blocks, self.kvlayout_pin_memory)
            if ids.numel() == 0:
                return
            seg_addrs, seg_block_strides, seg_page_sizes, max_chunks, blk_size, n_segs = self._meta
            idx = ids.to(device=self.device, non_blocking=True)
            utils._zero_kv_blocks_kernel[(ids.numel(), n_segs, max_chunks)](  # the ids checked, not a re-read
                seg_addrs, seg_block_strides, seg_page_sizes, idx, BLOCK_SIZE=blk_size
            )

    VerifiedKVBlockZeroer.__qualname__ = VerifiedKVBlockZeroer.__name__
    return VerifiedKVBlockZeroer


class ReplacedKVBlockZeroer(KVBlockZeroer):
    """kvlayout's drop-in, built from the arguments vLLM's runner passes its own ``KVBlockZeroer``."""

    kvlayout_mode = "replace"

    @plain_torch
    def __init__(  # type: ignore[override]
        self,
        device: Any,
        attn_groups_iter: Iterable[Any],
        kernel_block_sizes: list[int],
        static_forward_context: dict[str, Any],
        num_blocks: int,
        runner_only_attn_layers: set[str] | None = None,
        *,
        kv_cache_config: Any = None,
        **options: Any,
    ) -> None:
        groups = list(attn_groups_iter)
        if kv_cache_config is None:
            kv_cache_config, layout_name = _caller_config(2)
        else:
            layout_name = kv_cache_config.kv_cache_layout
        runner_only = _runner_only(kv_cache_config, runner_only_attn_layers)
        spec = spec_from_kv_cache_config(
            kv_cache_config,
            layout_name,
            kernel_block_sizes=kernel_block_sizes,
            runner_only_attn_layers=runner_only,
        )
        layout = plan_layout(spec)
        if not is_int(num_blocks):
            why = "must be an integer (the KVCacheConfig's num_blocks)"
            raise bad_value(SpecError, "num_blocks", num_blocks, why)
        if int(num_blocks) != layout.num_blocks:
            raise SpecError(
                f"num_blocks = {num_blocks}: the KVCacheConfig plans {layout.num_blocks}",
                field="num_blocks",
                value=num_blocks,
            )
        views = _manager_views(groups, static_forward_context, int(num_blocks), layout)
        backing, base = _storage_base(views, layout)
        # the spec the views were checked against, not the config read again (pass 40)
        self._init_spec(spec, backing, {**options, "offset": base})
        log.info(
            "kvlayout vLLM plugin: kvlayout's zeroer replaces vLLM's (%d rows, %d groups, %d blocks)",
            len(self.table),
            len(self.group_names),
            self.num_blocks,
        )

    def warmup(self, num_kv_blocks: int | None = None) -> None:  # type: ignore[override]
        """vLLM's ``warmup(num_kv_blocks)``: compile every group's kernel, writing nothing."""
        super().warmup()


def _replacing_class(original: type) -> type:
    return ReplacedKVBlockZeroer


__all__ = [
    "ENV_VAR",
    "MODES",
    "PluginConfigError",
    "ReplacedKVBlockZeroer",
    "ZeroerMismatchError",
    "checked_step_ids",
    "first_difference",
    "install",
    "installed_mode",
    "mode_from_env",
    "register",
    "uninstall",
    "verify_vllm_table",
]
