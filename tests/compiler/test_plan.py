"""Compiled plans: calling conventions, input checking, caching, printing, threads."""

from __future__ import annotations


import numpy as np
import pytest

import tensorlogic as tl

from conftest import run_in_threads, to_numpy


def _mlp(batch="B"):
    g = tl.EinsumGraph()
    x = g.input("x", (batch, 6))
    w = g.constant(np.linspace(-1, 1, 24, dtype="float32").reshape(6, 4), name="w")
    g.output(g.relu(g.einsum("bi,ij->bj", x, w) + 0.5), name="y")
    return g


def test_call_styles(backend, rng):
    plan = tl.compile(_mlp(), backend=backend)
    x = rng.standard_normal((3, 6)).astype("float32")
    a = to_numpy(plan(x=x)["y"])
    b = to_numpy(plan({"x": x})["y"])
    np.testing.assert_array_equal(a, b)
    w = np.linspace(-1, 1, 24, dtype="float32").reshape(6, 4)
    np.testing.assert_allclose(a, np.maximum(x @ w + 0.5, 0), rtol=1e-5, atol=1e-6)


def test_input_errors_happen_before_any_work():
    plan = tl.compile(_mlp(4), backend="numpy")
    good = np.ones((4, 6), "float32")
    with pytest.raises(tl.InputError, match="missing input"):
        plan()
    with pytest.raises(tl.InputError, match="unknown input"):
        plan(x=good, z=good)
    with pytest.raises(tl.InputError, match=r"dimension 0: expected 4, got 3"):
        plan(x=np.ones((3, 6), "float32"))
    with pytest.raises(tl.InputError, match="rank"):
        plan(x=np.ones((4, 6, 1), "float32"))
    with pytest.raises(tl.InputError, match="dtype float64"):
        plan(x=np.ones((4, 6)))
    with pytest.raises(tl.InputError, match="expected a numpy array, got list"):
        plan(x=[[1.0] * 6] * 4)
    with pytest.raises(tl.InputError, match="dtype object is not supported"):
        plan(x=np.ones((4, 6), dtype=object))
    with pytest.raises(tl.InputError, match="str"):
        plan(x="hello")
    bad = good.copy()
    bad[1, 2] = np.nan
    with pytest.raises(tl.InputError, match="NaN or inf"):
        plan(x=bad, check_finite=True)
    # still usable afterwards
    assert plan(x=good)["y"].shape == (4, 4)


def test_symbol_conflict_between_inputs():
    g = tl.EinsumGraph()
    a, b = g.input("a", ("B", 2)), g.input("b", ("B", 2))
    g.output(a + b, name="y")
    plan = tl.compile(g, backend="numpy")
    with pytest.raises(tl.InputError, match="symbol 'B' is already 3"):
        plan(a=np.ones((3, 2), "float32"), b=np.ones((4, 2), "float32"))


def test_out_argument_and_fresh_outputs(rng):
    plan = tl.compile(_mlp(4), backend="numpy")
    x = rng.standard_normal((4, 6)).astype("float32")
    first = plan(x=x)["y"]
    second = plan(x=x * 2)["y"]
    assert first is not second and not np.shares_memory(first, second)
    buf = np.empty((4, 4), "float32")
    res = plan(x=x, out={"y": buf})
    assert res["y"] is buf
    np.testing.assert_array_equal(buf, first)
    with pytest.raises(tl.InputError, match="out"):
        plan(x=x, out={"y": np.empty((4, 5), "float32")})
    with pytest.raises(tl.InputError, match="unknown output"):
        plan(x=x, out={"nope": buf})


def test_outputs_that_are_inputs_or_constants_are_copies():
    g = tl.EinsumGraph()
    x = g.input("x", (3,))
    c = g.constant(np.arange(3, dtype="float32"), name="c")
    g.output(x, name="same")
    g.output(c, name="const")
    g.output(x + c, name="sum")
    plan = tl.compile(g, backend="numpy")
    xv = np.ones(3, "float32")
    out = plan(x=xv)
    assert not np.shares_memory(out["same"], xv)
    out["const"][0] = 99  # must not corrupt the plan's constant
    np.testing.assert_array_equal(plan(x=xv)["sum"], [1, 2, 3])


def test_plan_cache_and_print():
    g = _mlp()
    p1 = tl.compile(g, backend="numpy", opt_level=1)
    assert tl.compile(g, backend="numpy", opt_level=1) is p1
    assert tl.compile(g, backend="numpy", opt_level=0) is not p1
    assert "not specialized" in str(p1) or p1._last is not None
    p1(x=np.ones((2, 6), "float32"))
    text = str(p1)
    assert "einsum[bi,ij->bj]" in text and "MFLOP" in text and "memory:" in text
    assert "binding: {'B': 2}" in text
    # editing the graph after compiling does not change the cached plan
    g.output(g.tensor("x") * 2.0, name="z")
    assert "z" not in p1.output_names
    assert tl.compile(g, backend="numpy", opt_level=1) is not p1


