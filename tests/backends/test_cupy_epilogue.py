"""Which contraction + elementwise pairs the cupy backend runs as one cuBLASLt epilogue call
(the decision, ``backends/epilogue.py``, needs no GPU), and the compiler's folding of such a
pair into one step, checked with a host backend that runs pairs with numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.backends import register_backend, unregister_backend
from tensorlogic.backends.base import PreparedKernel
from tensorlogic.backends import epilogue
from tensorlogic.backends.numpy.backend import NumpyBackend
from tensorlogic.compiler.schedule import make_buffers, needed_nodes
from tensorlogic.optimizer import optimize
from tensorlogic.options import CompileOptions

RNG = np.random.default_rng(7)


def _const(g, shape, dtype, name):
    return g.constant(RNG.standard_normal(shape).astype(np.float32), name=name, dtype=dtype)


def _decide(g, opt_level=2):
    """The optimized graph and its epilogue pairs, as the cupy backend would find them."""
    opts = CompileOptions.resolve({}, "numpy", frozenset())
    o, _ = optimize(g, opt_level, opts)
    order = needed_nodes(o)
    bufs = make_buffers(o, order)
    views = frozenset(n for n, b in bufs.items() if b.view_of is not None)
    return o, epilogue.find(o, order, views)


def _mlp(dtype="bfloat16", act="gelu", spec="bsd,df->bsf", xshape=(3, 5, 7), wshape=(7, 9)):
    g = tl.EinsumGraph()
    x = g.input("x", xshape, dtype)
    w = _const(g, wshape, dtype, "w")
    b = _const(g, (9,), dtype, "b")
    h = g.einsum(spec, x, w) + b
    if act is not None:
        h = getattr(g, act)(h)
    g.output(h, "y")
    return g


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("act", [None, "gelu", "relu"])
def test_bias_and_activation_fuse(dtype, act):
    o, pairs = _decide(_mlp(dtype, act))
    (epi,) = pairs.values()
    assert epi.activation == act and not epi.residual
    assert epi.name == {None: "BIAS", "gelu": "GELU_BIAS", "relu": "RELU_BIAS"}[act]
    assert (epi.m, epi.n, epi.k) == (15, 9, 7)
    assert o.node(epi.gemm).args["spec"] == "bsd,df->bsf"
    assert "cuBLASLt epilogue" in epi.describe("h")


@pytest.mark.parametrize(
    "spec,xshape,wshape,xt,wt",
    [
        ("md,dn->mn", (5, 7), (7, 9), False, False),
        ("md,nd->mn", (5, 7), (9, 7), False, True),
        ("dm,dn->mn", (7, 5), (7, 9), True, False),
        ("dab,nd->abn", (7, 2, 3), (9, 7), True, True),
        ("dn,bsd->bsn", (3, 2, 7), (7, 9), False, False),
    ],
)
def test_layouts(spec, xshape, wshape, xt, wt):
    g = tl.EinsumGraph()
    lhs = spec.split("->")[0].split(",")
    if len(lhs[0]) == 2 and lhs[0][1] == "n":  # the weight first
        w = _const(g, wshape, "float32", "w")
        x = g.input("x", xshape, "float32")
        h = g.einsum(spec, w, x)
    else:
        x = g.input("x", xshape, "float32")
        w = _const(g, wshape, "float32", "w")
        h = g.einsum(spec, x, w)
    g.output(g.relu(h + _const(g, (9,), "float32", "b")), "y")
    _, pairs = _decide(g)
    (epi,) = pairs.values()
    assert (epi.x_transposed, epi.w_transposed, epi.n, epi.k) == (xt, wt, 9, 7)


def test_residual_without_activation_fuses():
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), "bfloat16")
    w = _const(g, (8, 8), "bfloat16", "w")
    b = _const(g, (1, 8), "bfloat16", "b")
    g.output(g.einsum("ij,jk->ik", x, w) + b + x, "y")
    _, pairs = _decide(g)
    (epi,) = pairs.values()
    assert epi.residual and epi.activation is None and len(epi.inputs) == 4
    assert "residual" in epi.describe("h")


def _no_pair(g):
    _, pairs = _decide(g)
    assert pairs == {}


def test_two_consumers_do_not_fuse():
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), "float32")
    h = g.einsum("ij,jk->ik", x, _const(g, (8, 6), "float32", "w"))
    g.output(g.gelu(h + _const(g, (6,), "float32", "b")), "y")
    g.output(g.sum(h, axis=1), "s")
    _no_pair(g)


def test_product_that_is_an_output_does_not_fuse():
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), "float32")
    h = g.einsum("ij,jk->ik", x, _const(g, (8, 6), "float32", "w"))
    g.output(h, "h")
    g.output(h + _const(g, (6,), "float32", "b"), "y")
    _no_pair(g)


@pytest.mark.parametrize("bshape", [(4, 1), (4, 6), ()])
def test_bias_along_another_axis_does_not_fuse(bshape):
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), "float32")
    h = g.einsum("ij,jk->ik", x, _const(g, (8, 6), "float32", "w"))
    g.output(g.gelu(h + _const(g, bshape, "float32", "b")), "y")
    _no_pair(g)


@pytest.mark.parametrize("act", ["tanh", "sigmoid", "exp"])
def test_other_activations_do_not_fuse(act):
    _no_pair(_mlp("float32", act))


def test_scaled_product_does_not_fuse():
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), "float32")
    h = g.einsum("ij,jk->ik", x, _const(g, (8, 6), "float32", "w"))
    g.output(h * 2.0 + _const(g, (6,), "float32", "b"), "y")
    _no_pair(g)


@pytest.mark.parametrize("dtype", ["float64", "int32", "complex64"])
def test_other_dtypes_do_not_fuse(dtype):
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), dtype)
    w = g.constant(np.ones((8, 6), dtype), name="w")
    g.output(g.einsum("ij,jk->ik", x, w) + g.constant(np.ones((6,), dtype), name="b"), "y")
    _no_pair(g)


def test_residual_under_an_activation_does_not_fuse():
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), "float32")
    h = g.einsum("ij,jk->ik", x, _const(g, (8, 8), "float32", "w"))
    g.output(g.relu(h + _const(g, (8,), "float32", "b") + x), "y")
    _no_pair(g)


def test_batched_product_does_not_fuse():
    g = tl.EinsumGraph()
    x = g.input("x", (2, 4, 8), "float32")
    h = g.einsum("bij,bjk->bik", x, _const(g, (2, 8, 6), "float32", "w"))
    g.output(h + _const(g, (6,), "float32", "b"), "y")
    _no_pair(g)


def test_bias_of_another_dtype_does_not_fuse():
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), "float32")
    h = g.einsum("ij,jk->ik", x, _const(g, (8, 6), "float32", "w"))
    g.output(h + g.constant(np.ones((6,), np.float16), name="b"), "y")
    _no_pair(g)


def test_mixed_operand_dtypes_do_not_fuse():
    g = tl.EinsumGraph()
    x = g.input("x", (4, 8), "float16")
    w = _const(g, (8, 6), "float32", "w")
    g.output(g.einsum("ij,jk->ik", x, w) + _const(g, (6,), "float32", "b"), "y")
    _no_pair(g)


# the compiler's side: a host backend that runs each pair with numpy ------------------------


class _PairsOnHost(NumpyBackend):
    """The numpy backend, plus the cupy backend's pairs run as one numpy step each."""

    name = "epilogue_host"

    def epilogue_pairs(self, graph, order, views):
        return epilogue.find(graph, order, views)

    def prepare_epilogue(self, step, pair, graph):
        def run(args, out, e=pair):
            x, w, bias = (np.asarray(a, np.float32) for a in args[:3])
            xm = x.reshape(e.k, e.m).T if e.x_transposed else x.reshape(e.m, e.k)
            wm = w.reshape(e.n, e.k).T if e.w_transposed else w.reshape(e.k, e.n)
            y = xm @ wm + bias.reshape(1, e.n)
            if e.residual:
                y += np.asarray(args[3], np.float32).reshape(e.m, e.n)
            if e.activation == "relu":
                y = np.maximum(y, 0)
            elif e.activation == "gelu":
                y = 0.5 * y * (1 + np.tanh(0.7978845608028654 * (y + 0.044715 * y**3)))
            out[...] = y.reshape(out.shape).astype(out.dtype)
            return out

        return PreparedKernel(run, info=pair.describe(graph.node(pair.gemm).name))


