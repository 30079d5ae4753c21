"""Sparse relations, array results and inputs, arithmetic terms: against the reference
evaluator and against the dense representation, on fresh random programs and facts."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorlogic as tl
from tensorlogic.datalog import Relation, evaluate
from tensorlogic.lang import fixpoint, keysets, relset, sparse_rules
from tensorlogic.lang.analysis import desugar, has_arithmetic
from tensorlogic.lang.facts import normalize_facts
from tensorlogic.lang.fixpoint import Options, decode_all, evaluate_rules
from tensorlogic.lang.parser import parse_rules

from . import reference

TC = "p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z)."
REPRESENTATIONS = (
    {"representation": "sparse"},
    {"representation": "dense"},
    {"dense_cells": 6},
)  # mixed: dense for relations of at most 6 cells


def run(text: str, facts: dict, **kw) -> tuple[dict, object]:
    an, rels, ev = evaluate_rules(parse_rules(text), normalize_facts(facts), Options(**kw))
    return decode_all(an, rels), ev


def reference_model(text: str, facts: dict) -> dict:
    return reference.evaluate(parse_rules(text), {p: set(map(tuple, r)) for p, r in facts.items()})


@contextlib.contextmanager
def engine_path(name: str):
    """The sparse engine's other code paths on small inputs: "kernels" (numba kernels from the
    first key, bit maps of known tuples), "chunks" (sorted chunks behind a hashed filter)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(relset, "BITMAP_BITS", 0)
        if name == "kernels":
            mp.setattr(keysets, "KERNEL_MIN", 1)
            mp.setattr(keysets, "EXPAND_MIN", 1)
            mp.setattr(relset, "BITMAP_WORDS_PER_TUPLE", 1 << 40)
            # every projection asks whether the kept variables determine the dropped ones
            mp.setattr(sparse_rules, "UNIQUE_CHECK_ROWS", float("inf"))
        else:
            mp.setattr(relset, "BITMAP_WORDS_PER_TUPLE", 0)
        yield


def check_all(text: str, facts: dict, arithmetic: bool = False) -> dict:
    """Every representation (dense only without arithmetic) and the sparse engine's other
    code paths against the reference."""
    try:
        want = reference_model(text, facts)
    except reference.RefError as exc:
        with pytest.raises(tl.ProgramError) as info:
            evaluate(text, facts)
        assert info.value.code == exc.code, str(info.value)
        return {}
    for kw in REPRESENTATIONS:
        if arithmetic and kw.get("representation") == "dense":
            with pytest.raises(tl.ProgramError) as info:
                run(text, facts, **kw)
            assert info.value.code == "invalid_option"
            continue
        got, _ = run(text, facts, **kw)
        for p in want:
            assert got[p] == want[p], (kw, p, got[p] ^ want[p])
    for path in ("kernels", "chunks"):
        with engine_path(path):
            got, _ = run(text, facts, representation="sparse")
        for p in want:
            assert got[p] == want[p], (path, p, got[p] ^ want[p])
    return want


# ---------------------------------------------------------------------- random programs
CONSTS = [0, 1, 2, 3, "a", "b"]
PREDS = {"e": 2, "f": 1, "w": 3, "x": 4, "g": 0, "p": 2, "q": 1, "r": 3, "s": 4, "t": 0}
BASE = ("e", "f", "w", "x", "g")
DERIVED = ("p", "q", "r", "s", "t")
TOP = {"out1": 2, "out3": 3}  # arithmetic heads: read by no rule, so values cannot grow forever
VARS = ["A", "B", "C", "D"]


def _atom(draw, pred, arity, pool):
    args = []
    for _ in range(arity):
        kind = draw(st.sampled_from(["var", "var", "var", "const", "anon"]))
        if kind == "const":
            args.append(repr(draw(st.sampled_from(CONSTS))).replace("'", '"'))
        elif kind == "anon":
            args.append("_")
        else:
            args.append(draw(st.sampled_from(pool)) if pool else "_")
    return pred + (f"({', '.join(args)})" if args else "")


def _term(draw, bound):
    a = draw(st.sampled_from(bound))
    if draw(st.booleans()):
        return a
    op = draw(st.sampled_from(["+", "-", "*", "/", "%"]))
    b = draw(st.sampled_from(bound + ["2", "1", "3"]))
    return f"{a} {op} {b}"


