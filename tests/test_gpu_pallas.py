"""The ``pallas`` backend's Pallas-Triton kernel on a real GPU (marked ``gpu``: ``scripts/gpu_run.sh``).

A torch-owned, poisoned buffer (dsv4 at 10**5 blocks, ~15 GB) is handed to JAX by DLPack without a
copy, zeroed in place by the donated call (same pointer) and compared on the device with an
independent torch reference; the exact host comparison of the conformance battery; device-side
bad ids. Deselected by default (``-m "not gpu"``); skipped where JAX has no GPU. tests/conftest.py
defaults ``JAX_PLATFORMS`` to cpu: the GPU run sets it (``cuda,cpu``).
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import kvlayout.backends.pallas as kp
import numpy as np
import pytest
import torch
from kvlayout.backends.cuda.testing import device_poison, torch_reference_zero

import kvlayout as K
from kvlayout.conformance import run_case

pytestmark = pytest.mark.gpu
N = 10**5


@pytest.fixture(autouse=True)
def _jax_gpu() -> Iterator[None]:
    if jax.default_backend() != "gpu" or not torch.cuda.is_available():
        pytest.skip("needs JAX's GPU backend and CUDA torch (DLPack hand-off)")
    yield
    torch.cuda.empty_cache()


def _batches(n: int, k: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.choice(n, 4096, replace=False) for _ in range(k)] + [np.array([0, n - 1, n - 1, 7])]


@pytest.mark.parametrize(
    ("name", "num_blocks", "batches"),
    [
        ("dsv4", N, _batches(N, 4)),
        ("dsv4-test", N, _batches(N, 2)),
        ("llama-8b", 8192, [np.random.default_rng(1).choice(8192, 1024)]),
    ],
)
def test_dlpack_in_place_equals_torch_reference(
    name: str, num_blocks: int, batches: list[np.ndarray]
) -> None:
    table = K.plan(K.preset(name).with_num_blocks(num_blocks))
    z = kp.PallasZeroer(table)
    rows = z.buffer_shape[0]
    owner = device_poison(rows * 512, "cuda")
    ref = owner.clone()
    torch.cuda.synchronize()
    ptr = owner.data_ptr()
    buf = jax.dlpack.from_dlpack(owner.view(torch.int32).view(rows, 128))
    assert buf.unsafe_buffer_pointer() == ptr, "DLPack copied the buffer"
    for ids in batches:
        buf = z(buf, jnp.asarray(ids.astype(np.int32)))  # device ids, donated, in place
    buf.block_until_ready()
    assert buf.unsafe_buffer_pointer() == ptr, "the donated call moved the buffer"
    z.check()
    words = ref[: table.total_bytes].view(torch.int32)
    for ids in batches:
        torch_reference_zero(words, table, torch.from_numpy(ids).cuda())
    torch.cuda.synchronize()
    del buf
    assert z.mode == "native-gpu"
    assert torch.equal(owner, ref)


@pytest.mark.parametrize("name", ["dsv4-test", "dsv4"])
def test_exact_host_comparison(name: str) -> None:
    table = K.plan(K.preset(name))
    n = table.num_blocks
    for ids in ([0], [1, 3], [n - 1], list(range(n)), [3, 3, n - 1], []):
        res = run_case(kp.PallasBackend, table, ids)
        assert res.ok and res.mode == "native-gpu", (ids[:8], res)


def test_device_bad_ids_write_nothing() -> None:
    table = K.plan(K.preset("dsv4-test"))
    data = K.poison_pattern(table.total_bytes)
    z = kp.PallasZeroer(table)
    buf = jnp.asarray(data.view(np.int32).reshape(z.buffer_shape))
    out = z(buf, jnp.array([5, 100, -1, 10**6], jnp.int32))
    got = np.asarray(out).reshape(-1).view(np.uint8)
    assert K.reference.compare_to_contract(data, got, table, [5]).matches
    with pytest.raises(K.BlockIdError, match="outside"):
        z.check()
