"""Ground truth from vLLM 0.33.0 itself (GEOMETRY.md section 6, issue 14).

Every configuration of the battery is planned by vLLM's own code on the CPU: per-layer specs
customised by real attention backends (``customize_attention_spec``), grouped by
``get_kv_cache_groups``, placed by ``get_kv_cache_config_from_groups``, allocated and viewed by
``allocate_kv_cache`` (kernel-block views where vLLM splits blocks), bound as vLLM binds them,
and handed to vLLM's ``KVBlockZeroer``. kvlayout's table, through
:func:`kvlayout.integrations.vllm.spec_from_kv_cache_config`, must clear exactly the bytes of
the zeroer's ``_meta`` for every block id, and vLLM's own Triton kernel (run under Triton's
interpreter in a subprocess) must leave the same bytes as kvlayout's reference on the same
poisoned buffer. The two documented differences are tested as such. vLLM missing is a
failure, never a skip: CI installs it (requirements-vllm.txt).

Run as a script (``python tests/test_vllm_ground_truth.py --driver``) this module is the
interpreter driver: it needs ``TRITON_INTERPRET=1`` before Triton is imported, which is why
it runs in its own process.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.driver import start_driver

_HERE = Path(__file__).resolve()
_DRIVER_ENV = {
    # vLLM's platform probe: a CPU machine whose venv also holds libtpu would otherwise pick TPU.
    "VLLM_TARGET_DEVICE": "cpu",
    # vLLM's Triton probe keeps Triton when no GPU driver is active only in a "distributed" env
    # (an empty CUDA_VISIBLE_DEVICES, as Ray sets it); its kernel is then the real @triton.jit.
    "CUDA_VISIBLE_DEVICES": "",
    "TRITON_INTERPRET": "1",
}


_DRIVER = start_driver(_HERE, __name__, _DRIVER_ENV)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.v1 import kv_cache_interface as I  # noqa: E402
from vllm.v1.attention.backend import MultipleOf  # noqa: E402
from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend  # noqa: E402
from vllm.v1.attention.backends.mla.indexer import DeepseekV4IndexerBackend  # noqa: E402
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWABackend  # noqa: E402
from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend  # noqa: E402
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend  # noqa: E402
from vllm.v1.core import kv_cache_planning as P  # noqa: E402
from vllm.v1.worker import utils as U  # noqa: E402

import kvlayout as K  # noqa: E402
from kvlayout.errors import BlockIdError, SpecError  # noqa: E402
from kvlayout.integrations.vllm import (  # noqa: E402
    KVBlockZeroer,
    layout_name,
    spec_from_kv_cache_config,
    table_from_block_zeroer,
)

LAYOUTS = tuple(m.name for m in I.KVCacheLayout)
CPU = torch.device("cpu")


class Fixed16Backend(TritonAttentionBackend):
    """Triton attention whose kernels take 16-token blocks only (as FA4's fixed sizes do)."""

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [16]


# --------------------------------------------------------------------------- the battery
@dataclass(frozen=True)
class Case:
    """One vLLM configuration: per-layer raw specs and the backend that customises each."""

    name: str
    layout: str
    layers: tuple[tuple[str, Any, Any], ...]  # (layer name, raw vLLM spec, backend class or None)
    num_blocks: int = 5
    #: group id -> kernel block size bound through map_kv_caches_to_kernel_blocks (packed DSV4)
    kernel_views: tuple[tuple[int, int], ...] = ()
    #: kvlayout must refuse the config: regex of the error
    refused: str | None = None
    interpret: bool = False  # also run vLLM's Triton kernel under the interpreter


def _full(bs: int = 16, heads: int = 2, hs: int = 8, dtype: torch.dtype = torch.bfloat16, **kw: Any) -> Any:
    return I.FullAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=hs, dtype=dtype, **kw)


def _swa(bs: int = 16, heads: int = 2, hs: int = 8, window: int = 32, **kw: Any) -> Any:
    return I.SlidingWindowSpec(
        block_size=bs, num_kv_heads=heads, head_size=hs, dtype=torch.bfloat16, sliding_window=window, **kw
    )


def _mla(bs: int = 16, hs: int = 24, dtype: torch.dtype = torch.bfloat16, **kw: Any) -> Any:
    return I.MLAAttentionSpec(block_size=bs, num_kv_heads=1, head_size=hs, dtype=dtype, **kw)


#: A Mamba state of 752 B (bf16 conv (3, 40) + fp32 ssm (8, 16)), padded by vLLM to the 1,024 B
#: attention page; and one of exactly 1,024 B (BHLNC cannot express mixed pages, so vLLM needs it).
_STATE = ((3, 40), (8, 16))
_EQUAL_STATE = ((4, 64), (8, 16))


