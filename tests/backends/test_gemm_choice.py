"""Large products of "pool"-mode plans on MKL: the plans' constants (backends/constants.py),
MKL's packed-operand GEMMs (mkl.prepare_packed), whole GEMMs finished on numba's threads
(gemm_numba.then_epilogue), and the timed choice between the split and the whole ways
(backends/gemm_choice.py)."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.backends import constants, gemm_choice, gemm_numba, mkl
from tensorlogic.backends.numpy import threads as cpu_threads

needs_mkl = pytest.mark.skipif(mkl.library_path() is None, reason="the mkl package is not here")
TOL = {"float32": 3e-5, "float64": 1e-12}


@pytest.fixture
def use_mkl(monkeypatch, tmp_path):
    monkeypatch.setenv("TL_BLAS", "mkl")
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TL_MKL_SPLIT", raising=False)
    monkeypatch.setattr(gemm_choice, "_chosen", {})
    monkeypatch.setattr(cpu_threads, "_DISPATCH", {})
    assert mkl.available()


def _close(got, want, dtype):
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * np.abs(want).max())


def _constant(x: np.ndarray) -> np.ndarray:
    x = np.array(x)
    x.setflags(write=False)
    constants.register([x])
    return x


# ------------------------------------------------------------------ the plans' constants
def test_constant_roots_follow_views(rng):
    w = _constant(rng.standard_normal((6, 4)))
    assert constants.constant_root(w) is w
    assert constants.constant_root(w.T[1:, ::2]) is w
    assert constants.constant_root(w.reshape(3, 8)) is w
    assert constants.constant_root(w.copy()) is None
    assert constants.constant_root(rng.standard_normal(3)) is None
    assert constants.constant_root([1.0, 2.0]) is None


def test_a_constant_is_forgotten_when_it_dies():
    w = _constant(np.ones(5))
    ident = id(w)
    del w
    gc.collect()
    assert ident not in constants._ROOTS


def test_a_compiled_plan_registers_its_constants(rng):
    g = tl.EinsumGraph()
    x = g.input("x", (3, 4))
    w = g.constant(rng.standard_normal((4, 5)).astype(np.float32), name="w")
    g.output(g.einsum("ij,jk->ik", x, w), name="y")
    plan = tl.compile(g, backend="numpy", cache=False)
    held = [a for a in plan.concrete.constants.values() if a.shape == (4, 5)]
    assert held and all(constants.constant_root(a) is not None for a in held)


# ------------------------------------------------------------------ packed operands
@needs_mkl
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("which", ["A", "B"])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_packed_products_match_numpy(use_mkl, rng, dtype, which, trans_a, trans_b):
    m, k, n = 37, 53, 29
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    a, b = (_constant(a), b) if which == "A" else (a, _constant(b))
    A, B = (a.T if trans_a else a), (b.T if trans_b else b)
    out = np.empty((m, n), dtype)
    assert mkl.can_pack(A, B, out)
    call = mkl.prepare_packed(A, B, out, which)
    for _ in range(2):  # packs on the first call, reuses the pack after
        out[...] = np.nan
        _close(call(A, B, out), A.astype(np.float64) @ B, dtype)


@needs_mkl
def test_packed_calls_follow_the_operand_they_are_given(use_mkl, rng):
    """One prepared call serves every operand of its shapes: each constant gets its own pack,
    and an operand that is no constant runs the plain MKL call."""
    A = rng.standard_normal((40, 24)).astype(np.float32)
    w1 = _constant(rng.standard_normal((24, 16)).astype(np.float32))
    w2 = _constant(rng.standard_normal((24, 16)).astype(np.float32))
    free = rng.standard_normal((24, 16)).astype(np.float32)
    out = np.empty((40, 16), np.float32)
    call = mkl.prepare_packed(A, w1, out)
    for B in (w1, w2, free, w1, free, w2):
        _close(call(A, B, out).copy(), A.astype(np.float64) @ B, "float32")
        free += 1.0  # a non-constant's data may change between calls


@needs_mkl
def test_a_dead_constants_pack_is_not_reused(use_mkl, rng):
    A = rng.standard_normal((32, 48)).astype(np.float32)
    out = np.empty((32, 64), np.float32)
    w = _constant(rng.standard_normal((48, 64)).astype(np.float32))
    call = mkl.prepare_packed(A, w, out)
    call(A, w, out)
    for _ in range(4):  # new constants, perhaps at the address of the one before
        del w
        gc.collect()
        w = _constant(rng.standard_normal((48, 64)).astype(np.float32))
        _close(call(A, w, out), A.astype(np.float64) @ w, "float32")


@needs_mkl
def test_packs_go_with_their_constant(use_mkl, rng):
    w = _constant(rng.standard_normal((24, 32)).astype(np.float32))
    packs = mkl.ConstantPacks("B", 111, 32, "float32", [(0, 16, 32, 24)])
    assert packs.addresses(w) is not None and len(packs._packs) == 1
    keep = _constant(rng.standard_normal((24, 32)).astype(np.float32))
    packs.addresses(keep)
    del w
    gc.collect()
    assert list(packs._packs) == [keep.ctypes.data]  # the dead one's packs are freed
    assert packs.addresses(keep) is not None


@needs_mkl
def test_what_cannot_be_packed(use_mkl, rng):
    A = rng.standard_normal((8, 6)).astype(np.float32)
    B = rng.standard_normal((6, 5)).astype(np.float32)
    out = np.empty((8, 5), np.float32)
    assert mkl.can_pack(A, B, out)
    assert not mkl.can_pack(
        A.astype(np.complex64), B.astype(np.complex64), out.astype(np.complex64)
    )
    assert not mkl.can_pack(A[None], B[None], out[None])  # batches stay on the batch calls
    assert not mkl.can_pack(A[:, ::2], B[::2], out)  # no unit stride in A's matrix
    assert not mkl.can_pack(A, B, np.empty((5, 8), np.float32).T)  # out not C-contiguous


@needs_mkl
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("which", ["A", "B"])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("epilogue", [None, "bias", "relu", "gelu", "residual"])
@pytest.mark.parametrize("parts", [1, 3, 4])
def test_split_products_on_packed_blocks(use_mkl, rng, dtype, which, trans, epilogue, parts):
    """Blocks of uneven sizes (shared packs for equal ones), either operand packed, transposed
    or not, with and without a tile epilogue; a non-constant operand takes the unpacked way."""
    m, k, n = 70, 45, 100
    a = rng.standard_normal((k, m) if trans else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans else (k, n)).astype(dtype)
    a, b = (_constant(a), b) if which == "A" else (a, _constant(b))
    A, B = (a.T, b.T) if trans else (a, b)
    bias = rng.standard_normal(n).astype(dtype)
    res = rng.standard_normal((m, n)).astype(dtype) if epilogue == "residual" else None
    act = None if epilogue in ("bias", "residual") else epilogue
    blocks = gemm_numba.grid(1, m, n, parts, 8, 16)
    unpacked = []
    call = gemm_numba.prepare_packed(
        A, B, np.empty((m, n), dtype), blocks, which, lambda *args: unpacked.append(args),
        act, res is not None,
    )  # fmt: skip
    want = A.astype(np.float64) @ B
    if epilogue is not None:
        want = want + bias + (0 if res is None else res)
        if act == "relu":
            want = np.maximum(want, 0)
        elif act == "gelu":
            want = 0.5 * want * (1 + np.tanh(np.sqrt(2 / np.pi) * (want + 0.044715 * want**3)))
    for _ in range(2):
        out = np.full((m, n), np.nan, dtype)
        got = call(A, B, out) if epilogue is None else call(A, B, out, bias, res)
        tol = 1e-5 if act == "gelu" and dtype == "float32" else TOL[dtype]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    assert not unpacked
    free = (A.copy(), B) if which == "A" else (A, B.copy())
    call(*free, out)
    assert len(unpacked) == 1


# ------------------------------------------------------------------ whole GEMMs, tiles after
@pytest.mark.parametrize(
    "act, residual", [(None, False), ("relu", False), ("gelu", False), (None, True)]
)  # a residual comes only without an activation
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_whole_products_finish_their_tiles(rng, act, residual, dtype):
    m, k, n = 70, 33, 90
    A = rng.standard_normal((m, k)).astype(dtype)
    B = rng.standard_normal((k, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    res = rng.standard_normal((m, n)).astype(dtype) if residual else None
    blocks = gemm_numba.grid(1, m, n, 4)
    call = gemm_numba.then_epilogue(
        lambda A, B, out: np.matmul(A, B, out=out), blocks, dtype, act, residual
    )
    out = np.full((m, n), np.nan, dtype)
    call(A, B, out, bias, res)
    v = A.astype(np.float64) @ B + bias + (0 if res is None else res)
    if act == "relu":
        v = np.maximum(v, 0)
    elif act == "gelu":
        v = 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))
    np.testing.assert_allclose(out, v, rtol=1e-5, atol=1e-5 * np.abs(v).max())


# ------------------------------------------------------------------ the timed choice
class _Clock:
    """A clock that only the fake ways below advance: timings without a machine's jitter."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def way(self, seconds: float, calls: list, name: str):
        def call(*args):
            calls.append(name)
            self.now += seconds

        return call


