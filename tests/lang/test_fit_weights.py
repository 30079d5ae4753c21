"""Program.fit_weights: rule and fact weights learned under the fuzzy and probabilistic
semantics, checked against the evaluator's own weighted fixpoint."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.datalog import evaluate

PATH = """
path(X, Y) :- edge(X, Y).
path(X, Z) :- edge(X, Y), path(Y, Z).
"""


def _weights(rel) -> dict:
    return {tuple(int(c[i]) for c in rel.columns): float(w) for i, w in enumerate(rel.weights)}


@pytest.mark.parametrize("semantics", ["probabilistic", "fuzzy"])
def test_fact_weights_are_recovered_from_derived_values(semantics, rng):
    """Edge probabilities are learned from examples of path values that the evaluator derived
    from the true edge weights (an independent implementation of the semantics)."""
    edges = [(0, 1), (1, 2), (2, 3), (0, 2), (1, 3), (3, 4)]
    true = {e: float(w) for e, w in zip(edges, rng.uniform(0.2, 0.95, len(edges)))}
    ref = evaluate(PATH, {"edge": true}, semantics=semantics, as_relations=True)
    target = _weights(ref["path"])
    p = tl.parse(PATH)
    hist = p.fit_weights(
        {"path": target},
        facts={"edge": {e: 0.5 for e in edges}},
        semantics=semantics,
        learn_rules=False,
        learn_facts=["edge"],
        epochs=500,
        backend="numpy",
        progress=False,
    )
    assert hist.losses[-1] < hist.losses[0]
    got = p.fact_weights["edge"]
    assert set(got) == set(edges)
    if semantics == "probabilistic":  # every edge is some path's only support: identifiable
        for e in edges:
            assert got[e] == pytest.approx(true[e], abs=0.02)
    # the learned weights reproduce the examples through the evaluator's own fixpoint
    again = _weights(evaluate(PATH, {"edge": got}, semantics=semantics, as_relations=True)["path"])
    for k, v in target.items():
        assert again[k] == pytest.approx(v, abs=0.03)


def test_weighted_relations_match_the_evaluator(rng):
    edges = {(a, b): float(rng.uniform(0.1, 1.0)) for a, b in [(0, 1), (1, 2), (2, 0), (2, 3)]}
    p = tl.parse(PATH)
    p.fit_weights(
        {"path": {(0, 1): 0.5}},
        facts={"edge": edges},
        semantics="fuzzy",
        learn_rules=False,
        learn_facts=["edge"],
        epochs=1,
        optimizer=tl.optim.SGD(lr=1e-12),
        backend="numpy",
        progress=False,
    )
    ref = _weights(evaluate(PATH, {"edge": edges}, semantics="fuzzy", as_relations=True)["path"])
    dense = p.weighted_relations["path"]
    nodes = [0, 1, 2, 3]  # the constants in value order, as the dense axes hold them
    for (a, b), v in ref.items():
        assert dense[nodes.index(a), nodes.index(b)] == pytest.approx(v, rel=1e-5)
    assert np.count_nonzero(dense > 1e-6) == len(ref)


def test_rule_weights_learn_which_rule_explains_the_examples():
    p = tl.parse("""
        likes(X, Y) :- friend(X, Y).
        likes(X, Y) :- colleague(X, Y).
    """)
    friend = [("a", "b"), ("b", "c"), ("c", "d")]
    colleague = [("a", "c"), ("b", "d"), ("a", "d")]
    examples = {"likes": {**{f: 1.0 for f in friend}, **{c: 0.0 for c in colleague}}}
    p.fit_weights(
        examples,
        facts={"friend": friend, "colleague": colleague},
        epochs=300,
        backend="numpy",
        progress=False,
    )
    w = p.rule_weights
    assert set(w) == {"likes (line 2)", "likes (line 3)"}
    assert w["likes (line 2)"] > 0.95 and w["likes (line 3)"] < 0.05


def test_fit_weights_errors():
    p = tl.parse(PATH)
    facts = {"edge": [(0, 1), (1, 2)]}
    cases = [
        (dict(semantics="boolean"), "fuzzy' or 'probabilistic"),
        (dict(learn_facts=["nope"]), "no relations of the program"),
        (dict(examples={"nope": {(0, 1): 1.0}}), "'nope', which is no relation"),
        (dict(examples={"path": {(0, 9): 1.0}}), "9 is not a constant of argument 1"),
        (dict(examples={"path": {(0,): 1.0}}), "has 1 values; expected 2"),
        (dict(examples={"path": {(0, 1): 2.0}}), r"not in \[0, 1\]"),
        (dict(examples={"path": {}}), "no examples"),
        (dict(learn_rules=False), "nothing to learn"),
    ]
    for kw, match in cases:
        kw = {"examples": {"path": {(0, 2): 1.0}}, **kw}
        with pytest.raises(tl.ProgramError, match=match):
            p.fit_weights(facts=facts, backend="numpy", progress=False, **kw)
    assert p.rule_weights == {} and p.fact_weights == {}