def _mamba(state: tuple[tuple[int, ...], ...] = _STATE, **kw: Any) -> Any:
    return I.MambaSpec(block_size=16, shapes=state, dtypes=(torch.bfloat16, torch.float32), **kw)


def _dsv4_attn(ratio: int) -> Any:
    """DeepSeek-V4's compressed attention (models/deepseek_v4/attention.py)."""
    return I.MLAAttentionSpec(
        block_size=256,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=512,
        dtype=torch.uint8,
        tokens_per_state=ratio,
        cache_dtype_str="fp8_ds_mla",
        alignment=576,
        model_version="deepseek_v4",
        kv_quant_mode=I.get_kv_quant_mode("fp8_ds_mla"),
        state_content_bytes=584,
    )


def _dsv4_indexer() -> Any:
    """DeepSeek-V4's C4 indexer cache (132 B rows, 576 B alignment)."""
    return I.MLAAttentionSpec(
        block_size=256,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=132,
        dtype=torch.uint8,
        tokens_per_state=4,
        alignment=576,
    )


def _dsv4_swa() -> Any:
    """DeepSeek-V4's sliding-window MLA (64-token blocks, packed fp8 rows)."""
    return I.SlidingWindowMLASpec(
        block_size=64,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=512,
        dtype=torch.uint8,
        sliding_window=128,
        cache_dtype_str="fp8_ds_mla",
        state_content_bytes=584,
        alignment=576,
        model_version="deepseek_v4",
        kv_quant_mode=I.get_kv_quant_mode("fp8_ds_mla"),
    )


def _named(prefix: str, specs: list[tuple[Any, Any]]) -> tuple[tuple[str, Any, Any], ...]:
    return tuple((f"model.layers.{i}.{prefix}", s, b) for i, (s, b) in enumerate(specs))