@pytest.mark.parametrize(
    "costs, winner",
    [
        ({"split": 4.0, "whole": 1.0}, "whole"),
        ({"split": 2.0, "whole": 2.0}, "split"),  # a tie: the split stays
        ({"split": 2.0, "whole": 1.95}, "split"),  # 2.5% faster: within the margin
        ({"split": 2.0, "whole": 1.9, "whole packed": 1.5}, "whole packed"),
        ({"split": 1.0, "whole packed": 4.0}, "split"),
    ],
)
def test_the_race_keeps_the_split_unless_another_way_is_clearly_faster(monkeypatch, costs, winner):
    clock = _Clock()
    monkeypatch.setattr(gemm_choice, "time", clock)
    calls: list[str] = []
    ways = {name: clock.way(cost, calls, name) for name, cost in costs.items()}
    assert gemm_choice.race(ways, (), reps=3) == winner
    assert all(calls.count(name) == 4 for name in costs)  # a warm-up and three rounds each


@needs_mkl
def test_a_choice_is_timed_once_and_kept_per_machine(use_mkl, rng, monkeypatch, tmp_path):
    raced = []
    monkeypatch.setattr(
        gemm_choice, "race", lambda ways, args: raced.append(sorted(ways)) or "whole"
    )
    A = rng.standard_normal((64, 32)).astype(np.float32)
    B = _constant(rng.standard_normal((32, 48)).astype(np.float32))
    out = np.empty((64, 48), np.float32)

    def split(A, B, out):
        raise AssertionError("the split was not chosen")

    blocks = gemm_numba.grid(1, 64, 48, 2)
    call = gemm_choice.product(A, B, out, split, blocks)
    assert raced == [["split", "split packed", "whole", "whole packed"]]
    _close(call(A, B, out), A.astype(np.float64) @ B, "float32")
    gemm_choice._chosen.clear()  # a new process: the file answers, only "whole" is built
    for unused in (mkl, gemm_numba):
        monkeypatch.setattr(unused, "prepare_packed", lambda *a, **k: pytest.fail("built"))
    gemm_choice.product(A, B, out, split, blocks)
    assert len(raced) == 1 and (tmp_path / gemm_choice.CHOICE_FILE).is_file()
    free = B.copy()  # no constant: another product key, and no packed way offered
    gemm_choice.product(A, free, out, split, blocks)
    assert raced[-1] == ["split", "whole"]


