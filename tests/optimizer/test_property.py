"""Property test: random graphs give the O0 results at every opt level."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import tensorlogic as tl
from tensorlogic.errors import ShapeError
from tensorlogic.ir import infer

# Bounded unary ops: no overflow, so reassociated sums cannot turn inf into nan differently.
UNARY = ("neg", "abs", "tanh", "sigmoid", "relu", "one_minus", "gelu", "softplus")
BINARY = ("add", "sub", "mul", "maximum", "minimum")
SCALARS = (0.0, 1.0, 0.5, 2.0, -1.5)
INPUT_SHAPES = ((3, 4), (4, 5), (3,), (4,), (5, 3), (3, 4))
LETTERS = "abcdefgh"


def _pick(data, pool, pred=lambda t: True):
    cands = [t for t in pool if pred(t)]
    return data.draw(st.sampled_from(cands)) if cands else None


def _einsum(data, g, pool):
    a = _pick(data, pool, lambda t: t.ndim >= 1)
    b = _pick(data, pool, lambda t: t.ndim >= 1 and t.shape[0] == a.shape[-1])
    la = LETTERS[: a.ndim]
    if b is None:  # a single-operand einsum: a transpose or a sum over the last axis
        out = la[::-1] if data.draw(st.booleans()) else la[:-1]
        return g.einsum(f"{la}->{out}", a)
    shift = data.draw(st.integers(0, 3))  # alpha-renamed variants exercise CSE
    la = "".join(LETTERS[(LETTERS.index(c) + shift) % 8] for c in la)
    lb = la[-1] + "".join(LETTERS[(LETTERS.index(la[-1]) + 1 + k) % 8] for k in range(b.ndim - 1))
    keep = "".join(c for c in la + lb if (la + lb).count(c) == 1)
    if data.draw(st.booleans()):
        keep = keep[::-1]
    x = a * data.draw(st.sampled_from(SCALARS)) if data.draw(st.booleans()) else a
    return g.einsum(f"{la},{lb}->{keep}", x, b)


def _step(data, g, pool, inputs):
    kind = data.draw(
        st.sampled_from(
            ("unary", "binary", "scalar", "einsum", "reduce", "rowop", "layout", "where", "dup")
        )
    )
    if kind == "unary":
        return g.unary(data.draw(st.sampled_from(UNARY)), _pick(data, pool))
    if kind == "binary":
        a = _pick(data, pool)

        def fits(t):
            try:
                return infer.broadcast([a.shape, t.shape], "") == tuple(a.shape) or t.ndim <= a.ndim
            except ShapeError:
                return False

        b = _pick(data, pool, fits)
        op = data.draw(st.sampled_from(BINARY))
        return g.binary(op, a, b) if data.draw(st.booleans()) else g.binary(op, b, a)
    if kind == "scalar":
        a = _pick(data, pool)
        s = data.draw(st.sampled_from(SCALARS))
        op = data.draw(st.sampled_from(("add", "sub", "mul", "div")))
        return g.binary(op, a, s if op != "div" or s != 0.0 else 2.0)
    if kind == "einsum":
        return _einsum(data, g, pool)
    if kind == "reduce":
        a = _pick(data, pool, lambda t: t.ndim >= 1)
        op = data.draw(st.sampled_from(("sum", "mean", "max", "min", "logsumexp")))
        axis = data.draw(st.sampled_from((-1, None, 0)))
        return g.reduce(op, a, axis, keepdims=data.draw(st.booleans()))
    if kind == "rowop":
        a = _pick(data, pool, lambda t: t.ndim >= 1)
        return getattr(g, data.draw(st.sampled_from(("softmax", "log_softmax"))))(a)
    if kind == "layout":
        a = _pick(data, pool, lambda t: t.ndim == 2)
        if a is None:
            return None
        if data.draw(st.booleans()):
            return a.T.T if data.draw(st.booleans()) else a.T
        return a.reshape(a.shape[0] * a.shape[1]).reshape(a.shape)
    if kind == "where":
        c = _pick(data, inputs)
        a = _pick(data, pool, lambda t: tuple(t.shape) == tuple(c.shape))
        b = _pick(data, pool, lambda t: tuple(t.shape) == tuple(c.shape))
        return g.where(c > 0.1, a, b * 0.5)
    # dup: the same op again (CSE must merge it, DCE may drop it)
    a = _pick(data, pool)
    return g.tanh(a) + g.tanh(a)


@settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_graphs_match_o0_at_every_level(data):
    g = tl.EinsumGraph()
    n_in = data.draw(st.integers(1, 3))
    inputs = [
        g.input(f"x{k}", data.draw(st.sampled_from(INPUT_SHAPES)), "float64") for k in range(n_in)
    ]
    pool = list(inputs)
    for _ in range(data.draw(st.integers(1, 10))):
        t = _step(data, g, pool, inputs)
        if t is not None:
            pool.append(t)
    g.output(pool[-1], name="y")
    extra = data.draw(st.integers(0, 2))
    for k, t in enumerate(pool[-1 - extra : -1]):
        if t.id not in g.outputs.values():
            g.output(t, name=f"o{k}")
    seed = data.draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    vals = {f"x{k}": rng.uniform(-1.5, 1.5, t.shape) for k, t in enumerate(inputs)}
    ref = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**vals)
    for level in (1, 2, 3):
        got = tl.compile(g, backend="numpy", opt_level=level, cache=False)(**vals)
        assert set(got) == set(ref)
        for name in ref:
            np.testing.assert_allclose(
                got[name], ref[name], rtol=1e-9, atol=1e-9, err_msg=f"output {name} at O{level}"
            )
