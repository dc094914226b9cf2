"""Issue 25: block ids that do not fit int32 are bad ids, never another block.

With x64 off (JAX's default) ``jnp.asarray`` narrows a NumPy int64 id ``2**32 + 3`` to 3, at
trace time too; a Python list ``[2**32 + 5]`` overflowed. Every Pallas zeroer (flat, native,
sharded) must count such ids in ``apply`` and write nothing for them, refuse them with
``BlockIdError`` on the host-call path, and, with x64 on, range-check int64 device ids in the
traced code. Every check is on a poisoned buffer, byte for byte against the NumPy reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.cli import main

jax = pytest.importorskip("jax")
kp = pytest.importorskip("kvlayout.backends.pallas")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

N = 6  # blocks: every wide id below narrows (mod 2**32) into [0, N)
WIDE = 2**32 + 3  # narrows to block 3
NEG_WIDE = -(2**32) + 2  # narrows to block 2


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


class Case:
    """One zeroer over a poisoned buffer: ``apply``/``__call__`` plus the NumPy contract."""

    def __init__(self, name: str) -> None:
        self.name = name
        spec = K.preset("dsv4-test").with_num_blocks(N)
        table = K.plan(spec)
        if name in ("flat-tpu", "flat-triton"):
            kernel = name.split("-")[1]
            self.z: Any = kp.PallasZeroer(table, kernel=kernel, interpret=True)
            self.host = K.poison_pattern(self.z.rows * 512).view(np.int32).reshape(self.z.buffer_shape)
            self.table = table
            self.make = lambda: jnp.asarray(self.host)
            self.to_host = lambda buf: np.asarray(buf).reshape(-1).view(np.uint8)
            self.ref = self._flat_ref
        elif name in ("native", "native-mesh"):
            self.host = K.poison_pattern(N * 2 * 4 * 64).view(np.int32).reshape(N, 2, 4, 16)
            mesh = Mesh(np.array(jax.devices()[:1]), ("dp",)) if name == "native-mesh" else None
            sh = None if mesh is None else NamedSharding(mesh, P("dp"))
            self.make = lambda: [jax.device_put(jnp.asarray(self.host), sh)]
            kernel = {} if mesh is None else {"kernel": "triton", "interpret": True}  # faster under shard_map
            self.z = kp.CacheZeroer(self.make(), mesh=mesh, **kernel)
            self.to_host = lambda caches: np.asarray(caches[0]).reshape(-1).view(np.uint8)
            self.ref = self._native_ref
        else:
            lay = K.sharding.shard_spec(spec, {"x": 1}, block_axes=("x",))
            mesh1 = Mesh(np.array(jax.devices()[:1]), ("x",))
            self.z = kp.ShardedPallasZeroer(lay, mesh1, kernel="triton", interpret=True)
            self.host = K.poison_pattern(lay.gathered_bytes)
            self.make = lambda: self.z.make_buffer(self.host)
            self.to_host = self.z.to_host
            self.ref = lambda ids: self._sharded_ref(lay, ids)

    def _flat_ref(self, ids: list[int]) -> np.ndarray:
        out = self.host.reshape(-1).view(np.uint8).copy()
        K.reference.zero_blocks_numpy(out, self.table, ids)
        return out

    def _native_ref(self, ids: list[int]) -> np.ndarray:
        out = self.host.copy()
        out[ids] = 0
        return out.reshape(-1).view(np.uint8)

    def _sharded_ref(self, lay: Any, ids: list[int]) -> np.ndarray:
        out = self.host.copy()
        lay.zero_reference(out, ids)
        return out


CASES = ("flat-tpu", "flat-triton", "native", "native-mesh", "sharded")


def expect(case: Case, run: Callable[[Any], tuple[Any, Any]], ids: Any, good: list[int], nbad: int) -> None:
    out, bad = run(case.make())
    got = case.to_host(out)
    want = case.ref(good)
    assert int(bad) == nbad, (case.name, ids)
    assert np.array_equal(got, want), (case.name, ids, np.flatnonzero(got != want)[:8])


@pytest.fixture
def x64() -> Iterator[None]:
    """x64 on process-wide: the TPU interpreter's callbacks run in other threads, which do not
    see ``jax.enable_x64``'s thread-local switch (their int32 results then fail the int64 check)."""
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("name", CASES)
def test_wide_host_ids_x64_off_are_bad_ids(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """x64 off: ``apply`` (eager, and inside the user's jit where NumPy and list ids are
    constants) counts them and writes nothing for them; the host call refuses them with
    ``BlockIdError`` before anything runs (buffer neither donated nor written)."""
    assert not jax.config.jax_enable_x64
    case = Case(name)
    z = case.z
    for ids in (np.array([WIDE, 1, NEG_WIDE], np.int64), np.array([WIDE, 1, 2**40], np.uint64)):
        expect(case, lambda b, ids=ids: z.apply(b, ids), ids, [1], 2)
    wide_list = [WIDE + 2, 4, 2**63 + 1]  # an OverflowError before
    expect(case, jax.jit(lambda b: z.apply(b, wide_list)), wide_list, [4], 2)
    for ids in (np.array([WIDE], np.uint64), [WIDE + 2], [2**64 + 1, 0]):
        buf = case.make()
        with pytest.raises(K.BlockIdError, match=r"block_ids\[\d\] = \d+: outside"):
            z(buf, ids)
        assert np.array_equal(case.to_host(buf), case.ref([]))
    if name == "flat-tpu":  # the CLI sees host ids only: one line, exit 2
        for blocks in (str(WIDE), f"0,{2**64 + 1}"):
            rc = main(["zero", "--preset", "dsv4-test", "--blocks", blocks, "--backend", "pallas"])
            err = capsys.readouterr().err
            assert rc == 2 and len(err.strip().splitlines()) == 1 and "blocks" in err, err


@pytest.mark.parametrize("name", CASES)
def test_wide_ids_x64_on_are_bad_ids(name: str, x64: None) -> None:
    """x64 on: int64 device ids are range-checked in the traced code (the call writes only
    the valid id; check() raises); a host list over int64 in ``apply`` is a bad id, not an
    OverflowError."""
    case = Case(name)
    z = case.z
    dev = jnp.array([WIDE, 2, NEG_WIDE], jnp.int64)
    assert dev.dtype == jnp.int64
    out = z(case.make(), dev)
    assert np.array_equal(case.to_host(out), case.ref([2]))
    with pytest.raises(K.BlockIdError, match="2 ids outside"):
        z.check()
    expect(case, lambda b: z.apply(b, [2**63 + 1, 2, WIDE]), "list", [2], 2)
