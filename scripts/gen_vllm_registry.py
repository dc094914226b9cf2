#!/usr/bin/env python3
"""Generate kvlayout/models/registry_vllm.py from the installed vLLM's model registry (issue 23).

Reads ``vllm/model_executor/models/registry.py`` (``_TEXT_GENERATION_MODELS``) and each model class's
source with ``ast`` (nothing of vLLM is imported: no GPU, no seconds of import), and writes one row per
text-generation architecture: the module, the rule kind that decides its cache, and the cache-relevant
config fields its code reads. The kind, from the class and the classes it derives from (across vLLM's
model modules) and from the code of their modules:

- ``attention-free``: the class is ``IsAttentionFree`` (no KV cache);
- ``hybrid``: the class is ``IsHybrid`` (Mamba or linear-attention layers beside attention);
- ``mla``: the modules build multi-head latent attention (``MLAAttention``, ``MultiHeadLatentAttention``);
- ``sliding-window``: the modules read ``sliding_window`` or ``layer_types``;
- ``attention``: plain attention (the generic head size / KV heads rules).

It also writes the text-generation architectures vLLM serves through its Transformers modeling backend
(``_TRANSFORMERS_SUPPORTED_MODELS`` whose class is ``TransformersForCausalLM`` or
``TransformersMoEForCausalLM``; none of them is in ``_TEXT_GENERATION_MODELS``, asserted): there the
backend's ``Base._create_attention_instances`` (model_executor/models/transformers/base.py) makes one
``Attention`` per decoder layer from ModelConfig's head size and KV heads, a window on the
``sliding_attention`` layers of ``layer_types``, so the kind is ``sliding-window``, or ``mla`` where the
transformers config class reads ``kv_lora_rank``; the fields are those the transformers model's
configuration and modeling code read (found in the installed transformers' source, not imported; none
for a class transformers lacks: remote code).

Usage: ``python scripts/gen_vllm_registry.py [--check]`` (``--check``: exit 1 if the committed table
differs from what the installed vLLM gives). tests/test_models_registry.py runs the check.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "kvlayout" / "models" / "registry_vllm.py"

#: config fields that decide a KV cache (read from each module's code where it names them)
CACHE_FIELDS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "num_kv_heads",
    "n_head_kv",
    "multi_query_group_num",
    "head_dim",
    "hidden_size",
    "sliding_window",
    "layer_types",
    "use_sliding_window",
    "max_window_layers",
    "sliding_window_pattern",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "index_head_dim",
    "compress_ratios",
    "attn_layer_period",
    "attn_layer_offset",
    "hybrid_override_pattern",
    "full_attention_interval",
    "n_groups",
    "conv_kernel",
    "ssm_state_size",
    "mamba_expand",
    "mamba_d_conv",
    "mamba_d_state",
    "mamba_d_ssm",
    "mamba_n_groups",
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_num_heads",
    "mamba_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
_MLA_MARKERS = ("MLAAttention", "MultiHeadLatentAttention")
#: a class statement and its bases (no call in the bases: vLLM's model classes have none)
_CLASS = re.compile(r"^class\s+(\w+)\s*\(([^()]*)\)\s*:", re.M)


def vllm_root() -> Path:
    """The installed vLLM package directory (found, not imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vLLM is not installed (pip install -r requirements-vllm.txt)")
    return Path(next(iter(spec.submodule_search_locations)))


def _module_file(root: Path, module: str) -> Path:
    """A registry module name: relative to model_executor/models, or a full ``vllm.`` path."""
    parts = module.split(".")
    base = root.joinpath(*parts[1:]) if parts[0] == "vllm" else root / "model_executor" / "models" / module
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def text_generation_models(root: Path) -> dict[str, tuple[str, str]]:
    """``_TEXT_GENERATION_MODELS`` of vLLM's registry: architecture -> (module, class)."""
    tree = ast.parse((root / "model_executor" / "models" / "registry.py").read_text())
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if getattr(target, "id", None) == "_TEXT_GENERATION_MODELS":
            value = ast.literal_eval(node.value)  # type: ignore[union-attr, arg-type]
            return {str(k): (str(v[0]), str(v[1])) for k, v in value.items()}
    raise SystemExit("_TEXT_GENERATION_MODELS not found in vLLM's registry.py")


#: the vLLM classes of the Transformers backend that serve a text-generation architecture
BACKEND_CAUSAL_LM = ("TransformersForCausalLM", "TransformersMoEForCausalLM")


def transformers_backend_models(root: Path) -> dict[str, str]:
    """The text-generation rows of ``_TRANSFORMERS_SUPPORTED_MODELS``: architecture -> backend class."""
    tree = ast.parse((root / "model_executor" / "models" / "registry.py").read_text())
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if getattr(target, "id", None) == "_TRANSFORMERS_SUPPORTED_MODELS":
            value = ast.literal_eval(node.value)  # type: ignore[union-attr, arg-type]
            return {str(k): str(v[1]) for k, v in value.items() if v[1] in BACKEND_CAUSAL_LM}
    raise SystemExit("_TRANSFORMERS_SUPPORTED_MODELS not found in vLLM's registry.py")


def _transformers_root() -> Path | None:
    """The installed transformers' ``models`` directory (found, not imported), or None."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "models"


def backend_row(models: Path | None, arch: str) -> tuple[str, tuple[str, ...]]:
    """The kind and cache fields of a Transformers-backend architecture, from transformers' model code
    (``sliding-window``: the backend's rule; ``mla`` where the config class reads ``kv_lora_rank``)."""
    pattern = re.compile(rf"^class\s+{arch}\s*\(", re.M)
    for path in sorted(models.glob("*/modeling_*.py")) if models else []:
        src = path.read_text(errors="replace")
        if pattern.search(src):
            conf = path.with_name(path.name.replace("modeling_", "configuration_", 1))
            text = src + "\n" + (conf.read_text(errors="replace") if conf.exists() else "")
            kind = "mla" if re.search(r"\bkv_lora_rank\b", text) else "sliding-window"
            return kind, tuple(f for f in CACHE_FIELDS if re.search(rf"""(\.|["']|\b){f}\b""", text))
    return "sliding-window", ()


class _Classes:
    """Every class of vLLM's model code, by name, with its bases and its module's text."""

    def __init__(self, root: Path) -> None:
        self.by_name: dict[str, list[tuple[Path, list[str]]]] = {}
        self.text: dict[Path, str] = {}
        files = [*(root / "model_executor" / "models").rglob("*.py"), *(root / "models").rglob("*.py")]
        for path in sorted(files):
            src = path.read_text(errors="replace")
            self.text[path] = src
            for m in _CLASS.finditer(src):  # a regular expression: ast over 400 files takes seconds
                bases = [b.strip().split("[")[0].split(".")[-1] for b in m.group(2).split(",") if b.strip()]
                self.by_name.setdefault(m.group(1), []).append((path, bases))

    def closure(self, path: Path, name: str) -> Iterator[tuple[Path, str]]:
        """``(module file, class name)`` of the class and of every class it derives from."""
        seen: set[tuple[Path, str]] = set()
        todo = [(path, name)]
        while todo:
            p, n = todo.pop()
            if (p, n) in seen:
                continue
            seen.add((p, n))
            yield p, n
            found = [x for x in self.by_name.get(n, []) if x[0] == p] or self.by_name.get(n, [])[:1]
            for fp, bases in found:
                yield fp, n  # where the class is defined (a package may re-export it)
                for b in bases:
                    if b in self.by_name:
                        same = [x for x in self.by_name[b] if x[0] == fp]
                        todo.append((same[0][0] if same else self.by_name[b][0][0], b))
                    else:
                        todo.append((fp, b))  # an interface or a torch base: its name still counts


def classify(classes: _Classes, path: Path, cls: str) -> tuple[str, tuple[str, ...]]:
    """The rule kind of one architecture and the cache fields its modules read."""
    chain = list(classes.closure(path, cls))
    names = {n for _, n in chain}
    files = list(dict.fromkeys(p for p, _ in chain))
    if path.name == "__init__.py":  # a package (vllm/models/...): all of its code
        files += sorted(path.parent.rglob("*.py"))
    text = "\n".join(classes.text.get(p, "") for p in dict.fromkeys(files))
    if "IsAttentionFree" in names:
        kind = "attention-free"
    elif "IsHybrid" in names:
        kind = "hybrid"
    elif any(m in text for m in _MLA_MARKERS):
        kind = "mla"
    elif re.search(r"\bsliding_window\b|\blayer_types\b", text):
        kind = "sliding-window"
    else:
        kind = "attention"
    fields = tuple(f for f in CACHE_FIELDS if re.search(rf"""(\.|["']){f}\b""", text))
    return kind, fields


def _q(text: str) -> str:
    """A string literal as ruff writes it (double quotes)."""
    return json.dumps(text)


def _tuple(items: tuple[str, ...]) -> str:
    return "(" + ", ".join(map(_q, items)) + ("," if len(items) == 1 else "") + ")"


def _row(arch: str, module: str, kind: str, fields: tuple[str, ...], width: int = 110) -> str:
    """One table row, wrapped so that no line passes ``width`` (tests/test_line_length.py)."""
    one = f"    {_q(arch)}: ({_q(module)}, {_q(kind)}, {_tuple(fields)}),"
    if len(one) <= width:
        return one
    lines, cur = [], "            "
    for item in (f"{_q(f)}," for f in fields):
        if len(cur) + len(item) + 1 > width and cur.strip():
            lines.append(cur.rstrip())
            cur = "            "
        cur += item + " "
    lines.append(cur.rstrip())
    return "\n".join(
        [f"    {_q(arch)}: (", f"        {_q(module)},", f"        {_q(kind)},", "        (", *lines,
         "        ),", "    ),"]
    )


def generate(root: Path | None = None) -> str:
    """The text of registry_vllm.py for the vLLM installed at ``root``."""
    root = root or vllm_root()
    version = "unknown"
    for line in (root / "version.py").read_text().splitlines() if (root / "version.py").exists() else []:
        m = re.match(r"""__version__\s*=\s*version\s*=\s*['"]([^'"]+)""", line) or re.match(
            r"""__version__\s*=\s*['"]([^'"]+)""", line
        )
        if m:
            version = m.group(1)
    if version == "unknown":
        version = (root / "_version.py").read_text().split("version = ")[1].split("\n")[0].strip("'\"")
    classes = _Classes(root)
    rows = []
    for arch, (module, cls) in sorted(text_generation_models(root).items()):
        path = _module_file(root, module)
        kind, fields = classify(classes, path, cls)
        rows.append(_row(arch, module, kind, fields))
    body = "\n".join(rows)
    text_generation = text_generation_models(root)
    backend = transformers_backend_models(root)
    both = sorted(set(backend) & set(text_generation))
    if both:  # vLLM's own class would win (the registry's _normalize_arch): not the backend's
        raise SystemExit(f"in both registries, not served by the Transformers backend: {both}")
    models = _transformers_root()
    backend_rows = "\n".join(
        _row(arch, "transformers", *backend_row(models, arch)) for arch in sorted(backend)
    )
    return f'''"""vLLM {version}'s text-generation architectures and what decides their KV cache.

Generated by scripts/gen_vllm_registry.py from the installed vLLM (its model registry and model
code, read with ``ast``); do not edit. Row: architecture -> (vLLM module, rule kind, the
cache-relevant config fields its code reads). Kinds: ``attention``, ``sliding-window``, ``mla``,
``hybrid`` (Mamba or linear attention), ``attention-free``.
"""

from __future__ import annotations

from collections.abc import Mapping

VLLM_VERSION = {_q(version)}

# fmt: off
TEXT_GENERATION: Mapping[str, tuple[str, str, tuple[str, ...]]] = {{
{body}
}}
#: vLLM {version}'s text-generation architectures served by its Transformers modeling backend
#: (``_TRANSFORMERS_SUPPORTED_MODELS``): same row; the fields from transformers' model code
TRANSFORMERS_BACKEND: Mapping[str, tuple[str, str, tuple[str, ...]]] = {{
{backend_rows}
}}
# fmt: on
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed table is stale")
    args = ap.parse_args()
    text = generate()
    if args.check:
        ok = OUT.exists() and OUT.read_text() == text
        print("registry_vllm.py is up to date" if ok else "registry_vllm.py differs: rerun the script")
        return 0 if ok else 1
    OUT.write_text(text)
    rows = text.count(chr(10) + '    "')  # a row starts at 4 spaces; its wrapped lines at 8
    backend = len(transformers_backend_models(vllm_root()))
    print(f"wrote {OUT} ({rows - backend} architectures, {backend} of the Transformers backend)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