def _mlp(rng, w_scale: float):
    w = {
        "w1": (w_scale * rng.standard_normal((384, 512))).astype(np.float32),
        "b1": rng.standard_normal(512).astype(np.float32),
        "w2": (w_scale * rng.standard_normal((512, 384))).astype(np.float32),
        "b2": rng.standard_normal(384).astype(np.float32),
    }
    g = tl.EinsumGraph()
    x = g.input("x", (256, 384))
    c = {n: g.constant(v, name=n) for n, v in w.items()}
    h = g.relu(g.einsum("bi,ij->bj", x, c["w1"]) + c["b1"])
    g.output(g.einsum("bj,jk->bk", h, c["w2"]) + c["b2"], name="y")  # a bias-only epilogue
    return g, w


def _mlp_want(x, w):
    h = np.maximum(x.astype(np.float64) @ w["w1"] + w["b1"], 0)
    return h @ w["w2"] + w["b2"]


@needs_mkl
@pytest.mark.parametrize("forced", ["whole packed", "split packed", "whole", "split", None])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_plans_give_the_same_products_every_way(use_mkl, rng, monkeypatch, forced, backend):
    """Two plans of the same shapes and other weights, called in turn, each on every way a
    product may take (the race forced to one; None: really timed)."""
    monkeypatch.setattr(cpu_threads, "split_parts", lambda: 3)  # a split even on few cores
    monkeypatch.setattr(gemm_choice, "RACE_MIN_FLOPS", 1)
    if forced is not None:
        real = gemm_choice.race
        monkeypatch.setattr(
            gemm_choice, "race", lambda ways, args: forced if forced in ways else real(ways, args)
        )
    (g1, w1), (g2, w2) = _mlp(rng, 0.05), _mlp(rng, -0.1)
    p1 = tl.compile(g1, backend=backend, cache=False)
    p2 = tl.compile(g2, backend=backend, cache=False)
    for _ in range(3):
        for p, w in ((p1, w1), (p2, w2)):
            x = rng.standard_normal((256, 384)).astype(np.float32)
            _close(p(x=x)["y"], _mlp_want(x, w), "float32")
    assert gemm_choice._chosen  # the products were chosen for
    if forced != "split" and forced is not None:
        assert forced in gemm_choice._chosen.values()


@needs_mkl
def test_no_race_when_the_split_setting_is_set(use_mkl, rng, monkeypatch):
    monkeypatch.setenv("TL_MKL_SPLIT", "1")
    monkeypatch.setattr(gemm_choice, "RACE_MIN_FLOPS", 1)
    monkeypatch.setattr(gemm_choice, "race", lambda *a: pytest.fail("raced under TL_MKL_SPLIT"))
    g, w = _mlp(rng, 0.05)
    plan = tl.compile(g, backend="numba", cache=False)
    x = rng.standard_normal((256, 384)).astype(np.float32)
    _close(plan(x=x)["y"], _mlp_want(x, w), "float32")
    assert not gemm_choice._chosen


