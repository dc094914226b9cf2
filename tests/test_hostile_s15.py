"""Fifteenth hostile pass: the Pallas-Triton interpreter keeps NaN payloads of pages it does not
zero; bad vLLM caches, aliased or donated buffers, non-str backend names, bad ``--backend`` specs
and loosely typed options are refused with the field and value named."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kvlayout.backends.pallas.native import CacheZeroer

import kvlayout as K
from kvlayout.errors import BackendError, BlockIdError, LayoutBufferError, SpecError, short
from kvlayout.reference import ReferenceBackend

ROOT = Path(__file__).resolve().parent.parent
TABLE = K.plan(K.preset("dsv4-test").with_num_blocks(4))


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    """TPU interpret mode keeps process-wide state: reset it after each test, as the other suites do."""
    from jax.experimental.pallas import tpu as pltpu

    yield
    pltpu.reset_tpu_interpret_mode_state()

# ---- 1: the Pallas-Triton interpreter keeps the bits of pages it does not zero ------------------------

#: dtype -> same-width unsigned view and NaNs with non-canonical payloads (canonical: 0x7fc0, 0x7f)
_POISON = {
    "bfloat16": (np.uint16, [0x7F81, 0xFF83, 0x7FA5, 0xFFFF]),
    "float8_e5m2": (np.uint8, [0x7D, 0xFE, 0x7E, 0xFD]),
}


@pytest.mark.parametrize("device_ids", [False, True])
@pytest.mark.parametrize("dtype", list(_POISON))
def test_triton_interpret_keeps_nan_payloads_of_other_pages(dtype: str, device_ids: bool) -> None:
    """XLA on the CPU computes bfloat16 and fp8 in float32, so the interpreter's read-modify-write of a
    leaf rewrote every NaN payload to the canonical NaN, pages no id named included. Bits outside the
    zeroed pages must be those given, bit for bit."""
    udt, nans = _POISON[dtype]
    shape = (4, 3, 8)
    raw = np.resize(np.array(nans, udt), int(np.prod(shape))).reshape(shape)
    leaves = [jnp.asarray(raw.view(jnp.dtype(dtype))), jnp.asarray(raw.view(jnp.dtype(dtype))[:, :2])]
    z = CacheZeroer(leaves, "g", kernel="triton", interpret=True)
    ids: Any = jnp.array([2], jnp.int32) if device_ids else [2]
    out = z(leaves, ids)
    for got, want in zip(out, (raw, raw[:, :2])):
        expect = want.copy()
        expect[2] = 0
        np.testing.assert_array_equal(np.asarray(got).view(udt), expect)
    z.check()


# ---- 2: the int64 carve-out kvlayout cannot see is documented ---------------------------------------


@pytest.mark.parametrize("doc", ["docs/reliability.md", "docs/tpu.md"])
def test_int64_ids_narrowed_by_the_users_own_jit_are_documented(doc: str) -> None:
    """JAX (x64 off) narrows NumPy int64 arguments of the user's own jit before ``apply`` sees them:
    the docs say so, with the remedies (int32 ids checked on the host, or x64)."""
    text = " ".join((ROOT / doc).read_text().split())
    assert "narrowed by JAX itself" in text
    for remedy in ("int32", "normalize_block_ids", "jax_enable_x64"):
        assert remedy in text, remedy


# ---- 3, 4, 9c, 9e: KVBlockZeroer.from_kv_caches on a bad vLLM cache -------------------------------

VLLM_NAMES = ["model.layers.0.attn", "model.layers.1.attn"]


def _vllm(num_blocks: int = 4, lead: int = 0) -> tuple[Any, Any, dict[str, Any]]:
    """vLLM 0.33's own objects (``kv_cache_interface``, a config of two bf16 layers under BLHNC) and its
    views of the cache ``lead`` bytes into a zeroed storage."""
    from tests.driver import ground_truth

    ground_truth()  # imports vLLM on the CPU
    import torch
    from vllm.v1 import kv_cache_interface as iface

    attn = iface.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)
    tensor = iface.KVCacheTensor(
        size=2048 * num_blocks, layers=VLLM_NAMES, layer_stride=1024, block_stride=2048
    )
    config = iface.KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[tensor],
        kv_cache_groups=[iface.KVCacheGroupSpec(VLLM_NAMES, attn)], kv_cache_layout="BLHNC",
    )
    raw = torch.zeros(lead + 8192 + 64, dtype=torch.int8)[lead : lead + 8192]
    views = iface.create_kv_cache_views(raw, attn, 4, iface.KVCacheLayout.BLHNC, replace_size(tensor, 8192))
    return iface, config, dict(zip(VLLM_NAMES, views))


def replace_size(tensor: Any, size: int) -> Any:
    """The same ``KVCacheTensor`` of ``size`` bytes (views of a 4-block cache for any config)."""
    from dataclasses import replace

    return replace(tensor, size=size)


def test_from_kv_caches_with_no_blocks_names_num_blocks() -> None:
    """A config of 0 blocks over the views raised ZeroDivisionError (``shape[0] % num_blocks``)."""
    from kvlayout.integrations.vllm import KVBlockZeroer

    _, config, views = _vllm(num_blocks=0)
    with pytest.raises(SpecError, match=r"^kv_cache_config\.num_blocks = 0: a cache of no blocks"):
        KVBlockZeroer.from_kv_caches(config, views)


def test_check_views_against_a_layout_of_no_blocks_names_num_blocks() -> None:
    """The public check itself divided by the layout's 0 blocks."""
    from kvlayout.integrations.vllm import check_views_against_layout, spec_from_kv_cache_config

    _, config, views = _vllm(num_blocks=0)
    layout = K.plan_layout(spec_from_kv_cache_config(config))
    with pytest.raises(SpecError, match=r"^num_blocks = 0: a cache of no blocks"):
        check_views_against_layout(layout, views, 1 << 20)


