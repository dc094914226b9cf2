"""Issue 25's fresh hostile pass over the fifth session's changes: one regression test per defect found.

- A config whose ``hidden_size`` is below ``num_attention_heads`` (head size ``hidden // heads`` = 0)
  crashed every hybrid family (Jamba, Granite 4.0-H, LFM2, LFM2-MoE, OLMo hybrid) with a raw
  ``ZeroDivisionError`` in the block alignment (``state // (unit * 0)``), a traceback from the CLI.
- A backend target naming a relative module (``--backend ..:x``, ``.x:y``) reached
  ``importlib.import_module``, whose ``TypeError`` escaped as a traceback (zero and conformance).
- The cuda zeroer took a tensor off its device as host ids through ``.cpu().numpy()``: a bfloat16 or
  float8 tensor raised ``TypeError`` (natively every CPU tensor goes this way), a meta tensor
  ``NotImplementedError``; a sparse tensor on the device raised ``RuntimeError`` in ``.contiguous()``;
  ``ShardedCudaZeroer`` the same. Now ``BlockIdError``, nothing written.
- ``np.timedelta64`` is an ``np.integer`` subclass (its arrays an integer subdtype): a timedelta array
  was taken as block ids, a list of timedeltas (and a spec field holding one) raised a raw
  ``TypeError`` from ``int()``; the Pallas zeroers' traced ``apply`` likewise.
- Zamba2's attention names looped over every one of ``num_mem_blocks`` shared blocks times every
  hybrid layer: ``num_mem_blocks`` 10**7 took 6.6 s, 10**12 ran without end (exit only by a kill).
- The vLLM plugin's verify step (``checked_step_ids``) took tensors inside the scheduler's list as ids:
  ``[torch.tensor(True)]`` zeroed block 1, ``[torch.tensor([3])]`` block 3.
- ``KVBlockZeroer.zero_block_ids`` of a group without rows (Mamba state) bounds-checked CPU tensors
  through ``.numpy()``: bfloat16 and sparse tensors raised a raw ``TypeError``.
- The Pallas zeroers' ``lower(num_ids)`` passed any value to JAX: -1 and 2.5 raised ``TypeError``,
  2**40 ``OverflowError``; ``True`` lowered a 1-id step.
- Granite 4.0-H read as written planned a Mamba2 state whose ``mamba_d_head * mamba_n_heads`` is not
  ``mamba_expand * hidden_size`` (``auto`` with heads not dividing it, or a written head size), a
  config transformers' ``GraniteMoeHybridConfig`` (hence vLLM) refuses: bytes vLLM never allocates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.cli import main

from .test_models_hybrid_vllm import CONFIGS as HYBRIDS

_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"


def _hybrid_configs() -> dict[str, dict[str, Any]]:
    names = ("granitemoehybrid", "lfm2", "lfm2_moe", "olmo_hybrid")
    out = {name: {"torch_dtype": "bfloat16", **HYBRIDS[name]} for name in names}
    out["jamba"] = json.loads((_FIXTURES / "jamba" / "config.json").read_text())
    return out


def test_head_size_zero_is_a_spec_error_naming_hidden_size(tmp_path: Path, capsys: Any) -> None:
    """hidden_size < num_attention_heads: refused naming hidden_size (was ZeroDivisionError)."""
    for name, cfg in _hybrid_configs().items():
        for engine in ("vllm", "tpu-inference"):
            with pytest.raises(K.SpecError, match=r"hidden_size = 1: .*head size") as e:
                M.from_config({**cfg, "hidden_size": 1}, engine=engine)
            assert e.value.field.endswith("hidden_size"), name
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_hybrid_configs()["lfm2"], "hidden_size": 3}))
    assert main(["plan", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.hidden_size = 3" in err and "Traceback" not in err


def test_relative_backend_target_is_a_backend_error(capsys: Any) -> None:
    """``module:attr`` with a relative module: one line, exit 2 (was a raw TypeError)."""
    for target in ("..:x", ".x:y", ".:Backend"):
        with pytest.raises(K.BackendError, match=r"must be 'module:attr' \(an absolute module\)"):
            K.registry.load(target)
        assert main(["zero", "--preset", "dsv4-test", "--blocks", "0", "--backend", target]) == 2
        assert main(["conformance", "--backend", target]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 2 and f"backend target = {target!r}" in err


def test_cuda_zeroer_refuses_tensors_numpy_cannot_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Meta, sparse and (native, CPU) bfloat16 / float8 id tensors: BlockIdError, nothing written."""
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    Z = pytest.importorskip("kvlayout.backends.cuda.zeroer")
    if kc.MODE == "native":
        pytest.skip("the interpreter's CPU tensors: natively covered by the monkeypatched case's logic")
    table = K.plan(K.preset("dsv4-test").with_num_blocks(4))
    data = K.poison_pattern(table.total_bytes)
    buf = torch.from_numpy(data.copy())
    z = kc.CudaZeroer(table, buf, graphs=False)
    lay = K.shard_spec(K.preset("dsv4-test").with_num_blocks(4), {"dp": 2}, block_axes=("dp",))
    bufs = [torch.from_numpy(K.poison_pattern(lay.shard_bytes)) for _ in range(2)]
    before = [b.clone() for b in bufs]
    sz = kc.ShardedCudaZeroer(lay, bufs, graphs=False)
    bad = [torch.tensor([1], device="meta"), torch.tensor([1]).to_sparse()]
    for zeroer in (z, sz):
        for ids in bad:
            with pytest.raises(K.BlockIdError, match=r"block_ids.*(meta|sparse)"):
                zeroer.zero(ids)
    # natively a CPU tensor is host ids: NumPy has no bfloat16 / float8 (was a raw TypeError)
    monkeypatch.setattr(Z, "MODE", "native")
    monkeypatch.setattr(Z, "DEVICE_TYPE", "cuda")
    monkeypatch.setattr("kvlayout.backends.cuda.sharded.DEVICE_TYPE", "cuda")
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        for zeroer in (z, sz):
            with pytest.raises(K.BlockIdError, match=r"block_ids = torch\.(bfloat16|float8_e4m3fn) "):
                zeroer.zero(torch.tensor([1.0]).to(dtype))
    assert np.array_equal(buf.numpy(), data)
    assert all(torch.equal(a, b) for a, b in zip(bufs, before))