def battery() -> list[Case]:
    """Every layout; full, sliding window, MLA, DSV4 fp8_ds_mla C4/C128, attention + Mamba hybrids,
    overlaid groups, virtual block splitting, fp8/int8/bf16, packed content and head slots."""
    ta, tm = TritonAttentionBackend, TritonMLABackend
    cases: list[Case] = []
    for lay in LAYOUTS:
        cases += [
            Case(f"{lay}:full-bf16", lay, _named("attn", [(_full(), ta)] * 3), interpret=True),
            Case(f"{lay}:full-fp8", lay, _named("attn", [(_full(dtype=torch.float8_e4m3fn, hs=16), ta)] * 2)),
            Case(
                f"{lay}:int8-per-token-head",
                lay,  # Triton packs fp32 scales into C: state_content_bytes
                _named(
                    "attn",
                    [(_full(dtype=torch.int8, kv_quant_mode=I.KVQuantMode.INT8_PER_TOKEN_HEAD), ta)] * 2,
                ),
            ),
            Case(
                f"{lay}:full+swa-3-groups",
                lay,  # one full : two sliding-window layers -> 3 overlaid groups
                tuple((f"model.layers.{i}.attn", _full() if i % 3 == 0 else _swa(), ta) for i in range(6)),
                interpret=lay in ("LHBNC", "BHLNC"),
            ),
            Case(f"{lay}:mla-bf16", lay, _named("attn", [(_mla(), tm)] * 2)),
            Case(
                f"{lay}:head-slots",
                lay,  # a backend packing 2 KV heads into 4 head slots of 24 B cells
                _named("attn", [(_full(num_head_slots=4, state_content_bytes=24), ta)] * 2),
            ),
            Case(
                f"{lay}:states-per-token",
                lay,  # Whisper-style pooling: two states per token
                _named("attn", [(_full(tokens_per_state=Fraction(1, 2)), ta)] * 2),
            ),
            Case(
                f"{lay}:attn+mamba",
                lay,  # Mamba pages padded to the attention page (BHLNC: equal pages)
                (
                    *_named("attn", [(_full(), ta)] * 2),
                    *(
                        (f"model.layers.{i}.mixer", _mamba(_EQUAL_STATE if lay == "BHLNC" else _STATE), None)
                        for i in (2, 3)
                    ),
                ),
                refused=r"every layer of slot 0 must agree on head slots" if lay == "LHBNC" else None,
                interpret=lay == "BLNHC",
            ),
            Case(
                f"{lay}:attn1+mamba",
                lay,  # one KV head: every layout, LHBNC included
                (
                    *_named("attn", [(_full(heads=1, hs=16), ta)] * 2),
                    *(
                        (f"model.layers.{i}.mixer", _mamba(_EQUAL_STATE if lay == "BHLNC" else _STATE), None)
                        for i in (2, 3)
                    ),
                ),
            ),
        ]
    for lay in ("BLHNC", "BLNHC"):  # mixed page sizes: vLLM packs them block-outermost only
        dsv4 = (
            *((f"model.layers.{i}.self_attn", _dsv4_attn(4), FlashMLASparseBackend) for i in range(2)),
            *((f"model.layers.{i}.indexer", _dsv4_indexer(), DeepseekV4IndexerBackend) for i in range(2)),
            *((f"model.layers.{i}.self_attn", _dsv4_attn(128), FlashMLASparseBackend) for i in range(2, 4)),
        )
        cases += [
            Case(f"{lay}:dsv4-c4-c128", lay, dsv4, num_blocks=4, interpret=lay == "BLHNC"),
            Case(
                f"{lay}:dsv4+swa",
                lay,
                (
                    *dsv4,
                    *((f"model.layers.{i}.swa", _dsv4_swa(), DeepseekSparseSWABackend) for i in range(4, 6)),
                ),
                num_blocks=3,
            ),
            Case(
                f"{lay}:mixed-heads-one-group",
                lay,
                tuple((f"model.layers.{i}.attn", _full(heads=1 + i % 2), ta) for i in range(3)),
            ),
            Case(  # packed compressed MLA bound as 64-token kernel blocks (kernel_block_stride views)
                f"{lay}:c4-kernel-views",
                lay,
                _named("self_attn", [(_mla(bs=256, hs=32, tokens_per_state=4), FlashMLASparseBackend)] * 2),
                num_blocks=4,
                kernel_views=((0, 64),),
                interpret=lay == "BLNHC",
            ),
        ]
    for lay in ("LBHNC", "LBNHC"):
        cases.append(
            Case(
                f"{lay}:mixed-heads-one-group",
                lay,
                tuple((f"model.layers.{i}.attn", _full(heads=1 + i % 2), ta) for i in range(3)),
            )
        )
    # virtual block splitting: 32-token blocks, 16-token kernel blocks, where vLLM views dense pages
    cases += [
        Case("LBHNC:split", "LBHNC", _named("attn", [(_full(bs=32), Fixed16Backend)] * 2), interpret=True),
        Case("LBNHC:split", "LBNHC", _named("attn", [(_full(bs=32), Fixed16Backend)] * 2)),
        Case("LHBNC:split-one-head", "LHBNC", _named("attn", [(_full(bs=32, heads=1), Fixed16Backend)] * 2)),
        Case(
            "BLHNC:split-one-layer", "BLHNC", _named("attn", [(_full(bs=32), Fixed16Backend)]), interpret=True
        ),
        Case("BLNHC:split-mla", "BLNHC", _named("attn", [(_mla(bs=32, hs=32), Fixed16Backend)])),
    ]
    return cases


# --------------------------------------------------------------------------- building vLLM's objects
def vllm_config(layout: str, num_blocks: int) -> Any:
    """The few config fields vLLM's planning reads (the engine core resolves the layout)."""
    cache = SimpleNamespace(
        num_gpu_blocks_override=num_blocks,
        prefix_cache_retention_interval=None,
        kv_cache_layout=layout,
        get_resolved_kv_cache_layout=lambda: I.KVCacheLayout[layout],
    )
    return SimpleNamespace(
        cache_config=cache,
        attention_config=SimpleNamespace(hisparse_config=None),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        model_config=SimpleNamespace(supports_kv_cache_grouping=False),
    )


@dataclass
class Built:
    """vLLM's objects for one case, on CPU tensors."""

    case: Case
    config: Any  # KVCacheConfig
    layout: Any  # KVCacheLayout
    kernel_block_sizes: list[int]
    attn_groups: list[Any]
    forward_context: dict[str, Any]
    buffer: torch.Tensor  # the int8 backing allocation, as uint8
    zeroer: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_blocks(self) -> int:
        return int(self.config.num_blocks)

    def vllm_table(self) -> K.SegmentTable:
        return table_from_block_zeroer(
            self.zeroer, self.buffer.data_ptr(), self.buffer.numel(), self.num_blocks
        )


def _bind(spec: Any, view: torch.Tensor) -> Any:
    """What each layer keeps after ``bind_kv_cache`` (MLA squeezes its single head slot)."""
    if isinstance(spec, I.MambaSpec):
        return (view,)  # per-state tuples: not a tensor, the zeroer skips it
    return view.squeeze(1) if isinstance(spec, I.MLAAttentionSpec) else view


