"""Hostile input (issue 12, GEOMETRY.md section 8): no accepted input makes the verifier wrong,
and no input makes kvlayout crash, hang, exhaust memory or write outside a buffer.

Every case checks: the exit status or exception class, that the message names the field,
that it answered within 1 s and 100 MB of Python allocations, and that buffers are unchanged.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvlayout as K
from kvlayout.cli import main
from kvlayout.errors import KVLayoutError

#: CPU seconds: far above any bounded call (milliseconds), far below the unbounded ones this
#: file guards against (tens of seconds to hours); CPU time, so a busy machine does not fail it
LIMIT_S = 5.0
T = TypeVar("T")
LIMIT_BYTES = 100 * 2**20


def bounded(fn: Callable[[], T], limit_s: float = LIMIT_S) -> T:
    """``fn()``, failing unless it runs within ``limit_s`` CPU seconds and 100 MB of Python allocations.

    Time and memory are measured on two calls (tracemalloc slows Python down several times).
    """
    t0 = time.process_time()
    out = fn()
    dt = time.process_time() - t0
    tracemalloc.start()
    try:
        fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert dt < limit_s, f"took {dt:.2f} s"
    assert peak < LIMIT_BYTES, f"allocated {peak / 2**20:.0f} MiB"
    return out


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """Run the CLI in-process within the bounds; returns (exit status, stdout, stderr) of the first run."""
    outs: list[tuple[int, str, str]] = []

    def once() -> int:
        try:
            code = main(argv)
        except SystemExit as e:  # argparse usage errors and --version
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        outs.append((code, out, err))
        return code

    bounded(once)
    code, out, err = outs[0]
    assert "Traceback" not in out + err
    return code, out, err


def expect_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], *names: str) -> str:
    code, out, err = run_cli(capsys, argv)
    assert code == 2, (code, out, err)
    assert len(err.strip().splitlines()) == 1, err
    for n in names:
        assert n in err, (n, err)
    return err


def write(tmp_path: Path, name: str, data: str | bytes) -> str:
    p = tmp_path / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return str(p)


def one_row_table(num_blocks: int, stride: int = 1024, span: int = 1024, total: int = 1024) -> str:
    row = {
        "base": 0,
        "stride": stride,
        "span": span,
        "group": "g",
        "layer": "l",
        "part": "page",
        "virtual_index": 0,
    }
    return json.dumps({"version": 1, "total_bytes": total, "num_blocks": num_blocks, "segments": [row]})


# --------------------------------------------------------------------------- item 1: wrap-around
def test_wrapping_table_is_refused_not_proven_safe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(num_blocks-1)*stride wrapped in int64 and the table was SAFE; zeroing then wrote past 1 KiB."""
    path = write(tmp_path, "t.json", one_row_table(18014398509481985))
    expect_exit_2(capsys, ["check", "--table", path], "table.num_blocks", "18014398509481985")


