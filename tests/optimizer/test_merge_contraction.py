"""Einsum merging, scalar pulling and contraction planning."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.errors import MemoryBudgetError
from tensorlogic.ir import ops
from tensorlogic.optimizer import contraction, merge
from optim_helpers import assert_same_as_o0, count


def _chain():
    g = tl.EinsumGraph()
    x = g.input("x", (8, 16), "float64")
    w1 = g.input("w1", (16, 32), "float64")
    w2 = g.input("w2", (32, 4), "float64")
    h = g.einsum("bi,ij->bj", x * 0.5, w1)  # its contracted letter i clashes with the next spec
    y = g.einsum("bi,ik->bk", h, w2) * 3.0
    g.output(y, name="y")
    return g


def test_merge_builds_one_network_with_scalars(rng):
    g = _chain()
    res = merge(g)
    assert res.changed and res.stats == {"merged": 1, "scalars": 2}
    gg = res.graph
    assert count(gg, ops.EINSUM) == 1 and count(gg, ops.BINARY) == 0
    y = gg.node(gg.outputs["y"])
    assert y.id == g.outputs["y"] and y.kind == ops.EINSUM and len(y.inputs) == 5
    terms = y.args["spec"].split("->")[0].split(",")
    assert len(set(terms[0]) & set(terms[1]) - {"b"}) == 1  # the clash got a fresh letter
    assert not merge(gg).changed
    assert_same_as_o0(g, rng, 2)


@pytest.mark.parametrize(
    "spec1,spec2,shapes",
    [
        ("ij,jk->ik", "ii->i", [(5, 3), (3, 5)]),  # diagonal of a merged product
        ("ij,jk->ki", "ab,b->a", [(4, 3), (3, 6), (4,)]),
        ("...ij,...jk->...ik", "bij->bi", [(2, 3, 4), (2, 4, 5)]),
        ("ij,j->ij", "ij,kj->ik", [(4, 1), (3,), (5, 3)]),  # a size-1 dim broadcast inside
    ],
)
def test_merge_keeps_numpy_semantics(spec1, spec2, shapes, rng):
    g = tl.EinsumGraph()
    ins = [g.input(f"x{k}", s, "float64") for k, s in enumerate(shapes)]
    n1 = len(spec1.split("->")[0].split(","))
    a = g.einsum(spec1, *ins[:n1])
    g.output(g.einsum(spec2, a, *ins[n1:]), name="y")
    res = merge(g)
    assert res.changed and count(res.graph, ops.EINSUM) == 1
    assert_same_as_o0(g, rng, 2)
    ref = np.einsum(
        spec2,
        np.einsum(spec1, *[np.ones(s) for s in shapes[:n1]]),
        *[np.ones(s) for s in shapes[n1:]],
    )
    out = tl.compile(g, backend="numpy", opt_level=2, cache=False)(
        **{f"x{k}": np.ones(s) for k, s in enumerate(shapes)}
    )["y"]
    np.testing.assert_allclose(out, ref)


def test_merge_respects_shared_results_outputs_and_dtypes(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (4, 4), "float32")
    h16 = g.input("h", (4, 4), "float16")
    a = g.einsum("ij,jk->ik", x, x)
    g.output(g.einsum("ij,jk->ik", a, x) + a, name="shared")  # a has two users
    b = g.einsum("ij,jk->ik", x, x)
    g.output(b, name="b")
    g.output(g.einsum("ij,jk->ik", b, x), name="from_output")  # b is an output
    c = g.einsum("ij,jk->ik", h16, h16)
    g.output(g.einsum("ij,jk->ik", c, x), name="mixed")  # float16 rounding must stay
    assert not merge(g).changed
    assert_same_as_o0(g, rng, 2, rtol=1e-4, atol=1e-4)


def test_a_scaled_operand_of_several_einsums_is_scaled_in_each(rng):
    """``d * s`` used only by einsums (attention's scaled scores gradient, contracted with k
    and with q) is never written: each einsum takes ``d`` and ``s``; with another user too,
    the product stays."""
    g = tl.EinsumGraph()
    d = g.input("d", (2, 16, 16), "float64")
    q = g.input("q", (2, 16, 4), "float64")
    k = g.input("k", (2, 16, 4), "float64")
    ds = d * 0.125
    g.output(g.einsum("bqs,bsk->bqk", ds, k), name="dq")
    g.output(g.einsum("bqs,bqk->bsk", ds, q), name="dk")
    res = merge(g)
    assert res.stats == {"scalars": 2} and count(res.graph, ops.BINARY) == 0
    assert all(len(res.graph.node(res.graph.outputs[n]).inputs) == 3 for n in ("dq", "dk"))
    assert not merge(res.graph).changed
    assert_same_as_o0(g, rng, 2)
    g.output(ds + 1.0, name="other")  # a user that is not an einsum keeps the product
    assert not merge(g).changed
    assert_same_as_o0(g, rng, 2)


def test_contraction_records_path_and_print_shows_it(rng):
    g = tl.EinsumGraph()
    a = g.input("a", (64, 8), "float64")
    b = g.input("b", (8, 64), "float64")
    c = g.input("c", (64, 4), "float64")
    g.output(g.einsum("ij,jk,kl->il", a, b, c), name="y")
    res = contraction(g)
    y = res.graph.node(res.graph.outputs["y"])
    info = y.args["path_info"]
    assert info["strategy"] == "optimal"
    assert [tuple(p) for p in y.args["path_strategy"]] == [(1, 2), (0, 1)]  # b@c first is cheaper
    assert info["largest_intermediate"] == 8 * 4 * 1 or info["largest_intermediate"] == 64 * 4
    assert info["flops"] < info["naive_flops"]
    assert not contraction(res.graph).changed
    plan = assert_same_as_o0(g, rng, 2)
    text = str(plan)
    assert "path=[(1, 2), (0, 1)]" in text and "optimal" in text and "largest intermediate" in text
    assert "contraction" in text  # the optimizer report line


def test_path_memory_limit(rng):
    g = tl.EinsumGraph()
    a = g.input("a", (32, 2), "float64")
    b = g.input("b", (2, 32), "float64")
    c = g.input("c", (32, 32), "float64")
    g.output(g.einsum("ij,jk,kl->il", a, b, c), name="y")
    plan = assert_same_as_o0(g, rng, 2, path_memory_limit=32 * 32 * 8)
    y = plan.optimized_graph.node(plan.optimized_graph.outputs["y"])
    assert y.args["path_info"]["largest_intermediate"] <= 32 * 32
    with pytest.raises(MemoryBudgetError, match="path_memory_limit"):
        tl.compile(g, backend="numpy", opt_level=2, cache=False, path_memory_limit=100)


def test_cheap_large_network_keeps_the_fast_path(rng):
    """A 21-matrix chain of 3x3 runs in microseconds: it is not searched (cotengra or not)."""
    g = tl.EinsumGraph()
    n = 21
    xs = [g.input(f"m{k}", (3, 3), "float64") for k in range(n)]
    letters = "abcdefghijklmnopqrstuvwxyz"
    spec = ",".join(letters[k] + letters[k + 1] for k in range(n)) + f"->a{letters[n]}"
    g.output(g.einsum(spec, *xs), name="y")
    res = contraction(g)
    y = res.graph.node(res.graph.outputs["y"])
    assert y.args["path_info"]["strategy"].split("+")[0] == "greedy"
    inputs = {f"m{k}": rng.uniform(0.2, 0.6, (3, 3)) for k in range(n)}
    got = tl.compile(g, backend="numpy", opt_level=2, cache=False)(**inputs)["y"]
    ref = np.linalg.multi_dot([inputs[f"m{k}"] for k in range(n)])
    np.testing.assert_allclose(got, ref, rtol=1e-10)


def test_equal_flop_orders_are_broken_by_operand_copies(rng):
    """Of the orders with the fewest FLOPs, the planner keeps one that copies the fewest operand
    elements into BLAS layouts; every order still gives the same numbers."""
    from tensorlogic.ir import pairwise as contract
    from tensorlogic.ir import spec as einspec

    es = einspec.parse("abc,bcd,cde->ae", [3, 3, 3])
    shapes, sizes = [(6, 7, 8), (7, 8, 9), (8, 9, 5)], dict(zip("abcde", (6, 7, 8, 9, 5)))
    copies = {
        str(p): contract.plan_einsum(es, shapes, sizes, p).copied
        for p in ([(0, 1), (0, 1)], [(1, 2), (0, 1)])
    }
    assert copies["[(1, 2), (0, 1)]"] < copies["[(0, 1), (0, 1)]"]
    g = tl.EinsumGraph()
    ins = [g.input(n, s) for n, s in zip("xyz", shapes)]
    g.output(g.einsum("abc,bcd,cde->ae", *ins), "out")
    plan = assert_same_as_o0(g, rng, 2)
    (step,) = plan.steps
    assert [tuple(p) for p in plan.optimized_graph.node(step.node_id).args["path_strategy"]] == [
        (1, 2),
        (0, 1),
    ]
    # with no copies to save, opt_einsum's order stays
    es2 = einspec.parse("ab,bc,cd->ad", [2, 2, 2])
    plan2 = contract.plan_einsum(
        es2, [(4, 5), (5, 6), (6, 7)], dict(zip("abcd", (4, 5, 6, 7))), [(0, 1), (0, 1)]
    )
    assert plan2.copied == 0
