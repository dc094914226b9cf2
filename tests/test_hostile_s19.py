"""Hostile pass 19 (/tmp/h19): one regression test per finding that is fixed, each failing on the code
before its fix (a2e18cb). Buffers are poisoned (no zero byte) and compared byte for byte."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.errors import LayoutBufferError, SpecError
from kvlayout.reference import compare_to_contract
from kvlayout.sharding import shard_spec


def test_f1_sharded_cuda_refuses_an_oversized_shard_before_writing_any() -> None:
    """F1 (HIGH): a block-sharded ShardedCudaZeroer zeroed shard 0, then refused shard 1's batch (more
    owned ids than max_batch): the refusal left shard 0 written."""
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    from kvlayout.errors import BlockIdError

    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 2}, block_axes=("dp",))
    bufs = {k: torch.from_numpy(K.poison_pattern(lay.shard_bytes).copy()) for k in range(2)}
    before = {k: b.clone() for k, b in bufs.items()}
    z = kc.ShardedCudaZeroer(lay, bufs, max_batch=2)
    with pytest.raises(BlockIdError, match="batch of 3 exceeds max_batch 2"):
        z.zero([0, 1, 8, 9, 10])  # shard 0 owns 2 ids (fits), shard 1 owns 3
    for k in range(2):
        assert torch.equal(bufs[k], before[k]), k
    z.zero([0, 9])  # within max_batch on both shards: written as the contract says
    for k, ids in ((0, [0]), (1, [1])):
        t = lay.local_table
        got = K.changed_ranges(before[k].numpy(), bufs[k].numpy())
        assert (got == K.expected_zeroed(t, ids)).all(), k


def test_f6_a_truncated_image_is_refused_not_passed() -> None:
    """F6 (LOW): compare_to_contract and ShardedLayout.compare reported a match on 3-byte images (the
    expected ranges past the image's end were dropped)."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(4))
    img = np.zeros(3, np.uint8)
    with pytest.raises(LayoutBufferError, match=r"^before = 3 B: must hold bytes \[0, 599040\)"):
        compare_to_contract(img, img.copy(), t, [1])
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 1}, block_axes=("dp",))
    with pytest.raises(LayoutBufferError, match=r"^before = 3 B"):
        lay.compare(img, img.copy(), [1])
    # an image holding the layout past a guard band still compares; one byte short of it is refused
    full = K.poison_pattern(t.total_bytes + 64)
    after = full.copy()
    K.ReferenceBackend(t, after, offset=64).zero([1])
    assert compare_to_contract(full, after, t, [1], origin=64).matches
    with pytest.raises(LayoutBufferError, match=r"must hold bytes \[65, 599105\) \(the layout at origin 65"):
        compare_to_contract(full, after, t, [1], origin=65)
    with pytest.raises(LayoutBufferError, match="^before"):
        compare_to_contract(full, after, t, [1], origin=-1)
    # the lower-level compare_to_ranges takes a window (any origin), but not expected ranges past it
    from kvlayout.reference import compare_to_ranges

    img8 = K.poison_pattern(8)
    assert compare_to_ranges(img8, img8.copy(), np.zeros((0, 2), np.int64), -1000).matches
    with pytest.raises(LayoutBufferError, match=r"^before = 8 B: must hold bytes \[0, 16\)"):
        compare_to_ranges(img8, img8.copy(), np.array([[0, 16]]), 0)


def test_f7_changed_ranges_of_unequal_images_names_the_field() -> None:
    """F7 (LOW): images of different sizes raised a bare ValueError."""
    with pytest.raises(LayoutBufferError, match=r"^after = 4 B: must have as many bytes as before \(3\)"):
        K.changed_ranges(np.zeros(3, np.uint8), np.zeros(4, np.uint8))


def _llama(**kw: Any) -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
            "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
            **kw}


def test_f8_more_kv_heads_than_query_heads_is_refused_by_name() -> None:
    """F8 (LOW): 2**40 KV heads were refused as the layout's size, naming num_blocks (never set)."""
    with pytest.raises(SpecError, match=r"^config\.num_key_value_heads = 1099511627776: more than"):
        M.from_config(_llama(num_key_value_heads=2**40), reader="json")
    with pytest.raises(SpecError, match=r"^config\.num_key_value_heads = 9: more than num_attention_heads"):
        M.from_config(_llama(num_key_value_heads=9), reader="json")
    assert M.from_config(_llama(num_key_value_heads=8), reader="json").spec.layers  # type: ignore[union-attr]
    # per rank, as vLLM's Attention asserts num_heads % num_kv_heads == 0: 12 query heads over 8 KV heads
    # (vLLM's construction: "num_heads (12) is not divisible by num_kv_heads (8)"); 8 over 4 at tp 2 builds
    with pytest.raises(SpecError, match=r"^config\.num_key_value_heads = 8: the 12 query heads per rank"):
        M.from_config(_llama(num_attention_heads=12, hidden_size=768, num_key_value_heads=8), reader="json")
    tp2 = M.from_config(_llama(num_key_value_heads=4), reader="json", tp=2)
    assert isinstance(tp2, M.ModelSpec) and tp2.spec.layers
    res = subprocess.run(
        [sys.executable, "-m", "kvlayout", "plan", "--config", "/dev/stdin", "--reader", "json"],
        input=__import__("json").dumps(_llama(num_key_value_heads=2**40)), capture_output=True, text=True,
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "num_key_value_heads" in res.stderr
