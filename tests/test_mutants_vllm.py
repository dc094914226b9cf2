"""The vLLM adapter's rules that mutation testing found unpinned (issue 25).

Each test pins a rule of :mod:`kvlayout.integrations.vllm` that a surviving mutant of
``scripts/mutation.sh vllm`` broke: the full ``field = value: why`` of every refusal (the field,
the value and the valid choices are what a user reads), the fields of the kvlayout layer read
from each kind of vLLM spec, the byte ranges of strided views, which view the common storage
offset comes from, and the drop-in zeroer's arguments reaching the planner and the cuda backend.
vLLM 0.33.0's own objects on the CPU (the cuda backend under Triton's interpreter).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
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
from kvlayout.integrations import vllm as V  # noqa: E402
from kvlayout.spec import DTYPE_SIZES, KV_CACHE_LAYOUTS  # noqa: E402

NAMES = ["model.layers.0.attn", "model.layers.1.attn"]
ATTN = I.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)  # 1,024 B
TENSOR = I.KVCacheTensor(size=8192, layers=NAMES, layer_stride=1024, block_stride=2048)
CONFIG = I.KVCacheConfig(
    num_blocks=4,
    kv_cache_tensors=[TENSOR],
    kv_cache_groups=[I.KVCacheGroupSpec(NAMES, ATTN)],
    kv_cache_layout="BLHNC",
)
LEAD = 4096


def refused(exc: type[Exception], call: Any, field: str, value: Any, message: str) -> None:
    """``call()`` raises ``exc`` with exactly ``message``, naming ``field`` and ``value``."""
    with pytest.raises(exc) as info:
        call()
    assert str(info.value) == message
    assert (info.value.field, info.value.value) == (field, value)  # type: ignore[attr-defined]


def views_of(
    config: Any, spec: Any, lead: int = LEAD, tail: int = 4096
) -> tuple[torch.Tensor, dict[str, Any]]:
    """vLLM's BLHNC views of ``config``'s one tensor, ``lead`` bytes into a poisoned uint8 storage."""
    (t,) = config.kv_cache_tensors
    storage = torch.from_numpy(K.poison_pattern(lead + t.size + tail, seed=3))
    raw = storage.view(torch.int8)[lead : lead + t.size]
    views = I.create_kv_cache_views(raw, spec, config.num_blocks, I.KVCacheLayout.BLHNC, t)
    return storage, dict(zip(t.layers, views))


def shifted(view: torch.Tensor, elements: int) -> torch.Tensor:
    return view.as_strided(view.shape, view.stride(), view.storage_offset() + elements)


def case(name: str) -> Any:
    return G.build(next(c for c in G.CASES if c.name == name))


# --------------------------------------------------------------------------- small readers
def test_layout_dtype_and_state_readers() -> None:
    valid = ", ".join(KV_CACHE_LAYOUTS)
    refused(
        SpecError,
        lambda: V.layout_name("XYZ"),
        "kv_cache_layout",
        "XYZ",
        f"kv_cache_layout = 'XYZ': unknown vLLM layout; valid: {valid}",
    )
    assert (
        V.layout_name("NHD") == "LBNHC"
        and V.layout_name("HND") == "LBHNC"
        and V.layout_name(I.KVCacheLayout.BHLNC) == "BHLNC"
    )
    # a config object without the field (no resolved layout) takes the argument, or is refused
    bare = SimpleNamespace()
    assert V._resolve_layout(bare, "BHLNC") == "BHLNC"
    refused(
        SpecError,
        lambda: V._resolve_layout(bare, None),
        "kv_cache_layout",
        None,
        "kv_cache_layout = None: not given and not resolved in the KVCacheConfig",
    )
    refused(
        SpecError,
        lambda: V._dtype("w", torch.float64),
        "w.dtype",
        torch.float64,
        f"w.dtype = torch.float64: no kvlayout dtype; valid: {', '.join(DTYPE_SIZES)}",
    )
    assert V._is_torch_dtype(torch.bfloat16)
    assert not V._is_torch_dtype(torch.device("cpu"))  # torch's, but no dtype
    assert not V._is_torch_dtype(type("dtype", (), {})())  # named dtype, but not torch's
    refused(
        SpecError,
        lambda: V._check_dtypes("w", SimpleNamespace(), "mamba"),
        "w.dtypes",
        None,
        "w.dtypes = None: must be a tuple of torch.dtype",
    )
    refused(
        SpecError,
        lambda: V._check_dtypes("w", SimpleNamespace(), "full"),
        "w.dtype",
        None,
        "w.dtype = None: must be a torch.dtype (e.g. torch.bfloat16)",
    )
    # tokens_per_state: 1 is the default (None), k > 1 compresses, 1/k is k states per token
    assert [V._states("w", x) for x in (1, 2, 4, Fraction(1, 4))] == [
        (None, None),
        (2, None),
        (4, None),
        (None, 4),
    ]
    refused(
        SpecError,
        lambda: V._states("w", 0),
        "w.tokens_per_state",
        0,
        "w.tokens_per_state = 0: must be a whole number >= 1 or 1/k",
    )
    refused(
        SpecError,
        lambda: V._states("w", "x"),
        "w.tokens_per_state",
        "x",
        "w.tokens_per_state = 'x': must be a whole number or 1/k",
    )


def _alignment(value: Any) -> SimpleNamespace:
    def get() -> Any:
        if isinstance(value, Exception):
            raise value
        return value

    return SimpleNamespace(get_block_stride_alignment=get, block_stride_alignment="as given")


def test_stride_alignment_and_padding_readers() -> None:
    assert [V._stride_alignment("w", _alignment(a)) for a in (1, 2, 4096)] == [None, 2, 4096]
    refused(
        SpecError,
        lambda: V._stride_alignment("w", _alignment(ValueError("no kernel size"))),
        "w.block_stride_alignment",
        "as given",
        "w.block_stride_alignment = 'as given': vLLM cannot resolve it: no kernel size",
    )
    pad = V._padding
    assert pad(SimpleNamespace(), 1000) == {}  # neither attribute (older spec classes)
    assert pad(SimpleNamespace(page_size_padded=None, alignment=None), 1000) == {}
    assert pad(SimpleNamespace(page_size_padded=1024, alignment=None), 1000) == {"padded_page": 1024}
    assert pad(SimpleNamespace(page_size_padded=1152, alignment=576), 1000) == {"alignment": 576}
    assert pad(SimpleNamespace(page_size_padded=None, alignment=500), 1000) == {"alignment": 500}
    assert pad(SimpleNamespace(page_size_padded=None, alignment=576), 1000) == {}
    assert pad(SimpleNamespace(page_size_padded=2048, alignment=576), 1000) == {"padded_page": 2048}


# --------------------------------------------------------------------------- one layer
def test_layer_fields_of_each_vllm_spec_kind() -> None:
    layer = V._layer
    mla = layer(
        "w", "m", I.MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=24, dtype=torch.bfloat16)
    )
    assert (mla.token_bytes, mla.num_head_slots, mla.window) == (None, None, None)
    slots = I.MLAAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=24, dtype=torch.bfloat16, num_head_slots=2
    )
    assert layer("w", "m", slots).num_head_slots == 2
    for extra in ({"state_content_bytes": 64}, {"head_size_v": 8}):  # explicit bytes per token
        vs = I.MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=24, dtype=torch.bfloat16, **extra)
        assert layer("w", "m", vs).token_bytes == vs.state_content_size_bytes, extra
    swa_mla = I.SlidingWindowMLASpec(
        block_size=16, num_kv_heads=1, head_size=24, dtype=torch.bfloat16, sliding_window=64
    )
    assert layer("w", "m", swa_mla).window == 64
    full = layer("w", "a", ATTN)
    assert type(full) is K.FullAttentionSpec and full.head_size_v is None  # V head size = K head size
    swa = layer(
        "w",
        "a",
        I.SlidingWindowSpec(
            block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16, sliding_window=32
        ),
    )
    assert type(swa) is K.SlidingWindowSpec and swa.window == 32
    mamba = I.MambaSpec(
        block_size=16, shapes=((3, 40),), dtypes=(torch.bfloat16,), block_stride_alignment=4096
    )
    assert layer("w", "s", mamba).block_stride_alignment == 4096
    refused(
        SpecError,
        lambda: layer("w", "x", object()),
        "w.kv_cache_spec",
        "object",
        "w.kv_cache_spec = 'object': kvlayout does not represent this spec kind; "
        f"supported: {', '.join(V.SUPPORTED_SPECS)}",
    )
    for vs in (ATTN, I.MambaSpec(block_size=16, shapes=((3, 40),), dtypes=(torch.bfloat16,))):
        bad = replace(vs)
        object.__setattr__(bad, "block_stride_alignment", "x")  # vLLM's int() of it fails
        refused(
            SpecError,
            lambda bad=bad: layer("w", "a", bad),
            "w.block_stride_alignment",
            "x",
            "w.block_stride_alignment = 'x': vLLM cannot resolve it: invalid literal for int() with "
            "base 10: 'x'",
        )


def test_layer_refuses_where_vllm_arithmetic_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vLLM whose (H, N, C) or page sizes differ from kvlayout's (another release) is refused."""
    cls = type(ATTN)
    with monkeypatch.context() as m:
        m.setattr(cls, "num_states", property(lambda self: 99))
        refused(
            SpecError,
            lambda: V._layer("w", "a", ATTN),
            "w.num_states",
            (2, 99, 32),
            "w.num_states = (2, 99, 32): vLLM's (H, N, C) differ from kvlayout's (2, 16, 32)",
        )
    with monkeypatch.context() as m:
        m.setattr(cls, "real_page_size_bytes", property(lambda self: 1000))
        refused(
            SpecError,
            lambda: V._layer("w", "a", ATTN),
            "w.page_size_bytes",
            1024,
            "w.page_size_bytes = 1024: kvlayout computes a page of 1024 B (real 1024 B) for this spec",
        )
    with monkeypatch.context() as m:
        m.setattr(cls, "page_size_bytes", property(lambda self: 2048))
        m.setattr(cls, "real_page_size_bytes", property(lambda self: 1024))
        refused(
            SpecError,
            lambda: V._layer("w", "a", ATTN),
            "w.page_size_bytes",
            2048,
            "w.page_size_bytes = 2048: kvlayout computes a page of 1024 B (real 1024 B) for this spec",
        )


