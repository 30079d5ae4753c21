"""The examples that learn: they train here in seconds and reach their accuracy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import kinship_embeddings  # noqa: E402
import mlp_classifier  # noqa: E402


def test_mlp_classifier_reaches_the_torch_accuracy():
    """benchmarks/bench_train.py trains the same network from the same weights on the same
    batches with torch and records its test accuracy; ours must reach it (up to half a point:
    float32 sums in another order can flip a few borderline test points)."""
    doc = json.loads((ROOT / "benchmarks" / "results" / "bench_train.json").read_text())
    rec = doc["mlp_example"]
    assert rec["config"] == mlp_classifier.CONFIG  # the figure is for this very task
    res = mlp_classifier.main(progress=False)
    assert res["accuracy"] >= rec["torch_accuracy"] - 0.005
    assert res["epoch_losses"][-1] < 0.5 * res["epoch_losses"][0]


def test_kinship_embeddings_recover_held_out_facts():
    res = kinship_embeddings.main(progress=False)
    assert res["held_out_accuracy"] >= 0.9, res
    assert min(res["per_relation"].values()) >= 0.8, res