def build(case: Case, *, runner_only: frozenset[str] = frozenset()) -> Built:
    """Plan, allocate, view and bind ``case`` with vLLM's own functions; construct its zeroer."""
    specs = {n: U.customize_attention_spec(b, s) if b is not None else s for n, s, b in case.layers}
    backend_of = {n: b or TritonAttentionBackend for n, _, b in case.layers}
    vc = vllm_config(case.layout, case.num_blocks)
    groups = P.get_kv_cache_groups(vc, dict(specs))
    kcc = P.get_kv_cache_config_from_groups(vc, groups, case.num_blocks * P._pool_bytes_per_block(vc, groups))
    kcc.kv_cache_layout = case.layout
    # attention groups as gpu_model_runner makes them: one per (backend, per-layer spec) of a cache group
    by_gid: list[list[Any]] = []
    for gid, g in enumerate(kcc.kv_cache_groups):
        keyed: dict[tuple[Any, Any], list[str]] = {}
        for name in g.layer_names:
            s = g.kv_cache_spec
            s = s.kv_cache_specs[name] if isinstance(s, I.UniformTypeKVCacheSpecs) else s
            keyed.setdefault((backend_of[name], s), []).append(name)
        by_gid.append([U.AttentionGroup(b, names, s, gid) for (b, s), names in keyed.items()])
    kbs = U.prepare_kernel_block_sizes(kcc, by_gid)
    layout = I.KVCacheLayout[case.layout]
    caches = U.allocate_kv_cache(kcc, CPU, layout, kbs)
    flat = [ag for ags in by_gid for ag in ags]
    for gid, size in case.kernel_views:
        for ag in by_gid[gid]:
            ag.kernel_block_size = size
    bound = U.map_kv_caches_to_kernel_blocks(caches, flat)
    spec_of = {name: ag.kv_cache_spec for ag in flat for name in ag.layer_names}
    ctx = {name: SimpleNamespace(kv_cache=_bind(spec_of[name], view)) for name, view in bound.items()}
    storage = next(iter(caches.values())).untyped_storage()
    buf = torch.empty(0, dtype=torch.uint8).set_(storage)
    built = Built(case, kcc, layout, kbs, flat, ctx, buf, extra={"caches": caches})
    built.zeroer = U.KVBlockZeroer(CPU, flat, kbs, ctx, kcc.num_blocks, set(runner_only))
    return built


def kvlayout_spec(built: Built) -> K.KVCacheSpec:
    return spec_from_kv_cache_config(built.config, built.layout, kernel_block_sizes=built.kernel_block_sizes)


def _ranges(r: np.ndarray) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in r.tolist()]


def vllm_bytes(vt: K.SegmentTable, ids: list[int]) -> list[tuple[int, int]]:
    """Merged ranges vLLM's kernel writes for ``ids`` (any id: the kernel has no bounds check)."""
    if not ids or not len(vt):
        return []
    starts = np.array([s.base + b * s.stride for s in vt.segments for b in ids], np.int64)
    ends = starts + np.array([s.span for s in vt.segments for _ in ids], np.int64)
    return _ranges(K.merge_ranges(starts, ends))


# --------------------------------------------------------------------------- tests
CASES = battery()