def test_largest_pool_is_exact_unsafe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At the largest accepted num_blocks the same row is out of bounds: UNSAFE, exit 1, exact bytes."""
    n = 2**31 - 1
    path = write(tmp_path, "t.json", one_row_table(n))
    code, out, _ = run_cli(capsys, ["check", "--table", path])
    assert code == 1 and "UNSAFE" in out
    end = (n - 1) * 1024 + 1024
    assert f"ends at {end}, {end - 1024} B past total_bytes 1024" in out
    table = K.SegmentTable.from_json(Path(path).read_text())
    buf = np.full(1024, 7, np.uint8)
    with pytest.raises(K.TableError, match="outside the buffer"):
        K.ReferenceBackend(table, buf).zero([1, 2])
    assert (buf == 7).all()


def test_cuda_zeroer_refuses_the_wrapping_table() -> None:
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    with pytest.raises(KVLayoutError, match="num_blocks"):
        K.SegmentTable.from_json(one_row_table(18014398509481985))
    table = K.SegmentTable.from_json(one_row_table(2**31 - 1))
    buf = torch.zeros(1024, dtype=torch.uint8, device=kc.DEVICE_TYPE)
    with pytest.raises(K.TableError, match="refusing an unsafe table"):
        kc.CudaZeroer(table, buf)


@pytest.mark.parametrize("value", [10**18, 2**63, 2**70, -(2**63) - 1])
def test_huge_num_blocks_in_a_spec_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: int
) -> None:
    spec = K.preset("dsv4-test").to_dict()
    spec["num_blocks"] = value
    path = write(tmp_path, "s.json", json.dumps(spec))
    for cmd in ("plan", "check"):
        expect_exit_2(capsys, [cmd, path], "num_blocks", str(value))


@pytest.mark.parametrize("field", ["base", "stride", "span"])
@pytest.mark.parametrize("value", [2**62, 2**63, 2**64 + 5, -(2**62)])
def test_table_values_beyond_2_62_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: int
) -> None:
    t = json.loads(one_row_table(4))
    t["segments"][0][field] = value
    path = write(tmp_path, "t.json", json.dumps(t))
    expect_exit_2(capsys, ["check", "--table", path], f"segments[0].{field}")


def test_extent_beyond_2_62_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each value is in range but base + (n-1)*stride + span is not."""
    path = write(tmp_path, "t.json", one_row_table(2**31 - 1, stride=2**40, total=2**61))
    expect_exit_2(capsys, ["check", "--table", path], "table.segments[0]", "2**62")


@pytest.mark.parametrize("field", ["block_size", "num_kv_heads", "head_size", "alignment"])
def test_huge_layer_fields_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str) -> None:
    spec = K.preset("llama-8b").to_dict()
    spec["groups"][0]["layers"][0][field] = 2**63
    path = write(tmp_path, "s.json", json.dumps(spec))
    expect_exit_2(capsys, ["plan", path], field)


def test_page_products_beyond_2_62_refused() -> None:
    with pytest.raises(K.SpecError, match="real_page"):
        K.FullAttentionSpec("a", block_size=2**30, num_kv_heads=2**20, head_size=2**10, dtype="float32")
    big = K.FullAttentionSpec("a", block_size=2**20, num_kv_heads=2**10, head_size=2**10, dtype="float32")
    with pytest.raises(K.SpecError, match="num_blocks"):  # 2**33 B per block x 2**30 blocks
        K.plan(K.KVCacheSpec(2**30, "packed", (K.GroupSpec("g", (big,)),)))


