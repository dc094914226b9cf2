"""JAX path of sharded zeroing: the 8-device mesh cases, a 1-device mesh, and Mosaic compilation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import kvlayout as K
from kvlayout.sharding import shard_spec
from tests.mosaic_compile import run_check

jax = pytest.importorskip("jax")
kp = pytest.importorskip("kvlayout.backends.pallas")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


@pytest.mark.parametrize("mode", ["replicated", "block_sharded"])
def test_one_device_mesh_both_modes(mode: str) -> None:
    """The shape the one-GPU run uses: a 1-device mesh (cpu:0 is fine when it is the only device)."""
    axes = {"x": 1}
    lay = shard_spec(
        K.preset("dsv4-test").with_num_blocks(6),
        axes,
        **({"block_axes": ("x",)} if mode == "block_sharded" else {"head_axes": ("x",)}),
    )
    assert lay.mode == mode
    m = Mesh(np.array(jax.devices()[:1]), ("x",))
    z = kp.ShardedPallasZeroer(lay, m)
    data = K.poison_pattern(lay.gathered_bytes)
    buf = z(z.make_buffer(data), [1, 4, 4])
    buf = z(buf, jnp.array([5], jnp.int32))
    z.check()
    chk = lay.compare(data, z.to_host(buf), [1, 4, 5])
    assert chk.matches, chk.describe()


def test_sharded_mosaic_compiles_for_a_v5e_2x2_mesh() -> None:
    """The whole SPMD program (shard_map + TPU kernel) through the real TPU compiler, no collectives."""
    out = run_check("sharded")
    lines = [x for x in out.splitlines() if x.startswith("compiled")]
    assert len(lines) == 2, out
