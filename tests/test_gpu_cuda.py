"""The ``cuda`` backend on a real GPU, at real scale (marked ``gpu``: run by ``scripts/gpu_run.sh``).

dsv4 at 10**5 blocks (~15 GB) between guard bands, poisoned on the device and compared with an
independent torch reference (strided views, no Triton); the exact host comparison of the
conformance battery; CUDA-graph capture and replay; device-side bad ids. ``-k small`` is the
representative run for compute-sanitizer. Deselected by default (``-m "not gpu"`` in
pyproject.toml); on a machine without CUDA they skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kvlayout.backends.cuda as kc
import numpy as np
import pytest
import torch
from kvlayout.backends.cuda.testing import device_poison, torch_reference_zero

import kvlayout as K
from kvlayout.conformance import run_case

pytestmark = pytest.mark.gpu
GUARD = 4096
N = 10**5


@pytest.fixture(autouse=True)
def _native_cuda() -> Iterator[None]:
    if kc.MODE != "native":
        pytest.skip("needs a CUDA device (the cuda backend runs in the Triton interpreter here)")
    yield
    torch.cuda.empty_cache()


def _batches() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = [rng.choice(N, 4096, replace=False) for _ in range(6)] + [np.array([0, N - 1, N - 1, 7])]
    return out + [rng.choice(N, k, replace=False) for k in (1, 37, 300, 5000)]  # every bucket class


SCALE: dict[str, tuple[str, int, Any, dict[str, Any]]] = {
    # name: (preset, num_blocks, batches (None: _batches()), zeroer options / group)
    "small": ("dsv4-test", 100, [np.array([0, 5, 99]), np.array([1, 1, 2])], {}),
    "dsv4": ("dsv4", N, None, {}),
    "dsv4-uncoalesced": ("dsv4", N, 2, {"coalesce": False}),
    "dsv4-eager": ("dsv4", N, None, {"graphs": False}),
    "dsv4-group-c4.3": ("dsv4", N, None, {"group": "c4.3"}),
    "dsv4-test": ("dsv4-test", N, None, {}),
    "llama-8b": ("llama-8b", 8192, [np.random.default_rng(1).choice(8192, 1024)], {}),
}


@pytest.mark.parametrize("case", list(SCALE))
def test_scale_equals_torch_reference_guards_intact(case: str) -> None:
    name, num_blocks, batches, opts = SCALE[case]
    if batches is None or isinstance(batches, int):
        batches = _batches()[: batches or None]
    opts = dict(opts)
    group = opts.pop("group", None)
    table = K.plan(K.preset(name).with_num_blocks(num_blocks))
    total = table.total_bytes
    buf = device_poison(GUARD + total + GUARD, "cuda")
    ref = buf.clone()
    z = kc.CudaZeroer(table, buf, offset=GUARD, max_batch=max(len(b) for b in batches), **opts)
    ref_words = ref[GUARD : GUARD + total].view(torch.int32)
    for j, ids in enumerate(batches):
        z.zero(ids.tolist() if j % 2 else ids, group)  # host lists and arrays, no sync between batches
        torch_reference_zero(ref_words, table.for_group(group), torch.from_numpy(ids).cuda())
    z.check()
    torch.cuda.synchronize()
    assert torch.equal(buf[:GUARD], ref[:GUARD]) and torch.equal(buf[-GUARD:], ref[-GUARD:]), "guard band"
    assert torch.equal(buf, ref)


@pytest.mark.parametrize("name", ["dsv4-test", "dsv4", "llama-8b"])
def test_exact_host_comparison(name: str) -> None:
    table = K.plan(K.preset(name))
    n = table.num_blocks
    for ids in ([0], [n - 1], list(range(n)), [3, 3, n - 1, 0, 3], []):
        res = run_case(kc.CudaBackend, table, ids)
        assert res.ok and res.mode == "native", (ids[:8], res)


def test_graph_capture_and_replay() -> None:
    table = K.plan(K.preset("dsv4").with_num_blocks(20000))
    buf = device_poison(table.total_bytes, "cuda")
    ref = buf.clone()
    z = kc.CudaZeroer(table, buf)
    ids_dev = torch.zeros(512, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        z.zero(ids_dev)  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        z.zero(ids_dev)
    ref_words = ref.view(torch.int32)
    torch_reference_zero(ref_words, table, ids_dev)  # the warm-up zeroed block 0
    rng = np.random.default_rng(1)
    for _ in range(5):
        new = torch.from_numpy(rng.choice(table.num_blocks, 512, replace=False)).cuda()
        ids_dev.copy_(new)
        graph.replay()
        torch_reference_zero(ref_words, table, new)
    torch.cuda.synchronize()
    z.check()
    assert torch.equal(buf, ref)


def test_device_bad_ids_small() -> None:
    """Device ids outside the pool write nothing and set the flag that ``check()`` raises."""
    table = K.plan(K.preset("dsv4-test"))
    buf = device_poison(GUARD + table.total_bytes + GUARD, "cuda")
    ref = buf.clone()
    z = kc.CudaZeroer(table, buf, offset=GUARD)
    z.zero(torch.tensor([5, table.num_blocks + 3, -1, 10**9], dtype=torch.int64, device="cuda"))
    ref_words = ref[GUARD : GUARD + table.total_bytes].view(torch.int32)
    torch_reference_zero(ref_words, table, torch.tensor([5], device="cuda"))
    with pytest.raises(K.BlockIdError, match="outside"):
        z.check()
    torch.cuda.synchronize()
    assert torch.equal(buf, ref)


def test_zero_into_a_copy_with_host_ids_small() -> None:
    """``zero_into`` (the custom op's body) on a same-layout copy with CPU id tensors: the ids go to
    the device first (no CPU test can tell, since there everything is on the CPU), the copy is zeroed
    exactly, and the zeroer's own buffer is untouched."""
    table = K.plan(K.preset("dsv4-test"))
    buf = device_poison(GUARD + table.total_bytes + GUARD, "cuda")
    own = buf.clone()
    copy = buf.clone()
    ref = buf.clone()
    z = kc.CudaZeroer(table, buf, offset=GUARD)
    for ids in (torch.tensor([5, 0, 99]), torch.tensor([7], dtype=torch.int32)):
        z.zero_into(copy, ids)
        torch_reference_zero(ref[GUARD : GUARD + table.total_bytes].view(torch.int32), table, ids.cuda())
    torch.cuda.synchronize()
    z.check()
    assert torch.equal(copy, ref) and torch.equal(buf, own)
