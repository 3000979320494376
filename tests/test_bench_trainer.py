"""scripts/bench_trainer.py and bench_pipeline.py: their variants of the baseline train.py still
apply to it, and the bf16 variant takes out the float8 products the gpu recipe trains with
(docs/trainer.md)."""

import importlib.util
import sys
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


def test_every_change_of_the_pipeline_bench_applies_to_the_baseline(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "bench_pipeline", Path(__file__).resolve().parent.parent / "scripts" / "bench_pipeline.py"
    )
    sys.path.insert(0, str(Path(spec.origin).parent))  # it imports bench_trainer from its folder
    try:
        bench_pipeline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench_pipeline)
    finally:
        sys.path.remove(str(Path(spec.origin).parent))
    for name in bench_pipeline.CHANGES:
        path = bench_trainer.write_variant(name, tmp_path, bench_pipeline.CHANGES, prefix="")
        assert check_source(path.read_text()) == [], name
