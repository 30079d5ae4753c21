"""Equations and rules with more index variables than the 52 ASCII letters."""

from __future__ import annotations

import numpy as np

import tensorlogic as tl

from .test_datalog import check


def test_equation_with_sixty_indices(rng):
    # a chain of 60 matrices in one product: 61 index variables
    n = 60
    idx = [f"i{k}" for k in range(n + 1)]
    rhs = " ".join(f"A{k}[{idx[k]},{idx[k + 1]}]" for k in range(n))
    p = tl.parse(f"Y[{idx[0]},{idx[-1]}] = {rhs}\n")
    mats = {f"A{k}": (rng.random((2, 2)) + 0.2).astype(np.float64) for k in range(n)}
    out = p.run("numpy", **mats)["Y"]
    want = np.linalg.multi_dot(list(mats.values()))
    np.testing.assert_allclose(out, want, rtol=1e-5)  # programs compute in float32


def test_rule_with_sixty_variables():
    # a path of 60 edges in one rule body: 61 variables
    n = 60
    body = ", ".join(f"e(X{k}, X{k + 1})" for k in range(n))
    text = f"far(X0, X{n}) :- {body}."
    edges = [(k, k + 1) for k in range(n + 2)] + [(0, 0)]
    got = check(text, {"e": edges})
    # from the self-loop at 0, a 60-edge path reaches 1..60; from k >= 1 only k + 60
    assert got["far"] == {(0, k) for k in range(0, n + 1)} | {(1, 61), (2, 62)}
