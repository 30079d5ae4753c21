"""Integer, bool and complex tensors on the cupy backend against the numpy backend (GPU only).

Integer and bool results must be identical (numpy's wraparound included), complex and float
results close for their dtype, and every result dtype numpy's.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic import dtypes
from tensorlogic.errors import DTypeError
from tensorlogic.ir import ops

pytestmark = pytest.mark.gpu

INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
EXACT = ("bool", *INTS, "complex64", "complex128")
# ops whose integer operands must stay small and positive (no division by zero, no negative
# integer powers, no overflow to inf that both sides would reach differently)
SMALL = {"pow", "reciprocal", "div", "log", "sqrt", "exp", "softplus"}
SHAPE = (129, 33)


def _data(rng, shape, dt, small=False):
    if dt == "bool":
        return rng.random(shape) < 0.5
    if dt.startswith("complex"):
        z = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        return (z * (0.5 if small else 2.0)).astype(dt)
    if dt in INTS:
        if small:
            return rng.integers(1, 6, shape).astype(dt)
        info = np.iinfo(dt)  # the whole range: sums and products wrap around
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    return (rng.standard_normal(shape) * 2).astype(dt)


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _check(got, ref, what, scale=1.0):
    got = _host(got)
    assert got.dtype == ref.dtype, (what, got.dtype, ref.dtype)
    if ref.dtype.kind in "biu":
        np.testing.assert_array_equal(got, ref, err_msg=what)
        return
    tol = {"float16": 2e-3, "float32": 2e-5, "complex64": 2e-5}.get(ref.dtype.name, 1e-12)
    np.testing.assert_allclose(got, ref, rtol=tol * scale, atol=tol * scale, err_msg=what)


def _run_both(g, inputs):
    ref = tl.compile(g, backend="numpy", opt_level=0)(**inputs)
    got = tl.compile(g, backend="cupy", opt_level=0, cuda_graph=False)(**inputs)
    return ref, got


@pytest.mark.parametrize("dt", EXACT)
def test_every_elementwise_op(dt, rng):
    """Each op numpy has a loop for over ``dt`` (where: over a float32 condition), one output
    per op; CUDA C kernels and, where they leave it, CuPy's loops."""
    g = tl.EinsumGraph()
    inputs, outs = {}, []
    for op, row in ops.ELEMENTWISE.items():
        dts = [dt] * row.arity
        if op == "where":
            dts[0] = "float32"
        try:
            dtypes.elementwise_result(op, ops.DTYPE[op], dts)
        except DTypeError:
            continue
        xs = []
        for k, d in enumerate(dts):
            name = f"{op}{k}"
            inputs[name] = _data(rng, SHAPE, d, op in SMALL)
            xs.append(g.input(name, SHAPE, d))
        g.output(g.elementwise(op, *xs), op)
        outs.append(op)
    with np.errstate(all="ignore"):
        ref, got = _run_both(g, inputs)
    for op in outs:
        _check(got[op], ref[op], f"{op} over {dt}")


@pytest.mark.parametrize("dt", EXACT)
def test_reductions(dt, rng):
    """Every reduction numpy has a loop for over ``dt``: row, column, split (few long rows) and
    whole-tensor layouts; numpy's result dtypes (sum of int8 is int64, mean of ints float64)."""
    layouts = [((64, 1000), (1,)), ((300, 5, 7), (1,)), ((40, 30, 20), (0, 2)), ((4, 50000), (1,))]
    g = tl.EinsumGraph()
    inputs, outs = {}, []
    for j, (shape, axes) in enumerate(layouts):
        small = dt != "bool"  # integer products wrap either way; complex ones stay finite
        x = g.input(f"x{j}", shape, dt)
        inputs[f"x{j}"] = _data(rng, shape, dt, small=small)
        for tail in ops.REDUCTIONS:
            try:
                dtypes.reduction_result(tail, dt)
            except DTypeError:
                continue
            g.output(g.reduce(tail, x, axes), f"{tail}{j}")
            outs.append(f"{tail}{j}")
    with np.errstate(all="ignore"):
        ref, got = _run_both(g, inputs)
    for name in outs:
        # float and complex sums in another order: rounding grows with the row (up to 50000)
        _check(got[name], ref[name], f"{name} over {dt}", scale=100.0)


def test_integer_sums_wrap_around_as_numpy(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (8, 4096), "int32")
    g.output(g.reduce("max", x, (1,)), "m")
    g.output(g.elementwise("mul", x, x), "sq")
    g.output(g.einsum("ij,kj->ik", x, x), "gram")
    big = rng.integers(2**30, 2**31 - 1, (8, 4096)).astype(np.int32)
    ref, got = _run_both(g, {"x": big})
    for name in ("m", "sq", "gram"):
        _check(got[name], ref[name], name)
    assert np.any(ref["gram"] < 0)  # the sums wrapped


