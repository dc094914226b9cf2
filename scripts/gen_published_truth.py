"""vLLM 0.33's answers for the published configs of tests/fixtures/published/ (issue 23), pinned in
tests/fixtures/published/truth.json for tests/test_models_published_s16.py.

Each config is built by vLLM itself on the CPU (tests/test_models_hybrid_vllm.py's driver: ModelConfig from
the file as published, the model class from vLLM's registry constructed as rank 0 of tp N, its layers'
own ``get_kv_cache_spec``, vLLM's grouping and ``_pool_bytes_per_block``), on the meta device (the
weights of a published model do not fit this machine; the cache specs do not depend on them), at tp 1,
2 and 8 with a bf16 (``auto``) and an fp8 cache. The block size a case starts from is the attention
backend's that kvlayout resolves for the device (16 tokens for standard attention on Hopper and
Blackwell; an MLA backend's own: tests/test_models_backends.py checks that choice against vLLM's
priority lists), so a case is built once per distinct block size. An answer is vLLM's cache (block size,
groups, every layer's kind and pages, windows, bytes per block) or the error its construction raised.

    .venv/bin/python scripts/gen_published_truth.py            # writes truth.json, prints the table
    .venv/bin/python scripts/gen_published_truth.py --check    # compares only, writes nothing
    .venv/bin/python scripts/gen_published_truth.py --only a,b # builds configs a and b, keeps the other pins
    .venv/bin/python scripts/gen_published_truth.py --block-sizes  # pins truth_block_sizes.json

With ``--block-sizes``, a few configs of every cache kind (plain, sliding, sinks, MLA, Mamba and gated-delta-
net hybrids, per-layer head sizes, Mamba only) are built with the block size a user sets (``--block-size``:
vLLM's CacheConfig.block_size, kvlayout's ``block_size``) at tp 1 and 2, bf16 and fp8, on Hopper.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FIXTURES = ROOT / "tests" / "fixtures" / "published"
TRUTH = FIXTURES / "truth.json"
TRUTH_BLOCKS = FIXTURES / "truth_block_sizes.json"
#: the user-block-size cases: these configs, at these block sizes, tp 1 and 2, bf16 and fp8, on Hopper
BLOCK_MODELS = (
    "llama3_1_8b", "mistral_7b_v0_1", "gemma3_12b", "gpt_oss_20b", "deepseek_v2_lite", "kimi_k2_instruct",
    "jamba_1_5_mini", "qwen3_next_80b_a3b_instruct", "nemotron_h_56b", "gemma4_26b_a4b", "mamba_codestral_7b",
)
BLOCK_SIZES = (32, 64, 128)
TPS = (1, 2, 8)
KVS = ("auto", "fp8")
DEVICES = ("hopper", "blackwell")


def configs() -> dict[str, dict[str, Any]]:
    """name -> the published config, as stored."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))
            if p.name not in ("truth.json", "truth_block_sizes.json", "SOURCES.json")}


def kvlayout_answer(config: dict[str, Any], tp: int, kv: str, device: str) -> dict[str, Any]:
    """kvlayout's plan in the driver's answer's shape, or ``{"refused": reason}``."""
    from kvlayout.errors import SpecError
    from tests.test_models_hybrid_vllm import _kvlayout

    try:
        return _kvlayout({"config": config, "tp": tp, "kv_cache_dtype": kv, "device": device})
    except SpecError as e:
        return {"refused": str(e).splitlines()[0][:300]}


def block_of(config: dict[str, Any], tp: int, kv: str, device: str) -> int | None:
    """The block size vLLM's GPU platform would start the case from: kvlayout's backend choice for an
    MLA model, FlashAttention 4's fixed page (None: the CacheConfig default of 16 tokens)."""
    import kvlayout.models as M
    from kvlayout.models.backends import BACKENDS
    from kvlayout.spec import MLASpec

    try:
        ms = M.from_config(config, tp=tp, kv_cache_dtype=None if kv == "auto" else kv, device=device)
    except Exception:  # noqa: BLE001  # refused: vLLM starts from its default
        return None
    assert isinstance(ms, M.ModelSpec)
    if ms.family in MLA_HYBRIDS:  # vLLM starts from the MLA backend's block and realigns it (the driver)
        return BACKENDS[ms.attention_backend].preferred_block_size() if ms.attention_backend else None
    if any(isinstance(x, MLASpec) for _, x in ms.spec.layers):
        return ms.block_size
    if ms.attention_backend == "FLASH_ATTN" and ms.block_size != 16:
        # FlashAttention 4's fixed page, FLASH_ATTN's preferred block (tests/test_hostile_s26_models.py
        # checks it against vLLM's backend): Gemma 4 on Hopper with an fp8 cache starts from 64 tokens
        return ms.block_size
    return None


