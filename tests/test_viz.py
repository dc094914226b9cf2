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