def test_battery_covers_every_layout_and_kind() -> None:
    names = {c.name for c in CASES}
    for lay in LAYOUTS:
        assert {
            f"{lay}:full-bf16",
            f"{lay}:full+swa-3-groups",
            f"{lay}:mla-bf16",
            f"{lay}:attn+mamba",
        } <= names
    assert {"BLHNC:dsv4-c4-c128", "BLNHC:dsv4+swa", "LBHNC:split", "LHBNC:split-one-head"} <= names
    assert {c.layout for c in CASES if c.interpret} == set(LAYOUTS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kvlayout_clears_exactly_vllms_bytes(case: Case) -> None:
    built = build(case)
    if case.refused:
        with pytest.raises(SpecError, match=case.refused):
            kvlayout_spec(built)
        return
    spec = kvlayout_spec(built)
    table = K.plan(spec)
    rep = K.verify(table)
    assert rep.ok, rep
    assert table.total_bytes <= built.buffer.numel()
    vt = built.vllm_table()
    n = built.num_blocks
    assert len(vt) > 0
    for b in range(n):  # every block id, one at a time
        assert _ranges(K.expected_zeroed(table, [b])) == vllm_bytes(vt, [b]), (case.name, b)
    assert _ranges(K.expected_zeroed(table, list(range(n)))) == vllm_bytes(vt, list(range(n)))
    # kvlayout's verifier on vLLM's own table: isolated blocks inside the buffer
    assert K.verify(vt).ok


def test_dsv4_geometry_through_the_adapter() -> None:
    """The #50276 numbers survive vLLM's own planning: 37,376 B C4 pages padded to 37,440 B."""
    built = build(next(c for c in CASES if c.name == "BLHNC:dsv4-c4-c128"))
    spec = kvlayout_spec(built)
    pages = {(layer.name, layer.real_page, layer.page) for _, layer in spec.layers}
    assert ("model.layers.0.self_attn", 37_376, 37_440) in pages
    assert ("model.layers.0.indexer", 8_448, 8_640) in pages
    assert ("model.layers.2.self_attn", 1_168, 1_728) in pages
    lay = K.plan_layout(spec)
    assert lay.block_stride == built.config.kv_cache_tensors[0].block_stride
    c4 = spec.groups[0].layers[0]
    assert (c4.cache_dtype, c4.token_bytes, c4.compress_ratio, c4.alignment) == ("fp8_ds_mla", 584, 4, 576)


def test_kernel_block_views_of_packed_blocks() -> None:
    """A packed group bound as kernel blocks: vLLM's zeroer maps the views back to manager blocks."""
    built = build(next(c for c in CASES if c.name == "BLHNC:c4-kernel-views"))
    assert built.kernel_block_sizes == [256]  # packed blocks are never split group-wide ...
    # ... but bound as 64-token pages: 4 per layer, 8 per block row of two layers
    assert [ag.kernel_block_stride for ag in built.attn_groups] == [8]
    view = built.forward_context["model.layers.0.self_attn"].kv_cache
    assert view.shape[0] == 8 * (built.num_blocks - 1) + 4
    spec = kvlayout_spec(built)
    assert all(g.kernel_block_size is None for g in spec.groups)


def test_virtual_splitting_rows_match_vllm_segments() -> None:
    """Where vLLM splits blocks into kernel blocks, kvlayout's rows are its segments, row for row."""
    built = build(next(c for c in CASES if c.name == "LBHNC:split"))
    assert built.kernel_block_sizes == [16]
    table = K.plan(kvlayout_spec(built))
    assert {s.virtual_index for s in table.segments} == {0, 1}
    ours = sorted((s.base, s.stride, s.span) for s in table.segments)
    theirs = sorted((s.base, s.stride, s.span) for s in built.vllm_table().segments)
    assert ours == theirs


# ---- the two documented differences
def test_difference_ids_outside_the_pool() -> None:
    """vLLM zeroes id ``num_blocks`` past the end of its buffer; kvlayout refuses the id."""
    built = build(next(c for c in CASES if c.name == "BLHNC:dsv4-c4-c128"))
    n, size = built.num_blocks, built.buffer.numel()
    written = vllm_bytes(built.vllm_table(), [n])
    assert max(b for _, b in written) > size  # vLLM writes beyond the backing allocation
    table = K.plan(kvlayout_spec(built))
    with pytest.raises(BlockIdError, match=rf"outside \[0, {n}\)"):
        K.expected_zeroed(table, [n])
    with pytest.raises(BlockIdError):
        K.zero_blocks_numpy(K.poison_pattern(table.total_bytes), table, [0, n])


def test_difference_bhlnc_segment_spans_other_layers() -> None:
    """Under BHLNC a vLLM segment runs from a layer's head 0 to its head H-1, over the other
    layers of the block; zeroing one layer alone shows it. kvlayout clears that layer only."""
    case = next(c for c in CASES if c.name == "BHLNC:full-bf16")
    names = [n for n, _, _ in case.layers]
    kept = names[1]
    built = build(case, runner_only=frozenset(names) - {kept})
    vt = built.vllm_table()
    table = K.plan(kvlayout_spec(built))
    mine = K.SegmentTable(
        table.total_bytes, table.num_blocks, tuple(s for s in table.segments if s.layer == kept)
    )
    others = K.SegmentTable(
        table.total_bytes, table.num_blocks, tuple(s for s in table.segments if s.layer != kept)
    )
    for b in range(built.num_blocks):
        theirs, ours = vllm_bytes(vt, [b]), _ranges(K.expected_zeroed(mine, [b]))
        t_set = set().union(*(range(x, y) for x, y in theirs))
        o_set = set().union(*(range(x, y) for x, y in ours))
        extra = t_set - o_set
        assert o_set < t_set and extra  # vLLM clears more than the layer ...
        other = set().union(*(range(x, y) for x, y in _ranges(K.expected_zeroed(others, [b]))))
        assert extra <= other  # ... and every extra byte belongs to another layer of the block
    # with every layer zeroed, the union is the same (test_kvlayout_clears_exactly_vllms_bytes)


def test_lhbnc_with_mamba_is_refused_where_vllm_interleaves_blocks() -> None:
    """Under LHBNC a multi-head attention group strides blocks by N*C while the Mamba group it
    overlays strides by the page: block b of one shares bytes with other blocks of the other."""
    built = build(next(c for c in CASES if c.name == "LHBNC:attn+mamba"))
    t = built.config.kv_cache_tensors
    strides = sorted({x.block_stride for x in t})
    assert len(strides) == 2 and strides[1] == 2 * strides[0]  # the interleaving vLLM plans
    with pytest.raises(
        SpecError, match=r"every layer of slot 0 must agree on head slots and page under LHBNC"
    ):
        kvlayout_spec(built)


# ---- bad input: refused with the group/layer and the field named
@pytest.fixture(scope="module")
def full_built() -> Built:
    return build(next(c for c in CASES if c.name == "BLHNC:full-bf16"))


def _config(built: Built, **changes: Any) -> Any:
    return replace(built.config, **changes)


def test_unknown_layout_refused(full_built: Built) -> None:
    with pytest.raises(SpecError, match=r"kv_cache_layout = 'HBLNC': unknown vLLM layout; valid: LBHNC"):
        spec_from_kv_cache_config(full_built.config, "HBLNC")
    with pytest.raises(
        SpecError, match=r"kv_cache_layout = 'LBHNC': differs from the layout the KVCacheConfig"
    ):
        spec_from_kv_cache_config(full_built.config, "LBHNC")
    cfg = _config(full_built, kv_cache_layout=None)
    with pytest.raises(SpecError, match=r"kv_cache_layout = None: not given and not resolved"):
        spec_from_kv_cache_config(cfg)
    assert spec_from_kv_cache_config(full_built.config).layout == "BLHNC"  # the config's own layout
    assert spec_from_kv_cache_config(full_built.config, I.KVCacheLayout.BLHNC).layout == "BLHNC"
    assert [layout_name(x) for x in ("HND", "NHD", I.KVCacheLayout.BHLNC)] == ["LBHNC", "LBNHC", "BHLNC"]


def test_unknown_spec_kind_refused(full_built: Built) -> None:
    g = full_built.config.kv_cache_groups[0]
    chunked = I.ChunkedLocalAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16, attention_chunk_size=64
    )
    cfg = _config(full_built, kv_cache_groups=[replace(g, kv_cache_spec=chunked)])
    with pytest.raises(
        SpecError,
        match=r"kv_cache_groups\[0\]\['model.layers.0.attn'\]\.kv_cache_spec = "
        r"'ChunkedLocalAttentionSpec': kvlayout does not represent this spec kind",
    ):
        spec_from_kv_cache_config(cfg)