#: MLA hybrids: vLLM's GPU platform sets their block once the model is built, for the MLA backend
MLA_HYBRIDS = ("kimi_linear",)


def align_backend_of(config: dict[str, Any], tp: int, kv: str, device: str) -> str | None:
    """An MLA hybrid's MLA backend on ``device`` (the driver's ``align_backend``), as kvlayout resolves it
    (tests/test_models_backends.py checks that choice); None for another model, or one kvlayout refuses."""
    import kvlayout.models as M

    try:
        ms = M.from_config(config, tp=tp, kv_cache_dtype=None if kv == "auto" else kv, device=device)
    except Exception:  # noqa: BLE001  # refused: the driver's default path
        return None
    assert isinstance(ms, M.ModelSpec)
    return (ms.attention_backend or "FLASH_ATTN_MLA") if ms.family in MLA_HYBRIDS else None


KEYS = ("block_size", "layers", "blocks", "windows", "groups", "bytes_per_block")


def digest(answer: dict[str, Any]) -> str:
    """A short hash of an answer's cache fields (the pinned form of vLLM's layers and groups)."""
    text = json.dumps({k: answer[k] for k in KEYS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def summary(answer: dict[str, Any]) -> dict[str, Any]:
    """What a pinned answer keeps: readable totals and the digest of the whole."""
    if "error" in answer:
        return {"error": answer["error"]}
    kinds = sorted({(v[0], v[1], v[2]) for v in answer["layers"].values()})
    return {
        "block_size": answer["block_size"],
        "bytes_per_block": answer["bytes_per_block"],
        "num_layers": len(answer["layers"]),
        "groups": [len(g) for g in answer["groups"]],
        "pages": [list(k) for k in kinds],
        "windows": sorted(set(answer["windows"].values())),
        "digest": digest(answer),
    }


def vllm_cases(cfgs: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The driver's cases (one per model, tp, cache dtype and starting block) and, per case id of the
    table (model-tpN-kv-device), the driver case that answers it."""
    from transformers import CONFIG_MAPPING

    from kvlayout.models.config_aliases import VLLM_TYPES

    cases: dict[str, dict[str, Any]] = {}
    which: dict[str, str] = {}
    for name, cfg in cfgs.items():
        # a remote-code config class (no class of transformers' or vLLM's): the driver's stand-in, the
        # fields as written (vLLM serves these with --trust-remote-code, the class fetched from the hub)
        stand_in = cfg["model_type"] not in CONFIG_MAPPING and cfg["model_type"] not in VLLM_TYPES
        for tp in TPS:
            for kv in KVS:
                for device in DEVICES:
                    block = block_of(cfg, tp, kv, device)
                    align = align_backend_of(cfg, tp, kv, device)
                    key = f"{name}-tp{tp}-{kv}" + (f"-b{block}" if block else "")
                    key += f"-{align}" if align else ""
                    case: dict[str, Any] = {"config": cfg, "tp": tp, "kv_cache_dtype": kv}
                    case.update(torch_device="meta", stand_in=stand_in)
                    if align:  # the block set as vLLM's GPU platform sets it once the model is built
                        case["align_backend"] = align
                    if block:
                        case["block_size"] = block
                    else:  # standard attention on the backend a GPU picks, not the CPU's (its sliding
                        # layers take blocks in multiples of 32: tests/test_models_hybrid_vllm.py)
                        case["gpu_backend"] = True
                    cases[key] = case
                    which[f"{name}-tp{tp}-{kv}-{device}"] = key
    return cases, which


def compare(mine: dict[str, Any], pinned: dict[str, Any]) -> str:
    """agree, disagree, refused-both, refused-by-kvlayout-only or refused-by-vllm-only."""
    if "refused" in mine:
        return "refused-both" if "error" in pinned else "refused-by-kvlayout-only"
    if "error" in pinned:
        return "refused-by-vllm-only"
    return "agree" if digest(mine) == pinned["digest"] else "disagree"


def table(cfgs: dict[str, dict[str, Any]], truth: dict[str, Any]) -> dict[str, dict[str, int]]:
    rows: dict[str, dict[str, int]] = {}
    cols = ("agree", "disagree", "refused-both", "refused-by-kvlayout-only", "refused-by-vllm-only")
    for name, cfg in cfgs.items():
        row = dict.fromkeys(cols, 0)
        for tp in TPS:
            for kv in KVS:
                for device in DEVICES:
                    cid = f"{name}-tp{tp}-{kv}-{device}"
                    pinned = truth["answers"][truth["cases"][cid]]
                    verdict = compare(kvlayout_answer(cfg, tp, kv, device), pinned)
                    row[verdict] += 1
                    if verdict != "agree":
                        mine = kvlayout_answer(cfg, tp, kv, device)
                        said = mine["refused"] if "refused" in mine else summary(mine)
                        print(f"  {cid}: {verdict}: kvlayout {said}; vLLM {pinned.get('error', pinned)}",
                              file=sys.stderr)
        rows[name] = row
    print(f"{'model':28s} " + " ".join(f"{c:>10s}" for c in cols))
    for name, row in rows.items():
        print(f"{name:28s} " + " ".join(f"{row[c]:>10d}" for c in cols))
    total = {c: sum(r[c] for r in rows.values()) for c in cols}
    print(f"{'total':28s} " + " ".join(f"{total[c]:>10d}" for c in cols))
    return rows


def block_cases(cfgs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The user-block-size cases, for the driver (``block_size``: vLLM's CacheConfig.block_size) and for
    kvlayout (``user_block_size``), by id model-tpN-kv-bB."""
    cases = {}
    for name in BLOCK_MODELS:
        cfg = cfgs[name]
        mla = "kv_lora_rank" in cfg
        for tp in (1, 2):
            for kv in KVS:
                for bs in BLOCK_SIZES:
                    case: dict[str, Any] = {"config": cfg, "tp": tp, "kv_cache_dtype": kv, "block_size": bs}
                    case.update(user_block_size=bs, torch_device="meta", stand_in=False, device="hopper")
                    if not mla:  # standard attention on the backend a GPU picks (as vllm_cases)
                        case["gpu_backend"] = True
                    cases[f"{name}-tp{tp}-{kv}-b{bs}"] = case
    return cases


def block_answer(case: dict[str, Any]) -> dict[str, Any]:
    """kvlayout's plan of a user-block-size case, or ``{"refused": reason}``."""
    from kvlayout.errors import SpecError
    from tests.test_models_hybrid_vllm import _kvlayout

    try:
        return _kvlayout(case)
    except SpecError as e:
        return {"refused": str(e).splitlines()[0][:300]}


def main() -> None:
    cfgs = configs()
    if "--block-sizes" in sys.argv:  # the user-block-size pins
        from tests.test_models_hybrid_vllm import vllm_answers

        cases = block_cases(cfgs)
        pins = {k: summary(v) for k, v in vllm_answers(cases).items()}
        TRUTH_BLOCKS.write_text(json.dumps(pins, indent=0, sort_keys=True) + "\n")
        verdicts = [compare(block_answer(c), pins[k]) for k, c in cases.items()]
        print({v: verdicts.count(v) for v in sorted(set(verdicts))})
        return
    if "--check" in sys.argv:
        truth = json.loads(TRUTH.read_text())
    else:
        from tests.test_models_hybrid_vllm import vllm_answers

        only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
        built = {n: c for n, c in cfgs.items() if only is None or n in only}
        assert only is None or set(only) == set(built), set(only or ()) - set(built)
        cases, which = vllm_cases(built)
        answers = {k: summary(v) for k, v in vllm_answers(cases).items()}
        if only is not None:  # the other configs keep their pins (a config's cases are its own)
            old = json.loads(TRUTH.read_text())
            keep = {c: k for c, k in old["cases"].items() if c.rsplit("-", 3)[0] not in only}
            which = {**keep, **which}
            answers = {**{k: old["answers"][k] for k in set(keep.values())}, **answers}
        truth = {"cases": which, "answers": dict(sorted(answers.items()))}
        TRUTH.write_text(json.dumps(truth, indent=0, sort_keys=True) + "\n")
    table(cfgs, truth)


if __name__ == "__main__":
    main()