# --------------------------------------------------------------------------- groups and configs
def test_group_specs_refusals() -> None:
    swa = I.SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16, sliding_window=32
    )
    big = I.FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)

    def group(names: list[str], specs: dict[str, Any]) -> Any:
        return SimpleNamespace(
            layer_names=names, kv_cache_spec=I.UniformTypeKVCacheSpecs(16, kv_cache_specs=specs)
        )

    refused(
        SpecError,
        lambda: V._group_specs(0, group(["a", "b"], {"a": ATTN}), I),
        "kv_cache_groups[0]['b'].kv_cache_spec",
        None,
        "kv_cache_groups[0]['b'].kv_cache_spec = None: the group has no spec for it",
    )
    refused(
        SpecError,
        lambda: V._group_specs(1, group(["a", "b"], {"a": ATTN, "b": big}), I),
        "kv_cache_groups[1]['b'].block_size",
        32,
        "kv_cache_groups[1]['b'].block_size = 32: differs from 'a''s 16: "
        "vLLM groups layers of one block size",
    )
    refused(
        SpecError,
        lambda: V._group_specs(2, group(["a", "b"], {"a": ATTN, "b": swa}), I),
        "kv_cache_groups[2]['b'].kv_cache_spec",
        "SlidingWindowSpec",
        "kv_cache_groups[2]['b'].kv_cache_spec = 'SlidingWindowSpec': not of the uniform type of 'a' "
        "(FullAttentionSpec): vLLM requires one spec type per group",
    )


