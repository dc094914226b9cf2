"""kvlayout.cli against its contract (issue 25 mutation testing): exit status, the one-line
errors that name the field and value, the text and JSON each command prints.

Every case calls :func:`kvlayout.cli.main` (or a helper of the module) in-process on small specs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvlayout as K
import kvlayout.cli as C
from kvlayout.reference import ReferenceBackend

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"
GPT_OSS = str(FIXTURES / "gpt_oss" / "config.json")
LLAMA = str(FIXTURES / "llama" / "config.json")


def layer(name: str, head_size: int = 8, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "full", "block_size": 16, "num_kv_heads": 2, "head_size": head_size,
            "dtype": "bfloat16", **extra}


def spec_dict(layout: str = "packed", num_blocks: int = 4, layers: int = 2) -> dict[str, Any]:
    """``layers`` layers of 1,024 B pages (16 tokens x 2 heads x 8 x bf16 x K and V)."""
    return {"version": 1, "num_blocks": num_blocks, "layout": layout,
            "groups": [{"name": "g", "layers": [layer(f"l{i}") for i in range(layers)]}]}


NATIVE = {
    "version": 1,
    "layout": "native",
    "leaves": [
        {"name": "a", "shape": [4, 16, 2, 4, 8], "dtype": "bfloat16", "group": "full"},  # 2,048 B pages
        {"name": "b", "shape": [4, 2, 32, 16], "dtype": "bfloat16", "group": "mla"},  # 2,048 B pages
        {"name": "c", "shape": [4, 4, 8], "dtype": "float32", "group": "full"},  # 128 B pages
        {"name": "s", "shape": [4, 8], "dtype": "int32", "group": "full", "zeroed": False},
    ],
}


def write(tmp_path: Path, name: str, data: Any) -> str:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = C.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def bad(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Exit 2, nothing on stdout, one line on stderr that starts ``kvlayout CMD: error:``; that line."""
    rc, out, err = cli(capsys, *argv)
    assert rc == 2 and out == "", (argv, rc, out, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"kvlayout {argv[0]}: error: "), err
    return err[len(f"kvlayout {argv[0]}: error: "):-1]


def usage(fn: Any, *args: Any, **kw: Any) -> C.UsageError:
    with pytest.raises(C.UsageError) as e:
        fn(*args, **kw)
    return e.value


class SkipsLast(ReferenceBackend):
    """A wrong backend: never zeroes the last id (``zero`` must answer exit 1 and say where)."""

    name = "skips-last"
    runs = 0

    def zero(self, block_ids: Any, group: str | None = None) -> None:
        type(self).runs += 1
        super().zero(np.asarray(block_ids)[:-1], group)


class Counted(ReferenceBackend):
    """The reference, counting its runs (native arrays of one table share one run)."""

    name = "counted"
    runs = 0

    def zero(self, block_ids: Any, group: str | None = None) -> None:
        type(self).runs += 1
        super().zero(block_ids, group)


HERE = __name__  # "tests.test_mutants_cli": module:attr backends below


# --------------------------------------------------------------------------- small parsers
def test_count_parser() -> None:
    assert C._count("0") == 0 and C._count("0012") == 12 and C._count("9" * 19) == 10**19 - 1
    neg = "not a non-negative decimal integer"
    for text, why in (("9" * 20, "at most 19 digits"), ("-1", neg), ("1_0", neg), ("", neg), (" 1", neg),
                      ("1.0", neg), ("1" * 19 + "x", neg)):
        with pytest.raises(argparse.ArgumentTypeError) as e:
            C._count(text)
        assert str(e.value) == f"{text!r}: {why}", (text, str(e.value))
    long_msg = r"^'1{40}\.\.\.\(45 characters\)': at most 19 digits$"
    with pytest.raises(argparse.ArgumentTypeError, match=long_msg):
        C._count("1" * 45)


def test_parse_blocks_items_ranges_and_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    got = C.parse_blocks(" 1 , 3-5,,7-7, 0", 8)
    assert got.dtype == np.int64 and got.tolist() == [1, 3, 4, 5, 7, 0]
    for text in ("", " , ,"):
        e = C.parse_blocks(text, 8)
        assert e.dtype == np.int64 and e.shape == (0,)
    assert C.parse_blocks("7", 8).tolist() == [7] and C.parse_blocks("0-7", 8).tolist() == list(range(8))
    cases = [  # (text, message, value)
        ("8", "--blocks item '8': block 8 outside [0, 8)", "8"),
        ("2-8", "--blocks item '2-8': block 8 outside [0, 8)", "2-8"),
        ("5-3", "--blocks item '5-3': range is descending", "5-3"),
        ("x", "--blocks item 'x': must be N or A-B (decimal digits)", "x"),
        ("1-", "--blocks item '1-': must be N or A-B (decimal digits)", "1-"),
        ("-1", "--blocks item '-1': must be N or A-B (decimal digits)", "-1"),
        ("1" * 20, f"--blocks item '{'1' * 20}': must be N or A-B (decimal digits)", "1" * 20),
        ("0-" + "1" * 20, "must be N or A-B", "0-" + "1" * 20),
        ("9" * 19, f"block {'9' * 19} outside [0, 8)", "9" * 19),
    ]
    for text, msg, value in cases:
        e = usage(C.parse_blocks, text, 8)
        assert msg in str(e) and e.field == "blocks" and e.value == value, (text, str(e), e.field, e.value)
    monkeypatch.setattr(C, "MAX_CLI_IDS", 5)
    assert C.parse_blocks("0-2,6-7", 8).tolist() == [0, 1, 2, 6, 7]  # exactly the most ids
    e = usage(C.parse_blocks, "0-2,6-7,4", 8)
    assert str(e) == "--blocks names more than 5 ids" and e.field == "blocks" and e.value == 6
    e = usage(C.parse_blocks, "0-5", 8)
    assert e.value == 6


def test_parse_mesh_axes_sizes_and_count(monkeypatch: pytest.MonkeyPatch) -> None:
    assert C.parse_mesh(" dp=2, tp=4 ") == [("dp", 2), ("tp", 4)]
    top = K.sharding.MAX_MESH_DEVICES
    assert C.parse_mesh(f"_a9=1,B={top}") == [("_a9", 1), ("B", top)]
    assert C.parse_mesh("a" * 64 + "=3") == [("a" * 64, 3)]
    for text, tok in (("dp2", "dp2"), ("dp=2,", ""), ("9p=2", "9p=2"), ("a" * 65 + "=1", "a" * 65 + "=1"),
                      ("dp=-1", "dp=-1"), ("d-p=1", "d-p=1")):
        e = usage(C.parse_mesh, text)
        assert e.field == "mesh" and e.value == tok, (text, e.field, e.value)
        assert str(e) == f"--mesh item {C._short(tok)!r}: must be NAME=SIZE (e.g. dp=2,tp=4)", str(e)
    top = K.sharding.MAX_MESH_DEVICES
    for size in ("0", str(top + 1), "00000000001", "1" * 60):
        e = usage(C.parse_mesh, f"dp=1,tp={size}")
        assert e.field == "mesh.tp" and e.value == C._short(size), (size, e.field, e.value)
        assert str(e) == f"--mesh item {C._short('tp=' + size)!r}: axis size must lie in [1, {top}]", str(e)
    assert C.parse_mesh("tp=0000000002") == [("tp", 2)]  # ten digits are read
    monkeypatch.setattr(C, "MAX_MESH_AXES", 2)
    assert len(C.parse_mesh("a=1,b=1")) == 2
    e = usage(C.parse_mesh, "a=1,b=1,c=1")
    assert str(e) == "--mesh names more than 2 axes" and e.field == "mesh" and e.value == 3


def test_short_axes_one_line() -> None:
    assert C._short("x" * 40) == "x" * 40
    assert C._short("x" * 41) == "x" * 40 + "...(41 characters)"
    assert C._short("abcdef", 3) == "abc...(6 characters)" and C._short("abc", 3) == "abc"
    assert C._axes(None) == () and C._axes("") == () and C._axes(" dp, ,tp ,") == ("dp", "tp")
    assert C._one_line("a\nb\x1b[2Jc\té") == "a\\nb\\x1b[2Jc\\té"
    assert C._one_line("C:\\x 'q' \"d\" é") == "C:\\x 'q' \"d\" é"  # printable characters stay as they are


def test_host_and_report_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    C._host_sized(C.MAX_HOST_BYTES, "total_bytes")  # the limit itself is allowed
    e = usage(C._host_sized, C.MAX_HOST_BYTES + 1, "gathered bytes")
    assert e.field == "total_bytes" and e.value == C.MAX_HOST_BYTES + 1
    assert str(e) == (
        f"gathered bytes = {C.MAX_HOST_BYTES + 1} B: above the {C.MAX_HOST_BYTES} B this command checks on "
        "the host; use --num-blocks N to check the same layout with a smaller pool"
    )
    C._report_sized(C.MAX_REPORT_RANGES)
    e = usage(C._report_sized, C.MAX_REPORT_RANGES + 1)
    assert e.field == "blocks" and e.value == C.MAX_REPORT_RANGES + 1
    assert str(e) == (
        f"--blocks: the contract for these ids may hold up to {C.MAX_REPORT_RANGES + 1} separate byte "
        "ranges; "
        f"a zero report lists at most {C.MAX_REPORT_RANGES} (give fewer or consecutive ids)"
    )


# --------------------------------------------------------------------------- where the spec comes from
MODEL_FLAGS = [  # (flag, a value it takes): each applies with --config only
    ("--engine", "vllm"), ("--tp", "1"), ("--kv-cache-dtype", "auto"), ("--block-size", "16"),
    ("--device", "hopper"), ("--attention-backend", "FLASH_ATTN"), ("--reader", "json"), ("--dp", "1"),
    ("--dcp", "1"), ("--model-impl", "auto"), ("--max-model-len", "4096"),
]


