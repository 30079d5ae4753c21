"""The attention node: shape and dtype inference, argument checks, JSON round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.errors import DTypeError, GraphError, SerializationError, ShapeError
from tensorlogic.ir import ops
from tensorlogic.testing import reference


def _qkv(g, batch=(2, 3), sq=5, sk=7, d=4, dv=6, dtype="float32"):
    return (
        g.input("q", (*batch, sq, d), dtype),
        g.input("k", (*batch, sk, d), dtype),
        g.input("v", (*batch, sk, dv), dtype),
    )


def test_shape_dtype_and_default_scale():
    g = tl.EinsumGraph()
    q, k, v = _qkv(g)
    y = g.attention(q, k, v)
    assert y.shape == (2, 3, 5, 6) and y.dtype == "float32"
    assert y.node.kind == ops.ATTENTION
    assert y.node.args["scale"] == pytest.approx(1 / math.sqrt(4))
    assert y.node.args["causal"] is False


def test_symbolic_dims_with_explicit_scale():
    g = tl.EinsumGraph()
    q = g.input("q", ("B", "S", 8))
    k = g.input("k", ("B", "T", 8))
    v = g.input("v", ("B", "T", 3))
    assert g.attention(q, k, v, scale=0.5, causal=True).shape == ("B", "S", 3)


@pytest.mark.parametrize(
    "bad, err, words",
    [
        ({"k": (2, 3, 7, 5)}, ShapeError, "head dimension"),
        ({"v": (2, 3, 8, 6)}, ShapeError, "number of keys"),
        ({"k": (2, 4, 7, 4)}, ShapeError, "batch axes"),
        ({"q": (4,)}, ShapeError, "rank >= 2"),
        ({"k": (2, 3, 0, 4), "v": (2, 3, 0, 6)}, ShapeError, "zero keys"),
    ],
)
def test_bad_shapes_name_the_problem(bad, err, words):
    g = tl.EinsumGraph()
    shapes = {"q": (2, 3, 5, 4), "k": (2, 3, 7, 4), "v": (2, 3, 7, 6)} | bad
    ts = [g.input(n, s) for n, s in shapes.items()]
    n_nodes = len(g)
    with pytest.raises(err, match=words):
        g.attention(*ts, scale=1.0, name="att")
    assert len(g) == n_nodes  # nothing half-added


def test_bad_mask_dtype_and_args():
    g = tl.EinsumGraph()
    q, k, v = _qkv(g)
    with pytest.raises(ShapeError, match="does not broadcast"):
        g.attention(q, k, v, mask=g.input("m", (5, 6)))
    with pytest.raises(ShapeError, match="does not broadcast"):
        g.attention(q, k, v, mask=g.input("m2", (1, 2, 3, 5, 7)))
    with pytest.raises(DTypeError, match="share one dtype"):
        g.attention(q, k, g.input("v64", (2, 3, 7, 6), "float64"))
    with pytest.raises(GraphError, match="finite"):
        g.attention(q, k, v, scale=float("nan"))
    with pytest.raises(GraphError, match="causal"):
        g.attention(q, k, v, causal=1)
    with pytest.raises(GraphError, match="real number"):
        g.attention(q, k, v, scale="x")
    # broadcastable masks are accepted
    assert g.attention(q, k, v, mask=g.input("m3", (3, 1, 7))).shape == (2, 3, 5, 6)


def test_json_round_trip(tmp_path, rng):
    g = tl.EinsumGraph()
    q, k, v = _qkv(g)
    m = g.input("m", (5, 7))
    g.output(g.attention(q, k, v, scale=0.3, causal=True, mask=m), "y")
    g.save(tmp_path / "g.json")
    h = tl.EinsumGraph.load(tmp_path / "g.json")
    node = h.node(h.outputs["y"])
    assert node.kind == ops.ATTENTION and node.args["causal"] is True
    assert node.args["scale"] == 0.3
    ins = {n: rng.standard_normal(g.node(i).shape).astype(np.float32) for n, i in g.inputs.items()}
    a = tl.compile(g, backend="numpy")(**ins)["y"]
    b = tl.compile(h, backend="numpy")(**ins)["y"]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, reference.evaluate(g, ins)["y"], rtol=1e-5, atol=1e-5)


def test_json_rejects_bad_attention_args(tmp_path):
    g = tl.EinsumGraph()
    q, k, v = _qkv(g)
    g.output(g.attention(q, k, v), "y")
    g.save(tmp_path / "g.json")
    text = (tmp_path / "g.json").read_text().replace('"causal": false', '"causal": "yes"')
    (tmp_path / "g.json").write_text(text)
    with pytest.raises(SerializationError, match="causal"):
        tl.EinsumGraph.load(tmp_path / "g.json")
