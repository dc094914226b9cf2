"""Hostile pass 20 (/tmp/h20): one regression test per fixed finding, each failing on the code before its
fix (9dc7d0d). Buffers are poisoned (no zero byte) and compared with the contract byte for byte; configs
vLLM 0.33 refuses or builds were shown so by its own construction (tests/test_models_hybrid_vllm.py's driver:
the small configs there, ``mamba2_inner640`` and ``granite_all_mamba_kv3``)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.errors import BlockIdError, LayoutBufferError, SpecError
from kvlayout.reference import compare_to_ranges
from kvlayout.spec import MambaSpec
from tests.test_models_mimo_v2 import FLASH


class _Liar(int):
    """Its value is 19; int() and __index__() say 3 (NumPy's inference reads __index__)."""

    def __int__(self) -> int:
        return 3

    def __index__(self) -> int:
        return 3


@pytest.mark.parametrize("n", [3, 70, 4096])
def test_h1_a_long_list_with_a_lying_int_is_refused_before_any_write(n: int) -> None:
    """H1 (HIGH): CudaZeroer's 65-4,096-id list path converted with NumPy's inference, which took
    __index__ (3) where the value was 19: block 3 was zeroed. 0-d arrays in such lists were taken too."""
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    t = K.plan(K.preset("dsv4-test").with_num_blocks(100))
    z_ids = [_Liar(19)] + [20 + i % 70 for i in range(n - 1)]
    for bad in (z_ids, [np.array(19)] + z_ids[1:]):
        buf = torch.from_numpy(K.poison_pattern(t.total_bytes).copy())
        before = buf.clone()
        with pytest.raises(BlockIdError, match=r"^block_ids\[0\]"):
            kc.CudaZeroer(t, buf, max_batch=8192).zero(bad)
        assert torch.equal(buf, before)
    if n > 100:  # the interpreter zeroes a 4,096-id batch in 45 s: the refusals above are the point here
        return
    good = [19] + z_ids[1:]  # the same batch of plain ints: zeroed as the contract says
    buf = torch.from_numpy(K.poison_pattern(t.total_bytes).copy())
    before = buf.clone()
    kc.CudaZeroer(t, buf, max_batch=8192).zero(good)
    assert (K.changed_ranges(before.numpy(), buf.numpy()) == K.expected_zeroed(t, good)).all()


@pytest.mark.parametrize(("field", "value"), [("num_key_value_heads", 16), ("num_key_value_heads", 3),
                                              ("swa_num_key_value_heads", 3)])
def test_h2_mimo_v2_kv_heads_must_divide_the_query_heads_per_rank(field: str, value: int) -> None:
    """H2 (HIGH): MiMo-V2 with 16 (or 3) KV heads beside 8 query heads was planned; vLLM's Attention asserts
    ``num_heads % num_kv_heads == 0`` per rank ("num_heads (8) is not divisible by num_kv_heads (16)")."""
    with pytest.raises(SpecError, match=rf"^config\.{field} = {value}: the 8 query heads per rank"):
        M.from_config({**FLASH, field: value}, reader="json")
    assert isinstance(M.from_config(FLASH, reader="json", tp=2), M.ModelSpec)  # the published shape plans


MAMBA: dict[str, Any] = {
    "architectures": ["MambaForCausalLM"], "model_type": "mamba", "torch_dtype": "bfloat16",
    "hidden_size": 256, "num_hidden_layers": 2, "state_size": 16, "conv_kernel": 4, "expand": 2,
}


def test_m1_a_mamba_layer_config_of_another_class_must_write_its_inner_size() -> None:
    """M1 (MEDIUM): MambaForCausalLM with model_type mamba2 and no intermediate_size was planned from
    expand * hidden_size; vLLM reads the Mamba2Config, which has none ("no attribute 'intermediate_size'")."""
    with pytest.raises(SpecError, match=r"^config\.model_type = 'mamba2': write intermediate_size"):
        M.from_config({**MAMBA, "model_type": "mamba2"}, reader="json")
    ms = M.from_config({**MAMBA, "model_type": "mamba2", "intermediate_size": 512}, reader="json")
    assert isinstance(ms, M.ModelSpec) and ms.bytes_per_block == 2 * (3 * 512 * 2 + 512 * 16 * 2)


def test_m2_images_and_ranges_that_are_not_plain_data_are_named() -> None:
    """M2 (MEDIUM): changed_ranges(b, None), an object array, and malformed expected ranges got NumPy's raw
    TypeError / ValueError / OverflowError."""
    b = K.poison_pattern(64)
    with pytest.raises(LayoutBufferError, match=r"^after = '?object'?: must be an array of plain data"):
        K.changed_ranges(b, None)  # type: ignore[arg-type]
    with pytest.raises(LayoutBufferError, match=r"^before = '?object'?"):
        K.changed_ranges(np.ones(64, object), b)
    for exp in ([0, 8, 16], [[0, float("nan")]], [[0, 2**70]], None):
        with pytest.raises(LayoutBufferError, match=r"^expected = .*: must be \[k, 2\] integer"):
            compare_to_ranges(b, b.copy(), exp)  # type: ignore[arg-type]
    assert compare_to_ranges(b, b.copy(), [[0, 0]]).matches  # a plain list of ranges still reads


def test_m2_a_numpy_leaf_is_named_by_the_cache_zeroer() -> None:
    """M2 (MEDIUM): a NumPy masked-array leaf got JAX's raw ValueError from apply and __call__."""
    jax = pytest.importorskip("jax")
    kp = pytest.importorskip("kvlayout.backends.pallas")
    import jax.numpy as jnp

    host = (np.arange(6 * 4 * 8, dtype=np.float32) + 1).reshape(6, 4, 8)
    z = kp.CacheZeroer({"k": jnp.asarray(host), "v": jnp.asarray(host)}, kernel="triton", interpret=True)
    v = jnp.asarray(host)
    for path in ("apply", "__call__"):
        with pytest.raises(LayoutBufferError, match=r"^leaf 'k' = '?MaskedArray'?: must be a jax.Array"):
            getattr(z, path)({"k": np.ma.masked_array(host.copy()), "v": v}, [1])
    with pytest.raises(LayoutBufferError, match=r"^leaf 'k' = '?float64\(6, 4, 8\)'?: must be float32"):
        z.apply({"k": host.astype(np.float64), "v": v}, [1])
    with pytest.raises(LayoutBufferError, match=r"^leaf 'k' = '?ndarray'?: must be a jax.Array"):
        z.apply({"k": host.copy(), "v": v}, [1])  # a host leaf of the right dtype: not zeroed in place
    assert np.array_equal(np.asarray(v), host) and jax.devices()  # nothing ran


MAMBA2: dict[str, Any] = {
    "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "torch_dtype": "bfloat16",
    "hidden_size": 256, "num_hidden_layers": 2, "expand": 2, "num_heads": 8, "head_dim": 64, "n_groups": 1,
    "state_size": 64, "conv_kernel": 4,
}


def test_l2_mamba2_takes_a_written_intermediate_size_as_vllms_mixer_does() -> None:
    """L2 (LOW): intermediate_size 640 beside expand * hidden_size = 512 was refused; vLLM's Mamba2 mixer
    takes it (getattr) and its state shapes follow the mixer (tests/test_models_hybrid_vllm.py:
    mamba2_inner640, built by vLLM)."""
    ms = M.from_config({**MAMBA2, "intermediate_size": 640}, reader="json")
    assert isinstance(ms, M.ModelSpec)
    state = 3 * (640 + 2 * 64) * 2 + 8 * 64 * 64 * 2  # conv (3, 640 + 2 * 1 * 64), ssm (8, 64, 64), bf16
    assert [x.state_bytes for _, x in ms.spec.layers if isinstance(x, MambaSpec)] == [state, state]


def test_l3_a_hybrid_without_attention_layers_keeps_any_kv_heads() -> None:
    """L3 (LOW): an all-Mamba Granite 4.0-H with 3 KV heads beside 8 query heads was refused by the per-rank
    rule; vLLM builds no Attention there (its block alignment still reads the heads:
    granite_all_mamba_kv3 in tests/test_models_hybrid_vllm.py)."""
    from tests.test_models_hybrid_vllm import _BASE, CONFIGS

    cfg = {**_BASE, **CONFIGS["granite_all_mamba_kv3"]}
    ms = M.from_config(cfg, reader="json")
    assert isinstance(ms, M.ModelSpec) and ms.kinds and set(ms.kinds.values()) == {"mamba"}
    with pytest.raises(SpecError, match=r"^config\.num_key_value_heads = 3: the 8 query heads per rank"):
        M.from_config({**cfg, "layer_types": ["attention"] + cfg["layer_types"][1:]}, reader="json")


def test_l4_messages_name_what_is_wrong() -> None:
    """L4 (LOW): a Mamba2 conv width not divisible by tp was shown as n_groups = 73; tpu-inference with a
    Mamba-only config failed deep inside on an empty leaf list."""
    said = r"^config\.n_groups = 2: conv channels 9 \+ 2 \* 2 groups \* 16 = 73"
    with pytest.raises(SpecError, match=said):
        M.from_config({**MAMBA2, "hidden_size": 9, "expand": 1, "num_heads": 1, "head_dim": 9, "n_groups": 2,
                       "state_size": 16}, reader="json", tp=2)
    res = subprocess.run(
        [sys.executable, "-m", "kvlayout", "plan", "--config", "/dev/stdin", "--engine", "tpu-inference"],
        input=__import__("json").dumps(MAMBA), capture_output=True, text=True,
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "MambaForCausalLM without an attention layer are not read" in res.stderr
