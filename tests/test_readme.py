"""README.md and the guides in docs/ are runnable: every ``kvlayout`` command and every Python
snippet in them runs here.

The commands run in order (README first, then the guides by name; a line that appears twice
runs once), in-process, in one scratch folder (``tests/`` linked in for the model fixtures;
``> FILE`` writes the output there), each expected to exit 0. The Python snippets run in
order, each in a fresh namespace, in a process of their own (8 host devices for the mesh
snippet, vLLM on the CPU), as a reader would paste them. Numbers the documents quote are
checked against the command that prints them or the result file they cite; links between
the documents point at files and headings that exist. docs/GEOMETRY.md is the contract,
pinned by tests/test_geometry_doc.py, not here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvlayout.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
#: the guides, by name (GEOMETRY.md, the contract, has its own test file)
GUIDES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "GEOMETRY.md")
DOCS = [ROOT / "README.md", *GUIDES]
TEXTS = {p: p.read_text() for p in DOCS}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.M | re.S)
#: (document, language, source) of every fenced block, in order
ALL_BLOCKS = [(p, m[1], m[2]) for p in DOCS for m in FENCE.finditer(TEXTS[p])]
BLOCKS = [(lang, src) for p, lang, src in ALL_BLOCKS if p.name == "README.md"]
FLAT = " ".join(README.split())


def _guide(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text().split())


def _commands() -> list[str]:
    """Lines of ``bash`` blocks that run ``kvlayout`` (the set-up block runs scripts, not these)."""
    out = []
    for _, lang, src in ALL_BLOCKS:
        if lang == "bash":
            out += [line.split("  #")[0].strip() for line in src.splitlines() if line.startswith("kvlayout ")]
    return list(dict.fromkeys(out))


COMMANDS = _commands()
SNIPPETS = [(f"{p.relative_to(ROOT)}", src) for p, lang, src in ALL_BLOCKS if lang == "python"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch folder where the README's relative paths resolve (``tests/fixtures/...``)."""
    d = tmp_path_factory.mktemp("readme")
    (d / "tests").symlink_to(ROOT / "tests")
    return d


def run_command(line: str) -> tuple[int, str]:
    """Run one README command line in-process: ``(exit status, stdout)``; ``> FILE`` writes stdout there."""
    argv = shlex.split(line)
    assert argv[0] == "kvlayout"
    out_file = None
    if ">" in argv:
        i = argv.index(">")
        argv, out_file = argv[:i], argv[i + 1]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            code = main(argv[1:])
        except SystemExit as e:  # --version
            code = int(e.code or 0)
    if out_file is not None:
        Path(out_file).write_text(buf.getvalue())
    return code, buf.getvalue()


def test_exactly_two_commands_at_the_top() -> None:
    lang, src = BLOCKS[0]
    assert lang == "bash"
    cmds = [line.split("#")[0].strip() for line in src.splitlines() if line.strip()]
    assert cmds == ["./scripts/main.sh", "./scripts/test.sh"]
    assert README.index("## Set-up: two commands") < README.index("```")
    main_sh = (ROOT / "scripts" / "main.sh").read_text()
    for step in ("plan --preset dsv4", "check --preset dsv4", "zero --preset dsv4 --blocks 0,1,42,99"):
        assert step in main_sh  # what the README says the main job does
    assert "blocks 0, 1, 42 and 99" in FLAT


def test_commands_were_found() -> None:
    assert len(COMMANDS) >= 12
    for sub in ("plan", "check", "zero", "shard", "plot", "conformance"):
        assert any(c.split()[1] == sub for c in COMMANDS), sub
    assert any("--group" in c for c in COMMANDS) and any("--config" in c for c in COMMANDS)
    assert any("--compare" in c for c in COMMANDS)


@pytest.mark.parametrize("line", COMMANDS)
def test_command_runs(line: str, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    if "--table table.json" in line and not (workdir / "table.json").exists():
        run_command("kvlayout plan --preset dsv4-test --json > table.json")  # the README's previous line
    code, out = run_command(line)
    assert code == 0, (line, out)
    assert out.strip(), line
    if line.startswith("kvlayout check --table"):
        assert "invariant 4 (padding untouched): not checked" in out


def test_python_snippets_run(workdir: Path) -> None:
    """Every snippet on its own (a fresh namespace each, as a reader would paste it), in order; the
    snippets that import vLLM run in a second process beside the others (its import is slow)."""
    assert len(SNIPPETS) >= 8
    assert {doc for doc, _ in SNIPPETS} >= {"README.md", "docs/python.md", "docs/tpu.md", "docs/vllm.md"}
    driver = workdir / "run_snippets.py"
    driver.write_text(
        "import json, sys, time\n"
        "for i, (doc, src) in json.load(open(sys.argv[1])):\n"
        "    t = time.perf_counter()\n"
        "    exec(compile(src, f'{doc} python snippet {i}', 'exec'), {'__name__': '__main__'})\n"
        "    print(f'snippet {i} of {doc} ({time.perf_counter() - t:.1f} s) ok', flush=True)\n"
    )
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "TPU_SKIP_MDS_QUERY": "1",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=9",
        "VLLM_TARGET_DEVICE": "cpu",
        "MPLBACKEND": "Agg",
    }
    numbered = list(enumerate(SNIPPETS))
    parts = [[s for s in numbered if "vllm" not in s[1][1]], [s for s in numbered if "vllm" in s[1][1]]]
    assert all(parts)
    procs = []
    for k, part in enumerate(parts):
        (workdir / f"snippets{k}.json").write_text(json.dumps(part))
        procs.append(subprocess.Popen(
            [sys.executable, str(driver), f"snippets{k}.json"], cwd=workdir, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ))
    for proc, part in zip(procs, parts):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:] + err[-6000:]
        assert out.count(" ok\n") == len(part), out


