"""Pictures of layouts (``notebook`` extra: matplotlib; the explorer also needs ipywidgets).

- :func:`byte_map`: the bytes of a block, one lane per (block, group shape). Overlaid groups of
  one shape share a lane ("x 11 groups like c4.*"); layers are coloured one by one when there
  are few and by kind (attention, compressed, indexer, sliding window, Mamba) when there are
  many, with a legend; alignment gaps are hatched; stride, page and span arrows, the block
  boundary and the end of the buffer are marked; insets show the gaps at byte scale.
- :func:`table_map`: what each table row clears. Red only where the verifier's invariants
  break (bytes of two blocks, past the buffer, in padding), with the first spill at byte scale.
- Size bounds, checked before matplotlib is imported (``kvlayout plot`` uses the same):
  :data:`MAX_PLOT_LAYERS` and :data:`MAX_PLOT_GROUPS` per byte map, :data:`MAX_PLOT_ROWS` per table map;
  :data:`MAX_PLOT_LANES` (``max_lanes``), :data:`MAX_PLOT_BOXES` drawn, :data:`MAX_PLOT_IDS` block ids
  per call (a ``range`` checked by its ends) and :data:`MAX_PLOT_STRIPS` per :func:`zero_diff`.
- :func:`compare_maps` (two layouts, tp degrees, dtypes), :func:`bytes_per_step` (per-group
  against all-group zeroing), :func:`zero_diff`, :func:`describe_at` (what lies at a byte),
  :func:`attach_hover` and :class:`Explorer` (ipywidgets).

The modules, by what they draw (each imports only those above it):

- ``common``: colours, lanes of equal shape, :class:`Geometry` (block-row coordinates), formats.
- ``maps``: :func:`byte_map`, :func:`table_map`, :func:`table_view`, :func:`zero_diff`.
- ``compare``: spec variants (:func:`parse_compare`, :func:`variant`) and :func:`compare_maps`.
- ``charts``: :func:`step_bytes` and the :func:`bytes_per_step` chart.
- ``interactive``: :func:`describe_at`, :func:`attach_hover` and the :class:`Explorer` widget.

matplotlib and ipywidgets are imported inside the functions that need them: importing this
package is cheap, so the CLI validates ``--compare`` (:func:`parse_compare`) before loading them.
"""

from __future__ import annotations

from .charts import bytes_per_step, step_bytes
from .common import (
    BLOCK_GAP,
    EDGE_COLOR,
    HEADER,
    KIND_COLORS,
    LANE_BG,
    LANE_H,
    LANE_IN,
    LAYER_PALETTE,
    MAX_LAYER_COLORS,
    MAX_PLOT_BOXES,
    MAX_PLOT_GROUPS,
    MAX_PLOT_IDS,
    MAX_PLOT_LANES,
    MAX_PLOT_LAYERS,
    MAX_PLOT_ROWS,
    MAX_PLOT_STRIPS,
    PAD_COLOR,
    UNSAFE_COLOR,
    Box,
    Geometry,
    Lane,
    MapInfo,
    check_drawable,
    group_lanes,
    group_pattern,
    layer_colors,
    layer_kind,
)
from .compare import (
    COMPARE_KEYS,
    VARIANT_DTYPES,
    compare_maps,
    describe_changes,
    parse_compare,
    variant,
    with_dtype,
    with_layout,
)
from .interactive import Explorer, attach_hover, describe_at, explorer, hover_text
from .maps import TableView, byte_map, table_map, table_view, zero_diff

__all__ = [
    "BLOCK_GAP",
    "Box",
    "COMPARE_KEYS",
    "EDGE_COLOR",
    "Explorer",
    "Geometry",
    "HEADER",
    "KIND_COLORS",
    "LANE_BG",
    "LANE_H",
    "LANE_IN",
    "LAYER_PALETTE",
    "Lane",
    "MAX_LAYER_COLORS",
    "MAX_PLOT_BOXES",
    "MAX_PLOT_GROUPS",
    "MAX_PLOT_IDS",
    "MAX_PLOT_LANES",
    "MAX_PLOT_LAYERS",
    "MAX_PLOT_ROWS",
    "MAX_PLOT_STRIPS",
    "MapInfo",
    "PAD_COLOR",
    "TableView",
    "UNSAFE_COLOR",
    "VARIANT_DTYPES",
    "attach_hover",
    "byte_map",
    "bytes_per_step",
    "check_drawable",
    "compare_maps",
    "describe_at",
    "describe_changes",
    "explorer",
    "group_lanes",
    "group_pattern",
    "hover_text",
    "layer_colors",
    "layer_kind",
    "parse_compare",
    "step_bytes",
    "table_map",
    "table_view",
    "variant",
    "with_dtype",
    "with_layout",
    "zero_diff",
]
