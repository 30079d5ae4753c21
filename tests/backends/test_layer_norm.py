"""The layer_norm row op on every backend against a float64 numpy reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.errors import GraphError, SerializationError
from tensorlogic.ir import ops
from tensorlogic.ir.fused import FusedBody, FusedOp
from tensorlogic.backends import kernels

TOL = {"float32": dict(rtol=5e-5, atol=5e-5), "float64": dict(rtol=1e-11, atol=1e-11)}
CASES = [
    ((5, 7), -1),
    ((4, 6, 9), 1),
    ((3, 130), 0),
    ((2, 3, 300), -1),
    ((8, 1024), 1),
    ((16, 4096), -1),
    ((3, 1), -1),
]


def _reference(x, axis, eps):
    x = x.astype(np.float64)
    d = x - x.mean(axis=axis, keepdims=True)
    return d / np.sqrt((d * d).mean(axis=axis, keepdims=True) + eps)


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,axis", CASES)
def test_layer_norm_matches_reference(backend, shape, axis, dtype, opt_level, rng):
    eps = 1e-3
    g = tl.EinsumGraph()
    x = g.input("x", shape, dtype)
    w = g.input("w", shape[-1:], dtype)
    # an elementwise producer (fusion puts it before the tail) and an affine epilogue
    y = (x * 1.5 + 0.25).layer_norm(axis=axis, eps=eps) * w + 0.5
    g.output(y, "y")
    X = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    W = rng.standard_normal(shape[-1:]).astype(dtype)
    got = tl.compile(g, backend=backend, opt_level=opt_level)(x=X, w=W)["y"]
    ref = _reference(X.astype(np.float64) * 1.5 + 0.25, axis, eps) * W + 0.5
    assert _host(got).dtype == np.dtype(dtype)
    np.testing.assert_allclose(_host(got), ref, **TOL[dtype])


def test_fusion_makes_layer_norm_a_tail():
    g = tl.EinsumGraph()
    x = g.input("x", (8, 64))
    y = g.layer_norm(g.unary("tanh", x * 2.0), eps=1e-4)
    g.output(y, "y")
    from tensorlogic.optimizer import optimize

    og, _ = optimize(g, 2)
    fused = [n for n in og.nodes if n.kind == ops.FUSED]
    assert len(fused) == 1
    body = FusedBody.from_args(fused[0].args["body"])
    assert body.tail == "layer_norm" and body.axes == (1,) and body.eps == 1e-4
    assert [i.op for i in body.instrs] == ["mul", "tanh"]


def test_numpy_kernel_uses_scratch_and_runs_in_place(rng):
    x = rng.standard_normal((6, 50)).astype("float32")
    k = kernels.row_kernel(np, "layer_norm", (6, 50), "float32", (1,), 1e-5)
    assert k.inplace == (0,)
    bufs = [np.empty(s, d) for s, d in k.scratch]
    ref = _reference(x, 1, 1e-5)
    y = x.copy()
    k([y, *bufs], y)  # out aliases the input
    np.testing.assert_allclose(y, ref, **TOL["float32"])


def test_eps_zero_is_allowed():
    g = tl.EinsumGraph()
    x = g.input("x", (3, 5), "float64")
    g.output(x.layer_norm(eps=0.0), "y")
    X = np.arange(15, dtype=np.float64).reshape(3, 5)
    X[1] = 4.0
    got = tl.compile(g, backend="numpy")(x=X)["y"]
    assert np.isnan(got[1]).all()  # 0 / sqrt(0) with eps=0, as numpy computes it
    np.testing.assert_allclose(got[[0, 2]], _reference(X[[0, 2]], 1, 0.0), rtol=1e-12)


@pytest.mark.parametrize("eps", [-1.0, float("nan"), float("inf"), "1e-5", True])
def test_bad_eps_is_rejected(eps):
    g = tl.EinsumGraph()
    x = g.input("x", (3, 5))
    with pytest.raises(GraphError, match="eps"):
        g.layer_norm(x, eps=eps)
    assert len(g) == 1  # nothing half-added


def test_rank_zero_and_bad_axis_are_rejected():
    g = tl.EinsumGraph()
    with pytest.raises(tl.errors.ShapeError):
        g.layer_norm(g.input("s", ()))
    with pytest.raises(tl.errors.ShapeError):
        g.layer_norm(g.input("x", (3, 4)), axis=2)


def test_eps_only_for_layer_norm():
    g = tl.EinsumGraph()
    x = g.input("x", (3, 5))
    with pytest.raises(GraphError, match="eps"):
        g.add_node(ops.ROWOP, "softmax", [x.id], {"axis": 1, "eps": 1e-5})


def test_serialization_round_trip_keeps_eps(tmp_path, rng):
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 16))
    g.output(g.layer_norm(x * 2.0, eps=0.125), "y")
    path = tmp_path / "ln.json"
    g.save(path)
    g2 = tl.EinsumGraph.load(path)
    assert g2.fingerprint() == g.fingerprint()
    (ln,) = [n for n in g2.nodes if n.op == "layer_norm"]
    assert ln.args["eps"] == 0.125
    X = rng.standard_normal((4, 16)).astype("float32")
    a = tl.compile(g, backend="numpy")(x=X)["y"]
    b = tl.compile(g2, backend="numpy")(x=X)["y"]
    np.testing.assert_array_equal(a, b)
    # a file whose layer_norm lost its eps, or whose softmax gained one, is rejected
    doc = json.loads(path.read_text())
    for rec in doc["nodes"]:
        if rec["op"] == "layer_norm":
            rec["args"].pop("eps")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    (tmp_path / "bad.npz").write_bytes((tmp_path / "ln.npz").read_bytes())
    with pytest.raises(SerializationError, match="eps"):
        tl.EinsumGraph.load(bad)


def test_fused_body_round_trip_and_validation():
    body = FusedBody((), (4, 8), "layer_norm", (1,), eps=0.5)
    assert FusedBody.from_args(body.to_args()) == body
    assert "eps" not in FusedBody((), (4, 8), "softmax", (1,)).to_args()
    with pytest.raises(GraphError, match="eps"):
        FusedBody((FusedOp("neg", (("in", 0),)),), (4, 8), "layer_norm", (1,), eps=-1.0).validate(1)
