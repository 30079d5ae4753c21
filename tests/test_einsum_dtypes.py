"""Every einsum call numpy accepts, in every IR dtype: numpy's result and dtype on each CPU
backend at O0 and O2 (integers and bool bit for bit, wraparound included)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tensorlogic as tl
from tensorlogic.testing.einsum_calls import (
    EinsumCall,
    accepted,
    corpus,
    einsum_calls,
    numpy_result,
    opt_einsum_specs,
)

CORPUS = corpus(seed=20)
CPU = ("numpy", "numba")


def run_call(call: EinsumCall, operands: list, backend: str, level: int) -> np.ndarray:
    g = tl.EinsumGraph()
    args, feeds = [], {}
    for k, (x, s) in enumerate(zip(operands, call.scalars)):
        if s is not None:
            args.append(x)  # a Python scalar, as the user passes it to np.einsum
        else:
            args.append(g.input(f"x{k}", x.shape, x.dtype))
            feeds[f"x{k}"] = x
    g.output(g.einsum(call.spec, *args), name="y")
    return np.asarray(tl.compile(g, backend=backend, opt_level=level)(feeds)["y"])


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, numpy gives {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, numpy gives {want.shape}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)  # exact, wraparound included
        return
    scale = float(np.max(np.abs(want), initial=1.0))
    tol = {2: 4e-3, 4: 2e-6, 8: 1e-13}[
        np.finfo(want.dtype).bits // 8 if want.dtype.kind == "f" else np.finfo(want.dtype).bits // 8
    ]
    np.testing.assert_allclose(got, want, rtol=tol * 8, atol=tol * scale * 8, err_msg=what)


def test_corpus_covers_every_dtype_and_style():
    dts = {d for c in CORPUS for d in c.dtypes}
    # numpy's einsum has no bfloat16 loops to compare with: bfloat16 contractions are checked
    # against float64 references in tests/backends/test_half_precision.py
    assert dts == set(tl.dtypes.DTYPES) - {"bfloat16"}
    specs = {c.spec for c in CORPUS}
    assert set(opt_einsum_specs()) <= specs  # every opt_einsum test case is in
    assert any("..." in s for s in specs) and any(s.startswith(",") for s in specs)
    assert sum(1 for c in CORPUS if any(c.scalars)) >= 10
    assert len(CORPUS) >= 300


@pytest.mark.parametrize("level", [0, 2])
@pytest.mark.parametrize("backend", CPU)
def test_corpus_matches_numpy(backend, level):
    failures = []
    for j, call in enumerate(CORPUS):
        operands = call.operands(seed=1000 + j)
        want = numpy_result(call, operands)
        try:
            with np.errstate(all="ignore"):
                assert_same(run_call(call, operands, backend, level), want, str(call))
        except (AssertionError, tl.TensorLogicError) as exc:
            failures.append(f"{call}: {str(exc)[:300]}")
    assert not failures, f"{len(failures)} of {len(CORPUS)} calls differ:\n" + "\n".join(
        failures[:20]
    )


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(call=einsum_calls())
def test_random_calls_match_numpy(call):
    if not accepted(call):
        # numpy refuses it: so must we, with one of our errors
        operands = call.operands(0)
        with pytest.raises(tl.TensorLogicError):
            run_call(call, operands, "numpy", 0)
        return
    operands = call.operands(7)
    want = numpy_result(call, operands)
    for backend, level in (("numpy", 0), ("numba", 2)):
        with np.errstate(all="ignore"):
            got = run_call(call, operands, backend, level)
        assert_same(got, want, f"{call} {backend} O{level}")


def test_python_int_scalar_is_int64_as_in_numpy():
    # np.einsum converts a Python scalar with np.asarray: int8 x 2 gives int64
    a = np.arange(-3, 4, dtype=np.int8)
    g = tl.EinsumGraph()
    x = g.input("a", a.shape, "int8")
    g.output(g.einsum("i,->i", x, 2), name="y")
    got = tl.compile(g, backend="numpy")(a=a)["y"]
    want = np.einsum("i,->i", a, 2)
    assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want)


@pytest.mark.parametrize("backend", CPU)
def test_integer_contraction_wraps_like_numpy(backend):
    # sums of products that overflow int8 many times over: exact modular results, no floats
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (37, 300)).astype(np.int8)
    b = rng.integers(-128, 128, (300, 29)).astype(np.int8)
    c = rng.integers(-128, 128, (29, 11)).astype(np.int8)
    g = tl.EinsumGraph()
    xs = [g.input(n, v.shape, "int8") for n, v in (("a", a), ("b", b), ("c", c))]
    g.output(g.einsum("ij,jk,kl->il", *xs), name="y")
    got = tl.compile(g, backend=backend, opt_level=2)(a=a, b=b, c=c)["y"]
    want = np.einsum("ij,jk,kl->il", a, b, c)
    assert got.dtype == np.int8 and np.array_equal(got, want)
    # int64 products past 2**53, where a float path would round
    big = np.array([[2**40 + 1, 3]], np.int64)
    g = tl.EinsumGraph()
    x, y = g.input("x", (1, 2), "int64"), g.input("y", (2, 1), "int64")
    g.output(g.einsum("ij,jk->ik", x, y), name="y")
    got = tl.compile(g, backend=backend)(x=big, y=big.T.copy())["y"]
    assert np.array_equal(got, big @ big.T)


@pytest.mark.parametrize("backend", CPU)
def test_bool_einsum_is_logical(backend):
    rng = np.random.default_rng(4)
    a, b = rng.random((6, 5)) < 0.3, rng.random((5, 4)) < 0.3
    g = tl.EinsumGraph()
    x, y = g.input("a", a.shape, "bool"), g.input("b", b.shape, "bool")
    g.output(g.einsum("ij,jk->ik", x, y), name="y")
    g.output(g.einsum("ij->", x), name="any")
    out = tl.compile(g, backend=backend, opt_level=2)(a=a, b=b)
    assert out["y"].dtype == np.bool_ and np.array_equal(out["y"], np.einsum("ij,jk->ik", a, b))
    assert out["any"].dtype == np.bool_ and out["any"] == np.einsum("ij->", a)


def test_complex_contraction_uses_blas_path():
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((8, 6)) + 1j * rng.standard_normal((8, 6))).astype(np.complex64)
    b = (rng.standard_normal((6, 5)) + 1j * rng.standard_normal((6, 5))).astype(np.complex128)
    g = tl.EinsumGraph()
    x, y = g.input("a", a.shape, "complex64"), g.input("b", b.shape, "complex128")
    g.output(g.einsum("ij,jk->ik", x, y), name="y")
    got = tl.compile(g, backend="numpy")(a=a, b=b)["y"]
    assert got.dtype == np.complex128
    np.testing.assert_allclose(got, a.astype(np.complex128) @ b, rtol=1e-12)


def test_lists_and_numpy_scalars_as_operands():
    # np.einsum reads lists and numpy scalars with np.asarray: so does g.einsum
    a = np.arange(4, dtype=np.int16)
    g = tl.EinsumGraph()
    x = g.input("a", (4,), "int16")
    g.output(g.einsum("i,i->i", x, [1, 2, 3, 4]), "l")
    g.output(g.einsum("i,->i", x, np.int8(3)), "s")
    g.output(g.einsum("i,->i", x, 2.5), "f")
    g.output(g.einsum("i,->i", x, 1j), "c")
    for backend in CPU:
        out = tl.compile(g, backend=backend)(a=a)
        for name, want in (
            ("l", np.einsum("i,i->i", a, [1, 2, 3, 4])),
            ("s", np.einsum("i,->i", a, np.int8(3))),
            ("f", np.einsum("i,->i", a, 2.5)),
            ("c", np.einsum("i,->i", a, 1j)),
        ):
            assert out[name].dtype == want.dtype and np.array_equal(out[name], want), name
