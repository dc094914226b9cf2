#!/usr/bin/env python3
"""Generate kvlayout/models/config_aliases.py from the installed transformers (issue 25, tenth pass).

A transformers config class's ``attribute_map`` names aliases: setting the alias sets its target, so a
config.json that writes both gets the alias's value where the alias is not itself a field of the class
(``Glm4MoeLiteConfig``: ``head_dim`` beside ``qk_rope_head_dim`` = 128 and 64 is read with a 128-wide
rope part, the one vLLM 0.33's model reads). kvlayout's json reader reads a config as written, so it
applies the same aliases: this table, per model type, of the aliases that win, restricted to the fields
that decide a cache (scripts/gen_vllm_registry.py's ``CACHE_FIELDS`` and the names kvlayout's variations
read). Nothing of transformers is imported at kvlayout's run time.

It also writes, per model type, the fields deciding a cache for which the class refuses a ``null``
(``NOT_NULL``: ``MixtralConfig`` types ``num_key_value_heads`` as ``int``, a strict dataclass field, where
``LlamaConfig`` takes ``None`` and fills it): the json reader refuses such a null, naming the field, as
transformers, hence vLLM, does; it read it as absent (issue 25, tenth pass, left low). Found by trying:
``from_dict({field: None})`` over the class defaults fails the class's strict type check for that field
(a failure of arithmetic on None is not recorded: other fields may make the null valid, as layer_types
does Exaone4Config's null window); with vLLM's own class where vLLM 0.33 reads the model type with one
(``VLLM_TYPES``). And the text config's model type of a multimodal class that nests one (``TEXT_TYPES``),
for a ``text_config`` written without ``model_type``, or for the top level where none is nested.

And, per model type, the KV heads and head size the class fills where config.json leaves them out,
unlike vLLM's generic rule (the query heads; ``hidden_size // num_attention_heads``): ``DEFAULTS``
(MistralConfig fills 8 KV heads, Gemma2Config a head size of 256). The json reader planned the generic
rule there (issue 25, eleventh pass: Mistral without ``num_key_value_heads`` 4x vLLM's bytes). Found by
reading the class built from two probe configs (other hidden sizes, heads and layers); a value that
differs between them is written ``None`` (computed: the json reader sends the config to transformers).

Usage: ``python scripts/gen_config_aliases.py [--check] [--only TYPES]`` (``--check``: exit 1 if the
committed tables differ from what the installed transformers gives; ``--only a,b``: check those model
types' rows alone, seconds instead of a minute). tests/test_models_aliases.py runs the check.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "kvlayout" / "models" / "config_aliases.py"
#: the names kvlayout's variations read beside scripts/gen_vllm_registry.py's cache fields
EXTRA_FIELDS = (
    "n_head", "n_heads", "n_layer", "n_layers", "num_layers", "num_heads", "n_embd", "d_model",
    "kv_channels", "attention_head_dim", "layers_block_type", "num_attention_groups", "n_head_kv",
    "attention_window_size", "sliding_window_size", "attention_chunk_size", "v_head_dim",
)


def cache_fields() -> frozenset[str]:
    path = ROOT / "scripts" / "gen_vllm_registry.py"
    spec = importlib.util.spec_from_file_location("gen_vllm_registry", path)
    if spec is None or spec.loader is None:
        raise SystemExit("scripts/gen_vllm_registry.py not found")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return frozenset((*mod.CACHE_FIELDS, *EXTRA_FIELDS))


def _alias_row(cls: type, fields: frozenset[str]) -> dict[str, str]:
    """{alias: target} of a config class's ``attribute_map`` where the alias is not itself a declared
    field (a declared field wins over the map) and either side is a field the cache reads."""
    amap = getattr(cls, "attribute_map", None) or {}
    declared = set(getattr(cls, "__dataclass_fields__", None) or ()) | set(
        inspect.signature(cls.__init__).parameters
    )
    return {
        a: t
        for a, t in sorted(amap.items())
        if isinstance(a, str) and isinstance(t, str) and a != t and a not in declared
        and (a in fields or t in fields)
    }


def table() -> dict[str, dict[str, str]]:
    """model type -> {alias: target} for the aliases that win over a written target."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto as ma

    fields = cache_fields()
    # the model types a generating model is read from: causal LMs, multimodal models and their text configs
    lm = {*ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, *ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES}
    out: dict[str, dict[str, str]] = {}
    for mt in sorted(m for m in CONFIG_MAPPING if m in lm or m.endswith("_text")):
        try:
            cls = CONFIG_MAPPING[mt]
        except Exception:  # noqa: BLE001 - a class transformers cannot import here: not read
            continue
        row = _alias_row(cls, fields)
        if row:
            out[mt] = row
    return out