def test_timedeltas_are_not_integers() -> None:
    """Timedelta / datetime ids and fields are refused naming them (were taken, or a raw TypeError)."""
    td = np.timedelta64(3, "s")
    for ids in ([td], [1, td], np.array([3], "m8[s]"), np.array([3], "m8"), np.array([3], "M8[D]")):
        with pytest.raises(K.BlockIdError, match=r"block_ids(\[\d\])?(\.dtype)? = .*(timedelta|datetime)"):
            K.reference.normalize_block_ids(ids, 6)
    with pytest.raises(K.SpecError, match=r"block_size = np\.timedelta64\(16,'s'\): must be an integer"):
        K.FullAttentionSpec(
            name="a", block_size=np.timedelta64(16, "s"), num_kv_heads=1, head_size=8, dtype="bfloat16"
        )
    jnp = pytest.importorskip("jax.numpy")
    native = pytest.importorskip("kvlayout.backends.pallas.native")
    z = native.CacheZeroer([jnp.ones((6, 4, 128), jnp.int32)], kernel="tpu", interpret=True)
    for ids in ([td], np.array([3], "m8[s]"), np.array(["2020-01-01"], "M8[D]")):
        with pytest.raises(K.BlockIdError, match=r"block_ids"):
            z.apply([jnp.ones((6, 4, 128), jnp.int32)], ids)


def test_zamba2_num_mem_blocks_is_bounded_work() -> None:
    """Shared blocks past the hybrid layers take none: the names are O(layers) for any num_mem_blocks."""
    import time

    from .test_models_hybrid_vllm import _BASE

    cfg = {**_BASE, **HYBRIDS["zamba2"]}
    names = list(M.from_config(cfg).kinds)
    t0 = time.perf_counter()
    ms = M.from_config({**cfg, "num_mem_blocks": 10**15})
    assert time.perf_counter() - t0 < 5  # was an endless loop
    # one block per hybrid layer: layer k is block k, numbered from k * ceil(H / blocks) = k
    assert [n for n in ms.kinds if n.startswith("model.attn.")] == ["model.attn.0", "model.attn.1"]
    assert [n for n in ms.kinds if not n.startswith("model.attn.")] == [
        n for n in names if not n.startswith("model.attn.")
    ]


