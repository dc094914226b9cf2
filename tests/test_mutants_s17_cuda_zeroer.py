"""The cuda zeroer's session-16 host rules (interpreter): buffers whose bytes are not plain memory of
their dtype are refused by kind, ``coalesce`` must be a bool, and NumPy integers given as ``offset`` or
``chunk_words`` are kept as Python ints (the plans are keyed and the kernel built with them)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import kvlayout as K

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")
Z = pytest.importorskip("kvlayout.backends.cuda.zeroer")

pytestmark = pytest.mark.skipif(kc.MODE == "native", reason="CPU rules: interpreter only")

WHY = "must be a plain strided tensor (its bytes are the layout's)"


def tiny(num_blocks: int = 6) -> K.SegmentTable:
    layer = K.FullAttentionSpec(name="a", block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")
    return K.plan(K.KVCacheSpec(num_blocks, "BLHNC", (K.GroupSpec("g", (layer,)),)))


def _odd_buffers(nbytes: int) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # prototype / deprecated tensor kinds
        c = torch.zeros(nbytes // 8, dtype=torch.complex64)
        return {
            "nested": torch.nested.nested_tensor([torch.zeros(nbytes // 8), torch.zeros(nbytes // 8)]),
            "sparse": torch.zeros(nbytes // 4).to_sparse(),
            "quantized": torch.quantize_per_tensor(torch.zeros(nbytes), 0.1, 0, torch.quint8),
            "conjugate view": c.conj(),
            "negative view": torch.zeros(nbytes // 4, dtype=torch.complex64).conj().imag,
        }


@pytest.mark.parametrize("kind", ["nested", "sparse", "quantized", "conjugate view", "negative view"])
def test_a_tensor_whose_bytes_are_not_plain_is_refused_by_kind(kind: str) -> None:
    t = tiny()
    buf = _odd_buffers(t.total_bytes)[kind]
    with pytest.raises(K.LayoutBufferError) as e:
        kc.CudaZeroer(t, buf, graphs=False)
    assert str(e.value) == f"buffer = a {kind} tensor: {WHY}"
    assert e.value.field == "buffer" and e.value.value == kind


def test_a_conjugate_view_made_physical_is_plain() -> None:
    t = tiny()
    buf = torch.zeros(t.total_bytes // 8, dtype=torch.complex64).conj().resolve_conj()
    assert not buf.is_conj()
    z = kc.CudaZeroer(t, buf, graphs=False)
    assert z.words.numel() == t.total_bytes // 4


@pytest.mark.parametrize("bad", ["no", 0, 1, None])
def test_coalesce_must_be_a_bool(bad: Any) -> None:
    t = tiny()
    buf = torch.full((t.total_bytes,), 7, dtype=torch.uint8)
    with pytest.raises(K.BackendError) as e:
        kc.CudaZeroer(t, buf, coalesce=bad, graphs=False)
    assert str(e.value) == f"coalesce = {bad!r}: must be True or False"
    assert e.value.field == "coalesce" and e.value.value is bad
    assert bool((buf == 7).all())


def test_numpy_offset_and_chunk_words_are_python_ints() -> None:
    t = tiny()
    data = K.poison_pattern(t.total_bytes + 64, seed=5)
    buf = torch.from_numpy(data.copy())
    z = kc.CudaZeroer(t, buf, offset=np.int64(32), chunk_words=np.int64(64), graphs=False)
    assert type(z.offset) is int and z.offset == 32
    assert type(z._chunk_words) is int and z._chunk_words == 64
    assert list(z._plans) == [(None, 64)] and all(type(k[1]) is int for k in z._plans)
    z.zero([1, 4])
    want = data.copy()
    K.zero_blocks_numpy(want[32 : 32 + t.total_bytes], t, [1, 4])
    assert np.array_equal(buf.numpy(), want)
    z.zero([2], group="g")
    K.zero_blocks_numpy(want[32 : 32 + t.total_bytes], t, [2])
    assert np.array_equal(buf.numpy(), want)


def test_device_plan_takes_a_numpy_chunk_as_an_int() -> None:
    t = tiny()
    p = Z._device_plan(t, True, np.int64(4), 8, torch.device("cpu"))
    assert p.sub == 4 and type(p.sub) is int  # a power-of-two chunk narrower than the vector
    p = Z._device_plan(t, False, np.int32(8), 4, torch.device("cpu"))
    assert p.sub == 4 and p.table == t
    p = Z._device_plan(t, False, 12, 16, torch.device("cpu"))
    assert p.sub == 16  # not a power of two: the vector stays