def test_spec_sources_are_exclusive_and_model_flags_need_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write(tmp_path, "s.json", spec_dict())
    for flag, value in MODEL_FLAGS:
        for cmd in ("plan", "check"):
            assert bad(capsys, cmd, spec, flag, value) == f"{flag} applies with --config CONFIG.json only"
        ns = C.build_parser().parse_args(["plan", "--preset", "dsv4-test", flag, value])
        e = usage(C._load_spec, ns)
        assert e.field == flag and e.value is None
    assert bad(capsys, "plan", spec, "--preset", "dsv4-test") == "give SPEC.json or --preset, not both"
    e = usage(C._load_spec, C.build_parser().parse_args(["plan", spec, "--preset", "dsv4-test"]))
    assert (e.field, e.value) == ("spec", spec)
    for extra in ([spec], ["--preset", "dsv4-test"]):
        msg = bad(capsys, "plan", "--config", GPT_OSS, *extra)
        assert msg == "give --config or a spec (SPEC.json, --preset), not both"
        e = usage(C._load_spec, C.build_parser().parse_args(["plan", "--config", GPT_OSS, *extra]))
        assert (e.field, e.value) == ("config", GPT_OSS)
    assert bad(capsys, "plan") == "missing SPEC.json (or --preset NAME)"
    for text in ("{", ""):  # a spec file that is not JSON: SpecError, naming the "spec file"
        msg = bad(capsys, "plan", write(tmp_path, "bad.json", text))
        assert msg.startswith("spec file"), msg
    assert bad(capsys, "check", str(tmp_path / "none.json")).startswith("spec file")
    e = usage(C._load_spec, C.build_parser().parse_args(["check"]))
    assert (e.field, e.value) == ("spec", None)


def test_num_blocks_overrides_every_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, "s.json", spec_dict(num_blocks=4))
    for src in ([spec], ["--preset", "dsv4-test"]):
        rc, out, _ = cli(capsys, "plan", *src, "--num-blocks", "7", "--json")
        assert rc == 0 and json.loads(out)["num_blocks"] == 7
    rc, out, _ = cli(capsys, "plan", spec, "--json")
    assert rc == 0 and json.loads(out)["num_blocks"] == 4
    native = write(tmp_path, "n.json", NATIVE)
    rc, out, _ = cli(capsys, "plan", native, "--num-blocks", "3", "--json")
    tables = json.loads(out)["tables"]
    assert rc == 0 and {t["num_blocks"] for t in tables.values()} == {3}
    rc, out, _ = cli(capsys, "plan", native, "--json")
    assert rc == 0 and {t["num_blocks"] for t in json.loads(out)["tables"].values()} == {4}


def test_config_flags_reach_from_config(capsys: pytest.CaptureFixture[str]) -> None:
    """Each model flag is passed on as is; absent flags take from_config's documented defaults."""
    from kvlayout.models import DEFAULT_NUM_BLOCKS, from_config, summary

    cases: list[tuple[list[str], dict[str, Any]]] = [
        ([], {}),
        (["--engine", "vllm", "--tp", "1", "--device", "hopper", "--reader", "json",
          "--num-blocks", str(DEFAULT_NUM_BLOCKS)], {}),
        (["--tp", "2"], {"tp": 2}),
        (["--kv-cache-dtype", "fp8"], {"kv_cache_dtype": "fp8"}),
        (["--block-size", "32"], {"block_size": 32}),
        (["--num-blocks", "64"], {"num_blocks": 64}),
        (["--device", "ampere"], {"device": "ampere"}),
        (["--attention-backend", "TRITON_ATTN"], {"attention_backend": "TRITON_ATTN"}),
    ]
    for flags, kw in cases:
        rc, out, err = cli(capsys, "plan", "--config", LLAMA, *flags, "--json")
        want = K.plan(from_config(LLAMA, **kw).spec)
        assert rc == 0 and K.SegmentTable.from_json(out) == want, (flags, err)
        rc, out, _ = cli(capsys, "plan", "--config", LLAMA, *flags)
        assert rc == 0 and out == summary(from_config(LLAMA, **kw)) + "\n", flags
    for flag, value, field in (("--reader", "yaml", "reader"), ("--engine", "sglang", "engine"),
                               ("--device", "volta", "device")):
        msg = bad(capsys, "plan", "--config", LLAMA, flag, value)
        assert msg.startswith(f"{field} = {value!r}: "), msg
    base = ["--engine", "tpu-inference"]
    tpu_cases: list[tuple[list[str], dict[str, Any]]] = [
        (["--block-size", "16"], {"block_size": 16}),
        (["--dp", "2", "--tp", "4", "--block-size", "16"], {"dp": 2, "tp": 4, "block_size": 16}),
        (["--dcp", "2", "--block-size", "16"], {"dcp": 2, "block_size": 16}),
        (["--model-impl", "flax_nnx", "--block-size", "16"], {"model_impl": "flax_nnx", "block_size": 16}),
        (["--max-model-len", "4096"], {"max_model_len": 4096}),
        (["--kv-cache-dtype", "fp8", "--num-blocks", "32"], {"kv_cache_dtype": "fp8", "num_blocks": 32}),
    ]
    for flags, kw in tpu_cases:
        model = from_config(GPT_OSS, engine="tpu-inference", **kw)
        rc, out, err = cli(capsys, "plan", "--config", GPT_OSS, *base, *flags)
        assert rc == 0 and out == summary(model) + "\n", (flags, err)
        rc, out, err = cli(capsys, "plan", "--config", GPT_OSS, *base, *flags, "--json")
        assert rc == 0 and out == model.spec.to_json(indent=1) + "\n", (flags, err)
        rc, out, err = cli(capsys, "plan", "--config", GPT_OSS, *base, *flags, "--json", "--compact")
        assert rc == 0 and out == model.spec.to_json() + "\n", (flags, err)


def test_native_arrays_only_where_a_command_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    native = write(tmp_path, "n.json", NATIVE)
    out = str(tmp_path / "x.png")
    for cmd, extra in (("shard", ["--mesh", "dp=2"]), ("plot", ["--out", out])):
        assert bad(capsys, cmd, native, *extra) == (
            f"{C._short(native)!r} is a native spec (layout 'native'): plan, check, zero read it; "
            f"{cmd} takes a flat-buffer spec"
        )
        ns = C.build_parser().parse_args([cmd, native, *extra])
        e = usage(C._load_spec, ns)
        assert (e.field, e.value) == ("spec.layout", "native")
        msg = bad(capsys, cmd, "--config", GPT_OSS, "--engine", "tpu-inference", *extra)
        assert msg == (
            "--engine tpu-inference: native arrays are planned, checked and zeroed by plan, check, zero; "
            f"{cmd} takes vLLM's flat layout"
        )
        e = usage(C._load_spec, C.build_parser().parse_args([cmd, "--config", GPT_OSS, "--engine",
                                                               "tpu-inference", *extra]))
        assert (e.field, e.value) == ("engine", "tpu-inference")
    assert not Path(out).exists()
    # a flat spec whose "layout" is not "native" is read as a flat spec
    rc, text, _ = cli(capsys, "plan", write(tmp_path, "f.json", spec_dict("layer_major")))
    assert rc == 0 and text.startswith("layout layer_major:")