@pytest.mark.parametrize("kind", [list, tuple])
def test_from_kv_caches_refuses_a_list_of_views(kind: type) -> None:
    """The runner's list of bound tensors instead of vLLM's dict raised AttributeError ('.values')."""
    from kvlayout.integrations.vllm import KVBlockZeroer, check_views_against_layout

    _, config, views = _vllm()
    want = rf"^kv_caches = {kind.__name__}: must map layer names to their tensors"
    with pytest.raises(SpecError, match=want):
        KVBlockZeroer.from_kv_caches(config, kind(views.values()))
    with pytest.raises(SpecError, match=rf"^kv_caches = {kind.__name__}: must map layer names"):
        check_views_against_layout(K.plan_layout(K.preset("llama-8b")), kind(views.values()), 1 << 20)


@pytest.mark.parametrize("bad", ["model.layers.1.attn", b"model.layers.1.attn", 3, ["a", 1]])
def test_runner_only_attn_layers_must_be_a_collection_of_names(bad: Any) -> None:
    """A str was matched by substring (``"layers.1" in "model.layers.1.attn"``): refused, with the value."""
    from kvlayout.integrations.vllm import KVBlockZeroer, spec_from_kv_cache_config

    _, config, views = _vllm()
    field = r"runner_only_attn_layers\[1\]" if isinstance(bad, list) else "runner_only_attn_layers"
    with pytest.raises(SpecError, match=rf"^{field} = "):
        spec_from_kv_cache_config(config, runner_only_attn_layers=bad)
    with pytest.raises(SpecError, match=rf"^{field} = "):
        KVBlockZeroer.from_kv_caches(config, views, runner_only_attn_layers=bad)
    assert spec_from_kv_cache_config(config, runner_only_attn_layers={"other"}).num_blocks == 4


@pytest.mark.parametrize("lead", [2, 6])
def test_from_kv_caches_unaligned_start_is_said_in_bytes(lead: int) -> None:
    """Views starting 2 bytes into their storage said ``offset = 2: must be a multiple of 4``, naming an
    option the caller may not pass, in no unit; now the views' start, in bytes and elements."""
    from kvlayout.integrations.vllm import KVBlockZeroer

    _, config, views = _vllm(lead=lead)
    assert views[VLLM_NAMES[0]].storage_offset() == lead // 2  # torch counts bf16 elements
    want = (rf"^kv_caches\.storage_offset = {lead} B: the views put the cache at storage byte {lead} "
            rf"\(element {lead // 2} of their 2-byte dtype\).*multiple of 4 bytes")
    with pytest.raises(LayoutBufferError, match=want):
        KVBlockZeroer.from_kv_caches(config, views)


# ---- 5: one array given as two leaves ----------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["triton", "tpu"])
def test_cache_zeroer_names_one_array_given_as_two_leaves(kernel: str) -> None:
    """JAX refused to donate one buffer twice with its own INVALID_ARGUMENT error; now a
    LayoutBufferError names both leaves, and nothing ran: the array is whole and not donated."""
    a = jnp.ones((4, 8), jnp.float32)
    z = CacheZeroer({"k": a, "v": a}, "g", kernel=kernel, interpret=True)
    want = r"^leaf 'v' = 'same array': is the same jax.Array as leaf 'k'"
    for ids in ([1], jnp.array([1], jnp.int32)):
        with pytest.raises(LayoutBufferError, match=want):
            z({"k": a, "v": a}, ids)
        assert not a.is_deleted() and bool(jnp.all(a == 1))


