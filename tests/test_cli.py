"""The command line contract of GEOMETRY.md section 5, for all three presets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvlayout as K
from kvlayout.cli import main
from tests.test_verify import prefix_table


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("name", sorted(K.PRESETS))
def test_plan_check_zero_presets(capsys: pytest.CaptureFixture[str], name: str) -> None:
    rc, out, _ = run(capsys, "plan", "--preset", name, "--json")
    assert rc == 0
    table = json.loads(out)
    assert set(table) == {"version", "total_bytes", "num_blocks", "segments"}
    assert set(table["segments"][0]) == {"base", "stride", "span", "group", "layer", "part", "virtual_index"}
    assert K.SegmentTable.from_dict(table) == K.plan(K.preset(name))
    rc, out, _ = run(capsys, "plan", "--preset", name)
    assert rc == 0 and "base" in out and "rows" in out
    rc, out, _ = run(capsys, "check", "--preset", name)
    assert rc == 0 and "SAFE" in out
    n = K.preset(name).num_blocks
    rc, out, _ = run(
        capsys, "zero", "--preset", name, "--blocks", f"0,1,{n - 1}", "--backend", "reference", "--json"
    )
    assert rc == 0
    rep = json.loads(out)
    assert set(rep) == {
        "version",
        "backend",
        "mode",
        "total_bytes",
        "block_ids",
        "matches_contract",
        "zeroed",
        "zeroed_bytes",
    }
    assert rep["matches_contract"] is True and rep["backend"] == "reference" and rep["mode"] == "native"
    assert rep["zeroed"] == K.expected_zeroed(K.plan(K.preset(name)), [0, 1, n - 1]).tolist()


def test_zero_report_dsv4_test(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(
        capsys, "zero", "--preset", "dsv4-test", "--blocks", "0,5,99", "--json", "--backend", "reference"
    )
    rep = json.loads(out)
    assert rc == 0
    assert rep["block_ids"] == [0, 5, 99]
    assert rep["zeroed"][:2] == [[0, 37376], [37440, 74816]]
    assert rep["zeroed_bytes"] == 448_512
    assert rep["total_bytes"] == 14_976_000


def test_spec_file_and_table_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(K.preset("dsv4-test").to_json())
    rc, out, _ = run(capsys, "plan", str(spec), "--json")
    assert rc == 0
    tfile = tmp_path / "table.json"
    tfile.write_text(out)
    rc, out, _ = run(capsys, "check", "--table", str(tfile))
    assert rc == 0 and "SAFE" in out
    bad = tmp_path / "bad.json"
    bad.write_text(prefix_table().to_json())
    rc, out, _ = run(capsys, "check", "--table", str(bad))
    assert rc == 1
    assert "112320 B past" in out and "spills into" in out
    rc, out, _ = run(capsys, "check", "--table", str(bad), "--json")
    assert rc == 1 and json.loads(out)["ok"] is False


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["zero", "--preset", "dsv4-test", "--blocks", "0,100", "--backend", "reference"],
            "block 100 outside [0, 100)",
        ),
        (["zero", "--preset", "dsv4-test", "--blocks", "0,x"], "'x'"),
        (["zero", "--preset", "dsv4-test", "--blocks", "0", "--backend", "nope"], "Invalid value 'nope'"),
        (["plan", "/nonexistent.json"], "/nonexistent.json"),
        (["plan"], "missing SPEC.json"),
    ],
)
def test_bad_input_exit_2_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_spec_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = K.preset("dsv4-test").to_dict()
    d["groups"][0]["layers"][0]["dtype"] = "float64"
    p = tmp_path / "s.json"
    p.write_text(json.dumps(d))
    for cmd in ("plan", "check", "zero"):
        rc, _, err = run(capsys, cmd, str(p), *(["--blocks", "0"] if cmd == "zero" else []))
        assert rc == 2 and "groups[0].layers[0]" in err and "float64" in err


def test_env_var_unknown_backend(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVLAYOUT_BACKEND", "bogus")
    rc, _, err = run(capsys, "zero", "--preset", "dsv4-test", "--blocks", "0")
    assert rc == 2
    assert "Invalid value 'bogus' for KVLAYOUT_BACKEND. Valid options: auto, reference" in err
    assert "pip install 'kvlayout[cuda]'" in err and "pip install 'kvlayout[pallas]'" in err


def test_python_m_and_console_script() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "kvlayout", "check", "--preset", "dsv4-test"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "SAFE" in r.stdout


def test_import_is_light() -> None:
    code = (
        "import sys, kvlayout; kvlayout.plan(kvlayout.preset('dsv4')); "
        "print(sorted(m for m in ('torch','jax','triton') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_shard_routes_and_proves(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(
        capsys,
        "shard",
        "--preset",
        "dsv4-test",
        "--mesh",
        "dp=2,tp=4",
        "--block-axes",
        "dp",
        "--head-axes",
        "tp",
        "--blocks",
        "0,5,50,99",
    )
    assert rc == 0, out
    assert "block_sharded" in out and "SAFE" in out and "matches the contract" in out
    assert "shard 4 (dp=1, tp=0; bytes [29952000, 37440000)): local ids [0, 49]" in out
    rc, out, _ = run(
        capsys,
        "shard",
        "--preset",
        "llama-8b",
        "--mesh",
        "tp=4",
        "--head-axes",
        "tp",
        "--blocks",
        "1-3",
        "--json",
    )
    rep = json.loads(out)
    assert (
        rc == 0
        and rep["mode"] == "replicated"
        and rep["local_ids"] == [[1, 2, 3]] * 4
        and rep["matches_contract"]
    )
    assert rep["local_total_bytes"] * 4 == K.plan(K.preset("llama-8b")).total_bytes


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["--mesh", "dp2"], "--mesh item 'dp2'"),
        ([], "--mesh is required"),
        (
            ["--mesh", "tp=3", "--head-axes", "tp"],
            "num_kv_heads = 8: not divisible by mesh axis 'tp' of size 3",
        ),
        (["--mesh", "dp=2", "--block-axes", "dp", "--blocks", "0,64"], "block 64 outside [0, 64)"),
        (["--mesh", "dp=2", "--block-axes", "x"], "'x' is not a mesh axis"),
    ],
)
def test_shard_bad_input_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], msg: str) -> None:
    rc, out, err = run(capsys, "shard", "--preset", "llama-8b", *argv)
    assert rc == 2 and msg in err and out == ""


# --------------------------------------------------------------------------- native arrays from a config
GPT_OSS = str(Path(__file__).resolve().parent / "fixtures" / "models" / "gpt_oss" / "config.json")


def test_check_native_arrays_from_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "check", "--config", GPT_OSS, "--engine", "tpu-inference", "--block-size", "16")
    lines = out.splitlines()
    # 12 arrays (one per layer slot of vLLM's two groups of 12), then the verdict
    assert rc == 0 and len(lines) == 13 and lines[-1] == "12 arrays: SAFE"
    # 16 pages * 32,768 B (head_dim 64: K and V share a 128-lane row, 16 * 4 * 2 * 128 * 2 B)
    assert lines[0] == "kv_caches[0]: 1 rows, 16 blocks, total_bytes 524288: SAFE"
    rc, out, _ = run(
        capsys, "check", "--config", GPT_OSS, "--engine", "tpu-inference", "--block-size", "16", "--json"
    )
    rep = json.loads(out)
    assert rc == 0 and rep["safe"] is True and len(rep["arrays"]) == 12
    assert rep["arrays"]["kv_caches[11]"]["ok"] is True


def test_zero_native_arrays_from_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["zero", "--config", GPT_OSS, "--engine", "tpu-inference", "--block-size", "16"]
    argv += ["--num-blocks", "4", "--blocks", "1,3"]
    rc, out, _ = run(capsys, *argv, "--backend", "reference", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["matches_contract"] is True and rep["engine"] == "tpu-inference"
    assert rep["block_ids"] == [1, 3] and len(rep["arrays"]) == 12
    # each array (4 pages of 16 * 4 * 2 * 128 * 2 = 32,768 B) is zeroed at pages 1 and 3 only
    for a in rep["arrays"]:
        assert a["total_bytes"] == 131_072 and a["zeroed"] == [[32_768, 65_536], [98_304, 131_072]]
    rc, out, _ = run(capsys, *argv, "--backend", "reference")
    assert rc == 0 and "2 block ids, 786432 B zeroed in 12 arrays" in out  # 12 * 2 * 32,768
    assert out.rstrip().endswith("contract: every array matches")
    rc, _, err = run(capsys, *argv[:-2], "--blocks", "4", "--backend", "reference")
    assert rc == 2 and "outside [0, 4)" in err


def test_plot_refuses_native_arrays(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = str(tmp_path / "x.png")
    rc, out, err = run(capsys, "plot", "--config", GPT_OSS, "--engine", "tpu-inference", "--out", png)
    assert rc == 2 and not out and "plot takes vLLM's flat layout" in err
