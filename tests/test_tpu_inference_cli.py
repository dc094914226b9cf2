"""``kvlayout plan/check/zero --config ... --engine tpu-inference`` with tpu-inference's mesh and options."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlayout.cli import main

GPT_OSS = str(Path(__file__).resolve().parent / "fixtures" / "models" / "gpt_oss" / "config.json")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_mesh_and_options_change_the_arrays(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--config", GPT_OSS, "--engine", "tpu-inference"]
    cases = [  # (flags, a line the plan must print): gpt-oss, 8 KV heads of 64 (K and V in one row)
        (["--block-size", "16"], "  sliding+full             12      2  (16, 4, 2, 128)"),
        (
            ["--block-size", "16", "--dcp", "2", "--tp", "4"],
            "  sliding+full             12      2  (32, 4, 2, 128)",
        ),
        (
            ["--block-size", "16", "--model-impl", "flax_nnx"],
            "  full                     24      1  (16, 4, 2, 128)",
        ),
        (["--max-model-len", "4096"], "  sliding+full             12      2  (256, 4, 2, 128)"),
        (["--dp", "2", "--tp", "4", "--block-size", "16"], "mesh data=2 x model=4"),
    ]
    for flags, line in cases:
        rc, out, err = run(capsys, *base, *flags)
        assert rc == 0 and line in out, (flags, out, err)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--engine", "tpu-inference", "--dp", "3"], "num_blocks = 16: must be a multiple of dp = 3"),
        (
            ["--engine", "tpu-inference", "--model-impl", "jax"],
            "model_impl = 'jax': valid: auto, flax_nnx, vllm",
        ),
        (["--engine", "tpu-inference", "--dcp", "0"], "dcp = 0: must be a positive integer"),
        (["--dp", "2"], "dp = 2: applies to engine tpu-inference only"),
    ],
)
def test_bad_options_exit_2_in_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    rc, out, err = run(capsys, "plan", "--config", GPT_OSS, *flags)
    assert rc == 2 and not out and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_num_seqs": 2**17 + 1}, "max_num_seqs"),  # tpu-inference's minimum page would divide by zero
        ({"dp": 0}, "dp"),
        ({"model_impl": "torchax"}, "model_impl"),
        ({"mla_transpose_kv_cache": 1}, "mla_transpose_kv_cache"),
        ({"tp": 3}, "tp"),  # 8 KV heads: tpu-inference asserts tp divides them
        ({"block_size": 48, "mla_transpose_kv_cache": True}, "block_size"),  # transposed MLA: 128-token rows
    ],
)
def test_bad_options_name_their_field(options: dict[str, object], field: str) -> None:
    import kvlayout as K
    import kvlayout.models as M

    fixture = "deepseek_v3" if "mla_transpose_kv_cache" in options else "llama"
    path = Path(GPT_OSS).parent.parent / fixture / "config.json"
    with pytest.raises(K.SpecError) as e:
        M.from_config(path, engine="tpu-inference", **options)
    assert e.value.field == field
