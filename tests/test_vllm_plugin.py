"""kvlayout's vLLM general plugin (issue 27) against vLLM 0.33.0's own code on the CPU.

vLLM's objects come from the ground-truth builder (vLLM's planner, ``allocate_kv_cache``, real
``AttentionGroup``s, views bound as vLLM binds them); the zeroer is built by calling the model
runners' own ``_init_kv_zero_meta`` (``gpu_model_runner`` and the v2 ``gpu/model_runner``) on an
object holding the attributes it reads. In this process: ``verify`` passes vLLM 0.33's tables
for every layout, MLA, a Mamba hybrid and DeepSeek-V4's packed groups, and stops each planted
vLLM bug naming the layer, block and bytes; ``replace`` clears exactly the bytes of vLLM's own
table (kvlayout's kernel under its interpreter). A driver process (started at import so it
overlaps) loads the plugin through vLLM's own loader before vLLM's worker code is imported
(the import-hook path), then runs ``verify`` steps with vLLM's Triton kernel under Triton's
interpreter (``TRITON_INTERPRET=1`` must precede Triton's import, hence the process).
"""

from __future__ import annotations

import builtins
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import MethodType, SimpleNamespace
from typing import Any

from tests.driver import ground_truth, start_driver

_HERE = Path(__file__).resolve()
_DRIVER_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "CUDA_VISIBLE_DEVICES": "",  # keeps vLLM's real @triton.jit kernel without a GPU (see ground truth)
    "TRITON_INTERPRET": "1",
    "KVLAYOUT_VLLM_MODE": "verify",
    "VLLM_PLUGINS": "kvlayout",
    "KVLAYOUT_VLLM_DRIVER": "1",  # the ground-truth module, imported there, starts no driver of its own
}


_DRIVER = start_driver(_HERE, __name__, _DRIVER_ENV)
if __name__ == "__main__" and "--driver" in sys.argv:  # the plugin loads before vLLM's worker code
    from vllm.plugins import load_general_plugins

    _UTILS_BEFORE = "vllm.v1.worker.utils" in sys.modules
    load_general_plugins()




os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
G = ground_truth()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.v1.worker import gpu_model_runner as RUNNER_V1  # noqa: E402
from vllm.v1.worker import utils as U  # noqa: E402
from vllm.v1.worker.gpu import model_runner as RUNNER_V2  # noqa: E402

import kvlayout as K  # noqa: E402
from kvlayout.errors import BlockIdError, SpecError  # noqa: E402
from kvlayout.integrations import vllm_plugin as P  # noqa: E402
from kvlayout.integrations.vllm import spec_from_kv_cache_config  # noqa: E402

CPU = torch.device("cpu")
#: vLLM's own class, captured before any test installs the plugin in this process
VLLM_ZEROER = U.KVBlockZeroer if P.installed_mode() is None else P._state["original"]

#: every layout (full, sliding-window groups, MLA, attention + Mamba), DeepSeek-V4's packed groups
#: and packed kernel-block views, virtual splitting
PLUGIN_CASES = (
    *(f"{lay}:{kind}" for lay in G.LAYOUTS for kind in ("full+swa-3-groups", "mla-bf16", "attn1+mamba")),
    "BLHNC:attn+mamba",
    "BLHNC:dsv4-c4-c128",
    "BLNHC:dsv4+swa",
    "BLHNC:c4-kernel-views",
    "LBHNC:split",
)


def _case(name: str) -> Any:
    return next(c for c in G.CASES if c.name == name)


def _build(name: str) -> Any:
    """vLLM's objects for a battery case, its own zeroer built by vLLM's own class."""
    mode = P.installed_mode()
    P.uninstall()
    try:
        return G.build(_case(name))
    finally:
        if mode is not None:
            P.install(mode)


