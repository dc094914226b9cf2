"""Single-field mutations of the published configs: do the readers agree with transformers?

Each field of each config in ``tests/fixtures/models/`` (top level and ``text_config``) is replaced in
turn by values of the wrong kind or range (deleted, null, a string, a float, a bool, -1, 0, 7, a list,
an object), and the config is planned by ``reader="auto"``, ``"json"`` and ``"transformers"``.
A disagreement is a mutation that auto or json plans and transformers (hence vLLM, which reads the
config through the same class) refuses; a raw exception (anything but a :class:`~kvlayout.SpecError`)
from any reader is a bug. ``--show N`` prints N disagreements.

    .venv/bin/python scripts/fuzz_readers.py [--show 20] [--only llama,mistral]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's kvlayout, not an installed one
FIXTURES = ROOT / "tests" / "fixtures" / "models"
_DELETE = object()
VALUES: tuple[Any, ...] = (_DELETE, None, "abc", 1.5, True, -1, 0, 7, [1], {"a": 1})


def mutations(data: dict[str, Any]) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """(field path, value, mutated config) for every field of ``data`` and its ``text_config``."""
    for key in data:
        for v in VALUES:
            if v is not _DELETE and v == data[key] and type(v) is type(data[key]):
                continue
            out = dict(data)
            if v is _DELETE:
                del out[key]
            else:
                out[key] = copy.deepcopy(v)  # transformers rewrites a nested dict in place
            yield key, v, out
    tc = data.get("text_config")
    if isinstance(tc, dict):
        for key, v, sub in mutations(tc):
            if key == "text_config":
                continue
            yield f"text_config.{key}", v, {**data, "text_config": sub}


def outcome(config: dict[str, Any], reader: str) -> str:
    """``ok``, ``refused`` (a SpecError) or ``raw <ExceptionType>``."""
    import kvlayout.models as M
    from kvlayout import SpecError

    try:
        M.from_config(config, reader=reader)
    except SpecError:
        return "refused"
    except Exception as e:  # noqa: BLE001  # a raw exception is what the fuzz looks for
        return f"raw {type(e).__name__}: {e}"[:200]
    return "ok"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--show", type=int, default=0)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    counts: Counter[str] = Counter()
    shown = 0
    for d in sorted(FIXTURES.iterdir()):
        if only and d.name not in only:
            continue
        base = json.loads((d / "config.json").read_text())
        for key, v, cfg in mutations(base):
            counts["mutations"] += 1
            t = outcome(cfg, "transformers")
            got = {reader: outcome(cfg, reader) for reader in ("auto", "json")}
            if any(o.startswith("raw") for o in (t, *got.values())):
                counts["raw exception (any reader)"] += 1
            for reader, o in got.items():
                if o == "ok" and t != "ok":
                    counts[f"{reader} plans, transformers refuses"] += 1
                    if shown < args.show:
                        shown += 1
                        print(f"{d.name}: {key} = {'<deleted>' if v is _DELETE else repr(v)} [{reader}]: {t}")
                elif o != "ok" and t == "ok":
                    counts[f"{reader} refuses, transformers plans"] += 1
            if "ok" in got.values() and t != "ok":
                counts["auto or json plans, transformers refuses"] += 1
    import kvlayout

    print(f"kvlayout from {Path(kvlayout.__file__).parent}")
    for k, n in counts.items():
        print(f"{k}: {n}")


if __name__ == "__main__":
    main()
