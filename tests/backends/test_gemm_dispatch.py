"""The cached dispatch of CPU products (``numpy/threads.parallel_matmul``, ``whole_matmul``,
``mkl.matmul``): the way a product runs is chosen once per shapes, strides, dtypes and settings;
later calls with other data, or the same shapes under other strides, still compute A @ B."""

from __future__ import annotations

import numpy as np
import pytest

from tensorlogic.backends import gemm_numba, mkl
from tensorlogic.backends.numpy import host_pool, threads as cpu_threads

HAS_MKL = mkl.library_path() is not None

# (TL_BLAS, TL_MKL_SPLIT, SPLIT): numba loop of numpy's BLAS, Python threads, MKL split, whole
PATHS = [
    ("numpy", "", "numba"),
    ("numpy", "", "python"),
    pytest.param(
        ("mkl", "1", "numba"), marks=pytest.mark.skipif(not HAS_MKL, reason="no mkl package")
    ),
    pytest.param(
        ("mkl", "0", "numba"), marks=pytest.mark.skipif(not HAS_MKL, reason="no mkl package")
    ),
]


@pytest.fixture(params=PATHS, ids=lambda p: "-".join(x or "default" for x in p))
def path(request, monkeypatch):
    blas, split, how = request.param
    monkeypatch.setenv("TL_BLAS", blas)
    monkeypatch.setenv("TL_MKL_SPLIT", split)
    monkeypatch.setattr(cpu_threads, "SPLIT", how)
    monkeypatch.setattr(cpu_threads, "MIN_SPLIT_FLOPS", 0)
    monkeypatch.setattr(host_pool, "helper_count", lambda: 2)  # split even on one core
    monkeypatch.setattr(cpu_threads, "_DISPATCH", {})
    monkeypatch.setattr(mkl, "_calls", {})
    if how == "numba" and blas == "numpy" and not gemm_numba.available():
        pytest.skip("numpy's BLAS exports no CBLAS gemm here")
    return request.param


def _layouts(rng, nb: int, m: int, k: int, n: int):
    """(name, A, B) of one product in several memory layouts (the same shapes)."""
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    b = rng.standard_normal((nb, k, n)).astype(np.float32)
    # heads inside a sequence layout: batch stride smaller than a matrix, rows strided
    a_heads = rng.standard_normal((m, nb, k)).astype(np.float32).transpose(1, 0, 2)
    b_t = rng.standard_normal((nb, n, k)).astype(np.float32).swapaxes(-1, -2)  # transposed
    a_step = rng.standard_normal((nb, m, 2 * k)).astype(np.float32)[..., ::2]  # no unit stride
    b_bcast = rng.standard_normal((1, k, n)).astype(np.float32)  # broadcast batch
    return [
        ("contiguous", a, b),
        ("heads view", a_heads, b),
        ("transposed B", a, b_t),
        ("A copied", a_step, b),
        ("broadcast B", a, b_bcast),
        ("2-D B", a, b[0]),
    ]


def _check(run, A, B) -> None:
    out = np.empty((A.shape[0], A.shape[1], B.shape[-1]), np.float32)
    out.fill(np.nan)
    run(A, B, out)
    want = np.matmul(A.astype(np.float64), B.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("in_plan", [False, True])
@pytest.mark.parametrize("m,n", [(40, 70), (40, 1), (1, 70)])  # GEMMs, GEMVs both ways
def test_cached_dispatch_follows_data_and_strides(rng, path, in_plan, m, n):
    run = cpu_threads.parallel_matmul
    for name, A, B in _layouts(rng, 3, m, 24, n):
        with cpu_threads.pool_call() if in_plan else cpu_threads.single_threaded_blas():
            _check(run, A, B)
            kept = len(cpu_threads._DISPATCH)
            assert kept >= 1, name
            # the same shapes and strides with new data: the kept call, the new data's product
            for _ in range(2):
                view_a = _same_layout(A, rng.standard_normal(A.shape).astype(np.float32))
                view_b = _same_layout(B, rng.standard_normal(B.shape).astype(np.float32))
                assert view_a.strides == A.strides and view_b.strides == B.strides
                _check(run, view_a, view_b)
            assert len(cpu_threads._DISPATCH) == kept, name  # no new choice for new data


def _same_layout(like: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` in a fresh buffer with the strides (and offset) of ``like``."""
    base = like
    while base.base is not None:
        base = base.base
    fresh = np.empty(base.nbytes, np.uint8)
    offset = like.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    view = np.ndarray(like.shape, like.dtype, fresh, offset, like.strides)
    view[...] = values
    return view


def test_whole_matmul_follows_data_and_strides(rng, path):
    for _name, A, B in _layouts(rng, 2, 33, 17, 50):
        _check(cpu_threads.whole_matmul, A, B)
        _check(cpu_threads.whole_matmul, _same_layout(A, A + 1), _same_layout(B, B - 1))


@pytest.mark.skipif(not HAS_MKL, reason="no mkl package")
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64"])
def test_mkl_prepared_calls_follow_data_and_strides(rng, monkeypatch, dtype):
    monkeypatch.setenv("TL_BLAS", "mkl")
    monkeypatch.setattr(mkl, "_calls", {})
    a = rng.standard_normal((3, 2, 9, 5)).astype(dtype)
    b = rng.standard_normal((3, 2, 5, 7)).astype(dtype)
    cases = [(a, b), (a.transpose(1, 0, 2, 3), b.transpose(1, 0, 2, 3)), (a[:, :, ::2], b)]
    for A, B in cases:
        for scale in (1.0, -2.0):  # the second call reuses the prepared one with new data
            A2, B2 = _same_layout(A, A * scale), _same_layout(B, B + scale)
            batch = np.broadcast_shapes(A2.shape[:-2], B2.shape[:-2])
            out = np.empty(batch + (A.shape[-2], 7), dtype)
            mkl.matmul(A2, B2, out)
            want = np.matmul(A2.astype(np.complex128), B2.astype(np.complex128))
            tol = 1e-4 if dtype in ("float32", "complex64") else 1e-10
            np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.abs(want).max())
    assert len(mkl._calls) == len(cases)


def test_products_into_strided_results(rng, path):
    """``out`` a view whose matrices are rows of unit-stride columns apart (an intermediate
    written in its reader's letter order): every path writes the product in place, the numba
    loop without a copy; views BLAS cannot write (no unit stride, rows that overlap, negative
    strides) take numpy's matmul."""
    a = rng.standard_normal((2, 3, 40, 24)).astype(np.float32)
    b = rng.standard_normal((2, 3, 24, 16)).astype(np.float32)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    buf = np.full((2, 40, 3, 16), np.nan, np.float32)  # (b, q, h, k) written as (b, h, q, k)
    wide = np.full((2, 3, 40, 32), np.nan, np.float32)
    for name, out in [
        ("heads apart", buf.transpose(0, 2, 1, 3)),
        ("wide rows", wide[..., :16]),
        ("columns stepping", np.full((2, 3, 40, 32), np.nan, np.float32)[..., ::2]),
        ("reversed rows", np.full((2, 3, 40, 16), np.nan, np.float32)[:, :, ::-1]),
    ]:
        assert cpu_threads._rows_of_columns(out) == (name in ("heads apart", "wide rows")), name
        with cpu_threads.single_threaded_blas():
            cpu_threads.parallel_matmul(a, b, out)
        np.testing.assert_allclose(
            out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=name
        )
    assert not np.isnan(wide[..., :16]).any() and np.isnan(wide[..., 16:]).all()
