"""What a first compile of a tensor network spends: each einsum's program built once, layout
timing only where it can pay, and costs computed without building programs."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import opt_einsum
import pytest
from hypothesis import given, settings, strategies as st
from opt_einsum.testing import rand_equation

import tensorlogic as tl
from tensorlogic.ir import pair_layout, pairwise, sliced
from tensorlogic.ir import spec as einspec


def _costs_match(spec, shapes, path):
    es = einspec.parse(spec, [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    plan = pairwise.plan_einsum(es, shapes, sizes, path)
    costs = pairwise.path_costs(es, shapes, sizes, path)
    assert (costs.flops, costs.largest_intermediate) == (plan.flops, plan.largest_intermediate)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 14),
    reg=st.integers(2, 4),
    n_out=st.integers(0, 3),
    seed=st.integers(0, 2**16),
    strategy=st.sampled_from(["greedy", "optimal", "random"]),
)
def test_path_costs_are_the_plans(n, reg, n_out, seed, strategy):
    eq, shapes = rand_equation(n, reg, n_out=n_out, d_min=1, d_max=4, seed=seed)[:2]
    es = einspec.parse(eq, [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    terms = pairwise.prepared_terms(es, shapes, sizes)
    if strategy == "random":  # any order, multi-operand steps included
        rng = np.random.default_rng(seed)
        path, left = [], len(terms)
        while left > 1:
            k = int(rng.integers(2, min(left, 3) + 1))
            step = tuple(int(i) for i in rng.choice(left, k, replace=False))
            path.append(step)
            left -= k - 1
    else:
        path = pairwise.contraction_path(terms, es.output, sizes, "greedy")[0]
    _costs_match(eq, shapes, path)
    contracted = [c for c in sizes if c not in es.output]
    if contracted:
        sl = contracted[:1]
        ps = sliced.plan_sliced(es, shapes, sizes, path, sl, "float64")
        cs = sliced.sliced_costs(es, shapes, sizes, path, sl)
        assert (cs.flops, cs.largest_intermediate) == (ps.flops, ps.largest_intermediate)


@pytest.mark.parametrize(
    "spec,shapes,path",
    [
        ("iij,jk,kl->il", [(3, 3, 4), (4, 5), (5, 2)], [(0, 1, 2)]),  # a diagonal, one step
        ("ij,jk,kl,lm->im", [(3, 1), (4, 5), (5, 2), (2, 6)], [(0, 1, 2), (0, 1)]),  # broadcast
        ("abc,cd,de,a->be", [(2, 3, 4), (4, 5), (5, 2), (2,)], [(1, 2), (0, 1, 2)]),
        ("abx,bcx,cd->adx", [(2, 3, 2), (3, 4, 2), (4, 2)], [(0, 2, 1)]),  # a batch letter
        ("ab,ab,ab->ab", [(2, 3)] * 3, [(0, 1), (0, 1)]),  # no summed letter
        ("ab,cd,ef->abcdef", [(2, 0), (3, 4), (1, 2)], [(0, 1), (0, 1)]),  # an empty operand
    ],
)
def test_path_costs_of_special_layouts(spec, shapes, path):
    _costs_match(spec, shapes, path)


def _network(n, seed, d_max=3):
    eq, shapes = rand_equation(n, 3, n_out=2, d_min=2, d_max=d_max, seed=seed)[:2]
    return eq, shapes


def test_each_einsum_is_planned_once(monkeypatch, tmp_path):
    # the optimizer costs the path; only the backend builds the program (with its dtypes,
    # matmul and timed layouts)
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path))
    planned = []
    real = pairwise._plan_einsum
    monkeypatch.setattr(pairwise, "_PLANS", OrderedDict())  # no plan memoized by other tests
    monkeypatch.setattr(
        pairwise, "_plan_einsum", lambda *a, **k: planned.append(1) or real(*a, **k)
    )
    eq, shapes = _network(30, 4)
    g = tl.EinsumGraph()
    xs = [g.input(f"x{i}", s, "float64") for i, s in enumerate(shapes)]
    g.output(g.einsum(eq, *xs), "y")
    tl.compile(g, "numpy", 2, cache=False)
    assert len(planned) == 1


def _chooser_case(est, budget=1.0):
    built = []

    def build(i):
        def make():
            built.append(i)
            # candidate 1 is the fast one whatever the estimates say
            fn = lambda xp, A, B, out, scratch: A.sum() if i == 1 else (A @ A.T).sum()  # noqa: E731
            return fn, []

        return make

    chooser = pair_layout.Chooser(True, budget)
    shapes = [((64, 64), "float64"), ((64,), "float64")]
    return chooser, [build(i) for i in range(len(est))], shapes, built


def test_a_clear_choice_is_not_timed():
    # every other candidate estimated over CLEAR_RATIO times the best: no timing
    r = pair_layout.CLEAR_RATIO
    chooser, build, shapes, built = _chooser_case([1e6, r * 1e6 * 1.5, r * 1e6 * 2])
    assert chooser.choose([1e6, r * 1e6 * 1.5, r * 1e6 * 2], build, shapes) == 0
    assert built == [] and chooser.timed == 0


def test_a_tiny_step_is_not_timed():
    est = [pair_layout.MEASURE_MIN_NS / 2, pair_layout.MEASURE_MIN_NS / 2 * 1.1]
    chooser, build, shapes, built = _chooser_case(est)
    assert chooser.choose(est, build, shapes) == 0 and built == []


def test_only_near_candidates_are_timed_and_the_fastest_wins():
    est = [1e5, 1.2e5, 1e5 * pair_layout.CLEAR_RATIO * 2]
    chooser, build, shapes, built = _chooser_case(est)
    assert chooser.choose(est, build, shapes) == 1  # measured, against the estimates
    assert sorted(built) == [0, 1] and chooser.timed == 1


def test_timing_beyond_the_budget_is_skipped():
    est = [1e5, 1.2e5]
    # a budget shorter than timing both would take
    budget = pair_layout.TIMING_RUNS * sum(est) * 1e-9 / 2
    chooser, build, shapes, built = _chooser_case(est, budget)
    assert chooser.choose(est, build, shapes) == 0 and built == []


def test_a_timed_choice_is_remembered(monkeypatch):
    monkeypatch.setattr(pair_layout, "_TIMED", {})
    est = [1e5, 1.2e5]
    key = ("a step", 2)
    chooser, build, shapes, built = _chooser_case(est)
    assert chooser.choose(est, build, shapes, key) == 1
    first = list(built)
    # another einsum's chooser, same step: the memo answers, nothing runs
    chooser2, build2, _, built2 = _chooser_case(est)
    assert chooser2.choose(est, build2, shapes, key) == 1
    assert first and built2 == [] and chooser2.timed == 0


def test_budget_scales_with_the_estimated_call():
    # a short call gets the floor (the compile target allows 100 ms below 10 ms calls)
    assert pair_layout.budget_for(10**6, 10) == pair_layout.MEASURE_BUDGET_MIN_S
    large = pair_layout.budget_for(10**9, 10)
    assert large == pytest.approx(pair_layout.MEASURE_BUDGET_CALLS * (0.1 + 4e-6))
    assert pair_layout.Chooser(True, 10.0).budget_s == pair_layout.MEASURE_BUDGET_S


@pytest.mark.parametrize(
    "kind,seed",
    [("rrg", 1), ("rrg", 2), ("tree", 3), ("tree", 4), ("lattice", 5)],
)
def test_networks_match_opt_einsum(kind, seed, tmp_path, monkeypatch):
    # networks of 20-60 operands through the whole compile (budgeted timing, costs-only
    # optimizer), on fresh random data
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(seed)
    if kind == "rrg":
        eq, shapes = _network(int(rng.integers(20, 61)), seed, d_max=4)
    elif kind == "tree":
        n = int(rng.integers(20, 41))
        terms = [""] * n
        for e, k in enumerate(range(1, n)):
            s = opt_einsum.get_symbol(e)
            terms[int(rng.integers(k))] += s
            terms[k] += s
        free = opt_einsum.get_symbol(n + 1)
        terms[-1] += free
        eq = ",".join(terms) + "->" + free
        shapes = [(4,) * len(t) for t in terms]
    else:
        side = 5
        sym = iter(opt_einsum.get_symbol(i) for i in range(1000))
        h = {(r, c): next(sym) for r in range(side) for c in range(side - 1)}
        v = {(r, c): next(sym) for r in range(side - 1) for c in range(side)}
        terms = [
            "".join(
                x for x in (h.get((r, c - 1)), h.get((r, c)), v.get((r - 1, c)), v.get((r, c))) if x
            )
            for r in range(side)
            for c in range(side)
        ]
        eq = ",".join(terms) + "->"
        shapes = [(3,) * len(t) for t in terms]
    arrays = [rng.uniform(0.5, 1.0, s) for s in shapes]
    g = tl.EinsumGraph()
    xs = [g.input(f"x{i}", a.shape, "float64") for i, a in enumerate(arrays)]
    g.output(g.einsum(eq, *xs), "y")
    plan = tl.compile(g, "numpy", 2, cache=False)
    got = plan({f"x{i}": a for i, a in enumerate(arrays)})["y"]
    np.testing.assert_allclose(got, opt_einsum.contract(eq, *arrays), rtol=1e-10)


def test_the_budget_is_computed_only_when_a_step_could_be_timed():
    asked = []
    chooser = pair_layout.Chooser(True, lambda: asked.append(1) or 1.0)
    small = [pair_layout.MEASURE_MIN_NS / 4, pair_layout.MEASURE_MIN_NS / 3]
    _, build, shapes, _ = _chooser_case(small)
    chooser.choose(small, build, shapes)
    assert asked == []  # a tiny step: decided by the estimates, no budget needed
    est = [1e5, 1.2e5]
    _, build, shapes, _ = _chooser_case(est)
    chooser.choose(est, build, shapes)
    chooser.choose(est, build, shapes)
    assert asked == [1] and chooser.budget_s == pair_layout.MEASURE_BUDGET_S
