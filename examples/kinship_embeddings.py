"""Learn kinship relations in embedding space and recover facts held out of training.

A seeded family forest is generated here; the Datalog rules of examples/kinship.tl derive its
relations (parent, ancestor, sibling, aunt, uncle). Every person gets an embedding ``Emb[x, d]``
and every relation a matrix ``Rel[r, d, d']`` (both parameters, learned); a fact's score is the
tensor equation ``Score[r, x, y] = Emb[x, d] Rel[r, d, d'] Emb[y, d']`` and its probability
``sigmoid(Score)``. Training minimizes the cross-entropy on the known cells, with a fifth of the
true facts of every relation (and as many false ones) held out; afterwards the held-out facts
are classified from their scores alone.

Run: python examples/kinship_embeddings.py [--backend numba]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import tensorlogic as tl
from tensorlogic.datalog import evaluate

CONFIG = {
    "families": 4,
    "dim": 16,
    "epochs": 1,
    "steps": 300,
    "lr": 0.05,
    "l2": 1e-4,
    "held_out": 0.2,
    "seed": 0,
}
RELATIONS = ("parent", "ancestor", "sibling", "aunt", "uncle")


def family_forest(families: int, seed: int) -> tuple[list[tuple[int, int]], list[int], int]:
    """Parent facts and women of ``families`` families (people are ints): a founder and three
    generations below, every person with 2-3 children."""
    rng = np.random.default_rng(seed)
    parent, female, n = [], [], 0
    for _ in range(families):
        gen = [n]
        n += 1
        for _depth in range(3):
            nxt = []
            for p in gen:
                for _ in range(int(rng.integers(2, 4))):
                    parent.append((p, n))
                    nxt.append(n)
                    n += 1
            gen = nxt
    female = [x for x in range(n) if rng.random() < 0.5]
    return parent, female, n


def kinship_truth(cfg: dict = CONFIG) -> tuple[np.ndarray, int]:
    """``T[r, x, y]``: 1 where relation ``RELATIONS[r]`` holds, from the kinship.tl rules."""
    rules = "\n".join(
        line
        for line in (Path(__file__).parent / "kinship.tl").read_text().splitlines()
        if ":-" in line
    )
    parent, female, n = family_forest(cfg["families"], cfg["seed"])
    rel = evaluate(rules, {"parent": parent, "female": [(x,) for x in female]})
    truth = np.zeros((len(RELATIONS), n, n), np.float32)
    for r, name in enumerate(RELATIONS):
        for x, y in rel[name]:
            truth[r, x, y] = 1.0
    return truth, n


def split(truth: np.ndarray, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A training mask (1: a known cell) and the held-out cells: per relation, ``frac`` of its
    true facts and as many false ones."""
    rng = np.random.default_rng(seed + 1)
    train = np.ones_like(truth)
    held = np.zeros_like(truth)
    for r in range(truth.shape[0]):
        pos = np.argwhere(truth[r] == 1)
        neg = np.argwhere(truth[r] == 0)
        k = max(1, int(round(frac * len(pos))))
        for cells in (
            pos[rng.choice(len(pos), k, replace=False)],
            neg[rng.choice(len(neg), k, replace=False)],
        ):
            train[r, cells[:, 0], cells[:, 1]] = 0
            held[r, cells[:, 0], cells[:, 1]] = 1
    return train, held


def build_graph(n: int, cfg: dict = CONFIG) -> tl.EinsumGraph:
    """Scores of every (relation, x, y) and the weighted cross-entropy ``loss`` (weights
    ``W``: zero on cells held out, true facts weighted up so both classes count alike)."""
    rng = np.random.default_rng(cfg["seed"] + 2)
    d, r = cfg["dim"], len(RELATIONS)
    g = tl.EinsumGraph()
    truth = g.input("T", (r, n, n))
    weight = g.input("W", (r, n, n))
    emb = g.parameter("Emb", (rng.standard_normal((n, d)) * 0.3).astype(np.float32))
    rel = g.parameter("Rel", (rng.standard_normal((r, d, d)) * 0.3).astype(np.float32))
    score = g.einsum("xd,rde,ye->rxy", emb, rel, emb)
    g.output(score, name="Score")
    # binary cross-entropy with logits: softplus(s) - t s, averaged over the known cells
    bce = g.sum(weight * (g.softplus(score) - truth * score)) / g.sum(weight)
    g.output(bce + cfg["l2"] * (g.sum(emb * emb) + g.sum(rel * rel)), name="loss")
    return g


def main(backend: str = "numpy", progress: bool = True, cfg: dict = CONFIG) -> dict:
    """Train; return the held-out accuracy per relation and overall."""
    truth, n = kinship_truth(cfg)
    train, held = split(truth, cfg["held_out"], cfg["seed"])
    known = truth * train  # held-out facts are not in the data at all
    pos = known.sum(axis=(1, 2), keepdims=True)
    balance = (train.sum(axis=(1, 2), keepdims=True) - pos) / pos
    batch = {"T": known, "W": (train * np.where(known == 1, balance, 1.0)).astype(np.float32)}
    hist = tl.train(
        build_graph(n, cfg),
        [batch] * cfg["steps"],
        epochs=cfg["epochs"],
        optimizer=tl.optim.Adam(lr=cfg["lr"]),
        backend=backend,
        progress=progress,
    )
    score = hist.plan(batch, to_host=True)["Score"]
    right = (score > 0) == (truth == 1)
    per = {name: float(right[r][held[r] == 1].mean()) for r, name in enumerate(RELATIONS)}
    train_acc = float(right[train == 1].mean())
    return {
        "held_out_accuracy": float(right[held == 1].mean()),
        "per_relation": per,
        "train_accuracy": train_acc,
        "people": n,
        "final_loss": hist.losses[-1],
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="numpy")
    res = main(ap.parse_args().backend)
    print(f"{res['people']} people; training cells: accuracy {res['train_accuracy']:.3f}")
    for name, acc in res["per_relation"].items():
        print(f"held-out {name:9s} {acc:.3f}")
    print(f"held-out facts recovered: {res['held_out_accuracy']:.3f}")