# --------------------------------------------------------------------------- plan and check
def test_plan_text_json_compact_coalesce(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packed = write(tmp_path, "p.json", spec_dict("packed"))
    assert cli(capsys, "plan", packed) == (0, (
        "layout packed: 1 groups, 2 layers, 4 blocks, block_stride 2048, total_bytes 8192\n"
        " row         base    stride     span  group/layer/part\n"
        "   0            0      2048     1024  g/l0/page\n"
        "   1         1024      2048     1024  g/l1/page\n"
        "2 rows, 2048 B cleared per block\n"), "")
    lm = write(tmp_path, "l.json", spec_dict("layer_major", layers=3))
    rc, out, _ = cli(capsys, "plan", lm)
    assert rc == 0 and out.splitlines()[0] == (
        "layout layer_major: 1 groups, 3 layers, 4 blocks, 3 slots, total_bytes 12288")
    want = K.plan(K.KVCacheSpec.from_dict(spec_dict("packed")))
    rc, out, _ = cli(capsys, "plan", packed, "--json")
    assert rc == 0 and out == want.to_json(indent=1) + "\n" and "\n " in out
    rc, out, _ = cli(capsys, "plan", packed, "--json", "--compact")
    assert rc == 0 and out == want.to_json() + "\n" and out.count("\n") == 1
    rc, out, _ = cli(capsys, "plan", packed, "--json", "--coalesce")
    assert rc == 0 and K.SegmentTable.from_json(out) == want.coalesced() and len(want.coalesced()) == 1
    rc, out, _ = cli(capsys, "plan", packed, "--coalesce")
    assert rc == 0 and out.splitlines()[-1] == "1 rows, 2048 B cleared per block"
    assert out.splitlines()[2] == "   0            0      2048     2048  g/l0+l1/page"
    assert bad(capsys, "plan", packed, "--compact") == "--compact only applies with --json"
    e = usage(C.cmd_plan, C.build_parser().parse_args(["plan", packed, "--compact"]))
    assert (e.field, e.value) == ("compact", True)
    # _fmt_table without a layout: the rows only
    header = " row         base    stride     span  group/layer/part"
    assert C._fmt_table(None, want).splitlines()[0] == header


def test_plan_and_check_a_native_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    native = write(tmp_path, "n.json", NATIVE)
    assert cli(capsys, "plan", native) == (0, (
        "layout native: 4 arrays, 4 blocks, groups full, mla\n"
        "  a: [4, 16, 2, 4, 8] bfloat16 group full: base 0 stride 2048 span 2048\n"
        "  b: [4, 2, 32, 16] bfloat16 group mla: base 0 stride 2048 span 2048\n"
        "  c: [4, 4, 8] float32 group full: base 0 stride 128 span 128\n"
        "  s: [4, 8] int32 group full: not zeroed\n"
        "4224 B cleared per block\n"), "")
    from kvlayout.native import NativeCacheSpec, native_tables

    tables = {n: t.to_dict() for n, t in native_tables(NativeCacheSpec.from_dict(NATIVE)).items()}
    rc, out, _ = cli(capsys, "plan", native, "--json")
    doc = {"version": 1, "layout": "native", "tables": tables}
    assert rc == 0 and out == json.dumps(doc, indent=1) + "\n"
    rc, out, _ = cli(capsys, "plan", native, "--json", "--compact")
    assert rc == 0 and out == json.dumps(doc) + "\n"
    rc, out, _ = cli(capsys, "check", native)
    assert rc == 0 and out == (
        "a: 1 rows, 4 blocks, total_bytes 8192: SAFE\n"
        "b: 1 rows, 4 blocks, total_bytes 8192: SAFE\n"
        "c: 1 rows, 4 blocks, total_bytes 512: SAFE\n"
        "s: 0 rows, 4 blocks, total_bytes 128: SAFE\n"
        "4 arrays: SAFE\n")
    rc, out, _ = cli(capsys, "check", native, "--json")
    rep = json.loads(out)
    assert rc == 0 and out.count("\n") == 1 and rep["safe"] is True
    assert list(rep["arrays"]) == ["a", "b", "c", "s"]
    assert rep["arrays"]["a"]["ok"] is True and rep["arrays"]["s"]["total_bytes"] == 128


def test_check_native_renders_a_shared_report_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Arrays of one table share one report (verify_native): ``check`` renders each report once,
    as text and as JSON (a model's 100,000 per-layer arrays render one report, not 100,000)."""
    from kvlayout.verify import VerifyReport

    native = write(tmp_path, "n.json", NATIVE)
    rendered: list[int] = []
    for attr in ("format", "to_dict"):
        real = getattr(VerifyReport, attr)
        monkeypatch.setattr(VerifyReport, attr,
                            lambda self, _real=real: rendered.append(id(self)) or _real(self))
    for extra in ((), ("--json",)):
        rc, out, _ = cli(capsys, "check", native, *extra)
        # a and b (2,048 B pages) share a report; c (128 B) and s (not zeroed) have their own
        assert rc == 0 and len(rendered) == len(set(rendered)) == 3, (extra, rendered)
        rendered.clear()


def test_check_native_unsafe_is_exit_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """An array whose table breaks an invariant makes the verdict UNSAFE (exit 1), named per array."""
    import kvlayout.native as N

    spec = N.NativeCacheSpec.from_dict(NATIVE)
    reports = N.verify_native(spec)
    broken = K.verify(K.SegmentTable(8192, 4, (K.Segment(0, 2048, 4096, "g", "x", "page"),)))
    assert not broken.ok
    monkeypatch.setattr(N, "verify_native", lambda s, group=None: {**reports, "b": broken})
    native = write(tmp_path, "n.json", NATIVE)
    rc, out, _ = cli(capsys, "check", native)
    assert rc == 1 and out.splitlines()[1] == f"b: {broken.format().splitlines()[0]}"
    assert out.splitlines()[-1] == "4 arrays: UNSAFE" and out.splitlines()[0].endswith(": SAFE")
    rc, out, _ = cli(capsys, "check", native, "--json")
    assert rc == 1 and json.loads(out)["safe"] is False and json.loads(out)["arrays"]["b"]["ok"] is False


def test_check_tables_and_their_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, "s.json", spec_dict())
    table = K.plan(K.KVCacheSpec.from_dict(spec_dict()))
    good = write(tmp_path, "t.json", table.to_json())
    rc, out, _ = cli(capsys, "check", good)  # a table given as SPEC.json is not a spec
    assert rc == 2
    rc, out, err = cli(capsys, "check", "--table", good)
    loaded = K.SegmentTable.from_json(table.to_json())  # no layout: invariant 4 is not checked
    assert (rc, out, err) == (0, K.verify(loaded).format() + "\n", "")
    assert K.verify(loaded).format() != K.verify(table).format()
    rc, out, _ = cli(capsys, "check", spec, "--json")
    assert rc == 0 and out == json.dumps(K.verify(table).to_dict(), indent=1) + "\n"
    unsafe = K.SegmentTable(8192, 4, (K.Segment(0, 2048, 4096, "g", "x", "page"),))
    badt = write(tmp_path, "u.json", unsafe.to_json())
    rc, out, _ = cli(capsys, "check", "--table", badt)
    unsafe = K.SegmentTable.from_json(unsafe.to_json())
    assert rc == 1 and out == K.verify(unsafe).format() + "\n"
    rc, out, _ = cli(capsys, "check", "--table", badt, "--json")
    assert rc == 1 and out == json.dumps(K.verify(unsafe).to_dict(), indent=1) + "\n"
    for extra in ([spec], ["--preset", "dsv4-test"]):
        assert bad(capsys, "check", "--table", good, *extra) == "give --table or a spec, not both"
        e = usage(C.cmd_check, C.build_parser().parse_args(["check", "--table", good, *extra]))
        assert (e.field, e.value) == ("table", good)
    msg = bad(capsys, "check", "--table", good, "--num-blocks", "3")
    assert msg == "--num-blocks applies to specs; a table JSON fixes its own num_blocks"
    e = usage(C.cmd_check, C.build_parser().parse_args(["check", "--table", good, "--num-blocks", "3"]))
    assert (e.field, e.value) == ("num_blocks", 3)
    rc, out, err = cli(capsys, "check", "--table", good, "--num-blocks", "0")
    assert rc == 2 and "--num-blocks applies to specs" in err  # 0 is given, not absent
    assert bad(capsys, "check", "--table", str(tmp_path / "none.json")).startswith("table file")


# --------------------------------------------------------------------------- zero
def test_zero_report_text_json_and_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, "s.json", spec_dict())  # packed: block b is [2048 b, 2048 (b + 1))
    assert cli(capsys, "zero", spec, "--blocks", "1,3", "--backend", "reference") == (0, (
        f"backend reference (native): 2 block ids, 4096 B zeroed in 2 ranges of a 8192 B buffer "
        f"(+{C.GUARD_BYTES} B guard bands each side)\ncontract: matches the contract\n"), "")
    rc, out, _ = cli(capsys, "zero", spec, "--blocks", "3,1", "--backend", "reference", "--json")
    assert rc == 0 and out.count("\n") == 1 and json.loads(out) == {
        "version": 1, "backend": "reference", "mode": "native", "total_bytes": 8192, "block_ids": [3, 1],
        "matches_contract": True, "zeroed": [[2048, 4096], [6144, 8192]], "zeroed_bytes": 4096}
    two = spec_dict()
    two["groups"].append({"name": "h", "layers": [layer("m0", head_size=4)]})  # 512 B pages
    spec2 = write(tmp_path, "two.json", two)
    h0 = ["zero", spec2, "--blocks", "0", "--group", "h", "--backend", "reference"]
    rc, out, _ = cli(capsys, *h0, "--json")
    rep = json.loads(out)
    table = K.plan(K.KVCacheSpec.from_dict(two))
    assert rc == 0 and rep["group"] == "h" and rep["zeroed_bytes"] == 512 and rep["matches_contract"]
    assert rep["zeroed"] == K.expected_zeroed(table, [0], group="h").tolist()
    rc, out, _ = cli(capsys, *h0)
    assert rc == 0 and "512 B zeroed in 1 ranges" in out
    msg = bad(capsys, "zero", spec2, "--blocks", "0", "--group", "nope", "--backend", "reference")
    assert msg.startswith("group = 'nope'") and "'g', 'h'" in msg
    for src in ([spec], [write(tmp_path, "n.json", NATIVE)]):
        assert bad(capsys, "zero", *src) == "--blocks is required (e.g. --blocks 0,5,99)"
        e = usage(C.cmd_zero, C.build_parser().parse_args(["zero", *src]))
        assert (e.field, e.value) == ("blocks", None)
    assert bad(capsys, "zero", spec, "--blocks", "4", "--backend", "reference") == (
        "--blocks item '4': block 4 outside [0, 4)")


def test_zero_wrong_backend_is_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, "s.json", spec_dict())
    rc, out, _ = cli(capsys, "zero", spec, "--blocks", "1,3", "--backend", f"{HERE}:SkipsLast")
    lines = out.splitlines()
    assert rc == 1 and lines[0].startswith(
        "backend skips-last (native): 2 block ids, 2048 B zeroed in 1 ranges")
    assert lines[1].startswith("contract: ") and lines[1] != "contract: matches the contract"
    rc, out, _ = cli(capsys, "zero", spec, "--blocks", "1,3", "--backend", f"{HERE}:SkipsLast", "--json")
    rep = json.loads(out)
    assert rc == 1 and rep["matches_contract"] is False and rep["backend"] == "skips-last"
    assert rep["zeroed"] == [[2048, 4096]] and rep["zeroed_bytes"] == 2048


def test_zero_bounds_before_any_buffer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, "s.json", spec_dict())  # 8,192 B
    monkeypatch.setattr(C, "MAX_HOST_BYTES", 8191)
    msg = bad(capsys, "zero", spec, "--blocks", "0", "--backend", "reference")
    assert msg.startswith("total_bytes = 8192 B: above the 8191 B")
    msg = bad(capsys, "zero", spec, "--blocks", "0", "--group", "nope", "--backend", "reference")
    assert msg.startswith("group = 'nope'")  # an unknown group is named before the pool's size
    monkeypatch.setattr(C, "MAX_HOST_BYTES", 8192)
    assert cli(capsys, "zero", spec, "--blocks", "0", "--backend", "reference")[0] == 0
    # 2 groups; zeroing group h of ids 0 and 2 makes 2 ranges, of every group 4 (the group's bound counts)
    two = spec_dict()
    two["groups"].append({"name": "h", "layers": [layer("m0", head_size=4)]})
    spec2 = write(tmp_path, "two.json", two)
    table = K.plan(K.KVCacheSpec.from_dict(two))
    ids = np.array([0, 2])
    from kvlayout.reference import range_count_bound

    per_group, every = range_count_bound(table, ids, "h"), range_count_bound(table, ids, None)
    assert per_group < every
    monkeypatch.setattr(C, "MAX_REPORT_RANGES", per_group)
    argv = ["zero", spec2, "--blocks", "0,2", "--backend", "reference"]
    assert cli(capsys, *argv, "--group", "h")[0] == 0
    assert bad(capsys, *argv) == (
        f"--blocks: the contract for these ids may hold up to {every} separate byte ranges; a zero report "
        f"lists at most {per_group} (give fewer or consecutive ids)")
    monkeypatch.setattr(C, "MAX_REPORT_RANGES", per_group - 1)
    assert bad(capsys, *argv, "--group", "h").startswith(
        f"--blocks: the contract for these ids may hold up to {per_group} ")


