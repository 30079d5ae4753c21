"""Datalog on tensors against the tuple-at-a-time reference evaluator."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorlogic as tl
from tensorlogic.datalog import evaluate
from tensorlogic.lang.facts import normalize_facts
from tensorlogic.lang.fixpoint import Options, decode_all, evaluate_rules
from tensorlogic.lang.parser import parse_rules

from . import reference

ROUNDS = ("auto", "dense", "sparse")


def run_rounds(text: str, facts: dict, rounds: str, **kw) -> dict[str, set]:
    """``evaluate`` with recursive rounds forced dense or sparse (or chosen per round)."""
    an, dense, _ = evaluate_rules(
        parse_rules(text), normalize_facts(facts), Options(rounds=rounds, **kw)
    )
    return decode_all(an, dense)


def check(text: str, facts: dict | None = None, **kw) -> dict[str, set]:
    """Evaluate with the reference and with every kind of round (the public ``evaluate`` for
    "auto"); require the same relations (or the same error code)."""
    facts = facts or {}
    try:
        want = reference.evaluate(
            parse_rules(text), {p: set(map(tuple, r)) for p, r in facts.items()}
        )
    except reference.RefError as exc:
        with pytest.raises(tl.ProgramError) as info:
            evaluate(text, facts, **kw)
        assert info.value.code == exc.code, str(info.value)
        return {}
    got = evaluate(text, facts, **kw)
    assert set(got) == set(want)
    for p in want:
        assert got[p] == want[p], p
    for rounds in ("dense", "sparse"):
        other = run_rounds(text, facts, rounds, representation="dense", **kw)
        for p in want:
            assert other[p] == want[p], (rounds, p)
    # sparse relations throughout, and mixed: dense for relations of at most 4 cells
    for opts in ({"representation": "sparse"}, {"dense_cells": 4}):
        other = run_rounds(text, facts, "auto", **opts, **kw)
        for p in want:
            assert other[p] == want[p], (opts, p)
    return got


def random_graph(n: int, m: int, seed: int) -> list[tuple]:
    r = random.Random(seed)
    return sorted({(r.randrange(n), r.randrange(n)) for _ in range(m)})


TC = """
path(X, Y) :- edge(X, Y).
path(X, Z) :- path(X, Y), edge(Y, Z).
"""


def test_transitive_closure_chain():
    got = check(TC, {"edge": [(i, i + 1) for i in range(10)]})
    assert len(got["path"]) == 55


@pytest.mark.parametrize("seed", [0, 1])
def test_transitive_closure_random(seed):
    check(TC, {"edge": random_graph(30, 60, seed)})


def test_transitive_closure_right_and_nonlinear():
    check(
        """
    p(X, Y) :- e(X, Y).
    p(X, Z) :- e(X, Y), p(Y, Z).
    q(X, Y) :- e(X, Y).
    q(X, Z) :- q(X, Y), q(Y, Z).
    """,
        {"e": random_graph(15, 25, 3)},
    )


def test_same_generation():
    r = random.Random(5)
    parent = [(i, r.randrange(i)) for i in range(1, 25)]
    check(
        """
    sg(X, X) :- node(X).
    sg(X, Y) :- par(X, XP), sg(XP, YP), par(Y, YP).
    node(X) :- par(X, _).
    node(Y) :- par(_, Y).
    """,
        {"par": parent},
    )


def test_mutual_recursion():
    got = check(
        """
    even(0).
    odd(Y) :- even(X), succ(X, Y).
    even(Y) :- odd(X), succ(X, Y).
    """,
        {"succ": [(i, i + 1) for i in range(9)]},
    )
    assert got["even"] == {(0,), (2,), (4,), (6,), (8,)}


def test_stratified_negation():
    got = check(
        """
    reach(X, Y) :- edge(X, Y).
    reach(X, Z) :- reach(X, Y), edge(Y, Z).
    node(X) :- edge(X, _).
    node(Y) :- edge(_, Y).
    unreach(X, Y) :- node(X), node(Y), not reach(X, Y).
    isolated(X) :- node(X), not reach(X, _).
    """,
        {"edge": [(1, 2), (2, 3), (4, 4), (5, 1)]},
    )
    assert (3, 1) in got["unreach"] and (1, 3) not in got["unreach"]
    assert got["isolated"] == {(3,)}


def test_negation_spellings_agree():
    """``not p``, ``!p`` and Prolog's ``\\+ p`` are the same negation."""
    facts = {"edge": [(1, 2), (2, 3), (3, 1), (4, 5)]}
    results = [
        evaluate(f"oneway(X, Y) :- edge(X, Y), {neg}edge(Y, X).", facts)["oneway"]
        for neg in ("not ", "!", "\\+ ")
    ]
    assert (
        results[0]
        == results[1]
        == results[2]
        == {(1, 2), (2, 3), (3, 1), (4, 5)}
        - {(x, y) for x, y in facts["edge"] if (y, x) in facts["edge"]}
    )


