"""The "pool" thread mode: GEMMs split over our threads with single-threaded BLAS, every step on
the same threads; the "blas" mode keeps BLAS's own threads."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from threadpoolctl import threadpool_info

import tensorlogic as tl
from tensorlogic.backends.numpy import threads as cpu_threads, fused as fused_numpy, host_pool
from tensorlogic.errors import TensorLogicError


def _blas_threads() -> list[int]:
    """Threads of the BLAS libraries the pool mode controls (numpy's; a BLAS that another
    library loads later, such as scipy's, never runs a plan's GEMMs)."""
    ours = {c.filepath for c in cpu_threads._blas_controllers()}
    return [d["num_threads"] for d in threadpool_info() if d["filepath"] in ours]


@pytest.fixture
def three_threads(monkeypatch):
    """Pretend the machine has 3 cores and split every product, however small."""
    monkeypatch.setattr(host_pool, "helper_count", lambda: 2)
    monkeypatch.setattr(cpu_threads, "MIN_SPLIT_FLOPS", 0)


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((5, 37, 19), (5, 19, 23)),  # batch split (5 >= 3 threads)
        ((2, 70, 33), (2, 33, 9)),  # rows (m > n), not a multiple of the alignment
        ((2, 9, 33), (2, 33, 70)),  # columns
        ((97, 40), (40, 130)),  # 2-D, columns
        ((130, 40), (40, 97)),  # 2-D, rows
        ((1, 1), (1, 1)),
    ],
)
def test_parallel_matmul_matches_numpy(three_threads, a_shape, b_shape):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    out = np.empty(
        np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1]), np.float32
    )
    cpu_threads.parallel_matmul(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_parallel_matmul_on_strided_views(three_threads):
    """Transposed operands (a plan's swapaxes views) split correctly too."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 50, 64)).astype(np.float64).swapaxes(1, 2)  # 3 x 64 x 50
    b = rng.standard_normal((3, 40, 50)).astype(np.float64).swapaxes(1, 2)  # 3 x 50 x 40
    out = np.empty((3, 64, 40))
    cpu_threads.parallel_matmul(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)


@pytest.mark.parametrize("split", ["numba", "python"])
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((2, 1, 30, 20), (1, 3, 20, 25)),  # batch axes broadcast on either side
        ((30, 20), (4, 20, 25)),  # a 2-D operand against a batch
        ((4, 30, 20), (1, 20, 25)),
    ],
)
def test_parallel_matmul_broadcasts_batch_axes(three_threads, monkeypatch, split, a_shape, b_shape):
    # strided pairs of an einsum hand products whose operands broadcast over batch axes
    monkeypatch.setattr(cpu_threads, "SPLIT", split)
    rng = np.random.default_rng(3)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    shape = np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1])
    out = np.full(shape, np.nan, np.float32)
    with cpu_threads.single_threaded_blas():
        cpu_threads.parallel_matmul(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_cuts_cover_the_range_once():
    for n in (1, 7, 16, 47, 48, 1000):
        for parts in (1, 2, 3, 16):
            cuts = cpu_threads._cuts(n, parts, 16)
            assert cuts[0] == 0 and cuts[-1] == n
            assert all(a < b for a, b in itertools.pairwise(cuts))
            assert len(cuts) - 1 <= max(parts, 1)


def test_single_threaded_blas_nests_and_restores():
    before = _blas_threads()
    with cpu_threads.single_threaded_blas():
        assert all(n == 1 for n in _blas_threads())
        with cpu_threads.single_threaded_blas():
            assert all(n == 1 for n in _blas_threads())
        assert all(n == 1 for n in _blas_threads())  # the outer call is still inside
    assert _blas_threads() == before


def test_single_threaded_blas_restores_after_an_error():
    before = _blas_threads()
    with pytest.raises(ValueError), cpu_threads.single_threaded_blas():
        raise ValueError("boom")
    assert _blas_threads() == before


def _mlp(width=64, batch=96):
    rng = np.random.default_rng(2)
    g = tl.EinsumGraph()
    x = g.input("x", (batch, width), "float32")
    w1 = rng.standard_normal((width, 4 * width)).astype(np.float32) / 8
    w2 = rng.standard_normal((4 * width, width)).astype(np.float32) / 16
    h = g.gelu(g.einsum("bi,ij->bj", x, g.constant(w1, name="w1")))
    y = g.softmax(g.einsum("bj,jk->bk", h, g.constant(w2, name="w2")) + x, axis=-1)
    g.output(y, name="y")
    xv = rng.standard_normal((batch, width)).astype(np.float32)
    hv = xv @ w1
    hv = 0.5 * hv * (1 + np.tanh(0.7978845608028654 * (hv + 0.044715 * hv**3)))
    z = hv @ w2 + xv
    z = np.exp(z - z.max(-1, keepdims=True))
    return g, xv, z / z.sum(-1, keepdims=True)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("mode", ["pool", "blas"])
@pytest.mark.parametrize("level", [0, 2])
def test_plans_agree_in_both_thread_modes(three_threads, backend, mode, level):
    g, xv, want = _mlp()
    plan = tl.compile(g, backend=backend, opt_level=level, threads=mode, cache=False)
    np.testing.assert_allclose(plan(x=xv)["y"], want, rtol=2e-5, atol=1e-6)
    text = str(plan)
    assert ("threads: pool" in text) == (mode == "pool")


def test_pool_mode_runs_gemms_with_one_blas_thread_and_restores(three_threads, monkeypatch):
    seen: list[list[int]] = []
    real = cpu_threads.parallel_matmul

    def spy(a, b, out):
        seen.append(_blas_threads())
        return real(a, b, out)

    monkeypatch.setattr(cpu_threads, "parallel_matmul", spy)
    before = _blas_threads()
    g, xv, want = _mlp()
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    assert all(n == 1 for t in seen for n in t)  # layouts timed at compile time as they run
    seen.clear()
    np.testing.assert_allclose(plan(x=xv)["y"], want, rtol=2e-5, atol=1e-6)
    assert len(seen) == 2 and all(n == 1 for t in seen for n in t)
    assert _blas_threads() == before


def test_blas_mode_leaves_blas_threads_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_threads, "single_threaded_blas", lambda: calls.append(1))
    g, xv, want = _mlp()
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False, threads="blas")
    np.testing.assert_allclose(plan(x=xv)["y"], want, rtol=2e-5, atol=1e-6)
    assert calls == []