def test_vllm_step_ids_refuse_tensor_elements() -> None:
    """Tensors in the step's id list are no ids (a bool tensor was block 1), named by index."""
    torch = pytest.importorskip("torch")
    from kvlayout.integrations.vllm_plugin import checked_step_ids

    for bad, i in (([torch.tensor(True)], 0), ([1, torch.tensor([3])], 1), ([2, torch.tensor(5)], 1)):
        with pytest.raises(K.BlockIdError) as e:
            checked_step_ids(bad, 8)
        assert str(e.value) == f"block_ids[{i}] = {bad[i]!r}: must be an integer (nothing was written)"
    assert checked_step_ids([np.int64(3), 1], 8).tolist() == [3, 1]


def test_vllm_rowless_group_refuses_tensors_numpy_cannot_hold() -> None:
    """A Mamba group's host-id check: bfloat16 / sparse CPU tensors are BlockIdError (were TypeError)."""
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    from kvlayout.integrations.vllm import KVBlockZeroer

    full = K.FullAttentionSpec(name="a", block_size=16, num_kv_heads=2, head_size=8, dtype="bfloat16")
    groups = (K.GroupSpec("g", (full,)), K.GroupSpec("m", (K.MambaSpec(name="c", state_bytes=1024),)))
    table = K.plan(K.KVCacheSpec(8, "packed", groups))
    data = K.poison_pattern(table.total_bytes)
    buf = torch.from_numpy(data.copy()).to(kc.DEVICE_TYPE)  # the CPU under the interpreter, else CUDA
    z = KVBlockZeroer._from_table(table, buf, graphs=False)
    z.group_names = ("g", "m")  # as built from vLLM's KVCacheConfig: the Mamba group has no rows
    for ids in (torch.tensor([1.5], dtype=torch.bfloat16), torch.tensor([1]).to_sparse()):
        for group in ("m", 1):
            with pytest.raises(K.BlockIdError, match=r"^block_ids = torch\.\w+ torch\.\w+ tensor on cpu"):
                z.zero_block_ids(ids, group)
    with pytest.raises(K.BlockIdError, match=r"block_ids\[0\] = 9: outside \[0, 8\)"):
        z.zero_block_ids(torch.tensor([9]), "m")
    assert np.array_equal(buf.cpu().numpy(), data)


def test_pallas_lower_checks_num_ids() -> None:
    """lower(num_ids): an integer in [0, 2**31 - 1], else BlockIdError naming num_ids."""
    jnp = pytest.importorskip("jax.numpy")
    native = pytest.importorskip("kvlayout.backends.pallas.native")
    zeroer = pytest.importorskip("kvlayout.backends.pallas.zeroer")
    zs = (
        native.CacheZeroer([jnp.ones((6, 4, 128), jnp.int32)], kernel="tpu", interpret=True),
        zeroer.PallasZeroer(K.plan(K.preset("dsv4-test").with_num_blocks(4)), kernel="tpu", interpret=True),
    )
    for z in zs:
        for n, why in ((-1, "must be at least 0"), (2.5, "must be an integer"), (True, "must be an integer"),
                       (2**40, "must be at most 2\\*\\*31 - 1")):
            with pytest.raises(K.BlockIdError, match=rf"^num_ids = .*: {why}"):
                z.lower(n)


def test_granite_mamba_head_size_must_cover_the_inner_size() -> None:
    """mamba_d_head * mamba_n_heads != mamba_expand * hidden_size: refused as transformers refuses it."""
    cfg = _hybrid_configs()["granitemoehybrid"]  # inner 2 * 512 = 1024, 16 heads of 64
    M.from_config(cfg)
    M.from_config({**cfg, "mamba_d_head": "auto"})  # 1024 // 16 = 64
    for extra, shown in (
        ({"mamba_d_head": 32}, "32 \\* 16"),
        ({"mamba_d_head": "auto", "mamba_n_heads": 24}, "42 \\* 24"),
        ({"mamba_d_head": "auto", "mamba_n_heads": 3000}, "0 \\* 3000"),
    ):
        want = rf"^config\.mamba_d_head = .*: mamba_d_head \* mamba_n_heads = {shown}: must be"
        with pytest.raises(K.SpecError, match=want):
            M.from_config({**cfg, **extra})