def test_mixed_pages_need_block_compact_orders() -> None:
    pages = {(0, "a"): 1024, (1, "b"): 2048}
    refused(
        SpecError,
        lambda: V._check_layout_expresses("LBHNC", pages, 2),
        "kv_cache_groups[1]['b'].page_size_bytes",
        2048,
        "kv_cache_groups[1]['b'].page_size_bytes = 2048: LBHNC cannot express mixed page sizes "
        "[1024, 2048] (several groups); vLLM refuses it too",
    )
    one = {(0, "a"): 1024, (0, "b"): 2048}
    refused(
        SpecError,
        lambda: V._check_layout_expresses("LHBNC", one, 1),
        "kv_cache_groups[0]['b'].page_size_bytes",
        2048,
        "kv_cache_groups[0]['b'].page_size_bytes = 2048: LHBNC cannot express mixed page sizes "
        "[1024, 2048] (heads outside the page); vLLM refuses it too",
    )
    V._check_layout_expresses("LBHNC", one, 1)  # one group: layer-outer orders keep pages whole
    V._check_layout_expresses("BLHNC", pages, 2)


def _duck(**fields: Any) -> SimpleNamespace:
    """CONFIG as plain objects without vLLM's optional fields (host_resident, kv_cache_layout)."""
    t = SimpleNamespace(size=8192, layers=NAMES, layer_stride=1024, block_stride=2048, offset=0)
    g = SimpleNamespace(layer_names=NAMES, kv_cache_spec=ATTN)
    return SimpleNamespace(**{"num_blocks": 4, "kv_cache_tensors": [t], "kv_cache_groups": [g], **fields})


def test_config_refusals_name_the_field_and_value() -> None:
    spec = V.spec_from_kv_cache_config(CONFIG)
    assert V.spec_from_kv_cache_config(_duck(), "BLHNC") == spec  # optional fields may be absent
    read = V.spec_from_kv_cache_config
    g = CONFIG.kv_cache_groups[0]
    refused(
        SpecError,
        lambda: read(replace(CONFIG, kv_cache_tensors=[])),
        "kv_cache_groups",
        1,
        "kv_cache_groups = 1: an attention-free config has no KV cache to plan",
    )
    refused(
        SpecError,
        lambda: read(replace(CONFIG, kv_cache_tensors=[replace(TENSOR, host_resident=True)])),
        "kv_cache_tensors[0].host_resident",
        True,
        "kv_cache_tensors[0].host_resident = True: host-resident (HiSparse) pools are not planned",
    )
    refused(
        SpecError,
        lambda: read(replace(CONFIG, kv_cache_groups=[replace(g, host_resident=True)])),
        "kv_cache_groups[0].host_resident",
        True,
        "kv_cache_groups[0].host_resident = True: host-resident (HiSparse) groups are not planned",
    )
    two = [replace(TENSOR, size=8192, layers=NAMES[:1]), replace(TENSOR, size=4096, layers=NAMES[1:])]
    refused(
        SpecError,
        lambda: read(replace(CONFIG, kv_cache_tensors=two)),
        "kv_cache_tensors[1].size",
        4096,
        "kv_cache_tensors[1].size = 4096: differs from 8192: vLLM shares one backing allocation",
    )
    twice = [TENSOR, replace(TENSOR, layers=NAMES[:1])]
    refused(
        SpecError,
        lambda: read(replace(CONFIG, kv_cache_tensors=twice)),
        "kv_cache_tensors[1].layers",
        NAMES[0],
        f"kv_cache_tensors[1].layers = {NAMES[0]!r}: the layer is placed by two tensors",
    )
    extra = replace(CONFIG, kv_cache_groups=[g, I.KVCacheGroupSpec(["shared"], ATTN)])
    refused(
        SpecError,
        lambda: read(extra),
        "kv_cache_groups[1]['shared']",
        "shared",
        "kv_cache_groups[1]['shared'] = 'shared': no KVCacheTensor holds this layer "
        "(pass it in runner_only_attn_layers if it shares another's cache)",
    )
    refused(
        SpecError,
        lambda: read(extra, runner_only_attn_layers=["shared"]),
        "kv_cache_groups[1].layer_names",
        ["shared"],
        "kv_cache_groups[1].layer_names = ['shared']: no layer owns a tensor",
    )
    refused(
        SpecError,
        lambda: read(replace(CONFIG, kv_cache_groups=[replace(g, layer_names=NAMES[:1])])),
        "kv_cache_tensors[0].layers",
        NAMES[1],
        f"kv_cache_tensors[0].layers = {NAMES[1]!r}: the layer belongs to no cache group",
    )