# --------------------------------------------------------------------------- item 2: verifier bounds
def test_realistic_8192_row_spec_verifies_fast(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """64 full layers, block_size 128, kernel_block_size 1: 8,192 rows (crashed `check` before)."""
    layers = [
        {
            "name": f"l{i}",
            "kind": "full",
            "block_size": 128,
            "num_kv_heads": 8,
            "head_size": 128,
            "dtype": "bfloat16",
        }
        for i in range(64)
    ]
    spec = {
        "num_blocks": 10_000,
        "layout": "packed",
        "groups": [{"name": "g", "kernel_block_size": 1, "layers": layers}],
    }
    path = write(tmp_path, "s.json", json.dumps(spec))
    code, out, _ = run_cli(capsys, ["check", path])
    assert code == 0 and "8192 rows" in out and "SAFE" in out


@pytest.mark.parametrize(
    "rows",
    [
        [(0, 4096, 64), (32, 8192, 64)],  # different strides: block 2b' of row 0 meets block b' of row 1
        [(0, 4096, 64), (2**42, -4096, 64)],  # negative stride
        [(0, 0, 64), (128, 4096, 64)],  # stride 0
    ],
)
def test_two_rows_of_different_strides_at_the_largest_pool(rows: list[tuple[int, int, int]]) -> None:
    """Decided without looping over 2**31 - 1 blocks; the answer agrees with a direct witness check."""
    n = 2**31 - 1
    table = K.SegmentTable(2**61, n, tuple(K.Segment(*r) for r in rows))
    rep = bounded(lambda: K.verify(table))
    for v in rep.by_invariant(3):
        (ra, rb), (ba, bb) = (v.rows * 2)[:2], v.blocks
        a, c = table.segments[ra], table.segments[rb]
        lo_a, lo_c = a.base + ba * a.stride, c.base + bb * c.stride
        assert ba != bb and max(lo_a, lo_c) < min(lo_a + a.span, lo_c + c.span)
    assert not rep.ok  # each pair meets somewhere in 2**31 blocks


def test_5000_rows_bounded() -> None:
    """5,000 rows took 2.5 GB (every pair of rows materialised)."""
    rng = np.random.default_rng(0)
    rows = tuple(K.Segment(int(b) * 4, 4096 * 4, 4) for b in rng.permutation(4096)[: 5000 % 4096 + 904])
    table = K.SegmentTable(4096 * 4 * 100, 100, rows)
    assert bounded(lambda: K.verify(table)).ok


def test_too_many_cross_stride_pairs_are_refused_not_guessed() -> None:
    rows = tuple(K.Segment(4 * j, 4 * (j + 1), 4) for j in range(200))  # 200 strides, all meeting

    def refused() -> str:
        with pytest.raises(K.TableError, match="pairs of rows with different strides") as e:
            K.verify(K.SegmentTable(2**40, 1000, rows))
        return str(e.value)

    assert "at most" in bounded(refused)


# --------------------------------------------------------------------------- item 3: bounded inputs
@pytest.mark.parametrize(
    ("blocks", "names"),
    [
        ("0-100000000", ["block 100000000 outside [0, 100)"]),
        ("0-99999999999999999999999", ["must be N or A-B"]),
        ("5-3", ["descending"]),
        ("1_0", ["must be N or A-B"]),
        ("-1", ["must be N or A-B"]),
        ("0x10", ["must be N or A-B"]),
        ("1,,2,a", ["'a'"]),
    ],
)
def test_blocks_bounded_before_expansion(
    capsys: pytest.CaptureFixture[str], blocks: str, names: list[str]
) -> None:
    expect_exit_2(
        capsys, ["zero", "--preset", "dsv4-test", "--blocks", blocks, "--backend", "reference"], *names
    )


def test_too_many_ids_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["zero", "--preset", "dsv4-test", "--num-blocks", "2147483647", "--blocks", "0-2147483646"]
    expect_exit_2(capsys, argv, "--blocks names more than")


@pytest.mark.parametrize("cmd", [["zero", "--blocks", "0"], ["plot", "--out", "x.png", "--kind", "diff"]])
def test_pools_too_large_for_the_host_refused(capsys: pytest.CaptureFixture[str], cmd: list[str]) -> None:
    """A 3 GB pool crashed `zero` (5-8x the pool on the host); now a clear refusal naming the fix."""
    expect_exit_2(
        capsys, [*cmd, "--preset", "dsv4-test", "--num-blocks", "20000"], "total_bytes", "--num-blocks"
    )


def test_shard_pool_too_large_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "shard",
        "--preset",
        "dsv4-test",
        "--num-blocks",
        "20000",
        "--mesh",
        "dp=2",
        "--block-axes",
        "dp",
        "--blocks",
        "0",
    ]
    expect_exit_2(capsys, argv, "gathered bytes")


def test_dev_zero_is_not_read_forever(capsys: pytest.CaptureFixture[str]) -> None:
    expect_exit_2(capsys, ["plan", "/dev/zero"], "larger than")


def test_deeply_nested_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "deep.json", "[" * 200_000 + "]" * 200_000)
    expect_exit_2(capsys, ["plan", path], "nesting too deep")
    expect_exit_2(capsys, ["check", "--table", path], "nesting too deep")


def test_non_utf8_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "bin.json", b'{"num_blocks": \xff\xfe}')
    expect_exit_2(capsys, ["plan", path], "not UTF-8")


