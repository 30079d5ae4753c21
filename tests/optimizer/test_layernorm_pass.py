"""The layernorm pass: hand-written layer normalization becomes one row op, only when exact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.optimizer import layernorm, optimize


def _written(form: int, shape=(6, 40), axis=-1, dtype="float32", eps=1e-5):
    """A graph computing layer norm by hand in one of several spellings; returns (g, x, parts)."""
    g = tl.EinsumGraph()
    x = g.input("x", shape, dtype)
    m = x.mean(axis=axis, keepdims=True)
    d = x - m
    # each spelling is built lazily: a built alternative would be one more user of d
    q = [lambda: d * d, lambda: d.square(), lambda: d**2.0][form % 3]()
    v = q.mean(axis=axis, keepdims=True)
    s = (v + eps).sqrt() if form % 2 == 0 else (eps + v).sqrt()
    y = [
        lambda: d / s,
        lambda: d * s.reciprocal(),
        lambda: s.reciprocal() * d,
        lambda: d * (1.0 / s),
    ][form % 4]()
    return g, x, {"m": m, "d": d, "q": q, "v": v, "s": s, "y": y}


def _kinds(g):
    return [(n.kind, n.op) for n in g.nodes]


@pytest.mark.parametrize("form", range(6))
def test_every_spelling_becomes_one_row_op(form):
    g, x, p = _written(form)
    g.output(p["y"], "y")
    res = layernorm(g)
    assert res.changed and res.stats == {"layer_norms": 1}
    (ln,) = [n for n in res.graph.nodes if n.kind == ops.ROWOP]
    assert ln.op == "layer_norm" and ln.inputs == (x.id,) and ln.args["axis"] == 1
    assert ln.args["eps"] == float(np.float32(1e-5))
    assert ln.name == g.node(p["y"].id).name
    # only the input and leftover constants (dce removes them) remain besides the row op
    assert {k for k, _ in _kinds(res.graph)} <= {ops.INPUT, ops.CONSTANT, ops.ROWOP}
    res.graph.validate()
    assert not layernorm(res.graph).changed  # a second run finds nothing


@pytest.mark.parametrize("form", range(4))
def test_rewrite_is_numerically_the_same(form, rng):
    g, x, p = _written(form, (5, 3, 70), axis=1, dtype="float64", eps=1e-3)
    g.output(p["y"] * 2.0, "y")
    og, _ = optimize(g, 2)
    assert all(n.kind != ops.REDUCE for n in og.nodes)
    X = rng.standard_normal((5, 3, 70)) * 4
    a = tl.compile(g, backend="numpy", opt_level=0)(x=X)["y"]
    b = tl.compile(g, backend="numpy", opt_level=2)(x=X)["y"]
    np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    data=st.data(),
    dtype=st.sampled_from(["float32", "float64"]),
    form=st.integers(0, 5),
)
def test_rewrite_property(shape, data, dtype, form):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    seed = data.draw(st.integers(0, 2**31))
    g, x, p = _written(form, tuple(shape), axis, dtype, eps=1e-2)
    g.output(p["y"], "y")
    X = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(dtype)
    a = tl.compile(g, backend="numpy", opt_level=0)(x=X)["y"]
    b = tl.compile(g, backend="numpy", opt_level=2)(x=X)["y"]
    tol = 1e-4 if dtype == "float32" else 1e-11
    np.testing.assert_allclose(b, a, rtol=tol, atol=tol)


def test_intermediate_with_another_user_blocks_the_rewrite():
    for name in ("m", "d", "q", "v", "s"):
        g, x, p = _written(0)
        g.output(p["y"], "y")
        g.output(p[name] * 3.0, "other")
        assert not layernorm(g).changed, name


def test_intermediate_that_is_an_output_blocks_the_rewrite():
    g, x, p = _written(1)
    g.output(p["y"], "y")
    g.output(p["v"], "var")
    assert not layernorm(g).changed


def test_near_misses_are_left_alone():
    def build(mean_keep=True, axes=(-1, -1), eps=1e-5, sub_order=True, eps_dtype=None, sq=True):
        g = tl.EinsumGraph()
        x = g.input("x", (4, 6, 8))
        m = x.mean(axis=axes[0], keepdims=mean_keep)
        d = x - m if sub_order else m - x
        q = d * d if sq else d * x
        v = q.mean(axis=axes[1], keepdims=True)
        e = g.constant(np.asarray(eps, eps_dtype)) if eps_dtype else eps
        g.output(d / (v + e).sqrt(), "y")
        return g

    assert layernorm(build()).changed  # the baseline does match
    assert not layernorm(build(axes=(-1, 1))).changed  # two different axes
    assert not layernorm(build(sub_order=False)).changed  # mean - x
    assert not layernorm(build(sq=False)).changed  # not a square of the deviation
    assert not layernorm(build(eps=-1e-5)).changed  # a negative epsilon
    assert not layernorm(build(eps_dtype="float64")).changed  # promotes to float64
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8))
    d = x - x.mean(axis=-1, keepdims=True)
    eps = g.constant(np.full((4, 1), 1e-5, "float32"))  # not a scalar
    g.output(d / ((d * d).mean(axis=-1, keepdims=True) + eps).sqrt(), "y")
    assert not layernorm(g).changed


def test_o2_fuses_rewritten_pattern_with_producers(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (16, 96))
    w = g.input("w", (96,))
    h = (x * 0.5).tanh()
    m = h.mean(axis=-1, keepdims=True)
    d = h - m
    y = d / ((d * d).mean(axis=-1, keepdims=True) + 1e-5).sqrt() * w
    g.output(y, "y")
    og, _ = optimize(g, 2)
    fused = [n for n in og.nodes if n.kind == ops.FUSED]
    tails = [n.args["body"]["tail"] for n in fused]
    assert "layer_norm" in tails
    X = rng.standard_normal((16, 96)).astype("float32")
    W = rng.standard_normal(96).astype("float32")
    a = tl.compile(g, backend="numpy", opt_level=0)(x=X, w=W)["y"]
    b = tl.compile(g, backend="numpy", opt_level=2)(x=X, w=W)["y"]
    np.testing.assert_allclose(b, a, rtol=5e-5, atol=5e-5)