def test_per_group_numbers_are_what_the_command_prints(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workdir)
    text = _guide("python.md")
    m = re.search(r"--backend reference` zeroes ([\d,]+) B where zeroing every group zeroes ([\d,]+) B", text)
    assert m
    one, every = (int(n.replace(",", "")) for n in m.groups())
    _, out = run_command("kvlayout zero --preset dsv4 --blocks 0,5 --group c4.3 --backend reference --json")
    assert json.loads(out)["zeroed_bytes"] == one
    _, out = run_command("kvlayout zero --preset dsv4 --blocks 0,5 --backend reference --json")
    assert json.loads(out)["zeroed_bytes"] == every


def test_verifier_numbers_come_from_the_cited_results() -> None:
    results = json.loads((ROOT / "bench" / "results" / "verify.json").read_text())["results"]
    big = [r for r in results if r["rows"] == 100_000]
    m = re.search(r"100,000 rows in at most ([\d.]+) s and ([\d.]+) MiB", _guide("performance.md"))
    assert m
    assert m[1] == f"{max(r['seconds'] for r in big):.2f}"
    assert m[2] == f"{max(r['peak_mib'] for r in big):.1f}"
    assert max(r["num_blocks"] for r in big) == 2**31 - 1


def test_sharded_numbers_come_from_the_cited_results() -> None:
    results = (ROOT / "bench" / "results" / "RESULTS.md").read_text()
    for n in ("164.5", "156.7", "275.0", "225.6", "4.0-4.2 TB/s", "0.87-0.90x", "0.63-0.67x", "0.75-0.77x"):
        assert n in results, n
    perf = _guide("performance.md")
    for quoted in ("(torch: 164.5 against 156.7 us)", "(JAX: 275.0 against 225.6 us)"):
        assert quoted in perf, quoted
    roof = (ROOT / "bench" / "results" / "tpu_roofline_native.json").read_text()
    assert "131072" in roof.replace(",", "").replace("_", "")


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def test_step_numbers_come_from_the_cited_results() -> None:
    """The per-step, kernel, memset, index_fill and Pallas ranges quoted are those of the JSON."""
    step = json.loads((ROOT / "bench" / "results" / "h200-s5" / "run3" / "step.json").read_text())
    rows = [r for preset in step["results"].values() for r in preset["rows"]]
    small, large = [r for r in rows if r["batch"] <= 512], [r for r in rows if r["batch"] >= 4096]
    perf = _guide("performance.md")
    section = perf[perf.index("Measured (H200)"):]
    quoted = [
        f"{_span([r['step_speedup'] for r in small])}x faster than vLLM's at 1-512 ids",
        f"{_span([r['step_speedup'] for r in large])}x at 4,096-16,384 ids",
        f"is {_span([r['kernel_speedup'] for r in rows])}x vLLM's",
        f"runs {_span([r['kernel_vs_memset'] for r in large])}x an int32 memset",
        f"{_span([r['kernel_vs_rows'] for r in large])}x torch's `index_fill_`",
        f"takes {_span([r['pallas_vs_cuda_kernel'] for r in rows if 'pallas_in_jit_us' in r])}x the cuda",
    ]
    sweep = json.loads((ROOT / "bench" / "results" / "h200-pallas-sweep" / "pallas_sweep.json").read_text())
    chosen = [r["variants"]["direct-vec-umaj"]["vs_cuda"] for r in sweep["rows"]]
    quoted.append(f"measured {_span(chosen)}x at 64-16,384 ids")
    for q in quoted:
        assert q in section, q
    assert all(r["byte_equal"] for r in rows)


