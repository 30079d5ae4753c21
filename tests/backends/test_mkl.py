"""MKL as the CPU backends' GEMM library (backends/mkl.py): finding and loading it, its GEMMs
against numpy, the choice between it and numpy's BLAS, one OpenMP pool with numba, and whole
plans on both paths."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorlogic as tl
from tensorlogic import config
from tensorlogic.backends import mkl
from tensorlogic.backends.numpy import host_pool, threads as cpu_threads
from tensorlogic.errors import BackendError

HAS_MKL = mkl.library_path() is not None
needs_mkl = pytest.mark.skipif(not HAS_MKL, reason="the mkl package is not installed here")
TOL = {"float32": 2e-5, "float64": 1e-12, "complex64": 2e-5, "complex128": 1e-12}


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


@pytest.fixture
def use_mkl(monkeypatch):
    monkeypatch.setenv("TL_BLAS", "mkl")
    assert mkl.available()


def test_blas_setting_is_checked(monkeypatch):
    monkeypatch.setenv("TL_BLAS", "openblas")
    with pytest.raises(BackendError, match="TL_BLAS='openblas'"):
        config.cpu_blas()
    monkeypatch.setenv("TL_BLAS", "numpy")
    assert not mkl.wanted() and not mkl.available()


def test_not_installed_means_numpys_blas(monkeypatch, tmp_path):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    mkl.library_path.cache_clear()
    try:
        assert mkl.library_path() is None
        monkeypatch.setenv("TL_BLAS", "auto")
        assert not mkl.available()
        monkeypatch.setenv("TL_BLAS", "mkl")
        with pytest.raises(BackendError, match="libmkl_rt not found"):
            mkl.wanted()
        (tmp_path / "lib").mkdir()
        (tmp_path / "lib" / "libmkl_rt.so.2").write_bytes(b"")
        mkl.library_path.cache_clear()
        fake = str(tmp_path / "lib" / "libmkl_rt.so.2")
        assert mkl.library_path() == fake
        # an empty file is no MKL: an error when asked for, numpy's BLAS under "auto"
        with pytest.raises(BackendError, match="did not load as MKL"):
            mkl.available()
        monkeypatch.setenv("TL_BLAS", "auto")
        monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path / "cache"))
        assert not mkl.available()
    finally:
        mkl.library_path.cache_clear()
        mkl._loaded.pop(str(tmp_path / "lib" / "libmkl_rt.so.2"), None)
        mkl._faster.pop(str(tmp_path / "lib" / "libmkl_rt.so.2"), None)


@needs_mkl
def test_found_through_the_installed_files():
    path = mkl.library_path()
    assert os.path.isfile(path) and os.path.basename(path).startswith("libmkl_rt.so")


CASES = [
    ((6, 9), (9, 5)),  # one GEMM
    ((3, 6, 9), (3, 9, 5)),  # batch: one strided call
    ((3, 6, 9), (9, 5)),  # B broadcast (stride 0)
    ((1, 6, 9), (4, 9, 5)),  # A broadcast
    ((2, 1, 6, 9), (1, 3, 9, 5)),  # two broadcast axes: pointer batch
    ((6, 0), (0, 5)),  # k = 0
    ((0, 6, 9), (0, 9, 5)),  # empty batch
]


@needs_mkl
@pytest.mark.parametrize("dtype", sorted(TOL))
@pytest.mark.parametrize("a_shape,b_shape", CASES)
def test_matmul_matches_numpy(use_mkl, rng, dtype, a_shape, b_shape):
    a, b = _rand(rng, a_shape, dtype), _rand(rng, b_shape, dtype)
    want = np.matmul(a, b)
    out = np.full(want.shape, np.nan, dtype)
    mkl.matmul(a, b, out)
    np.testing.assert_allclose(out, want, rtol=TOL[dtype], atol=TOL[dtype] * 10)


@needs_mkl
@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_matmul_reads_transposed_and_strided_operands(use_mkl, rng, dtype):
    views = [
        (_rand(rng, (9, 6), dtype).T, _rand(rng, (5, 9), dtype).T),  # both transposed
        (_rand(rng, (4, 9, 6), dtype).swapaxes(1, 2), _rand(rng, (4, 9, 5), dtype)),
        (_rand(rng, (2, 3, 6, 9), dtype)[:, ::2], _rand(rng, (2, 2, 9, 5), dtype)),
        (_rand(rng, (3, 2, 6, 9), dtype).transpose(1, 0, 2, 3), _rand(rng, (2, 3, 9, 5), dtype)),
        (_rand(rng, (6, 18), dtype)[:, ::2], _rand(rng, (9, 5), dtype)),  # no unit stride: copy
    ]
    for a, b in views:
        want = np.matmul(a, b)
        out = np.empty(want.shape, dtype)
        mkl.matmul(a, b, out)
        np.testing.assert_allclose(out, want, rtol=TOL[dtype], atol=TOL[dtype] * 10)


@needs_mkl
def test_matmul_refuses_what_it_cannot_do(use_mkl):
    a = np.ones((3, 4), np.int64)
    with pytest.raises(BackendError, match="MKL matmul"):
        mkl.matmul(a, a.T.copy(), np.empty((3, 3), np.int64))
    f = np.ones((3, 4), np.float32)
    with pytest.raises(BackendError, match="MKL matmul"):
        mkl.matmul(f, f.T, np.empty((3, 3), np.float64))


@needs_mkl
@settings(max_examples=40, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    mnk=st.tuples(st.integers(1, 17), st.integers(1, 17), st.integers(1, 17)),
    flags=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**16),
)
def test_matmul_property(batch, mnk, flags, dtype, seed):
    m, n, k = mnk
    ta, tb, bcast_a, bcast_b = flags
    rng = np.random.default_rng(seed)
    ba = [1] * len(batch) if bcast_a else batch
    bb = [1] * len(batch) if bcast_b else batch
    a = _rand(rng, (*ba, k, m), dtype).swapaxes(-1, -2) if ta else _rand(rng, (*ba, m, k), dtype)
    b = _rand(rng, (*bb, n, k), dtype).swapaxes(-1, -2) if tb else _rand(rng, (*bb, k, n), dtype)
    want = np.matmul(a, b)
    out = np.empty(want.shape, dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TL_BLAS", "mkl")
        mkl.matmul(a, b, out)
    np.testing.assert_allclose(out, want, rtol=TOL[dtype], atol=TOL[dtype] * 10)


@needs_mkl
def test_auto_follows_the_race(monkeypatch, tmp_path):
    monkeypatch.setenv("TL_BLAS", "auto")
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path))
    lib, real_race = mkl._load(), mkl.race
    for t_mkl, t_numpy in ((1.0, 2.0), (2.0, 1.0)):
        monkeypatch.setattr(mkl, "race", lambda m, t=(t_mkl, t_numpy): t)
        monkeypatch.setattr(mkl, "_faster", {})
        (tmp_path / mkl.CHOICE_FILE).unlink(missing_ok=True)
        assert mkl.available() == (t_mkl < t_numpy)
    # the answer is kept on disk: a new process (a fresh memo) does not race again
    monkeypatch.setattr(mkl, "_faster", {})
    monkeypatch.setattr(mkl, "race", lambda m: pytest.fail("raced again"))
    with monkeypatch.context() as mp:
        mp.setattr(mkl, "_load", lambda: pytest.fail("loaded MKL for a cached 'numpy'"))
        assert mkl.available() is False
    # the real race times both libraries, and leaves MKL on its threads
    t_mkl, t_numpy = real_race(lib, reps=1)
    assert 0 < t_mkl < 10 and 0 < t_numpy < 10
    assert lib.get_threads() == mkl.threads()


@needs_mkl
def test_one_openmp_pool_with_numba(use_mkl):
    # a fresh process: numba's layer is chosen when MKL is installed, MKL's threads are the
    # libgomp workers numba started (no new threads), and its thread count follows numba's
    code = textwrap.dedent(
        """
        import os, numpy as np, numba
        from tensorlogic.backends import mkl
        from tensorlogic.backends.numpy import threads as cpu_threads
        assert mkl.available()
        from tensorlogic.backends.numba import threads as nt
        nt.configure()

        @numba.njit(parallel=True)
        def touch(x):
            for i in numba.prange(x.shape[0]):
                x[i] += 1.0

        touch(np.zeros(1 << 16))
        before = len(os.listdir("/proc/self/task"))
        a = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
        out = np.empty_like(a)
        for _ in range(3):
            mkl.matmul(a, a, out)
        # and MKL inside numba's loop (the split) stays on each block's thread: no nested team
        os.environ["TL_MKL_SPLIT"] = "1"
        cpu_threads.MIN_SPLIT_FLOPS = 0
        out2 = np.empty_like(a)
        with cpu_threads.single_threaded_blas():
            for _ in range(3):
                cpu_threads.parallel_matmul(a, a, out2)
        assert np.allclose(out2, a @ a, rtol=1e-4, atol=1e-3)
        after = len(os.listdir("/proc/self/task"))
        assert np.allclose(out, a @ a, rtol=1e-4, atol=1e-3)
        maps = open("/proc/self/maps").read()
        gomps = {ln.split()[-1] for ln in maps.splitlines() if "libgomp" in ln}
        print(numba.threading_layer(), before, after, len(gomps),
              mkl.mkl_threads(), mkl.threads(), cpu_threads.blas_libraries())
        """
    )
    env = {**os.environ, "TL_BLAS": "mkl", "TL_NUMBA_THREADING_LAYER": "threadsafe"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    layer, before, after, gomps, mkl_threads, threads, libs = res.stdout.split(maxsplit=6)
    assert layer == "omp"
    assert after == before  # MKL ran on the workers numba's kernel started
    assert gomps == "1"  # one OpenMP runtime in the process
    assert mkl_threads == threads
    assert "mkl" not in libs.lower()  # threadpoolctl never limits MKL to one thread


def _block_graph():
    """A slice of the transformer block: per-head projections, scores, softmax, values."""
    g = tl.EinsumGraph()
    x, wq, wk, wv = (g.input(n, s, "float32") for n, s in BLOCK_INPUTS.items())
    q = g.einsum("bsd,hkd->bhsk", x, wq)
    k = g.einsum("bsd,hkd->bhsk", x, wk)
    v = g.einsum("bsd,hkd->bhsk", x, wv)
    s = g.softmax(g.einsum("bhqk,bhsk->bhqs", q, k), axis=-1)
    g.output(g.einsum("bhqs,bhsk->bqhk", s, v), name="y")
    return g


BLOCK_INPUTS = {"x": (2, 16, 32), "wq": (4, 8, 32), "wk": (4, 8, 32), "wv": (4, 8, 32)}


def _block_want(f):
    q, k, v = (np.einsum("bsd,hkd->bhsk", f["x"], f[w]) for w in ("wq", "wk", "wv"))
    s = np.einsum("bhqk,bhsk->bhqs", q, k)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return np.einsum("bhqs,bhsk->bqhk", s, v)


@pytest.mark.parametrize("blas", ["mkl", "numpy"])
@pytest.mark.parametrize("split", ["0", "1"])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("threads", ["pool", "blas"])
def test_plans_on_both_blas_paths(monkeypatch, rng, blas, split, backend, threads):
    if blas == "mkl" and not HAS_MKL:
        pytest.skip("the mkl package is not installed here")
    monkeypatch.setenv("TL_BLAS", blas)
    monkeypatch.setenv("TL_MKL_SPLIT", split)
    monkeypatch.setattr(host_pool, "helper_count", lambda: 2)  # split even on one core
    monkeypatch.setattr(cpu_threads, "MIN_SPLIT_FLOPS", 0)
    monkeypatch.setattr(cpu_threads.parallel_matmul, "min_flops", 0)
    monkeypatch.setattr(cpu_threads.whole_matmul, "min_flops", 0)
    calls = []
    real = mkl.matmul
    monkeypatch.setattr(mkl, "matmul", lambda *a: calls.append(1) or real(*a))
    g = _block_graph()
    plan = tl.compile(g, backend=backend, opt_level=2, threads=threads, cache=False)
    feed = {n: (0.3 * rng.standard_normal(s)).astype(np.float32) for n, s in BLOCK_INPUTS.items()}
    got = plan(**feed)["y"]
    want = _block_want({n: v.astype(np.float64) for n, v in feed.items()})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    if blas == "numpy":
        assert not calls and "MKL" not in str(plan)
    else:
        assert ("MKL" in str(plan)) == (threads == "pool")  # print(plan) names pool runners
        # whole products go to mkl.matmul; split ones run as MKL blocks in numba's loop
        assert bool(calls) == (threads == "blas" or split == "0")


@needs_mkl
def test_first_choice_in_a_fresh_process(tmp_path):
    # the race runs (and loads MKL) on the first call of a process, then the answer is on disk
    code = "from tensorlogic.backends import mkl; print(mkl.available())"
    env = {**os.environ, "TL_BLAS": "auto", "TL_CACHE_DIR": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    for _ in range(2):
        res = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() in ("True", "False")
    assert (tmp_path / mkl.CHOICE_FILE).is_file()