def test_specs_kvlayout_cannot_express_refused(full_built: Built) -> None:
    g = full_built.config.kv_cache_groups[0]
    for spec, message in (
        (
            _full(tokens_per_state=Fraction(2, 3)),
            r"\.tokens_per_state = Fraction\(2, 3\): must be a whole number",
        ),
        (_full(dtype=torch.float64), r"\.dtype = torch.float64: no kvlayout dtype"),
        (
            _full(tokens_per_state=3),
            r": layer 'model.layers.0.attn'\.tokens_per_state = 3: block_size 16 is not",
        ),
        (_mamba(num_heads=2), r"\.num_heads = 2: a Mamba state page has one head slot"),
    ):
        cfg = _config(full_built, kv_cache_groups=[replace(g, kv_cache_spec=spec)])
        with pytest.raises(SpecError, match=r"^kv_cache_groups\[0\]\['model.layers.0.attn'\]" + message):
            spec_from_kv_cache_config(cfg)


def test_non_uniform_group_refused(full_built: Built) -> None:
    g = full_built.config.kv_cache_groups[0]
    names = g.layer_names
    mixed = I.UniformTypeKVCacheSpecs(
        block_size=16, kv_cache_specs={names[0]: _full(), names[1]: _full(bs=32), names[2]: _full()}
    )
    with pytest.raises(
        SpecError, match=r"kv_cache_groups\[0\]\['model.layers.1.attn'\]\.block_size = 32: differs"
    ):
        spec_from_kv_cache_config(_config(full_built, kv_cache_groups=[replace(g, kv_cache_spec=mixed)]))
    kinds = I.UniformTypeKVCacheSpecs(
        block_size=16, kv_cache_specs={names[0]: _full(), names[1]: _mamba(), names[2]: _full()}
    )
    with pytest.raises(
        SpecError, match=r"\['model.layers.1.attn'\]\.kv_cache_spec = 'MambaSpec': not of the uniform"
    ):
        spec_from_kv_cache_config(_config(full_built, kv_cache_groups=[replace(g, kv_cache_spec=kinds)]))


