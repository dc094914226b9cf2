"""Issue 25, sixteenth pass (F2, F3, F5): configs vLLM 0.33 refuses, the class model_type selects, and
FlashAttention's fp8 cache on Ampere. Ground truth is the installed vLLM 0.33.0 and transformers 5.20.2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout import SpecError
from kvlayout.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"
LLAMA_PATH = str(FIXTURES / "llama" / "config.json")


def _llama() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(LLAMA_PATH).read_text())
    return data


# --------------------------------------------------------------------------- F5: FLASH_ATTN fp8 on Ampere
@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3"])
def test_ampere_fp8_cache_takes_the_next_backend(kv: str) -> None:
    """vLLM 0.33 on SM80 runs FlashAttention 2 (fa_utils.get_flash_attn_version), which takes no fp8 cache
    (flash_attn_supports_kv_cache_dtype: FA3 on SM90, FA4 on SM100): the priority list's next backend,
    FLASHINFER, is chosen (platforms/cuda.py, _get_backend_priorities), and the reason says why."""
    ms = M.from_config(_llama(), device="ampere", kv_cache_dtype=kv)
    assert ms.attention_backend == "FLASHINFER"
    assert "skipped FLASH_ATTN" in ms.backend_reason and "FlashAttention 2" in ms.backend_reason
    assert ms.block_size == 16
    # a bf16 cache on Ampere, and fp8 on Hopper, are still FlashAttention's
    assert M.from_config(_llama(), device="ampere").attention_backend == "FLASH_ATTN"
    assert M.from_config(_llama(), device="hopper", kv_cache_dtype=kv).attention_backend == "FLASH_ATTN"


def test_ampere_fp8_cache_refuses_flash_attn_by_name() -> None:
    with pytest.raises(SpecError) as e:
        M.from_config(_llama(), device="ampere", kv_cache_dtype="fp8", attention_backend="FLASH_ATTN")
    assert e.value.field == "attention_backend"
    assert "vLLM refuses it on ampere" in str(e.value) and "fp8" in str(e.value)
    # FA4 on Blackwell takes it
    ms = M.from_config(_llama(), device="blackwell", kv_cache_dtype="fp8", attention_backend="FLASH_ATTN")
    assert ms.attention_backend == "FLASH_ATTN"


def test_ampere_fp8_flash_attn_cli_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--config", LLAMA_PATH, "--device", "ampere", "--kv-cache-dtype", "fp8"]
    rc = main([*argv, "--attention-backend", "FLASH_ATTN"])
    out, err = capsys.readouterr()
    assert rc == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "attention_backend = 'FLASH_ATTN'" in err and "FlashAttention 2" in err
    assert main(argv) == 0
    out, _ = capsys.readouterr()
    assert "attention backend FLASHINFER on ampere" in out
