"""tl.grad / tl.vjp as graph transformations: what they return, and the errors they raise."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.errors import GradError


def _mlp():
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 4), "float32")
    w = g.input("w", (4, 3), "float32")
    b = g.constant(np.zeros(3, np.float32) + 0.1, name="b")
    y = g.relu(g.einsum("bi,ij->bj", x, w) + b)
    g.output(y, "y")
    g.output(g.mean(y * y), "loss")
    return g


def test_grad_returns_a_new_graph_with_the_forward_outputs():
    g = _mlp()
    before = g.fingerprint()
    back = tl.grad(g, "loss", ["w", "b"])
    assert g.fingerprint() == before  # the forward graph is unchanged
    assert list(back.inputs) == list(g.inputs)
    assert list(back.outputs) == ["y", "loss", "grad_w", "grad_b"]
    assert back.node(back.outputs["grad_w"]).shape == (4, 3)
    assert back.node(back.outputs["grad_b"]).dtype == "float32"
    back.validate()
    rng = np.random.default_rng(0)
    feed = {
        "x": rng.standard_normal((5, 4)).astype(np.float32),
        "w": rng.standard_normal((4, 3)).astype(np.float32),
    }
    fwd = tl.compile(g, backend="numpy")(**feed)
    out = tl.compile(back, backend="numpy", opt_level=2)(**feed)
    np.testing.assert_array_equal(out["loss"], fwd["loss"])


def test_vjp_adds_the_cotangent_input():
    g = _mlp()
    back = tl.vjp(g, "y", ["x", "w"], cotangent="dy")
    assert list(back.inputs) == ["x", "w", "dy"]
    assert back.node(back.inputs["dy"]).shape == ("B", 3)
    x = np.ones((2, 4), np.float32)
    out = tl.compile(back, backend="numpy")(
        x=x, w=np.ones((4, 3), np.float32), dy=np.ones((2, 3), np.float32)
    )
    np.testing.assert_allclose(out["grad_x"], np.full((2, 4), 3.0))


def test_gradients_are_graphs_too_second_order():
    g = tl.EinsumGraph()
    x = g.input("x", (3,), "float64")
    g.output(g.sum(g.exp(x) * x), "loss")
    back = tl.grad(g, "loss", ["x"])  # (x + 1) e^x
    back.outputs["dx"] = back.outputs.pop("grad_x")
    back.output(back.sum(back.tensor(back.outputs["dx"])), "s")
    second = tl.grad(back, "s", ["x"])  # (x + 2) e^x
    xv = np.array([0.1, -0.5, 1.0])
    out = tl.compile(second, backend="numpy", opt_level=2)(x=xv)
    np.testing.assert_allclose(out["dx"], (xv + 1) * np.exp(xv))
    np.testing.assert_allclose(out["grad_x"], (xv + 2) * np.exp(xv))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda g: tl.grad(g, "y", ["w"]), "expected a scalar"),
        (lambda g: tl.grad(g, "nope", ["w"]), "not an output"),
        (lambda g: tl.grad(g, "loss", ["nope"]), "no node of the graph"),
        (lambda g: tl.grad(g, "loss", ["w", "w"]), "twice"),
        (lambda g: tl.grad(g, "loss", []), "wrt is empty"),
        (lambda g: tl.grad(g, "loss", [3]), "node names"),
        (lambda g: tl.grad(g, "loss", ["n"]), "has dtype int64, which has no gradient"),
        (lambda g: tl.grad(g, "loss", [g.node(g.outputs["y"]).name]), "a unary node; expected"),
        (lambda g: tl.grad(g, "count", ["w"]), "expected a real float scalar"),
        (lambda g: tl.grad([], "loss", ["w"]), "expected an EinsumGraph"),
        (lambda g: tl.vjp(g, "y", ["w"], cotangent="x"), "existing node"),
        (lambda g: tl.vjp(g, "y", ["w"], cotangent="not a name"), "identifier"),
        (lambda g: tl.vjp(g, "count", ["w"], cotangent="c"), "integer and bool"),
    ],
)
def test_bad_calls_raise_grad_error(call, match):
    g = _mlp()
    n = g.input("n", (3,), "int64")
    g.output(g.sum(n), "count")
    before = g.fingerprint()
    with pytest.raises(GradError, match=match):
        call(g)
    assert g.fingerprint() == before
    assert issubclass(GradError, tl.TensorLogicError)


def test_existing_gradient_output_name_is_refused():
    g = _mlp()
    g.output(g.tensor(g.outputs["y"]), "grad_w")
    with pytest.raises(GradError, match="already has an output 'grad_w'"):
        tl.grad(g, "loss", ["w"])


def test_complex_loss_is_refused():
    g = tl.EinsumGraph()
    z = g.input("z", (2,), "complex64")
    g.output(g.sum(z), "loss")
    with pytest.raises(GradError, match="tl.vjp"):
        tl.grad(g, "loss", ["z"])


def test_fused_nodes_are_refused():
    from tensorlogic.optimizer import optimize

    g = tl.EinsumGraph()
    x = g.input("x", (8,), "float32")
    g.output(g.sum(g.exp(x) * 2.0 + 1.0), "loss")
    opt, _ = optimize(g, 2)
    assert any(n.kind == "fused" for n in opt.nodes)
    with pytest.raises(GradError, match="fused node"):
        tl.grad(opt, "loss", ["x"])


def test_symbolic_repeated_index_needs_a_size():
    g = tl.EinsumGraph()
    x = g.input("x", ("B", "B"), "float32")
    g.output(g.sum(g.einsum("ii->i", x)), "loss")
    with pytest.raises(GradError, match="symbolic dimension 'B'"):
        tl.grad(g, "loss", ["x"])
    back = tl.grad(g.bind({"B": 3}), "loss", ["x"])
    out = tl.compile(back, backend="numpy")(x=np.ones((3, 3), np.float32))
    np.testing.assert_array_equal(out["grad_x"], np.eye(3))