def _runner(built: Any, v2: bool) -> Any:
    """The attributes ``_init_kv_zero_meta`` of each model runner reads, from vLLM's objects."""
    by_gid: list[list[Any]] = [[] for _ in built.config.kv_cache_groups]
    for ag in built.attn_groups:
        by_gid[ag.kv_cache_group_id].append(ag)
    ctx = SimpleNamespace(static_forward_context=built.forward_context)
    ns = SimpleNamespace(
        device=torch.device("cpu"), attn_groups=by_gid, kv_cache_config=built.config, compilation_config=ctx
    )
    if v2:
        ns.kernel_block_sizes = built.kernel_block_sizes
        return ns
    ns._kernel_block_sizes = built.kernel_block_sizes
    ns.runner_only_attn_layers = set()
    ns._kv_cache_spec_attn_group_iterator = MethodType(
        RUNNER_V1.GPUModelRunner._kv_cache_spec_attn_group_iterator, ns
    )
    return ns


def init_kv_zero_meta(built: Any, v2: bool = False) -> Any:
    """Run the model runner's own ``_init_kv_zero_meta``; return the zeroer it built."""
    ns = _runner(built, v2)
    if v2:
        RUNNER_V2.GPUModelRunner._init_kv_zero_meta(ns)
        return ns.kv_block_zeroer
    RUNNER_V1.GPUModelRunner._init_kv_zero_meta(ns)
    return ns._kv_block_zeroer


@pytest.fixture
def mode() -> Iterator[Any]:
    """Install a mode for one test; vLLM's own class is back afterwards."""
    yield P.install
    P.uninstall()
    assert U.KVBlockZeroer is VLLM_ZEROER and RUNNER_V1.KVBlockZeroer is VLLM_ZEROER


# --------------------------------------------------------------------------- the variable
def test_mode_from_the_environment_variable() -> None:
    assert P.ENV_VAR == "KVLAYOUT_VLLM_MODE" and P.MODES == ("verify", "replace", "off")
    assert P.mode_from_env({}) == "verify"  # default once the plugin is enabled
    assert P.mode_from_env({P.ENV_VAR: ""}) == "verify"
    assert [P.mode_from_env({P.ENV_VAR: m}) for m in ("replace", " OFF ", "Verify")] == [
        "replace",
        "off",
        "verify",
    ]
    for bad in ("bogus", "1", "verify,replace"):
        with pytest.raises(P.PluginConfigError) as e:
            P.mode_from_env({P.ENV_VAR: bad})
        assert (
            str(e.value)
            == f"Invalid value {bad!r} for KVLAYOUT_VLLM_MODE. Valid options: verify, replace, off"
        )
        assert "\n" not in str(e.value) and e.value.field == "KVLAYOUT_VLLM_MODE"


def test_vllms_loader_runs_the_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_general_plugins`` finds kvlayout's entry point; a bad mode stops it, ``off`` patches nothing."""
    from importlib.metadata import entry_points

    import vllm.plugins

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "kvlayout"]
    assert ep.value == "kvlayout.integrations.vllm_plugin:register"
    monkeypatch.setenv("VLLM_PLUGINS", "kvlayout")
    try:
        for value, installed in (("off", None), ("replace", "replace"), ("", "verify")):
            monkeypatch.setenv(P.ENV_VAR, value)
            monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
            vllm.plugins.load_general_plugins()
            assert P.installed_mode() == installed, value
            assert (U.KVBlockZeroer is VLLM_ZEROER) == (installed is None)
            assert RUNNER_V1.KVBlockZeroer is U.KVBlockZeroer and RUNNER_V2.KVBlockZeroer is U.KVBlockZeroer
            P.uninstall()
        monkeypatch.setenv(P.ENV_VAR, "fast")
        monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
        with pytest.raises(
            P.PluginConfigError, match=r"^Invalid value 'fast' for KVLAYOUT_VLLM_MODE\. Valid"
        ):
            vllm.plugins.load_general_plugins()  # start-up stops
        assert P.installed_mode() is None
    finally:
        P.uninstall()


