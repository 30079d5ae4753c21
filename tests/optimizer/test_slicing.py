"""Slicing: a network whose largest intermediate exceeds path_memory_limit runs slice by slice
(cotengra picks the indices), summed, on numpy and numba, with the slices in print(plan)."""

from __future__ import annotations

import numpy as np
import opt_einsum
import pytest

import tensorlogic as tl
from tensorlogic.errors import MemoryBudgetError

pytest.importorskip("cotengra")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path / "cache"))


def _graph(eq, shapes, dtype="float64"):
    g = tl.EinsumGraph()
    ts = [g.input(f"x{i}", s, dtype) for i, s in enumerate(shapes)]
    g.output(g.einsum(eq, *ts), "y")
    return g


def _einsum_node(plan):
    og = plan.optimized_graph
    return og.node(og.outputs["y"])


def _lattice(n, bond, phys):
    """An n x n lattice (open boundaries), one physical output index per site at row 0."""
    from opt_einsum import get_symbol

    idx = iter(range(10_000))
    h = {(r, c): get_symbol(next(idx)) for r in range(n) for c in range(n - 1)}
    v = {(r, c): get_symbol(next(idx)) for r in range(n - 1) for c in range(n)}
    terms, shapes, out = [], [], []
    for r in range(n):
        for c in range(n):
            t = "".join(
                x for x in (h.get((r, c - 1)), h.get((r, c)), v.get((r - 1, c)), v.get((r, c))) if x
            )
            if r == 0:
                p = get_symbol(next(idx))
                t += p
                out.append(p)
            terms.append(t)
            shapes.append(tuple(phys if ch in out else bond for ch in t))
    return ",".join(terms) + "->" + "".join(out), shapes


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_chain_sliced_under_the_limit(backend):
    rng = np.random.default_rng(0)
    eq, shapes = "ij,jk,kl->il", [(4, 64), (64, 64), (64, 4)]
    arrays = [rng.standard_normal(s) for s in shapes]
    g = _graph(eq, shapes)
    plan = tl.compile(g, backend, 2, cache=False, path_memory_limit=100 * 8)
    node = _einsum_node(plan)
    info = node.args["path_info"]
    assert info["slices"] and info["n_slices"] > 1 and info["largest_intermediate"] <= 100
    assert "sliced over" in str(plan)
    got = plan({f"x{i}": a for i, a in enumerate(arrays)})["y"]
    np.testing.assert_allclose(got, np.einsum(eq, *arrays), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_lattice_sliced_to_a_quarter_of_its_peak(backend):
    rng = np.random.default_rng(1)
    eq, shapes = _lattice(4, 4, 2)
    arrays = [rng.uniform(0.5, 1.5, s) for s in shapes]
    free = _einsum_node(tl.compile(_graph(eq, shapes), "numpy", 2, cache=False))
    peak = free.args["path_info"]["largest_intermediate"]
    limit = peak // 4
    plan = tl.compile(_graph(eq, shapes), backend, 2, cache=False, path_memory_limit=limit * 8)
    info = _einsum_node(plan).args["path_info"]
    assert info["largest_intermediate"] <= limit
    got = plan({f"x{i}": a for i, a in enumerate(arrays)})["y"]
    np.testing.assert_allclose(got, opt_einsum.contract(eq, *arrays), rtol=1e-9)


def test_integer_slices_sum_exactly():
    rng = np.random.default_rng(2)
    eq, shapes = "ij,jk,kl->il", [(4, 64), (64, 64), (64, 4)]
    arrays = [rng.integers(-100, 100, s).astype(np.int32) for s in shapes]
    plan = tl.compile(
        _graph(eq, shapes, "int32"), "numpy", 2, cache=False, path_memory_limit=100 * 4
    )
    assert _einsum_node(plan).args["path_info"]["slices"]
    got = plan({f"x{i}": a for i, a in enumerate(arrays)})["y"]
    ref = np.einsum(eq, *arrays)
    assert got.dtype == ref.dtype and np.array_equal(got, ref)


def test_output_larger_than_the_limit_still_raises():
    eq, shapes = "ij,jk,kl->il", [(32, 2), (2, 32), (32, 32)]
    with pytest.raises(MemoryBudgetError, match="path_memory_limit"):
        tl.compile(_graph(eq, shapes), "numpy", 2, cache=False, path_memory_limit=100)


def test_joint_search_of_path_and_slices_runs_correctly():
    """cotengra's joint search returns a path and contracted letters whose sliced plan fits the
    limit and gives the network's value."""
    from tensorlogic.ir import pairwise as contract, sliced
    from tensorlogic.optimizer import slicing
    from tensorlogic.ir import spec as einspec

    eq, shapes = _lattice(5, 4, 2)
    es = einspec.parse(eq, [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    terms = contract.prepared_terms(es, shapes, sizes)
    free = contract.plan_einsum(es, shapes, sizes, "greedy")
    limit = free.largest_intermediate // 32
    found = slicing.search_sliced(terms, es.output, sizes, limit, 0.3)
    assert found is not None
    path, sliced_letters = found
    assert sliced_letters and not set(sliced_letters) & set(es.output)
    plan = sliced.plan_sliced(es, shapes, sizes, path, sliced_letters, "float64")
    assert plan.largest_intermediate <= limit
    rng = np.random.default_rng(3)
    arrays = [rng.uniform(0.5, 1.5, s) for s in shapes]
    got = plan.run(np, arrays, np.empty(tuple(sizes[c] for c in es.output)))
    np.testing.assert_allclose(got, opt_einsum.contract(eq, *arrays), rtol=1e-9)


def test_too_many_slices_are_refused(monkeypatch):
    # the chain needs 4+ slices under this limit; with at most 2 allowed the compile refuses,
    # naming the slice count and the cap
    import sys

    # the module (the package re-exports its pass under the same name)
    monkeypatch.setattr(sys.modules["tensorlogic.optimizer.contraction"], "MAX_SLICES", 2)
    g = _graph("ij,jk,kl->il", [(4, 64), (64, 64), (64, 4)])
    with pytest.raises(MemoryBudgetError, match=r"slices, more than the 2 allowed") as info:
        tl.compile(g, "numpy", 2, cache=False, path_memory_limit=100 * 8)
    assert "path_memory_limit=800 bytes" in str(info.value)