def test_no_path_outside_the_repository() -> None:
    word = "shared" + "/"
    folders = ("kvlayout", "tests", "bench", "notebooks", "scripts", "backends")
    files = [*DOCS, *(p for f in folders for p in (ROOT / f).rglob("*") if p.suffix in (".py", ".sh", ".md"))]
    for path in files:
        assert word not in path.read_text(), path


def test_readme_is_a_page_with_every_guide() -> None:
    """About 150 lines (five minutes to read), linking every guide and the contract."""
    assert len(README.splitlines()) <= 160
    linked = set(re.findall(r"\]\(docs/([\w.]+\.md)\)", README))
    assert linked == {p.name for p in GUIDES} | {"GEOMETRY.md"}
    for p in GUIDES:
        assert "](../README.md)" in TEXTS[p], p.name  # every guide leads back


def test_layout_section_matches_the_tree() -> None:
    tree = next(src for lang, src in BLOCKS if lang == "text")
    listed = [line.split()[0] for line in tree.splitlines() if line.strip()]
    for entry in listed:
        assert (ROOT / entry).exists(), entry
    top = {p.name + ("/" if p.is_dir() else "") for p in ROOT.iterdir()}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    tracked_dirs = {f.split("/")[0] + "/" for f in tracked if "/" in f and not f.startswith(".")}
    assert tracked_dirs <= {e.split("/")[0] + "/" for e in listed} and tracked_dirs <= top
    assert "pyproject.toml" in listed
    pyproject = (ROOT / "pyproject.toml").read_text()
    mapped = (("backends/cuda/", "kvlayout.backends.cuda"), ("backends/pallas/", "kvlayout.backends.pallas"))
    for folder, name in mapped:
        line = next(ln for ln in tree.splitlines() if ln.startswith(folder))
        assert f"imported as {name}" in line
        assert f'"{name}" = "{folder.rstrip("/")}"' in pyproject
    # the modules the README names as examples of each layer exist (the full map: kvlayout/__init__.py)
    paragraph = README[README.index("The docstring of `kvlayout/__init__.py`"):]
    named = re.findall(r"`(\w+(?:\.py|/))`", paragraph)
    assert len(named) >= 10
    for name in named:
        assert (ROOT / "kvlayout" / name).exists(), name


def test_every_notebook_is_listed() -> None:
    guide = (ROOT / "docs" / "python.md").read_text()
    section = guide[guide.index("## Notebooks"):]
    listed = re.findall(r"^- `(\d\d_\w+)`", section, flags=re.M)
    assert listed == sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9]*.py"))


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_files_and_links_the_documents_name_exist() -> None:
    folders = "kvlayout|backends|tests|bench|scripts|docs|notebooks"
    for doc in DOCS:
        text = TEXTS[doc]
        for path in set(re.findall(rf"`((?:{folders})/[\w./-]+)`", text)):
            found = ROOT / path.rstrip("/")
            if "NN_name" not in path:  # the notebooks' naming pattern
                assert found.exists() or found.with_suffix(".py").exists(), (doc.name, path)
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text):
            if target.startswith(("http://", "https://")):
                continue
            linked = (doc.parent / target).resolve() if target else doc
            assert linked.is_file(), (doc.name, target)
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
                assert anchor in {_anchor(h) for h in headings}, (doc.name, target, anchor)
    assert _anchor("Layouts: kvlayout's two and vLLM 0.33's six") == "layouts-kvlayouts-two-and-vllm-033s-six"


def test_jax_call_numbers_come_from_the_cited_results() -> None:
    """The standalone JAX call's times quoted in performance.md are those of the JSON."""
    rows = {r["ids"]: r for r in json.loads(
        (ROOT / "bench" / "results" / "h200-s5" / "run3" / "bench_jax_step.json").read_text())["rows"]}
    perf = _guide("performance.md")
    section = perf[perf.index("## The JAX call on its own"):perf.index("## Sharded caches")]
    section = " ".join(section.split())

    def us(keys: list[tuple[int, str]]) -> str:
        return " / ".join(f"{rows[n][k]:,.0f}" for n, k in keys)

    def prof(n: int) -> float:
        return float(rows[n]["device_profile"]["in_jit"]["per_call_us"])

    small, graph = (1, 8, 64), "cuda_graph_us"
    quoted = [
        f"{us([(n, 'call_dev_us') for n in small])} us at 1 / 8 / 64 ids against "
        f"{us([(n, 'xla_set_us') for n in small])} us",
        f"{us([(n, 'call_dev_us') for n in (512, 4096)])} us against "
        f"{us([(n, 'xla_set_us') for n in (512, 4096)])} us",
        f"takes {us([(n, 'call_list_us') for n in small])} us",
        f"is {' / '.join(f'{prof(n):.1f}' for n in small)} us at 1 / 8 / 64 ids, against "
        f"{' / '.join(f'{rows[n][graph]:.1f}' for n in small)} us",
    ]
    for q in quoted:
        assert q in section, q
