"""Hostile pass 29 (/tmp/h29), on pass 28's fixes: each test failing on the code before its fix.

H1: ids stored inside the buffer being zeroed were cleared by the kernel while it read them (blocks 0 and
1 zeroed for ids [1, 2]). H2: a TorchFunctionMode's ``contiguous()`` handed the kernel a strided view of a
plain tensor (pass 28 refused only subclasses). H3: the native spec's group argument took an object equal
to every name (pass 28 fixed only the table's). M1: a ZeroTensor (no memory) as ids or as the buffer raised
raw errors (natively: a read of address 0). Q1/L1: Inkling's own attention layers read neither
compressed-tensors' KV scheme nor a checkpoint's KV-cache method (planned fp8 where vLLM allocates bf16;
fp8_e5m2 refused where vLLM builds it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.errors import BlockIdError, LayoutBufferError, SpecError
from kvlayout.native import NativeCacheSpec, NativeLeaf, expected_zeroed_native, zero_native_numpy
from tests import shared_answers
from tests.hostile_cases import cuda, device, eight, to_dev, to_host, zeroed_blocks
from tests.test_models_inkling import BASE as INKLING


def test_ids_inside_the_buffer_are_refused() -> None:
    torch, kc = cuda()
    t = eight()
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = kc.CudaZeroer(t, buf, graphs=False)
    ids = buf.view(torch.int64)[32:34]  # block 1's first 16 bytes
    ids.copy_(torch.tensor([1, 2]))
    host = to_host(buf).copy()
    for call in (lambda: z.zero(ids), lambda: z.zero_into(buf, ids),
                 lambda: torch.ops.kvlayout.zero_blocks(buf, ids, z.handle)):
        with pytest.raises(BlockIdError, match="lie in the buffer being zeroed") as e:
            call()
        assert e.value.field == "block_ids"
    assert np.array_equal(to_host(buf), host)
    other = to_dev(torch.tensor([1, 2]))  # the same ids elsewhere: zeroed
    z.zero(other)
    assert zeroed_blocks(host, to_host(buf)) == [1, 2]


def test_a_torch_function_mode_cannot_hand_the_kernel_other_ids() -> None:
    torch, kc = cuda()
    from torch.overrides import TorchFunctionMode

    class Lie(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func in (torch.Tensor.contiguous, torch.Tensor.to):
                return args[0]
            return func(*args, **(kwargs or {}))

    t = eight()
    for call in ("zero", "launch_routed", "zero_into"):
        host = K.poison_pattern(t.total_bytes)
        buf = to_dev(torch.from_numpy(host.copy()))
        z = kc.CudaZeroer(t, buf, graphs=False)
        ids = to_dev(torch.tensor([1, 7, 2, 7]))[::2]  # a plain tensor, logically [1, 2]
        target = to_dev(torch.from_numpy(host.copy()))
        with Lie():
            if call == "zero":
                z.zero(ids)
            elif call == "launch_routed":
                z.launch_routed(ids, 0, 8)
            else:
                z.zero_into(target, ids)
        z.check()
        got = target if call == "zero_into" else buf
        assert zeroed_blocks(host, to_host(got)) == [1, 2], call


def test_zero_tensors_are_refused() -> None:
    torch, kc = cuda()
    t = eight()
    z = kc.CudaZeroer(t, torch.zeros(512, dtype=torch.int32, device=device()), graphs=False)
    # device ids: the kernel read them at address 0 natively
    ids = torch._efficientzerotensor(2, dtype=torch.int64, device=device())
    for call in (lambda: z.zero(ids), lambda: z.launch_routed(ids, 0, 8),
                 lambda: z.zero_into(torch.zeros(512, dtype=torch.int32, device=device()), ids)):
        with pytest.raises(BlockIdError, match="ZeroTensor"):
            call()
    with pytest.raises(LayoutBufferError, match="ZeroTensor"):
        kc.CudaZeroer(t, torch._efficientzerotensor(512, dtype=torch.int32, device=device()),
                      graphs=False)


def test_the_native_group_argument_is_a_string() -> None:
    class AnyGroup:
        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return hash("b")

    spec = NativeCacheSpec((NativeLeaf("ka", (4, 64), "int32", "a"), NativeLeaf("kb", (4, 64), "int32", "b")))
    arrs = [np.ones((4, 64), np.int32), np.ones((4, 64), np.int32)]
    for call in (lambda: spec.zeroed_mask(AnyGroup()),  # type: ignore[arg-type]
                 lambda: zero_native_numpy(arrs, spec, [1], group=AnyGroup()),  # type: ignore[arg-type]
                 lambda: expected_zeroed_native(spec, [1], group=AnyGroup())):  # type: ignore[arg-type]
        with pytest.raises(SpecError, match="must be a group name") as e:
            call()
        assert e.value.field == "group" and "not AnyGroup" in str(e.value)
    assert all((a == 1).all() for a in arrs) and spec.zeroed_mask("a") == (True, False)


_CT = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}
_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}


def _cases() -> dict[str, dict[str, Any]]:
    return {"inkling_fp8_e5m2": {
        "config": {**INKLING, "quantization_config": _FP8}, "tp": 1, "kv_cache_dtype": "fp8_e5m2",
    }}


shared_answers.register("hybrid", __name__, _cases())


def test_inkling_ignores_compressed_tensors_kv_scheme() -> None:
    """vLLM's engine leaves an auto cache auto for compressed-tensors and only its standard Attention takes
    the scheme; Inkling's attention reads the engine's dtype (source: vllm/models/inkling/nvidia/attention.py,
    ``cache_config.cache_dtype``), so its cache is the model's bfloat16."""
    plain = M.from_config(INKLING, reader="json", device="hopper")
    ct = M.from_config({**INKLING, "quantization_config": {"quant_method": "compressed-tensors",
                                                           "kv_cache_scheme": _CT}}, reader="json")
    assert ct.bytes_per_block == plain.bytes_per_block
    assert {x.dtype for g in ct.spec.groups for x in g.layers} == {"bfloat16"}


def test_inkling_fp8_e5m2_with_an_fp8_checkpoint_is_built(tmp_path: Any) -> None:
    pytest.importorskip("vllm")
    from tests.test_models_hybrid_vllm import vllm_answers

    got = shared_answers.answers("hybrid", __name__, _cases(), vllm_answers)["inkling_fp8_e5m2"]
    assert "error" not in got, got
    assert shared_answers.differing({"inkling_fp8_e5m2": got}, _cases()) == set()