EINSUMS = [
    ("ij,jk->ik", [(64, 48), (48, 40)]),
    ("bij,bjk->bik", [(3, 32, 16), (3, 16, 24)]),
    ("ij,kj->ik", [(40, 33), (50, 33)]),  # a transposed operand
    ("ijk,jl,lk->i", [(12, 10, 8), (10, 6), (6, 8)]),  # a path of three
    ("ii,ij->j", [(20, 20), (20, 9)]),  # a diagonal
    ("ij,ij->", [(30, 31), (30, 31)]),  # a full inner product
    ("ij->j", [(70, 9)]),  # an operand's own sum
]


@pytest.mark.parametrize(
    "dt", ("bool", "int8", "uint16", "int64", "uint64", "complex64", "complex128")
)
def test_einsums(dt, rng):
    """Contractions: complex on cuBLAS's complex GEMMs, integers and bool exact (CuPy's integer
    matmul), as numpy.einsum computes them."""
    for spec, shapes in EINSUMS:
        g = tl.EinsumGraph()
        xs = [g.input(f"x{k}", s, dt) for k, s in enumerate(shapes)]
        g.output(g.einsum(spec, *xs), "y")
        inputs = {f"x{k}": _data(rng, s, dt) for k, s in enumerate(shapes)}
        ref = np.einsum(spec, *inputs.values())
        for level in (0, 2):
            got = tl.compile(g, backend="cupy", opt_level=level)(**inputs)["y"]
            _check(got, np.asarray(ref), f"{spec} over {dt} at O{level}")


def test_mixed_dtypes_and_python_scalars(rng):
    """Mixed operands promote as numpy's (NEP 50: Python scalars are weak)."""
    g = tl.EinsumGraph()
    a = g.input("a", SHAPE, "int8")
    b = g.input("b", SHAPE, "uint8")
    f = g.input("f", SHAPE, "float32")
    c = g.input("c", SHAPE, "complex64")
    g.output(a + b, "ab")  # int16
    g.output(a * 3, "a3")  # int8, wrapping
    g.output(a + f, "af")  # float32
    g.output(c * f, "cf")  # complex64
    g.output(c + 2.5j, "cj")
    g.output(g.einsum("ij,ij->i", c, f), "ecf")  # complex64 from mixed operands
    inputs = {
        "a": _data(rng, SHAPE, "int8"),
        "b": _data(rng, SHAPE, "uint8"),
        "f": _data(rng, SHAPE, "float32"),
        "c": _data(rng, SHAPE, "complex64"),
    }
    ref, got = _run_both(g, inputs)
    for name in ref:
        _check(got[name], ref[name], name)


def test_complex_contraction_replays_in_a_cuda_graph(rng):
    """A complex128 network on cuBLAS's complex GEMMs, captured and replayed with new inputs."""
    g = tl.EinsumGraph()
    xs = [g.input(n, (16, 16), "complex128") for n in "abcd"]
    y = g.einsum("ij,jk,kl,li->", *xs)
    g.output(g.elementwise("exp", g.einsum("ij,jk->ik", xs[0], xs[1]) * 0.01) + y, "y")
    plan = tl.compile(g, backend="cupy", opt_level=2, cuda_graph=True)
    for _ in range(4):
        inputs = {n: _data(rng, (16, 16), "complex128") for n in "abcd"}
        ref = tl.compile(g, backend="numpy", opt_level=0)(**inputs)["y"]
        _check(plan(**inputs)["y"], ref, "complex graph")
    assert "cuda graph: on" in str(plan), str(plan)


@pytest.mark.parametrize(
    "dt", ["float32", "float64", "float16", "bfloat16", "int8", "uint64", "bool", "complex128"]
)
def test_comparisons_are_bool_and_masks_multiply(dt, rng):
    """Comparisons give bool (CUDA C kernels computing in the operands' dtype); a mask times a
    float32 tensor stays float32, at O0 and O2 (fused around the mask)."""
    g = tl.EinsumGraph()
    x, y = g.input("x", SHAPE, dt), g.input("y", SHAPE, dt)
    w = g.input("w", SHAPE, "float32")
    cmps = ("eq", "ne") if dt.startswith("complex") else ops.COMPARISONS
    for op in cmps:
        m = g.binary(op, x, y)
        g.output(m, op)
        g.output(g.exp(w * m) * 2.0 + w, f"{op}_masked")
    a, b = _data(rng, SHAPE, dt), _data(rng, SHAPE, dt)
    b[::2] = a[::2]  # ties
    inputs = {"x": a, "y": b, "w": _data(rng, SHAPE, "float32")}
    ref = tl.compile(g, backend="numpy", opt_level=0)(**inputs)
    for level in (0, 2):
        got = tl.compile(g, backend="cupy", opt_level=level)(**inputs)
        for name in ref:
            assert ref[name].dtype == (np.bool_ if name in cmps else np.float32)
            _check(got[name], ref[name], f"{name} over {dt} at O{level}")
