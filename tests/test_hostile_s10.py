"""Issue 25's seventh fresh hostile pass (2026-12-05, a reviewer who did not write the fixes): one
regression test per defect it found.

- High: a ``numpy.matrix`` buffer (an ndarray subclass whose reshape stays 2-D) was taken by the
  reference zeroer, ``zero_native_numpy`` and ``ShardedLayout.zero_reference``: the 1-D slices then
  landed on other blocks' bytes (blocks 2 and 6 cleared for blocks 1 and 3) and missed row 1.
- Medium: ``CudaZeroer`` on a quantized tensor segfaulted (torch's uint8 view of it); conjugate and
  negative views and nested tensors raised torch's RuntimeError.
- Medium: a sharded pool's gathered bytes and global block count were never bounded: the gathered
  contract's int64 arithmetic wrapped at 2**64 and ``kvlayout shard`` said SAFE for a spec ``plan``
  refuses.
- Low: a bare ``LayerSpec`` in a group raised NotImplementedError when planned.

The eighth pass (another reviewer, after those fixes):

- Medium, wrong bytes: ``KVBlockZeroer.from_kv_caches`` with every layer given as a list of inner
  slots guessed the cache's start (tests/test_mutants_vllm.py, test_lists_alone_do_not_fix_...).
- Medium: a text-only architecture's config with a stray ``text_config`` was planned from it; vLLM
  0.33 refuses such a config (``get_hf_text_config``: no ``num_attention_heads``).
- Low: Llama with ``sliding_window`` and no ``layer_types`` was labelled full (vLLM: every layer takes
  the engine's window); ``dtype`` beside a different ``torch_dtype`` lost to it (transformers keeps
  ``dtype``); ``sliding_window: 0`` refused (vLLM reads it as none).
- Low/medium: ``kvlayout zero`` of a 1 GiB layout took 3.4 GB and 5-12 s: layouts are now at most
  256 MiB on the host.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import kvlayout as K
from kvlayout.cli import main
from kvlayout.errors import LayoutBufferError, SpecError
from kvlayout.sharding import ShardedLayout
from kvlayout.spec import FullAttentionSpec, GroupSpec, LayerSpec
from kvlayout.table import Segment, SegmentTable

_T = SegmentTable(2048, 8, (Segment(0, 64, 32, "g"), Segment(1024, 128, 64, "g")))


def _subclass(kind: str, raw: np.ndarray) -> np.ndarray:
    if kind == "matrix":
        return np.asmatrix(raw)
    if kind == "matrix2d":
        return np.asmatrix(raw.reshape(32, 64))
    if kind == "chararray":
        return raw.view("S1").view(np.char.chararray)
    return raw.view(np.dtype([("a", np.uint8)])).view(np.recarray)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
@pytest.mark.parametrize("kind", ["matrix", "matrix2d", "chararray", "recarray"])
def test_ndarray_subclasses_are_zeroed_as_their_bytes(kind: str) -> None:
    raw = K.poison_pattern(2048)
    buf = _subclass(kind, raw.copy())
    K.ReferenceBackend(_T, buf).zero([1, 3])
    after = np.asarray(buf).view(np.uint8).reshape(-1)
    assert K.changed_ranges(raw, after).tolist() == K.expected_zeroed(_T, [1, 3]).tolist()


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_a_matrix_buffer_through_the_sharded_reference() -> None:
    lay = K.sharding.shard_spec(K.preset("dsv4-test"), {"dp": 2}, block_axes=("dp",))
    raw = K.poison_pattern(lay.gathered_bytes)
    buf = np.asmatrix(raw.copy())
    lay.zero_reference(buf, [51])
    got = K.changed_ranges(raw, np.asarray(buf).reshape(-1))
    assert got.tolist() == lay.expected_zeroed([51]).tolist()


@pytest.mark.parametrize("kind", ["quantized", "conj", "neg", "nested"])
def test_cuda_zeroer_refuses_tensors_that_are_not_plain_memory(kind: str) -> None:
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    if kind == "quantized":
        with warnings.catch_warnings():  # torch's deprecation warning (once per process)
            warnings.simplefilter("ignore")
            buf = torch.quantize_per_tensor(torch.ones(64), 1.0, 0, torch.qint8)
    elif kind == "conj":
        buf = torch.zeros(8, dtype=torch.complex64).conj()
    elif kind == "neg":
        buf = torch._neg_view(torch.zeros(16))
    else:
        with warnings.catch_warnings():  # nested tensors are a prototype (once per process)
            warnings.simplefilter("ignore")
            buf = torch.nested.nested_tensor([torch.zeros(16), torch.zeros(16)])
    if kc.DEVICE_TYPE != "cpu":
        buf = buf.to(kc.DEVICE_TYPE)
    with pytest.raises(LayoutBufferError, match="must be a plain strided tensor") as e:
        kc.CudaZeroer(SegmentTable(64, 4, (Segment(0, 16, 8, "g"),)), buf, graphs=False)
    assert e.value.field == "buffer"


def _big() -> K.KVCacheSpec:
    layer = {"name": "l0", "kind": "full", "block_size": 16, "num_kv_heads": 1, "head_size": 2**25,
             "dtype": "bfloat16"}
    group = {"name": "g", "layers": [layer]}
    doc = {"version": 1, "num_blocks": 2**27, "layout": "packed", "groups": [group]}
    return K.KVCacheSpec.from_json(json.dumps(doc))


def test_a_sharded_pool_past_the_limits_is_refused() -> None:
    with pytest.raises(SpecError) as e:
        ShardedLayout.from_local(_big(), {"dp": 64}, block_axes=("dp",))
    assert str(e.value) == (
        "num_blocks = 8589934592: the global pool of 64 block shards: at most 2**31 - 1 blocks (section 8)"
    )
    with pytest.raises(SpecError) as e:
        ShardedLayout.from_local(_big(), {"tp": 64})
    assert str(e.value) == (
        "gathered_bytes = 18446744073709551616: 64 shards of 288230376151711744 B: must be below 2**62 "
        "(section 8)"
    )
    # at the limits: 2**31 - 1 global blocks are taken, 2**62 gathered bytes are not
    one = ShardedLayout.from_local(_big().with_num_blocks(2**31 - 1), {"dp": 1}, block_axes=("dp",))
    assert one.num_blocks == 2**31 - 1
    half = _big().with_num_blocks(2**30)  # 2**31 B a block: 2**61 B a shard
    assert ShardedLayout.from_local(half, {"tp": 1}).gathered_bytes == 2**61
    with pytest.raises(SpecError, match="^gathered_bytes = 4611686018427387904: 2 shards of"):
        ShardedLayout.from_local(half, {"tp": 2})
    # the largest that fits: 2**31 - 1 global blocks are taken
    ok = ShardedLayout.from_local(_big().with_num_blocks(2**31 // 64 - 1), {"dp": 64}, block_axes=("dp",))
    assert ok.num_blocks < 2**31 - 1


def test_shard_refuses_what_plan_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = json.loads(_big().to_json())
    spec["groups"][0]["layers"][0]["num_kv_heads"] = 64
    p = tmp_path / "big.json"
    p.write_text(json.dumps(spec))
    assert main(["plan", str(p)]) == 2
    capsys.readouterr()
    assert main(["shard", str(p), "--mesh", "tp=64", "--head-axes", "tp"]) == 2
    err = capsys.readouterr().err
    assert "gathered_bytes" in err and "2**62" in err and len(err.strip().splitlines()) == 1


def test_a_bare_layer_spec_is_refused_by_its_group() -> None:
    with pytest.raises(SpecError) as e:
        GroupSpec("g", (FullAttentionSpec("a", 16, 1, 8, "bfloat16"), LayerSpec("x")))
    assert (e.value.field, e.value.value) == ("group 'g'.layers[1]", "LayerSpec")
    assert str(e.value) == (
        "group 'g'.layers[1] = 'LayerSpec': must be a layer spec of a kind (FullAttentionSpec, MLASpec, "
        "MambaSpec, ...)"
    )


_LLAMA = Path(__file__).resolve().parent / "fixtures" / "models" / "llama" / "config.json"


def _llama(**changes: object) -> dict[str, object]:
    return {**json.loads(_LLAMA.read_text()), **changes}


def test_a_text_only_config_with_a_text_config_is_refused_as_vllm_refuses_it() -> None:
    import kvlayout.models as M

    stray = {"num_attention_heads": 8, "num_key_value_heads": 1, "hidden_size": 1024, "num_hidden_layers": 2}
    with pytest.raises(SpecError) as e:
        M.from_config(_llama(text_config=stray))
    assert e.value.field == "config.text_config" and "vLLM 0.33 refuses" in str(e.value)
    assert isinstance(M.from_config(_llama(text_config=None)), M.ModelSpec)  # null: no nested config


def test_llama_windows_dtype_and_a_zero_window_as_vllm_reads_them() -> None:
    import kvlayout.models as M

    ms = M.from_config(_llama(num_hidden_layers=2, sliding_window=4096))
    assert set(ms.kinds.values()) == {"sliding"}
    assert {x.window for _, x in ms.spec.layers} == {4096}
    ms = M.from_config(_llama(num_hidden_layers=2, sliding_window=0))
    assert set(ms.kinds.values()) == {"full"} and "sliding_window 0: vLLM reads it as no window" in ms.notes
    ms = M.from_config(_llama(num_hidden_layers=2, torch_dtype="float16", dtype="bfloat16"))
    assert (ms.dtype, ms.kv_cache_dtype) == ("bfloat16", "bfloat16")


def test_zero_refuses_layouts_past_its_host_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvlayout import cli

    assert cli.MAX_HOST_BYTES == 2**28
    p = tmp_path / "config.json"
    p.write_text(json.dumps(_llama(num_hidden_layers=257)))  # 16 blocks of 257 layers: just over 256 MiB
    assert main(["zero", "--config", str(p), "--blocks", "0"]) == 2
    err = capsys.readouterr().err
    assert "above the 268435456 B this command checks on the host" in err and len(err.splitlines()) == 1