def test_tpu_inference_zeroer_names_one_array_given_twice() -> None:
    """The adapter's leaves are the runner's indices: ``kv_caches[1]`` is ``kv_caches[0]``."""
    from types import SimpleNamespace

    from kvlayout.integrations.tpu_inference import TpuInferenceZeroer

    a = jnp.ones((4, 8), jnp.bfloat16)
    config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=["l0", "l1"])])
    z = TpuInferenceZeroer([a, a], config, {"l0": 0, "l1": 1}, kernel="triton", interpret=True)
    want = r"^leaf '1' = 'same array': is the same jax.Array as leaf '0'"
    with pytest.raises(LayoutBufferError, match=want):
        z([a, a], [2])
    assert not a.is_deleted() and bool(jnp.all(a == 1))


# ---- 6: a donated buffer ---------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["triton", "tpu"])
def test_pallas_zeroer_names_a_donated_buffer(kernel: str) -> None:
    """The buffer an earlier call donated raised JAX's bare RuntimeError ('Array has been deleted')."""
    from kvlayout.backends.pallas import PallasZeroer

    z = PallasZeroer(K.plan(K.preset("dsv4-test").with_num_blocks(4)), kernel=kernel, interpret=True)
    buf = jnp.zeros(z.buffer_shape, jnp.int32)
    z(buf, [1])
    for ids in ([1], jnp.array([1], jnp.int32)):
        with pytest.raises(LayoutBufferError, match=r"^buffer = 'deleted': was donated to an earlier call"):
            z(buf, ids)


def test_sharded_pallas_zeroer_names_a_donated_buffer() -> None:
    from jax.sharding import Mesh
    from kvlayout.backends.pallas import ShardedPallasZeroer

    from kvlayout.sharding import shard_spec

    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(4), {"x": 1}, block_axes=("x",))
    z = ShardedPallasZeroer(lay, Mesh(np.array(jax.devices()[:1]), ("x",)), kernel="triton", interpret=True)
    buf = z.make_buffer()
    z(buf, [1])
    for ids in ([1], jnp.array([1], jnp.int32)):
        with pytest.raises(LayoutBufferError, match=r"^buffer = 'deleted': was donated to an earlier call"):
            z(buf, ids)


# ---- 7: a backend name that is not a str ----------------------------------------------------------------


@pytest.mark.parametrize("bad", [3, b"cuda", 1.5, ["cuda"], True])
def test_backend_name_must_be_a_str(bad: Any) -> None:
    """``3`` and ``b"cuda"`` raised TypeError from an ``in`` test (``["cuda"]``: unhashable)."""
    from kvlayout import registry

    want = rf"^backend = {re.escape(short(bad))}: must be a backend name \(a str: auto, reference"
    for call in (registry.resolve, registry.load, lambda n: K.create_backend(TABLE, np.zeros(8), backend=n)):
        with pytest.raises(BackendError, match=want):
            call(bad)


# ---- 8: a --backend that is no usable backend -------------------------------------------------------


class BrokenInit(ReferenceBackend):
    """A backend whose constructor fails as a user's might (``module:attr`` for the CLI)."""

    def __init__(self, table: Any, buffer: Any, *, offset: int = 0) -> None:
        raise TypeError("broken on purpose")


