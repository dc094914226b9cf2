"""The ``cuda`` backend's real Triton kernel: under Triton's interpreter in CPU CI, natively on a GPU.

Every test runs in both modes: buffers and device ids live on ``kc.DEVICE_TYPE``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlayout as K
from kvlayout.conformance import run_case
from kvlayout.testing import random_spec

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")



def on_device(data: np.ndarray) -> torch.Tensor:
    """A copy of host bytes on the backend's device (the CPU under the interpreter)."""
    return torch.from_numpy(data.copy()).to(kc.DEVICE_TYPE)


def host(buf: torch.Tensor) -> np.ndarray:
    return buf.cpu().numpy()


def test_registered_and_mode() -> None:
    cls = K.load_backend("cuda")
    assert cls is kc.CudaBackend
    native = torch.cuda.is_available()
    assert kc.MODE == "native" if native else kc.MODE == "interpreter"
    assert kc.DEVICE_TYPE == "cuda" if native else kc.DEVICE_TYPE == "cpu"


@pytest.mark.parametrize("name", ["dsv4-test", "dsv4"])
def test_presets_match_contract(name: str) -> None:
    t = K.plan(K.preset(name))
    n = t.num_blocks
    for ids in ([0], [n - 1], [0, 5, n - 1], [7, 7, 3, 7]):
        res = run_case(kc.CudaBackend, t, ids)
        assert res.mode == kc.MODE
        assert res.ok, res.check.describe()


def test_all_blocks_and_llama() -> None:
    t = K.plan(K.preset("dsv4-test"))
    assert run_case(kc.CudaBackend, t, list(range(t.num_blocks))).ok
    tl = K.plan(K.preset("llama-8b").with_num_blocks(8))
    assert run_case(kc.CudaBackend, tl, [0, 3, 7]).ok


def test_uncoalesced_181_rows_and_small_chunks() -> None:
    t = K.plan(K.preset("dsv4").with_num_blocks(6))
    data = K.poison_pattern(t.total_bytes + 1024)
    buf = on_device(data)
    z = kc.CudaZeroer(t, buf, offset=512, coalesce=False, chunk_words=1024, sub_words=256)
    assert len(z.kernel_table) == 181
    z.zero([1, 5])
    chk = K.reference.compare_to_contract(data, host(buf), t, [1, 5], origin=512)
    assert chk.matches, chk.describe()


def test_empty_batch_is_noop() -> None:
    t = K.plan(K.preset("dsv4-test"))
    res = run_case(kc.CudaBackend, t, [])
    assert res.ok and res.check.zeroed_bytes == 0


@given(st.integers(0, 2**32 - 1), st.data())
@settings(max_examples=25)
def test_random_specs(seed: int, data: st.DataObject) -> None:
    spec = random_spec(seed, max_blocks=8)
    t = K.plan(spec)
    ids = data.draw(st.lists(st.integers(0, spec.num_blocks - 1), max_size=5))
    res = run_case(kc.CudaBackend, t, ids)
    assert res.ok, res.check.describe()


@pytest.mark.parametrize("ids", [[0, 100], [-1], [True], np.array([1.5])])
def test_bad_host_ids_write_nothing(ids: object) -> None:
    t = K.plan(K.preset("dsv4-test"))
    data = K.poison_pattern(t.total_bytes)
    buf = on_device(data)
    z = kc.CudaZeroer(t, buf)
    with pytest.raises(K.BlockIdError):
        z.zero(ids)
    assert (host(buf) == data).all()


def test_device_tensor_ids_int32_and_int64() -> None:
    t = K.plan(K.preset("dsv4-test"))
    for dt in (torch.int32, torch.int64):
        data = K.poison_pattern(t.total_bytes)
        buf = on_device(data)
        kc.CudaZeroer(t, buf).zero(torch.tensor([2, 99], dtype=dt, device=kc.DEVICE_TYPE))
        assert K.reference.compare_to_contract(data, host(buf), t, [2, 99]).matches


def test_kernel_bounds_check_writes_nothing_and_flags() -> None:
    """Bypass host validation: the kernel itself must skip and flag out-of-range ids."""
    t = K.plan(K.preset("dsv4-test"))
    data = K.poison_pattern(t.total_bytes)
    buf = on_device(data)
    z = kc.CudaZeroer(t, buf)
    z._launch(torch.tensor([3, 100, -5], dtype=torch.int64, device=kc.DEVICE_TYPE))
    chk = K.reference.compare_to_contract(data, host(buf), t, [3])
    assert chk.matches, chk.describe()  # block 3 zeroed, nothing else touched
    with pytest.raises(K.BlockIdError, match=r"outside \[0, 100\)"):
        z.check()
    z.check()  # flag was reset