def test_refusals_from_kvlayout_keep_its_field_and_value() -> None:
    g = CONFIG.kv_cache_groups[0]
    three = I.FullAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16, tokens_per_state=3
    )
    with pytest.raises(SpecError) as info:  # kvlayout's layer check, the group and layer added
        V.spec_from_kv_cache_config(replace(CONFIG, kv_cache_groups=[replace(g, kv_cache_spec=three)]))
    assert str(info.value).startswith(f"kv_cache_groups[0][{NAMES[0]!r}]: ")
    assert (info.value.field, info.value.value) == (f"layer {NAMES[0]!r}.tokens_per_state", 3)
    built = case("LHBNC:attn+mamba")  # kvlayout's planner refuses it (head slots of slot 0)
    with pytest.raises(SpecError) as info:
        V.spec_from_kv_cache_config(built.config, built.layout)
    assert str(info.value).startswith("vLLM KVCacheConfig under LHBNC: ")
    inner = str(info.value).removeprefix("vLLM KVCacheConfig under LHBNC: ")
    assert inner.startswith(f"{info.value.field} = ") and info.value.field is not None
    assert info.value.value is not None and repr(info.value.value) in inner


def test_tensor_placements_refused_name_the_layer() -> None:
    read = V.spec_from_kv_cache_config
    refused(
        SpecError,
        lambda: read(replace(CONFIG, kv_cache_tensors=[replace(TENSOR, layer_stride=1536)])),
        "kv_cache_tensors[0].offset",
        0,
        f"kv_cache_tensors[0].offset = 0: vLLM puts block 0 of kv_cache_groups[0] layer {NAMES[1]!r} at "
        "byte 1536, kvlayout's BLHNC plan at 1024: kvlayout cannot represent this placement",
    )
    refused(
        SpecError,
        lambda: read(replace(CONFIG, kv_cache_tensors=[replace(TENSOR, block_stride=4096)])),
        "kv_cache_tensors[0].block_stride",
        4096,
        f"kv_cache_tensors[0].block_stride = 4096: kvlayout's BLHNC plan strides blocks of "
        f"kv_cache_groups[0] layer {NAMES[0]!r} by 2048 B",
    )


# --------------------------------------------------------------------------- vLLM's own zeroer
def _meta(*cols: Any) -> SimpleNamespace:
    return SimpleNamespace(_meta=cols)


def test_table_from_block_zeroer_rows_and_refusals() -> None:
    read = V.table_from_block_zeroer
    t = read(_meta([1000, 2024], [512, 512], [256, 256], 1, 256, 2), 1000, 8192, 4)
    assert t.segments == (
        K.Segment(0, 2048, 1024, "vllm", "segment0", "page", 0),
        K.Segment(1024, 2048, 1024, "vllm", "segment1", "page", 0),
    )
    empty = read(SimpleNamespace(), 1000, 8192, 4)  # a zeroer without _meta: no rows
    assert (len(empty), empty.total_bytes, empty.num_blocks) == (0, 8192, 4)
    assert len(read(_meta([], [], [], 0, 256, 0), 1000, 8192, 4)) == 0  # no segment: no chunk needed
    fields = ", ".join(V.META_FIELDS)
    refused(
        TableError,
        lambda: read(SimpleNamespace(_meta=7), 0, 8192, 4),
        "zeroer._meta",
        "int",
        f"zeroer._meta = int: must be a tuple ({fields})",
    )


# --------------------------------------------------------------------------- views
def test_view_block_ranges_of_strided_views() -> None:
    ranges = V._view_block_ranges
    h = torch.zeros(64, dtype=torch.int16)
    stride, r = ranges("w", h.as_strided((4, 3), (8, 2), 5), 4)  # every other element, 10 B in
    assert stride == 16 and r.tolist() == [[10, 12], [14, 16], [18, 20]]
    stride, r = ranges("w", h[:64].view(8, 8), 4)  # kernel blocks: manager block 0 = rows 0 and 1
    assert stride == 32 and r.tolist() == [[0, 32]]
    stride, r = ranges("w", h[:8], 8)  # one element per block
    assert stride == 2 and r.tolist() == [[0, 2]]
    stride, r = ranges("w", h[:8].view(1, 8), 1)  # one block
    assert stride == 16 and r.tolist() == [[0, 16]]
    refused(
        SpecError,
        lambda: ranges("w", h[0], 4),
        "w.shape",
        (),
        "w.shape = (): dim 0 must be a positive multiple of the 4 blocks (kernel blocks per block)",
    )
    refused(
        SpecError,
        lambda: ranges("w", h[:0].view(4, 0, 2), 4),
        "w.shape",
        (4, 0, 2),
        "w.shape = (4, 0, 2): an empty view holds no page",
    )
    b = torch.zeros(2 * V.MAX_VIEW_RUNS + 70_000, dtype=torch.uint8)
    _, r = ranges("w", b.as_strided((1, V.MAX_VIEW_RUNS), (1, 2)), 1)  # as many runs as allowed
    assert len(r) == V.MAX_VIEW_RUNS and r[-1].tolist() == [2 * V.MAX_VIEW_RUNS - 2, 2 * V.MAX_VIEW_RUNS - 1]
    _, r = ranges("w", b[:70_000].view(1, 70_000), 1)  # contiguous: one run, however long
    assert r.tolist() == [[0, 70_000]]
    _, r = ranges("w", b[:70_000].view(1, 2, 35_000), 1)
    assert r.tolist() == [[0, 70_000]]
    refused(
        SpecError,
        lambda: ranges("w", b.as_strided((1, 300, 300), (1, 400, 2)), 1),
        "w.stride",
        (1, 400, 2),
        f"w.stride = (1, 400, 2): 90000 runs per block: more than {V.MAX_VIEW_RUNS}",
    )