def test_run_zero_checks_ids_and_group_first(monkeypatch: pytest.MonkeyPatch) -> None:
    table = K.plan(K.KVCacheSpec.from_dict(spec_dict()))
    rep = C.run_zero(table, [2], "reference")
    chk = rep.pop("_check")
    assert rep == {"version": 1, "backend": "reference", "mode": "native", "total_bytes": 8192,
                   "block_ids": [2], "matches_contract": True, "zeroed": [[4096, 6144]], "zeroed_bytes": 2048}
    assert chk.matches and chk.zeroed_bytes == 2048
    assert C.run_zero(table, [2], f"{HERE}:Counted")["backend"] == "counted"  # module:attr: the class's name
    import kvlayout.registry as R

    plugins = {**R.registered(), "alias": (f"{HERE}:Counted", None)}
    monkeypatch.setattr(R, "registered", lambda: plugins)
    assert C.run_zero(table, [2], "alias")["backend"] == "alias"  # a registered name: as asked for
    with pytest.raises(K.BlockIdError):
        C.run_zero(table, [4], "reference")
    with pytest.raises(K.KVLayoutError, match="'nope'"):
        C.run_zero(table, [0], "reference", "nope")
    with pytest.raises(K.KVLayoutError, match="'bogus'"):
        C.run_zero(table, [0], "bogus")