@pytest.mark.parametrize("vi", ['"abc"', "null", "1.5", "-1", "true", str(2**63)])
def test_virtual_index_must_be_an_int(tmp_path: Path, capsys: pytest.CaptureFixture[str], vi: str) -> None:
    text = one_row_table(1).replace('"virtual_index": 0', f'"virtual_index": {vi}')
    expect_exit_2(capsys, ["check", "--table", write(tmp_path, "t.json", text)], "virtual_index")


@pytest.mark.parametrize("field", ["group", "layer", "part"])
def test_provenance_must_be_printable_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    t = json.loads(one_row_table(1))
    t["segments"][0][field] = "x\n   0 999 999 999  forged/row"
    expect_exit_2(capsys, ["check", "--table", write(tmp_path, "t.json", json.dumps(t))], field, "control")
    t["segments"][0][field] = 7
    expect_exit_2(capsys, ["check", "--table", write(tmp_path, "t.json", json.dumps(t))], field)


@pytest.mark.parametrize("name", ["a\nb", "x\x1b[2J", "tab\there", ""])
def test_layer_names_cannot_forge_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    spec = K.preset("dsv4-test").to_dict()
    spec["groups"][0]["layers"][0]["name"] = name
    err = expect_exit_2(capsys, ["plan", write(tmp_path, "s.json", json.dumps(spec))], "name")
    assert "\x1b" not in err


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["plot", "--preset", "dsv4-test", "--out", "/no/such/folder/x.png"], ["folder", "does not exist"]),
        (["plot", "--preset", "dsv4-test", "--out", "x.bmpx"], [".png, .svg or .pdf"]),
        (["plot", "--preset", "dsv4-test", "--out", "x.png", "--blocks", "500"], ["outside [0, 100)"]),
        (["check", "--table", "t.json", "--num-blocks", "5"], ["--num-blocks applies to specs"]),
        (["plan", "--preset", "dsv4-test", "--compact"], ["--compact only applies with --json"]),
        (["plan", "--preset", "dsv4-test", "--num-blocks", "1_0"], ["num-blocks"]),
        (["plan", "--preset", "nope"], ["preset"]),
        (["frobnicate"], ["invalid choice"]),
    ],
)
def test_misuse_exit_2_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], names: list[str]
) -> None:
    write(tmp_path, "t.json", one_row_table(4))
    argv = [a if a != "t.json" else str(tmp_path / "t.json") for a in argv]
    expect_exit_2(capsys, argv, *names)


def test_plot_negative_block_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    expect_exit_2(capsys, ["plot", "--preset", "dsv4-test", "--out", "x.png", "--blocks=-5"], "-5")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, ["--version"])
    assert code == 0 and out.strip() == f"kvlayout {K.__version__}"


# --------------------------------------------------------------------------- item 7: API misuse, reference
def test_group_spec_accepts_a_list_and_rejects_non_layers() -> None:
    layer = K.FullAttentionSpec("a", 16, 8, 128, "bfloat16")
    assert K.GroupSpec("g", [layer]).layers == (layer,)  # type: ignore[arg-type]
    with pytest.raises(K.SpecError, match=r"layers\[0\]"):
        K.GroupSpec("g", ["not a layer"])  # type: ignore[list-item]
    with pytest.raises(K.SpecError, match="groups"):
        K.KVCacheSpec(4, "packed", ("g",))  # type: ignore[arg-type]


@pytest.mark.parametrize("ways", [0, -2, True, 1.5])
def test_split_heads_bad_ways(ways: Any) -> None:
    with pytest.raises(K.SpecError, match="ways"):
        K.split_heads(K.preset("llama-8b"), ways)


@pytest.mark.parametrize("ids", [[1, True], [1.0], ["1"], [2**64], [[0]], {0}, None])
def test_bad_ids_name_the_element(ids: Any) -> None:
    table = K.plan(K.preset("dsv4-test"))
    buf = K.poison_pattern(table.total_bytes)
    before = buf.copy()
    with pytest.raises(K.BlockIdError, match="block_ids"):
        K.ReferenceBackend(table, buf).zero(ids)
    assert np.array_equal(buf, before)


