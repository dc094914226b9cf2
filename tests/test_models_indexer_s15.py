"""DeepSeek-V3.2's IndexCache schedule (hostile pass 13, F1): vLLM 0.33 builds the indexer cache only on
the layers ``index_topk_freq`` / ``index_topk_pattern`` schedule; kvlayout plans the same layers (it refused
such a config in the fifteenth session; vLLM's construction: tests/test_models_indexcache_vllm.py), never
an indexer on every layer; and the pass's message findings (F4, F6, F7)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError

FIXTURE = Path(__file__).parent / "fixtures" / "models" / "deepseek_v32" / "config.json"


def _config(**extra: Any) -> dict[str, Any]:
    data = json.loads(FIXTURE.read_text())
    data.update(extra)
    return data


def _indexers(data: dict[str, Any]) -> int:
    kinds = M.from_config(data).kinds
    return sum(1 for name, kind in kinds.items() if kind == "indexer" and name.endswith("indexer.k_cache"))


def test_every_layer_has_an_indexer_without_a_schedule() -> None:
    n = _config()["num_hidden_layers"]
    assert _indexers(_config()) == n
    assert _indexers(_config(index_topk_freq=1)) == n  # freq 1: every layer, as vLLM builds it
    assert _indexers(_config(index_topk_pattern="F" * n)) == n


@pytest.mark.parametrize(
    ("extra", "indexed"),
    [
        ({"index_topk_freq": 4}, [0, 1] + list(range(5, 61, 4))),  # max(i - 1, 0) % 4 == 0
        ({"index_topk_freq": 2, "index_skip_topk_offset": 0}, list(range(1, 61, 2))),  # (i + 1) % 2 == 0
        ({"index_topk_pattern": "F" + "S" * 60}, [0]),
        ({"index_topk_pattern": ["F", "S"]}, [0] + list(range(2, 61))),  # layers past the pattern: full
    ],
)
def test_a_scheduled_indexer_is_planned(extra: dict[str, Any], indexed: list[int]) -> None:
    """Planned since the sixteenth session as vLLM builds it (tests/test_models_indexcache_vllm.py)."""
    kinds = M.from_config(_config(**extra)).kinds
    got = sorted(int(name.split(".")[2]) for name, kind in kinds.items() if kind == "indexer")
    assert got == indexed
    assert sum(1 for kind in kinds.values() if kind == "mla") == 61


@pytest.mark.parametrize("bad", [0, 1.5, "4", True])
def test_a_bad_frequency_is_named(bad: object) -> None:
    with pytest.raises(SpecError, match=r"config\.index_topk_freq = "):
        M.from_config(_config(index_topk_freq=bad))


def test_a_pattern_of_another_type_is_named() -> None:
    with pytest.raises(SpecError, match=r"config\.index_topk_pattern = 7: must be a string"):
        M.from_config(_config(index_topk_pattern=7))


def test_cli_plans_a_scheduled_indexer(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(index_topk_freq=4)))
    r = subprocess.run(
        [sys.executable, "-m", "kvlayout", "plan", "--config", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "indexer" in r.stdout


def test_a_block_size_no_backend_takes_is_named_as_the_block_size() -> None:
    """Hostile pass 13, F7: the block size the user set is the field no backend takes, not the cache dtype."""
    llama = Path(__file__).parent / "fixtures" / "models" / "llama" / "config.json"
    with pytest.raises(SpecError, match=r"^block_size = 7: no vLLM attention backend on hopper takes it"):
        M.from_config(llama, block_size=7)
    assert M.from_config(llama, block_size=16).block_size == 16


def test_an_unknown_tpu_inference_option_is_named() -> None:
    """Hostile pass 13, F6: an option tpu-inference does not take is a SpecError naming it."""
    llama = Path(__file__).parent / "fixtures" / "models" / "llama" / "config.json"
    with pytest.raises(SpecError, match=r"^page_size = 0: not an option of engine tpu-inference \(valid: tp"):
        M.from_config(llama, engine="tpu-inference", page_size=0)


def _nested(kind: type, depth: int) -> Any:
    top: Any = kind()
    cur = top
    for _ in range(depth):
        nxt: Any = kind()
        if kind is dict:
            cur["text_config"] = nxt
        else:
            cur.append(nxt)
        cur = nxt
    return top


@pytest.mark.parametrize("reader", ["json", "auto", "transformers"])
def test_a_config_nested_past_the_recursion_limit_is_named(reader: str) -> None:
    """Hostile pass 13, F4: 1,500 levels of text_config or of a list (and a dict that holds itself) are
    refused naming the field, not a RecursionError; a 64-level bound, walked without recursion."""
    if reader == "transformers":
        pytest.importorskip("transformers")
    llama = json.loads((Path(__file__).parent / "fixtures" / "models" / "llama" / "config.json").read_text())
    cases = [
        ({**llama, "text_config": _nested(dict, 1500)}, "config.text_config.text_config.text_config..."),
        ({**llama, "rope_scaling": _nested(list, 1500)}, "config.rope_scaling[0][0]..."),
    ]
    cyclic = dict(llama)
    cyclic["self"] = cyclic
    cases.append((cyclic, "config.self.self.self..."))
    for data, field in cases:
        with pytest.raises(SpecError) as e:
            M.from_config(data, reader=reader)
        assert str(e.value) == f"{field} = '64 levels deep': a config nests at most that deep"
    # the bound: a list 63 levels under the config's top is read, 64 are refused
    assert M.from_config({**llama, "x": _nested(list, 62)}, reader="json").block_size == 16
    with pytest.raises(SpecError, match="64 levels deep"):
        M.from_config({**llama, "x": _nested(list, 63)}, reader="json")
