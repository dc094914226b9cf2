"""Hostile pass 25 (/tmp/h25): each finding checked against vLLM 0.33's own construction where it is a model
rule (tests/test_models_hybrid_vllm.py's driver, one batched call), each test failing on the code before
its fix.

M1: Qwen2-MoE of one layer with ``use_sliding_window`` true, no ``layer_types`` and ``max_window_layers``
0 was planned sliding; ``Qwen2MoeConfig`` derives ``["full_attention"]`` (layers slide only below
``max_window_layers``), so the engine's one window is withheld and vLLM builds full attention."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout.models as M
from kvlayout.errors import LayoutBufferError, SpecError
from tests.test_hostile_s22 import LLAMA
from tests.test_hostile_s24_models import COHERE2, QWEN2_MOE
from tests.test_models_hybrid_vllm import _kvlayout, vllm_answers

#: one decoder layer, the flag on, no layer_types: the window counts only below max_window_layers
ONE = {**QWEN2_MOE, "num_hidden_layers": 1, "sliding_window": 64}


def _kinds(cfg: dict[str, Any], **kw: Any) -> set[str]:
    ms = M.from_config(cfg, **kw)
    assert isinstance(ms, M.ModelSpec)
    return set(ms.kinds.values())


def test_m1_qwen2_moe_one_layer_below_no_window_layers_is_full() -> None:
    assert _kinds({**ONE, "max_window_layers": 0}) == {"full"}
    assert _kinds({**ONE, "max_window_layers": 1}) == {"sliding"}
    # left out: the class's 28 (the default reader reads it through Qwen2MoeConfig, as vLLM does)
    assert _kinds({k: v for k, v in ONE.items() if k != "max_window_layers"}) == {"sliding"}


def test_m1_l3_are_vllms_construction() -> None:
    """M1, and L3: an explicit float16 / bfloat16 cache unlike the model's dtype (float32 runs in bfloat16)
    was planned; vLLM 0.33's VllmConfig refuses it (``_reject_mismatched_float_kv_cache``)."""
    pytest.importorskip("vllm")
    cases = {
        f"mwl{m}": {
            "config": {**ONE, "max_window_layers": m}, "tp": 1, "kv_cache_dtype": "auto", "gpu_backend": True
        }
        for m in (0, 1)
    }
    dtypes = {"f16_on_bf16": ("bfloat16", "float16"), "bf16_on_bf16": ("bfloat16", "bfloat16"),
              "bf16_on_f32": ("float32", "bfloat16"), "f16_on_f32": ("float32", "float16"),
              "f16_on_f16": ("float16", "float16")}
    for cid, (model, kv) in dtypes.items():
        cfg = {**LLAMA, "torch_dtype": model}
        cases[cid] = {"config": cfg, "tp": 1, "kv_cache_dtype": kv, "gpu_backend": True}
    answers = vllm_answers(cases)
    assert answers["mwl0"]["windows"] == {} and len(answers["mwl1"]["windows"]) == 1
    for cid in ("f16_on_bf16", "f16_on_f32"):  # refused by both, naming the cache dtype here
        assert "is incompatible with" in answers[cid]["error"], answers[cid]
        with pytest.raises(SpecError) as e:
            _kvlayout(cases.pop(cid))
        assert (e.value.field, e.value.value) == ("kv_cache_dtype", "float16")
    for cid, case in cases.items():
        got, want = _kvlayout(case), answers[cid]
        for key in ("block_size", "layers", "blocks", "windows", "groups", "bytes_per_block"):
            assert got[key] == want[key], (cid, key, got[key], want[key])


# ------------------------------------------------------------------- C1: a tuple subclass of rows
class _Turning(tuple):  # type: ignore[type-arg]
    """Rows whose own ``__iter__`` yields themselves for the first ``good`` passes, then ``later``."""

    good = 0
    later: tuple[Any, ...] = ()

    def __iter__(self) -> Any:
        type(self).good -= 1
        return tuple.__iter__(self) if type(self).good >= 0 else iter(type(self).later)