def test_common_offset_is_the_one_most_views_agree_on() -> None:
    names = [f"model.layers.{i}.attn" for i in range(3)]
    t3 = I.KVCacheTensor(size=12288, layers=names, layer_stride=1024, block_stride=3072)
    cfg = replace(CONFIG, kv_cache_tensors=[t3], kv_cache_groups=[I.KVCacheGroupSpec(names, ATTN)])
    storage, views = views_of(cfg, ATTN)
    layout = K.plan_layout(V.spec_from_kv_cache_config(cfg))
    n = storage.numel()
    assert V.check_views_against_layout(layout, views, n) == LEAD
    off = dict(views, **{names[0]: shifted(views[names[0]], 2)})  # the first view 4 B off: it is named
    refused(
        SpecError,
        lambda: V.check_views_against_layout(layout, off, n),
        f"kv_caches[{names[0]!r}].storage_offset",
        LEAD // 2 + 2,
        f"kv_caches[{names[0]!r}].storage_offset = {LEAD // 2 + 2}: block 0 covers storage bytes "
        "[(4100, 5124)], kvlayout's BLHNC plan puts this layer at [(4096, 5120)] (the cache starting at "
        "storage byte 4096, where 2 of 3 views put it)",
    )
    # a view inside its layer's bytes but not all of them, given as a tensor: refused (a tuple: accepted)
    half = views[names[1]][:, :1]
    part = dict(views, **{names[1]: half})
    with pytest.raises(SpecError, match=rf"^kv_caches\[{names[1]!r}\]\.storage_offset = "):
        V.check_views_against_layout(layout, part, n)
    assert V.check_views_against_layout(layout, dict(views, **{names[1]: (half,)}), n) == LEAD


def test_state_views_and_optional_layers() -> None:
    storage, views = views_of(CONFIG, ATTN)
    layout = K.plan_layout(V.spec_from_kv_cache_config(CONFIG))
    n = storage.numel()
    v0, v1 = views[NAMES[0]], views[NAMES[1]]
    # only state tuples of layers kvlayout zeroes: nothing fixes the start (issue 25, eighth pass)
    refused(
        SpecError,
        lambda: V.check_views_against_layout(layout, {NAMES[0]: (v0,), NAMES[1]: (v1,)}, n),
        "kv_caches",
        "only lists of tensors",
        "kv_caches = 'only lists of tensors': no layer kvlayout zeroes has a single-tensor view, so nothing "
        "fixes where the cache starts in the storage (vLLM gives each attention layer one tensor)",
    )
    # a single-tensor view fixes it; a state tuple is then checked inside its layer's bytes at that start
    assert V.check_views_against_layout(layout, {NAMES[0]: v0, NAMES[1]: (v1,)}, n) == LEAD
    refused(
        SpecError,
        lambda: V.check_views_against_layout(layout, {NAMES[0]: v0, NAMES[1]: (shifted(v1, 4),)}, n),
        f"kv_caches[{NAMES[1]!r}].storage_offset",
        2564,
        f"kv_caches[{NAMES[1]!r}].storage_offset = 2564: block 0 covers storage bytes [(5128, 6152)], "
        "kvlayout's BLHNC plan puts this layer at [(5120, 6144)] (the cache starting at storage byte 4096, "
        "where 1 of 2 views put it)",
    )
    # a state tensor starting before its layer's bytes (ending inside them) is refused too
    with pytest.raises(SpecError, match=rf"^kv_caches\[{NAMES[1]!r}\]\.storage_offset = 2556:"):
        V.check_views_against_layout(layout, {NAMES[0]: v0, NAMES[1]: (shifted(v1, -4),)}, n)
    # an optional layer without a view is skipped, and the layers after it are still checked
    assert V.check_views_against_layout(layout, {NAMES[1]: v1}, n, optional=NAMES[:1]) == LEAD
    with pytest.raises(SpecError, match="only lists of tensors"):
        V.check_views_against_layout(layout, {NAMES[1]: (v1,)}, n, optional=NAMES[:1])
    refused(
        SpecError,
        lambda: V.check_views_against_layout(layout, {}, n, optional=NAMES),
        "kv_caches",
        0,
        "kv_caches = 0: holds no view of a planned layer",
    )