def test_bad_compile_arguments():
    with pytest.raises(tl.GraphError):
        tl.compile("graph")
    with pytest.raises(tl.GraphError):
        tl.compile(_mlp(), opt_level=7)
    with pytest.raises(tl.BackendError, match="unknown backend"):
        tl.compile(_mlp(), backend="tpu")


def test_memory_limit():
    g = tl.EinsumGraph()
    x = g.input("x", (256, 256))
    g.output(g.exp(g.relu(x) + 1.0), name="y")
    with pytest.raises(tl.MemoryBudgetError, match="bytes"):
        tl.compile(g, backend="numpy", memory_limit=1024)


def test_register_backend():
    from tensorlogic.backends.numpy.backend import NumpyBackend

    class Counting(NumpyBackend):
        name = "counting"
        prepared = 0

        def prepare(self, step, node, in_nodes, graph):
            Counting.prepared += 1
            return super().prepare(step, node, in_nodes, graph)

    tl.register_backend("counting", Counting, replace=True)
    plan = tl.compile(_mlp(3), backend="counting")
    assert Counting.prepared == len(plan.steps)  # one prepare per step (fusion may merge steps)
    assert plan(x=np.ones((3, 6), "float32"))["y"].shape == (3, 4)
    with pytest.raises(tl.BackendError, match="already registered"):
        tl.register_backend("counting", Counting)
    from tensorlogic.backends import base

    with base._lock:  # leave the registry as the other tests expect it
        base._factories.pop("counting", None)
        base._instances.pop("counting", None)


def test_threads_share_one_plan(rng):
    plan = tl.compile(_mlp(), backend="numpy")
    w = np.linspace(-1, 1, 24, dtype="float32").reshape(6, 4)
    errors = []

    def worker(seed):
        r = np.random.default_rng(seed)
        for _ in range(50):
            x = r.standard_normal((int(r.integers(1, 9)), 6)).astype("float32")
            got = plan(x=x)["y"]
            if not np.allclose(got, np.maximum(x @ w + 0.5, 0), rtol=1e-5, atol=1e-6):
                errors.append(seed)

    run_in_threads(worker, 8)
    assert not errors


def test_plan_computes_inf_and_nan_without_warnings_and_restores_error_state(recwarn):
    """log(0), overflow in a BLAS dot and 0/0 give numpy's values, warn nothing, and leave the
    caller's floating-point error settings as they were (also when a call fails)."""
    g = tl.EinsumGraph()
    a = g.input("a", (4,))
    b = g.input("b", (4,))
    g.output(g.log(a), "log")
    g.output(g.einsum("i,i->", b, b), "dot")
    g.output(a / a, "ratio")
    plan = tl.compile(g, backend="numpy", opt_level=0)
    x = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
    big = np.full(4, 3e38, np.float32)
    before = np.geterr()
    with np.errstate(all="raise"):
        res = plan(a=x, b=big)
        assert np.geterr()["over"] == "raise"
        assert np.isneginf(res["log"][0]) and np.isinf(res["dot"]) and np.isnan(res["ratio"][0])
        with pytest.raises(tl.TensorLogicError):
            plan(a=x)
        assert np.geterr()["divide"] == "raise"
    assert np.geterr() == before
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_numpy_plan_takes_strided_inputs_and_rejects_wrong_ones():
    """Ready C-contiguous arrays skip the input checks; anything else still goes through them."""
    g = tl.EinsumGraph()
    a = g.input("a", (3, 4))
    g.output(g.einsum("ij->ji", a) * 2.0, "y")
    plan = tl.compile(g, backend="numpy")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3)).astype(np.float32).T  # a transposed view: not C-contiguous
    np.testing.assert_allclose(plan(a=x)["y"], x.T * 2.0, rtol=1e-6)
    np.testing.assert_allclose(plan(a=np.ascontiguousarray(x))["y"], x.T * 2.0, rtol=1e-6)
    with pytest.raises(tl.InputError, match="dtype"):
        plan(a=np.ascontiguousarray(x, dtype=np.float64))
    with pytest.raises(tl.InputError, match="shape"):
        plan(a=np.ones((4, 3), np.float32))


def test_compile_leaves_the_garbage_collector_as_it_was():
    import gc

    g = tl.EinsumGraph()
    g.output(g.exp(g.input("x", (4,))), "y")
    was = gc.isenabled()
    try:
        for state in (True, False):
            (gc.enable if state else gc.disable)()
            tl.compile(g, backend="numpy", cache=False)
            assert gc.isenabled() is state
        gc.enable()
        with pytest.raises(tl.TensorLogicError):
            tl.compile(g, backend="numpy", opt_level=9, cache=False)
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
