"""Tensor equations against numpy, the Program API, the examples and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.cli import main
from tensorlogic.lang.parser import parse_rules

from . import reference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOL = {"rtol": 1e-5, "atol": 1e-5}


def rand(rng, *shape):
    return (rng.random(shape, dtype=np.float32) - 0.3).astype(np.float32)


def test_equations_match_numpy(rng, backend):
    p = tl.parse("""
    Y[i] = relu(W[i,j] X[j] + B[i])   # a layer
    Z[i] = 2 Y[i] - 1 / C             // constants, subtraction and division
    S[i,j.] = softmax(W[i,j] / 2)
    L[i.,j] = log_softmax(W[i,j])
    M[i] max= W[i,j] X[j]
    A[i] avg= W[i,j]
    T = 0.5
    # k is summed inside tanh: indices the left side drops are summed where their product ends
    P[i] = sig(Y[i], T) + tanh(X[k]) exp(B[i]) - sqrt(softplus(B[i]))
    D[i] = Q[i,i]
    O[i,j] = X[i] X[j]
    O[i,j] = Q[i,j]
    Bc[i,j] = X[i] + X[j]
    """)
    W, X, B, Q = rand(rng, 4, 3), rand(rng, 3), rand(rng, 4), rand(rng, 3, 3)
    C = np.float32(3.0)
    out = p.run(backend, W=W, X=X, B=B, Q=Q, C=C)
    Y = np.maximum(W @ X + B, 0)
    np.testing.assert_allclose(out["Y"], Y, **TOL)
    np.testing.assert_allclose(out["Z"], 2 * Y - 1 / C, **TOL)
    e = np.exp(W / 2)
    np.testing.assert_allclose(out["S"], e / e.sum(1, keepdims=True), **TOL)
    lw = W - np.log(np.exp(W).sum(0, keepdims=True))
    np.testing.assert_allclose(out["L"], lw, **TOL)
    np.testing.assert_allclose(out["M"], (W * X).max(1), **TOL)
    np.testing.assert_allclose(out["A"], W.mean(1), **TOL)
    P = 1 / (1 + np.exp(-Y / 0.5)) + np.tanh(X.sum()) * np.exp(B) - np.sqrt(np.logaddexp(B, 0))
    np.testing.assert_allclose(out["P"], P, **TOL)
    np.testing.assert_allclose(out["D"], np.diag(Q), **TOL)
    np.testing.assert_allclose(out["O"], np.outer(X, X) + Q, **TOL)
    np.testing.assert_allclose(out["Bc"], X[:, None] + X[None, :], **TOL)


def test_equation_errors():
    with pytest.raises(tl.ProgramError) as info:
        tl.parse("Y[i] = relu(W[i,j] X[j]").run(W=np.ones((2, 2), np.float32))
    assert info.value.code == "parse_error"
    with pytest.raises(tl.ProgramError) as info:
        tl.parse("Y[i] = W[i,j] X[j]").run(W=np.ones((2, 3), np.float32))
    assert info.value.code == "missing_data" and "line 1, column 15" in str(info.value)
    with pytest.raises(tl.ProgramError) as info:
        tl.parse("Y[i] = W[i,j] X[j]").run(W=np.ones((2, 3), np.float32), X=np.ones(2, np.float32))
    assert info.value.code == "shape_mismatch"
    with pytest.raises(tl.ProgramError) as info:
        tl.parse("A[i] = B[i]\nB[i] = A[i]").run()
    assert info.value.code == "recursive_equation"
    with pytest.raises(tl.ProgramError) as info:
        tl.parse("W: float32[3]\nY[i] = W[i]").run(W=np.ones(2, np.float32))
    assert info.value.code == "shape_mismatch" and "line 1" in str(info.value)
    with pytest.raises(tl.ProgramError) as info:
        tl.parse("Y[i, k] = W[i]").run(W=np.ones(2, np.float32))
    assert info.value.code == "unbound_variable"
    with pytest.raises(tl.ProgramError) as info:
        tl.parse("Y[i] = relu(W[i], W[i])")
    assert info.value.code == "parse_error"


def test_program_query_and_symbols():
    p = tl.parse(
        'edge("a", "b").\nedge("b", "c").\npath(X, Y) :- edge(X, Y).\n'
        "path(X, Z) :- path(X, Y), edge(Y, Z)."
    )
    assert p.query("path") == {("a", "b"), ("b", "c"), ("a", "c")}
    assert p.query("path", facts={"edge": [("c", "d")]}) >= {("a", "d")}
    with pytest.raises(tl.ProgramError) as info:
        p.query("nope")
    assert info.value.code == "unknown_predicate"
    assert p.symbols("edge")[0] == ["a", "b", "c", "d"]
    dense = p.run()["path"]
    assert dense.dtype == np.float32 and set(np.unique(dense)) <= {0.0, 1.0}


def _reference_relations(path: Path) -> dict:
    rules = [r for r in parse_rules(_datalog_part(path))]
    return reference.evaluate(rules, {})


def _datalog_part(path: Path) -> str:
    return "\n".join(
        line for line in path.read_text().splitlines() if ":-" in line or line.strip().endswith(".")
    )


def test_example_kinship():
    p = tl.load_program(EXAMPLES / "kinship.tl")
    got = p.relations_as_sets()
    want = _reference_relations(EXAMPLES / "kinship.tl")
    assert got == want
    assert ("carol", "dave") in got["aunt"] and ("bob", "frank") in got["uncle"]


def test_example_reachability():
    p = tl.load_program(EXAMPLES / "reachability.tl")
    reach = p.query("Reach")
    edges = {(1, 2), (2, 3), (3, 1), (3, 4), (5, 6)}
    closure = set(edges)
    while True:
        more = {(a, d) for a, b in closure for c, d in edges if b == c} - closure
        if not more:
            break
        closure |= more
    assert reach == closure
    assert p.query("cyclic") == {(1,), (2,), (3,)}
    assert (4, 1) in p.query("unreachable") and (1, 4) not in p.query("unreachable")


def test_example_mlp(rng):
    p = tl.load_program(EXAMPLES / "mlp.tl")
    d = {
        "X": rand(rng, 5, 8),
        "W1": rand(rng, 16, 8),
        "B1": rand(rng, 16),
        "W2": rand(rng, 4, 16),
        "B2": rand(rng, 4),
    }
    out = p.run(**d)
    H = np.maximum(d["X"] @ d["W1"].T + d["B1"], 0)
    z = H @ d["W2"].T + d["B2"]
    e = np.exp(z - z.max(1, keepdims=True))
    np.testing.assert_allclose(out["Y"], e / e.sum(1, keepdims=True), **TOL)


def test_example_attention(rng):
    p = tl.load_program(EXAMPLES / "attention.tl")
    d = {
        "Emb": rand(rng, 6, 8),
        "WQ": rand(rng, 4, 8),
        "WK": rand(rng, 4, 8),
        "WV": rand(rng, 5, 8),
        "Dk": np.float32(4.0),
    }
    out = p.run(**d)
    q, k, v = d["Emb"] @ d["WQ"].T, d["Emb"] @ d["WK"].T, d["Emb"] @ d["WV"].T
    s = q @ k.T / 2.0
    a = np.exp(s - s.max(1, keepdims=True))
    a /= a.sum(1, keepdims=True)
    np.testing.assert_allclose(out["Comp"], a, **TOL)
    np.testing.assert_allclose(out["Attn"], a @ v, **TOL)


def test_example_kernel_machine(rng):
    p = tl.load_program(EXAMPLES / "kernel_machine.tl")
    d = {
        "X": rand(rng, 7, 3),
        "Xq": rand(rng, 5, 3),
        "A": rng.random(7, dtype=np.float32),
        "Ys": np.sign(rand(rng, 7)).astype(np.float32),
        "B": np.float32(0.1),
    }
    out = p.run(**d)
    K = (d["Xq"] @ d["X"].T + 1) ** 2
    score = K @ (d["A"] * d["Ys"]) + d["B"]
    np.testing.assert_allclose(out["Score"], score, **TOL)
    np.testing.assert_array_equal(out["Y"], (score > 0).astype(np.float32))


def test_example_embedding_reasoning(rng):
    p = tl.load_program(EXAMPLES / "embedding_reasoning.tl")
    likes = np.zeros((4, 4), np.float32)
    for a, b in [(0, 1), (1, 2), (2, 0), (3, 3)]:
        likes[a, b] = 1
    emb = rand(rng, 4, 6)
    out = p.run(Emb=emb, T=np.float32(0.3))
    score = emb @ (emb.T @ likes @ emb) @ emb.T
    np.testing.assert_allclose(out["Score"], score, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        out["Query"], 1 / (1 + np.exp(-(score - 0.5) / 0.3)), rtol=1e-4, atol=1e-4
    )
    # orthonormal embeddings and a low temperature give back the relation itself
    sharp = p.run(Emb=np.eye(4, dtype=np.float32), T=np.float32(0.01))["Query"]
    np.testing.assert_allclose(sharp, likes, atol=1e-6)


def test_cli_runs_programs(tmp_path, capsys):
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"Edge": [[6, 7]]}))
    assert (
        main(["run", str(EXAMPLES / "reachability.tl"), "--facts", str(facts), "--query", "Reach"])
        == 0
    )
    lines = capsys.readouterr().out.split("\n")
    assert "(5, 7)" in lines and "(1, 4)" in lines
    assert main(["run", str(EXAMPLES / "kinship.tl")]) == 0
    out = capsys.readouterr().out
    assert "aunt: 3 tuple(s)" in out and '("carol", "dave")' in out
    assert main(["run", str(EXAMPLES / "kinship.tl"), "--query", "nope"]) == 2
    assert "unknown relation" in capsys.readouterr().err
    inputs = tmp_path / "in.npz"
    np.savez(
        inputs,
        X=np.ones((2, 8), np.float32),
        W1=np.ones((16, 8), np.float32),
        B1=np.zeros(16, np.float32),
        W2=np.ones((4, 16), np.float32),
        B2=np.zeros(4, np.float32),
    )
    assert main(["run", str(EXAMPLES / "mlp.tl"), "--inputs", str(inputs)]) == 0
    assert "Y: shape=(2, 4)" in capsys.readouterr().out
