"""Issue 25's fresh hostile pass over the fourth session's changes: one regression test per defect found.

- The cuda zeroer's one-shot launch (one program per work item on a ``(units, ids)`` grid) must keep
  the grid's product within int32: Triton's native launcher multiplies ``gridX * gridY * gridZ`` as C
  ints and launches only when the product is positive, so a grid of 2**31 programs or more was
  skipped without an error and wrote nothing (65,535 ids of a table with 32,776 units per block).
- The spec parse's repeated-layer reuse must not turn a non-JSON layer (a dict key that is not a
  string) into a raw ``TypeError``: it is refused as before, naming the field.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

import kvlayout as K

INT32_MAX = 2**31 - 1


def _bad_key_spec() -> dict[str, Any]:
    layer: dict[Any, Any] = {
        "kind": "full",
        "name": "a",
        "block_size": 16,
        "num_kv_heads": 1,
        "head_size": 8,
        "dtype": "bfloat16",
        1: 2,
    }
    return {"num_blocks": 4, "layout": "packed", "groups": [{"name": "g", "layers": [layer]}]}


def test_layer_with_a_non_string_key_is_a_spec_error() -> None:
    """A Python dict layer with a key that is not a str is refused naming it (was a raw TypeError)."""
    with pytest.raises(K.SpecError, match=r"groups\[0\]\.layers\[0\]\.1 = 2: unknown field"):
        K.KVCacheSpec.from_dict(_bad_key_spec())
    # the same in a repeated layer, and with other non-string keys
    for key in (None, ("a",), 2.5, b"x"):
        data = _bad_key_spec()
        first = dict(data["groups"][0]["layers"][0])
        del first[1]
        bad = dict(first, name="b")
        bad[key] = 1
        data["groups"][0]["layers"] = [first, bad]
        with pytest.raises(K.SpecError, match=r"groups\[0\]\.layers\[1\]\..* unknown field") as e:
            K.KVCacheSpec.from_dict(data)
        assert e.value.value == 1


class _GridSpy:
    """Stands in for ``zero_units_kernel``: records each launch's grid and runs nothing."""

    def __init__(self) -> None:
        self.grids: list[tuple[int, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        self.grids.append(tuple(grid))
        return lambda *args, **kwargs: None


def test_one_shot_grid_product_fits_int32(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    zmod = sys.modules[kc.CudaZeroer.__module__]
    # one float32 layer of 524,416 B per block: 32,776 units of 4 words (16 B)
    layer = K.FullAttentionSpec(name="l", block_size=16, num_kv_heads=1, head_size=4097, dtype="float32")
    spec = K.KVCacheSpec(num_blocks=2, layout="packed", groups=(K.GroupSpec(name="g", layers=(layer,)),))
    t = K.plan(spec)
    buf = torch.zeros(t.total_bytes // 4, dtype=torch.int32, device=kc.DEVICE_TYPE)
    spy = _GridSpy()
    monkeypatch.setattr(zmod, "zero_units_kernel", spy)
    monkeypatch.setattr(zmod, "route_ids_kernel", _GridSpy())  # the ids are not packed: only grids matter
    for small, programs in ((True, None), (True, 1 << 30), (False, None)):
        z = kc.CudaZeroer(t, buf, chunk_words=4, max_programs=programs, graphs=False, small_batch=small)
        units = z._plan_for(None).plan.units_per_block
        assert units == 32776
        for n in (1, 2, 65_520, 65_521, 65_535, 65_536, 70_000):
            ids = torch.zeros(n, dtype=torch.int64, device=kc.DEVICE_TYPE)  # duplicates are fine
            spy.grids.clear()
            z.zero(ids)
            z.launch_routed(ids, 0, t.num_blocks)
            z._launch(ids, count=torch.tensor([n], dtype=torch.int32, device=kc.DEVICE_TYPE))
            for grid in spy.grids:
                product = 1
                for g in grid:
                    product *= g
                assert 0 < product <= INT32_MAX, (small, programs, n, grid)
                assert grid[0] <= INT32_MAX and (len(grid) == 1 or grid[1] <= 65535), (n, grid)
            # the one-shot grid is still taken while its product fits (65,520 * 32,776 < 2**31)
            assert (spy.grids[0] == (units, n)) is (small and n <= 65_520), (programs, n, spy.grids)


def test_per_array_arguments_refuse_a_0d_array() -> None:
    """``spec_from_arrays``' names, groups and zeroed as a 0-d NumPy array: a SpecError naming the
    field (was a raw ``TypeError: iteration over a 0-d array``); 1-D arrays are still lists."""
    np = pytest.importorskip("numpy")
    arrays = [np.zeros((4, 16), np.float32), np.zeros((4, 16), np.float32)]
    for field, value in (("names", np.array("kv")), ("groups", np.array("g")), ("zeroed", np.array(True))):
        with pytest.raises(K.SpecError, match=f"^{field} = .*one entry per array") as e:
            K.spec_from_arrays(arrays, **{field: value})
        assert e.value.field == field
    spec = K.spec_from_arrays(arrays, names=np.array(["k", "v"]), groups=np.array(["g", "g"]))
    assert [leaf.name for leaf in spec.leaves] == ["k", "v"]


def test_conflicting_kv_head_fields_are_refused() -> None:
    """A config writing ``num_kv_heads`` (or ``n_head_kv``) next to a different ``num_key_value_heads``:
    vLLM 0.33's Llama layers take ``num_key_value_heads`` (8 heads: checked by building the model, the
    test_models_generic driver) while ModelConfig takes the first alias; kvlayout planned 1 head, an
    eighth of each page. Refused naming the field; equal values still plan."""
    import kvlayout.models as M

    base = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "num_hidden_layers": 2,
        "torch_dtype": "bfloat16",
    }
    for key in ("num_kv_heads", "n_head_kv", "multi_query_group_num"):
        with pytest.raises(K.SpecError, match=r"differs from .* = [18]") as e:
            M.from_config({**base, key: 1})
        assert e.value.field in (f"config.{key}", "config.num_key_value_heads")
        ms = M.from_config({**base, key: 8})
        assert {layer.num_kv_heads for _, layer in ms.spec.layers} == {8}
