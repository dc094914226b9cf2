"""Every launch path of the cuda zeroer's kernel against the NumPy contract, on poisoned buffers.

The kernel has a one-shot path (one program per work item; one masked vector store when every
unit fits one vector, else a loop and a masked tail), a persistent path (a capped grid striding
over the items) and a counted variant of each (device-side live-id count). Each is run here with
out-of-range ids mixed in, at a non-zero offset with guard bands on both sides: exactly the
contract's bytes are zeroed and every bad id is counted.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")

ORIGIN = 512  # bytes of guard band before the layout (and as many after it)


def test_every_launch_path_matches_the_contract() -> None:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(6))
    n = t.num_blocks
    good = [3, 0, 5, 3]
    dev_ids = torch.tensor([3, -1, 0, 5, n, 3, 2**40], dtype=torch.int64, device=kc.DEVICE_TYPE)
    seen = set()
    # (chunk words, vector words, one-shot allowed, max programs): one-shot with one store per unit
    # or a loop and a tail; persistent (small_batch off, or a routed batch over max_programs)
    for chunk, sub, small, programs in (
        (2048, 4096, True, 1 << 20),
        (8192, 1024, True, 1 << 20),
        (2048, 4096, True, 3),
        (8192, 1024, False, 3),
        (2048, 2048, False, 2),
    ):
        for counted in (False, True):
            data = K.poison_pattern(t.total_bytes + 2 * ORIGIN)
            buf = torch.from_numpy(data.copy()).to(kc.DEVICE_TYPE)
            z = kc.CudaZeroer(
                t,
                buf,
                offset=ORIGIN,
                chunk_words=chunk,
                sub_words=sub,
                max_programs=programs,
                graphs=False,
                small_batch=small,
            )
            dplan = z._plan_for(None)
            fits = programs >= dev_ids.numel() * dplan.plan.units_per_block
            one_shot = small and (fits or not counted)
            seen.add((one_shot, dplan.single, counted))
            if counted:  # the sharded path: ids packed and counted on the device first
                z.launch_routed(dev_ids, 0, n)
            else:
                z._launch(dev_ids, dplan=dplan)
            chk = K.reference.compare_to_contract(data, buf.cpu().numpy(), t, good, origin=ORIGIN)
            assert chk.matches, (chunk, sub, small, programs, counted, chk.describe())
            with pytest.raises(K.BlockIdError, match=r"outside \[0, 6\)"):
                z.check()
    # every path was taken: one-shot and persistent, each with a single store and with a loop
    assert {(o, s) for o, s, _ in seen} == {(True, True), (True, False), (False, True), (False, False)}


def test_single_store_plan_flag() -> None:
    """``single`` is set exactly when every unit fits one vector store."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(4))
    buf = torch.zeros(t.total_bytes // 4, dtype=torch.int32, device=kc.DEVICE_TYPE)
    for chunk, sub, single in (
        (2048, 4096, True),
        (2048, 1024, False),
        (8192, 4096, False),
        (1000, 1024, True),
    ):
        z = kc.CudaZeroer(t, buf, chunk_words=chunk, sub_words=sub, graphs=False)
        dp = z._plan_for(None)
        assert dp.single is single, (chunk, sub)
        assert dp.single == bool(np.max(dp.plan.words) <= dp.sub)
