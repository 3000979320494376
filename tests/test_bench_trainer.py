"""scripts/bench_trainer.py: its variants of the baseline train.py still apply to it, and the
bf16 variant takes out the float8 products the gpu recipe trains with (docs/trainer.md)."""

import importlib.util
from pathlib import Path

from node.trainer import BASELINE_TRAIN_PY
from node.trainer.policy import check_source

_spec = importlib.util.spec_from_file_location(
    "bench_trainer", Path(__file__).resolve().parent.parent / "scripts" / "bench_trainer.py"
)
bench_trainer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_trainer)


def test_every_variant_applies_to_the_baseline_and_passes_the_policy(tmp_path):
    for name in bench_trainer.VARIANTS:
        path = bench_trainer.write_variant(name, tmp_path)  # exits if a replacement finds nothing
        text = path.read_text()
        assert (text == BASELINE_TRAIN_PY.read_text()) == (name == "baseline"), name
        assert check_source(text) == [], name


def test_the_bf16_variant_turns_the_float8_products_off(tmp_path):
    text = bench_trainer.write_variant("bf16", tmp_path).read_text()
    flag = next(line for line in text.splitlines() if line.startswith("FP8 = "))
    assert flag.startswith("FP8 = False and ")
