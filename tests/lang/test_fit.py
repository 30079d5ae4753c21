"""Program.fit: tensor-equation programs learn their parameters with tl.grad and tl.train."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl

REGRESSION = """
Pred[b] = W[i] X[b, i] + B
Err[b] = Pred[b] - Y[b]
Loss avg= Err[b] Err[b]
"""


def test_linear_regression_recovers_the_weights(rng):
    p = tl.parse(REGRESSION)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    w = rng.standard_normal(4).astype(np.float32)
    y = x @ w + 0.7
    hist = p.fit(
        {"X": x, "Y": y},
        loss="Loss",
        params=["W", "B"],
        epochs=300,
        init={"W": np.zeros(4), "B": 0.0},
        optimizer=tl.optim.Adam(lr=0.05),
        backend="numpy",
        progress=False,
    )
    assert hist.losses[-1] < 1e-4 * hist.losses[0]
    np.testing.assert_allclose(p.params["W"], w, atol=1e-2)
    np.testing.assert_allclose(p.params["B"], 0.7, atol=1e-2)
    # run() reads the learned values where no array is given
    out = p.run(X=x, Y=y, backend="numpy")
    assert out["Loss"] < 1e-4
    # and a second fit starts where the first ended
    again = p.fit(
        {"X": x, "Y": y},
        loss="Loss",
        params=["W", "B"],
        epochs=1,
        optimizer=tl.optim.SGD(lr=1e-3),
        backend="numpy",
        progress=False,
    )
    assert again.losses[0] == pytest.approx(float(out["Loss"]), rel=1e-3, abs=1e-7)


def test_declared_mlp_learns_a_classification_from_batches(rng):
    p = tl.parse("""
        W1: float32[16, 2]
        B1: float32[16]
        W2: float32[3, 16]
        B2: float32[3]
        H[b, h] = relu(W1[h, i] X[b, i] + B1[h])
        Y[b, o.] = log_softmax(W2[o, h] H[b, h] + B2[o])
        Loss avg= -T[b, o] Y[b, o]
    """)
    centers = np.array([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]], np.float32)
    labels = rng.integers(0, 3, 600)
    x = (centers[labels] + 0.5 * rng.standard_normal((600, 2))).astype(np.float32)
    t = np.eye(3, dtype=np.float32)[labels]
    batches = [{"X": x[i : i + 100], "T": t[i : i + 100]} for i in range(0, 600, 100)]
    hist = p.fit(
        batches,
        loss="Loss",
        params=["W1", "B1", "W2", "B2"],
        epochs=20,
        optimizer=tl.optim.Adam(lr=0.02),
        backend="numba",
        progress=False,
    )
    assert hist.steps == 120 and hist.epoch_losses[-1] < 0.3 * hist.epoch_losses[0]
    pred = p.run(X=x, T=t, backend="numpy")["Y"].argmax(axis=1)
    assert (pred == labels).mean() > 0.95


def test_fit_reads_relations_of_the_rules(rng):
    """A relation derived by the rules is data for the equations: learn a score per node that
    ranks nodes by how many others they reach."""
    p = tl.parse("""
        reach(X, Y) :- edge(X, Y).
        reach(X, Z) :- reach(X, Y), edge(Y, Z).
        Count[x] = reach(x, y)
        Err[x] = S[x] - Count[x]
        Loss avg= Err[x] Err[x]
    """)
    edges = [(0, 1), (1, 2), (2, 3), (3, 4)]
    p.fit(
        {},
        loss="Loss",
        params=["S"],
        init={"S": np.zeros(5)},
        epochs=400,
        facts={"edge": edges},
        optimizer=tl.optim.Adam(lr=0.1),
        backend="numpy",
        progress=False,
    )
    np.testing.assert_allclose(p.params["S"], [4, 3, 2, 1, 0], atol=0.05)


def test_fit_errors():
    p = tl.parse(REGRESSION)
    data = {"X": np.ones((4, 4), np.float32), "Y": np.ones(4, np.float32)}
    init = {"W": np.zeros(4), "B": 0.0}
    cases = [
        (dict(loss="Nope", params=["W"]), "loss 'Nope' is not the left side"),
        (dict(loss="Pred", params=["W", "B"], init=init), "loss 'Pred' has shape"),
        (dict(loss="Loss", params=["Pred"]), "must name tensors the equations read"),
        (dict(loss="Loss", params=["Q"]), "must name tensors the equations read"),
        (dict(loss="Loss", params=["W"]), "parameter 'W' needs a starting value"),
        (dict(loss="Loss", params=["W"], init={"B": 0.0}), "init.*names no entry"),
    ]
    for kw, match in cases:
        with pytest.raises(tl.ProgramError, match=match):
            p.fit(data, progress=False, backend="numpy", **kw)
    with pytest.raises(tl.ProgramError, match="dict of arrays"):
        p.fit([], loss="Loss", params=["W", "B"], init=init)
    assert p.params == {}