@st.composite
def programs(draw):
    rules = []
    for k in range(draw(st.integers(1, 6))):
        top = k > 0 and draw(st.integers(0, 3)) == 0
        body = [
            _atom(draw, p, PREDS[p], VARS)
            for p in draw(st.lists(st.sampled_from(sorted(PREDS)), min_size=1, max_size=3))
        ]
        bound = sorted({v for b in body for v in VARS if f"({v}" in b or f" {v}" in b})
        if draw(st.booleans()):
            p = draw(st.sampled_from(sorted(PREDS)))
            body.append("not " + _atom(draw, p, PREDS[p], bound))
        if bound and draw(st.integers(0, 2)) == 0:
            lhs = draw(st.sampled_from(bound))
            rhs = _term(draw, bound) if top else draw(st.sampled_from(bound + ['"a"', "1"]))
            body.append(f"{lhs} {draw(st.sampled_from(['=', '!=', '<', '>=']))} {rhs}")
        if top and bound:
            head = draw(st.sampled_from(sorted(TOP)))
            args = [_term(draw, bound) for _ in range(TOP[head])]
            rules.append(f"{head}({', '.join(args)}) :- {', '.join(body)}.")
            continue
        head = draw(st.sampled_from(DERIVED))
        pool = bound if draw(st.integers(0, 9)) else VARS
        rules.append(f"{_atom(draw, head, PREDS[head], pool)} :- {', '.join(body)}.")
    facts = {}
    for p in BASE:
        rows = draw(st.lists(st.tuples(*[st.sampled_from(CONSTS)] * PREDS[p]), max_size=7))
        if rows or draw(st.booleans()):
            facts[p] = rows
    return "\n".join(rules), facts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_every_representation_matches_reference(prog):
    text, facts = prog
    rules = [desugar(r) for r in parse_rules(text)]
    check_all(text, facts, arithmetic=has_arithmetic(rules))


# ---------------------------------------------------------------------- conformance
def test_arithmetic_terms():
    want = check_all(
        """
    a(X, Y, X + Y) :- r(X, Y).
    b(Y) :- r(X, _), Y = X * 2.
    c(X - Y - 1, X / 2, X % 4, -X) :- r(X, Y).
    d(X) :- r(X, Y), X + 1 > Y * 2.
    f(X / 2.0) :- r(X, _).
    """,
        {"r": [(7, 2), (-7, 3), (0, 0)]},
        arithmetic=True,
    )
    assert (7, 2, 9) in want["a"] and (-14,) in want["b"]
    assert (-7 - 3 - 1, -3, -3, 7) in want["c"]  # left-associative; / and % toward zero
    got = evaluate(
        "c(X / 0) :- r(X). d(X % 0) :- r(X). e(X + 1) :- s(X).", {"r": [(5,)], "s": [("a",), (1,)]}
    )
    assert got["c"] == set() and got["d"] == set() and got["e"] == {(2,)}  # undefined: no tuple


def test_arithmetic_values_join_the_domain_during_the_fixpoint():
    got = evaluate("n(0).\nn(Y) :- n(X), X < 50, Y = X + 1.\nsq(X, X * X) :- n(X).")
    assert got["n"] == {(i,) for i in range(51)}
    assert (50, 2500) in got["sq"]
    prog = tl.parse("n(0).\nn(Y) :- n(X), X < 5, Y = X + 1.")
    assert prog.symbols("n") == [[0, 1, 2, 3, 4, 5]]
    assert prog.relation("n").to_dense().tolist() == [1.0] * 6


@pytest.mark.parametrize(
    "text, code",
    [
        ("p(Y + 1) :- q(X).", "unbound_variable"),
        ("p(X) :- q(X), Y > X + Z.", "unbound_variable"),
        ("p(X + _) :- q(X).", "unbound_variable"),
        ("Ok() :- not Ok().", "cyclic_negation"),
        ("p(_) :- q(X).", "unbound_variable"),
        ("p(X, Y) :- q(X).", "unbound_variable"),
        ("p(X) :- q(X), not r(X, Y).", "unbound_variable"),
    ],
)
def test_semantic_error_codes(text, code):
    with pytest.raises(tl.ProgramError) as info:
        evaluate(text, {"q": [(1,)]})
    assert info.value.code == code