def test_mixed_pages_where_vllm_requires_uniform_refused() -> None:
    built = build(next(c for c in CASES if c.name == "BLHNC:mixed-heads-one-group"))
    cfg = replace(built.config, kv_cache_layout="BHLNC")
    with pytest.raises(
        SpecError,
        match=r"\['model.layers.1.attn'\]\.page_size_bytes = 1024: BHLNC cannot express "
        r"mixed page sizes \[512, 1024\]",
    ):
        spec_from_kv_cache_config(cfg)


def test_backing_tensor_smaller_than_the_plan_refused(full_built: Built) -> None:
    t = full_built.config.kv_cache_tensors
    small = [replace(x, size=x.size - 4) for x in t]
    with pytest.raises(
        SpecError,
        match=r"kv_cache_tensors\[0\]\.size = \d+: smaller than the \d+ B kvlayout's "
        r"BLHNC plan needs",
    ):
        spec_from_kv_cache_config(_config(full_built, kv_cache_tensors=small))
    uneven = [t[0], replace(t[0], size=t[0].size * 2, layers=[])]
    with pytest.raises(SpecError, match=r"kv_cache_tensors\[1\]\.size = \d+: differs"):
        spec_from_kv_cache_config(_config(full_built, kv_cache_tensors=uneven))


def test_misplaced_tensor_refused(full_built: Built) -> None:
    (t,) = full_built.config.kv_cache_tensors
    for changes, what in (
        ({"offset": 4}, "offset"),
        ({"block_stride": t.block_stride + 4}, "block_stride"),
        ({"layer_stride": t.layer_stride * 2}, "offset"),
    ):
        cfg = _config(full_built, kv_cache_tensors=[replace(t, **changes)])
        with pytest.raises(SpecError, match=rf"kv_cache_tensors\[0\]\.{what} = "):
            spec_from_kv_cache_config(cfg)


def test_layers_without_tensors_refused(full_built: Built) -> None:
    g = full_built.config.kv_cache_groups[0]
    extra = replace(g, layer_names=[*g.layer_names, "model.layers.9.attn"])
    with pytest.raises(
        SpecError, match=r"kv_cache_groups\[0\]\['model.layers.9.attn'\] = .*no KVCacheTensor holds"
    ):
        spec_from_kv_cache_config(_config(full_built, kv_cache_groups=[extra]))
    ok = spec_from_kv_cache_config(
        _config(full_built, kv_cache_groups=[extra]), runner_only_attn_layers={"model.layers.9.attn"}
    )
    assert [layer.name for _, layer in ok.layers] == g.layer_names
    with pytest.raises(SpecError, match=r"kernel_block_sizes = \[16, 16\]: needs one entry per cache group"):
        spec_from_kv_cache_config(full_built.config, kernel_block_sizes=[16, 16])


def test_host_resident_refused(full_built: Built) -> None:
    (t,) = full_built.config.kv_cache_tensors
    cfg = _config(full_built, kv_cache_tensors=[replace(t, host_resident=True)])
    with pytest.raises(SpecError, match=r"kv_cache_tensors\[0\]\.host_resident = True"):
        spec_from_kv_cache_config(cfg)


# ---- the drop-in KVBlockZeroer (kvlayout's cuda backend; here under Triton's interpreter)
@pytest.fixture(scope="module")
def dsv4_built() -> Built:
    return build(next(c for c in CASES if c.name == "BLHNC:full+swa-3-groups"))


def _dropin(built: Built) -> KVBlockZeroer:
    return KVBlockZeroer.from_kv_caches(
        built.config, built.extra["caches"], built.layout, kernel_block_sizes=built.kernel_block_sizes
    )


