"""Programs in the forms of the common Datalog test suites (Souffle-style): recursion of every
shape, mutual recursion, stratified negation, comparisons, arithmetic, constants in heads,
nullary atoms, duplicate rules, string and integer facts, wildcards, arities up to 4 and the
semantic error codes. Each runs sparse, dense (no arithmetic), mixed and through the sparse
engine's kernel and sorted-chunk paths, against the reference evaluator of ``reference.py``."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.datalog import evaluate
from tensorlogic.lang.analysis import desugar, has_arithmetic
from tensorlogic.lang.parser import parse_rules

from .test_sparse import check_all

CHAIN = {"e": [(i, i + 1) for i in range(6)] + [(6, 2)]}
GRAPH = {
    "e": [(1, 2), (2, 3), (3, 1), (3, 4), (5, 6), (6, 6), (4, 7)],
    "node": [(i,) for i in range(1, 9)],
}


def rng_edges(seed: int, n: int, m: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return sorted(set(zip(rng.integers(0, n, m).tolist(), rng.integers(0, n, m).tolist())))


PROGRAMS = {
    "left_recursion": ("p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z).", CHAIN),
    "right_recursion": ("p(X, Y) :- e(X, Y).\np(X, Z) :- e(X, Y), p(Y, Z).", CHAIN),
    "doubly_recursive": ("p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), p(Y, Z).", CHAIN),
    "random_closure": (
        "p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), p(Y, Z).",
        {"e": rng_edges(3, 25, 40)},
    ),
    "mutual_even_odd": (
        """
        even(0).
        odd(Y) :- even(X), succ(X, Y).
        even(Y) :- odd(X), succ(X, Y).
        """,
        {"succ": [(i, i + 1) for i in range(9)]},
    ),
    "mutual_three_way": (
        """
        a(X) :- s(X).
        b(Y) :- a(X), e(X, Y).
        c(Y) :- b(X), e(X, Y).
        a(Y) :- c(X), e(X, Y), Y != 4.
        """,
        {**GRAPH, "s": [(1,)]},
    ),
    "same_generation": (
        """
        sg(X, X) :- node(X).
        sg(X, Y) :- par(X, XP), sg(XP, YP), par(Y, YP), X != Y.
        """,
        {"node": [(i,) for i in range(12)], "par": [(i, (i - 1) // 2) for i in range(1, 12)]},
    ),
    "stratified_negation": (
        """
        reach(X) :- start(X).
        reach(Y) :- reach(X), e(X, Y).
        unreach(X) :- node(X), not reach(X).
        lonely(X) :- unreach(X), not e(X, _), not e(_, X).
        """,
        {**GRAPH, "start": [(1,)]},
    ),
    "negation_of_recursive_with_constants": (
        """
        p(X, Y) :- e(X, Y).
        p(X, Z) :- p(X, Y), e(Y, Z).
        notfrom1(X) :- node(X), !p(1, X).
        cyclic(X) :- p(X, X).
        acyclic(X) :- node(X), \\+ cyclic(X).
        """,
        GRAPH,
    ),
    "comparisons": (
        """
        lt(X, Y) :- v(X), v(Y), X < Y.
        ge(X, Y) :- v(X), v(Y), X >= Y, X != Y.
        big(X) :- v(X), X > 2.
        strs(X) :- v(X), X >= "b".
        eq(X, Y) :- v(X), w(Y), X = Y.
        """,
        {
            "v": [(1,), (2,), (3,), (2.5,), ("a",), ("b",), ("c",)],
            "w": [(2,), ("b",), (2.0,), ("z",)],
        },
    ),
    "arithmetic": (
        """
        fib(0, 0).
        fib(1, 1).
        fib(N + 1, A + B) :- fib(N, A), fib(N - 1, B), N < 15.
        sq(X, Y) :- fib(X, _), Y = X * X.
        divmod(X, X / 3, X % 3) :- n(X).
        """,
        {"n": [(-7,), (-1,), (0,), (5,), (9,)]},
    ),
    "arithmetic_counter_and_comparison": (
        """
        cnt(0).
        cnt(Y) :- cnt(X), Y = X + 3, Y <= 20.
        pair(X, Y) :- cnt(X), cnt(Y), X + Y = 21.
        """,
        {},
    ),
    "constants_in_heads": (
        """
        tag("src", X) :- e(X, _).
        tag("dst", Y) :- e(_, Y).
        both(X, "yes", 1) :- tag("src", X), tag("dst", X).
        """,
        GRAPH,
    ),
    "nullary_atoms": (
        """
        has_cycle() :- e(X, Y), e(Y, X).
        has_self :- e(X, X).
        ok() :- not bad().
        bad() :- e(100, _).
        out(X) :- node(X), has_self, ok().
        none(X) :- node(X), not has_cycle().
        """,
        GRAPH,
    ),
    "duplicate_rules_and_facts": (
        """
        p(X, Y) :- e(X, Y).
        p(X, Y) :- e(X, Y).
        p(X, Z) :- p(X, Y), e(Y, Z).
        p(X, Z) :- p(X, Y), e(Y, Z).
        e(1, 2).
        e(1, 2).
        """,
        {"e": [(2, 3), (2, 3)]},
    ),
    "string_and_int_facts": (
        """
        parent("alice", "bob").
        parent("bob", "carol").
        parent("carol", 7).
        parent(7, "dave").
        anc(X, Y) :- parent(X, Y).
        anc(X, Z) :- anc(X, Y), parent(Y, Z).
        """,
        {},
    ),
    "wildcards": (
        """
        src(X) :- e(X, _).
        two(X) :- e(X, _), e(_, X).
        any() :- e(_, _).
        w3(A) :- t(A, _, _).
        w4(B, D) :- q(_, B, _, D).
        """,
        {**GRAPH, "t": [(1, 2, 3), (4, 5, 6)], "q": [(1, 2, 3, 4), (5, 6, 7, 8)]},
    ),
    "repeated_variables": (
        """
        self(X) :- e(X, X).
        diag(X, Y) :- t(X, Y, X).
        same(A) :- q(A, A, A, A).
        """,
        {
            **GRAPH,
            "t": [(1, 2, 1), (1, 2, 3), (4, 4, 4)],
            "q": [(1, 1, 1, 1), (1, 2, 1, 1), ("a", "a", "a", "a")],
        },
    ),
    "arity_three_and_four": (
        """
        path3(A, B, C) :- e(A, B), e(B, C).
        path4(A, B, C, D) :- path3(A, B, C), e(C, D), A != D.
        r4(A, B, C, D) :- q(A, B, C, D).
        r4(A, B, C, D) :- r4(D, A, B, C), A < 9.
        back(A, D) :- path4(A, _, _, D), not r4(A, _, _, D).
        """,
        {**GRAPH, "q": [(1, 2, 3, 4), (5, "x", 7, 8)]},
    ),
    "recursion_through_arity_three": (
        """
        reach(X, Y, 1) :- e(X, Y).
        reach(X, Z, N + 1) :- reach(X, Y, N), e(Y, Z), N < 4.
        """,
        GRAPH,
    ),
    "equality_binding": (
        """
        copy(X, Y) :- e(X, Z), Y = Z.
        const(X, Y) :- node(X), Y = "c".
        loop(X) :- e(X, Y), X = Y.
        """,
        GRAPH,
    ),
    "empty_inputs": (
        """
        p(X) :- q(X).
        r(X) :- node(X), not p(X).
        """,
        {"q": [], "node": [(1,), (2,)]},
    ),
    "deep_strata": (
        """
        s1(X) :- node(X), not e(X, _).
        s2(X) :- node(X), not s1(X).
        s3(X) :- node(X), not s2(X), X > 2.
        s4(X) :- s2(X), not s3(X).
        """,
        GRAPH,
    ),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_matches_reference(name):
    text, facts = PROGRAMS[name]
    arithmetic = has_arithmetic([desugar(r) for r in parse_rules(text)])
    want = check_all(text, facts, arithmetic=arithmetic)
    assert want  # a model was computed (no error expected for these programs)
    # something was derived beyond the facts (the programs are not vacuous)
    heads = {
        line.split("(")[0].split(":-")[0].strip() for line in text.splitlines() if ":-" in line
    }
    assert any(want[h] for h in heads), name


def test_expected_models():
    """A few least models written out, so that the reference itself is checked."""
    got = evaluate(*PROGRAMS["mutual_even_odd"])
    assert got["even"] == {(0,), (2,), (4,), (6,), (8,)}
    assert got["odd"] == {(1,), (3,), (5,), (7,), (9,)}
    got = evaluate(*PROGRAMS["arithmetic"])
    assert (15, 610) in got["fib"] and (10, 100) in got["sq"]
    assert (-7, -2, -1) in got["divmod"] and (9, 3, 0) in got["divmod"]
    got = evaluate(*PROGRAMS["string_and_int_facts"])
    assert ("alice", "dave") in got["anc"] and ("alice", 7) in got["anc"]
    got = evaluate(*PROGRAMS["stratified_negation"])
    assert got["unreach"] == {(5,), (6,), (8,)} and got["lonely"] == {(8,)}
    got = evaluate(*PROGRAMS["nullary_atoms"])
    assert got["has_cycle"] == {()} and got["ok"] == {()} and got["none"] == set()


@pytest.mark.parametrize(
    "text, code",
    [
        ("p(X) :- q(X), not p(X).", "cyclic_negation"),
        ("a(X) :- q(X), not b(X).\nb(X) :- q(X), not a(X).", "cyclic_negation"),
        ("a(X) :- q(X), not b(X).\nb(X) :- c(X).\nc(X) :- a(X).", "cyclic_negation"),
        ("p(X, Y) :- q(X).", "unbound_variable"),
        ("p(_) :- q(X).", "unbound_variable"),
        ("p(X) :- not q(X).", "unbound_variable"),
        ("p(X) :- q(Y), X > 3.", "unbound_variable"),
        ("p(X) :- q(Y), X != Y.", "unbound_variable"),
        ("p(X) :- q(X), Y = Z.", "unbound_variable"),
        ("p(X + Y) :- q(X).", "unbound_variable"),
        ("p(X :- q(X).", "parse_error"),
        ("p(X) :- q(X)", "parse_error"),
        ("p(X) :- q(X),.", "parse_error"),
        ("p(X) :- .", "parse_error"),
        ('p("unterminated) :- q(X).', "parse_error"),
        ("p(X) : q(X).", "parse_error"),
        ("p(X) :- q(X, Y).\np(X) :- q(X).", "arity_mismatch"),
    ],
)
def test_error_codes(text, code):
    with pytest.raises(tl.ProgramError) as info:
        evaluate(text, {"q": [(1,)]} if code != "arity_mismatch" else {})
    assert info.value.code == code, str(info.value)


def test_comments_of_every_kind():
    got = evaluate("""
        e(1, 2). // a line comment
        e(2, 3). # another
        /* a block comment
           p(X) :- e(X, _).   (inside it: not a rule) */
        q(Y) :- e(_, Y). /* trailing */ r(X) :- q(X).
        """)
    assert "p" not in got and got["q"] == {(2,), (3,)} and got["r"] == got["q"]
    with pytest.raises(tl.ProgramError) as info:
        evaluate("e(1, 2).\n/* never closed\n")
    assert info.value.code == "parse_error" and "line 2" in str(info.value)
    with pytest.raises(tl.ProgramError) as info:
        evaluate("/* a\nb */ p(X :- e(X).")
    assert info.value.code == "parse_error" and "line 2, column 10" in str(info.value)


def test_integers_past_64_bits_are_refused_with_a_code():
    with pytest.raises(tl.ProgramError) as info:
        evaluate("q(99999999999999999999999). p(X) :- q(X).")
    assert info.value.code == "parse_error" and "64 bits" in str(info.value)
    with pytest.raises(tl.ProgramError) as info:
        evaluate("p(X) :- q(X).", {"q": [(1,), (2**70,)]})
    assert info.value.code == "invalid_fact" and "64-bit" in str(info.value)
    top = 2**63 - 1
    assert evaluate(f"q({top}). p(X) :- q(X).")["p"] == {(top,)}


def test_tuple_lists_of_every_kind_of_constant():
    """Lists of int tuples take a vectorized path; mixed, float and string rows the general one:
    the same models either way."""
    for rows in (
        [(1, 2), (2, 3), (1, 2)],
        [(1, 2), (2, "a")],
        [(1, 2.5), (2, 3)],
        [(True, 2), (2, 3)],
        [(1, 2), [2, 3]],
    ):
        got = evaluate("p(X, Z) :- e(X, Y), e(Y, Z).\nq(X, Y) :- e(X, Y).", {"e": rows})
        norm = {tuple(r) for r in rows}
        assert got["q"] == norm
        assert got["p"] == {(a, d) for a, b in norm for c, d in norm if b == c}


SOUFFLE_FORMS = {
    "souffle_directives": (
        """
        .type Node <: symbol
        .decl edge(x: Node, y: Node)
        .decl path(x: Node, y: Node) btree
        .input edge
        .output path
        edge("a", "b"). edge("b", "c").
        path(x, y) :- edge(x, y).
        path(x, z) :- path(x, y), edge(y, z).
        """,
        {"edge": [("c", "d")]},
    ),
    "odd_strings": (
        r"""
        s("a\"b", 1). s("c\\d", 2). s("with, comma", 3). s("paren) (", 4).
        s("rule :- inside", 5). s("// not a comment", 6). s("/* nor this */", 7).
        s("tab\there", 8). s("ünïcødé ✓", 9). s("", 10). s("not", 11). s(" spaced ", 12).
        name(X) :- s(X, _).
        hit(N) :- s("with, comma", N).
        hit(N) :- s("", N).
        other(X) :- s(X, N), X != "not", N > 5.
        """,
        {},
    ),
    "numbers_versus_symbols": (
        """
        n(1). n("1"). n(-1). n(1.5). n(0x10). n("0x10"). n(0b11). n("abc").
        same(X) :- n(X), m(X).
        num(X) :- n(X), X > 0.
        sym(X) :- n(X), X >= "".
        """,
        {"m": [("1",), (16,), (3,), ("abc",), (2,)]},
    ),
    "constant_arithmetic_in_facts": (
        """
        expr(-5). expr(- 7). expr(-(2 * 3)). expr(1 + 2 * 3). expr((1 + 2) * 3).
        expr(10 - 2 - 3). expr(7 / -2). expr(-7 % 3). expr(0x1F). expr(2147483647 + 1).
        pos(X) :- expr(X), X > 0.
        """,
        {},
    ),
    "unused_and_empty_relations": (
        """
        p(X) :- q(X), r(X).
        s(X) :- q(X), not r(X).
        t(X) :- q(X), not empty_input(X, _).
        u(X) :- never(X).
        """,
        {"q": [(1,), (2,)], "unused": [(7, 8, 9)], "empty_input": []},
    ),
    "ground_rules_and_bodies": (
        """
        p(1) :- q(2).
        p(3) :- q(4).
        yes() :- 1 < 2.
        no() :- 2 < 1.
        one(X) :- X = 1.
        two(X, Y) :- one(X), Y = X + 1.
        """,
        {"q": [(2,)]},
    ),
    "repeated_variables_in_heads": (
        """
        refl(X, X) :- node(X).
        back(X, Y, X) :- e(X, Y).
        loop2(X) :- e(X, Y), e(Y, X).
        """,
        GRAPH,
    ),
    "disjunction": (
        """
        either(X) :- b(X); c(X).
        some(X) :- b(X), X > 0; c(X), X < 5; b(X), c(X).
        reach(X) :- start(X); reach(Y), e(Y, X).
        """,
        {**GRAPH, "b": [(1,), (-1,)], "c": [(2,), (9,)], "start": [(5,)]},
    ),
    "recursion_guarded_by_lower_negation": (
        """
        blocked(4).
        reach(X) :- start(X).
        reach(Y) :- reach(X), e(X, Y), not blocked(Y).
        stuck(X) :- node(X), not reach(X).
        """,
        {**GRAPH, "start": [(1,)]},
    ),
}


@pytest.mark.parametrize("name", sorted(SOUFFLE_FORMS))
def test_souffle_forms_match_reference(name):
    text, facts = SOUFFLE_FORMS[name]
    arithmetic = has_arithmetic([desugar(r) for r in parse_rules(text)])
    assert check_all(text, facts, arithmetic=arithmetic)


def test_souffle_forms_expected_models():
    got = evaluate(*SOUFFLE_FORMS["souffle_directives"])
    assert got["path"] == {("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("b", "d"), ("a", "d")}
    got = evaluate(*SOUFFLE_FORMS["odd_strings"])
    assert {('a"b',), ("c\\d",), ("tab\there",), ("ünïcødé ✓",), ("",)} <= got["name"]
    assert got["hit"] == {(3,), (10,)} and ("not",) not in got["other"]
    assert len(got["name"]) == 12
    got = evaluate(*SOUFFLE_FORMS["numbers_versus_symbols"])
    assert got["same"] == {("1",), (16,), (3,), ("abc",)}
    assert got["num"] == {(1,), (1.5,), (16,), (3,)}
    assert got["sym"] == {("1",), ("0x10",), ("abc",)}
    got = evaluate(*SOUFFLE_FORMS["constant_arithmetic_in_facts"])
    assert got["expr"] == {(v,) for v in (-5, -7, -6, 7, 9, 5, -3, -1, 31, 2147483648)}
    got = evaluate(*SOUFFLE_FORMS["unused_and_empty_relations"])
    assert got["p"] == set() and got["s"] == {(1,), (2,)} and got["t"] == got["s"]
    assert got["u"] == set() and got["unused"] == {(7, 8, 9)}
    got = evaluate(*SOUFFLE_FORMS["ground_rules_and_bodies"])
    assert got["p"] == {(1,)} and got["yes"] == {()} and got["no"] == set()
    assert got["two"] == {(1, 2)}
    got = evaluate(*SOUFFLE_FORMS["disjunction"])
    assert got["either"] == {(1,), (-1,), (2,), (9,)} and got["some"] == {(1,), (2,)}
    assert got["reach"] == {(5,), (6,)}
    got = evaluate(*SOUFFLE_FORMS["recursion_guarded_by_lower_negation"])
    assert got["reach"] == {(1,), (2,), (3,)} and (4,) in got["stuck"]


def test_declared_relations():
    # a .decl relation exists (empty) even when nothing derives it, and fixes its arity
    got = evaluate(".decl r(x: number, y: symbol)\n.decl s(x: number)\ns(X) :- r(X, _).")
    assert got["r"] == set() and got["s"] == set()
    rel = evaluate(".decl r(x: number, y: number)", as_relations=True)["r"]
    assert rel.arity == 2 and len(rel) == 0
    assert evaluate(".decl n()\nn().")["n"] == {()}
    for text, facts, code in [
        (".decl p(x: number)\np(1, 2).", None, "arity_mismatch"),
        (".decl p(x: number)\nq(X) :- p(X, _).", None, "arity_mismatch"),
        (".decl p(x: number)", {"p": [(1, 2)]}, "arity_mismatch"),
        (".decl p(x: number)\n.decl p(x: number)", None, "parse_error"),
        (".decl p(x: number) eqrel", None, "parse_error"),
        (".decl p(x number)", None, "parse_error"),
        (".functor f(x: number): number", None, "parse_error"),
    ]:
        with pytest.raises(tl.ProgramError) as info:
            evaluate(text, facts)
        assert info.value.code == code, (text, str(info.value))


def test_integer_overflow_wraps_without_warnings():
    # 64-bit integers wrap around as in Souffle; no numpy warning reaches the user
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = evaluate("p(X + 1) :- q(X). q(9223372036854775807).")
    assert got["p"] == {(-(2**63),)}
