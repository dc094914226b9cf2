"""``kvlayout plan|check|zero|plot --config config.json`` (issue 17): the CLI from a model's config alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"
LLAMA = str(FIXTURES / "llama" / "config.json")
QWEN35 = str(FIXTURES / "qwen3_5" / "config.json")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_summary(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "plan", "--config", QWEN35)
    assert rc == 0 and not err
    lines = out.splitlines()
    assert len(lines) <= 24  # one screen
    assert lines[0].startswith("Qwen3_5ForConditionalGeneration (qwen3_5) on vllm, tp 1")
    assert "544-token blocks" in out and "4 groups, 24 layers" in out
    # per kind: layers, tokens, real page, padded page, padding (GDN 1,085,440 padded to 1,114,112)
    assert any(line.split() == ["gdn", "18", "-", "1,085,440", "1,114,112", "28,672"] for line in lines)
    assert any(line.split() == ["full", "6", "544", "1,114,112", "1,114,112", "0"] for line in lines)
    assert "bytes per block 6,684,672; blocks per GiB 160" in out  # 6 * 1,114,112; 2**30 // 6,684,672
    assert lines[-1].startswith("zeroing table: 6 rows") and lines[-1].endswith("SAFE")


def test_plan_json_is_the_table_of_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "plan", "--config", LLAMA, "--num-blocks", "4", "--json")
    assert rc == 0
    table = K.SegmentTable.from_dict(json.loads(out))
    assert table == K.plan(M.spec_from_config(LLAMA, num_blocks=4))
    assert table.total_bytes == 8_388_608  # 4 blocks * 32 layers * 65,536 B
    assert table.segments[0].layer == "model.layers.0.self_attn.attn"


@pytest.mark.parametrize(
    ("flags", "per_block"),
    [
        ([], "2,097,152"),  # 32 * 2 * 16 * 8 * 128 * 2
        (["--tp", "8"], "262,144"),  # 1 KV head per rank: 32 * 2 * 16 * 1 * 128 * 2
        (["--kv-cache-dtype", "fp8"], "1,048,576"),  # 1 B per element
        (["--tp", "8", "--kv-cache-dtype", "fp8"], "131,072"),
        (["--block-size", "32"], "4,194,304"),
        (["--engine", "vllm"], "2,097,152"),
    ],
)
def test_plan_flags(capsys: pytest.CaptureFixture[str], flags: list[str], per_block: str) -> None:
    rc, out, _ = run(capsys, "plan", "--config", LLAMA, *flags)
    assert rc == 0 and f"bytes per block {per_block};" in out


def test_check_zero_plot_from_a_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, _ = run(capsys, "check", "--config", QWEN35, "--num-blocks", "3")
    assert rc == 0 and "SAFE" in out and "invariant 4 (padding untouched): ok" in out
    rc, out, _ = run(
        capsys,
        "zero",
        "--config",
        LLAMA,
        "--num-blocks",
        "3",
        "--blocks",
        "0,2",
        "--backend",
        "reference",
        "--json",
    )
    rep = json.loads(out)
    assert rc == 0 and rep["matches_contract"] is True
    assert rep["zeroed_bytes"] == 4_194_304  # 2 blocks * 32 layers * 65,536 B
    pytest.importorskip("matplotlib")
    png = tmp_path / "map.png"
    rc, out, _ = run(capsys, "plot", "--config", QWEN35, "--num-blocks", "2", "--out", str(png))
    assert rc == 0 and png.stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "--config", "/nonexistent/config.json"], "config file"),
        (["plan", "--config", LLAMA, "--preset", "dsv4"], "not both"),
        (["plan", "--tp", "2", "--preset", "dsv4"], "--tp applies with --config"),
        (["check", "--kv-cache-dtype", "fp8", "--preset", "dsv4"], "--kv-cache-dtype applies with --config"),
        (["plan", "--config", LLAMA, "--tp", "3"], "config.num_attention_heads = 32"),
        (["plan", "--config", LLAMA, "--tp", "0"], "tp = 0"),
        (["plan", "--config", LLAMA, "--kv-cache-dtype", "int4"], "kv_cache_dtype = 'int4'"),
        (["plan", "--config", LLAMA, "--engine", "sglang"], "engine = 'sglang'"),
        (["zero", "--config", LLAMA, "--num-blocks", "2", "--blocks", "2"], "outside [0, 2)"),
    ],
)
def test_bad_input_is_exit_2_and_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and not out
    assert err.count("\n") == 1 and needle in err, err


def test_missing_field_names_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = json.loads(Path(LLAMA).read_text())
    del cfg["num_attention_heads"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc, _, err = run(capsys, "plan", "--config", str(path), "--reader", "json")
    assert rc == 2 and err.startswith("kvlayout plan: error: config.num_attention_heads = None: missing")
    # the default reader (auto) takes LlamaConfig's default (32 heads), as vLLM does, and says so
    rc, out, _ = run(capsys, "plan", "--config", str(path))
    note = "note: config.json has no config.num_attention_heads: read through transformers'"
    assert rc == 0 and note in out
    cfg["num_attention_heads"] = 32
    cfg["architectures"] = ["MyNewModelForCausalLM"]
    path.write_text(json.dumps(cfg))
    rc, _, err = run(capsys, "check", "--config", str(path))
    assert rc == 2 and "config.architectures[0] = 'MyNewModelForCausalLM': unknown architecture" in err


def test_tpu_inference_engine(capsys: pytest.CaptureFixture[str]) -> None:
    from kvlayout.native import NativeCacheSpec

    rc, out, _ = run(capsys, "plan", "--config", LLAMA, "--engine", "tpu-inference", "--block-size", "16")
    assert (
        rc == 0
        and "32 arrays of 16 pages" in out
        and "(16, 8, 2, 128)" in out
        and out.rstrip().endswith("SAFE")
    )
    rc, out, _ = run(
        capsys, "plan", "--config", LLAMA, "--engine", "tpu-inference", "--num-blocks", "2", "--json",
        "--block-size", "16",
    )
    spec = NativeCacheSpec.from_json(out)
    assert rc == 0 and spec.num_blocks == 2 and spec.leaves[0].shape == (2, 16, 8, 2, 128)
    rc, out, err = run(capsys, "shard", "--config", LLAMA, "--engine", "tpu-inference", "--mesh", "dp=2")
    assert rc == 2 and not out and "planned, checked and zeroed by plan, check, zero" in err


def test_python_dash_m_from_a_config_file() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvlayout", "plan", "--config", LLAMA, "--tp", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "bytes per block 1,048,576; blocks per GiB 1,024" in proc.stdout  # 32 * 2 * 16 * 4 * 128 * 2


def test_reader_transformers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--reader transformers`` fills what LlamaConfig defaults (32 heads, KV heads = heads), as vLLM
    reads the config; the ``json`` reader names the missing field; without transformers the
    CLI says which extra to install, in one line."""
    cfg = json.loads(Path(LLAMA).read_text())
    del cfg["num_attention_heads"], cfg["num_key_value_heads"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc, _, err = run(capsys, "plan", "--config", str(path), "--reader", "json")
    assert rc == 2 and "config.num_attention_heads = None: missing" in err
    rc, out, err = run(capsys, "plan", "--config", str(path), "--reader", "transformers")
    assert rc == 0 and not err
    assert "bytes per block 8,388,608" in out  # 32 layers * 2 * 16 tokens * 32 KV heads * 128 * 2 B
    rc, out, err = run(capsys, "check", "--config", str(path), "--reader", "transformers",
                       "--num-blocks", "4")
    assert rc == 0 and "SAFE" in out, err
    for argv, needle in (
        (["plan", "--config", str(path), "--reader", "yaml"], "reader = 'yaml'"),
        (["plan", "--preset", "llama-8b", "--reader", "transformers"], "--reader applies with --config"),
    ):
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and not out and err.count("\n") == 1 and needle in err, err
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    rc, out, err = run(capsys, "zero", "--config", str(path), "--reader", "transformers", "--num-blocks", "2")
    assert rc == 2 and not out and err.count("\n") == 1
    assert "transformers is not installed: pip install 'kvlayout[models]'" in err, err