@pytest.mark.parametrize(
    ("backend", "needle"),
    [
        ("kvlayout.planted:PlantedBackend", "failed as it ran: AttributeError: type object 'PlantedBackend'"),
        ("tests.test_hostile_s15:BrokenInit", "failed as it ran: TypeError: broken on purpose"),
        ("no_such_module_s15:X", "cannot import"),
        ("kvlayout.planted:Nope", "has no attribute 'Nope'"),
        ("kvlayout.planted:PLANTED", "is not a kvlayout.Backend subclass"),
        ("kvlayout.backend:Backend", "is abstract"),
        ("kvlayout.planted:", "must be 'module:attr'"),
    ],
)
def test_cli_zero_with_a_bad_backend_is_one_line_exit_2(
    backend: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--backend kvlayout.planted:PlantedBackend`` (a Backend subclass with no planted bug) printed a
    traceback and exited 1: every bad ``--backend`` is one line naming it, exit 2."""
    from kvlayout.cli import main

    rc = main(["zero", "--preset", "dsv4-test", "--num-blocks", "4", "--blocks", "1", "--backend", backend])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err and backend in err, err


# ---- 9: loosely typed options ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["no", 0, 1, None])
def test_coalesce_must_be_a_bool(bad: Any) -> None:
    """``coalesce="no"`` is truthy: it coalesced. Every ``coalesce`` option refuses a non-bool."""
    import torch
    from kvlayout.backends.cuda import CudaZeroer
    from kvlayout.backends.pallas import PallasZeroer

    with pytest.raises(SpecError, match=rf"^coalesce = {re.escape(repr(bad))}: must be True or False"):
        K.plan(K.preset("dsv4-test").with_num_blocks(4), coalesce=bad)
    with pytest.raises(BackendError, match=rf"^coalesce = {re.escape(repr(bad))}: must be True or False"):
        PallasZeroer(TABLE, coalesce=bad, kernel="triton", interpret=True)
    buf = torch.full((TABLE.total_bytes,), 7, dtype=torch.uint8)
    with pytest.raises(BackendError, match=rf"^coalesce = {re.escape(repr(bad))}: must be True or False"):
        CudaZeroer(TABLE, buf, coalesce=bad)
    assert bool((buf == 7).all())


def test_a_numpy_integer_group_is_an_index_where_groups_are_indices() -> None:
    """TpuInferenceZeroer's group ids are vLLM's indices: ``np.int64(0)`` (and ``0``) were refused with
    "valid group ids: 0, 1", listing the value refused; now any integer is the index, as KVBlockZeroer
    takes one."""
    from types import SimpleNamespace

    from kvlayout.integrations.tpu_inference import TpuInferenceZeroer

    host = np.arange(32, dtype=np.float32).reshape(4, 8) + 1
    config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=["l0"]),
                                              SimpleNamespace(layer_names=["l1"])])
    z = TpuInferenceZeroer([jnp.asarray(host), jnp.asarray(host)], config, {"l0": 0, "l1": 1},
                           kernel="triton", interpret=True)
    for g in (np.int64(1), np.int32(1), 1, "1"):
        out = z([jnp.asarray(host), jnp.asarray(host)], [2], group=g)
        want = host.copy()
        want[2] = 0
        np.testing.assert_array_equal(np.asarray(out[0]), host)  # group 0's array: untouched
        np.testing.assert_array_equal(np.asarray(out[1]), want)
    with pytest.raises(LayoutBufferError, match=r"^group = np.int64\(2\): valid group ids: 0, 1"):
        z([jnp.asarray(host), jnp.asarray(host)], [2], group=np.int64(2))


def test_kv_block_zeroer_takes_a_numpy_integer_group_index() -> None:
    """``np.int64(0)`` was refused as "must be a cache group index in [0, 1)": 0 is in it."""
    import torch

    from kvlayout.integrations.vllm import KVBlockZeroer

    z = KVBlockZeroer._from_table(TABLE, torch.zeros(TABLE.total_bytes, dtype=torch.uint8), max_batch=4)
    assert z.group_name(np.int64(0)) == z.group_name(0) == TABLE.groups[0]
    with pytest.raises(BlockIdError, match=r"^group = np.int64\(9\): must be a cache group index"):
        z.group_name(np.int64(9))


@pytest.mark.parametrize("bad", [np.int64(0), 0])
def test_cache_zeroer_names_the_type_of_a_non_str_group(bad: Any) -> None:
    """CacheZeroer's groups are names: ``np.int64(0)`` said "no such group; valid groups: '0', '1'",
    as if group '0' did not exist; now the type is named."""
    a = jnp.ones((4, 8), jnp.float32)
    z = CacheZeroer([a, jnp.ones((4, 8), jnp.float32)], ["0", "1"], kernel="triton", interpret=True)
    want = rf"^group = {re.escape(repr(bad))}: must be a group name \(a str\) or None, not "
    want += type(bad).__name__
    with pytest.raises(SpecError, match=want):
        z([a, jnp.ones((4, 8), jnp.float32)], [1], group=bad)
    assert not a.is_deleted() and bool(jnp.all(a == 1))


@pytest.mark.parametrize("offset", [2**62, 2**40])
def test_pallas_zeroer_names_an_offset_past_int32_rows(offset: int) -> None:
    """``offset=2**62`` was blamed on ``table.total_bytes`` (599,040 B, which fits): the offset is named."""
    from kvlayout.backends.pallas import PallasZeroer

    want = rf"^offset = {offset}: the layout \(599040 B\) at this byte offset"
    with pytest.raises(LayoutBufferError, match=want):
        PallasZeroer(TABLE, offset=offset, kernel="triton", interpret=True)