def test_c1_table_rows_are_a_plain_tuple_read_once() -> None:
    """C1 (HIGH): ``SegmentTable`` kept a tuple subclass of rows as given: its ``__iter__`` gave the verifier
    (``require_safe``) a row inside a 2 KiB buffer and the cuda zeroer's plan one at byte 4,096; zeroing
    blocks 0 and 5 wrote bytes [4096, 4104) and [4256, 4264) of the parent, past the view. The rows are now
    read once, at construction, into a plain tuple (the padding likewise)."""
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    import kvlayout as K

    good, bad = K.Segment(0, 32, 8, "a", "L0"), K.Segment(4096, 32, 8, "a", "L0")
    _Turning.good, _Turning.later = 3, (bad,)
    t = K.SegmentTable(total_bytes=2048, num_blocks=64, segments=_Turning((good,)), padding=[])
    parent = torch.full((1 << 13,), 7, dtype=torch.uint8)
    if kc.MODE == "native":
        parent = parent.cuda()
    z = kc.CudaZeroer(t, parent[:2048], graphs=False)
    z.zero([0, 5])
    if kc.MODE == "native":
        torch.cuda.synchronize()
    out = parent.cpu().numpy()
    assert (out[2048:] == 7).all()
    assert sorted(set(range(2048)) - set(np.flatnonzero(out[:2048] == 7).tolist())) == [
        *range(0, 8), *range(160, 168)
    ]
    assert type(t.segments) is tuple and type(t.padding) is tuple


# ------------------------------------------------------------------- V1: kv_caches read more than once
def test_v1_from_kv_caches_reads_the_mapping_once() -> None:
    """V1 (HIGH): ``KVBlockZeroer.from_kv_caches`` read ``kv_caches`` three times (subclass check, storage
    check, placement): a mapping giving vLLM's plain views to the first read and tensor subclasses whose
    ``storage_offset()`` says 1,024 elements further on to the later ones passed the pass-24 check, and
    zeroing block 0 cleared storage bytes [6144, 8192), block 1's, where block 0 is [4096, 6144). Now read
    once into a plain dict (lists and tuples into plain tuples)."""
    pytest.importorskip("vllm")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    if kc.MODE == "native":
        pytest.skip("CPU views: interpreter only")
    from collections.abc import Iterator, Mapping

    import torch

    import kvlayout as K
    from kvlayout.integrations.vllm import KVBlockZeroer
    from tests.test_vllm_hostile import CONFIG, _storage_views

    class Shifted(torch.Tensor):
        def storage_offset(self) -> int:
            return int(super().storage_offset()) + 1024

    class Turning(Mapping[str, Any]):
        """vLLM's views to the first read, the subclass's after."""

        def __init__(self, plain: dict[str, Any], lying: dict[str, Any]) -> None:
            self.plain, self.lying, self.reads = plain, lying, 0

        def _src(self) -> dict[str, Any]:
            self.reads += 1
            return self.plain if self.reads == 1 else self.lying

        def __getitem__(self, k: str) -> Any:
            return self._src()[k]

        def __iter__(self) -> Iterator[str]:
            return iter(self.plain)

        def __len__(self) -> int:
            return len(self.plain)

        def items(self) -> Any:
            src = self._src()
            return [(k, src[k]) for k in self.plain]

    storage, views = _storage_views()
    before = storage.clone()
    lying = {name: v.as_subclass(Shifted) for name, v in views.items()}
    KVBlockZeroer.from_kv_caches(CONFIG, Turning(views, lying)).zero_block_ids([0])
    assert K.changed_ranges(before.numpy(), storage.numpy()).tolist() == [[4096, 6144]]


# ------------------------------------------------------------------- D1: read-only memory behind lying flags
def test_d1_from_dlpack_reads_an_ndarray_subclass_as_the_plain_array() -> None:
    """D1 (HIGH): ``CudaZeroer.from_dlpack`` asked the array's own ``flags`` whether it is writeable: an
    ndarray subclass saying so over ``np.frombuffer(bytes)`` (read-only) was imported, and zeroing blocks 0
    and 1 wrote zeros into the immutable ``bytes`` object. Now read as the plain array it is: refused."""
    kc = pytest.importorskip("kvlayout.backends.cuda")
    if kc.MODE == "native":
        pytest.skip("host memory: interpreter only")
    import kvlayout as K
    from tests.test_hostile_s24 import _ContiguousArray

    data = bytes([7]) * 4096
    lying = np.frombuffer(data, np.uint8).view(_ContiguousArray)
    assert lying.flags.writeable  # what it says
    t = K.SegmentTable(total_bytes=2048, num_blocks=64, segments=(K.Segment(0, 32, 8, "a", "L0"),))
    said = r"^buffer = _ContiguousArray \(read-only\): zeroing writes in place; pass writeable memory"
    with pytest.raises(LayoutBufferError, match=said):
        kc.CudaZeroer.from_dlpack(lying, t, graphs=False).zero([0, 1])
    assert data == bytes([7]) * 4096