def test_zero_native_arrays(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    native = write(tmp_path, "n.json", NATIVE)
    Counted.runs = 0
    rc, out, _ = cli(capsys, "zero", native, "--blocks", "1,3", "--backend", f"{HERE}:Counted", "--json")
    assert Counted.runs == 3  # a and b have equal tables (2,048 B pages): one run; c; s (no rows)
    z = [[2048, 4096], [6144, 8192]]
    assert rc == 0 and out.count("\n") == 1 and json.loads(out) == {
        "version": 1, "engine": "native spec", "backend": "counted", "mode": "native", "block_ids": [1, 3],
        "matches_contract": True, "arrays": [
            {"name": "a", "total_bytes": 8192, "zeroed": z, "zeroed_bytes": 4096, "matches_contract": True},
            {"name": "b", "total_bytes": 8192, "zeroed": z, "zeroed_bytes": 4096, "matches_contract": True},
            {"name": "c", "total_bytes": 512, "zeroed": [[128, 256], [384, 512]], "zeroed_bytes": 256,
             "matches_contract": True},
            {"name": "s", "total_bytes": 128, "zeroed": [], "zeroed_bytes": 0, "matches_contract": True},
        ]}
    assert cli(capsys, "zero", native, "--blocks", "1,3", "--backend", "reference") == (0, (
        f"backend reference (native): 2 block ids, 8448 B zeroed in 4 arrays (+{C.GUARD_BYTES} B guard bands "
        "each side of each)\ncontract: every array matches\n"), "")
    rc, out, _ = cli(capsys, "zero", native, "--blocks", "0", "--group", "mla", "--backend", "reference",
                     "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["group"] == "mla" and [a["zeroed_bytes"] for a in rep["arrays"]] == [0, 2048, 0, 0]
    rc, out, _ = cli(capsys, "zero", native, "--blocks", "0", "--backend", "reference", "--json")
    assert "group" not in json.loads(out)
    rc, out, _ = cli(capsys, "zero", native, "--blocks", "1,3", "--backend", f"{HERE}:SkipsLast")
    lines = out.splitlines()
    assert rc == 1 and lines[0].startswith(
        "backend skips-last (native): 2 block ids, 4224 B zeroed in 4 arrays")
    assert [ln.split(":")[0] for ln in lines[1:-1]] == ["a", "b", "c"]  # s has no rows: it matches
    assert lines[-1] == "contract: MISMATCH"
    rc, out, _ = cli(capsys, "zero", native, "--blocks", "1,3", "--backend", f"{HERE}:SkipsLast", "--json")
    rep = json.loads(out)
    assert rc == 1 and rep["matches_contract"] is False
    assert [a["matches_contract"] for a in rep["arrays"]] == [False, False, False, True]
    # bounds: the largest array (one poisoned run at a time), and the number of different tables
    monkeypatch.setattr(C, "MAX_HOST_BYTES", 8192 - 1)
    assert bad(capsys, "zero", native, "--blocks", "0", "--backend", "reference").startswith(
        "total_bytes of an array = 8192 B: above")
    monkeypatch.setattr(C, "MAX_HOST_BYTES", 8192)
    monkeypatch.setattr(C, "MAX_NATIVE_ZERO_TABLES", 3)
    assert cli(capsys, "zero", native, "--blocks", "0", "--backend", "reference")[0] == 0
    monkeypatch.setattr(C, "MAX_NATIVE_ZERO_TABLES", 2)
    assert bad(capsys, "zero", native, "--blocks", "0", "--backend", "reference") == (
        "spec: 3 different array shapes; zero runs the backend on at most 2 (arrays of one shape share "
        "one run)")
    ns = C.build_parser().parse_args(["zero", native, "--blocks", "0", "--backend", "reference"])
    C._load_spec(ns)
    e = usage(C._zero_native, ns)
    assert (e.field, e.value) == ("leaves", 3)


def test_zero_native_of_a_config_names_its_engine(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["zero", "--config", GPT_OSS, "--engine", "tpu-inference", "--block-size", "16"]
    argv += ["--num-blocks", "2"]
    rc, out, _ = cli(capsys, *argv, "--blocks", "1", "--backend", "reference", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["engine"] == "tpu-inference" and rep["block_ids"] == [1]


def test_table_key_ignores_names_only() -> None:
    t = K.SegmentTable(8192, 4, (K.Segment(0, 2048, 1024, "g", "x", "page"),))
    same = K.SegmentTable(8192, 4, (K.Segment(0, 2048, 1024, "h", "y", "page"),))
    assert C._table_key(t) == C._table_key(same) == (8192, 4, ((0, 2048, 1024),))
    for other in (K.SegmentTable(8192, 2, t.segments), K.SegmentTable(16384, 4, t.segments),
                  K.SegmentTable(8192, 4, (K.Segment(4, 2048, 1024, "g", "x", "page"),)),
                  K.SegmentTable(8192, 4, (K.Segment(0, 2048, 1020, "g", "x", "page"),)),
                  K.SegmentTable(8192, 4, (K.Segment(0, 1024, 1024, "g", "x", "page"),))):
        assert C._table_key(other) != C._table_key(t)


# --------------------------------------------------------------------------- shard
def test_shard_text_routes_and_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, "s.json", spec_dict(num_blocks=20))  # 2,048 B per block
    argv = ["shard", spec, "--mesh", "dp=2,tp=2", "--block-axes", "dp", "--head-axes", " tp,"]
    rc, out, _ = cli(capsys, *argv, "--blocks", "0-19")
    local = K.KVCacheSpec.from_dict(spec_dict(num_blocks=20))
    lay = K.sharding.shard_spec(local, [("dp", 2), ("tp", 2)], block_axes=("dp",), head_axes=("tp",))
    sb = lay.shard_bytes  # 10 blocks of 1,024 B (heads split in two), 512-B aligned
    assert sb == 10_240
    ten = "0, 1, 2, 3, 4, 5, 6, 7, ... (10 ids)"
    assert rc == 0 and out == (
        f"{lay.describe()}\n"
        f"local table: {lay.verify().format().splitlines()[0]}\n"
        f"  shard 0 (dp=0, tp=0; bytes [0, {sb})): local ids [{ten}]\n"
        f"  shard 1 (dp=0, tp=1; bytes [{sb}, {2 * sb})): local ids [{ten}]\n"
        f"  shard 2 (dp=1, tp=0; bytes [{2 * sb}, {3 * sb})): local ids [{ten}]\n"
        f"  shard 3 (dp=1, tp=1; bytes [{3 * sb}, {4 * sb})): local ids [{ten}]\n"
        f"reference on the gathered buffer: {4 * sb} B zeroed, matches the contract\n")
    rc, out, _ = cli(capsys, *argv, "--blocks", "2-9,19")
    lines = out.splitlines()
    assert rc == 0 and lines[2].endswith("local ids [2, 3, 4, 5, 6, 7, 8, 9]")  # 8 ids: all shown
    assert lines[4].endswith("local ids [9]")
    rc, out, _ = cli(capsys, *argv, "--blocks", "0-8")  # 9 ids: the first 8, then the count
    assert rc == 0 and out.splitlines()[2].endswith("local ids [0, 1, 2, 3, 4, 5, 6, 7, ... (9 ids)]")
    assert lines[-1] == f"reference on the gathered buffer: {9 * 2 * 1024} B zeroed, matches the contract"
    rc, out, _ = cli(capsys, *argv)  # no --blocks: the layout and its proof only
    assert rc == 0 and out == f"{lay.describe()}\nlocal table: {lay.verify().format().splitlines()[0]}\n"


def test_shard_json(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = spec_dict()
    spec = write(tmp_path, "s.json", d)
    lay = K.sharding.shard_spec(K.KVCacheSpec.from_dict(d), [("tp", 2)], head_axes=("tp",))
    layout = {k: v for k, v in lay.to_dict().items() if k != "local_spec"}
    rc, out, _ = cli(capsys, "shard", spec, "--mesh", "tp=2", "--head-axes", "tp", "--json")
    assert rc == 0 and out == json.dumps({**layout, "safe": True}) + "\n"
    tp2 = ["shard", spec, "--mesh", "tp=2", "--head-axes", "tp"]
    rc, out, _ = cli(capsys, *tp2, "--blocks", "3,1", "--json")
    assert rc == 0 and json.loads(out) == {**layout, "safe": True, "block_ids": [1, 3],
                                           "local_ids": [[1, 3], [1, 3]], "matches_contract": True,
                                           "zeroed_bytes": 2 * 2 * 1024}
    # --json lists every shard's local ids: bounded by MAX_CLI_IDS after routing (3 ids x 2 shards)
    monkeypatch.setattr(C, "MAX_CLI_IDS", 6)
    argv = ["shard", spec, "--mesh", "tp=2", "--head-axes", "tp", "--blocks", "0-2"]
    assert cli(capsys, *argv, "--json")[0] == 0
    monkeypatch.setattr(C, "MAX_CLI_IDS", 5)
    assert bad(capsys, *argv, "--json") == (
        "--blocks: 3 ids routed to 2 shards give 6 local ids; --json lists at most 5")
    ns = C.build_parser().parse_args([*argv, "--json"])
    e = usage(C.cmd_shard, ns)
    assert (e.field, e.value) == ("blocks", 6)
    assert cli(capsys, *argv)[0] == 0  # the text lists 8 ids per shard at most
    # the gathered buffer of the reference run is bounded, only when there is one
    monkeypatch.setattr(C, "MAX_HOST_BYTES", lay.gathered_bytes - 1)
    assert bad(capsys, *argv).startswith(f"gathered bytes = {lay.gathered_bytes} B: above")
    assert cli(capsys, "shard", spec, "--mesh", "tp=2", "--head-axes", "tp")[0] == 0
    monkeypatch.setattr(C, "MAX_HOST_BYTES", lay.gathered_bytes)
    assert cli(capsys, *argv)[0] == 0
    assert bad(capsys, "shard", spec) == "--mesh is required (e.g. --mesh dp=2,tp=4)"
    e = usage(C.cmd_shard, C.build_parser().parse_args(["shard", spec, "--mesh", ""]))
    assert (e.field, e.value) == ("mesh", None)


def test_shard_unsafe_or_mismatched_is_exit_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from kvlayout.sharding import ShardedLayout

    spec = write(tmp_path, "s.json", spec_dict())
    argv = ["shard", spec, "--mesh", "dp=2", "--block-axes", "dp"]
    with monkeypatch.context() as m:  # a reference that writes nothing: the check fails
        m.setattr(ShardedLayout, "zero_reference", lambda self, buf, ids: None)
        rc, out, _ = cli(capsys, *argv, "--blocks", "1")
        assert rc == 1 and out.splitlines()[-1].startswith("reference on the gathered buffer: 0 B zeroed, ")
        assert "matches the contract" not in out
        rc, out, _ = cli(capsys, *argv, "--blocks", "1", "--json")
        rep = json.loads(out)
        assert rc == 1 and rep["matches_contract"] is False and rep["zeroed_bytes"] == 0
        assert cli(capsys, *argv)[0] == 0  # nothing zeroed, nothing to mismatch
    unsafe = K.verify(K.SegmentTable(8192, 4, (K.Segment(0, 2048, 4096, "g", "x", "page"),)))
    monkeypatch.setattr(ShardedLayout, "verify", lambda self: unsafe)
    rc, out, _ = cli(capsys, *argv)
    assert rc == 1 and out.splitlines()[1] == f"local table: {unsafe.format().splitlines()[0]}"
    rc, out, _ = cli(capsys, *argv, "--blocks", "1", "--json")
    assert rc == 1 and json.loads(out)["safe"] is False and json.loads(out)["matches_contract"] is True


# --------------------------------------------------------------------------- plot
def test_plot_out_path_rules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("a.png", "b.SVG", "c.Pdf"):
        assert C._plot_path(str(tmp_path / name)) == tmp_path / name
    (tmp_path / "old.png").write_bytes(b"x")
    assert C._plot_path(str(tmp_path / "old.png")) == tmp_path / "old.png"  # a file to overwrite
    (tmp_path / "t.txt").write_text("keep")
    (tmp_path / "link.png").symlink_to(tmp_path / "t.txt")
    (tmp_path / "loop.png").symlink_to(tmp_path / "loop.png")
    (tmp_path / "d.png").mkdir()
    os.mkfifo(tmp_path / "f.png")
    ok_link = tmp_path / "ok.png"
    ok_link.symlink_to(tmp_path / "old.png")
    assert C._plot_path(str(ok_link)) == ok_link  # a link to a plot file is fine; the link is returned
    long = str(tmp_path / ("x" * 50 + ".png"))
    cases = [  # (text, message after "--out 'TEXT': ")
        (str(tmp_path / "a.txt"), "the file must end in .png, .svg or .pdf"),
        (str(tmp_path / "a.png") + "/", "the file must end in .png, .svg or .pdf"),
        (str(tmp_path / "a.png") + "\\", "the file must end in .png, .svg or .pdf"),
        (str(tmp_path / "png"), "the file must end in .png, .svg or .pdf"),
        (str(tmp_path / "link.png"),
         f"links to {C._short(str(tmp_path / 't.txt'))!r}, not a .png, .svg or .pdf file"),
        ("/proc/x.png", "/proc, /sys, /dev hold no plot files"),
        ("/sys/kernel/x.svg", "/proc, /sys, /dev hold no plot files"),
        ("/dev/x.pdf", "/proc, /sys, /dev hold no plot files"),
        (str(tmp_path / "d.png"), "is a folder or not a regular file"),
        (str(tmp_path / "f.png"), "is a folder or not a regular file"),
        (str(tmp_path / "no" / "x.png"), f"folder {str(tmp_path / 'no')!r} does not exist"),
        (str(tmp_path / "t.txt" / "x.png"), f"folder {str(tmp_path / 't.txt')!r} does not exist"),
    ]
    for text, why in cases:
        e = usage(C._plot_path, text)
        assert str(e) == f"--out {C._short(text)!r}: {why}", (text, str(e))
        assert (e.field, e.value) == ("out", text)
    e = usage(C._plot_path, str(tmp_path / "loop.png"))
    assert str(e).startswith(f"--out {C._short(str(tmp_path / 'loop.png'))!r}: ") and e.field == "out"
    assert e.value == str(tmp_path / "loop.png")
    assert "loop" in str(e).split(": ", 1)[1].lower() or "link" in str(e).split(": ", 1)[1].lower()
    e = usage(C._plot_path, long + ".txt")
    assert str(e).startswith(f"--out {C._short(long + '.txt')!r}: ")
    assert (tmp_path / "t.txt").read_text() == "keep"
    # writable: the folder, and the file when it exists (root passes os.access: patched here)
    real = os.access
    for denied, path, refused in (
        (str(tmp_path), tmp_path / "new.png", True),
        (str(tmp_path / "old.png"), tmp_path / "old.png", True),
        (str(tmp_path / "new.png"), tmp_path / "new.png", False),  # a new file: only its folder counts
    ):
        monkeypatch.setattr(os, "access", lambda p, mode, d=denied: str(p) != d and real(p, mode))
        if refused:
            e = usage(C._plot_path, str(path))
            assert str(e) == f"--out {C._short(str(path))!r}: not writable" and e.field == "out"
            assert e.value == str(path)
        else:
            assert C._plot_path(str(path)) == path
    monkeypatch.setattr(os, "access", lambda p, mode: mode == os.W_OK or real(p, mode))
    C._plot_path(str(tmp_path / "old.png"))
    monkeypatch.setattr(os, "access", lambda p, mode: mode != os.W_OK and real(p, mode))
    assert usage(C._plot_path, str(tmp_path / "new.png")).field == "out"


def test_plot_size_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = K.preset("dsv4-test")  # 4 layers in 1 group, 4 rows
    table = K.plan(spec)
    assert (len(table), len({s.group for s in table.segments}), len(spec.layers)) == (4, 1, 4)
    monkeypatch.setattr(C, "MAX_PLOT_ROWS", 4)
    monkeypatch.setattr(C, "MAX_PLOT_GROUPS", 1)
    monkeypatch.setattr(C, "MAX_PLOT_LAYERS", 4)
    C._plot_sized(table, [spec, spec])
    for attr, field, n in (("MAX_PLOT_ROWS", "rows", 4), ("MAX_PLOT_GROUPS", "groups", 1)):
        with monkeypatch.context() as m:
            m.setattr(C, attr, n - 1)
            e = usage(C._plot_sized, table, [])
            assert str(e) == (
                f"plot: the table has {n} {field}; plots draw at most {n - 1} (use kvlayout plan or check)")
            assert (e.field, e.value) == (field, n)
    C._plot_sized(table, [])
    monkeypatch.setattr(C, "MAX_PLOT_LAYERS", 3)
    C._plot_sized(table, [])
    small = K.KVCacheSpec.from_dict(spec_dict(layers=3))
    C._plot_sized(table, [small])
    e = usage(C._plot_sized, table, [small, spec])
    assert str(e) == "plot: the spec has 4 layers; byte maps draw at most 3"
    assert (e.field, e.value) == ("layers", 4)


class Fig:
    """A figure stand-in: records where it is saved (no matplotlib drawing in these tests)."""

    def __init__(self, kind: str, args: tuple[Any, ...], kw: dict[str, Any], error: OSError | None = None):
        self.kind, self.args, self.kw, self.error, self.saved = kind, args, kw, error, None

    def savefig(self, out: Any, dpi: int) -> None:
        if self.error is not None:
            raise self.error
        self.saved = (out, dpi)


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Fig]:
    """kvlayout.viz's figure makers replaced by recorders; the figures made, in order."""
    import kvlayout.viz as V

    figs: list[Fig] = []

    def maker(kind: str) -> Any:
        def make(*args: Any, **kw: Any) -> Fig:
            figs.append(Fig(kind, args, kw))
            return figs[-1]
        return make

    for kind in ("byte_map", "compare_maps", "table_map", "bytes_per_step", "zero_diff"):
        monkeypatch.setattr(V, kind, maker(kind))
    return figs


def test_plot_draws_each_kind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str], drawn: list[Fig]) -> None:
    d = spec_dict(num_blocks=8)
    spec = write(tmp_path, "small.json", d)
    ks = K.KVCacheSpec.from_dict(d)
    table = write(tmp_path, "tab.json", K.plan(ks).to_json())
    png = str(tmp_path / "x.png")

    def plot(*argv: str) -> Fig:
        n = len(drawn)
        assert cli(capsys, "plot", *argv, "--out", png) == (0, f"wrote {png}\n", "")
        assert len(drawn) == n + 1 and drawn[-1].saved == (Path(png), 110)
        return drawn[-1]

    f = plot(spec)
    assert (f.kind, f.args, f.kw) == ("byte_map", (ks, None), {"title": "small.json"})
    f = plot(spec, "--num-blocks", "0")  # a map of a pool without blocks draws the layout
    assert (f.kind, f.args[0]) == ("byte_map", ks.with_num_blocks(0))
    f = plot(spec, "--kind", "map", "--blocks", "7,0-1")
    assert (f.kind, f.args, f.kw) == ("byte_map", (ks, [7, 0, 1]), {"title": "small.json"})
    f = plot("--preset", "dsv4-test")
    assert f.kw == {"title": "dsv4-test"} and f.args == (K.preset("dsv4-test"), None)
    f = plot(spec, "--kind", "table", "--blocks", "2")
    assert (f.kind, f.args) == ("table_map", (K.plan(ks), [2]))
    f = plot("--table", table)  # a table: --kind table by default
    assert (f.kind, f.args) == ("table_map", (K.SegmentTable.from_json(K.plan(ks).to_json()), None))
    f = plot(spec, "--kind", "steps")
    assert (f.kind, f.args) == ("bytes_per_step", (ks,))
    f = plot("--table", table, "--kind", "steps")
    assert (f.kind, f.args) == ("bytes_per_step", (K.SegmentTable.from_json(K.plan(ks).to_json()),))
    f = plot(spec, "--compare", "layout=layer_major, num_blocks=4", "--blocks", "3")
    other = ks.with_num_blocks(4)
    other = K.KVCacheSpec.from_dict({**other.to_dict(), "layout": "layer_major"})
    assert f.kind == "compare_maps" and f.args[:2] == (ks, other) and f.args[3] == [3]
    assert f.args[2] == ("small.json", "small.json with layout=layer_major, num_blocks=4")
    f = plot(spec, "--kind", "map", "--compare", "tp=2")
    assert f.args[2] == ("small.json", "small.json with tp=2") and f.args[3] is None
    f = plot("--config", LLAMA, "--num-blocks", "4")
    assert f.kind == "byte_map" and f.kw == {"title": "llama"}  # the config's folder names the model
    monkeypatch.chdir(Path(LLAMA).parent)
    f = plot("--config", "config.json", "--num-blocks", "4")
    assert f.kw == {"title": "config"}  # a config in the current folder
    # diff: the reference run on a poisoned buffer, ids 0 unless given
    from kvlayout.reference import poison_pattern

    for blocks, ids in (([], [0]), (["--blocks", "5,2"], [5, 2])):
        f = plot(spec, "--kind", "diff", *blocks)
        before, runs, tab, got_ids = f.args
        assert f.kind == "zero_diff" and f.kw == {"origin": C.GUARD_BYTES} and tab == K.plan(ks)
        assert got_ids == ids and list(runs) == ["reference"]
        n = 2 * C.GUARD_BYTES + K.plan(ks).total_bytes
        assert before.size == n and np.array_equal(before, poison_pattern(n))
        changed = np.flatnonzero(runs["reference"] != before) - C.GUARD_BYTES
        want = K.expected_zeroed(K.plan(ks), ids)
        assert np.array_equal(np.unique(changed), np.concatenate([np.arange(a, b) for a, b in want.tolist()]))
    assert not Path(png).exists()  # every figure was a stand-in


def test_plot_refusals(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                       drawn: list[Fig]) -> None:
    d = spec_dict(num_blocks=8)
    spec = write(tmp_path, "small.json", d)
    table = write(tmp_path, "tab.json", K.plan(K.KVCacheSpec.from_dict(d)).to_json())
    png = str(tmp_path / "x.png")
    for extra in ([spec], ["--preset", "dsv4-test"], ["--config", LLAMA]):
        msg = bad(capsys, "plot", "--table", table, *extra, "--out", png)
        assert msg == "give --table or a spec, not both"
        e = usage(C.cmd_plot, C.build_parser().parse_args(["plot", "--table", table, *extra, "--out", png]))
        assert (e.field, e.value) == ("table", table)
    why = ("--table draws --kind table or steps (a table JSON has no layout: --compare, --num-blocks and "
           "--kind map/diff need a spec)")
    for extra in (["--num-blocks", "4"], ["--num-blocks", "0"], ["--compare", "tp=2"], ["--compare", ""],
                  ["--kind", "map"], ["--kind", "diff"]):
        assert bad(capsys, "plot", "--table", table, *extra, "--out", png) == why
        e = usage(C.cmd_plot, C.build_parser().parse_args(["plot", "--table", table, *extra, "--out", png]))
        assert (e.field, e.value) == ("table", table)
    why = "--compare draws two byte maps: use it without --kind (or with --kind map)"
    for kind in ("table", "diff", "steps"):
        assert bad(capsys, "plot", spec, "--kind", kind, "--compare", "tp=2", "--out", png) == why
        ns = C.build_parser().parse_args(["plot", spec, "--kind", kind, "--compare", "tp=2", "--out", png])
        e = usage(C.cmd_plot, ns)
        assert (e.field, e.value) == ("compare", "tp=2")
    msg = bad(capsys, "plot", spec, "--compare", "tp=3", "--out", png)
    assert msg.startswith("layer 'l0'.num_kv_heads = 2")
    assert bad(capsys, "plot", spec, "--compare", "bogus", "--out", png).startswith("--compare item")
    # a variant that cannot be planned (padded pages of 2 head slots in LHBNC) is refused before drawing
    padded = spec_dict(num_blocks=8)
    padded["groups"][0]["layers"] = [layer("l0", alignment=1536)]
    msg = bad(capsys, "plot", write(tmp_path, "pad.json", padded), "--compare", "layout=LHBNC", "--out", png)
    assert msg.startswith("layer 'l0'.alignment = 1536: LHBNC cannot pad")
    assert drawn == []
    msg = bad(capsys, "plot", spec, "--blocks", "8", "--out", png)
    assert msg == "--blocks item '8': block 8 outside [0, 8)"
    assert bad(capsys, "plot", spec, "--out", str(tmp_path / "x.txt")).startswith("--out ")
    for text in ("{", ""):  # a table file that is not JSON: TableError, naming the "table file"
        msg = bad(capsys, "plot", "--table", write(tmp_path, "bad.json", text), "--out", png)
        assert msg.startswith("table file"), msg
    assert bad(capsys, "plot", "--table", str(tmp_path / "none.json"), "--out", png).startswith("table file")
    # the byte-map size limit counts the spec and its variant, for maps only
    monkeypatch.setattr(C, "MAX_PLOT_LAYERS", 4)
    assert cli(capsys, "plot", "--preset", "dsv4-test", "--out", png)[0] == 0
    msg = bad(capsys, "plot", "--preset", "dsv4-test", "--compare", "preset=dsv4", "--out", png)
    assert msg.startswith("plot: the spec has ") and msg.endswith("layers; byte maps draw at most 4")
    monkeypatch.setattr(C, "MAX_PLOT_LAYERS", 3)
    for kind in ("table", "steps", "diff"):
        assert cli(capsys, "plot", "--preset", "dsv4-test", "--kind", kind, "--out", png)[0] == 0, kind
    assert bad(capsys, "plot", "--preset", "dsv4-test", "--out", png) == (
        "plot: the spec has 4 layers; byte maps draw at most 3")
    # a spec file is refused before it is parsed: layers counted over the groups that list them
    big = {"num_blocks": 4, "layout": "packed", "groups": [
        {"name": "g", "layers": [layer("a"), layer("b")]}, {"name": "h", "layers": [layer("c"), layer("d")]},
        {"name": "i", "layers": "not a list"}, "not a group"]}
    msg = bad(capsys, "plot", write(tmp_path, "big.json", big), "--out", png)
    assert msg == "plot: the spec has 4 layers; plots draw at most 3"
    e = usage(C._load_spec, C.build_parser().parse_args(["plot", str(tmp_path / "big.json"), "--out", png]))
    assert (e.field, e.value) == ("layers", 4)
    for odd in ([1, 2], {"groups": 5}, {"groups": [3, {"name": "g"}]}):  # refused by the spec's own checks
        msg = bad(capsys, "plot", write(tmp_path, "odd.json", odd), "--out", png)
        assert not msg.startswith("plot:"), msg
    three = write(tmp_path, "three.json", spec_dict(num_blocks=8, layers=3))
    assert cli(capsys, "plot", three, "--kind", "table", "--out", png)[0] == 0
    assert bad(capsys, "plot", write(tmp_path, "n.json", NATIVE), "--out", png).endswith(
        "plot takes a flat-buffer spec")
    # diff runs the reference on a host copy: bounded by a quarter of zero's bound (the others are not)
    monkeypatch.setattr(C, "MAX_HOST_BYTES", 4 * 8 * 2048 - 1)
    msg = bad(capsys, "plot", spec, "--kind", "diff", "--out", png)
    assert msg.startswith("total_bytes = 16384 B: above the 16383 B")
    assert cli(capsys, "plot", spec, "--kind", "table", "--out", png)[0] == 0
    monkeypatch.setattr(C, "MAX_HOST_BYTES", 4 * 8 * 2048)
    assert cli(capsys, "plot", spec, "--kind", "diff", "--out", png)[0] == 0
    assert not Path(png).exists()


def test_plot_without_matplotlib_or_a_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str], drawn: list[Fig]) -> None:
    import kvlayout.viz as V

    spec = write(tmp_path, "s.json", spec_dict())
    png = str(tmp_path / "x.png")
    for err, shown in ((OSError(28, "No space left on device"), "No space left on device"),
                       (OSError("disk gone"), "disk gone")):
        monkeypatch.setattr(V, "byte_map", lambda *a, e=err, **k: Fig("byte_map", a, k, error=e))
        assert bad(capsys, "plot", spec, "--out", png) == f"--out {C._short(png)!r}: {shown}"
        e = usage(C.cmd_plot, C.build_parser().parse_args(["plot", spec, "--out", png]))
        assert (e.field, e.value) == ("out", png)
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert bad(capsys, "plot", spec, "--out", png) == (
        "kvlayout plot needs matplotlib: pip install 'kvlayout[notebook]'")
    e = usage(C.cmd_plot, C.build_parser().parse_args(["plot", spec, "--out", png]))
    assert (e.field, e.value) == ("plot", None)


