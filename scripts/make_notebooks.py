"""Write the notebooks in notebooks/ (outputs stripped; CI executes them: tests/test_notebooks.py).

    python scripts/make_notebooks.py
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NB = {
    "01_dsv4_packed_layout.ipynb": [
        ("md", "# Explore the DeepSeek-V4 packed layout\nPage arithmetic, why the block stride is not the zero span, and the pre-fix bug of vLLM #50276 drawn and caught by the verifier."),
        ("code", "%matplotlib inline\nimport kvlayout as K\nfrom kvlayout.viz import byte_map, table_map, table_view\nspec = K.preset('dsv4-test')\nlayer = spec.groups[0].layers[0]\nprint(layer.stored_tokens, layer.real_page, layer.page, layer.gap)\nassert (layer.stored_tokens, layer.real_page, layer.page, layer.gap) == (64, 37376, 37440, 64)"),
        ("md", "Four such layers share one row per block: the **block stride** is 4 padded pages, 149,760 B; the **zero span** of each layer is its real page, 37,376 B."),
        ("code", "table = K.plan(spec)\nview = table_view(table)\nprint(view)\nassert all(s.stride == 149760 and s.span == 37376 for s in table.segments)\nbyte_map(spec);"),
        ("md", "## The pre-fix table: the page size used as stride *and* span"),
        ("code", "bad = K.SegmentTable(table.total_bytes, 100, tuple(K.Segment(s.base, 149760, 149760, s.group, s.layer) for s in table.segments))\nrep = K.verify(bad)\nprint(rep.format())\nassert not rep.ok\nassert {v.rows[0] for v in rep.by_invariant(3)} == {1, 2, 3}\nassert any('112320 B past' in v.message for v in rep.by_invariant(2))\nfig = table_map(bad)"),
    ],
    "02_choose_a_backend.ipynb": [
        ("md", "# Choose a backend\n`KVLAYOUT_BACKEND` (or `--backend`, or an argument) picks the zeroer; `auto` picks from the hardware. Here every installed backend zeroes the same blocks and the results are compared byte for byte."),
        ("code", "%matplotlib inline\nimport os\nos.environ.setdefault('JAX_PLATFORMS', 'cpu')\nimport kvlayout as K\nfrom kvlayout import registry\nfrom kvlayout.cli import installed_backends\nos.environ['KVLAYOUT_BACKEND'] = 'reference'\nprint(registry.resolve())\ntry:\n    os.environ['KVLAYOUT_BACKEND'] = 'tpu'\n    registry.resolve()\nexcept K.BackendError as e:\n    print(e)\nfinally:\n    del os.environ['KVLAYOUT_BACKEND']\nbackends = installed_backends()\nprint(sorted(backends))\nassert 'reference' in backends"),
        ("code", "from kvlayout.conformance import run_case, GUARD_BYTES\nfrom kvlayout.viz import zero_diff\nimport numpy as np\ntable = K.plan(K.preset('dsv4-test'))\nids = [0, 1, 99]\nresults = {name: run_case(cls, table, ids) for name, cls in backends.items()}\nfor name, r in results.items():\n    print(name, r.mode, r.ok)\n    assert r.ok\nfirst = next(iter(results.values())).after\nassert all(np.array_equal(first, r.after) for r in results.values())\nzero_diff(K.poison_pattern(first.size), {n: r.after for n, r in results.items()}, table, ids, origin=GUARD_BYTES, region=(0, 2 * 149760));"),
    ],
    "03_bring_your_own_layout.ipynb": [
        ("md", "# Bring your own layout\nWrite a spec in JSON or Python, plan it, prove it, draw it, zero it."),
        ("code", "%matplotlib inline\nimport json\nimport kvlayout as K\nfrom kvlayout.viz import byte_map, table_view\nspec = K.KVCacheSpec.from_json(json.dumps({'version': 1, 'num_blocks': 32, 'layout': 'packed', 'groups': [\n  {'name': 'attn', 'layers': [\n    {'name': 'L0', 'kind': 'full', 'block_size': 16, 'num_kv_heads': 2, 'head_size': 64, 'dtype': 'bfloat16', 'alignment': 4096},\n    {'name': 'mamba0', 'kind': 'mamba', 'state_bytes': 6000, 'alignment': 512}]},\n  {'name': 'mla', 'layers': [{'name': 'M0', 'kind': 'mla', 'block_size': 16, 'head_size': 576, 'dtype': 'bfloat16'}]}]}))\ntable = K.plan(spec)\nprint(table_view(table))\nassert K.verify(table).ok\nbyte_map(spec);"),
        ("code", "from kvlayout.conformance import run_case\nres = run_case(K.ReferenceBackend, table, [0, 7, 31])\nprint(res.check.describe(), res.check.zeroed_bytes)\nassert res.ok and res.check.zeroed_bytes == 3 * table.bytes_per_block"),
    ],
}


def main() -> None:
    out = Path(__file__).resolve().parent.parent / "notebooks"
    out.mkdir(exist_ok=True)
    for name, cells in NB.items():
        nb = new_notebook(cells=[new_markdown_cell(t) if k == "md" else new_code_cell(t) for k, t in cells])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, out / name)
        print("wrote", out / name)


if __name__ == "__main__":
    main()
