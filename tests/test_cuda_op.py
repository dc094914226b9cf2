"""``torch.ops.kvlayout.zero_blocks``: eager, version counter, torch.compile(fullgraph=True), CUDA graphs.

Under Triton's interpreter on CPU in CI (``aot_eager`` keeps compilation fast); natively on a
GPU the same tests also compile with Inductor and capture the op in a CUDA graph.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")

NATIVE = kc.MODE == "native"


def setup(num_blocks: int = 6) -> tuple[K.SegmentTable, np.ndarray, torch.Tensor, kc.CudaZeroer]:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(num_blocks))
    data = K.poison_pattern(t.total_bytes + 64)
    buf = torch.from_numpy(data.copy()).to(kc.DEVICE_TYPE)
    return t, data, buf, kc.CudaZeroer(t, buf, offset=64)


def matches(t: K.SegmentTable, data: np.ndarray, buf: torch.Tensor, ids: list[int]) -> None:
    got = buf.cpu().numpy()
    assert np.array_equal(got[:64], data[:64]), "bytes before the layout changed"
    chk = K.reference.compare_to_contract(data[64:], got[64:], t, ids)
    assert chk.matches, chk.describe()


def test_eager_op_zeroes_and_bumps_version() -> None:
    t, data, buf, z = setup()
    v0 = buf._version
    torch.ops.kvlayout.zero_blocks(buf, torch.tensor([4, 1], device=kc.DEVICE_TYPE), z.handle)
    assert buf._version > v0
    matches(t, data, buf, [1, 4])
    z.check()


def test_handle_is_stable_and_unknown_handle_raises() -> None:
    _, _, buf, z = setup()
    assert z.handle == z.handle
    with pytest.raises(K.BackendError, match="handle"):
        torch.ops.kvlayout.zero_blocks(buf, torch.tensor([1]), 10**9)


def test_bad_ids_through_the_op() -> None:
    t, data, buf, z = setup()
    ids = torch.tensor([2, t.num_blocks], device=kc.DEVICE_TYPE)
    if NATIVE:  # device ids: the kernel writes the good one and flags the bad one
        torch.ops.kvlayout.zero_blocks(buf, ids, z.handle)
        with pytest.raises(K.BlockIdError):
            z.check()
        matches(t, data, buf, [2])
    else:  # host ids: refused before anything is written
        with pytest.raises(K.BlockIdError, match=r"block_ids\[1\]"):
            torch.ops.kvlayout.zero_blocks(buf, ids, z.handle)
        matches(t, data, buf, [])


def test_into_a_copy_writes_the_copy_only() -> None:
    """Functionalisation may hand the op a copy of the buffer: the copy is what gets zeroed."""
    t, data, buf, z = setup()
    copy = buf.clone()
    torch.ops.kvlayout.zero_blocks(copy, torch.tensor([3], device=kc.DEVICE_TYPE), z.handle, "mla")
    matches(t, data, copy, [3])
    matches(t, data, buf, [])


@pytest.mark.parametrize("backend", ["aot_eager"] + (["inductor"] if NATIVE else []))
def test_compiled_fullgraph_step(backend: str) -> None:
    t, data, buf, z = setup()
    h = z.handle

    def step(b: torch.Tensor, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        torch.ops.kvlayout.zero_blocks(b, ids, h)
        return x * 2 + ids.sum()  # the rest of an engine's step

    torch._dynamo.reset()
    f = torch.compile(step, fullgraph=True, backend=backend)
    x = torch.ones(4, device=kc.DEVICE_TYPE)
    out = f(buf, torch.tensor([0, 5], device=kc.DEVICE_TYPE), x)
    assert torch.equal(out.cpu(), torch.full((4,), 7.0))
    out = f(buf, torch.tensor([2, 2], device=kc.DEVICE_TYPE), x)  # same shapes: no retrace needed
    assert torch.equal(out.cpu(), torch.full((4,), 6.0))
    matches(t, data, buf, [0, 2, 5])
    z.check()


@pytest.mark.skipif(not NATIVE, reason="CUDA graphs need a GPU")
def test_op_inside_a_cuda_graph() -> None:
    t, data, buf, z = setup(64)
    ids = torch.zeros(8, dtype=torch.int64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.kvlayout.zero_blocks(buf, ids, z.handle)  # warm-up: compiles (zeroes block 0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.ops.kvlayout.zero_blocks(buf, ids, z.handle)
    done = {0}
    rng = np.random.default_rng(3)
    for _ in range(3):
        new = rng.choice(64, 8, replace=False)
        ids.copy_(torch.from_numpy(new))
        g.replay()
        done |= set(new.tolist())
    torch.cuda.synchronize()
    matches(t, data, buf, sorted(done))
    z.check()