@needs_mkl
def test_concurrent_first_calls_race_once(use_mkl, rng, monkeypatch):
    import threading

    raced = []

    def slow_race(ways, args):
        raced.append(1)
        time.sleep(0.05)
        return "whole"

    monkeypatch.setattr(gemm_choice, "race", slow_race)
    A = rng.standard_normal((64, 32)).astype(np.float32)
    B = rng.standard_normal((32, 48)).astype(np.float32)
    outs = [np.empty((64, 48), np.float32) for _ in range(4)]
    blocks = gemm_numba.grid(1, 64, 48, 2)
    calls = []

    def first_call(out):
        calls.append(gemm_choice.product(A, B, out, None, blocks))

    threads = [threading.Thread(target=first_call, args=(o,)) for o in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(raced) == 1 and len(calls) == 4
    for call, out in zip(calls, outs):
        _close(call(A, B, out), A.astype(np.float64) @ B, "float32")


@needs_mkl
def test_whole_products_under_the_whole_setting_finish_on_numbas_threads(use_mkl, rng, monkeypatch):
    """TL_MKL_SPLIT=0: each product one MKL call; an epilogue pair's bias and ReLU run on the
    tile loop, not as numpy ufuncs on the calling thread afterwards."""
    monkeypatch.setenv("TL_MKL_SPLIT", "0")
    monkeypatch.setattr(cpu_threads, "split_parts", lambda: 3)
    monkeypatch.setattr(
        cpu_threads, "_matmul_then_epilogue", lambda *a, **k: pytest.fail("numpy epilogue")
    )
    finished = []
    real = gemm_numba.then_epilogue
    monkeypatch.setattr(
        gemm_numba, "then_epilogue", lambda *a, **k: finished.append(a[3]) or real(*a, **k)
    )
    g, w = _mlp(rng, 0.05)
    plan = tl.compile(g, backend="numba", cache=False)
    x = rng.standard_normal((256, 384)).astype(np.float32)
    _close(plan(x=x)["y"], _mlp_want(x, w), "float32")
    assert sorted(finished, key=str) == [None, "relu"]  # both layers' epilogues


@needs_mkl
@pytest.mark.parametrize("how", ["threads=blas", "TL_MKL_SPLIT=0"])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_whole_products_pack_their_constant_weights(use_mkl, rng, monkeypatch, how, backend):
    """Products that run whole on MKL's threads (the "blas" thread mode, TL_MKL_SPLIT=0) read
    a constant weight packed once; one plan's weights and another's stay apart."""
    options = {}
    if how == "threads=blas":
        options["threads"] = "blas"
    else:
        monkeypatch.setenv("TL_MKL_SPLIT", "0")
    packed = []
    real = mkl.prepare_packed
    monkeypatch.setattr(mkl, "prepare_packed", lambda *a: packed.append(a[3]) or real(*a))
    (g1, w1), (g2, w2) = _mlp(rng, 0.05), _mlp(rng, -0.1)
    p1 = tl.compile(g1, backend=backend, cache=False, **options)
    p2 = tl.compile(g2, backend=backend, cache=False, **options)
    for _ in range(2):
        for p, w in ((p1, w1), (p2, w2)):
            x = rng.standard_normal((256, 384)).astype(np.float32)
            _close(p(x=x)["y"], _mlp_want(x, w), "float32")
    assert packed and set(packed) == {"B"}


@needs_mkl
@pytest.mark.parametrize("constant", ["A", "B", "both", "neither"])
def test_whole_calls_pack_the_operand_that_is_constant(use_mkl, rng, monkeypatch, constant):
    a = rng.standard_normal((48, 40)).astype(np.float64)
    b = rng.standard_normal((40, 56)).astype(np.float64)
    A = _constant(a) if constant in ("A", "both") else a
    B = _constant(b) if constant in ("B", "both") else b
    out = np.empty((48, 56))
    packed = []
    real = mkl.prepare_packed
    monkeypatch.setattr(mkl, "prepare_packed", lambda *x: packed.append(x[3]) or real(*x))
    call = mkl.prepare_whole(A, B, out)
    _close(call(A, B, out), a @ b, "float64")
    # neither: the plain call, with no per-call look for a constant
    assert packed == {"A": ["A"], "B": ["B"], "both": ["B"], "neither": []}[constant]
    assert mkl.prepare_whole(A[None], B[None], out[None]) is not None  # batches: plain calls
    assert len(packed) == (constant != "neither")
