"""kvlayout: plan paged KV-cache layouts, prove their segment tables safe, zero blocks exactly.

The core is NumPy only: importing it pulls in neither torch nor JAX. Backends (``cuda``,
``pallas``, plugins) load lazily through :mod:`kvlayout.registry`.
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
    "load_backend",
    "merge_ranges",
    "normalize_block_ids",
    "plan",
    "plan_layout",
    "poison_pattern",
    "preset",
    "resolve_backend",
    "shard_spec",
    "split_heads",
    "verify",
    "zero_blocks_numpy",
]
