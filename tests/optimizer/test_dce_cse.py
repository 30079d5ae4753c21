"""DCE and CSE: structure, numbers against O0, idempotence."""

from __future__ import annotations

import numpy as np

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.optimizer import cse, dce
from optim_helpers import assert_same_as_o0, count


def _dead_graph():
    g = tl.EinsumGraph()
    x = g.input("x", (4, 5), "float64")
    y = g.input("unused", (3,), "float64")
    a = g.exp(x)
    g.tanh(a) + 1.0  # dead
    g.neg(y)  # dead
    g.output(a * 2.0, name="out")
    g.output(a, name="a")
    return g


def test_dce_removes_dead_nodes_and_keeps_outputs_and_inputs(rng):
    g = _dead_graph()
    before = g.fingerprint()
    res = dce(g)
    assert res.changed
    assert count(res.graph, ops.UNARY, "tanh") == 0 and count(res.graph, ops.UNARY, "neg") == 0
    assert set(res.graph.outputs) == {"out", "a"}
    assert res.graph.outputs == g.outputs
    assert set(res.graph.inputs) == {"x", "unused"}
    assert g.fingerprint() == before, "the input graph must not change"
    assert not dce(res.graph).changed
    assert_same_as_o0(g, rng, 1)


def test_dce_never_drops_an_output_that_is_an_input():
    g = tl.EinsumGraph()
    x = g.input("x", (3,), "float32")
    g.output(x, name="x_out")
    res = dce(g)
    assert not res.changed and res.graph.outputs == {"x_out": x.id}


def _alpha_graph():
    g = tl.EinsumGraph()
    a = g.input("a", (3, 4), "float64")
    b = g.input("b", (4, 5), "float64")
    p = g.einsum("ij,jk->ik", a, b)
    q = g.einsum("xy,yz->xz", a, b)  # alpha-renamed
    r = g.einsum("yz,xy->xz", b, a)  # alpha-renamed and operands permuted
    s = g.einsum("ij,jk->ki", a, b)  # a different output order: not a duplicate
    c1 = g.constant(np.full((3, 5), 0.5))
    c2 = g.constant(np.full((3, 5), 0.5))  # equal by value
    u = p * c1 + q * c2
    v = (c2 * q) + (c1 * p)  # commutative operands in the other order
    g.output(u + v + r, name="y")
    g.output(s, name="s")
    return g


def test_cse_merges_alpha_renamed_and_permuted_einsums(rng):
    g = _alpha_graph()
    res = cse(g)
    assert res.changed
    assert count(res.graph, ops.EINSUM) == 2  # p == q == r, s differs
    assert count(res.graph, ops.CONSTANT) == 1
    assert count(res.graph, ops.BINARY, "mul") == 1 and count(res.graph, ops.BINARY, "add") == 3
    assert not cse(res.graph).changed
    assert_same_as_o0(g, rng, 1)


def test_cse_keeps_output_nodes_and_their_ids(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (6,), "float32")
    a = g.exp(x)
    b = g.exp(x)
    c = g.exp(x)
    g.output(g.tanh(a), name="t")
    g.output(b, name="b")
    g.output(c, name="c")
    res = cse(g)
    assert res.graph.outputs == g.outputs
    # a merges into the output b; b and c stay separate outputs with their own buffers
    assert count(res.graph, ops.UNARY, "exp") == 2
    tanh_node = next(n for n in res.graph if n.op == "tanh")
    assert tanh_node.inputs == (b.id,)
    assert not cse(res.graph).changed
    plan = assert_same_as_o0(g, rng, 1)
    out = plan(x=np.ones(6, np.float32))
    assert out["b"] is not out["c"]
