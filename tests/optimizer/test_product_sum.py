"""The product_sum pass: einsums without data reuse fuse with their elementwise producers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.optimizer import optimize, product_sum


def _kernel_machine(q=6, n=10, f=5, dtype="float32"):
    """Score[q] = A[i] Ys[i] (Xq[q, j] X[i, j] + 1)^2, as the kernel machine example writes it."""
    g = tl.EinsumGraph()
    xq = g.input("xq", (q, f), dtype)
    x = g.input("x", (n, f), dtype)
    a = g.input("a", (n,), dtype)
    ys = g.input("ys", (n,), dtype)
    dot = g.einsum("qj,ij->qi", xq, x) + 1.0
    g.output(g.einsum("i,i,qi,qi->q", a, ys, dot, dot), "score")
    return g


def _feed(g, rng):
    return {
        name: rng.standard_normal(g.node(nid).shape).astype(g.node(nid).dtype)
        for name, nid in g.inputs.items()
    }


def test_kernel_machine_sum_becomes_one_fused_reduction(rng):
    g = _kernel_machine()
    og, report = optimize(g, 2)
    kinds = sorted(n.kind for n in og.nodes if n.kind not in (ops.INPUT, ops.CONSTANT))
    # the GEMM stays an einsum; A * Ys is a small product of its own; "+ 1", the products with
    # the kernel values and the sum are one fused node
    assert kinds == [ops.BINARY, ops.EINSUM, ops.FUSED]
    assert any(r.name == "product_sum" and r.changed for r in report.records)
    feed = _feed(g, rng)
    f = {k: v.astype(np.float64) for k, v in feed.items()}
    want = np.einsum(
        "i,i,qi,qi->q", f["a"], f["ys"], f["xq"] @ f["x"].T + 1, f["xq"] @ f["x"].T + 1
    )
    for backend in ("numpy", "numba"):
        got = tl.compile(g, backend=backend, opt_level=2)(**feed)["score"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _one(spec, shapes, dtypes=None, producer=0, twice=False):
    """An einsum whose operand ``producer`` is ``x + 1`` (None: no producer)."""
    g = tl.EinsumGraph()
    dtypes = dtypes or ["float32"] * len(shapes)
    xs = [g.input(f"x{k}", s, d) for k, (s, d) in enumerate(zip(shapes, dtypes))]
    if producer is not None:
        xs[producer] = xs[producer] + 1.0
        if twice:
            g.output(xs[producer], "p")
    g.output(g.einsum(spec, *xs), "y")
    return g


@pytest.mark.parametrize(
    "spec,shapes,kw",
    [
        ("i,i->", [(8,), (8,)], {"producer": None}),  # nothing to fuse: BLAS's dot stays
        ("ij,jk->ik", [(3, 4), (4, 5)], {}),  # a GEMM: no operand holds every index
        ("ba,ba->ab", [(3, 4), (3, 4)], {}),  # summed letters would not trail: left alone
        ("ba,ab->b", [(3, 4), (4, 3)], {}),  # an operand in another index order
        ("ii,i->i", [(3, 3), (3,)], {}),  # a repeated index (a diagonal)
        ("ba,a->b", [(3, 4), (4,)], {"dtypes": ["float32", "float64"]}),  # mixed dtypes
        ("ba,a->b", [(3, 4), (4,)], {"twice": True}),  # the producer is an output too
        ("ba,a->b", [(3, 1), (4,)], {}),  # a size-1 broadcast of an index
    ],
)
def test_left_alone(spec, shapes, kw):
    g = _one(spec, shapes, **kw)
    assert not product_sum(g).changed


@st.composite
def _cases(draw):
    """A full operand over random letters (output letters first), other operands on ordered
    subsets of them, the full one made by an elementwise op."""
    n = draw(st.integers(1, 4))
    letters = "abcd"[:n]
    sizes = {c: draw(st.integers(1, 5)) for c in letters}
    n_out = draw(st.integers(0, n))
    full = letters
    terms = [full]
    for _ in range(draw(st.integers(1, 3))):
        keep = [c for c in full if draw(st.booleans())]
        terms.append("".join(keep))
    if draw(st.booleans()):
        terms.append(full)
    order = draw(st.permutations(range(len(terms))))
    terms = [terms[i] for i in order]
    spec = ",".join(terms) + "->" + full[:n_out]
    shapes = [tuple(sizes[c] for c in t) for t in terms]
    dtype = draw(st.sampled_from(["float32", "float64"]))
    return spec, shapes, terms.index(full), dtype


@settings(max_examples=60, deadline=None)
@given(case=_cases(), seed=st.integers(0, 2**16), backend=st.sampled_from(["numpy", "numba"]))
def test_rewritten_einsums_match_numpy(case, seed, backend):
    spec, shapes, producer, dtype = case
    g = _one(spec, shapes, [dtype] * len(shapes), producer)
    res = product_sum(g)
    assert res.changed
    res.graph.validate()
    feed = _feed(g, np.random.default_rng(seed))
    ops_ = [v.astype(np.float64) for v in feed.values()]
    ops_[producer] = ops_[producer] + 1.0
    want = np.einsum(spec, *ops_)
    got = tl.compile(g, backend=backend, opt_level=2)(**feed)["y"]
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