# ------------------------------------------------------------------- L1: messages naming the config field
def test_l1_plamo3_window_past_the_config_limit_is_named_by_its_field() -> None:
    """L1 (LOW): a PLaMo 3 window of 2**70 was refused as ``layer 'model.layers.layers.0.mixer.attn'.window``
    (the planned spec's check), not by the config entry written; now as the other config integers are."""
    from kvlayout.errors import SpecError
    from tests.test_models_plamo3 import BASE as PLAMO3

    with pytest.raises(SpecError) as e:
        M.from_config({**PLAMO3, "interleaved_sliding_window": [2**70] * 8})
    assert e.value.field == "config.interleaved_sliding_window[0]" and e.value.value == 2**70


# ------------------------------------------------------------------- M2: an EAGLE-3 draft's layer offset
def test_m2_target_layer_count_beside_layer_types_is_refused() -> None:
    """M2 (HIGH): ``target_layer_count`` in a Llama (or DeciLM) config.json with ``layer_types``: vLLM's
    ``LlamaAttention`` reads layer i's type at ``i - target_layer_count`` (an EAGLE-3 draft's offset,
    wrapping below 0), so with [sliding, full, full, full] and 1 vLLM slides layer 1 where kvlayout planned
    layer 0 sliding (groups in another order). Refused, naming the field; vLLM's shift shown below."""
    from kvlayout.errors import SpecError
    from tests.test_hostile_s22 import LLAMA
    from tests.test_models_nemotron_nas import BASE, _blocks

    s, f = "sliding_attention", "full_attention"
    llama = {**LLAMA, "sliding_window": 64, "layer_types": [s, f, f, f], "target_layer_count": 1}
    nas = {**BASE, "sliding_window": 64, "layer_types": [s, f, f, f, f, f], "target_layer_count": 1,
           "block_configs": _blocks([2] * 6)}
    for cfg in (llama, nas):
        with pytest.raises(SpecError) as e:
            M.from_config(cfg)
        assert e.value.field == "config.target_layer_count" and e.value.value == 1
        rest = {k: v for k, v in cfg.items() if k != "target_layer_count"}
        assert isinstance(M.from_config(rest), M.ModelSpec)
    pytest.importorskip("vllm")
    case = {"config": llama, "tp": 1, "kv_cache_dtype": "auto", "gpu_backend": True}
    assert list(vllm_answers({"llama": case})["llama"]["windows"]) == ["model.layers.1.self_attn.attn"]


