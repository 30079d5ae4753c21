"""Datalog benchmark workloads: programs and seeded generators (numpy ``default_rng``).

Every generator returns ``{relation: (column, column)}`` of int64 numpy arrays; the same arrays
go to every engine.

* ancestors: node i (1 <= i < N) has the parent ``rng.integers(0, i)``, drawn in order of i;
  ``e(child, parent)`` and the two-rule transitive closure.
* closure: node i gets the two out-edges ``rng.integers(0, N, 2 * N)`` in order, self-loops and
  duplicate edges dropped.
* same-generation: the random tree of bounded fan-out of the earlier benchmark (``random.Random``:
  node i's parent is ``randrange(i // 4, i)``).
* points-to: Andersen's analysis over ``V`` variables, its four statement kinds drawn with
  ``default_rng(seed)`` (see ``pointsto``).
"""

from __future__ import annotations

import random

import numpy as np

TC = "p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z)."
SG = "sg(X, X) :- node(X).\nsg(X, Y) :- par(X, XP), sg(XP, YP), par(Y, YP)."
ANDERSEN = (
    "pt(P, O) :- addr(P, O).\n"
    "pt(P, O) :- assign(P, Q), pt(Q, O).\n"
    "pt(P, O) :- load(P, Q), pt(Q, R), pt(R, O).\n"
    "pt(R, O) :- store(P, Q), pt(P, R), pt(Q, O)."
)


def ancestors(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    parent = rng.integers(0, np.arange(1, n))  # the same draws as one call per i, in order
    child = np.arange(1, n, dtype=np.int64)
    return {"e": (child, parent.astype(np.int64))}


def closure(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    dst = rng.integers(0, n, 2 * n)
    src = np.repeat(np.arange(n, dtype=np.int64), 2)
    keep = src != dst
    key = np.sort(src[keep] * n + dst[keep])
    key = key[np.concatenate([[True], key[1:] != key[:-1]])]
    return {"e": (key // n, key % n)}


def same_generation(n: int, seed: int = 0) -> dict:
    r = random.Random(seed)
    par = np.array([(i, r.randrange(max(0, i // 4), i)) for i in range(1, n)], np.int64)
    return {"par": (par[:, 0], par[:, 1]), "node": (np.arange(n, dtype=np.int64),)}


def pointsto(
    v: int = 100_000,
    seed: int = 0,
    addr: float = 0.3,
    assign: float = 0.4,
    load: float = 0.08,
    store: float = 0.08,
) -> dict:
    """Andersen points-to facts over ``v`` variables: ``addr * v`` statements ``p = &o``
    (o among the first tenth of the variables: the address-taken ones), ``assign * v``
    ``p = q``, ``load * v`` ``p = *q`` and ``store * v`` ``*p = q``, all uniform at random."""
    rng = np.random.default_rng(seed)
    objs = max(1, v // 10)

    def pairs(k: float, high2: int) -> tuple[np.ndarray, np.ndarray]:
        m = int(k * v)
        return (rng.integers(0, v, m).astype(np.int64), rng.integers(0, high2, m).astype(np.int64))

    return {
        "addr": pairs(addr, objs),
        "assign": pairs(assign, v),
        "load": pairs(load, v),
        "store": pairs(store, v),
    }


#: name -> (program, output relation, generator, generator arguments)
WORKLOADS = {
    "ancestors": (TC, "p", ancestors),
    "closure": (TC, "p", closure),
    "samegen": (SG, "sg", same_generation),
    "pointsto": (ANDERSEN, "pt", pointsto),
}