def test_plan_must_fit_the_storage() -> None:
    layout = K.plan_layout(V.spec_from_kv_cache_config(CONFIG))
    _, views = views_of(CONFIG, ATTN, lead=0)
    ref = views[NAMES[0]]
    small = torch.zeros(4000, dtype=torch.bfloat16)  # 8,000 B: the plan needs 8,192 B from byte 0
    v0 = small.as_strided(ref.shape, ref.stride(), 0)  # layer 0's view ends at byte 7,168: it fits
    refused(
        SpecError,
        lambda: V.check_views_against_layout(layout, {NAMES[0]: v0}, 8000, optional=NAMES[1:]),
        "kv_caches.storage",
        8000,
        "kv_caches.storage = 8000: the 8192 B cache starting at storage byte 0 does not fit the storage",
    )
    early = shifted(
        views[NAMES[1]], -512
    )  # layer 1's block 0 at storage byte 0: the cache would start at -1024
    refused(
        SpecError,
        lambda: V.check_views_against_layout(layout, {NAMES[1]: early}, 12288, optional=NAMES[:1]),
        "kv_caches.storage",
        12288,
        "kv_caches.storage = 12288: the 8192 B cache starting at storage byte -1024 does not fit the storage",
    )


def test_many_runs_are_shown_four_at_a_time() -> None:
    built = G.build(
        G.Case("BHLNC:6-heads", "BHLNC", G._named("attn", [(G._full(heads=6), G.TritonAttentionBackend)] * 2))
    )
    caches = dict(built.extra["caches"])
    name = next(iter(caches))
    caches[name] = shifted(caches[name], 2)
    with pytest.raises(SpecError) as info:
        V.KVBlockZeroer.from_kv_caches(built.config, caches, built.layout)
    got, want = (
        str(info.value)
        .split("block 0 covers storage bytes ")[1]
        .split(", kvlayout's BHLNC plan puts this layer at ")
    )
    assert got.count("(") == 4 and want.split(" (the cache")[0].count("(") == 4


# --------------------------------------------------------------------------- the drop-in zeroer
def test_dropin_passes_its_arguments_to_the_planner_and_backend() -> None:
    unresolved = replace(CONFIG, kv_cache_layout=None)
    storage, views = views_of(CONFIG, ATTN)
    plan = K.plan(V.spec_from_kv_cache_config(CONFIG))
    buf = torch.zeros(8192, dtype=torch.uint8)
    assert V.KVBlockZeroer(unresolved, buf, "BLHNC").table == plan
    z = V.KVBlockZeroer.from_kv_caches(unresolved, views, "BLHNC", max_batch=8)
    assert z.table == plan and z._zeroer.max_batch == 8 and z._zeroer.offset == LEAD
    # runner-only layers (KV sharing) and kernel block sizes reach the planner
    shared = replace(CONFIG, kv_cache_groups=[I.KVCacheGroupSpec([*NAMES, "shared"], ATTN)])
    assert V.KVBlockZeroer(shared, buf, runner_only_attn_layers=["shared"]).table == plan
    assert V.KVBlockZeroer.from_kv_caches(shared, views, runner_only_attn_layers=["shared"]).table == plan
    with pytest.raises(SpecError, match=r"^kv_cache_groups\[0\]\['shared'\] = 'shared': no KVCacheTensor"):
        V.KVBlockZeroer.from_kv_caches(shared, views)
    split = case("LBHNC:split")
    kbs = split.kernel_block_sizes
    want = K.plan(V.spec_from_kv_cache_config(split.config, split.layout, kernel_block_sizes=kbs))
    assert want != K.plan(V.spec_from_kv_cache_config(split.config, split.layout))
    assert V.KVBlockZeroer(split.config, split.buffer, split.layout, kernel_block_sizes=kbs).table == want
    got = V.KVBlockZeroer.from_kv_caches(
        split.config, split.extra["caches"], split.layout, kernel_block_sizes=kbs
    )
    assert got.table == want
    # one layer: one view
    one = I.KVCacheTensor(size=4096, layers=NAMES[:1], layer_stride=1024, block_stride=1024)
    cfg1 = replace(CONFIG, kv_cache_tensors=[one], kv_cache_groups=[I.KVCacheGroupSpec(NAMES[:1], ATTN)])
    _, views1 = views_of(cfg1, ATTN)
    assert V.KVBlockZeroer.from_kv_caches(cfg1, views1)._zeroer.offset == LEAD


def test_dropin_refusals_name_the_field() -> None:
    storage, views = views_of(CONFIG, ATTN)
    make = V.KVBlockZeroer.from_kv_caches
    refused(SpecError, lambda: make(CONFIG, {}), "kv_caches", 0, "kv_caches = 0: holds no tensor")
    refused(
        SpecError,
        lambda: make(CONFIG, views, offset=0),
        "offset",
        0,
        "offset = 0: taken from the views' storage offset; pass the buffer to KVBlockZeroer instead",
    )
    other = dict(views, **{NAMES[1]: views[NAMES[1]].clone()})
    refused(
        SpecError,
        lambda: make(CONFIG, other),
        f"kv_caches[{NAMES[1]!r}]",
        "another storage",
        f"kv_caches[{NAMES[1]!r}] = 'another storage': all layers must view one allocation",
    )
    z = V.KVBlockZeroer(case("BLHNC:full+swa-3-groups").config, torch.zeros(1 << 16, dtype=torch.uint8))
    assert [z.group_name(g) for g in (None, 0, 2, "group1")] == [None, "group0", "group2", "group1"]
    for bad in (True, 1.5, 3, -1):
        refused(
            BlockIdError,
            lambda bad=bad: z.group_name(bad),
            "group",
            bad,
            f"group = {bad!r}: must be a cache group index in [0, 3)",
        )


