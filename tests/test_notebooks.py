"""Notebooks are authored as percent scripts (notebooks/NN_name.py); the committed .ipynb files are
exactly what scripts/make_notebooks.py builds from them (no outputs), and every notebook runs top
to bottom on the CPU, its own assertions included."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent


def _converter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "scripts" / "make_notebooks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


make_notebooks = _converter()
SOURCES = make_notebooks.sources()


def test_every_notebook_has_its_source() -> None:
    assert len(SOURCES) >= 3
    built = {p.with_suffix(".ipynb").name for p in SOURCES}
    committed = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert built == committed


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.name)
def test_committed_notebook_is_built_from_its_source(src: Path) -> None:
    committed = src.with_suffix(".ipynb").read_text()
    assert committed == make_notebooks.render(src), "run python scripts/make_notebooks.py"
    nb = nbformat.reads(committed, as_version=4)
    nbformat.validate(nb)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit without outputs"


def test_converter_splits_cells_and_uncomments(tmp_path: Path) -> None:
    src = tmp_path / "00_x.py"
    src.write_text(
        "# %% [markdown]\n# # Title\n#\n# text\n\n# %%\n# %matplotlib inline\nx = 1  # %% not a marker\n\n\n"
    )
    assert make_notebooks.split_cells(src) == [
        ("markdown", "# Title\n\ntext"),
        ("code", "%matplotlib inline\nx = 1  # %% not a marker"),
    ]
    nb = make_notebooks.build(src)
    assert [c.id for c in nb.cells] == ["cell-00", "cell-01"]
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize(
    "text",
    ["x = 1\n# %%\ny = 2\n", "# %% [raw]\nz\n", "# %% [markdown]\nnot commented\n"],
    ids=["text-before-marker", "unknown-marker", "uncommented-markdown"],
)
def test_converter_refuses_what_it_cannot_convert(tmp_path: Path, text: str) -> None:
    src = tmp_path / "00_bad.py"
    src.write_text(text)
    with pytest.raises(ValueError, match="00_bad.py:"):
        make_notebooks.split_cells(src)


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.name)
def test_notebook_executes(src: Path) -> None:
    nb = make_notebooks.build(src)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    resources = {"metadata": {"path": str(src.parent)}}
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources=resources)
    client.execute()
    images = sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert images >= 1, "each notebook shows at least one picture"
