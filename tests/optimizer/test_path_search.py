"""Path search budget by estimated cost, and the disk cache of paths across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import opt_einsum
import pytest
from opt_einsum.testing import rand_equation

from tensorlogic.optimizer import path_search

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path / "cache"))


def _network(n, d_max, seed=7):
    eq, shapes, sizes = rand_equation(
        n, 3, n_out=2, d_min=2, d_max=d_max, seed=seed, return_size_dict=True
    )
    lhs, out = eq.split("->")
    return lhs.split(","), out, sizes


def test_budget_scales_with_cost():
    cheap = path_search.budget_for(1e5, 24)
    assert not cheap.search and cheap.estimated_call_s < 1e-3
    mid = path_search.budget_for(2e7, 24)  # ~10 ms a call: a search of ~0.1 s
    assert mid.search and 0.05 <= mid.seconds <= 0.2
    assert mid.seconds == pytest.approx(path_search.PAYBACK_CALLS * mid.estimated_call_s)
    big = path_search.budget_for(1e12, 24)
    assert big.seconds == path_search.MAX_SEARCH_S
    # up to 16 operands the fast path is dp already: never searched, however costly
    assert not path_search.budget_for(1e12, 16).search


def _spy(monkeypatch):
    calls = []
    real = path_search._searched_path

    def spy(terms, output, sizes, seconds):
        calls.append(seconds)
        return real(terms, output, sizes, min(seconds, 0.2))

    monkeypatch.setattr(path_search, "_searched_path", spy)
    return calls


def test_cheap_network_is_not_searched(monkeypatch):
    calls = _spy(monkeypatch)
    terms, out, sizes = _network(24, 3)
    path, strategy = path_search.find_path(terms, out, sizes)
    assert calls == [] and strategy == "greedy"
    assert len(path) == 23


def test_expensive_network_is_searched_within_its_budget(monkeypatch):
    calls = _spy(monkeypatch)
    terms, out, sizes = _network(40, 9, seed=3)
    shapes = [tuple(sizes[c] for c in t) for t in terms]
    eq = ",".join(terms) + "->" + out
    greedy = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize="greedy")[1].opt_cost
    expect = path_search.budget_for(float(greedy), len(terms))
    assert expect.search
    path, strategy = path_search.find_path(terms, out, sizes)
    assert calls == [pytest.approx(expect.seconds)]
    found = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=path)[1].opt_cost
    assert found <= greedy
    assert strategy in ("greedy", "cotengra", "random-greedy")


_CHILD = """
import json, sys
from opt_einsum.testing import rand_equation
from tensorlogic.optimizer import path_search
eq, shapes, sizes = rand_equation(40, 3, n_out=2, d_min=2, d_max=9, seed=3, return_size_dict=True)
lhs, out = eq.split("->")
searched = []
real = path_search._searched_path
def spy(*a):
    searched.append(a[-1])
    return real(*a[:-1], min(a[-1], 0.2))