# --------------------------------------------------------------------------- the parser, main
SOURCE_HELP = [  # (how --help shows the option, its help): the spec sources (every command but conformance)
    ("-v, --verbose", "log backend choices"),
    ("spec", "spec JSON file (GEOMETRY.md section 4)"),
    ("--preset {dsv4,dsv4-test,llama-8b}", "use a built-in spec instead of SPEC.json"),
    ("--num-blocks NUM_BLOCKS", "override the spec's num_blocks"),
    ("--config CONFIG.json", "a Hugging Face config.json instead of SPEC.json"),
    ("--engine ENGINE", "with --config: vllm (default) or tpu-inference"),
    ("--tp TP", "with --config: tensor-parallel ranks (one rank's layout)"),
    ("--kv-cache-dtype KV_CACHE_DTYPE", "with --config: auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2"),
    ("--block-size BLOCK_SIZE", "with --config: tokens per block (else the engine's)"),
    ("--device DEVICE", "with --config: the GPU: hopper (default), blackwell, ampere"),
    ("--attention-backend ATTENTION_BACKEND", "with --config: a vLLM attention backend (else vLLM's choice)"),
    ("--reader READER", "with --config: auto (default: as written, through transformers where a field is "
     "left out), json (as written) or transformers (as vLLM)"),
    ("--dp DP", "with --engine tpu-inference: the mesh's data axis"),
    ("--dcp DCP", "with --engine tpu-inference: decode context parallel size"),
    ("--model-impl MODEL_IMPL", "with --engine tpu-inference: auto (default), flax_nnx, vllm"),
    ("--max-model-len MAX_MODEL_LEN", "with --engine tpu-inference: sets its default page"),
]
COMMAND_HELP = {
    "plan": ("plan a spec and print its segment table", [
        ("--json", "print the table JSON of GEOMETRY.md section 4"),
        ("--compact", "with --json: one line"),
        ("--coalesce", "print the coalesced (kernel) table"),
    ]),
    "check": ("prove a table safe for every block id", [
        ("--table TABLE", "check a segment table JSON instead of a spec"),
        ("--json", "print the report as JSON"),
    ]),
    "zero": ("zero blocks with a real backend on a poisoned buffer and compare", [
        ("--blocks BLOCKS", "block ids, e.g. 0,5,99 or 0-15"),
        ("--backend BACKEND", "backend name (else $KVLAYOUT_BACKEND, else auto)"),
        ("--json", "print the zero report JSON"),
        ("--group GROUP", "zero the ids of this cache group only (docs/GEOMETRY.md section 7)"),
    ]),
    "shard": ("shard a spec over a device mesh: per-shard layout, proof, id routing", [
        ("--mesh MESH", "mesh axes in order, e.g. dp=2,tp=4"),
        ("--block-axes BLOCK_AXES", "axes that split the block pool (block_sharded mode), e.g. dp"),
        ("--head-axes HEAD_AXES",
         "axes that split the KV heads (each shard: a full local layout), e.g. tp"),
        ("--blocks BLOCKS", "global block ids to route (and zero with the reference), e.g. 0,5,99"),
        ("--json", "print the sharded layout (and routing) as JSON"),
    ]),
    "plot": ("draw a layout: byte map, table rows, zeroing, bytes per step", [
        ("--table TABLE", "draw a segment table JSON instead of a spec (--kind table or steps)"),
        ("--out OUT", "FILE.png, FILE.svg or FILE.pdf"),
        ("--blocks BLOCKS",
         "block ids to draw (default: first, second, middle, last); for --kind diff: ids to zero"),
        ("--kind {map,table,diff,steps}",
         "map (default for a spec): lanes per group shape, gaps at byte scale; "
         "table (default for --table): what each row clears, red only where unsafe; diff: reference zeroing, "
         "changed bytes; steps: bytes written per step, per-group against all-group zeroing"),
        ("--compare KEY=VALUE[,...]", "draw the spec above a variant of it: layout=NAME, tp=N, dtype=NAME, "
         "num_blocks=N, preset=NAME or spec=FILE (e.g. --compare layout=layer_major or --compare tp=2)"),
    ]),
    "conformance": ("run the conformance battery on one or every installed backend", [
        ("--backend BACKEND", "name or module:attr (default: every installed backend)"),
        ("--quick", "fewer random specs"),
    ]),
}