def test_pool_mode_plans_called_from_threads_at_once(three_threads):
    g, xv, want = _mlp()
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    before = _blas_threads()
    errors: list[BaseException] = []

    def worker():
        try:
            for _ in range(5):
                np.testing.assert_allclose(plan(x=xv)["y"], want, rtol=2e-5, atol=1e-6)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert _blas_threads() == before


def test_large_lone_row_op_runs_on_the_helpers_with_identical_results(monkeypatch):
    """At O0 a lone softmax over a large array becomes a one-op fused kernel with a register
    set per thread, and gives exactly what the row kernel gives."""
    monkeypatch.setattr(fused_numpy, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(fused_numpy, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(host_pool, "helper_count", lambda: 1)
    rng = np.random.default_rng(4)
    g = tl.EinsumGraph()
    x = g.input("x", (64, 33), "float32")
    g.output(g.softmax(g.layer_norm(x) * 2.0, axis=-1), name="y")
    xv = rng.standard_normal((64, 33)).astype(np.float32)
    pool = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    blas = tl.compile(g, backend="numpy", opt_level=0, cache=False, threads="blas")
    assert any(s.info.startswith("[") for s in pool.steps)  # fused-kernel description
    np.testing.assert_array_equal(pool(x=xv)["y"], blas(x=xv)["y"])


@pytest.mark.parametrize("bad", ["omp", 2, ""])
def test_bad_thread_mode_is_rejected(bad):
    g = tl.EinsumGraph()
    g.output(g.input("x", (2, 2)) * 2.0, name="y")
    with pytest.raises(TensorLogicError, match="threads"):
        tl.compile(g, backend="numpy", threads=bad, cache=False)


@pytest.mark.parametrize(
    "step_gemms,bound",
    [
        ([[(1, 256, 256, 256)]] * 5, True),  # a chain of plain GEMMs
        ([[(1, 48, 48, 2304)], [(1, 1000, 1000, 1000)]], True),
        ([[(48, 48, 48, 48), (1, 48, 48, 2304)]], False),  # a batched product: keep the split
        ([[(1, 512, 2048, 512)], None, [(1, 512, 512, 2048)]], False),  # a row op between
        ([None], False),
        ([[]], False),  # no GEMM at all (a one-operand einsum)
        ([], False),
    ],
)
def test_blas_bound_rule(step_gemms, bound):
    assert cpu_threads.blas_bound(step_gemms) is bound


def _einsum_plan(spec, shapes, backend="numpy", seed=0):
    g = tl.EinsumGraph()
    ins = [g.input(f"x{j}", s, "float32") for j, s in enumerate(shapes)]
    g.output(g.einsum(spec, *ins), "y")
    rng = np.random.default_rng(seed)
    feed = {f"x{j}": rng.standard_normal(s).astype(np.float32) for j, s in enumerate(shapes)}
    want = np.einsum(spec, *[v.astype(np.float64) for v in feed.values()], optimize=True)
    return tl.compile(g, backend=backend, opt_level=2, cache=False), feed, want


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize(
    "spec,shapes,bound",
    [
        ("ab,bc,cd,de->ad", [(40, 56), (56, 72), (72, 64), (64, 48)], True),
        ("ij,jk->ik", [(96, 80), (80, 112)], True),
        ("bij,bjk->bik", [(6, 40, 24), (6, 24, 56)], False),
        ("abc,bcd,cde->ae", [(12, 10, 14)] + [(10, 14, 16), (14, 16, 9)], False),
    ],
)
def test_gemm_only_plans_choose_blas_threads_by_the_rule(
    three_threads, monkeypatch, backend, spec, shapes, bound
):
    seen: list[list[int]] = []
    real = cpu_threads.parallel_matmul

    def spy(a, b, out):
        seen.append(_blas_threads())
        return real(a, b, out)

    monkeypatch.setattr(cpu_threads, "parallel_matmul", spy)
    plan, feed, want = _einsum_plan(spec, shapes, backend)
    before = _blas_threads()
    seen.clear()
    np.testing.assert_allclose(plan(**feed)["y"], want, rtol=2e-4, atol=2e-4)
    assert ("BLAS's own threads" in str(plan)) == bound
    assert "threads: pool" in str(plan)
    # a blas-bound plan leaves BLAS's thread count as it was; a split plan runs on one
    assert seen and all(t == (before if bound else [1] * len(before)) for t in seen)
    assert _blas_threads() == before


def test_mixed_plans_keep_the_split(three_threads):
    g, xv, want = _mlp()
    plan = tl.compile(g, backend="numba", opt_level=2, cache=False)
    assert "BLAS's own threads" not in str(plan)
    np.testing.assert_allclose(plan(x=xv)["y"], want, rtol=2e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    dims=st.lists(st.integers(1, 70), min_size=3, max_size=6),
    batch=st.sampled_from([0, 1, 3]),
)
def test_gemm_chains_match_numpy_in_either_runner(dims, batch):
    # random chains (plain, or with a batch letter that keeps the split): numpy's result
    letters = "abcdefg"
    n = len(dims) - 1
    pre = "z" if batch else ""
    terms = [pre + letters[i] + letters[i + 1] for i in range(n)]
    spec = ",".join(terms) + "->" + pre + letters[0] + letters[n]
    shapes = [((batch,) if batch else ()) + (dims[i], dims[i + 1]) for i in range(n)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(host_pool, "helper_count", lambda: 2)
        mp.setattr(cpu_threads, "MIN_SPLIT_FLOPS", 0)
        plan, feed, want = _einsum_plan(spec, shapes, seed=sum(dims))
        got = plan(**feed)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(dims))