path_search._searched_path = spy
path, strategy = path_search.find_path(lhs.split(","), out, sizes)
print(json.dumps({"path": [list(p) for p in path], "strategy": strategy, "searched": searched}))
"""


def _child(cache):
    env = {**os.environ, "TL_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_second_process_reads_the_path_from_disk(tmp_path):
    first = _child(tmp_path)
    assert first["searched"] and not first["strategy"].endswith("+cache")
    assert len(list((tmp_path / "paths").glob("*.json"))) == 1
    second = _child(tmp_path)
    assert second["searched"] == []
    assert second["strategy"] == first["strategy"] + "+cache"
    assert second["path"] == first["path"]


def test_cache_key_is_the_structure():
    terms, out, sizes = _network(20, 3)
    # renaming every index keeps the key; another size or memory limit changes it
    ren = {c: opt_einsum.get_symbol(100 + i) for i, c in enumerate(sorted(sizes))}
    t2 = ["".join(ren[c] for c in t) for t in terms]
    s2 = {ren[c]: d for c, d in sizes.items()}
    key = path_search.cache_path(terms, out, sizes)
    assert path_search.cache_path(t2, "".join(ren[c] for c in out), s2) == key
    c0 = terms[0][0]
    assert path_search.cache_path(terms, out, {**sizes, c0: sizes[c0] + 1}) != key
    assert path_search.cache_path(terms, out, sizes, 1000) != key


@pytest.mark.parametrize(
    "content", ["not json", '{"path": [[0, 99]]}', '{"path": [[0, 0]]}', '{"path": [[0, 1]]}', "[]"]
)
def test_bad_cache_file_is_ignored_and_replaced(content):
    terms, out, sizes = _network(20, 3)
    file = path_search.cache_path(terms, out, sizes)
    file.parent.mkdir(parents=True)
    file.write_text(content)
    path, strategy = path_search.find_path(terms, out, sizes)
    assert not strategy.endswith("+cache") and len(path) == len(terms) - 1
    again, strategy = path_search.find_path(terms, out, sizes)
    assert strategy.endswith("+cache") and again == path


def test_cached_path_runs_correctly(tmp_path):
    import tensorlogic as tl

    terms, out, sizes = _network(24, 3, seed=11)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(tuple(sizes[c] for c in t)) for t in terms]
    g = tl.EinsumGraph()
    ts = [g.input(f"x{i}", a.shape, "float64") for i, a in enumerate(arrays)]
    g.output(g.einsum(",".join(terms) + "->" + out, *ts), "y")
    feed = {f"x{i}": a for i, a in enumerate(arrays)}
    ref = opt_einsum.contract(",".join(terms) + "->" + out, *arrays)
    for _ in range(2):  # the second compile plans from the cache
        got = tl.compile(g, "numpy", 2, cache=False)(feed)["y"]
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12 * np.abs(ref).max())


@pytest.mark.parametrize("n,limit", [(3, None), (10, None), (30, None), (30, 64), (12, 64)])
def test_fast_path_is_opt_einsums(n, limit):
    # opt_einsum's path function called directly (no PathInfo): same path, same opt_cost
    terms, out, sizes = _network(n, 4, seed=n)
    eq = ",".join(terms) + "->" + out
    shapes = [tuple(sizes[c] for c in t) for t in terms]
    strategy = path_search.pairwise.choose_path_strategy(n)
    try:
        ref, info = opt_einsum.contract_path(
            eq, *shapes, shapes=True, optimize=strategy, memory_limit=limit
        )
    except RuntimeError:  # dp finds nothing under the limit: so must ours
        with pytest.raises(RuntimeError):
            path_search._fast_path(terms, out, sizes, limit)
        return
    path, name, flops = path_search._fast_path(terms, out, sizes, limit)
    assert name == strategy and path == [tuple(p) for p in ref]
    assert flops == float(info.opt_cost)


def test_search_stops_once_it_has_spent_a_few_calls_of_its_best_path(monkeypatch):
    # every round of trials takes 10 ms against a path estimated at 1 ms a call: the search
    # stops after the first round, far below its budget
    terms, out, sizes = _network(40, 9, seed=3)
    rounds = []
    real = opt_einsum.RandomGreedy.__call__

    def slow(self, *a, **k):
        rounds.append(1)
        import time

        time.sleep(0.01)
        return real(self, *a, **k)

    monkeypatch.setattr(opt_einsum.RandomGreedy, "__call__", slow)
    monkeypatch.setattr(path_search, "likely_call_s", lambda f, n: 1e-3)
    monkeypatch.setattr(path_search, "_cotengra_optimizer", lambda seconds: None)
    path, name = path_search._searched_path(terms, out, sizes, 10.0)
    assert name == "random-greedy" and len(rounds) == 1 and len(path) == len(terms) - 1


_NO_COTENGRA = """
import json, sys
from opt_einsum.testing import rand_equation
from tensorlogic.optimizer import path_search
eq, shapes, sizes = rand_equation(40, 3, n_out=2, d_min=2, d_max=9, seed=3, return_size_dict=True)
lhs, out = eq.split("->")
path, name = path_search._searched_path(lhs.split(","), out, sizes, 0.1)
print(json.dumps({"name": name, "imported": "cotengra" in sys.modules}))
"""


def test_a_short_search_does_not_import_cotengra():
    # cotengra's import alone (0.25-0.75 s) would be several times a 0.1 s budget
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _NO_COTENGRA],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    res = json.loads(done.stdout.strip().splitlines()[-1])
    assert res == {"name": "random-greedy", "imported": False}


def test_the_search_stops_by_the_likely_call_not_the_conservative_one():
    # the conservative rate decides to search; the stop takes the planner's faster estimate
    flops, n = 2.4e7, 36
    assert (
        path_search.likely_call_s(flops, n) < path_search.budget_for(flops, n).estimated_call_s / 3
    )
    assert path_search.likely_call_s(2 * flops, n) > path_search.likely_call_s(flops, n)
