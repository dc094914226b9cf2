"""Issue 25, hostile review: inputs a fresh pass found that the fixes did not bound.

Each test fails on the code before its fix (checked once by reverting it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError


def test_pallas_apply_refuses_string_ids_as_block_id_error() -> None:
    """``apply`` with string ids raised JAX's raw ``TypeError``; a scalar int was said not to fit int64."""
    jax = pytest.importorskip("jax")
    kp = pytest.importorskip("kvlayout.backends.pallas")
    import jax.numpy as jnp

    table = K.plan(K.preset("dsv4-test").with_num_blocks(6))
    z = kp.PallasZeroer(table, kernel="triton", interpret=True)
    host = K.poison_pattern(z.rows * 512).view(np.int32).reshape(z.buffer_shape)
    cz = kp.CacheZeroer([jnp.zeros((6, 2, 4, 16), jnp.int32)])
    for bad in ("1", ["1"], ("a", "b"), [None], {"x": 1}):
        with pytest.raises(BlockIdError, match="block_ids"):
            z.apply(jnp.asarray(host), bad)
        with pytest.raises(BlockIdError, match="block_ids"):
            cz.apply([jnp.zeros((6, 2, 4, 16), jnp.int32)], bad)
    with pytest.raises(BlockIdError, match="block_ids = 4294967299: must be a list, tuple or") as info:
        z.apply(jnp.asarray(host), 2**32 + 3)  # a scalar: refused as __call__ does (hostile pass 16, L1)
    assert "int64" not in str(info.value)
    del jax


