"""The block byte map: the CLI writes a picture with every layer's colour and the end-of-buffer mark."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kvlayout as K
from kvlayout.cli import main

mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")


def _has_color(img: np.ndarray, rgb: tuple[float, ...], tol: float = 0.02) -> bool:
    return bool((np.abs(img[..., :3] - np.array(rgb[:3])) < tol).all(axis=-1).any())


@pytest.mark.parametrize("name", ["dsv4-test", "llama-8b"])
def test_plot_cli_draws_layers_and_end(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"{name}.png"
    assert main(["plot", "--preset", name, "--out", str(out)]) == 0
    img = mpl.image.imread(out)
    assert img.shape[0] > 100 and img.shape[1] > 500
    from kvlayout.viz import layer_colors

    colors = layer_colors(K.plan_layout(K.preset(name)))
    for c in list(colors.values())[:4]:
        assert _has_color(img, c), c
    if name == "dsv4-test":
        assert _has_color(img, (1.0, 0.0, 0.0))  # end of buffer on the last block's row


def test_padding_is_drawn(tmp_path: Path) -> None:
    from kvlayout.viz import byte_map

    spec = K.preset("dsv4-test").with_num_blocks(2)
    fig = byte_map(spec, blocks=[0, 1])
    hatched = [p for p in fig.axes[0].patches if p.get_hatch() == "///"]
    assert len(hatched) == 4 * 2  # one alignment gap per layer per block
    assert all(abs(p.get_width() - 64) < 1e-9 for p in hatched)


def _png(fig: object, path: Path) -> np.ndarray:
    fig.savefig(path, dpi=80)  # type: ignore[attr-defined]
    return mpl.image.imread(path)


def test_bad_table_drawn_red_and_table_view(tmp_path: Path) -> None:
    from kvlayout.viz import table_map, table_view
    from tests.test_verify import prefix_table

    bad, good = prefix_table(), K.plan(K.preset("dsv4-test"))
    assert _has_color(_png(table_map(bad), tmp_path / "bad.png"), (1.0, 0.0, 0.0))
    assert not _has_color(_png(table_map(good, blocks=[0, 1]), tmp_path / "good.png"), (1.0, 0.0, 0.0))
    v = table_view(bad)
    assert "BROKEN 2,3" in str(v) and "15088320 / 14976000" in str(v)
    assert "color:red" in v._repr_html_()
    assert "BROKEN" not in str(table_view(good))


def test_zero_diff_marks_bytes_outside_contract(tmp_path: Path) -> None:
    from kvlayout.conformance import GUARD_BYTES, run_case
    from kvlayout.planted import PLANTED
    from kvlayout.viz import zero_diff

    t = K.plan(K.preset("dsv4-test").with_num_blocks(4))
    ok = run_case(K.ReferenceBackend, t, [1]).after
    bad = run_case(PLANTED["overrun-4"], t, [1]).after
    before = K.poison_pattern(ok.size)
    img_ok = _png(zero_diff(before, {"reference": ok}, t, [1], origin=GUARD_BYTES), tmp_path / "a.png")
    img_bad = _png(zero_diff(before, {"planted": bad}, t, [1], origin=GUARD_BYTES), tmp_path / "b.png")
    assert _has_color(img_ok, (0.2, 0.7, 0.3), tol=0.03) and not _has_color(img_ok, (1.0, 0.0, 0.0))
    assert _has_color(img_bad, (1.0, 0.0, 0.0))


@pytest.mark.parametrize("kind", ["table", "diff"])
def test_plot_kinds(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"{kind}.png"
    assert main(["plot", "--preset", "dsv4-test", "--kind", kind, "--blocks", "0,99", "--out", str(out)]) == 0
    img = mpl.image.imread(out)
    assert img.shape[1] > 500 and not _has_color(img, (1.0, 0.0, 0.0))  # a safe table: nothing red


def test_readme_picture_is_the_cli_output() -> None:
    path = Path(__file__).resolve().parent.parent / "docs" / "byte_map_dsv4_test.png"
    img = mpl.image.imread(path)
    from kvlayout.viz import layer_colors

    for c in layer_colors(K.plan_layout(K.preset("dsv4-test"))).values():
        assert _has_color(img, c)