def test_from_table_builds_the_zeroer_without_vllm() -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(4))
    poison = K.poison_pattern(t.total_bytes, seed=5)
    buf = torch.from_numpy(poison.copy())
    z = V.KVBlockZeroer._from_table(t, buf, max_batch=16)
    assert z.spec is None and z.table is t and z.group_names == t.groups and z._zeroer.max_batch == 16
    g = t.groups[-1]
    z.zero_block_ids([1], g)
    expected = poison.copy()
    K.zero_blocks_numpy(expected, t, [1], group=g)
    assert np.array_equal(buf.numpy(), expected)


def test_a_group_without_rows_checks_host_ids_only() -> None:
    built = case("LBNHC:attn1+mamba")
    z = V.KVBlockZeroer(built.config, built.buffer, built.layout)
    gi = next(i for i, n in enumerate(z.group_names) if n not in z._row_groups)  # the Mamba group
    before = built.buffer.numpy().copy()
    n = z.num_blocks
    for ids in ([0, n - 1], np.array([1]), torch.tensor([2]), torch.tensor([n], device="meta")):
        z.zero_block_ids(ids, gi)  # device ids are not read (nothing to write)
    for bad in ([n], np.array([-1]), torch.tensor([n])):
        with pytest.raises(BlockIdError, match=r"block_ids\[0\]"):
            z.zero_block_ids(bad, gi)
    # CPU tensors NumPy cannot hold: BlockIdError naming block_ids and the tensor's kind (issue 25)
    for bad, kind in ((torch.tensor([1.5], dtype=torch.bfloat16), "torch.bfloat16 torch.strided"),
                      (torch.tensor([1]).to_sparse(), "torch.int64 torch.sparse_coo")):
        refused(BlockIdError, lambda bad=bad: z.zero_block_ids(bad, gi), "block_ids", f"{kind} tensor on cpu",
                f"block_ids = {kind} tensor on cpu: must be a dense integer tensor holding data")
    assert np.array_equal(built.buffer.numpy(), before)


def test_warmup_plans_every_group_with_rows() -> None:
    built = case("BLHNC:full+swa-3-groups")
    z = V.KVBlockZeroer(built.config, built.buffer, built.layout)
    before = built.buffer.numpy().copy()
    z.warmup()
    chunk = z._zeroer._chunk_words
    assert {g for g, c in z._zeroer._plans if c == chunk} == {None, *z.group_names}
    assert np.array_equal(built.buffer.numpy(), before)
    z.check()


def test_layers_of_interleaved_tensors_keep_vllms_byte_order() -> None:
    """Layers are planned in the order of their first byte, whichever tensor places them."""
    small = I.FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)  # 512 B
    ta = I.KVCacheTensor(size=6144, layers=["a0", "a1"], layer_stride=1024, block_stride=1536)
    tb = I.KVCacheTensor(size=6144, layers=["b0"], layer_stride=512, block_stride=1536, offset=512)
    group = I.KVCacheGroupSpec(["a0", "a1", "b0"], small)
    cfg = I.KVCacheConfig(
        num_blocks=4, kv_cache_tensors=[ta, tb], kv_cache_groups=[group], kv_cache_layout="BLHNC"
    )
    spec = V.spec_from_kv_cache_config(cfg)
    assert [layer.name for _, layer in spec.layers] == ["a0", "b0", "a1"]


def _fake_iface(strides: Any) -> SimpleNamespace:
    """vLLM's stride function replaced: returns ``strides`` (or raises it), after checking its call."""

    def compute_layout_strides(
        vspec: Any, num_blocks: int, num_layers: int, layout: Any, *, fixed_strides: tuple[Any, ...]
    ) -> Any:
        assert layout is I.KVCacheLayout.LHBNC and fixed_strides == (5120, 512, None, None, None)
        if isinstance(strides, Exception):
            raise strides
        return strides

    return SimpleNamespace(KVCacheLayout=I.KVCacheLayout, compute_layout_strides=compute_layout_strides)


def test_head_slot_strides_checked_against_vllms() -> None:
    """LHBNC, two heads: vLLM's head-slot stride must be kvlayout's (vLLM's function stubbed)."""
    built = case("LHBNC:full-bf16")
    cfg = built.config
    (t,) = cfg.kv_cache_tensors
    layout = K.plan_layout(V.spec_from_kv_cache_config(cfg, built.layout))
    where_of = {name: (0, li) for li, name in enumerate(t.layers)}
    vspecs = {name: (0, cfg.kv_cache_groups[0].kv_cache_spec) for name in t.layers}
    pitch = layout.placements[0].parts[1].base - layout.placements[0].parts[0].base
    assert pitch == 2560
    V._check_against_tensors(layout, [t], where_of, vspecs, _fake_iface((5120, 512, 2560, 32, 2)))
    name = f"kv_cache_groups[0] layer {t.layers[0]!r}"
    refused(
        SpecError,
        lambda: V._check_against_tensors(
            layout, [t], where_of, vspecs, _fake_iface((5120, 512, 2048, 32, 2))
        ),
        "kv_cache_tensors[0].layer_stride",
        5120,
        f"kv_cache_tensors[0].layer_stride = 5120: vLLM strides the head slots of {name} by 2048 B, "
        "kvlayout by 2560 B",
    )
    refused(
        SpecError,
        lambda: V._check_against_tensors(
            layout, [t], where_of, vspecs, _fake_iface(AssertionError("too narrow"))
        ),
        "kv_cache_tensors[0].layer_stride",
        5120,
        f"kv_cache_tensors[0].layer_stride = 5120: vLLM cannot stride {name}: too narrow",
    )