def test_native_check_verifies_each_page_size_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``check`` of a native spec ran the verifier once per leaf: 200,000 leaves (12 MB of JSON,
    under the 64 MiB cap) ran past 20 s. Leaves of one page size now share one safe report."""
    import kvlayout.native as kn

    shapes = [(4, 2, 8 * (1 + i % 3)) for i in range(3000)]
    leaves = [kn.NativeLeaf(name=f"l{i}", shape=s, dtype="bfloat16") for i, s in enumerate(shapes)]
    spec = kn.NativeCacheSpec(tuple(leaves))
    calls: list[int] = []
    real = kn.verify

    def counting(t: K.SegmentTable) -> object:
        calls.append(1)
        return real(t)

    monkeypatch.setattr(kn, "verify", counting)
    reports = kn.verify_native(spec)
    assert len(reports) == 3000 and all(r.ok for r in reports.values())
    assert len(calls) == 3  # one per page size
    assert reports["l4"].num_rows == 1 and reports["l4"].total_bytes == 4 * 2 * 16 * 2


def test_native_zero_runs_each_table_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``zero`` of a native spec resolved the backend (an entry-point scan) and ran a poisoned case
    per array: 2,000 small arrays ran past 30 s (past an hour at 200,000). Arrays with equal tables
    now share one run; more than 256 different tables is refused in one line."""
    import json

    import kvlayout.cli as cli
    from kvlayout import registry

    leaves = [{"name": f"l{i}", "shape": [4, 2, 8], "dtype": "bfloat16"} for i in range(600)]
    leaves += [{"name": "s", "shape": [4, 4, 8], "dtype": "bfloat16", "zeroed": False}]
    path = tmp_path / "n.json"
    path.write_text(json.dumps({"layout": "native", "leaves": leaves}))
    cases: list[int] = []
    scans: list[int] = []
    real_case, real_registered = cli.run_case, registry.registered

    def counting_case(*a: Any, **k: Any) -> Any:
        cases.append(1)
        return real_case(*a, **k)

    def counting_registered() -> Any:
        scans.append(1)
        return real_registered()

    monkeypatch.setattr(cli, "run_case", counting_case)
    monkeypatch.setattr(registry, "registered", counting_registered)
    assert cli.main(["zero", str(path), "--blocks", "0,3", "--backend", "reference", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert len(cases) == 2 and len(scans) <= 3  # was 601 cases and 1,803 scans
    assert len(rep["arrays"]) == 601 and rep["matches_contract"]
    by = {a["name"]: a for a in rep["arrays"]}
    assert by["l7"]["zeroed"] == [[0, 32], [96, 128]] and by["s"]["zeroed"] == []

    many = [{"name": f"l{i}", "shape": [2, 2 * (i + 1)], "dtype": "bfloat16"} for i in range(257)]
    path.write_text(json.dumps({"layout": "native", "leaves": many}))
    assert cli.main(["zero", str(path), "--blocks", "0", "--backend", "reference"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "257" in err and len(cases) == 2


def test_plot_out_refuses_a_link_to_a_file_that_is_no_plot(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``plot --out x.png`` where x.png links to another file (``/etc/passwd`` as root) overwrote
    that file with the PNG: the suffix was checked on the name given, not on the file written."""
    from kvlayout.cli import main

    target = tmp_path / "passwd"
    target.write_bytes(b"root:x:0:0\\n")
    link = tmp_path / "x.png"
    link.symlink_to(target)
    assert main(["plot", "--preset", "dsv4-test", "--out", str(link)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err and "links to" in err
    assert target.read_bytes() == b"root:x:0:0\\n" and link.is_symlink()


def test_tpu_inference_zero_scheduled_takes_array_ids() -> None:
    """``zero_scheduled`` tested ids for truth: ``new_block_ids_to_zero = np.array([0])`` is falsy,
    so block 0 kept its stale bytes, and a longer array raised NumPy's raw ValueError."""
    pytest.importorskip("jax")
    from types import SimpleNamespace as NS

    import jax.numpy as jnp

    from kvlayout.integrations.tpu_inference import TpuInferenceZeroer

    start = np.arange(1, 4 * 8 * 128 + 1, dtype=np.int32).reshape(4, 8, 128) % 251 + 1
    caches = [jnp.asarray(start)]
    r = NS(kv_caches=caches, kv_cache_config=NS(kv_cache_groups=[NS(layer_names=["a"])]),
           layer_name_to_kvcache_index={"a": 0})
    z = TpuInferenceZeroer.from_runner(r)
    for ids, zeroed in ((np.array([0]), [0]), (np.array([0, 2]), [0, 2]), ((1,), [1]), ([], [])):
        out = z.zero_scheduled([jnp.asarray(start)], NS(new_block_ids_to_zero=ids))
        want = start.copy()
        want[zeroed] = 0
        assert np.array_equal(np.asarray(out[0]), want), ids
    with pytest.raises(BlockIdError):
        z.zero_scheduled([jnp.asarray(start)], NS(new_block_ids_to_zero=np.array([4])))
    z.check()


def test_vllm_plugin_step_ids_refuse_non_lists_and_non_integers() -> None:
    """The verify step's id check raised raw ValueError/TypeError/IndexError (``[2**63]``, ``['1']``,
    ``[None]``, a bare int) and let a nested list through; now BlockIdError naming block_ids."""
    pytest.importorskip("torch")
    from kvlayout.integrations.vllm_plugin import checked_step_ids

    for bad in ([2**63], [2**64], ["1"], [None], [[1]], [[1, 2], [3, 4]], 5, np.array([1]), "12"):
        with pytest.raises(BlockIdError, match=r"^block_ids(\[0\])? = "):  # an element is named (pass 23)
            checked_step_ids(bad, 4)  # type: ignore[arg-type]
    assert checked_step_ids((1, 3), 4).tolist() == [1, 3] and checked_step_ids([], 4).numel() == 0


def test_empty_model_flags_are_refused_not_defaulted(capsys: pytest.CaptureFixture[str]) -> None:
    """``--engine ''``, ``--device ''`` and ``--reader ''`` silently meant vllm, hopper and json."""
    from pathlib import Path

    from kvlayout.cli import main

    config = str(Path(__file__).parent / "fixtures" / "models" / "llama" / "config.json")
    for flag, field in (("--engine", "engine"), ("--device", "device"), ("--reader", "reader")):
        assert main(["plan", "--config", config, flag, ""]) == 2, flag
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{field} = ''" in err, err


def test_count_flags_echo_a_short_value(capsys: pytest.CaptureFixture[str]) -> None:
    """``--dp <5,000 digits>`` echoed all 5,000 digits in its one-line error (5,078 characters)."""
    from kvlayout.cli import main

    with pytest.raises(SystemExit) as info:
        main(["plan", "--preset", "dsv4-test", "--dp", "9" * 5000])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert info.value.code == 2 and len(err) < 200 and "--dp" in err and "19 digits" in err, err