def test_nullary_atoms_with_parentheses():
    got = evaluate("Ok() :- not Bad().\nBad() :- q(2).\nAlso() :- Ok(), q(1).", {"q": [(1,)]})
    assert got["Ok"] == {()} and got["Bad"] == set() and got["Also"] == {()}


def test_percent_is_modulo_after_an_operand_and_a_comment_elsewhere():
    got = evaluate("% a comment\nm(X % 3) :- r(X). % another\n", {"r": [(7,), (9,)]})
    assert got["m"] == {(1,), (0,)}


# ---------------------------------------------------------------------- Relation results
def test_relation_object():
    edges = np.array([[1, 2], [2, 3], [3, 4]])
    rels = evaluate(TC, {"e": edges}, as_relations=True)
    p = rels["p"]
    assert isinstance(p, Relation) and p.is_sparse and len(p) == 6
    a, b = p.columns
    assert a.dtype == np.int64 and sorted(zip(a.tolist(), b.tolist())) == sorted(p)
    assert (1, 4) in p and (4, 1) not in p and ("x", 1) not in p and (1,) not in p
    assert p.to_set() == {(1, 2), (2, 3), (3, 4), (1, 3), (2, 4), (1, 4)}
    assert p.weights is None and "6 tuples" in repr(p)
    df = p.to_pandas()
    assert list(df.columns) == ["c0", "c1"] and len(df) == 6
    dense = p.to_dense()
    assert dense.shape == (4, 4) and dense.sum() == 6
    assert [s.tolist() for s in p.symbols] == [[1, 2, 3, 4], [1, 2, 3, 4]]
    with pytest.raises(tl.ProgramError) as info:
        evaluate(TC, {"e": edges}, as_relations=True, memory_budget=10)["p"].to_dense()
    assert info.value.code == "memory_budget"
    with pytest.raises(KeyError):
        rels["nope"]


def test_relation_strings_mixed_and_weights():
    rels = evaluate(
        "q(X, Y) :- r(X, Y).",
        {"r": {("a", 1): 0.5, (2.5, "b"): 0.25}},
        semantics="fuzzy",
        as_relations=True,
    )
    q = rels["q"]
    assert q.to_set() == {("a", 1), (2.5, "b")}
    w = dict(zip(q, q.weights.tolist()))
    assert w[("a", 1)] == pytest.approx(0.5) and w[(2.5, "b")] == pytest.approx(0.25)
    assert "weight" in q.to_pandas().columns


def test_program_run_returns_relations_past_the_budget_and_relation_by_name():
    prog = tl.parse("p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z).")
    out = prog.run(facts={"e": [(1, 2), (2, 3)]})
    assert isinstance(out["p"], np.ndarray) and out["p"].sum() == 3
    n = 3000
    out = prog.run(facts={"e": (np.arange(n - 1), np.arange(1, n))}, memory_budget=1 << 24)
    assert isinstance(out["e"], Relation) and len(out["e"]) == n - 1
    assert len(prog.relation("p")) == n * (n - 1) // 2
    assert prog.query("e") == {(i, i + 1) for i in range(n - 1)}


def test_program_run_takes_facts_by_keyword():
    prog = tl.parse("anc(X, Y) :- Parent(X, Y).\nanc(X, Z) :- anc(X, Y), Parent(Y, Z).")
    prog.run(Parent=[("a", "b"), ("b", "c")])
    assert prog.query("anc") == {("a", "b"), ("b", "c"), ("a", "c")}
    with pytest.raises(tl.ProgramError) as info:
        prog.run(Parent=[("a", "b")], facts={"Parent": [("b", "c")]})
    assert info.value.code == "invalid_fact"


