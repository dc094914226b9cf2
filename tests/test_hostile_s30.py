"""Hostile pass 30 (/tmp/h30), on pass 29's fixes: each test failing on the code before its fix.

H1: pass 29 disabled torch functions only around the ids' checks, so a caller's TorchFunctionMode still
answered the launch's ``data_ptr()`` (blocks [5, 6] zeroed for ids [1, 2]) and ``zero_into``'s size check
(``numel()``: 1 KiB written past a smaller target). Every public entry now runs with torch functions
disabled. M1: the sharded zeroer refused ids kept in shard 1's buffer after shard 0 was written. L1: ids
inside ``torch.func.vmap`` raised torch's raw error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError, LayoutBufferError
from tests.hostile_cases import cuda, eight, to_dev, to_host, zeroed_blocks


def test_a_mode_cannot_point_the_launch_at_other_ids() -> None:
    torch, kc = cuda()
    from torch.overrides import TorchFunctionMode

    evil = to_dev(torch.tensor([5, 6], dtype=torch.int64))

    class Lie(TorchFunctionMode):
        def __init__(self, ids: Any) -> None:
            super().__init__()
            self.ids = ids

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func is torch.Tensor.data_ptr and out == self.ids.data_ptr():
                return evil.data_ptr()
            return out

    t = eight()
    for call in ("zero", "zero_into", "launch_routed"):
        host = K.poison_pattern(t.total_bytes)
        buf = to_dev(torch.from_numpy(host.copy()))
        z = kc.CudaZeroer(t, buf, graphs=False)
        ids = to_dev(torch.tensor([1, 2]))  # device ids: the launch reads their data_ptr()
        target = to_dev(torch.from_numpy(host.copy())) if call == "zero_into" else buf
        with Lie(ids):
            if call == "zero":
                z.zero(ids)
            elif call == "zero_into":
                z.zero_into(target, ids)
            else:
                z.launch_routed(ids, 0, 8)
        z.check()
        assert zeroed_blocks(host, to_host(target)) == [1, 2], call


def test_a_mode_cannot_make_a_small_target_pass_the_size_check() -> None:
    torch, kc = cuda()
    from torch.overrides import TorchFunctionMode

    t = eight()
    z = kc.CudaZeroer(t, to_dev(torch.from_numpy(K.poison_pattern(t.total_bytes))), graphs=False)
    backing = to_dev(torch.from_numpy(K.poison_pattern(4096).copy())).view(torch.int32)
    target = backing[:256]  # 1 KiB: half the 2 KiB layout
    before = backing.clone()

    class Lie(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            return 512 if func is torch.Tensor.numel and args[0] is target else out

    with Lie(), pytest.raises(LayoutBufferError, match="smaller than"):
        z.zero_into(target, to_dev(torch.tensor([6])))
    assert torch.equal(backing, before)


def test_the_sharded_zeroer_checks_every_shard_before_writing() -> None:
    torch, kc = cuda()
    from kvlayout.sharding import shard_spec

    spec = K.preset("dsv4-test").with_num_blocks(16)
    for kind, lay in (
        ("replicated", shard_spec(spec, {"tp": 2}, head_axes=("tp",))),
        ("block-sharded", shard_spec(spec, {"dp": 2}, block_axes=("dp",))),
    ):
        bufs = {k: to_dev(torch.from_numpy(K.poison_pattern(lay.shard_bytes, seed=k + 1).copy()))
                for k in range(2)}
        z = kc.ShardedCudaZeroer(lay, bufs)
        ids = bufs[1].view(torch.int64)[-2:]  # kept in shard 1's buffer
        ids.copy_(torch.tensor([1, 9] if kind == "block-sharded" else [1, 2]))
        before = {k: b.clone() for k, b in bufs.items()}
        with pytest.raises(BlockIdError, match="lie in the buffer being zeroed"):
            z.zero(ids)
        assert all(torch.equal(before[k], bufs[k]) for k in range(2)), kind


def test_ids_under_vmap_are_named() -> None:
    torch, kc = cuda()
    t = eight()
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = kc.CudaZeroer(t, buf, graphs=False)
    for f in (lambda x: z.zero(x), lambda x: z.launch_routed(x, 0, 8), lambda x: z.zero_into(buf, x)):
        with pytest.raises(BlockIdError, match="without storage"):
            torch.func.vmap(lambda x, f=f: (f(x), x)[1])(to_dev(torch.tensor([[1, 2], [3, 4]])))
    assert np.array_equal(to_host(buf), host)
