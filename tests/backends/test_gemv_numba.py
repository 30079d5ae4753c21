"""Matrix-vector products split over numba's threads as BLAS GEMV blocks (gemv_numba), and the
"pool" mode's choice of them over GEMM blocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorlogic as tl
from tensorlogic.backends import gemm_numba, gemv_numba
from tensorlogic.backends.numpy import host_pool, threads as cpu_threads

pytestmark = pytest.mark.skipif(
    not gemv_numba.available(), reason="numpy's BLAS exports no CBLAS gemv under a known name"
)


def _product(rng, batch_a, batch_b, m, n, k, t_matrix, dtype):
    """A (*batch_a, m, k) @ (*batch_b, k, n) with m or n equal to 1; ``t_matrix`` stores the
    matrix operand transposed (its rows 1 apart), as a plan's strided views do."""

    def make(shape, transposed):
        if transposed:
            return rng.standard_normal(shape[:-2] + shape[:-3:-1]).astype(dtype).swapaxes(-1, -2)
        return rng.standard_normal(shape).astype(dtype)

    a = make(batch_a + (m, k), t_matrix and n == 1)
    b = make(batch_b + (k, n), t_matrix and m == 1)
    return a, b


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("t_matrix", [False, True])
@pytest.mark.parametrize(
    "batch_a,batch_b,m,n,k,parts",
    [
        ((), (), 1000, 1, 24, 4),  # one matrix times a vector, rows cut
        ((), (), 1, 700, 24, 3),  # a vector times a matrix
        ((7,), (1,), 50, 1, 24, 3),  # a batch of matrices, one vector for all (broadcast)
        ((1,), (7,), 1, 50, 24, 16),  # one vector against a batch of matrices
        ((2, 1), (1, 5), 33, 1, 9, 4),  # batch axes broadcast on either side
        ((3,), (3,), 129, 1, 1, 5),  # k = 1
        ((), (), 1, 1, 40, 2),  # a dot product
    ],
)
def test_split_matches_numpy(rng, dtype, t_matrix, batch_a, batch_b, m, n, k, parts):
    a, b = _product(rng, batch_a, batch_b, m, n, k, t_matrix, dtype)
    a = a.reshape((1,) * (len(batch_b) - len(batch_a)) + a.shape)
    out = np.full(np.broadcast_shapes(batch_a, batch_b) + (m, n), np.nan, dtype)
    assert gemv_numba.usable(a, b, out)
    with cpu_threads.single_threaded_blas():
        gemv_numba.matmul(a, b, out, parts)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    tol = 1e-4 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * k)


def test_products_it_does_not_take(rng):
    a = rng.standard_normal((30, 8))
    v = rng.standard_normal((8, 1))
    out = np.empty((30, 1))
    assert gemv_numba.usable(a, v, out)
    assert not gemv_numba.usable(a, rng.standard_normal((8, 2)), np.empty((30, 2)))  # no GEMV
    assert not gemv_numba.usable(a.astype(np.float32), v, out)  # mixed dtypes
    ints = np.ones((30, 8), np.int64)
    assert not gemv_numba.usable(ints, np.ones((8, 1), np.int64), np.empty((30, 1), np.int64))
    assert not gemv_numba.usable(a[::-1], v, out)  # a negative stride
    # neither axis of the matrix has a unit stride
    assert not gemv_numba.usable(rng.standard_normal((30, 16))[:, ::2], v, out)
    assert not gemv_numba.usable(np.broadcast_to(a[:1], (30, 8)), v, out)  # rows repeated


@settings(max_examples=40, deadline=None)
@given(
    nb=st.integers(1, 6),
    rows=st.integers(1, 300),
    k=st.integers(1, 40),
    vec_left=st.booleans(),
    t_matrix=st.booleans(),
    parts=st.integers(1, 20),
    seed=st.integers(0, 2**16),
)
def test_random_gemvs_match_numpy(nb, rows, k, vec_left, t_matrix, parts, seed):
    rng = np.random.default_rng(seed)
    m, n = (1, rows) if vec_left else (rows, 1)
    a, b = _product(rng, (nb,), (nb,), m, n, k, t_matrix, "float64")
    out = np.full((nb, m, n), np.nan)
    with cpu_threads.single_threaded_blas():
        gemv_numba.matmul(a, b, out, parts)
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-12, atol=1e-12 * k)


@settings(max_examples=40, deadline=None)
@given(nb=st.integers(1, 9), rows=st.integers(1, 500), parts=st.integers(1, 40))
def test_grid_covers_every_row_once(nb, rows, parts):
    seen = np.zeros((nb, rows), int)
    for b, r0, r1 in gemv_numba.grid(nb, rows, parts):
        assert r0 < r1
        seen[b, r0:r1] += 1
    assert (seen == 1).all()


@pytest.fixture
def three_threads(monkeypatch):
    """Pretend the machine has 3 cores and split every product, however small."""
    monkeypatch.setattr(host_pool, "helper_count", lambda: 2)
    monkeypatch.setattr(cpu_threads, "MIN_SPLIT_FLOPS", 0)
    monkeypatch.setattr(cpu_threads.parallel_matmul, "min_flops", 0)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize(
    "spec,shapes",
    [
        ("acdiq,d->aciq", [(4, 3, 24, 5, 6), (24,)]),  # a bond-24 tree's step: batched GEMVs
        ("abcde,e->abcd", [(5, 6, 7, 8, 24), (24,)]),  # one GEMV over the leading indices
        ("acdiq,d,aciq->c", [(4, 3, 24, 5, 6), (24,), (4, 3, 5, 6)]),
    ],
)
def test_pool_plans_run_gemvs_as_gemv_blocks(three_threads, monkeypatch, backend, spec, shapes):
    """In a pool-mode plan the matrix-vector products go to GEMV blocks, never to GEMM blocks,
    with numpy's result."""
    calls = []
    real = gemv_numba.matmul

    def spy(a, b, out, parts):
        calls.append(out.shape)
        return real(a, b, out, parts)

    monkeypatch.setattr(gemv_numba, "matmul", spy)
    gemm_calls = []
    real_gemm = gemm_numba.matmul

    def gemm_spy(a, b, out, blocks):
        if out.shape[-1] == 1 or out.shape[-2] == 1:
            gemm_calls.append(out.shape)
        return real_gemm(a, b, out, blocks)

    monkeypatch.setattr(gemm_numba, "matmul", gemm_spy)
    rng = np.random.default_rng(6)
    g = tl.EinsumGraph()
    ins = [g.input(f"x{j}", s, "float64") for j, s in enumerate(shapes)]
    g.output(g.exp(g.einsum(spec, *ins) * 0.01), "y")  # an elementwise step keeps the pool
    feed = {f"x{j}": rng.standard_normal(s) for j, s in enumerate(shapes)}
    plan = tl.compile(g, backend=backend, opt_level=2, cache=False)
    calls.clear()
    got = plan(**feed)["y"]
    want = np.exp(np.einsum(spec, *feed.values()) * 0.01)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert "threads: pool (" in str(plan) and calls and not gemm_calls