# ---------------------------------------------------------------------- array inputs
def test_array_inputs_agree_with_tuples():
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 30, (80, 2))
    want = evaluate(TC, {"e": [tuple(r) for r in arr.tolist()]})["p"]
    assert evaluate(TC, {"e": arr})["p"] == want
    assert evaluate(TC, {"e": (arr[:, 0], arr[:, 1])})["p"] == want
    pd = pytest.importorskip("pandas")
    assert evaluate(TC, {"e": pd.DataFrame({"s": arr[:, 0], "d": arr[:, 1]})})["p"] == want
    strs = np.array([f"n{i}" for i in range(5)])
    got = evaluate("q(X) :- r(X).", {"r": strs})["q"]
    assert got == {(s,) for s in strs.tolist()}
    got = evaluate(
        "q(X, Y) :- r(X, Y).", {"r": (np.array([1.5, 2.0]), np.array(["a", "b"], dtype=object))}
    )["q"]
    assert got == {(1.5, "a"), (2, "b")}


@pytest.mark.parametrize(
    "facts",
    [
        {"e": np.zeros((2, 2, 2))},
        {"e": (np.array([1, 2]), np.array([1]))},
        {"e": np.array([[1.0, np.nan]])},
        {"e": (np.array([1, 2]), np.array([None, 1], dtype=object))},
        {"e": np.array([[1 + 2j, 2]])},
    ],
)
def test_bad_array_inputs(facts):
    with pytest.raises(tl.ProgramError) as info:
        evaluate(TC, facts)
    assert info.value.code == "invalid_fact"


# ---------------------------------------------------------------------- scale and shape
def test_ten_million_constants():
    n = 10_000_000
    got = evaluate(
        "small(X) :- big(X), X < 5.\nnext(Y) :- small(X), Y = X + n0, big(Y).\n".replace(
            "n0", str(n - 5)
        ),
        {"big": np.arange(n)},
        as_relations=True,
    )
    assert got["small"].to_set() == {(i,) for i in range(5)}
    assert got["next"].to_set() == {(n - 5 + i,) for i in range(5)}
    assert len(got["big"]) == n


def test_arity_four_with_keys_wider_than_62_bits():
    rng = np.random.default_rng(3)
    base = 1 << 20  # 4 x 21 bits of symbol ids: rows are ranked, not packed
    x = rng.integers(0, 4, (60, 4)) * base + rng.integers(0, 3, (60, 4))
    facts = {"x": x, "f": x[:20, :1]}
    text = """
    s(A, B, C, D) :- x(A, B, C, D), not f(D).
    s(A, B, C, D) :- s(D, C, B, A), x(A, _, _, _).
    j(A, D) :- s(A, B, C, D), x(D, B, _, _).
    k(A) :- x(A, A, _, _).
    """
    check_all(
        text, {"x": [tuple(r) for r in x.tolist()], "f": [tuple(r) for r in x[:20, :1].tolist()]}
    )
    sparse, _ = run(text, facts, representation="sparse")
    want = reference_model(
        text, {"x": [tuple(r) for r in x.tolist()], "f": [tuple(r) for r in x[:20, :1].tolist()]}
    )
    assert all(sparse[p] == want[p] for p in want)


def test_comparison_over_a_large_domain_builds_no_matrix():
    n = 4000
    e = np.stack([np.arange(n), (np.arange(n) * 7) % n], axis=1)
    got = evaluate(
        "p(X, Y) :- e(X, Y), X != Y.\nq(X, Y) :- e(X, Y), X < Y.", {"e": e}, memory_budget=1 << 22
    )  # a dense 4000 x 4000 matrix would need 64 MB
    assert len(got["p"]) == sum(1 for a, b in e if a != b)
    assert len(got["q"]) == sum(1 for a, b in e if a < b)
    with pytest.raises(tl.ProgramError) as info:
        evaluate(
            "p(X, Y) :- e(X, Y), X != Y.", {"e": e}, memory_budget=1 << 22, representation="dense"
        )
    assert info.value.code == "memory_budget"


def test_dense_rounds_take_over_dense_fixpoints():
    rng = np.random.default_rng(5)
    n = 60
    e = np.stack([np.repeat(np.arange(n), 8), rng.integers(0, n, 8 * n)], axis=1)
    got, ev = run(TC, {"e": e})
    kinds = ev.round_kinds[("p",)]
    assert kinds.startswith("S") and kinds.strip("S"), kinds  # sparse first, then dense
    want = reference_model(TC, {"e": [tuple(r) for r in e.tolist()]})
    assert got["p"] == want["p"]


