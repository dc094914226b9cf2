"""kvlayout.models read as written (``reader="json"``), for the tests of the json reader's own rules and
messages: the default reader, ``auto``, reads a config through transformers where it leaves out a field
(tests/test_models_auto_reader.py), which those tests would not see."""

from __future__ import annotations

from typing import Any

import kvlayout.models as M


def from_config(config: Any, **kw: Any) -> Any:
    """:func:`kvlayout.models.from_config` with ``reader="json"`` unless another is passed."""
    kw.setdefault("reader", "json")
    return M.from_config(config, **kw)


def spec_from_config(config: Any, **kw: Any) -> Any:
    """:func:`kvlayout.models.spec_from_config` with ``reader="json"`` unless another is passed."""
    kw.setdefault("reader", "json")
    return M.spec_from_config(config, **kw)