@pytest.fixture
def host_pairs():
    register_backend(_PairsOnHost.name, _PairsOnHost, replace=True)
    yield _PairsOnHost.name
    unregister_backend(_PairsOnHost.name)


def _block(dtype):
    g = tl.EinsumGraph()
    x = g.input("x", (3, 5, 12), dtype)
    h = g.gelu(
        g.einsum("bsd,df->bsf", x, _const(g, (12, 17), dtype, "w1")) + _const(g, (17,), dtype, "c1")
    )
    m = g.einsum("bsf,df->bsd", h, _const(g, (12, 17), dtype, "w2")) + _const(g, (12,), dtype, "c2")
    g.output(
        g.relu(
            g.einsum("bsd,de->bse", m + x, _const(g, (12, 6), dtype, "w3"))
            + _const(g, (6,), dtype, "c3")
        ),
        "y",
    )
    return g


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiler_folds_pairs_into_one_step(host_pairs, dtype):
    g = _block(dtype)
    compiled = tl.compile(g, backend=host_pairs, cache=False)
    plan = compiled.specialize()
    # the reference without pairs: the numpy backend runs its own GEMM-block pairs in "pool"
    ref_plan = tl.compile(g, backend="numpy", cache=False, threads="blas")
    ref = ref_plan.specialize()
    text = str(compiled)
    assert text.count("cuBLASLt epilogue") == 3, text
    assert "GELU_BIAS" in text and "RELU_BIAS" in text and "BIAS + residual" in text
    assert len(plan.steps) == len(ref.steps) - 3
    x = RNG.standard_normal((3, 5, 12)).astype(np.float32)
    if dtype == "bfloat16":
        x = x.astype(ml_dtypes.bfloat16)
    got = np.asarray(compiled(x=x)["y"], np.float64)
    want = np.asarray(ref_plan(x=x)["y"], np.float64)
    # bfloat16: both plans round each layer's result to 8 bits, in different places (the pair
    # rounds once, the two steps twice), so a value near 0 may differ by a rounding of the layer
    tol = 1e-5 if dtype == "float32" else 0.1
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    assert plan.memory.peak_bytes <= ref.memory.peak_bytes


def test_backend_without_pairs_keeps_both_steps(host_pairs):
    class _Declines(_PairsOnHost):
        name = "epilogue_declines"

        def prepare_epilogue(self, step, pair, graph):
            return None

    register_backend(_Declines.name, _Declines, replace=True)
    try:
        g = _block("float32")
        compiled = tl.compile(g, backend=_Declines.name, cache=False)
        ref_plan = tl.compile(g, backend="numpy", cache=False, threads="blas")  # no pairs
        plan, ref = compiled.specialize(), ref_plan.specialize()
        assert "cuBLASLt" not in plan.table()
        assert [s.label for s in plan.steps] == [s.label for s in ref.steps]
        x = RNG.standard_normal((3, 5, 12)).astype(np.float32)
        np.testing.assert_allclose(compiled(x=x)["y"], ref_plan(x=x)["y"], rtol=1e-6)
    finally:
        unregister_backend(_Declines.name)
