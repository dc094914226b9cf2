"""kvlayout.sharding's compare (session 22, mutation coverage): the images must hold the whole gathered
layout from ``origin``, not only the ranges the ids clear (a truncated gathered image passed).

Byte counts: the spec below over dp = 2 gathers two 1,024-byte shards (2,048 bytes);
block 0's pages are its first 128 bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import LayoutBufferError
from kvlayout.sharding import ShardedLayout


def spec() -> K.KVCacheSpec:
    """tests/test_mutants_sharding.py's spec (copied: a survivor rerun stages this file alone): one group of
    a full and a sliding-window layer, block 1, 4 KV heads of size 2, float32, 6 blocks."""
    page = {"block_size": 1, "num_kv_heads": 4, "head_size": 2, "dtype": "float32"}
    layers = [{"name": "f", "kind": "full", **page},
              {"name": "w", "kind": "sliding_window", "window": 8, **page}]
    groups = [{"name": "g", "layers": layers}]
    return K.KVCacheSpec.from_dict({"num_blocks": 6, "layout": "packed", "groups": groups})


@pytest.mark.parametrize("ids", [[], [0]])
def test_compare_refuses_an_image_shorter_than_the_gathered_layout(ids: list[int]) -> None:
    """An image holding block 0's bytes but one byte short of the gathered layout is refused, by the
    field 'before' and its size, naming the bytes it must hold; the full image compares."""
    lay = ShardedLayout.from_local(spec(), {"dp": 2}, block_axes=("dp",))
    assert lay.gathered_bytes == 2048 and lay.expected_zeroed([0]).tolist() == [[0, 128]]
    before = K.poison_pattern(2048)
    after = before.copy()
    lay.zero_reference(after, ids)
    assert lay.compare(before, after, ids).matches
    with pytest.raises(LayoutBufferError) as e:
        lay.compare(before[:2047], after[:2047], ids)
    assert e.value.field == "before" and e.value.value == "2047 B"
    why = "must hold bytes [0, 2048) (the layout at origin 0 and the ranges expected zeroed)"
    assert str(e.value) == f"before = 2047 B: {why}"
    guard = np.concatenate([K.poison_pattern(16, seed=9), before])  # the layout from origin 16
    with pytest.raises(LayoutBufferError, match=r"^before = 2063 B: must hold bytes \[16, 2064\)"):
        lay.compare(guard[:-1].copy(), guard[:-1].copy(), ids, origin=16)
    assert lay.compare(guard, guard.copy(), [], origin=16).matches