# ------------------------------------------------------------------- G1: a group name whose own __eq__ lies
class _AnyGroup(str):
    """A group name equal to every name, hashing as group ``b``."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("b")


def test_g1_a_str_subclass_group_zeroes_its_own_rows_only() -> None:
    """G1 (HIGH): a group name's own ``__eq__`` chose the rows (``SegmentTable.for_group``) and the cached
    plans (the cuda zeroer's dict lookups): ``_AnyGroup("a")`` zeroed block 3 of groups a and b, in the
    cuda zeroer and in the NumPy reference. Now read as the plain str it holds (one type check a call)."""
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    import kvlayout as K

    rows = (K.Segment(0, 64, 16, "a", "L0"), K.Segment(32, 64, 16, "b", "L1"))
    t = K.SegmentTable(total_bytes=512, num_blocks=8, segments=rows)
    assert [s.layer for s in t.for_group(_AnyGroup("a")).segments] == ["L0"]
    host = np.full(512, 7, np.uint8)
    K.zero_blocks_numpy(host, t, [3], group=_AnyGroup("a"))
    assert K.changed_ranges(np.full(512, 7, np.uint8), host).tolist() == [[192, 208]]
    if kc.MODE == "native":
        pytest.skip("CPU buffer: interpreter only")
    for warm in (None, "b"):  # with group b's plan cached first, its key found by the lying hash
        buf = torch.full((512,), 7, dtype=torch.uint8)
        z = kc.CudaZeroer(t, buf, graphs=False)
        if warm:
            z.zero([1], warm)
            buf.fill_(7)
        z.zero([3], _AnyGroup("a"))
        assert K.changed_ranges(np.full(512, 7, np.uint8), buf.numpy()).tolist() == [[192, 208]]


def test_g1_native_caches_read_the_group_as_its_plain_str() -> None:
    """G1 on the JAX-native side: ``NativeCacheSpec.zeroed_mask`` asked ``group in leaf.group_names``, the
    name's own ``__eq__`` answering: ``_AnyGroup("a")`` zeroed the pages of leaves a and b (the NumPy
    reference, and the Pallas ``CacheZeroer``, whose jitted steps are keyed by the group too)."""
    from kvlayout.native import spec_from_arrays, zero_native_numpy

    def caches() -> list[np.ndarray]:
        return [np.full((4, 8), 7, np.float32), np.full((4, 8), 7, np.float32)]

    spec = spec_from_arrays(caches(), ["a", "b"])
    assert spec.zeroed_mask(_AnyGroup("a")) == (True, False)
    host = caches()
    zero_native_numpy(host, spec, [2], group=_AnyGroup("a"))
    assert (host[0][2] == 0).all() and (host[1] == 7).all()
    jnp = pytest.importorskip("jax.numpy")
    kp = pytest.importorskip("kvlayout.backends.pallas")
    z = kp.CacheZeroer([jnp.full((4, 8), 7.0), jnp.full((4, 8), 7.0)], ["a", "b"])
    out = z([jnp.full((4, 8), 7.0), jnp.full((4, 8), 7.0)], [1], group="b")  # b's step traced first
    out = z([jnp.full((4, 8), 7.0), jnp.full((4, 8), 7.0)], [2], group=_AnyGroup("a"))
    assert (np.asarray(out[0])[2] == 0).all() and (np.asarray(out[1]) == 7).all()


def test_l2_decilm_layer_types_of_another_length_are_refused() -> None:
    """L2 (LOW): DeciLM's layer_types longer than the layers were planned by their first entries; the
    config class (transformers' validate_layer_type) refuses any other length, so vLLM builds nothing."""
    from kvlayout.errors import SpecError
    from tests.test_models_nemotron_nas import BASE, _blocks

    s, f = "sliding_attention", "full_attention"
    cfg = {**BASE, "sliding_window": 64, "layer_types": [s, f] * 4, "block_configs": _blocks([2] * 6)}
    with pytest.raises(SpecError) as e:
        M.from_config(cfg)
    assert e.value.field == "config.layer_types" and e.value.value == "8 items"


def test_l4_cohere2_window_zero_is_refused_saying_zero_reads_as_null() -> None:
    """L4 (LOW): a written ``sliding_window: 0`` (ModelConfig reads it as none) was refused showing None
    with no word of the 0 written; the message now says so."""
    with pytest.raises(SpecError) as e:
        M.from_config({**COHERE2, "sliding_window": 0})
    assert e.value.field == "config.sliding_window"
    assert "ModelConfig reads a written 0 as null" in str(e.value)


def test_plugin_storage_base_refuses_view_subclasses() -> None:
    """Left by pass 25, closed here: the vLLM plugin's own view walk (``_storage_base``) took views of a
    tensor subclass whose ``storage_offset()`` lies, as ``from_kv_caches`` did before pass 24 (H7)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from kvlayout.integrations.vllm import spec_from_kv_cache_config
    from kvlayout.integrations.vllm_plugin import _storage_base
    from kvlayout.planner import plan_layout
    from tests.test_vllm_hostile import CONFIG, _storage_views

    class Shifted(torch.Tensor):
        def storage_offset(self) -> int:
            return int(super().storage_offset()) + 1024

    layout = plan_layout(spec_from_kv_cache_config(CONFIG, "BLHNC"))
    _, views = _storage_views()
    backing, base = _storage_base(views, layout)  # vLLM's own views: placed at their storage offset
    assert base == 4096 and backing.numel() == 4096 + layout.total_bytes + 4096
    lying = {name: v.as_subclass(Shifted) for name, v in views.items()}
    with pytest.raises(SpecError) as e:
        _storage_base(lying, layout)
    assert (e.value.field, e.value.value) == ("static_forward_context", "Shifted")
    assert "must be plain torch.Tensor views" in str(e.value)