def parser_help_problems() -> list[tuple[str, str, str]]:
    """Every option of :data:`COMMAND_HELP` and :data:`SOURCE_HELP` whose help is not shown as written."""
    parser = C.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for cmd, (_, options) in COMMAND_HELP.items():
        sub = subs.choices[cmd]
        sub.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=10_000)
        text = " ".join(sub.format_help().split()) + " "
        for shown, what in options + (SOURCE_HELP if cmd != "conformance" else []):
            if f" {shown} {what} " not in text:
                missing.append((cmd, shown, what))
    return missing


@pytest.fixture(autouse=True)
def _help_as_documented() -> None:
    """Before every test here: the parser still documents every option as written (a cheap check,
    so that a test run stopped at its first failure reports a broken --help at once)."""
    assert parser_help_problems() == []


def help_text(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``kvlayout ARGV --help`` on one line (words joined by single spaces), with a trailing space."""
    monkeypatch.setenv("COLUMNS", "10000")  # no wrapping
    with pytest.raises(SystemExit) as e:
        C.main([*argv, "--help"])
    out, err = capsys.readouterr()
    assert e.value.code == 0 and err == ""
    return " ".join(out.split()) + " "


def test_help_of_every_command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """What --help says is the command line's documentation: every option with its text."""
    top = help_text(monkeypatch, capsys)
    assert top.startswith("usage: kvlayout [-h] [--version] {plan,check,zero,shard,plot,conformance} ")
    assert " Plan, verify and zero paged KV-cache layouts (contract: docs/GEOMETRY.md). " in top
    for cmd, (summary, options) in COMMAND_HELP.items():
        assert f" {cmd} {summary} " in top, cmd
        text = help_text(monkeypatch, capsys, cmd)
        assert text.startswith(f"usage: kvlayout {cmd} [-h] "), text[:80]
        rows = options + (SOURCE_HELP if cmd != "conformance" else [])
        for shown, what in rows:
            assert f" {shown} {what} " in text, (cmd, shown, what)
        if cmd != "conformance":
            assert " a model's config.json (kvlayout.models): the cache an engine allocates for it: " in text
    with pytest.raises(SystemExit) as e:
        C.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"kvlayout {K.__version__}\n"


def test_argparse_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        ([], "kvlayout: error: the following arguments are required: cmd"),
        (["plan", "--num-blocks", "x"],
         "kvlayout plan: error: argument --num-blocks: 'x': not a non-negative decimal integer"),
        (["zero", "--tp", "1" * 20],
         f"kvlayout zero: error: argument --tp: '{'1' * 20}': at most 19 digits"),
        (["check", "--preset", "nope"], "kvlayout check: error: argument --preset: invalid choice: 'nope' "),
        (["plot", "--preset", "dsv4-test"],
         "kvlayout plot: error: the following arguments are required: --out"),
        (["plot", "--preset", "dsv4-test", "--out", "x.png", "--kind", "pie"],
         "kvlayout plot: error: argument --kind: invalid choice: 'pie' "),
        (["conformance", "--preset", "dsv4"], "kvlayout: error: unrecognized arguments: --preset dsv4"),
        (["plan", "--table", "t.json"], "kvlayout: error: unrecognized arguments: --table"),
        (["shard", "--group", "g"], "kvlayout: error: unrecognized arguments: --group"),
    ]
    for argv, start in cases:
        with pytest.raises(SystemExit) as e:
            C.main(argv)
        out, err = capsys.readouterr()
        assert e.value.code == 2 and out == "" and err.count("\n") == 1, (argv, err)
        assert (err.startswith(start) if "invalid choice" in start else err == start + "\n"), (argv, err)
    for flag in ("--num-blocks", "--tp", "--block-size", "--dp", "--dcp", "--max-model-len"):
        with pytest.raises(SystemExit):
            C.main(["plan", "--preset", "dsv4-test", flag, "-1"])
        assert f"argument {flag}: '-1': not a non-negative decimal integer" in capsys.readouterr().err


def test_main_logging_errors_and_memory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: seen.append(kw))
    for argv, level in ((["plan", "--preset", "dsv4-test"], logging.WARNING),
                        (["plan", "--preset", "dsv4-test", "-v"], logging.INFO),
                        (["check", "--preset", "dsv4-test", "--verbose"], logging.INFO)):
        assert cli(capsys, *argv)[0] == 0
        assert seen[-1] == {"level": level, "format": "%(message)s"}, argv
    monkeypatch.setattr("kvlayout.conformance.run_conformance", lambda backends, quick=False: [])
    assert cli(capsys, "conformance", "--backend", "reference")[0] == 0
    assert seen[-1]["level"] == logging.WARNING  # conformance has no -v
    rc, out, _ = cli(capsys, "check", "--table", write_unsafe(monkeypatch))
    assert rc == 1  # the command's own status comes back as an int

    def boom(*a: Any, **k: Any) -> None:
        raise MemoryError

    monkeypatch.setattr(C, "plan_layout", boom)
    assert cli(capsys, "plan", "--preset", "dsv4-test") == (
        2, "", "kvlayout plan: error: out of host memory (try a smaller --num-blocks)\n")

    def bad_spec(*a: Any, **k: Any) -> None:
        raise K.SpecError("line one\nline\x1b[2J two")

    monkeypatch.setattr(C, "plan_layout", bad_spec)
    assert cli(capsys, "check", "--preset", "dsv4-test") == (
        2, "", "kvlayout check: error: line one\\nline\\x1b[2J two\n")

    def closed(*a: Any, **k: Any) -> None:
        raise BrokenPipeError  # e.g. ``kvlayout plan | head``: the reader left, not an error

    monkeypatch.setattr(C, "plan_layout", closed)
    assert cli(capsys, "plan", "--preset", "dsv4-test") == (0, "", "")