def vllm_alias_table(vllm: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """vLLM type -> {alias: target} of vLLM's own config class (``ChatGLMConfig``: ``num_hidden_layers`` is
    its ``num_layers``), by :func:`table`'s rule; the type's transformers class, where vLLM reads it with
    one, is in :data:`ALIASES` already."""
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    fields = cache_fields()
    out: dict[str, dict[str, str]] = {}
    for mt, cls in _classes(vllm, frozenset(vllm)):
        if mt not in _CONFIG_REGISTRY or cls.__module__.startswith("transformers."):
            continue
        row = _alias_row(cls, fields)
        if row:
            out[mt] = row
    return out


def render_vllm_aliases(rows: dict[str, dict[str, str]]) -> list[str]:
    return [
        "#: the VLLM_TYPES read with vLLM's own class -> {alias: target} of that class (as ALIASES)",
        "VLLM_ALIASES: Mapping[str, Mapping[str, str]] = {",
        *(line for mt, row in rows.items() for line in _row_lines(mt, row)),
        "}",
    ]


def _row_lines(mt: str, row: dict[str, str]) -> list[str]:
    """One table row on a line, or one entry a line where it would pass 110 characters."""
    one = f"    {mt!r}: {{{', '.join(f'{a!r}: {t!r}' for a, t in row.items())}}},"
    if len(one) <= 110:
        return [one]
    return [f"    {mt!r}: {{", *(f"        {a!r}: {t!r}," for a, t in row.items()), "    },"]


def _types() -> list[str]:
    """The model types a generating model is read from: causal LMs, multimodal models, text configs."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto as ma

    lm = {*ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, *ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES}
    return sorted(m for m in CONFIG_MAPPING if m in lm or m.endswith("_text"))


def vllm_types() -> tuple[str, ...]:
    """The model types vLLM 0.33 reads with its own config class (its ``_CONFIG_REGISTRY``), not
    transformers': Beam's BeamConfig fills 4 KV heads where transformers' fills 8."""
    import os

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    return tuple(sorted(_CONFIG_REGISTRY))


def vllm_transformers_classes(vllm: tuple[str, ...]) -> dict[str, str]:
    """vLLM type -> the transformers model type whose class vLLM 0.33 reads it with, where that class is
    transformers' own (``deepseek_v32`` and ``kimi_k2``: ``DeepseekV3Config``): the transformers reader
    builds such a config with that class, not with the one transformers maps the type to."""
    from transformers import CONFIG_MAPPING
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    out = {}
    for mt in vllm:
        cls = _CONFIG_REGISTRY[mt]
        key = getattr(cls, "model_type", None)
        ours = cls.__module__.startswith("transformers.")
        if ours and key in CONFIG_MAPPING and CONFIG_MAPPING[key] is cls:
            out[mt] = key
    return out


def _class(mt: str, vllm: tuple[str, ...]) -> Any:
    """The config class vLLM 0.33 reads model type ``mt`` with."""
    if mt in vllm:
        from vllm.transformers_utils.config import _CONFIG_REGISTRY

        return _CONFIG_REGISTRY[mt]
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[mt]


def _read_types(only: frozenset[str] | None, vllm: tuple[str, ...]) -> list[str]:
    return [mt for mt in sorted({*_types(), *vllm}) if only is None or mt in only]


def _classes(vllm: tuple[str, ...], only: frozenset[str] | None) -> Iterator[tuple[str, Any]]:
    """(model type, the class vLLM reads it with) for each type read (those not importable here left out),
    with transformers' log records and warnings silenced while the caller builds them."""
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for mt in _read_types(only, vllm):
                try:
                    cls = _class(mt, vllm)
                except Exception:  # noqa: BLE001 - a class that cannot be imported here: not read
                    continue
                yield mt, cls
    finally:
        logging.disable(logging.NOTSET)


def _declared(cls: Any) -> set[str]:
    amap = getattr(cls, "attribute_map", None) or {}
    return (
        set(getattr(cls, "__dataclass_fields__", None) or ())
        | set(inspect.signature(cls.__init__).parameters)
        | {a for a in amap if isinstance(a, str)}
    )


def null_table(
    vllm: tuple[str, ...], only: frozenset[str] | None = None
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """model type -> (class name, the cache fields its ``from_dict`` refuses as ``null``), read with the
    class vLLM reads it with."""
    from huggingface_hub.errors import StrictDataclassFieldValidationError

    fields = cache_fields()
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for mt, cls in _classes(vllm, only):
        try:
            cls.from_dict({})
        except Exception:  # noqa: BLE001 - its defaults do not build
            continue
        refused = []
        for f in sorted(fields & _declared(cls)):
            try:
                cls.from_dict({f: None})
            except StrictDataclassFieldValidationError as e:  # the field's type refuses None, always
                if repr(f) in str(e):
                    refused.append(f)
            except Exception:  # noqa: BLE001 - arithmetic on None over the defaults: other fields may
                pass  # make it valid (Exaone4Config's null window beside layer_types): not recorded
        if refused:
            out[mt] = (cls.__name__, tuple(refused))
    return out


#: the KV-head fields vLLM's ModelConfig reads, first found first (kvlayout.models.attention.KV_HEAD_KEYS)
KV_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
PROBES = (
    {"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 4},
    {"hidden_size": 1536, "num_attention_heads": 24, "num_hidden_layers": 6},
)


def _first_kv(c: Any) -> tuple[str, int] | None:
    return next(((k, getattr(c, k)) for k in KV_KEYS if getattr(c, k, None) is not None), None)


def default_table(
    vllm: tuple[str, ...], only: frozenset[str] | None = None
) -> dict[str, tuple[str, dict[str, int | None]]]:
    """model type -> (class name, {field: the value its class fills, None if computed}) for the KV heads
    and head size a class fills unlike vLLM's generic rule, read with the class vLLM reads it with."""
    out: dict[str, tuple[str, dict[str, int | None]]] = {}
    for mt, cls in _classes(vllm, only):
        try:
            built = [cls.from_dict(dict(p)) for p in PROBES]
            kv = [_first_kv(c) for c in built]
            hd = [getattr(c, "head_dim", None) for c in built]
        except Exception:  # noqa: BLE001 - not importable, the probes do not build, or per-layer fields
            continue
        row: dict[str, int | None] = {}
        generic_kv = [p["num_attention_heads"] for p in PROBES]
        generic_hd = [p["hidden_size"] // p["num_attention_heads"] for p in PROBES]
        if all(x is not None for x in kv) and [x[1] for x in kv if x] != generic_kv:
            key, v = kv[0]  # type: ignore[misc]
            row[key] = v if all(x == kv[0] for x in kv) else None
        if all(isinstance(x, int) for x in hd) and hd != generic_hd:
            row["head_dim"] = hd[0] if hd[0] == hd[1] else None
        if row:
            out[mt] = (cls.__name__, row)
    return out


def text_types() -> dict[str, str]:
    """multimodal model type -> the model type of the text config class it nests."""
    from transformers import CONFIG_MAPPING

    out: dict[str, str] = {}
    for mt in _types():
        try:
            cls = CONFIG_MAPPING[mt]
        except Exception:  # noqa: BLE001
            continue
        sub = (getattr(cls, "sub_configs", None) or {}).get("text_config")
        t = getattr(sub, "model_type", None)
        if not t and sub is not None:  # an AutoConfig sub-config: the type the class gives a text_config
            try:  # written without one (Mistral3Config: mistral; LlavaOnevisionConfig: qwen2)
                made = getattr(cls.from_dict({"text_config": {}}), "text_config", None)
                t = getattr(made, "model_type", None)
            except Exception:  # noqa: BLE001 - the class needs more to build: no default type recorded
                t = None
        if isinstance(t, str) and t and t != mt:
            out[mt] = t
    return out


def render_defaults(rows: dict[str, tuple[str, dict[str, int | None]]]) -> list[str]:
    lines = [
        "#: model type -> (config class, {field: the value it fills where config.json leaves the field out,",
        "#: unlike vLLM's generic rule; None: computed from other fields, read through transformers})",
        "DEFAULTS: Mapping[str, tuple[str, Mapping[str, int | None]]] = {",
    ]
    for mt, (name, row) in rows.items():
        lines.append(f"    {mt!r}: ({name!r}, {{{', '.join(f'{k!r}: {v!r}' for k, v in row.items())}}}),")
    return [*lines, "}"]


def render_vllm(vllm: tuple[str, ...]) -> list[str]:
    lines = ["#: the model types vLLM 0.33 reads with its own config class (NOT_NULL and DEFAULTS from it)",
             "VLLM_TYPES: frozenset[str] = frozenset({"]
    row = "   "
    for mt in vllm:
        if len(row) + len(mt) + 4 > 110:
            lines.append(row)
            row = "   "
        row += f" {mt!r},"
    return [*lines, row, "})"]


def render_vllm_transformers(rows: dict[str, str]) -> list[str]:
    return [
        "#: the VLLM_TYPES vLLM 0.33 reads with a transformers class -> that class's transformers model type",
        "VLLM_TRANSFORMERS_CLASSES: Mapping[str, str] = {",
        *(f"    {mt!r}: {key!r}," for mt, key in rows.items()),
        "}",
    ]


def render_nulls(rows: dict[str, tuple[str, tuple[str, ...]]], texts: dict[str, str]) -> list[str]:
    lines = [
        "",
        "#: model type -> (config class, the fields deciding a cache it refuses as null)",
        "NOT_NULL: Mapping[str, tuple[str, tuple[str, ...]]] = {",
    ]
    for mt, (name, fs) in rows.items():
        one = f"    {mt!r}: ({name!r}, ({''.join(f'{f!r}, ' for f in fs).rstrip()})),"
        if len(one) <= 110:
            lines.append(one)
        else:
            lines.append(f"    {mt!r}: ({name!r}, (")
            row = "       "
            for f in fs:  # as many fields a line as fit
                if len(row) + len(f) + 4 > 110:
                    lines.append(row)
                    row = "       "
                row += f" {f!r},"
            lines += [row, "    )),"]
    lines += [
        "}",
        "#: multimodal model type -> the model type of its text config (a text_config without model_type)",
        "TEXT_TYPES: Mapping[str, str] = {",
        *(f"    {mt!r}: {t!r}," for mt, t in texts.items()),
        "}",
    ]
    return lines


def render(rows: dict[str, dict[str, str]], nulls: list[str]) -> str:
    import transformers

    lines = [
        f'"""Generated by scripts/gen_config_aliases.py from transformers {transformers.__version__}.',
        "",
        "Per model type, the config.json aliases (transformers' ``attribute_map``) that set a field",
        "deciding the cache and win over it when both are written; kvlayout's json reader applies them.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from collections.abc import Mapping",
        "",
        "#: model type -> {alias: target}",
        "ALIASES: Mapping[str, Mapping[str, str]] = {",
    ]
    for mt, row in rows.items():
        one = f"    {mt!r}: {{{', '.join(f'{a!r}: {t!r}' for a, t in row.items())}}},"
        if len(one) <= 110:
            lines.append(one)
        else:
            lines += [f"    {mt!r}: {{", *(f"        {a!r}: {t!r}," for a, t in row.items()), "    },"]
    lines.append("}")
    return "\n".join([*lines, *nulls]) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed table is stale")
    ap.add_argument("--only", help="with --check: these model types' null and default rows, the rest whole")
    args = ap.parse_args()
    if args.check and args.only:
        from kvlayout.models.config_aliases import ALIASES, DEFAULTS, NOT_NULL, TEXT_TYPES, VLLM_TYPES

        only = frozenset(args.only.split(","))
        vllm = VLLM_TYPES if only.isdisjoint(VLLM_TYPES) else vllm_types()  # vLLM imported only if needed
        got = null_table(vllm, only)
        want = {mt: NOT_NULL[mt] for mt in only if mt in NOT_NULL}
        got_d = default_table(vllm, only)
        want_d = {mt: (n, dict(r)) for mt, (n, r) in DEFAULTS.items() if mt in only}
        stale = [
            what for what, ok in (
                ("ALIASES", table() == ALIASES), ("TEXT_TYPES", text_types() == TEXT_TYPES),
                (f"NOT_NULL for {sorted(only)}: {got} != {want}", got == want),
                (f"DEFAULTS for {sorted(only)}: {got_d} != {want_d}", got_d == want_d),
            ) if not ok
        ]
        if stale:
            why = "; ".join(stale)
            print(f"{OUT} is stale ({why}): run python scripts/gen_config_aliases.py", file=sys.stderr)
            return 1
        return 0
    vllm = vllm_types()
    text = render(
        table(),
        [
            *render_nulls(null_table(vllm), text_types()),
            "",
            *render_defaults(default_table(vllm)),
            *render_vllm(vllm),
            *render_vllm_transformers(vllm_transformers_classes(vllm)),
            *render_vllm_aliases(vllm_alias_table(vllm)),
        ],
    )
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python scripts/gen_config_aliases.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