def test_query_lines_are_accepted_and_recorded():
    from tensorlogic.lang.parser import parse_ast

    text = "edge(1, 2).\npath(X, Y) :- edge(X, Y).\n?- path(1, Y).\n?- edge(X, Y)\n"
    assert evaluate(text) == evaluate("edge(1, 2).\npath(X, Y) :- edge(X, Y).")
    queries = parse_ast(text).queries
    assert [(q.pred, len(q.args)) for q in queries] == [("path", 2), ("edge", 2)]
    with pytest.raises(tl.ProgramError) as info:
        evaluate("p(1).\n?- p(X) q(X).")
    assert info.value.code == "parse_error" and "line 2" in str(info.value)


def test_constants_and_mixed_types():
    got = check(
        """
    a(X) :- f(X, "1").
    b(X) :- f(X, 1).
    c(X, "tag", 3) :- f(X, _).
    d :- f("x", 1).
    """,
        {"f": [("x", 1), ("y", "1"), ("z", 1.5)]},
    )
    assert got["a"] == {("y",)} and got["b"] == {("x",)}
    assert got["c"] == {("x", "tag", 3), ("y", "tag", 3), ("z", "tag", 3)}
    assert got["d"] == {()}


def test_repeated_variables_and_wildcards():
    got = check(
        """
    loop(X) :- e(X, X).
    twice(X, X) :- e(X, _).
    any2(X) :- e(X, _), e(_, X).
    tri(X, Y, X) :- e(X, Y), e(Y, X).
    """,
        {"e": [(1, 1), (1, 2), (2, 1), (3, 2)]},
    )
    assert got["loop"] == {(1,)}
    assert got["twice"] == {(1, 1), (2, 2), (3, 3)}


def test_nullary_atoms():
    got = check(
        """
    go :- start.
    done :- go, not stop.
    stopped :- stop.
    out(X) :- done, item(X).
    start.
    """,
        {"item": [(1,), (2,)]},
    )
    assert got["done"] == {()} and got["stopped"] == set() and got["out"] == {(1,), (2,)}


def test_facts_as_rules_and_empty_predicates():
    got = check("""
    p(1, "a").
    p(2, "b").
    q(X) :- p(X, _), not missing(X).
    r(X) :- nothing(X, Y), p(Y, X).
    """)
    assert got["q"] == {(1,), (2,)} and got["missing"] == set() and got["r"] == set()


def test_comparisons():
    got = check(
        """
    lt(X, Y) :- n(X), n(Y), X < Y.
    ne(X, Y) :- n(X), n(Y), X != Y, Y >= 2.
    eq(X, Y) :- n(X), Y = X.
    c(X) :- n(X), X = 2.
    s(X) :- m(X), X > "b".
    mixed(X) :- m(X), X < 10.
    """,
        {"n": [(1,), (2,), (3,)], "m": [("a",), ("c",), (5,)]},
    )
    assert got["lt"] == {(1, 2), (1, 3), (2, 3)} and got["c"] == {(2,)}
    assert got["s"] == {("c",)} and got["mixed"] == {(5,)}


def test_paper_form_rules():
    text = """
    Ancestor(x, y) = Parent(x, y)
    Ancestor(x, z) = Ancestor(x, y) Parent(y, z)
    """
    got = evaluate(text, {"Parent": [("a", "b"), ("b", "c")]})
    assert got["Ancestor"] == {("a", "b"), ("b", "c"), ("a", "c")}


def test_rules_as_list():
    got = evaluate(["p(X) :- q(X).", "q(1)."], {})
    assert got["p"] == {(1,)}