def test_buffer_validation() -> None:
    t = K.plan(K.preset("dsv4-test"))
    dev = kc.DEVICE_TYPE
    with pytest.raises(K.LayoutBufferError, match="smaller than offset 0 \\+ total_bytes 14976000"):
        kc.CudaZeroer(t, torch.zeros(t.total_bytes - 4, dtype=torch.uint8, device=dev))
    with pytest.raises(K.LayoutBufferError, match="must be a torch.Tensor"):
        kc.CudaZeroer(t, np.zeros(t.total_bytes, np.uint8))
    with pytest.raises(K.LayoutBufferError, match="offset = 2"):
        kc.CudaZeroer(t, torch.zeros(t.total_bytes + 8, dtype=torch.uint8, device=dev), offset=2)
    with pytest.raises(K.LayoutBufferError, match="contiguous"):
        kc.CudaZeroer(t, torch.zeros(2, t.total_bytes // 2, dtype=torch.uint8, device=dev).t())
    if kc.MODE == "native":  # natively a host tensor is refused; under the interpreter it is the buffer
        with pytest.raises(K.LayoutBufferError, match="buffer device = cpu"):
            kc.CudaZeroer(t, torch.zeros(t.total_bytes, dtype=torch.uint8))


def test_float16_buffer_every_byte() -> None:
    """Any dtype works: a poisoned float16 buffer (guard bands on both sides), checked byte for byte."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(6))
    data = K.poison_pattern(t.total_bytes + 1024)
    buf = on_device(data).view(torch.float16)
    assert buf.dtype == torch.float16 and buf.numel() == (t.total_bytes + 1024) // 2
    z = kc.CudaZeroer(t, buf, offset=512)
    z.zero([1, 4])
    z.zero(torch.tensor([5], device=kc.DEVICE_TYPE))
    z.check()
    got = host(buf.view(torch.uint8))
    chk = K.reference.compare_to_contract(data, got, t, [1, 4, 5], origin=512)
    assert chk.matches, chk.describe()
    assert chk.zeroed_bytes == 3 * 4 * 37_376


def test_unsafe_table_refused() -> None:
    from tests.test_verify import prefix_table

    t = prefix_table()
    with pytest.raises(K.TableError, match="unsafe table"):
        kc.CudaZeroer(t, torch.zeros(t.total_bytes, dtype=torch.uint8, device=kc.DEVICE_TYPE))


def test_launch_geometry_at_vllm_52058_scale() -> None:
    """181 rows mixing 9,344- and 292-word pages, 6,870 blocks: no overflow, no empty work."""
    t = K.plan(K.preset("dsv4").with_num_blocks(6870))
    plan = kc.plan_units(t)  # uncoalesced: 181 rows
    assert t.spans.max() // 4 == 9344 and t.spans.min() // 4 == 292
    # units cover every row's span exactly, none longer than a chunk, none empty
    assert plan.words.min() > 0 and plan.words.max() <= plan.chunk_words
    assert int(plan.words.sum()) * 4 == int(t.spans.sum())
    programs, items = kc.launch_grid(plan, 6870, max_programs=132 * 16)
    assert items == 6870 * plan.units_per_block
    assert 1 <= programs <= 2**31 - 1 and programs <= items
    # vLLM's 3-D grid for the same case would launch 6,870 x 181 x ceil(9344/1024)
    assert items < 6870 * 181 * 10
    # even 10**7 ids never exceed the grid limit
    assert kc.launch_grid(plan, 10**7, max_programs=2**40)[0] == 2**31 - 1


def test_numpy_model_of_units_equals_contract() -> None:
    t = K.plan(K.preset("dsv4").with_num_blocks(5)).coalesced()
    plan = kc.plan_units(t, chunk_words=1000)
    words = K.poison_pattern(t.total_bytes).view(np.int32).copy()
    before = words.copy()
    kc.zero_units_numpy(words, plan, np.array([0, 4]))
    assert K.reference.compare_to_contract(before, words, t, [0, 4]).matches


def test_from_dlpack_in_place() -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(4))
    data = K.poison_pattern(t.total_bytes)
    owner = on_device(data)
    z = kc.CudaZeroer.from_dlpack(owner, t)
    assert z.buffer.data_ptr() == owner.data_ptr()
    z.zero([2])
    chk = K.reference.compare_to_contract(data, host(owner), t, [2])
    assert chk.matches, chk.describe()