def test_off_after_an_earlier_mode_puts_vllms_zeroer_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile pass 13, F8: ``register()`` with ``off`` after ``verify`` in one process leaves no kvlayout
    zeroer (and no import hook) behind."""
    try:
        monkeypatch.setenv(P.ENV_VAR, "verify")
        P.register()
        assert P.installed_mode() == "verify" and U.KVBlockZeroer is not VLLM_ZEROER
        monkeypatch.setenv(P.ENV_VAR, "off")
        P.register()
        assert P.installed_mode() is None and U.KVBlockZeroer is VLLM_ZEROER
        assert RUNNER_V1.KVBlockZeroer is VLLM_ZEROER and P._state["hook"] is None
    finally:
        P.uninstall()


# --------------------------------------------------------------------------- verify
def _bind_mamba_as_vllm(built: Any) -> int:
    """Rebind Mamba layers with vLLM's own ``MambaBase.bind_kv_cache`` (a tuple of state views)."""
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    bound = 0
    for ag in built.attn_groups:
        spec = ag.kv_cache_spec
        if not isinstance(spec, G.I.MambaSpec):
            continue
        for name in ag.layer_names:
            layer = SimpleNamespace(
                get_state_shape=lambda s=spec: s.shapes, get_state_dtype=lambda s=spec: s.dtypes
            )
            MambaBase.bind_kv_cache(layer, built.extra["caches"][name])
            assert isinstance(layer.kv_cache, tuple) and len(layer.kv_cache) == len(spec.shapes)
            built.forward_context[name] = layer
            bound += 1
    return bound


def test_verify_passes_vllm_033_tables_through_both_runners(mode: Any) -> None:
    mode("verify")
    for name in PLUGIN_CASES:
        built = _build(name)
        if "mamba" in name:
            assert _bind_mamba_as_vllm(built) == 2
        for v2 in (False, True):
            z = init_kv_zero_meta(built, v2)
            assert isinstance(z, VLLM_ZEROER) and type(z).kvlayout_mode == "verify", name
            assert z._meta is not None and built.zeroer._meta is not None
            for ours, theirs in zip(z._meta[:3], built.zeroer._meta[:3]):  # vLLM keeps its own table
                assert torch.equal(ours, theirs), name
            assert z._meta[3:] == built.zeroer._meta[3:]
            assert z.kvlayout_table == K.plan(G.kvlayout_spec(built)), name