def test_dropin_ids_and_buffer_stay_on_the_views_device() -> None:
    """Under another torch default device the backing buffer and warm-up ids stay on the views' device."""
    storage, views = views_of(CONFIG, ATTN)
    poison = storage.numpy().copy()
    with torch.device("meta"):
        z = V.KVBlockZeroer.from_kv_caches(CONFIG, views)
        z.warmup()
    assert z._zeroer.buffer.device.type == "cpu"
    z.zero_block_ids([2])
    expected = poison.copy()
    K.zero_blocks_numpy(expected[LEAD : LEAD + 8192], z.table, [2])
    assert np.array_equal(storage.numpy(), expected)


def test_lists_alone_do_not_fix_where_the_cache_starts() -> None:
    """Issue 25's eighth pass: every layer given as a one-tensor list holding its second head slot (inside
    the page, not its start) was accepted at a start 512 B late, and block 0's zeroing cleared 512 B of
    block 1 and left 512 B of block 0. A list's tensors need only lie inside their pages, so a start is
    taken only from single-tensor views; with none (and a layer to zero) the views are refused."""
    storage, views = views_of(CONFIG, ATTN)
    lists = {n: [v[:, 1:]] for n, v in views.items()}
    before = storage.numpy().copy()
    with pytest.raises(SpecError) as info:
        V.KVBlockZeroer.from_kv_caches(CONFIG, lists)
    assert (info.value.field, info.value.value) == ("kv_caches", "only lists of tensors")
    assert "nothing fixes where the cache starts" in str(info.value)
    assert (storage.numpy() == before).all()
    # one single-tensor view fixes the start: the other layer's inner slot is then checked inside its page
    mixed = {NAMES[0]: views[NAMES[0]], NAMES[1]: [views[NAMES[1]][:, 1:]]}
    z = V.KVBlockZeroer.from_kv_caches(CONFIG, mixed)
    z.zero_block_ids([0])
    got = K.changed_ranges(before, storage.numpy()).tolist()
    assert got == [[LEAD, LEAD + 2048]]


def test_mamba_states_alone_start_at_their_first_tensor() -> None:
    """With only Mamba state views (the attention layers optional), vLLM's first state tensor of the
    first layer starts its page: that is the start (nothing is zeroed in such layers)."""
    built = case("LBNHC:attn1+mamba")
    layout = K.plan_layout(V.spec_from_kv_cache_config(built.config, built.layout))
    caches = dict(built.extra["caches"])
    full = V.check_views_against_layout(layout, caches, built.buffer.untyped_storage().nbytes())
    states = {k: [v] for k, v in caches.items() if k.endswith(".mixer")}  # as lists of state tensors
    assert states and len(states) < len(caches)
    optional = [k for k in caches if k not in states]
    n = built.buffer.untyped_storage().nbytes()
    assert V.check_views_against_layout(layout, states, n, optional=optional) == full


def test_mamba_states_alone_at_a_storage_offset() -> None:
    """Mamba state views alone, ``LEAD`` bytes into a larger storage, the first one not at plan byte 0:
    the cache's start is the first state tensor's storage byte less its plan byte (not the sum, not 0),
    and a state run that leaves its pages is named with the count of views at that start (0: only lists)."""
    built = case("LBNHC:attn1+mamba")
    layout = K.plan_layout(V.spec_from_kv_cache_config(built.config, built.layout))
    caches = dict(built.extra["caches"])
    n = built.buffer.untyped_storage().nbytes()
    big = torch.zeros(LEAD + n + 1024, dtype=torch.int8)

    def moved(v: torch.Tensor, by: int = 0) -> torch.Tensor:
        return big.as_strided(v.shape, v.stride(), v.storage_offset() + LEAD + by)

    mixers = sorted(k for k in caches if k.endswith(".mixer"))
    assert len(mixers) == 2
    first = next(p for p in layout.placements if p.layer.name == mixers[1])
    assert first.parts[0].base > 0  # the second state layer does not start at plan byte 0
    optional = [k for k in caches if k != mixers[1]]
    got = V.check_views_against_layout(layout, {mixers[1]: [moved(caches[mixers[1]])]}, LEAD + n,
                                       optional=optional)
    assert got == LEAD
    both = {k: [moved(caches[k], 800 if k == mixers[1] else 0)] for k in mixers}
    optional = [k for k in caches if k not in both]
    with pytest.raises(SpecError) as info:
        V.check_views_against_layout(layout, both, LEAD + n, optional=optional)
    assert info.value.field == f"kv_caches[{mixers[1]!r}].storage_offset"
    assert str(info.value).endswith(f"(the cache starting at storage byte {LEAD}, where 0 of 2 views put it)")
