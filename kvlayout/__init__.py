"""kvlayout: plan paged KV-cache layouts, prove their segment tables safe, zero blocks exactly.

The core is NumPy only: importing it pulls in neither torch nor JAX. Backends (``cuda``,
``pallas``, plugins) load lazily through :mod:`kvlayout.registry`.

Map of the modules, by layer. A module imports from its own layer and the layers listed before
it, never after (this package's ``__init__`` re-exports from all three); there are no import
cycles. ``tests/test_layers.py`` checks both, and that every module is listed here.

core: the contract (docs/GEOMETRY.md) in NumPy
    ``errors``         the error classes: every bad input names its field and value
    ``ranges``         exact integer and byte-range arithmetic, the limits of section 8
    ``validate``       input rules shared by every entry point (names, ints, JSON)
    ``hardware``       the one probe of which accelerators torch and JAX can reach
    ``spec``           layer, group and cache specs; page arithmetic
    ``table``          the segment table: rows, groups, coalescing, JSON
    ``planner``        spec -> layout -> segment table, all six orders
    ``verify``         the static verifier: invariants 1-4 of section 3, every block id
    ``presets``        built-in specs for ``--preset``: DeepSeek-V4 geometries, Llama-8B
    ``backend``        the backend interface every zeroer implements
    ``reference``      the NumPy oracle: expected bytes, the reference backend
adapters: other systems' objects to and from specs and tables
    ``native``         native caches (section 9): typed arrays, page axis first
    ``sharding``       ``ShardedLayout``: one local layout per shard of a device mesh
    ``models``         a HuggingFace config.json to a spec, family by family
    ``integrations``   vLLM's objects (``integrations.vllm``)
    ``backends``       the kernel backends: ``cuda`` (Triton, torch), ``pallas`` (JAX)
tools: for people and test suites, built on the two layers above
    ``registry``       backend discovery and selection (``auto``, plugins)
    ``conformance``    the conformance battery any backend must pass
    ``planted``        backends with real past bugs, which the battery must catch
    ``testing``        seeded random specs
    ``pytest_plugin``  the battery as a pytest plugin
    ``viz``            pictures: byte maps, table maps, step charts, the explorer
    ``cli``            the ``kvlayout`` command line
    ``__main__``       ``python -m kvlayout``
"""

from __future__ import annotations

from .backend import Backend
from .errors import (
    BackendError,
    BlockIdError,
    KVLayoutError,
    LayoutBufferError,
    SpecError,
    TableError,
)
from .planner import Layout, Part, Placement, plan, plan_layout
from .presets import PRESETS, preset
from .reference import (
    ReferenceBackend,
    changed_ranges,
    expected_zeroed,
    merge_ranges,
    normalize_block_ids,
    poison_pattern,
    zero_blocks_numpy,
)
from .registry import create as create_backend
from .registry import load as load_backend
from .registry import resolve as resolve_backend
from .sharding import ShardedLayout, shard_spec, split_heads
from .spec import (
    DTYPE_SIZES,
    FullAttentionSpec,
    GroupSpec,
    KVCacheSpec,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
)
from .table import Segment, SegmentTable
from .verify import VerifyReport, Violation, verify

__version__ = "0.1.0"

#: The native-cache API (GEOMETRY.md section 9), loaded on first use: ``kvlayout.NativeCacheSpec``.
_LAZY = {
    name: ".native"
    for name in (
        "NativeCacheSpec",
        "NativeLeaf",
        "expected_zeroed_native",
        "native_tables",
        "spec_from_arrays",
        "verify_native",
        "zero_native_numpy",
    )
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "Backend",
    "BackendError",
    "BlockIdError",
    "DTYPE_SIZES",
    "FullAttentionSpec",
    "GroupSpec",
    "KVCacheSpec",
    "KVLayoutError",
    "LayerSpec",
    "Layout",
    "LayoutBufferError",
    "MLASpec",
    "MambaSpec",
    "NativeCacheSpec",
    "NativeLeaf",
    "PRESETS",
    "Part",
    "Placement",
    "ReferenceBackend",
    "Segment",
    "SegmentTable",
    "ShardedLayout",
    "SlidingWindowSpec",
    "SpecError",
    "TableError",
    "VerifyReport",
    "Violation",
    "changed_ranges",
    "create_backend",
    "expected_zeroed",
    "expected_zeroed_native",
    "load_backend",
    "merge_ranges",
    "native_tables",
    "normalize_block_ids",
    "plan",
    "plan_layout",
    "poison_pattern",
    "preset",
    "resolve_backend",
    "shard_spec",
    "spec_from_arrays",
    "split_heads",
    "verify",
    "verify_native",
    "zero_blocks_numpy",
    "zero_native_numpy",
]