def _plant(monkeypatch: pytest.MonkeyPatch, bug: str, base: int) -> None:
    """vLLM's constructor as the named release computed its table (0.33's code, one line changed)."""
    if bug == "vllm-0.28-first-span-kept":  # 0.28 kept the first span per address, not the widest
        real_max = builtins.max
        monkeypatch.setattr(
            U, "max", lambda *a, **k: a[0] if len(a) == 2 else real_max(*a, **k), raising=False
        )
        return
    real_init = VLLM_ZEROER.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        addrs, strides, pages, *rest = self._meta
        if bug == "vllm-0.27-span-is-stride":  # #50276: the page size as both stride and span
            pages = strides.clone()
        elif bug == "vllm-52709-offset-twice":  # data_ptr() already holds the layer offset
            addrs = (base + 2 * (addrs.to(torch.int64) - base)).to(torch.uint64)
        chunk = rest[1]
        rest[0] = -(-int(pages.max()) // chunk)
        self._meta = (addrs, strides, pages, *rest)

    monkeypatch.setattr(VLLM_ZEROER, "__init__", init)


@pytest.mark.parametrize(
    ("bug", "case", "message"),
    [
        (
            "vllm-0.27-span-is-stride",
            "BLHNC:dsv4-c4-c128",
            r"vLLM's KVBlockZeroer is unsafe: segment \d+ at cache byte \d+ \(layer 'model\.layers\.\d\.\w+' "
            r"block 0\).*block \d+.*bytes \[\d+, \d+\)",
        ),
        (
            "vllm-0.28-first-span-kept",
            "BLHNC:dsv4-indexer-first",
            r"differs from kvlayout's plan at block 0, cache bytes \[8448, 37376\): a page byte of layer "
            r"'model\.layers\.1\.self_attn' block 0 that vLLM leaves stale",
        ),
        (
            "vllm-52709-offset-twice",
            "BLHNC:dsv4-c4-c128",
            r"vLLM's KVBlockZeroer is unsafe: segment \d+ at cache byte \d+ \(.*\).*bytes \[\d+, \d+\)",
        ),
    ],
)
def test_verify_stops_each_planted_vllm_bug(
    monkeypatch: pytest.MonkeyPatch, mode: Any, bug: str, case: str, message: str
) -> None:
    mode("verify")
    built = _indexer_first() if case == "BLHNC:dsv4-indexer-first" else _build(case)
    _plant(monkeypatch, bug, built.buffer.data_ptr())
    for v2 in (False, True):
        with pytest.raises(P.ZeroerMismatchError, match=message):
            init_kv_zero_meta(built, v2)


def _indexer_first() -> Any:
    """DeepSeek-V4's C4 indexer (8,448 B pages) in a cache group listed before the sliding-window MLA
    group (37,376 B) it overlays: the shape of vLLM 0.28's first-span-kept bug."""
    layers = (
        ("model.layers.0.indexer", G._dsv4_indexer(), G.DeepseekV4IndexerBackend),
        ("model.layers.1.self_attn", G._dsv4_swa(), G.DeepseekSparseSWABackend),
    )
    mode = P.installed_mode()
    P.uninstall()
    try:
        built = G.build(G.Case("BLHNC:dsv4-indexer-first", "BLHNC", layers, num_blocks=4))
    finally:
        if mode is not None:
            P.install(mode)
    assert [len(g.layer_names) for g in built.config.kv_cache_groups] == [1, 1]
    assert built.zeroer._meta[2].tolist() == [37_376 // 4]  # one overlaid segment, the widest span
    return built


def test_verify_names_the_layer_block_and_bytes_of_a_difference() -> None:
    """Tables that are safe but not the plan: the first differing block and bytes, with the layer."""
    built = _build("LBHNC:full+swa-3-groups")
    layout = K.plan_layout(G.kvlayout_spec(built))
    ours = layout.table()
    vt = built.vllm_table()
    P.verify_vllm_table(vt, layout, ours, 0)  # vLLM 0.33: equal
    assert P.first_difference(ours, vt) is None
    short = K.SegmentTable(vt.total_bytes, vt.num_blocks, vt.segments[:-1])
    last = vt.segments[-1]
    with pytest.raises(
        P.ZeroerMismatchError,
        match=rf"at block 0, cache bytes \[{last.base}, {last.base + last.span}\): a page byte of layer "
        r"'model\.layers\.3\.attn' block 0 that vLLM leaves stale",
    ):
        P.verify_vllm_table(short, layout, ours, 0)
    # the same bytes cut differently (two rows for one) are the same table
    s0 = vt.segments[0]
    halves = (
        K.Segment(s0.base, s0.stride, s0.span // 2),
        K.Segment(s0.base + s0.span // 2, s0.stride, s0.span - s0.span // 2),
    )
    assert (
        P.first_difference(ours, K.SegmentTable(vt.total_bytes, vt.num_blocks, halves + vt.segments[1:]))
        is None
    )


def test_verify_refuses_a_config_from_another_cache() -> None:
    """The views must be where kvlayout's plan of vLLM's KVCacheConfig puts them."""
    built = _build("BLHNC:full+swa-3-groups")
    name = built.config.kv_cache_groups[0].layer_names[0]
    view = built.forward_context[name].kv_cache
    built.forward_context[name] = SimpleNamespace(kv_cache=view.as_strided(view.shape, view.stride(), 8))
    P.install("verify")
    try:
        with pytest.raises(SpecError, match=rf"static_forward_context\[{name!r}\]\.storage_offset = 8"):
            init_kv_zero_meta(built)
        with pytest.raises(SpecError, match=r"built outside a model runner's _init_kv_zero_meta"):
            U.KVBlockZeroer(CPU, built.attn_groups, built.kernel_block_sizes, built.forward_context, 5)
    finally:
        P.uninstall()


def test_step_ids_checked_before_vllms_kernel() -> None:
    """The verify step's check: the host tensor vLLM builds, refused on any id outside the pool."""
    ids = P.checked_step_ids([3, 0, 99], 100)
    assert ids.dtype == torch.int64 and ids.tolist() == [3, 0, 99] and ids.device.type == "cpu"
    assert P.checked_step_ids([], 100).numel() == 0
    for bad, i, v in (([0, 100], 1, 100), ([-1, 5], 0, -1), ([7, 2**40, -3], 1, 2**40)):
        with pytest.raises(
            BlockIdError, match=rf"^block_ids\[{i}\] = {v}: outside \[0, 100\): kvlayout refused"
        ):
            P.checked_step_ids(bad, 100)


# --------------------------------------------------------------------------- replace
#: every layout once; DeepSeek-V4 packed, packed kernel-block views, a Mamba hybrid, MLA, splitting
REPLACE_CASES = (
    "BLHNC:dsv4-c4-c128",
    "LHBNC:full+swa-3-groups",
    "BLNHC:attn1+mamba",
    "BLHNC:c4-kernel-views",
    "LBNHC:mla-bf16",
    "BHLNC:full+swa-3-groups",
    "LBHNC:split",
)


def test_replace_clears_exactly_vllms_bytes(mode: Any) -> None:
    mode("replace")
    for name in REPLACE_CASES:
        built = _build(name)
        vt = built.vllm_table()
        n = built.num_blocks
        poison = K.poison_pattern(built.buffer.numel(), seed=len(name))
        for v2 in (False, True):
            z = init_kv_zero_meta(built, v2)
            assert isinstance(z, P.ReplacedKVBlockZeroer) and not isinstance(z, VLLM_ZEROER)
            assert z.table == K.plan(G.kvlayout_spec(built))
            z.warmup(n)  # vLLM's warmup(num_kv_blocks): writes nothing
            batches = [[b] for b in range(n)] if not v2 else [[n - 1, 0]]
            for ids in batches:
                built.buffer.copy_(torch.from_numpy(poison))
                z.zero_block_ids(ids)
                expected = poison.copy()
                for lo, hi in G.vllm_bytes(vt, ids):  # vLLM's own table, its own bytes
                    expected[lo:hi] = 0
                assert np.array_equal(built.buffer.numpy(), expected), (name, v2, ids)
            built.buffer.copy_(torch.from_numpy(poison))
            with pytest.raises(BlockIdError, match=rf"outside \[0, {n}\)"):
                z.zero_block_ids([0, n])  # vLLM would write past its buffer
            for g in range(len(z.group_names)):  # one group at a time (vLLM #52187)
                z.zero_block_ids([1], group=g)
            expected = poison.copy()
            for g in {s.group for s in z.table.segments}:  # a Mamba group has no rows: nothing written
                K.zero_blocks_numpy(expected, z.table, [1], group=g)
            assert np.array_equal(built.buffer.numpy(), expected), name


def test_replace_at_a_nonzero_storage_offset(mode: Any) -> None:
    """vLLM views its buffer from the buffer's storage offset; the replacement writes there."""
    built = _build("BLHNC:full+swa-3-groups")
    lead = 4096
    store = torch.from_numpy(K.poison_pattern(lead + built.buffer.numel() + lead, seed=2))
    raw = store.view(torch.int8)[lead : lead + built.buffer.numel()]
    views: dict[str, Any] = {}
    for t in built.config.kv_cache_tensors:
        g = next(g for g in built.config.kv_cache_groups if t.layers[0] in g.layer_names)
        views.update(
            zip(t.layers, U.create_kv_cache_views(raw, g.kv_cache_spec, built.num_blocks, built.layout, t))
        )
    ctx = {name: SimpleNamespace(kv_cache=v) for name, v in views.items()}
    built.forward_context.clear()
    built.forward_context.update(ctx)
    mode("replace")
    z = init_kv_zero_meta(built)
    before = store.numpy().copy()
    z.zero_block_ids([2])
    expected = before.copy()
    K.zero_blocks_numpy(expected[lead : lead + built.buffer.numel()], z.table, [2])
    assert np.array_equal(store.numpy(), expected)


def test_kv_sharing_layer_without_a_tensor(mode: Any) -> None:
    """A layer that reuses another's cache owns no KVCacheTensor; vLLM's v2 runner does not name it."""
    for m in ("verify", "replace"):
        built = _build("BLHNC:full-bf16")
        g = built.config.kv_cache_groups[0]
        shared, target = "model.layers.9.attn", g.layer_names[0]
        built.config = replace(
            built.config, kv_cache_groups=[replace(g, layer_names=[*g.layer_names, shared])]
        )
        built.attn_groups[0].layer_names.append(shared)
        built.forward_context[shared] = built.forward_context[target]  # the runner's kv sharing
        mode(m)
        for v2 in (False, True):
            ns = _runner(built, v2)
            if not v2:
                ns.runner_only_attn_layers = {shared}
            (RUNNER_V2 if v2 else RUNNER_V1).GPUModelRunner._init_kv_zero_meta(ns)
            z = ns.kv_block_zeroer if v2 else ns._kv_block_zeroer
            table = z.kvlayout_table if m == "verify" else z.table
            spec = spec_from_kv_cache_config(
                built.config, kernel_block_sizes=built.kernel_block_sizes, runner_only_attn_layers={shared}
            )
            assert table == K.plan(spec), (m, v2)  # the shared layer adds no row
        P.uninstall()


def test_the_guide_quotes_the_measured_per_step_cost() -> None:
    """docs/vllm.md's per-step numbers are those of the H200 run it cites."""
    root = _HERE.parents[1]
    rows = json.loads((root / "bench" / "results" / "h200-plugin" / "plugin.json").read_text())["rows"]
    assert rows and all(r["byte_equal"] and r["bad_id_refused"] for r in rows)
    guide = " ".join((root / "docs" / "vllm.md").read_text().split())
    section = guide[guide.index("## Use with vLLM") :]

    def span(key: str) -> str:
        values = [r[key] for r in rows]
        return f"{min(values):.2f}-{max(values):.2f}x"

    checks = sorted(r["id_check_us"] for r in rows if r["id_check_us"] > 0)
    for quoted in (
        f"`verify` takes {span('verify_vs_vllm')} vLLM's step",
        f"`replace` is {span('replace_speedup')} faster",
        f"{checks[0]:.0f}-{checks[-1]:.0f} us on the host",
        "bench/results/h200-plugin/plugin.md",
        "KVLAYOUT_VLLM_MODE",
    ):
        assert quoted in section, quoted


# --------------------------------------------------------------------------- the driver
def test_driver_loads_the_plugin_and_checks_vllms_kernel_steps() -> None:
    assert _DRIVER is not None
    out, err = _DRIVER.communicate(timeout=600)
    assert _DRIVER.returncode == 0, err[-4000:]
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    head, *cases = results
    assert head == {"utils_imported_before": False, "mode": "verify", "patched": True}, err[-2000:]
    assert [r["case"] for r in cases] == list(DRIVER_CASES), err[-2000:]
    for r in cases:
        assert r["zeroed"] > 0 and r["differ"] == 0 and r["refused"] and r["untouched"], r


DRIVER_CASES = ("BLHNC:dsv4-c4-c128", "LHBNC:full+swa-3-groups")


def _driver() -> None:
    """Fresh process: vLLM's loader installed the plugin (at import, above), then vLLM's worker code
    was imported; steps run vLLM's kernel under Triton's interpreter."""
    head = {
        "utils_imported_before": _UTILS_BEFORE,
        "mode": P.installed_mode(),
        "patched": getattr(U.KVBlockZeroer, "kvlayout_mode", None) == "verify",
    }
    print(json.dumps(head), flush=True)
    for name in DRIVER_CASES:
        built = _build(name)
        n = built.num_blocks
        ids = sorted({0, 2 % n, n - 1})
        poison = K.poison_pattern(built.buffer.numel(), seed=5)
        built.buffer.copy_(torch.from_numpy(poison))
        built.zeroer.zero_block_ids(ids)  # vLLM's own zeroer, its kernel
        theirs = built.buffer.numpy().copy()
        z = init_kv_zero_meta(built, v2=name.startswith("LHBNC"))
        built.buffer.copy_(torch.from_numpy(poison))
        z.zero_block_ids(ids)  # verify mode: the same kernel after kvlayout's id check
        ours = built.buffer.numpy().copy()
        built.buffer.copy_(torch.from_numpy(poison))
        try:
            z.zero_block_ids([1, n])
            refused = False
        except BlockIdError:
            refused = True
        print(
            json.dumps(
                {
                    "case": name,
                    "zeroed": int((theirs != poison).sum()),
                    "differ": int((ours != theirs).sum()),
                    "refused": refused,
                    "untouched": bool(np.array_equal(built.buffer.numpy(), poison)),
                }
            ),
            flush=True,
        )


if __name__ == "__main__" and "--driver" in sys.argv:
    _driver()