@pytest.mark.parametrize(
    "text,facts,code",
    [
        ("p(X :- q(X).", {}, "parse_error"),
        ("p(X) :- q(X)", {}, "parse_error"),
        ("p(X) :- q(X, Y).\np(X) :- q(X).", {}, "arity_mismatch"),
        ("p(X) :- q(X).", {"q": [(1, 2)]}, "arity_mismatch"),
        ("p(X, Y) :- q(X).", {}, "unbound_variable"),
        ("p(X) :- q(X), not r(Y).", {}, "unbound_variable"),
        ("p(X) :- not q(X).", {}, "unbound_variable"),
        ("p(_) :- q(X).", {}, "unbound_variable"),
        ("p(X).", {}, "unbound_variable"),
        ("p(X) :- q(X), X < Y.", {}, "unbound_variable"),
        ("p(X) :- q(X), not p(X).", {}, "cyclic_negation"),
        ("p(X) :- q(X), not r(X).\nr(X) :- q(X), p(X).", {}, "cyclic_negation"),
        ("p(X) :- q(X).", {"q": [(None,)]}, "invalid_fact"),
    ],
)
def test_error_codes(text, facts, code):
    with pytest.raises(tl.ProgramError) as info:
        evaluate(text, facts)
    assert info.value.code == code


def test_parse_error_position():
    with pytest.raises(tl.ProgramError) as info:
        evaluate("p(X) :- q(X).\nr(X) :- q(X) s(X).")
    assert "line 2, column 14" in str(info.value)
    assert info.value.context["line"] == 2 and info.value.context["column"] == 14


def test_error_positions_name_the_atom():
    with pytest.raises(tl.ProgramError) as info:
        evaluate("p(X) :- q(X).\n\np(X, Y) :- q(X), q(Y).")
    assert "line 3, column 1" in str(info.value)
    with pytest.raises(tl.ProgramError) as info:
        evaluate("p(X) :- q(X),\n   not r(X, Z).")
    assert "line 2, column 13" in str(info.value)


def test_memory_budget_names_the_relation():
    with pytest.raises(tl.ProgramError) as info:
        evaluate(
            "p(X, Y) :- q(X), q(Y).",
            {"q": [(i,) for i in range(100)]},
            memory_budget=10_000,
            representation="dense",
        )
    assert info.value.code == "memory_budget"
    assert "'p'" in str(info.value) and "(100, 100)" in str(info.value)
    # the sparse form refuses the 10,000-row cross product too, naming the rule
    with pytest.raises(tl.ProgramError) as info:
        evaluate("p(X, Y) :- q(X), q(Y).", {"q": [(i,) for i in range(100)]}, memory_budget=10_000)
    assert info.value.code == "memory_budget" and "'p'" in str(info.value)


def test_max_iterations():
    with pytest.raises(tl.ProgramError) as info:
        evaluate(TC, {"edge": [(i, i + 1) for i in range(10)]}, max_iterations=3)
    assert info.value.code == "max_iterations"


def test_fuzzy_and_probabilistic():
    facts = {"edge": {(1, 2): 0.5, (2, 3): 0.5, (1, 3): 0.2}}
    assert evaluate(TC, facts, semantics="fuzzy")["path"] == {(1, 2), (2, 3), (1, 3)}
    from tensorlogic.lang.facts import normalize_facts
    from tensorlogic.lang.fixpoint import Options, evaluate_rules

    for sem, want in (("fuzzy", 0.25), ("probabilistic", 1 - (1 - 0.2) * (1 - 0.25))):
        an, dense, _ = evaluate_rules(
            parse_rules(TC), normalize_facts(facts), Options(semantics=sem)
        )
        idx = an.domains.index[an.domains.of_position[("path", 0)]]
        assert dense["path"].to_dense()[idx[1], idx[3]] == pytest.approx(want, rel=1e-5)


# ---------------------------------------------------------------------- random programs
CONSTS = [1, 2, "1", "a", "b"]
PREDS = {"e": 2, "f": 1, "g": 0, "p": 2, "q": 1, "r": 0, "s": 2}
BASE = ("e", "f", "g")
DERIVED = ("p", "q", "r", "s")
VARS = ["X", "Y", "Z"]


def _lit(draw, pred, bound=None):
    args = []
    for _ in range(PREDS[pred]):
        kind = draw(st.sampled_from(["var", "var", "var", "const", "anon"]))
        if kind == "const":
            args.append(repr(draw(st.sampled_from(CONSTS))).replace("'", '"'))
        elif kind == "anon":
            args.append("_")
        else:
            pool = sorted(bound) if bound is not None else VARS
            args.append(draw(st.sampled_from(pool)) if pool else "_")
    return pred + (f"({', '.join(args)})" if args else "")


