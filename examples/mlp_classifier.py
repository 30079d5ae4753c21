"""Train an MLP classifier: parameters, tl.grad, tl.optim.Adam and tl.train.

The task is generated here from a seed: three interleaved noisy spirals in the plane, a
classic problem a linear model cannot solve. ``benchmarks/bench_train.py`` trains the same
network from the same initial weights on the same batches with PyTorch and records both
accuracies; the tests run ``main()`` and check ours reaches the recorded figure.

Run: python examples/mlp_classifier.py [--backend numba]
"""

from __future__ import annotations

import argparse

import numpy as np

import tensorlogic as tl

CONFIG = {
    "classes": 3,
    "n_train": 3000,
    "n_test": 1500,
    "noise": 0.6,
    "hidden": 64,
    "epochs": 15,
    "batch": 100,
    "lr": 0.01,
    "seed": 0,
}


def make_data(
    n: int, seed: int, classes: int = CONFIG["classes"], noise: float = CONFIG["noise"]
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points on ``classes`` interleaved spirals (float32 x of shape (n, 2), int labels)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    r = rng.uniform(0.05, 1.0, n)
    theta = 3.5 * r + 2 * np.pi * labels / classes + rng.normal(0, noise, n)
    x = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1)
    return x.astype(np.float32), labels


def init_params(
    seed: int, hidden: int = CONFIG["hidden"], classes: int = CONFIG["classes"]
) -> dict[str, np.ndarray]:
    """He-initialized weights (rows: inputs) and zero biases, float32."""
    rng = np.random.default_rng(seed + 1)
    sizes = [2, hidden, hidden, classes]
    p = {}
    for i, (a, b) in enumerate(zip(sizes, sizes[1:]), start=1):
        p[f"W{i}"] = (rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32)
        p[f"b{i}"] = np.zeros(b, np.float32)
    return p


def build_graph(params: dict[str, np.ndarray]) -> tl.EinsumGraph:
    """Logits of a two-hidden-layer ReLU MLP and the mean cross-entropy ``loss``."""
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 2))
    y = g.input("y", ("B", params["b3"].shape[0]))  # one-hot labels
    w = {k: g.parameter(k, v) for k, v in params.items()}
    h = g.relu(g.einsum("bi,ij->bj", x, w["W1"]) + w["b1"])
    h = g.relu(g.einsum("bi,ij->bj", h, w["W2"]) + w["b2"])
    logits = g.einsum("bi,ij->bj", h, w["W3"]) + w["b3"]
    g.output(logits, name="logits")
    g.output(-g.mean(g.sum(y * g.log_softmax(logits, axis=-1), axis=-1)), name="loss")
    return g


def batch_order(n: int, epoch: int, seed: int = CONFIG["seed"]) -> np.ndarray:
    """The shuffled order of the training points in ``epoch`` (shared with the torch run)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def one_hot(labels: np.ndarray, classes: int = CONFIG["classes"]) -> np.ndarray:
    """Labels as float32 one-hot rows."""
    return np.eye(classes, dtype=np.float32)[labels]


def main(backend: str = "numpy", progress: bool = True) -> dict:
    """Train, then return the test accuracy, the loss history and the trained parameters."""
    c = CONFIG
    x, labels = make_data(c["n_train"], c["seed"])
    x_test, labels_test = make_data(c["n_test"], c["seed"] + 100)
    y = one_hot(labels)
    graph = build_graph(init_params(c["seed"]))

    def batches(epoch):
        order = batch_order(len(x), epoch)
        for i in range(0, len(x), c["batch"]):
            idx = order[i : i + c["batch"]]
            yield {"x": x[idx], "y": y[idx]}

    hist = tl.train(
        graph,
        batches,
        epochs=c["epochs"],
        optimizer=tl.optim.Adam(lr=c["lr"]),
        backend=backend,
        progress=progress,
    )
    # the trained plan computes the logits of the test set too (its gradients are not used)
    logits = hist.plan({"x": x_test, "y": one_hot(labels_test)}, to_host=True)["logits"]
    accuracy = float((logits.argmax(axis=1) == labels_test).mean())
    return {
        "accuracy": accuracy,
        "epoch_losses": hist.epoch_losses,
        "params": {
            k: np.asarray(hist.plan.backend.to_host(v)) for k, v in hist.plan.parameters.items()
        },
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="numpy")
    args = ap.parse_args()
    res = main(args.backend)
    print(f"loss per epoch: {' '.join(f'{v:.3f}' for v in res['epoch_losses'])}")
    print(f"test accuracy: {res['accuracy']:.4f}")