def test_dropin_clears_vllms_bytes_and_one_group_at_a_time(dsv4_built: Built) -> None:
    z = _dropin(dsv4_built)
    poison = K.poison_pattern(dsv4_built.buffer.numel(), seed=3)
    vt = dsv4_built.vllm_table()
    n = dsv4_built.num_blocks
    assert len(z.group_names) == len(dsv4_built.config.kv_cache_groups) > 1
    for group in (None, *range(len(z.group_names))):
        for ids in ([0], [n - 1, 1], list(range(n))):
            dsv4_built.buffer.copy_(torch.from_numpy(poison))
            z.zero_block_ids(ids, group)
            after = dsv4_built.buffer.numpy()
            expected = poison.copy()
            K.zero_blocks_numpy(expected, z.table, ids, group=z.group_name(group))
            assert np.array_equal(after, expected), (group, ids)
            if group is None:  # every group: exactly the bytes of vLLM's own segments
                changed = _ranges(K.merge_ranges(*np.array(vllm_bytes(vt, ids)).T))
                assert _ranges(K.expected_zeroed(z.table, ids)) == changed
    # overlaid groups share tensors: each group's bytes lie inside the all-group bytes
    every = K.expected_zeroed(z.table, list(range(n)))
    for g in z.group_names:
        for a, b in K.expected_zeroed(z.table, list(range(n)), group=g).tolist():
            assert any(lo <= a and b <= hi for lo, hi in every.tolist()), (g, a, b)


def test_dropin_refuses_what_vllm_writes_past_the_buffer(dsv4_built: Built) -> None:
    z = _dropin(dsv4_built)
    poison = K.poison_pattern(dsv4_built.buffer.numel(), seed=4)
    dsv4_built.buffer.copy_(torch.from_numpy(poison))
    n = dsv4_built.num_blocks
    for bad, err in (([0, n], BlockIdError), ([-1], BlockIdError), ([0], BlockIdError)):
        with pytest.raises(err):
            z.zero_block_ids(bad, group=len(z.group_names) if bad == [0] else None)
    with pytest.raises(K.TableError, match="unknown group"):
        z.zero_block_ids([0], group="nope")
    z.warmup()  # compiles every group's launch and writes nothing
    assert np.array_equal(dsv4_built.buffer.numpy(), poison)


def test_dropin_needs_one_allocation(dsv4_built: Built) -> None:
    caches = dict(dsv4_built.extra["caches"])
    name = list(caches)[-1]
    caches[name] = caches[name].clone()
    with pytest.raises(SpecError, match=rf"kv_caches\['{name}'\] = 'another storage'"):
        KVBlockZeroer.from_kv_caches(dsv4_built.config, caches, dsv4_built.layout)


# ---- vLLM's own Triton kernel under the interpreter, against kvlayout's reference
def _interpret_cases() -> list[Case]:
    return [c for c in CASES if c.interpret and not c.refused]


def _ids(n: int) -> list[int]:
    return sorted({0, 2 % n, n - 1})


def run_driver() -> Iterator[dict[str, Any]]:
    """Driver process: zero with vLLM's kernel and with kvlayout's reference on the same bytes."""
    for case in _interpret_cases():
        built = build(case)
        table = K.plan(kvlayout_spec(built))
        poison = K.poison_pattern(built.buffer.numel(), seed=len(case.name))
        built.buffer.copy_(torch.from_numpy(poison))
        ids = _ids(built.num_blocks)
        built.zeroer.zero_block_ids(ids)
        theirs = built.buffer.numpy().copy()
        ours = poison.copy()
        K.zero_blocks_numpy(ours, table, ids)
        diff = np.flatnonzero(theirs != ours)
        # the drop-in (kvlayout's cuda backend under the interpreter) on the same poisoned bytes
        built.buffer.copy_(torch.from_numpy(poison))
        kbs = built.kernel_block_sizes
        dropin = KVBlockZeroer(built.config, built.buffer, built.layout, kernel_block_sizes=kbs)
        dropin.zero_block_ids(ids)
        dropin_diff = np.flatnonzero(built.buffer.numpy() != theirs)
        yield {
            "case": case.name,
            "ids": ids,
            "zeroed": int((theirs != poison).sum()),
            "differ": int(diff.size),
            "first": int(diff[0]) if diff.size else None,
            "dropin_differ": int(dropin_diff.size),
        }


def test_vllm_triton_kernel_under_the_interpreter_equals_the_reference() -> None:
    # started at import, unless another test file imported this module first with the driver off
    # (tests/test_vllm_plugin.py borrows its builders): then it starts now
    driver = _DRIVER if _DRIVER is not None else start_driver(_HERE, __name__, _DRIVER_ENV)
    assert driver is not None
    out, err = driver.communicate(timeout=600)
    assert driver.returncode == 0, err[-4000:]
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["case"] for r in results] == [c.name for c in _interpret_cases()], err[-2000:]
    assert {c.layout for c in _interpret_cases()} == set(LAYOUTS)
    for r in results:
        assert r["differ"] == 0 and r["zeroed"] > 0 and r["dropin_differ"] == 0, r


def _main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "the driver needs TRITON_INTERPRET=1"
    for result in run_driver():
        print(json.dumps(result), flush=True)


if __name__ == "__main__" and "--driver" in sys.argv:
    _main()