def write_unsafe(monkeypatch: pytest.MonkeyPatch) -> str:
    import tempfile

    d = tempfile.mkdtemp()
    p = Path(d) / "u.json"
    p.write_text(K.SegmentTable(8192, 4, (K.Segment(0, 2048, 4096, "g", "x", "page"),)).to_json())
    return str(p)


class Failure:
    def __init__(self, text: str) -> None:
        self.text = text

    def format(self) -> str:
        return self.text


def test_conformance_command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import kvlayout.conformance as CF
    import kvlayout.registry as R

    calls: list[tuple[dict[str, Any], bool]] = []
    result: list[Any] = []
    monkeypatch.setattr(CF, "run_conformance", lambda b, quick=False: calls.append((b, quick)) or result)
    assert cli(capsys, "conformance", "--backend", "reference") == (
        0, "conformance: 1 backends (reference): all passed\n", "")
    assert calls[-1] == ({"reference": ReferenceBackend}, False)
    assert cli(capsys, "conformance", "--backend", f"{HERE}:Counted", "--quick")[0] == 0
    assert calls[-1] == ({f"{HERE}:Counted": Counted}, True)
    result[:] = [Failure("case a: wrong"), Failure("case b: wrong")]
    assert cli(capsys, "conformance", "--backend", "reference") == (
        1, "case a: wrong\ncase b: wrong\nconformance: 1 backends (reference): 2 failures\n", "")
    # every installed backend: those whose extra imports, in registry order
    found = {"one": ("x", None), "gone": ("y", "cuda"), "two": ("z", None)}
    monkeypatch.setattr(R, "registered", lambda: found)

    def load(name: str) -> Any:
        if name == "gone":
            raise K.BackendError("not installed")
        return {"one": ReferenceBackend, "two": Counted}[name]

    monkeypatch.setattr(R, "load", load)
    assert C.installed_backends() == {"one": ReferenceBackend, "two": Counted}
    assert list(C.installed_backends()) == ["one", "two"]
    result[:] = []
    assert cli(capsys, "conformance") == (0, "conformance: 2 backends (one, two): all passed\n", "")
    assert calls[-1] == ({"one": ReferenceBackend, "two": Counted}, False)


def test_a_table_takes_no_model_beside_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (issue 25): check --table T --config C answered SAFE for T and silently ignored C, and
    check/plot --table T --tp 4 (any model flag) ignored the flag."""
    table = write(tmp_path, "t.json", K.plan(K.KVCacheSpec.from_dict(spec_dict())).to_json())
    png = str(tmp_path / "x.png")
    assert bad(capsys, "check", "--table", table, "--config", LLAMA) == "give --table or a spec, not both"
    e = usage(C.cmd_check, C.build_parser().parse_args(["check", "--table", table, "--config", LLAMA]))
    assert (e.field, e.value) == ("table", table)
    for flag, value in MODEL_FLAGS:
        for cmd, extra in (("check", []), ("plot", ["--out", png])):
            msg = bad(capsys, cmd, "--table", table, flag, value, *extra)
            assert msg == f"{flag} applies with --config CONFIG.json only", (cmd, flag, msg)
            e = usage(C._refuse_model_flags, C.build_parser().parse_args([cmd, "--table", table, flag, value,
                                                                          *extra]))
            assert (e.field, e.value) == (flag, None)
    C._refuse_model_flags(C.build_parser().parse_args(["check", "--table", table]))
    assert not Path(png).exists()


def test_zero_a_group_of_never_zeroed_layers(capsys: pytest.CaptureFixture[str]) -> None:
    """``zero --group`` naming a group whose layers are never zeroed (Jamba's Mamba groups): nothing to
    clear, exit 0, the report says so; another name: exit 2 listing both kinds of group; the ids and
    the backend are still checked."""
    jamba = str(FIXTURES / "jamba" / "config.json")
    rc, out, err = cli(capsys, "zero", "--config", jamba, "--blocks", "1,3,3", "--group", "mamba.2", "--json")
    assert (rc, err) == (0, "")
    assert json.loads(out) == {
        "version": 1, "backend": "reference", "mode": "none", "total_bytes": 20_971_520,
        "block_ids": [1, 3, 3], "matches_contract": True, "zeroed": [], "zeroed_bytes": 0, "group": "mamba.2",
    }
    rc, out, err = cli(capsys, "zero", "--config", jamba, "--blocks", "0", "--group", "mamba.0")
    assert (rc, err) == (0, "")
    assert out == (
        "group 'mamba.0' holds no zeroed layer (its state is never zeroed, docs/GEOMETRY.md section 7): "
        "1 block ids, 0 B zeroed of a 20971520 B buffer\n"
    )
    rc, out, _ = cli(capsys, "zero", "--config", jamba, "--blocks", "0", "--group", "mamba.0",
                     "--backend", "cuda", "--json")
    assert rc == 0 and json.loads(out)["backend"] == "cuda"
    mamba = ", ".join(f"'mamba.{i}'" for i in range(7))
    assert bad(capsys, "zero", "--config", jamba, "--blocks", "0", "--group", "Mamba.0") == (
        f"group = 'Mamba.0': unknown group; valid groups: 'full'; groups that zero nothing: {mamba}"
    )
    assert bad(capsys, "zero", "--config", jamba, "--blocks", "16", "--group", "mamba.0") == (
        "--blocks item '16': block 16 outside [0, 16)"
    )
    assert bad(capsys, "zero", "--config", jamba, "--blocks", "1", "--group", "mamba.0", "--backend", "nope"
               ).startswith("Invalid value 'nope' for backend. Valid options: ")
    assert bad(capsys, "zero", "--preset", "dsv4-test", "--blocks", "1", "--group", "x") == (
        "group = 'x': unknown group; valid groups: 'mla'"
    )
    rc, out, _ = cli(capsys, "zero", "--config", jamba, "--blocks", "1", "--group", "full", "--json")
    assert rc == 0 and json.loads(out)["zeroed_bytes"] == 4 * 327_680 and json.loads(out)["group"] == "full"


def test_plot_of_a_pool_without_blocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A drawing that zeroes block ids needs a block: a pool of 0 blocks (or a --compare variant of 0)
    is refused by name, before matplotlib (issue 25: it named an id the user never gave)."""
    out = str(tmp_path / "x.png")
    none = "draws block ids, and this pool has none"
    for extra, msg in (
        (["--num-blocks", "0", "--kind", "diff"], f"num_blocks = 0: --kind diff {none}"),
        (["--num-blocks", "0", "--kind", "steps"], f"num_blocks = 0: --kind steps {none}"),
        (["--compare", "num_blocks=0"], f"--compare num_blocks = 0: --kind map {none}"),
        (["--num-blocks", "0", "--compare", "layout=BHLNC"], f"num_blocks = 0: --kind map {none}"),
    ):
        assert bad(capsys, "plot", "--preset", "dsv4-test", "--out", out, *extra) == msg
        argv = ["plot", "--preset", "dsv4-test", "--out", out, *extra]
        e = usage(C.cmd_plot, C.build_parser().parse_args(argv))
        assert (e.field, e.value) == ("num_blocks", 0)
    assert not Path(out).exists()


def test_native_zero_and_shard_bound_the_ranges_they_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``zero`` of a native spec lists each array's ranges and ``shard --blocks`` the gathered
    contract: both are refused past 1,000,000 ranges, before anything runs (issue 25: 4,000 arrays
    printed 629 MB of JSON; 4,000 layers over 64 shards took 8 s and 1.4 GB)."""
    native = tmp_path / "n.json"
    leaves = [{"name": f"l{i}", "shape": [2002, 1], "dtype": "float32", "group": "g"} for i in range(1001)]
    native.write_text(json.dumps({"version": 1, "layout": "native", "leaves": leaves}))
    even = ",".join(map(str, range(0, 2002, 2)))  # 1,001 runs in each of 1,001 arrays
    assert bad(capsys, "zero", str(native), "--backend", "reference", "--blocks", even) == (
        "--blocks: the contract for these ids may hold up to 1002001 separate byte ranges; a zero report "
        "lists at most 1000000 (give fewer or consecutive ids)"
    )
    layers = [{"name": f"l{i}", "kind": "full", "block_size": 1, "num_kv_heads": 64, "head_size": 2,
               "dtype": "float16"} for i in range(1000)]
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"version": 1, "num_blocks": 64, "layout": "layer_major",
                                "groups": [{"name": "g", "layers": layers}]}))
    ids = ",".join(map(str, range(0, 64, 2)))
    assert bad(capsys, "shard", str(spec), "--mesh", "tp=64", "--head-axes", "tp", "--blocks", ids) == (
        "--blocks: the contract for these ids may hold up to 2048000 separate byte ranges; a zero report "
        "lists at most 1000000 (give fewer or consecutive ids)"
    )
    rc, out, _ = cli(capsys, "shard", str(spec), "--mesh", "tp=64", "--head-axes", "tp", "--blocks", "0-15")
    assert rc == 0 and "matches the contract" in out


def test_shard_range_bound_is_dense_runs_plus_sparse_ids() -> None:
    """``_shard_ranges``: each shard's range_count_bound (dense rows once per run of consecutive ids,
    sparse rows once per id), its two coefficients read off ids [0] and [0, 1] (one id only in a pool
    of one block)."""
    seg = K.Segment
    t4 = K.SegmentTable(288, 4, (seg(0, 64, 64), seg(256, 8, 4)))  # one dense row, one sparse
    routes = [np.array([0, 1, 3]), np.array([2]), np.array([], np.int64)]
    assert C._shard_ranges(t4, routes) == 1 * (2 + 1) + 1 * (3 + 1)
    assert C._shard_ranges(t4, [np.array([], np.int64)] * 3) == 0
    t2 = K.SegmentTable(272, 2, (seg(0, 64, 64), seg(256, 8, 4)))
    assert C._shard_ranges(t2, [np.array([0, 1])]) == 1 * 1 + 1 * 2
    t1 = K.SegmentTable(272, 1, (seg(0, 64, 64), seg(256, 8, 4)))
    assert C._shard_ranges(t1, [np.array([0]), np.array([0])]) == 2 * 2