@st.composite
def programs(draw):
    rules = []
    for _ in range(draw(st.integers(1, 5))):
        head = draw(st.sampled_from(DERIVED))
        body = [
            _lit(draw, draw(st.sampled_from(sorted(PREDS)))) for _ in range(draw(st.integers(1, 3)))
        ]
        bound = {v for b in body for v in VARS if f"({v}" in b or f" {v}" in b}
        if draw(st.booleans()):
            body.append("not " + _lit(draw, draw(st.sampled_from(sorted(PREDS))), bound))
        if bound and draw(st.integers(0, 3)) == 0:
            x = draw(st.sampled_from(sorted(bound)))
            rhs = draw(st.sampled_from(sorted(bound) + ['"a"', "1"]))
            body.append(f"{x} {draw(st.sampled_from(['=', '!=', '<']))} {rhs}")
        rules.append(
            f"{_lit(draw, head, bound if draw(st.integers(0, 9)) else None)} :- {', '.join(body)}."
        )
    facts = {}
    for p in BASE:
        rows = draw(st.lists(st.tuples(*[st.sampled_from(CONSTS)] * PREDS[p]), max_size=6))
        if rows or draw(st.booleans()):
            facts[p] = rows
    return "\n".join(rules), facts


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_match_reference(prog):
    text, facts = prog
    check(text, facts)


def test_unknown_predicate_lookup():
    got = evaluate("p(X) :- q(X).", {"q": [(1,)], "lonely": []})
    assert got["lonely"] == set() and got["p"] == {(1,)}
    with pytest.raises(tl.ProgramError) as info:
        got["nope"]
    assert info.value.code == "unknown_predicate" and "'nope'" in str(info.value)
    with pytest.raises(KeyError):
        got["nope"]
    assert got.get("nope") is None and "nope" not in got


def test_evaluate_empty_program_and_types():
    assert evaluate("", {"a": [(1, "1"), ("1", 1)]})["a"] == {(1, "1"), ("1", 1)}
    assert evaluate("b(X) :- a(X, 1).", {"a": [[1, "1"], ["1", 1]]})["b"] == {("1",)}
    got = evaluate('p(-2, 1.5, "it\'s \\"q\\"").\nq(X) :- p(X, _, _).')
    assert got["p"] == {(-2, 1.5, 'it\'s "q"')} and got["q"] == {(-2,)}


def test_bodies_of_comparisons_only():
    got = check('c(X) :- X = 1.\nd(X, Y) :- X = "a", Y = X.\ne :- 1 < 2.\nf :- 2 < 1.')
    assert got["c"] == {(1,)} and got["d"] == {("a", "a")} and got["e"] == {()}
    assert got["f"] == set()


# ---------------------------------------------------------------------- sparse and dense rounds
def _kinds(text: str, facts: dict, **kw) -> str:
    """Check every mode against the reference; the round kinds of the "auto" run with ``kw``."""
    check(text, facts)
    an, dense, ev = evaluate_rules(
        parse_rules(text), normalize_facts(facts), Options(representation="dense", **kw)
    )
    want = reference.evaluate(parse_rules(text), {p: set(map(tuple, r)) for p, r in facts.items()})
    got = decode_all(an, dense)
    assert all(got[p] == want[p] for p in want)
    return "".join(ev.round_kinds.values())


def test_rounds_switch_between_sparse_and_dense():
    # a fixed exchange rate makes the choice deterministic: the wide middle rounds of the closure
    # are dense, the narrow first and last ones sparse
    edges = random_graph(60, 110, 7)
    kinds = _kinds(TC, {"edge": edges}, flops_per_candidate=1000.0)
    assert "s" in kinds and "d" in kinds, kinds
    assert kinds.index("d") < kinds.rindex("s"), kinds  # back to sparse after dense


def test_sparse_round_over_budget_runs_dense():
    # every node points at every node: the first sparse attempt meets n candidates per delta
    # tuple, far over a budget sized for one candidate per tuple
    n = 20
    edges = [(i, j) for i in range(n) for j in range(n)]
    kinds = _kinds(TC, {"edge": edges}, flops_per_candidate=2.0 * n**3 / (n * n))
    assert kinds.startswith("x"), kinds


