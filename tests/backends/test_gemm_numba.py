"""GEMMs split over numba's threads (gemm_numba) and the "pool" mode's choice of split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tensorlogic.backends import gemm_numba
from tensorlogic.backends.numpy import threads as cpu_threads

pytestmark = pytest.mark.skipif(
    not gemm_numba.available(), reason="numpy's BLAS exports no CBLAS gemm under a known name"
)


def _operands(rng, nb, m, n, k, ta, tb, dtype):
    a = rng.standard_normal((nb, k, m) if ta else (nb, m, k)).astype(dtype)
    b = rng.standard_normal((nb, n, k) if tb else (nb, k, n)).astype(dtype)
    return (a.swapaxes(1, 2) if ta else a), (b.swapaxes(1, 2) if tb else b)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize(
    "nb,m,n,k,parts", [(1, 67, 130, 33, 4), (3, 40, 9, 70, 5), (5, 1, 17, 8, 3), (2, 129, 1, 5, 7)]
)
def test_split_matches_numpy(rng, dtype, ta, tb, nb, m, n, k, parts):
    a, b = _operands(rng, nb, m, n, k, ta, tb, dtype)
    out = np.full((nb, m, n), np.nan, dtype)
    with cpu_threads.single_threaded_blas():
        gemm_numba.matmul(a, b, out, gemm_numba.grid(nb, m, n, parts))
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    tol = 1e-4 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * k)


def test_broadcast_and_strided_operands(rng):
    # a batch axis broadcast with stride 0, and an operand BLAS cannot read (copied first)
    a = np.broadcast_to(rng.standard_normal((1, 20, 12)).astype(np.float32), (4, 20, 12))
    b = rng.standard_normal((4, 24, 30)).astype(np.float32)[:, ::2, ::3]
    out = np.empty((4, 20, 10), np.float32)
    gemm_numba.matmul(a, b, out, gemm_numba.grid(4, 20, 10, 3))
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-5, atol=1e-5)
    # two-dimensional operands
    a2, b2 = a[0], np.ascontiguousarray(b[1])
    out2 = np.empty((20, 10), np.float32)
    gemm_numba.matmul(a2, b2, out2, gemm_numba.grid(1, 20, 10, 2))
    np.testing.assert_allclose(out2, a2 @ b2, rtol=1e-5, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(nb=st.integers(1, 5), m=st.integers(1, 300), n=st.integers(1, 300), parts=st.integers(1, 40))
def test_grid_covers_every_element_once(nb, m, n, parts):
    blocks = gemm_numba.grid(nb, m, n, parts)
    seen = np.zeros((nb, m, n), np.int32)
    for bt, r0, r1, c0, c1 in blocks:
        assert r0 < r1 and c0 < c1
        seen[bt, r0:r1, c0:c1] += 1
    assert (seen == 1).all()
    # about one block per part: never fewer than the work allows, never many more
    assert len(blocks) <= max(parts, nb)


@pytest.mark.parametrize("split", ["numba", "python"])
@pytest.mark.parametrize("shape", [(1, 256, 192, 96), (6, 64, 80, 48)])
def test_parallel_matmul_splits_agree(rng, monkeypatch, split, shape):
    monkeypatch.setattr(cpu_threads, "SPLIT", split)
    monkeypatch.setattr(cpu_threads, "MIN_SPLIT_FLOPS", 0)
    monkeypatch.setattr(cpu_threads.host_pool, "helper_count", lambda: 3)
    nb, m, n, k = shape
    a, b = _operands(rng, nb, m, n, k, 0, 1, "float32")
    if nb == 1:
        a, b = a[0], b[0]
    out = np.full(a.shape[:-1] + (n,), np.nan, np.float32)
    with cpu_threads.single_threaded_blas():
        cpu_threads.parallel_matmul(a, b, out)
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_split_gemm_plan_called_from_many_threads(rng, backend):
    import threading

    import tensorlogic as tl

    g = tl.EinsumGraph()
    x = g.input("x", (4, 96, 128), "float32")
    w = g.constant(rng.standard_normal((128, 160)).astype(np.float32), name="w")
    g.output(g.relu(g.einsum("bsd,df->bsf", x, w)), "y")
    plan = tl.compile(g, backend=backend, cache=False)
    errors = []

    def work(seed: int) -> None:
        r = np.random.default_rng(seed)
        for _ in range(20):
            xv = r.standard_normal((4, 96, 128)).astype(np.float32)
            got = plan(x=xv)["y"]
            want = np.maximum(np.einsum("bsd,df->bsf", xv.astype(np.float64), plan_w), 0)
            if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                errors.append(seed)

    plan_w = np.asarray(g.constants[w.id], np.float64)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_split_respects_the_thread_cap(monkeypatch):
    # TL_NUM_THREADS (host_pool.helper_count) caps the blocks of a split GEMM
    monkeypatch.setattr(cpu_threads.host_pool, "helper_count", lambda: 1)
    assert len(cpu_threads._grid(1, 512, 512)) <= 2
    monkeypatch.setattr(cpu_threads.host_pool, "helper_count", lambda: 0)
    a = np.ones((64, 64), np.float32)
    out = np.empty((64, 64), np.float32)
    calls = []
    monkeypatch.setattr(gemm_numba, "matmul", lambda *args: calls.append(args))
    monkeypatch.setattr(cpu_threads, "MIN_SPLIT_FLOPS", 0)
    cpu_threads.parallel_matmul(a, a, out)  # one thread: numpy's matmul, no split
    assert not calls and (out == 64).all()


def test_without_cblas_the_python_split_runs(rng, monkeypatch):
    # a numpy whose BLAS exports no known CBLAS gemm: the blocks go to the helper threads
    monkeypatch.setattr(gemm_numba, "_gemms", {"numpy": {}, "mkl": {}})
    monkeypatch.setenv("TL_BLAS", "numpy")
    monkeypatch.setattr(cpu_threads, "MIN_SPLIT_FLOPS", 0)
    monkeypatch.setattr(cpu_threads.host_pool, "helper_count", lambda: 2)
    assert not gemm_numba.available()
    assert "helper threads" in cpu_threads.describe("pool")
    a = rng.standard_normal((96, 40)).astype(np.float32)
    b = rng.standard_normal((40, 72)).astype(np.float32)
    out = np.empty((96, 72), np.float32)
    with cpu_threads.single_threaded_blas():
        cpu_threads.parallel_matmul(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,n,parts", [(48, 48, 8), (256, 40, 8), (20, 300, 7)])
def test_grid_takes_fewer_blocks_rather_than_thin_ones(m, n, parts):
    # a block narrower than the micro-kernel tile re-packs the whole other operand for little
    # work: the grid then uses fewer blocks, each at least 8 rows and 32 columns where it can
    blocks = gemm_numba.grid(1, m, n, parts)
    rows, cols = blocks[:, 2] - blocks[:, 1], blocks[:, 4] - blocks[:, 3]
    assert (rows >= min(m, 8)).all() and (cols >= min(n, 32)).all()
    assert 1 < len(blocks) <= parts
