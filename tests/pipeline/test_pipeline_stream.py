"""run_batches: ordered and unordered runs equal one big call; skip/raise policies; windowing."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_models import mlp_graph

import tensorlogic as tl


@pytest.fixture(scope="module")
def plan():
    return tl.compile(mlp_graph(), backend="numpy", opt_level=2)


def _data(rng, n, width=32):
    return rng.standard_normal((n, width)).astype(np.float32)


def _split(x, sizes):
    out, lo = [], 0
    for s in sizes:
        out.append({"x": x[lo : lo + s]})
        lo += s
    return out


def _check_equal(plan, x, results, n_batches):
    ref = plan({"x": x})
    assert sorted(r.index for r in results) == list(range(n_batches))
    results = sorted(results, key=lambda r: r.index)
    for name in ("y", "s"):
        got = np.concatenate([r[name] for r in results])
        np.testing.assert_allclose(got, ref[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("workers,prefetch", [(1, 2), (3, 0), (2, 4)])
def test_runs_equal_one_big_call(plan, rng, ordered, workers, prefetch):
    x = _data(rng, 300)
    sizes = [64, 64, 64, 64, 44]
    res = list(
        tl.run_batches(
            plan,
            _split(x, sizes),
            workers=workers,
            prefetch=prefetch,
            ordered=ordered,
            progress=False,
        )
    )
    if ordered:
        assert [r.index for r in res] == list(range(len(sizes)))
    assert [r.n_items for r in sorted(res, key=lambda r: r.index)] == sizes
    assert all(isinstance(r, tl.BatchOutput) and r.ok for r in res)
    _check_equal(plan, x, res, len(sizes))


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    workers=st.integers(1, 3),
    prefetch=st.integers(0, 3),
    ordered=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_property_any_split_equals_big_call(plan, sizes, workers, prefetch, ordered, seed):
    x = _data(np.random.default_rng(seed), sum(sizes))
    # a generator source: no length, consumed once
    source = (b for b in _split(x, sizes))
    res = list(
        tl.run_batches(
            plan, source, workers=workers, prefetch=prefetch, ordered=ordered, progress=False
        )
    )
    _check_equal(plan, x, res, len(sizes))


def test_unordered_yields_finished_batches_first(plan, rng):
    """A huge first batch does not hold back the small ones behind it."""
    x = _data(rng, 20000)
    plan(x=x[:4])  # compile the small batch's plan first, so only the compute times differ
    batches = [{"x": x}] + [{"x": x[:4]} for _ in range(6)]
    res = list(tl.run_batches(plan, batches, workers=2, ordered=False, progress=False))
    assert sorted(r.index for r in res) == list(range(7))
    # the other worker finishes small batches while the huge one runs (strict "last" would
    # depend on how the loaded machine schedules the two workers)
    assert res[0].index != 0


def _bad_batches(rng):
    x = _data(rng, 40)
    nan = x[:8].copy()
    nan[3, 5] = np.nan
    return [{"x": x[:10]}, {"x": x[:10, :5]}, {"x": x[10:20]}, {"x": nan}, [x[:3]], {"x": x[20:40]}]


@pytest.mark.parametrize("ordered", [True, False])
def test_skip_policy_reports_bad_batches_and_goes_on(plan, rng, ordered):
    batches = _bad_batches(rng)
    res = list(
        tl.run_batches(
            plan, batches, on_error="skip", check_finite=True, ordered=ordered, progress=False
        )
    )
    by_index = {r.index: r for r in res}
    assert sorted(by_index) == list(range(6))
    failed = {i for i, r in by_index.items() if not r.ok}
    assert failed == {1, 3, 4}
    assert "batch 1" in str(by_index[1].error) and "dimension 1: expected 32" in str(
        by_index[1].error
    )
    assert "batch 3" in str(by_index[3].error) and "NaN" in str(by_index[3].error)
    assert "batch 4" in str(by_index[4].error) and "dict" in str(by_index[4].error)
    for i in failed:
        assert isinstance(by_index[i], tl.BatchFailure)
        assert isinstance(by_index[i].error, tl.BatchError) and by_index[i].error.index == i
    for i in (0, 2, 5):
        ref = plan(batches[i])
        np.testing.assert_allclose(by_index[i]["y"], ref["y"], rtol=1e-6)


def test_without_check_finite_nan_batch_runs(plan, rng):
    batches = _bad_batches(rng)
    res = list(tl.run_batches(plan, [batches[3]], progress=False))
    assert np.isnan(res[0]["y"][3]).all()


def test_raise_policy_names_the_batch_index(plan, rng):
    batches = _bad_batches(rng)
    seen = []
    with pytest.raises(tl.BatchError, match=r"^batch 1: input 'x'") as info:
        for r in tl.run_batches(plan, batches, progress=False):
            seen.append(r.index)
    assert seen == [0]
    assert info.value.index == 1 and isinstance(info.value.error, tl.InputError)
    assert isinstance(info.value, tl.TensorLogicError)


def test_source_error_names_the_batch_after_earlier_results(plan, rng):
    x = _data(rng, 30)

    def source():
        yield {"x": x[:10]}
        yield {"x": x[10:20]}
        raise OSError("disk gone")

    got = []
    with pytest.raises(tl.BatchError, match="batch 2: the batch source raised OSError: disk gone"):
        for r in tl.run_batches(plan, source(), progress=False):
            got.append(r.index)
    assert got == [0, 1]


def test_window_bounds_batches_taken_ahead(plan, rng):
    """With prefetch=2 and one worker, while the caller holds result 0 the loader has taken
    batches 1..3 (prepared and computed ahead) and no more."""
    x = _data(rng, 64)
    taken = []

    def source():
        for k in range(20):
            taken.append(k)
            yield {"x": x[k : k + 2]}

    it = tl.run_batches(plan, source(), prefetch=2, workers=1, progress=False)
    first = next(it)
    assert first.index == 0
    deadline = time.monotonic() + 5
    while len(taken) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(taken) == 4  # window (prefetch + workers = 3) plus the slot freed by result 0
    rest = list(it)
    assert [r.index for r in rest] == list(range(1, 20))


def test_closing_early_stops_the_loader(plan, rng):
    x = _data(rng, 8)
    before = set(threading.enumerate())

    def endless():
        while True:
            yield {"x": x}

    it = tl.run_batches(plan, endless(), progress=False)
    assert [next(it).index for _ in range(3)] == [0, 1, 2]
    it.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [
            t
            for t in threading.enumerate()
            if t.name == "tensorlogic-batch-loader" and t not in before
        ]
        if not alive:
            break
        time.sleep(0.02)
    assert not alive


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"prefetch": -1}, "prefetch must be an int >= 0"),
        ({"workers": 0}, "workers must be an int >= 1"),
        ({"on_error": "ignore"}, "on_error must be one of"),
    ],
)
def test_bad_arguments(plan, kwargs, match):
    with pytest.raises(tl.InputError, match=match):
        tl.run_batches(plan, [], **kwargs)


def test_bad_plan_and_source(plan):
    with pytest.raises(tl.GraphError, match="expected a CompiledPlan"):
        tl.run_batches(object(), [])
    with pytest.raises(tl.InputError, match="iterable of input dicts"):
        tl.run_batches(plan, {"x": np.ones((2, 32), np.float32)})


def test_empty_source(plan):
    assert list(tl.run_batches(plan, [], progress=False)) == []


def test_graph_without_symbols(rng):
    g = tl.EinsumGraph()
    x = g.input("x", shape=(5, 3))
    g.output(g.exp(x), name="y")
    p = tl.compile(g, backend="numpy")
    xs = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(4)]
    res = list(tl.run_batches(p, [{"x": a} for a in xs], progress=False))
    assert [r.n_items for r in res] == [5] * 4
    for r, a in zip(res, xs):
        np.testing.assert_allclose(r["y"], np.exp(a), rtol=1e-6)


def test_loading_overlaps_the_callers_work(plan, rng):
    """A source that takes 40 ms per batch (like reading a file) and a caller that takes 40 ms
    per result: pipelined, the two waits overlap instead of adding up."""
    x = _data(rng, 8)
    n, pause = 10, 0.04

    def slow_source():
        for _ in range(n):
            time.sleep(pause)
            yield {"x": x}

    t0 = time.perf_counter()
    for _ in tl.run_batches(plan, slow_source(), progress=False):
        time.sleep(pause)
    elapsed = time.perf_counter() - t0
    serial = 2 * n * pause
    assert elapsed < 0.8 * serial, f"{elapsed:.3f}s vs {serial:.3f}s one after the other"


def test_batch_error_survives_pickling():
    """Errors cross process boundaries (Dask workers) with their index and cause."""
    import pickle

    err = tl.BatchError("batch 3: bad", index=3, error=tl.InputError("bad"))
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, tl.BatchError) and back.index == 3 and str(back) == "batch 3: bad"
    assert isinstance(back.error, tl.InputError)