def test_sparse_rounds_several_recursive_atoms():
    check(
        """
    p(X, Y) :- e(X, Y).
    p(X, W) :- p(X, Y), p(Y, Z), p(Z, W).
    t(X, Y, Z) :- e(X, Y), e(Y, Z).
    t(X, Y, W) :- t(X, Y, Z), p(Z, W), not e(W, X).
    c(X) :- t(X, X, _).
    c(Y) :- c(X), p(X, Y), p(Y, X).
    """,
        {"e": random_graph(12, 22, 11)},
    )


def test_sparse_rounds_mutual_recursion_with_lower_negation_and_comparisons():
    check(
        """
    blocked(X) :- n(X), not e(X, _).
    a(X, Y) :- e(X, Y), X < Y.
    b(X, Y) :- a(X, Z), e(Z, Y), not blocked(Y), X != Y.
    a(X, Y) :- b(X, Y), Y >= 3.
    a(X, Y) :- b(Y, X), X = Y.
    b(X, Y) :- b(X, Z), Z = Y, a(Y, _).
    """,
        {"e": random_graph(14, 30, 2), "n": [(i,) for i in range(16)]},
    )


def test_sparse_rounds_projection_cross_product_and_bindings():
    check(
        """
    r(X) :- s(X).
    r(X) :- r(Y), e(Y, Z), e(Z, X).
    pair(X, Y) :- r(X), f(Y).
    pair(X, Y) :- pair(X, _), r(Y).
    tag(X, 1) :- r(X).
    tag(X, K) :- tag(X, J), e(J, K), K = 2.
    tag(X, Y) :- tag(Y, X), X = Y.
    """,
        {"s": [(0,)], "e": random_graph(10, 18, 4), "f": [(1,), (3,)]},
    )


def test_sparse_rounds_nullary_constants_and_repeated_variables():
    check(
        """
    go :- start.
    on(X) :- go, e(0, X).
    on(Y) :- on(X), e(X, Y), go.
    loop(X, X) :- e(X, X).
    loop(X, Y) :- loop(Z, Z), e(Z, X), e(X, Y).
    back(X) :- on(X), loop(X, X), not stop.
    start.
    """,
        {"e": random_graph(9, 20, 8) + [(3, 3)]},
    )


def test_sparse_rounds_empty_and_full_deltas():
    # nothing to start from: the recursive stratum's first delta is empty
    check(TC + "q(X, Y) :- q(X, Z), edge(Z, Y).\n", {"edge": random_graph(8, 12, 1)})
    # a complete graph: the first delta is the whole relation, the second empty
    got = check(TC, {"edge": [(i, j) for i in range(9) for j in range(9)]})
    assert len(got["path"]) == 81


def test_invalid_rounds_option():
    with pytest.raises(tl.ProgramError) as info:
        run_rounds(TC, {"edge": [(1, 2)]}, "sometimes")
    assert info.value.code == "invalid_option"


def test_sparse_rounds_constants_nullary_heads_and_ordering(monkeypatch):
    from tensorlogic.lang import sparse

    text = """
    r(X, "a") :- e(X, 1).
    r(Y, "b") :- r(X, "a"), e(X, Y), X < Y, 1 < 2.
    r(Y, T) :- r(X, T), e(X, Y), not halt, Y >= X.
    r(X, "c") :- r(X, _), X = 4, 2 < 1.
    hit :- r(_, "b").
    hit :- hit, e(3, _).
    more(X) :- hit, e(X, _).
    more(Y) :- more(X), e(X, Y), Y = 5.
    more(Y) :- more(X), Y = 7, not halt2.
    halt2 :- e(9, 9).
    """
    facts = {"e": random_graph(8, 20, 3) + [(2, 1), (3, 1)]}
    check(text, facts)
    monkeypatch.setattr(sparse, "STARTS_LIMIT", 0)  # search sorted keys instead of a table
    for p, rows in run_rounds(text, facts, "sparse", representation="dense").items():
        assert rows == run_rounds(text, facts, "dense", representation="dense")[p]


def test_sparse_round_too_large_for_memory_runs_dense():
    n = 20
    edges = [(i, j) for i in range(n) for j in range(n)]
    an, dense, ev = evaluate_rules(
        parse_rules(TC),
        normalize_facts({"edge": edges}),
        Options(rounds="sparse", memory_budget=128 * 1000, representation="dense"),
    )
    assert ev.round_kinds[("path",)].startswith("x")  # 8000 candidate rows > 1000 allowed
    assert len(decode_all(an, dense)["path"]) == n * n