def test_dense_switch_comes_before_the_round_that_would_outgrow_the_cells():
    # 200 nodes, out-degree 4: the third sparse round would already touch more binding rows
    # than the 40,000 cells of the dense relation, so the switch happens after the second
    # (predicted from the growth of the rounds), and the dense rounds inherit the sparse
    # rounds' measured growth: no sparse attempt over budget right after the switch
    rng = np.random.default_rng(5)
    n = 200
    e = np.stack([np.repeat(np.arange(n), 4), rng.integers(0, n, 4 * n)], axis=1)
    # a fixed cost per candidate row: measured costs vary with the machine's load
    got, ev = run(TC, {"e": e}, flops_per_candidate=fixpoint.FLOPS_PER_CANDIDATE)
    kinds = ev.round_kinds[("p",)]
    assert kinds.startswith("SSSd") and "x" not in kinds, kinds
    want = reference_model(TC, {"e": [tuple(r) for r in e.tolist()]})
    assert got["p"] == want["p"]


@pytest.mark.parametrize("sem", ["fuzzy", "probabilistic"])
def test_weighted_semantics_sparse_matches_dense(sem):
    rng = np.random.default_rng(2)
    facts = {
        "e": {
            (int(a), int(b)): float(w)
            for a, b, w in zip(rng.integers(0, 12, 30), rng.integers(0, 12, 30), rng.random(30))
        }
    }
    text = "p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z).\nq(X) :- p(X, X), not e(X, X)."
    out = {}
    for rep in ("dense", "sparse"):
        an, rels, _ = evaluate_rules(
            parse_rules(text), normalize_facts(facts), Options(semantics=sem, representation=rep)
        )
        out[rep] = {p: dict(zip(rels[p], rels[p].weights.tolist())) for p in ("p", "q")}
    for p in ("p", "q"):
        assert out["dense"][p].keys() == out["sparse"][p].keys()
        for k, w in out["dense"][p].items():
            assert out["sparse"][p][k] == pytest.approx(w, rel=1e-4, abs=1e-5), (p, k)


def test_relation_sets_from_shared_objects_and_from_columns():
    """to_set and iteration gather from the symbol table's objects when it is small next to the
    relation, else convert the decoded columns: the same tuples, values of the same types."""
    rows = [(1, "a"), (2.5, "b"), (3, 3), ("c", -1)]
    small = evaluate("q(X, Y) :- r(X, Y).", {"r": rows}, as_relations=True)["q"]
    big = evaluate(
        "q(X, Y) :- r(X, Y).", {"r": rows, "pad": np.arange(1000, 5000)[:, None]}, as_relations=True
    )["q"]
    for rel in (small, big):
        got = rel.to_set()
        assert got == set(rows) == set(iter(rel))
        assert {type(v) for r in got for v in r} == {int, float, str}


@pytest.mark.parametrize("functional", [True, False])
def test_projection_skips_deduplication_only_when_the_kept_variables_determine_the_dropped(
    functional, monkeypatch
):
    """Same-generation drops the parent after joining it: a child has one parent, so no two
    rows can become equal and no deduplication runs; with a second parent for some child, the
    rows are deduplicated. Either way the model is the reference's."""
    rng = np.random.default_rng(11)
    n = 40
    child = np.arange(1, n)
    par = [(int(c), int(rng.integers(0, c))) for c in child]
    if not functional:
        par += [(int(c), int(rng.integers(0, c))) for c in child[::3]]
    facts = {"par": par, "node": [(i,) for i in range(n)]}
    text = "sg(X, X) :- node(X).\nsg(X, Y) :- par(X, XP), sg(XP, YP), par(Y, YP)."
    answers = []
    real = sparse_rules.Table.determines

    def spy(self, kept, gone, bits):
        answers.append(real(self, kept, gone, bits))
        return answers[-1]

    monkeypatch.setattr(sparse_rules.Table, "determines", spy)
    monkeypatch.setattr(sparse_rules, "UNIQUE_CHECK_ROWS", float("inf"))
    got, _ = run(text, facts, representation="sparse")
    assert got["sg"] == reference_model(text, facts)["sg"]
    assert answers and all(answers) == functional
