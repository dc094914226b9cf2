"""Reading a model's ``config.json`` as vLLM 0.33 reads it: fields by path, dtypes, tp.

- Text config: a ``...ForConditionalGeneration`` config keeps the language model in
  ``text_config`` (vLLM's ``hf_text_config``).
- Model dtype: ``torch_dtype`` (or ``dtype``, newer transformers); vLLM's ``auto`` runs a
  float32 checkpoint in bfloat16 (the first dtype the GPU supports).
- KV cache dtype: ``auto`` is the model dtype, ``fp8``/``fp8_e4m3`` float8_e4m3fn,
  ``fp8_e5m2`` float8_e5m2.

A missing field or a field of the wrong type is a :class:`~kvlayout.SpecError` naming its
path (``config.num_key_value_heads``, ``config.text_config.head_dim``), never a guess.
"""

from __future__ import annotations

import copy
import importlib.util
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import SpecError, short, spec_error
from ..validate import is_int, read_json_file

MODEL_DTYPES = ("bfloat16", "float16", "float32")
#: A bound on ``num_hidden_layers`` (the largest published model has a few hundred): planning a
#: config is linear in its layers, 10,000 take about a second on a CPU core (100,000 took 6-17 s).
MAX_CONFIG_LAYERS = 10_000
#: A bound on every integer read from a config (and on tp and block_size): 2**53, the largest
#: integer a JSON number holds exactly. Products of bounded fields stay far from the interpreter's
#: 4,300-digit limit on printing an integer (a 2,200-digit conv_dim crashed a note's f-string).
MAX_CONFIG_INT = 2**53
#: Bounds on what a config hands transformers' config class (the ``transformers`` and ``auto`` readers):
#: its classes build lists from counts (Cohere2-MoE's ``range(num_hidden_layers - first_k_dense_replace)``
#: took 115 s and 879 MB at -30,000,000; issue 25, tenth pass). An integer's magnitude is at most
#: 2**20 but where its name says it is a token id, vocabulary, position, length or rope theta; a list
#: holds at most :data:`MAX_CONFIG_LAYERS` items.
MAX_TRANSFORMERS_INT = 2**20
_LARGE_INT_NAMES = ("token", "vocab", "position", "length", "seq_len", "theta", "pixels", "_index", "_id")
#: model types whose transformers config class refuses a ``hidden_size`` that ``num_attention_heads`` does not
#: divide, ``head_dim`` written or not (their ``validate_architecture``; vLLM 0.33 reads the config through
#: the class, so it refuses it too). Probed from transformers 5.20.2 (every class of ``CONFIG_MAPPING``
#: built with hidden 4096, 7 heads, head_dim 128); tests/test_models_validation_s16.py probes it again.
HEADS_DIVIDE_HIDDEN: frozenset[str] = frozenset({
    "altclip_text_model", "altclip_vision_model", "arcee", "aria_text", "canary_decoder",
    "chinese_clip_text_model", "chinese_clip_vision_model", "clip_text_model", "clip_vision_model",
    "clipseg_text_model", "clipseg_vision_model", "cosmos3_edge_text", "cvt", "cwm", "deepseek_ocr2_text",
    "deepseek_v2", "dinat", "donut-swin", "esmc", "eurobert", "florence_vision", "gemma2", "gemma3_text",
    "gemma3n_text", "higgs_audio_v2", "hrm_text", "hyperclovax", "jais2", "llama", "maskformer-swin",
    "metaclip_2_text_model", "metaclip_2_vision_model", "minicpm3", "muse_glimmer_text", "muse_spark_text",
    "neucodec", "qwen2_vl_vision", "swin", "swin2sr", "swinv2", "t5_gemma_module", "t5gemma2_decoder",
    "t5gemma2_text", "tipsv2_text_model", "ultrabert", "unlimited_ocr_text", "unlimited_ocr_vision_encoder",
    "vaultgemma", "xcodec2",
})
KV_DTYPES: Mapping[str, str | None] = {
    "auto": None,
    "bfloat16": "bfloat16",
    "float16": "float16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


class Config:
    """A JSON object read field by field; a missing or mistyped field names its path."""

    def __init__(
        self,
        data: Mapping[str, Any],
        path: str,
        *,
        completed: bool = False,
        model_type: str | None = None,
        notes: list[str] | None = None,
        final: bool | None = None,
    ) -> None:
        self.data = data
        self.path = path
        self.completed = completed  # built by transformers' class: its defaults are in, none to add
        # no reader left to try (the transformers reader ran): a missing field is refused without a hint
        self.final = completed if final is None else final
        # the transformers class it is read as: its own model_type, else the one its parent's class nests
        mt = data.get("model_type")
        self.model_type = REMOTE_PARENTS.get(mt, mt) if isinstance(mt, str) else model_type
        self.notes = [] if notes is None else notes  # where a class default read is said

    def class_default(self, key: str) -> int | None:
        """The value transformers' config class fills for ``key`` where config.json leaves it out, if it
        differs from vLLM's generic rule (:data:`.config_aliases.DEFAULTS`: MistralConfig's 8 KV heads);
        None where the class fills none or the config was read through transformers. A value the class
        computes from other fields is a :class:`MissingField` (the default reader asks transformers)."""
        from .config_aliases import DEFAULTS, TEXT_TYPES

        if self.completed or self.model_type is None or key in self.data:
            return None  # a null written is read as absent by the generic rule, as those classes keep it
        mt = self.model_type
        if mt not in DEFAULTS and "text_config" not in self.data:
            # a multimodal config written flat (Qwen2-VL's published shape): its class builds the text config
            # from these fields, and vLLM reads that one (get_text_config)
            mt = TEXT_TYPES.get(mt, mt)
        name, row = DEFAULTS.get(mt, ("", {}))
        if key not in row:
            return None
        value = row[key]
        lib = _library(mt)
        if value is None:
            raise self.missing(key, f"{_possessive(lib)} {name} computes it from other fields")
        self.notes.append(f"{self.field(key)} left out: {name}'s default, {value} ({lib}), as vLLM reads it")
        return value

    def field(self, key: str) -> str:
        return f"{self.path}.{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def missing(self, key: str, why: str) -> SpecError:
        mt = self.model_type
        if key != "architectures" and mt is not None and not _transformers_reads(mt):
            # transformers' class is not the one vLLM reads it with: no reader of kvlayout's has its defaults
            own = f"; vLLM 0.33 reads model_type {mt!r} with its own config class: write it"
            return spec_error(self.field(key), None, f"missing; {why}{own}")
        if not self.final and key != "architectures":
            hint = "; reader='transformers' fills the config class's defaults, as vLLM does"
            err = spec_error(self.field(key), None, f"missing; {why}{hint}")
            return MissingField(str(err), field=err.field, value=None)
        return spec_error(self.field(key), None, f"missing; {why}")

    def req_int(self, key: str, why: str, *, lo: int = 1) -> int:
        """A required integer ``>= lo``."""
        if not self.has(key):
            raise self.missing(key, why)
        return self._int(key, self.data[key], lo)

    def opt_int(self, key: str, *, lo: int = 1) -> int | None:
        return self._int(key, self.data[key], lo) if self.has(key) else None

    def _int(self, key: str, v: Any, lo: int) -> int:
        if not is_int(v):
            raise spec_error(self.field(key), v, "must be an integer")
        if v < lo:
            raise spec_error(self.field(key), v, f"must be at least {lo}")
        if v > MAX_CONFIG_INT:
            raise spec_error(self.field(key), v, "must be at most 2**53")
        return int(v)

    def req_str(self, key: str, why: str) -> str:
        if not self.has(key):
            raise self.missing(key, why)
        v = self.data[key]
        if not isinstance(v, str):
            raise spec_error(self.field(key), v, "must be a string")
        return v

    def req_bool(self, key: str, why: str) -> bool:
        if key not in self.data:
            raise self.missing(key, why)
        v = self.data[key]
        if not isinstance(v, bool):
            raise spec_error(self.field(key), v, "must be true or false")
        return v

    def req_list(self, key: str, why: str, n: int, kind: type, *, exact: bool = False) -> list[Any]:
        """A required list of at least ``n`` items of type ``kind`` (the first ``n`` are returned);
        ``exact``: exactly ``n`` (``layer_types``: transformers refuses another length)."""
        if not self.has(key):
            raise self.missing(key, why)
        v = self.data[key]
        if not isinstance(v, list):
            raise spec_error(self.field(key), v, "must be a list")
        if exact and len(v) != n:
            raise spec_error(self.field(key), f"{len(v)} items", f"needs exactly one item per layer ({n})")
        if len(v) < n:
            raise spec_error(self.field(key), f"{len(v)} items", f"needs one item per layer ({n})")
        for i, x in enumerate(v[:n]):
            ok = is_int(x) if kind is int else isinstance(x, kind)
            if not ok:
                raise spec_error(
                    f"{self.field(key)}[{i}]", x, f"must be {'an integer' if kind is int else 'a string'}"
                )
        return list(v[:n])


#: Largest config.json read from a file: published ones are a few KB (the largest of tests/fixtures: 4 KB;
#: a long quantization ignore list, tens of KB); a 22 MB file of junk keys took 15 s and 500 MB to refuse
#: (issue 25, seventeenth pass), 2 MiB under a second
MAX_CONFIG_BYTES = 2 * 2**20


def load_config(config: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    data = (
        read_json_file(SpecError, "config file", str(config), MAX_CONFIG_BYTES)
        if isinstance(config, (str, Path))
        else config
    )
    if not isinstance(data, Mapping):
        raise spec_error("config", type(data).__name__, "must be a JSON object (a model's config.json)")
    _check_depth(data)
    return data


#: how deep a config may nest (published ones: 3 or 4 levels); deeper is refused before any recursive read
MAX_CONFIG_DEPTH = 64


def _check_depth(data: Mapping[str, Any]) -> None:
    """Refuse, naming the field, a config nested deeper than :data:`MAX_CONFIG_DEPTH` (a dict from
    Python may be nested past the interpreter's recursion limit, or hold itself): walked without
    recursion and only through containers, so the check itself is bounded."""
    # (container, depth, the key that led to it, its parent's entry): the path is built only to refuse
    stack: list[tuple[Any, int, object, Any]] = [(data, 0, None, None)]
    while stack:
        entry = stack.pop()
        value, depth = entry[0], entry[1]
        if depth >= MAX_CONFIG_DEPTH:
            keys: list[object] = []
            node = entry
            while node[3] is not None:
                keys.append(node[2])
                node = node[3]
            top = reversed(keys[-3:])
            path = "config" + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in top)
            raise spec_error(
                f"{path}...", f"{MAX_CONFIG_DEPTH} levels deep", "a config nests at most that deep"
            )
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        stack.extend((v, depth + 1, k, entry) for k, v in items if isinstance(v, (Mapping, list, tuple)))


READERS = ("auto", "json", "transformers")


class MissingField(SpecError):
    """A field a config read as written leaves out, which its transformers config class may fill (the
    ``auto`` reader then reads it through transformers)."""


def transformers_installed() -> bool:
    """Whether transformers can be imported (looked up, not imported: seconds)."""
    return importlib.util.find_spec("transformers") is not None


def _library(model_type: str) -> str:
    """Whose config class vLLM 0.33 reads ``model_type`` with: its own (:data:`.config_aliases.VLLM_TYPES`)
    or transformers'."""
    from .config_aliases import VLLM_TYPES

    return "vLLM" if model_type in VLLM_TYPES else "transformers"


def _transformers_reads(model_type: str) -> str | None:
    """The transformers model type whose class vLLM 0.33 reads ``model_type`` with, or None where vLLM's
    own class reads it (:data:`.config_aliases.VLLM_TRANSFORMERS_CLASSES`: ``deepseek_v32`` as
    ``deepseek_v3``)."""
    from .config_aliases import VLLM_TRANSFORMERS_CLASSES

    return model_type if _library(model_type) == "transformers" else VLLM_TRANSFORMERS_CLASSES.get(model_type)


def _possessive(library: str) -> str:
    return "transformers'" if library == "transformers" else f"{library}'s"


#: remote-code config classes (a model type transformers lacks) that subclass a transformers class and add
#: no field deciding a cache: read as that class (XiaomiMiMo's MiMoConfig is a Qwen2Config with MTP fields)
REMOTE_PARENTS: Mapping[str, str] = {"mimo": "qwen2"}


def through_transformers(data: Mapping[str, Any], notes: list[str]) -> tuple[Mapping[str, Any], bool]:
    """``data`` as transformers' config class for its ``model_type`` makes it (vLLM's ``get_config``):
    its defaults filled in, ``text_config`` nested and completed, derived fields (``layer_types``)
    and the class's ``attribute_map`` aliases (``num_attention_heads`` for GPT-2's ``n_head``)
    written; and whether that class built it. Needs the ``models`` extra (transformers, the version
    vLLM 0.33 pins). A model type transformers does not know is read as written, with a note; so is
    one vLLM 0.33 reads with its own class (:data:`.config_aliases.VLLM_TYPES`: transformers' class,
    where it has one, fills other defaults), as the json reader reads it (that class's KV heads and
    head size where left out)."""
    model_type = data.get("model_type")
    for cfg, where in ((data, "config"), (data.get("text_config"), "config.text_config")):
        n = cfg.get("num_hidden_layers") if isinstance(cfg, Mapping) else None
        if is_int(n) and not 0 <= int(n) <= MAX_CONFIG_LAYERS:  # type: ignore[arg-type]  # per-layer lists
            raise spec_error(f"{where}.num_hidden_layers", n, f"must be between 0 and {MAX_CONFIG_LAYERS:,}")
    _bounded_for_transformers(data, "config")  # before transformers is imported (seconds)
    if not isinstance(model_type, str):  # no class to look up: transformers is not imported (seconds)
        notes.append(f"model_type {model_type!r} is not a transformers config class: read as written")
        return data, False
    read_as = _transformers_reads(model_type)
    if read_as is None:
        notes.append(
            f"model_type {model_type!r}: vLLM 0.33 reads it with its own config class, not transformers': "
            "read as written"
        )
        return written_aliases(data, notes), False
    try:
        from transformers import CONFIG_MAPPING
    except ImportError as e:
        raise spec_error(
            "reader", "transformers", "transformers is not installed: pip install 'kvlayout[models]'"
        ) from e
    parent = REMOTE_PARENTS.get(model_type)
    if parent is not None and model_type not in CONFIG_MAPPING:
        said = f"model_type {model_type!r} read as transformers' {parent!r} class (its own is a subclass)"
        notes.append(said)
        model_type = read_as = parent
    if read_as not in CONFIG_MAPPING:
        if not _remote_code(data):  # AutoConfig.from_pretrained: "does not recognize this architecture"
            why = (
                "no transformers config class has this model_type, and config.json names no remote code "
                "(auto_map.AutoConfig): vLLM 0.33's AutoConfig refuses it"
            )
            raise spec_error("config.model_type", model_type, why)
        notes.append(f"model_type {model_type!r} is not a transformers config class: read as written")
        return data, False
    cls = CONFIG_MAPPING[read_as]
    try:
        with _transformers_log(notes):
            out = cls.from_dict(copy.deepcopy(dict(data))).to_dict()  # it rewrites nested dicts in place
    except Exception as e:  # transformers refuses the config: its message names the field
        raise _transformers_refusal(data, cls, model_type, e) from e
    if read_as != model_type:  # the class vLLM reads it with, under the model type written
        out["model_type"] = model_type
        said = f"read through transformers' {cls.__name__}, the class vLLM 0.33 reads {model_type!r} with"
        notes.append(said)
    else:
        notes.append(f"read through transformers' {cls.__name__}")
    # the class's aliases, as vLLM reads them (GPT-2's num_attention_heads is its n_head)
    aliases = getattr(cls, "attribute_map", None)
    for alias, target in aliases.items() if isinstance(aliases, Mapping) else ():
        if out.get(alias) is None and isinstance(alias, str) and isinstance(target, str) and target in out:
            out[alias] = out[target]
    return _keep_written(out, data), True


def _remote_code(data: Mapping[str, Any]) -> bool:
    """Whether config.json names a remote-code config class (``auto_map.AutoConfig``), which vLLM 0.33
    loads with ``--trust-remote-code`` whatever its ``model_type``."""
    auto_map = data.get("auto_map")
    return isinstance(auto_map, Mapping) and "AutoConfig" in auto_map


def check_model_type(data: Mapping[str, Any]) -> None:
    """Refuse a ``model_type`` written that is not a non-empty string where config.json names no remote
    code: vLLM 0.33 picks the config class by it (``HFConfigParser.parse`` ->
    ``AutoConfig.from_pretrained``: "Unrecognized model ... Should have a `model_type` key"). Every
    reader; transformers is not imported."""
    mt = data.get("model_type")
    if isinstance(mt, str) and mt or "model_type" not in data or _remote_code(data):
        # absent: still read by the architecture's rule (many small configs of kvlayout's tests write none;
        # vLLM refuses them: left open, issue 25 sixteenth pass)
        return
    why = "vLLM 0.33 picks the config class by it (AutoConfig): a non-empty string, e.g. 'llama'"
    raise spec_error("config.model_type", mt, why)


def _transformers_refusal(data: Mapping[str, Any], cls: type, model_type: str, e: Exception) -> SpecError:
    """transformers' refusal of ``data`` as one line naming the field and the value written (its strict
    validation names the field it checked: the value is read from config.json, under the name written
    where the class reads it by an alias, e.g. ``rope_scaling`` for ``rope_parameters``)."""
    import re

    lines = [" ".join(x.split()) for x in str(e).splitlines() if x.strip()]
    cause = lines[-1] if lines else type(e).__name__
    whose = f"transformers refuses it ({cls.__name__}, vLLM 0.33's class for model_type {model_type!r})"
    m = re.match(r"Validation error for field '([^']+)'", lines[0] if lines else "")
    if m is None:
        return spec_error("config", model_type, f"{whose}: {cause}")
    name = m.group(1)
    written = [name] if name in data else []
    aliases = getattr(cls, "attribute_map", None)
    if not written and isinstance(aliases, Mapping):
        written = [k for k, v in aliases.items() if v == name and k in data]
    if not written and name == "rope_parameters":  # transformers builds it from the legacy fields
        written = [k for k in ("rope_scaling", "rope_theta") if k in data]
    if not written:
        return spec_error(f"config.{name}", "as transformers builds it", f"{whose}: {cause}")
    if len(cause) > 300:  # a union's message lists every member's error
        cause = cause[:300] + "..."
    return spec_error(f"config.{written[0]}", data[written[0]], f"{whose}: {cause}")


def check_with_transformers(data: Mapping[str, Any]) -> str | None:
    """Refuse, naming the field and the value, a config transformers' config class refuses (its strict
    field types and validators: ``LlamaConfig.validate_architecture``, ``validate_rope``'s even rotary
    dimension, ...), as vLLM 0.33 reads it through that class and fails to load it. Nothing where
    transformers is not installed (the ``models`` extra) or vLLM reads the type with its own class; a
    note where a value too large to hand transformers safely left the check out (the json reader's
    checks stand)."""
    if not transformers_installed():
        return None
    try:
        _bounded_for_transformers(data, "config")
    except SpecError as e:
        return f"transformers' check of the config left out: {e} (the json reader's checks stand)"
    through_transformers(data, [])
    return None


def written_aliases(
    data: Mapping[str, Any], notes: list[str], where: str = "config", model_type: str | None = None
) -> Mapping[str, Any]:
    """``data`` as its transformers config class reads it, for the json reader (:mod:`.config_aliases`,
    generated from transformers): an alias written sets its target, over a target written beside it
    (GLM-4 MoE Lite's ``head_dim`` is its ``qk_rope_head_dim`` in transformers, hence in vLLM 0.33; the
    json reader planned the written ``qk_rope_head_dim``: issue 25, tenth pass); a ``null`` the class
    refuses is refused, naming the field (Mixtral's ``num_key_value_heads: null`` was read as absent, where
    transformers, hence vLLM, refuses the config). Its ``text_config`` too, by its own model type, or the
    one its parent's class nests where it writes none. ``model_type``: the type to read ``data`` as where
    it writes none."""
    from .config_aliases import ALIASES, NOT_NULL, TEXT_TYPES, VLLM_ALIASES, VLLM_TYPES

    out = dict(data)
    mt = out.get("model_type")
    mt = REMOTE_PARENTS.get(mt, mt) if isinstance(mt, str) else model_type
    tc = out.get("text_config")
    if isinstance(tc, Mapping):
        out["text_config"] = written_aliases(
            tc, notes, f"{where}.text_config", TEXT_TYPES.get(mt) if mt is not None else None
        )
    if mt is None:
        return out
    name, refused = NOT_NULL.get(mt, ("", ()))
    for key in refused:
        if key in out and out[key] is None:
            whose = _possessive(_library(mt))
            why = (
                f"{whose} {name} refuses null for it, and so vLLM 0.33 refuses the config: write a "
                "value, or leave the field out for the class default"
            )
            raise spec_error(f"{where}.{key}", None, why)
    rows = VLLM_ALIASES.get(mt, {}) if mt in VLLM_TYPES else ALIASES.get(mt, {})
    for alias, target in rows.items():
        value = out.get(alias)
        lo = 0 if "window" in alias else 1  # a window of 0 is none; the others are sizes and counts, or lists
        sized = target not in ("layer_types", "layers_block_type")
        if value is not None and sized and (isinstance(value, bool) or not is_int(value) or value < lo):
            # checked under the name written: the target's own check would name a field written otherwise
            why = f"must be an integer of at least {lo}: {mt}'s alias of {target} (transformers sets it)"
            raise spec_error(f"{where}.{alias}", value, why)
        if value is not None and (out.get(target) != value or type(out.get(target)) is not type(value)):
            was = "" if target not in out else f" (written: {out[target]!r})"
            notes.append(
                f"{where}.{alias} is {mt}'s alias of {target} in transformers: {target} = {out[alias]!r}"
                f"{was}, as vLLM reads it"
            )
            out[target] = out[alias]
    # an alias left out reads its target, as the class's attribute does (ChatGLM's num_hidden_layers is the
    # num_layers written: vLLM 0.33's ChatGLMConfig); the json reader refused it as missing (issue 23)
    for alias, target in rows.items():
        if alias not in out and out.get(target) is not None:  # (a null alias is read as not written)
            out[alias] = out[target]
    return out


def _bounded_for_transformers(value: Any, where: str, key: str = "") -> None:
    """Refuse, naming the field, what could make a transformers config class build huge lists."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            _bounded_for_transformers(v, f"{where}.{k}", str(k))
    elif isinstance(value, list):
        if len(value) > MAX_CONFIG_LAYERS:
            why = f"read through transformers, a list holds at most {MAX_CONFIG_LAYERS:,} items"
            raise spec_error(where, f"a list of {len(value):,} items", why)
        for i, v in enumerate(value):
            _bounded_for_transformers(v, f"{where}[{i}]", key)
    elif (
        is_int(value)
        and not isinstance(value, bool)
        and abs(int(value)) > MAX_TRANSFORMERS_INT
        and not any(n in key.lower() for n in _LARGE_INT_NAMES)
    ):
        why = (
            f"read through transformers, an integer is at most {MAX_TRANSFORMERS_INT:,} in magnitude "
            "(its config class may build a list that long)"
        )
        raise spec_error(where, value, why)


#: one read through transformers at a time (its logger is swapped for the read: _transformers_log)
_TRANSFORMERS_READ = threading.RLock()


@contextmanager
def _transformers_log(notes: list[str]) -> Iterator[None]:
    """transformers' own log records and warnings of a config read, taken as notes: its logger writes to
    stderr, and the command line's error is one line (issue 25, tenth pass). The logger is restored.
    One such read at a time (a lock: two threads swapping the logger left kvlayout's handler on it, and
    each read's notes in the other's; issue 25, eleventh pass); another thread's record during a read goes
    where the logger would have sent it. Warnings are caught process-wide for the read's length."""
    import logging
    import warnings

    me = threading.get_ident()
    logger = logging.getLogger("transformers")

    class _Notes(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.thread == me:
                notes.append(f"transformers: {' '.join(record.getMessage().split())}")
                return
            for handler in saved[0]:  # another thread's record: where it would have gone
                if record.levelno >= handler.level:
                    handler.handle(record)
            if saved[1] and logger.parent is not None:
                logger.parent.handle(record)

    with _TRANSFORMERS_READ:
        saved = (logger.handlers[:], logger.propagate)
        logger.handlers, logger.propagate = [_Notes(logging.WARNING)], False
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield
            notes.extend(f"transformers: {' '.join(str(w.message).split())}" for w in caught)
        finally:
            logger.handlers, logger.propagate = saved


def _keep_written(made: Mapping[str, Any], written: Mapping[str, Any]) -> dict[str, Any]:
    """``made`` (transformers' dict) with the fields of ``written`` it dropped or left None put back
    (vLLM keeps them as attributes of the config: ``compress_ratios``, Nemotron-H's layer count)."""
    out = dict(made)
    for key, value in written.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _keep_written(out[key], value)
        elif out.get(key) is None:
            out[key] = value
    return out


def text_config(top: Config) -> Config:
    tc = top.data.get("text_config")
    if tc is None:
        return top
    if not isinstance(tc, Mapping):
        raise spec_error(top.field("text_config"), tc, "must be a JSON object")
    from .config_aliases import TEXT_TYPES

    nested = TEXT_TYPES.get(top.model_type) if top.model_type is not None else None
    return Config(
        tc,
        top.field("text_config"),
        completed=top.completed,
        model_type=nested,
        notes=top.notes,
        final=top.final,
    )


# --------------------------------------------------------------------------- dtypes and tp
#: model types vLLM 0.33 does not run in float16 (``vllm/config/model.py``, ``_FLOAT16_NOT_SUPPORTED_MODELS``,
#: "numerical instability"): dtype auto runs a float16 checkpoint in bfloat16 (``_resolve_auto_dtype``: the
#: first of the CUDA platform's supported dtypes it allows), and dtype float16 is refused
#: (``_check_valid_dtype``); read from the config's own (top-level) model_type
FLOAT16_NOT_SUPPORTED = ("gemma2", "gemma3", "gemma3_text", "glm4")


def resolve_model_dtype(top: Config, text: Config, dtype: str | None, notes: list[str]) -> str:
    """The dtype vLLM 0.33 runs the model in (``_get_and_verify_dtype`` on a CUDA GPU)."""
    mt = top.data.get("model_type")
    no_fp16 = isinstance(mt, str) and mt in FLOAT16_NOT_SUPPORTED
    if dtype is not None and dtype != "auto":
        if dtype not in MODEL_DTYPES:
            raise spec_error("dtype", dtype, f"valid: auto, {', '.join(MODEL_DTYPES)}")
        if dtype == "float16" and no_fp16:
            why = (
                f"vLLM 0.33 does not run model_type {mt!r} in float16 (_FLOAT16_NOT_SUPPORTED_MODELS: "
                "numerical instability); valid: auto, bfloat16, float32"
            )
            raise spec_error("dtype", dtype, why)
        return dtype
    for cfg in (top, text):
        for key in ("dtype", "torch_dtype"):  # transformers keeps dtype where both are written
            if cfg.has(key):
                raw = cfg.data[key]
                if raw not in MODEL_DTYPES:
                    raise spec_error(
                        cfg.field(key), raw, f"valid: {', '.join(MODEL_DTYPES)} (or pass dtype=)"
                    )
                if raw == "float32":
                    notes.append("float32 checkpoint: vLLM's dtype auto runs it in bfloat16")
                    return "bfloat16"
                if raw == "float16" and no_fp16:
                    notes.append(
                        f"float16 checkpoint of model_type {mt!r}: vLLM 0.33's dtype auto runs it in "
                        "bfloat16 (float16 is not supported for it: _FLOAT16_NOT_SUPPORTED_MODELS)"
                    )
                    return "bfloat16"
                return str(raw)
    # vLLM (ModelArchConfigConvertorBase.get_torch_dtype, _resolve_auto_dtype): no dtype in the config
    # (gpt-oss) and no safetensors metadata to read is float32, which dtype auto runs in bfloat16 on CUDA
    notes.append(
        "no torch_dtype in the config: vLLM reads the weights' dtype from safetensors, else runs it "
        "in bfloat16 (assumed here; pass dtype= for the weights' dtype)"
    )
    return "bfloat16"


def resolve_kv_dtype(kv_cache_dtype: str | None, model_dtype: str) -> str:
    """The cache's dtype: ``auto`` is the model's; an explicit float16 / bfloat16 must be the model's own
    (vLLM 0.33's ``VllmConfig`` refuses another: ``_reject_mismatched_float_kv_cache``, pass 25)."""
    key = "auto" if kv_cache_dtype is None else kv_cache_dtype
    if key not in KV_DTYPES:
        raise spec_error("kv_cache_dtype", kv_cache_dtype, f"valid: {', '.join(KV_DTYPES)}")
    if key in ("float16", "bfloat16") and key != model_dtype:
        allowed = f"auto or {model_dtype}" if model_dtype in ("float16", "bfloat16") else "auto"
        why = f"vLLM 0.33 refuses it beside the model's dtype {model_dtype} (valid: {allowed})"
        raise spec_error("kv_cache_dtype", kv_cache_dtype, why)
    return KV_DTYPES[key] or model_dtype


#: ModelOpt's KV cache algorithms (lowercased) -> the cache dtype vLLM 0.33 makes an ``auto`` cache
#: (``vllm/utils/torch_utils.py``, ``MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP``): ``nvfp4`` is not planned here
_MODELOPT_KV = {"fp8": "fp8_e4m3"}

#: a ModelOpt producer's ``quant_algo`` (uppercased) -> the ``quant_method`` vLLM 0.33's ModelConfig writes
#: (``ModelArchConfigConvertorBase._normalize_quantization_config``); another algorithm raises there
_MODELOPT_METHODS = {
    "FP8": "modelopt",
    "FP8_PER_CHANNEL_PER_TOKEN": "modelopt",
    "FP8_PB_WO": "modelopt",
    "NVFP4": "modelopt_fp4",
    "MIXED_PRECISION": "modelopt_mixed",
}


def _normalized(holder: Mapping[str, Any], at: str) -> tuple[dict[str, Any], str] | None:
    """One config's quantization dict as vLLM 0.33's ModelConfig rewrites it before anything reads it
    (a copy; vLLM edits its own in place): ``quantization_config``, else ``compression_config``; a ModelOpt
    producer (``producer.name`` ``modelopt``, or the legacy ``quantization.modelopt_quant_config``) with a
    ``quantization.quant_algo`` sets ``quant_method`` from the algorithm, whatever it said; then
    ``quant_method`` is lowercased and ``compressed_tensors`` spelled ``compressed-tensors``."""
    key = "quantization_config" if holder.get("quantization_config") is not None else "compression_config"
    raw = holder.get(key)
    if raw is None:
        return None
    where = f"{at}.{key}"
    if not isinstance(raw, Mapping):
        raise spec_error(where, raw, "must be an object (vLLM 0.33 reads its quant_method)")
    qc = dict(raw)
    if key == "quantization_config":
        producer: Any = qc.get("producer", {})
        if not isinstance(producer, Mapping):
            why = "must be an object (vLLM 0.33's ModelConfig reads producer.name)"
            raise spec_error(f"{where}.producer", producer, why)
        inner: Any = qc.get("quantization", {})
        legacy = isinstance(inner, Mapping) and "modelopt_quant_config" in inner
        if producer.get("name") == "modelopt" or legacy:
            if not isinstance(inner, Mapping):
                why = "must be an object (vLLM 0.33 reads a ModelOpt producer's quant_algo from it)"
                raise spec_error(f"{where}.quantization", inner, why)
            algo = inner.get("quant_algo")
            if algo is not None:
                if str(algo).upper() not in _MODELOPT_METHODS:
                    valid = ", ".join(_MODELOPT_METHODS)
                    why = f"vLLM 0.33 raises 'Unknown ModelOpt quant algo' (valid: {valid})"
                    raise spec_error(f"{where}.quantization.quant_algo", algo, why)
                qc["quant_method"] = _MODELOPT_METHODS[str(algo).upper()]
    method = qc.get("quant_method", "")
    if not isinstance(method, str):
        raise spec_error(f"{where}.quant_method", method, "must be a string (vLLM 0.33 lowercases it)")
    qc["quant_method"] = method.lower().replace("compressed_tensors", "compressed-tensors")
    return qc, where


def quant_config(data: Mapping[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The quantization config vLLM 0.33 quantizes the model by, normalised (``_normalized``), and the
    field it was written in: the top config's (``ModelConfig``), else a multimodal ``text_config``'s.

    The layers' quant config is read by ``get_quant_config`` in another order (``quantization_config``,
    ``text_config.quantization_config``, ``compression_config``): where the two orders part (a
    ``compression_config`` beside a text config's ``quantization_config``, or only a text config's
    ``compression_config``, which ``get_quant_config`` does not read) the config is refused by name."""
    found = _normalized(data, "config")
    text = data.get("text_config")
    inner = text if isinstance(text, Mapping) and text else None
    if found is not None:
        if found[1] == "config.compression_config" and inner and inner.get("quantization_config") is not None:
            why = (
                "vLLM 0.33 takes the method from it but the layers' config from text_config's "
                "quantization_config (get_quant_config): not planned; write one of them"
            )
            raise spec_error(found[1], "set", why)
        return found
    if inner is None:
        return None
    found = _normalized(inner, "config.text_config")
    if found is not None and found[1].endswith(".compression_config"):
        why = (
            "vLLM 0.33 takes the method from it, but its get_quant_config reads no text config's "
            "compression_config: not planned; write it as quantization_config"
        )
        raise spec_error(found[1], "set", why)
    return found


def quantized_kv_cache(data: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The cache dtype a checkpoint's quantization config (``quant_config``, normalised as vLLM 0.33's
    ModelConfig does) makes vLLM 0.33 use for a ``--kv-cache-dtype`` left ``auto``, the note that says so,
    and the field whose fp8 only standard ``Attention`` layers take (``""``: every layer); None where it
    sets none.

    - ModelOpt (``quant_method`` starting ``modelopt``) in the top config's ``quantization_config``, the
      one ``resolve_kv_cache_dtype_string`` reads: ``EngineArgs.create_engine_config`` ->
      ``get_kv_cache_quant_algo_string`` reads the first truthy of ``quantization.kv_cache_scheme``,
      ``kv_cache_scheme``, ``quantization.kv_cache_quant_algo``, ``kv_cache_quant_algo``: ``FP8`` (any
      case), or a scheme ``{num_bits: 8, type: float, dynamic: false}``, is ``fp8_e4m3`` for the whole
      engine; a value neither string nor object is no algorithm (the model's dtype), except under
      ``quantization``, where ModelOpt's own config raises 'kv_cache_quant_algo must be a string'.
    - compressed-tensors: a ``kv_cache_scheme`` (wherever the config is written) makes every ``Attention``
      layer's ``auto`` cache ``fp8`` (``Attention.__init__``;
      ``CompressedTensorsKVCacheMethod.validate_kv_cache_scheme`` refuses any but 8-bit float, symmetric,
      per tensor or per head).

    NVFP4 and what vLLM falls back from (an unknown algorithm: ``auto`` with a warning, while ModelOpt's own
    config still quantizes the cache) are refused, naming the field."""
    found = quant_config(data)
    if found is None:
        return None
    qc, where = found
    method = qc["quant_method"]
    if method.startswith("modelopt"):
        _modelopt_algo_type(qc, where)
        # only the top config's quantization_config sets the engine's cache dtype; ModelOpt's config has no
        # kv_cache_scheme for Attention.__init__ to read
        return _modelopt_kv(qc, where) if where == "config.quantization_config" else None
    if method == "compressed-tensors" and qc.get("kv_cache_scheme") is not None:
        scheme = qc["kv_cache_scheme"]
        at = f"{where}.kv_cache_scheme"
        ok = (
            isinstance(scheme, Mapping)
            and scheme.get("type") == "float"
            and scheme.get("num_bits") == 8
            and scheme.get("strategy") in ("tensor", "attn_head")
            and bool(scheme.get("symmetric"))
        )
        if not ok:
            why = (
                "vLLM 0.33's compressed-tensors KV cache takes only num_bits 8, type float, strategy tensor "
                "or attn_head, symmetric (CompressedTensorsKVCacheMethod refuses another)"
            )
            raise spec_error(at, scheme, why)
        note = (
            f"{at} is set: vLLM 0.33's Attention layers store an auto KV cache as fp8 "
            "(compressed-tensors' FP8 KV cache)"
        )
        return "fp8", note, at
    return None


def _modelopt_algo_type(qc: Mapping[str, Any], where: str) -> None:
    """ModelOpt's ``from_config`` (vLLM 0.33): a ``quantization.kv_cache_quant_algo`` written, not null,
    must be a string."""
    inner = qc.get("quantization")
    if isinstance(inner, Mapping) and inner.get("kv_cache_quant_algo") is not None:
        algo = inner["kv_cache_quant_algo"]
        if not isinstance(algo, str):
            why = "must be a string (vLLM 0.33's ModelOpt config raises 'kv_cache_quant_algo must be a "
            why += "string')"
            raise spec_error(f"{where}.quantization.kv_cache_quant_algo", algo, why)


def kv_quant_layers(data: Mapping[str, Any]) -> tuple[bool, str] | None:
    """Where vLLM 0.33's checkpoint quant config gives attention layers a KV-cache method, which refuses
    an ``fp8_e5m2`` cache (``_init_kv_cache_quant``: 'fp8_e5m2 kv-cache is not supported with fp8
    checkpoints'): (whether MLA attention layers take it too, the method); None where none does.

    ``fp8`` (``Fp8Config``: ``Attention`` layers), ModelOpt's FP8 / NVFP4 / MXFP8 (``Attention`` and
    ``MLAAttention``), ModelOpt mixed precision with a KV cache algorithm (``Attention``), compressed-tensors
    with a ``kv_cache_scheme`` (``Attention``; a weight-only one keeps e5m2)."""
    found = quant_config(data)
    if found is None:
        return None
    qc, _ = found
    method = qc["quant_method"]
    if method == "fp8":
        return False, method
    if method in ("modelopt", "modelopt_fp4", "modelopt_mxfp8"):
        return True, method
    if method == "modelopt_mixed":
        inner = qc.get("quantization")
        if isinstance(inner, Mapping):
            algo = inner.get("kv_cache_quant_algo")
            return (False, method) if isinstance(algo, str) and algo else None
        scheme = qc.get("kv_cache_scheme")
        kv = isinstance(scheme, Mapping) and scheme.get("type") == "float" and scheme.get("num_bits") == 8
        return (False, method) if kv else None
    if method == "compressed-tensors" and qc.get("kv_cache_scheme") is not None:
        return False, method
    return None


def _modelopt_kv(qc: Mapping[str, Any], where: str) -> tuple[str, str, str] | None:
    """vLLM 0.33's ``get_kv_cache_quant_algo_string`` for a ModelOpt ``quantization_config``."""
    inner: Any = qc.get("quantization", qc)
    if not isinstance(inner, Mapping):
        why = "must be an object (vLLM 0.33 reads kv_cache_quant_algo from it)"
        raise spec_error(f"{where}.quantization", inner, why)
    field, algo = "", None
    order = ((inner, "kv_cache_scheme"), (qc, "kv_cache_scheme"), (inner, "kv_cache_quant_algo"),
             (qc, "kv_cache_quant_algo"))
    for holder, name_of in order:
        if holder.get(name_of):  # vLLM's `or` chain: the first truthy value
            at = where if holder is qc else f"{where}.quantization"
            field, algo = f"{at}.{name_of}", holder[name_of]
            break
    else:
        return None
    if not isinstance(algo, (str, Mapping)):  # vLLM maps neither: no algorithm, the model's dtype
        return None
    name: Any = algo
    if isinstance(algo, Mapping):
        if algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float":
            name = "fp8"
        elif algo.get("num_bits") == 4 and algo.get("type") == "float":
            name = "nvfp4"
        else:
            name = None
    key = name.lower() if isinstance(name, str) else None
    if key is None or key not in _MODELOPT_KV:
        cant = (
            "an NVFP4 KV cache, which kvlayout does not plan (vLLM 0.33: --kv-cache-dtype nvfp4)"
            if key == "nvfp4"
            else "not a KV cache algorithm vLLM 0.33 maps (FP8 or NVFP4): vLLM falls back to auto while "
            "ModelOpt's config reads it; kvlayout does not plan it"
        )
        raise spec_error(field, algo, f"{cant}; pass kv_cache_dtype (--kv-cache-dtype) to plan another")
    note = f"{field} = {short(algo)}: vLLM 0.33 stores an auto KV cache as {_MODELOPT_KV[key]} (ModelOpt)"
    return _MODELOPT_KV[key], note, ""


#: Families whose cache vLLM also accepts as ``fp8_ds_mla`` (DeepSeek's packed fp8 layout).
DS_MLA_FAMILIES = ("deepseek_v32", "deepseek_v4")


def check_kv_cache_dtype(kv_cache_dtype: object, family: str) -> str | None:
    """A ``--kv-cache-dtype`` vLLM 0.33 takes for ``family`` (None: ``auto``)."""
    if kv_cache_dtype is None:
        return None
    valid = [*KV_DTYPES, *(["fp8_ds_mla"] if family in DS_MLA_FAMILIES else [])]
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in valid:
        raise spec_error("kv_cache_dtype", kv_cache_dtype, f"valid: {', '.join(valid)}")
    return kv_cache_dtype


def check_tp(tp: object) -> int:
    if not is_int(tp) or not 1 <= int(tp) <= MAX_CONFIG_INT:  # type: ignore[call-overload]
        raise spec_error("tp", tp, "must be a positive integer, at most 2**53")
    return int(tp)  # type: ignore[call-overload]


def per_rank(cfg: Config, key: str, total: int, tp: int) -> int:
    """``total / tp`` where vLLM shards a dimension over tensor parallelism (it must divide)."""
    if total % tp:
        raise spec_error(cfg.field(key), total, f"not divisible by tp = {tp}")
    return total // tp
