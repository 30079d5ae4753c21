"""Graph construction: inference, errors at the line that built the node, structure."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.ir import ops, spec


def test_nodes_keep_ordered_inputs_and_inferred_shapes():
    g = tl.EinsumGraph()
    a, b = g.input("a", (2, 3)), g.input("b", (3, 4))
    c = g.einsum("ij,jk->ik", a, b, name="c")
    d = g.sub(b.T, 1.0)  # operand order matters for sub
    assert c.shape == (2, 4) and c.dtype == "float32"
    node = g.node("c")
    assert node.inputs == (a.id, b.id) and node.kind == ops.EINSUM
    assert g.node(d).inputs[0] != g.node(d).inputs[1]
    assert list(g.nx_graph.predecessors(c.id)) == [a.id, b.id]
    assert g.users(a.id) == [c.id]


def test_spec_parsing_normal_forms():
    assert str(spec.parse("ij,jk", [2, 2])) == "ij,jk->ik"
    assert str(spec.parse("ba", [2])) == "ba->ab"
    assert str(spec.parse("Ab", [2])) == "Ab->Ab"
    assert str(spec.parse(" i j , j k -> i k ", [2, 2])) == "ij,jk->ik"
    es = spec.parse("...ij,...jk->...ik", [4, 2])
    assert len(es.inputs[0]) == 4 and len(es.inputs[1]) == 2 and len(es.output) == 4
    assert es.inputs[0][2:] == "ij" and es.output.endswith("ik")
    assert spec.canonical(spec.parse("xy,yz->xz", [2, 2])) == spec.canonical(
        spec.parse("ab,bc->ac", [2, 2])
    )


@pytest.mark.parametrize(
    "bad,ranks,fragment",
    [
        ("ij,jk->ik", [2], "2 input term"),
        ("ij->ik", [2], "'k' does not appear"),
        ("ij,jk->iki", [2, 2], "more than once"),
        ("i1,jk->ik", [2, 2], "invalid index character '1'"),
        ("ij,jk->ik->i", [2, 2], "at most one '->'"),
        ("ijk,jk->ik", [2, 2], "3 indices but operand 0 has rank 2"),
        ("i.j->ij", [2], "'.'"),
        ("...ij->ij", [3], "ellipsis"),
        ("ij,j-k", [2, 2], "'->'"),
    ],
)
def test_spec_errors(bad, ranks, fragment):
    with pytest.raises(tl.SpecError) as err:
        spec.parse(bad, ranks)
    assert fragment in str(err.value)
    assert repr(bad) in str(err.value) or bad in str(err.value)


def test_shape_error_names_node_and_shapes():
    g = tl.EinsumGraph()
    a, b = g.input("a", (2, 3)), g.input("b", (4, 5))
    with pytest.raises(tl.ShapeError) as err:
        g.einsum("ij,jk->ik", a, b, name="bad")
    msg = str(err.value)
    assert "'bad'" in msg and "(2, 3)" in msg and "(4, 5)" in msg and "'j'" in msg
    with pytest.raises(tl.ShapeError) as err:
        g.add(a, b, name="sum_ab")
    assert "'sum_ab'" in str(err.value) and "broadcast" in str(err.value)
    # nothing was added by the failed calls
    assert len(g) == 2 and "bad" not in [n.name for n in g.nodes]


def test_dtype_errors():
    g = tl.EinsumGraph()
    with pytest.raises(tl.DTypeError):
        g.input("x", (2,), "float128")
    with pytest.raises(tl.DTypeError):
        g.input("x", (2,), "not-a-dtype")
    with pytest.raises(tl.DTypeError):
        g.constant(np.array(["a", "b"]))
    with pytest.raises(tl.DTypeError):
        g.constant(np.array([1, 2], dtype=object))
    x = g.input("x", (2,))
    with pytest.raises(tl.DTypeError):
        g.cast(x, "clongdouble")


def test_graph_errors():
    g = tl.EinsumGraph()
    x = g.input("x", (2, 3))
    with pytest.raises(tl.GraphError):
        g.input("x", (2,))  # duplicate name
    with pytest.raises(tl.GraphError):
        g.unary("frobnicate", x)
    with pytest.raises(tl.GraphError):
        g.reduce("median", x)
    with pytest.raises(tl.GraphError):
        g.add_node("mystery", None, [x.id])
    with pytest.raises(tl.GraphError):
        g.einsum("ij->ji")
    other = tl.EinsumGraph().input("y", (2, 3))
    with pytest.raises(tl.GraphError):
        g.add(x, other)
    with pytest.raises(tl.GraphError):
        g.add(x, "3")
    with pytest.raises(tl.ShapeError):
        g.sum(x, axis=5)
    with pytest.raises(tl.ShapeError):
        g.transpose(x, (0, 0))
    with pytest.raises(tl.ShapeError):
        g.reshape(x, (4, -1))
    with pytest.raises(tl.ShapeError):
        g.input("z", (2, -1))
    with pytest.raises(tl.GraphError):
        bool(x > 1)


def test_cycles_are_rejected():
    g = tl.EinsumGraph()
    x = g.input("x", (2,))
    a = g.relu(x)
    b = g.exp(a)
    # wire a cycle through the low-level API: a now also consumes b
    from dataclasses import replace

    g.replace_node(a.id, replace(g.node(a.id), kind=ops.BINARY, op="add", inputs=(x.id, b.id)))
    g.output(b, name="y")
    with pytest.raises(tl.GraphError) as err:
        g.validate()
    assert "cycle" in str(err.value)
    with pytest.raises(tl.GraphError):
        tl.compile(g)


def test_graph_without_outputs_does_not_compile():
    g = tl.EinsumGraph()
    g.relu(g.input("x", (2,)))
    with pytest.raises(tl.GraphError) as err:
        tl.compile(g)
    assert "no outputs" in str(err.value)


def test_reshape_with_symbols():
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 4, 6))
    assert g.reshape(x, ("B", -1)).shape == ("B", 24)
    with pytest.raises(tl.ShapeError, match="does not resolve"):
        g.reshape(x, (-1, 6))  # would be 4*B: a product of a symbol is not expressible
    with pytest.raises(tl.ShapeError):
        g.reshape(x, ("C", 24))


def test_fingerprint_and_dot():
    def build(scale):
        g = tl.EinsumGraph()
        x = g.input("x", (2, 2))
        g.output(x * scale, name="y")
        return g

    assert build(2.0).fingerprint() == build(2.0).fingerprint()
    assert build(2.0).fingerprint() != build(3.0).fingerprint()
    dot = build(2.0).to_dot()
    assert dot.startswith("digraph") and "->" in dot and "binary:mul" in dot


def test_validate_rechecks_every_node_after_a_rewire(monkeypatch):
    from dataclasses import replace

    from tensorlogic.ir import infer

    g = tl.EinsumGraph()
    x = g.input("x", (3, 4))
    y = g.exp(x)
    g.output(g.sum(y), "s")
    calls = []
    real = infer.infer
    monkeypatch.setattr(infer, "infer", lambda *a, **k: calls.append(a) or real(*a, **k))
    g.validate()  # built by add_node alone: consistent by construction, nothing re-inferred
    assert calls == []
    # a rewired record is checked again: here one that lies about its shape
    g.replace_node(y.id, replace(g.node(y.id), shape=(4, 3)))
    with pytest.raises(tl.errors.GraphError, match="recorded shape"):
        g.validate()
    assert calls
    h = tl.EinsumGraph()
    e = h.exp(h.input("x", (2,)))
    h.output(e, "y")
    h.replace_node(e.id, h.node(e.id))  # a rewire, even to the same record
    h2 = h.copy()
    calls.clear()
    h2.validate()  # the copy of a rewired graph is checked in full, once
    assert calls
    calls.clear()
    h2.validate()
    assert calls == []