def test_reference_zeroes_a_negative_stride_table_that_verifies() -> None:
    """The reference refused (with a wrong message) a table that verify proves and kernels zero."""
    table = K.SegmentTable(4096, 8, (K.Segment(3584, -512, 256), K.Segment(256, 512, 128)))
    assert K.verify(table).ok
    data = K.poison_pattern(4096 + 1024)
    buf = data.copy()
    K.ReferenceBackend(table, buf, offset=512).zero([0, 3, 7])
    chk = K.reference.compare_to_contract(data, buf, table, [0, 3, 7], origin=512)
    assert chk.matches, chk.describe()
    # the contract, by hand: row 0 of block b at 3584 - 512*b, row 1 at 256 + 512*b
    want = sorted(
        [(3584 - 512 * b, 3584 - 512 * b + 256) for b in (0, 3, 7)]
        + [(256 + 512 * b, 384 + 512 * b) for b in (0, 3, 7)]
    )
    assert chk.zeroed.tolist() == [list(r) for r in K.merge_ranges(*np.array(want).T).tolist()]


def test_replay_command_quotes_names_with_quotes() -> None:
    import shlex

    from kvlayout.conformance import Failure

    spec = K.preset("dsv4-test").to_dict()
    spec["groups"][0]["name"] = "it's"
    f = Failure("reference", "case", json.dumps(spec), (0, 1), "detail")
    replay = f.format().splitlines()[-1].split("replay: ", 1)[1]
    argv = shlex.split(replay)
    assert argv[:2] == ["printf", "%s"] and json.loads(argv[2])["groups"][0]["name"] == "it's"


# --------------------------------------------------------------------------- fuzz: tables and specs
odd = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -4, 4, 2**31 - 1, 2**31, 2**62 - 4, 2**62, 2**63 - 1, 2**63, 2**64]),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@given(total=odd, n=odd, base=odd, stride=odd, span=odd, vi=odd)
def test_fuzz_table_json(total: Any, n: Any, base: Any, stride: Any, span: Any, vi: Any) -> None:
    """Any table JSON: a kvlayout error, or a table whose verdict is computed within the bounds."""
    row = {"base": base, "stride": stride, "span": span, "virtual_index": vi}
    text = json.dumps({"total_bytes": total, "num_blocks": n, "segments": [row, dict(row, base=0)]})

    def check() -> None:
        try:
            table = K.SegmentTable.from_json(text)
        except KVLayoutError as e:
            assert e.field and str(e).startswith(e.field.split("[")[0].split(".")[0])
            return
        if K.verify(table).ok:  # then every row's extent fits, by exact integer arithmetic
            for s in table.segments:
                last = s.base + (table.num_blocks - 1) * s.stride
                assert table.num_blocks == 0 or (
                    min(s.base, last) >= 0 and max(s.base, last) + s.span <= table.total_bytes
                )

    bounded(check)


layer_field = st.sampled_from(
    [
        "block_size",
        "num_kv_heads",
        "head_size",
        "alignment",
        "window",
        "compress_ratio",
        "token_bytes",
        "state_bytes",
        "kv_split",
        "dtype",
        "name",
        "kind",
    ]
)


@given(field=layer_field, value=odd, n=odd, layout=st.sampled_from(["packed", "layer_major", "LBHNC", 3]))
def test_fuzz_spec_json(field: str, value: Any, n: Any, layout: Any) -> None:
    """Any spec JSON: a kvlayout error naming a field, or a plan whose table verifies."""
    spec = K.preset("dsv4-test").to_dict()
    spec["num_blocks"], spec["layout"] = n, layout
    spec["groups"][0]["layers"][1][field] = value

    def check() -> None:
        try:
            table = K.plan(K.KVCacheSpec.from_json(json.dumps(spec)))
        except KVLayoutError as e:
            assert e.field
            return
        assert K.verify(table).ok

    bounded(check)
