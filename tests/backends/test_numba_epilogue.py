"""GEMM epilogues on the CPU backends: a contraction and its bias (+ ReLU / GELU, or +
residual) consumer run as one step of GEMM blocks that each finish their own tile
(``gemm_numba.prepare_epilogue``, ``threads.matmul_epilogue``), checked against the numpy
backend at O0, which runs every node as written."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorlogic as tl
from tensorlogic.backends import gemm_numba
from tensorlogic.backends.numpy import threads as cpu_threads

pytestmark = pytest.mark.skipif(not gemm_numba.available(), reason="no CBLAS gemm to enter")

TOL = {"float32": 2e-5, "float64": 1e-12}


def _graph(rng, m, n, k, act, dtype, x_t=False, w_t=False, residual=False, lead=()):
    g = tl.EinsumGraph()
    xs = (k, *lead, m) if x_t else (*lead, m, k)
    x = g.input("x", xs, dtype)
    w = g.constant(rng.standard_normal((n, k) if w_t else (k, n)).astype(dtype), name="w")
    b = g.constant(rng.standard_normal(n).astype(dtype), name="b")
    ms = "".join("pqr"[: len(lead)]) + "i"
    spec = ("c" + ms if x_t else ms + "c") + "," + ("jc" if w_t else "cj") + "->" + ms + "j"
    h = g.einsum(spec, x, w) + b
    feed = {"x": rng.standard_normal(xs).astype(dtype)}
    if residual:
        h = h + g.input("r", (*lead, m, n), dtype)
        feed["r"] = rng.standard_normal((*lead, m, n)).astype(dtype)
    if act is not None:
        h = getattr(g, act)(h)
    g.output(h, name="y")
    return g, feed


def _check(g, feed, dtype, expect_epilogue=True, **opts):
    plan = tl.compile(g, backend="numba", cache=False, **opts)
    got = plan(**feed)["y"]
    want = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**feed)["y"]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale)
    infos = [s.info for s in plan.steps]
    assert any("GEMM-block epilogue" in i for i in infos) == expect_epilogue, infos
    return plan


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("x_t,w_t", [(False, False), (True, False), (False, True), (True, True)])
def test_bias_activation_epilogues_match_numpy(rng, dtype, act, x_t, w_t):
    # 300 x 260 x 40 is past the split threshold: several blocks, each finishing its own tile
    g, feed = _graph(rng, 300, 260, 40, act, dtype, x_t, w_t)
    plan = _check(g, feed, dtype)
    assert len(plan.steps) == 1
    name = {None: "BIAS", "relu": "RELU_BIAS", "gelu": "GELU_BIAS"}[act]
    assert f"epilogue {name} " in plan.steps[0].info


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_residual_epilogue_and_batched_rows(rng, dtype):
    g, feed = _graph(rng, 33, 70, 17, None, dtype, residual=True, lead=(3,))
    plan = _check(g, feed, dtype)
    assert "+ residual" in plan.steps[0].info


def test_matrix_vector_pairs_stay_two_steps(rng):
    g, feed = _graph(rng, 1, 300, 64, "gelu", "float32")
    _check(g, feed, "float32", expect_epilogue=False)


def test_small_odd_product_runs_as_one_block(rng):
    g, feed = _graph(rng, 5, 3, 7, "gelu", "float32")
    plan = _check(g, feed, "float32")
    assert plan.steps[0].threads == 1


def test_nan_and_inf_propagate_like_numpy(rng):
    g, feed = _graph(rng, 64, 48, 16, "relu", "float32")
    feed["x"][3, 2] = np.nan
    feed["x"][5, :] = np.inf
    plan = tl.compile(g, backend="numba", cache=False)
    want = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**feed)["y"]
    got = plan(**feed)["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-5, atol=2e-5)


def test_gelu_of_large_values_is_exact_at_the_tails(rng):
    g, feed = _graph(rng, 64, 64, 8, "gelu", "float32")
    feed["x"] *= 30  # GEMM outputs far out on both sides: gelu -> x and -> -0
    _check(g, feed, "float32")


def test_no_fold_where_the_option_or_mode_says_so(rng):
    g, feed = _graph(rng, 64, 64, 32, "gelu", "float32")
    _check(g, feed, "float32", expect_epilogue=False, fast_math=False)
    _check(g, feed, "float32", expect_epilogue=False, threads="blas")
    g2, feed2 = _graph(rng, 64, 64, 32, "relu", "float32")
    _check(g2, feed2, "float32", expect_epilogue=True, fast_math=False)


def test_product_used_twice_or_as_output_keeps_two_steps(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (40, 30), "float32")
    w = g.constant(rng.standard_normal((30, 20)).astype(np.float32), name="w")
    b = g.constant(rng.standard_normal(20).astype(np.float32), name="b")
    h = g.einsum("ik,kj->ij", x, w)
    g.output(g.relu(h + b), name="y")
    g.output(h, name="h")
    _check(g, {"x": rng.standard_normal((40, 30)).astype(np.float32)}, "float32", False)


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_fallback_without_the_numba_loop_computes_the_same(rng, monkeypatch, act):
    a = rng.standard_normal((50, 30)).astype(np.float32)
    b = rng.standard_normal((30, 40)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    fast = cpu_threads.matmul_epilogue(a, b, np.empty((50, 40), np.float32), bias, None, act)
    cpu_threads.clear_dispatch()
    monkeypatch.setattr(cpu_threads, "SPLIT", "python")
    slow = cpu_threads.matmul_epilogue(a, b, np.empty((50, 40), np.float32), bias, None, act)
    cpu_threads.clear_dispatch()
    np.testing.assert_allclose(fast, slow, rtol=2e-5, atol=2e-5)


def test_prepare_epilogue_refuses_residual_with_activation():
    a = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="residual"):
        gemm_numba.prepare_epilogue(a, a, a.copy(), gemm_numba.grid(1, 4, 4, 1), "relu", True)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 90),
    n=st.integers(1, 90),
    k=st.integers(1, 40),
    act=st.sampled_from([None, "relu", "gelu"]),
    dtype=st.sampled_from(["float32", "float64"]),
    x_t=st.booleans(),
    w_t=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_epilogue_property(m, n, k, act, dtype, x_t, w_t, seed):
    rng = np.random.default_rng(seed)
    g, feed = _graph(rng, m, n, k, act, dtype, x_t, w_t)
    plan = tl.compile(g, backend="numba", cache=False)
    want = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**feed)["y"]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(plan(**feed)["y"], want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


@pytest.mark.parametrize("m,n", [(1, 300), (300, 1)])
def test_matrix_vector_products_keep_their_gemv_path(rng, monkeypatch, m, n):
    a = rng.standard_normal((m, 64)).astype(np.float32)
    b = rng.standard_normal((64, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    called = []
    monkeypatch.setattr(gemm_numba, "prepare_epilogue", lambda *args: called.append(args) or None)
    cpu_threads.clear_dispatch()
    got = cpu_threads.matmul_epilogue(a, b, np.empty((m, n), np.float32), bias, None, "relu")
    cpu_threads.clear_dispatch()
    assert not called
    np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("layout", ["arena view", "strided"])
def test_step_writes_views_in_place_and_strided_outputs_back(rng, layout):
    from tensorlogic.backends import epilogue
    from tensorlogic.backends.numpy.backend import _epilogue_kernel

    m, n, k = 48, 40, 24
    pair = epilogue.Epilogue(1, 2, (0, 1, 3), "relu", False, m, n, k, False, False)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    if layout == "arena view":  # a plan buffer: a C-contiguous view into the plan's arena
        arena = np.zeros(m * n + 64, np.float32)
        out = arena[32 : 32 + m * n].reshape(m, n)
    else:
        out = np.zeros((n, m), np.float32).T
    got = _epilogue_kernel(pair, 0, "").fn([x, w, b], out)
    assert got is out
    np.testing.assert_allclose(out, np.maximum(x @ w + b, 0), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("act", [None, "relu", "gelu", "residual"])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("opt_level", [0, 1, 2])
def test_pairs_are_a_fusion_of_o2(rng, act, backend, opt_level):
    """From O2 (O0 and O1 run nodes as written); on the numpy backend bias, ReLU and residual
    (exact), GELU only on numba (its blocks compute it through the fast exp)."""
    residual = act == "residual"
    g, feed = _graph(rng, 96, 80, 48, None if residual else act, "float32", residual=residual)
    plan = tl.compile(g, backend=backend, opt_level=opt_level, cache=False)
    want = tl.compile(g, backend="numpy", opt_level=0, cache=False)(**feed)["y"]
    np.testing.assert_allclose(plan(**feed)["y"], want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    paired = any("GEMM-block epilogue" in s.info for s in plan.steps)
    assert paired == (opt_level >= 2 and (backend == "numba" or act != "gelu"))
