"""The seventeenth hostile pass's findings outside the JAX zeroers (issue 25), each pinned.

F2: a non-finite ``partial_rotary_factor`` beside an odd ``head_dim`` (a traceback, exit 1). F3: the vLLM
adapter's sparse views, non-tensors in a layer's cache, a forward context binding no tensor and a
``num_blocks`` that is no integer (raw exceptions). F4: a group index whose comparisons lie (a raw
IndexError). F5: a 22 MB config.json (15 s, 500 MB to refuse). F6: the auto reader leaving transformers'
check out without a word. F7: DeepSeek-V3.2 fields written ``null``, which vLLM 0.33 reads as written.
F9: ``kvlayout plan > /dev/full`` (a traceback).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "tests" / "fixtures" / "published"


def _config(name: str, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PUBLISHED / f"{name}.json").read_text())
    data.update(changes)
    return data


def _refused(config: Any, field: str, value: Any, words: str, **kw: Any) -> None:
    with pytest.raises(SpecError) as info:
        M.from_config(config, **kw)
    assert info.value.field == field
    got = info.value.value
    assert got == value or (isinstance(value, float) and math.isnan(value) and math.isnan(got))
    assert words in str(info.value), str(info.value)


def _cli(*args: str, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvlayout", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


# --------------------------------------------------------------------------- F2
@pytest.mark.parametrize("factor", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("reader", ["json", "auto"])
def test_f2_a_non_finite_partial_rotary_factor_is_refused_by_name(factor: float, reader: str) -> None:
    odd = _config("llama3_2_1b", head_dim=129, num_attention_heads=16, hidden_size=2064)
    _refused(
        {**odd, "partial_rotary_factor": factor},
        "config.partial_rotary_factor",
        factor,
        "finite",
        reader=reader,
    )
    nested = {**odd, "rope_scaling": {**odd["rope_scaling"], "partial_rotary_factor": factor}}
    _refused(nested, "config.rope_scaling.partial_rotary_factor", factor, "finite", reader="json")


def test_f2_the_command_line_says_it_in_one_line(tmp_path: Path) -> None:
    odd = _config("llama3_2_1b", head_dim=129, num_attention_heads=16, hidden_size=2064)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(odd).replace('"rope_theta"', '"partial_rotary_factor": NaN, "rope_theta"'))
    res = _cli("plan", "--config", str(p), "--reader", "json")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "config.partial_rotary_factor = nan: head_dim (129) times it must be finite" in res.stderr


# --------------------------------------------------------------------------- F7
def test_f7_deepseek_v32_fields_written_null_are_refused() -> None:
    # vLLM 0.33 builds V3.2's indexer wherever index_topk is an attribute (hasattr), null or not
    _refused(_config("deepseek_v3", index_topk=None), "config.index_topk", None, "hasattr", reader="json")
    v32 = _config(
        "deepseek_v3",
        architectures=["DeepseekV32ForCausalLM"],
        model_type="deepseek_v32",
        index_topk=2048,
        index_head_dim=128,
        index_n_heads=64,
    )
    M.from_config(v32, reader="json")  # the fields written: planned
    for key in ("index_topk", "index_topk_freq", "index_skip_topk_offset"):
        _refused({**v32, key: None}, f"config.{key}", None, "fails to build", reader="json")
    # a null pattern is getattr's default: the freq/offset schedule, as without it
    with_null = M.from_config({**v32, "index_topk_pattern": None}, reader="json")
    assert with_null.spec == M.from_config(v32, reader="json").spec


# --------------------------------------------------------------------------- F6
def test_f6_the_auto_reader_says_when_it_left_transformers_check_out() -> None:
    pytest.importorskip("transformers")
    junk = _config("llama3_2_1b", junk=2**21)
    ms = M.from_config(junk)  # the default reader, auto
    said = [n for n in ms.notes if "transformers' check of the config left out" in n]
    assert len(said) == 1 and "config.junk = 2097152" in said[0], ms.notes
    assert not any("left out" in n for n in M.from_config(_config("llama3_2_1b")).notes)


# --------------------------------------------------------------------------- F5
def test_f5_a_config_file_past_2_mib_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    from kvlayout.models.config import MAX_CONFIG_BYTES

    base = _config("llama3_2_1b")
    p = tmp_path / "config.json"
    junk = {f"k{i}": 0 for i in range(MAX_CONFIG_BYTES // 8)}
    p.write_text(json.dumps({**base, **junk}, separators=(",", ":")))
    assert p.stat().st_size > MAX_CONFIG_BYTES
    t0 = time.perf_counter()
    with pytest.raises(SpecError) as info:
        M.from_config(str(p), reader="json")
    assert time.perf_counter() - t0 < 5
    assert f"larger than {MAX_CONFIG_BYTES} B" in str(info.value) and info.value.field == "config file"
    p.write_text(json.dumps(base))  # a published one is read as before
    assert M.from_config(str(p), reader="json").spec == M.from_config(base, reader="json").spec


# --------------------------------------------------------------------------- F9
def test_f9_an_output_that_cannot_be_written_is_one_line_and_exit_2() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        res = _cli("plan", "--preset", "dsv4", stdout=full)
    assert res.returncode == 2, res.stderr
    assert res.stderr == "kvlayout plan: error: writing the output: No space left on device\n", res.stderr


# --------------------------------------------------------------------------- the eighteenth pass
def test_h18_a_closed_stdout_is_not_a_traceback() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; os.close(1); sys.stdout = None; "
            "from kvlayout.cli import main; sys.exit(main(['plan', '--preset', 'dsv4-test']))",
        ],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


def test_h18_a_factor_whose_product_overflows_is_refused_and_a_huge_int_is_read() -> None:
    odd = _config("llama3_2_1b", head_dim=129, num_attention_heads=16, hidden_size=2064)
    _refused(
        {**odd, "partial_rotary_factor": 1e308},
        "config.partial_rotary_factor",
        1e308,
        "finite",
        reader="json",
    )
    M.from_config({**odd, "partial_rotary_factor": 10**330}, reader="json")  # an int: int() of it is exact


def test_h18_the_auto_reader_reads_a_pipe_once(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    text = (PUBLISHED / "llama3_2_1b.json").read_text()
    res = subprocess.run(
        [sys.executable, "-m", "kvlayout", "plan", "--config", "/dev/stdin"],
        input=text,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0 and "LlamaForCausalLM" in res.stdout, res.stderr
