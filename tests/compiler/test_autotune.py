"""O3 autotuning: the candidates tried, the winner kept, the disk cache, the budget.

An injected timer (``autotune_timer``) makes every decision deterministic."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.compiler import autotune
from tensorlogic.errors import GraphError


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TL_BACKEND", raising=False)
    return tmp_path


def _graph():
    rng = np.random.default_rng(0)
    g = tl.EinsumGraph()
    x = g.input("x", (16, 24), "float32")
    w = g.constant(rng.standard_normal((24, 24)).astype(np.float32) / 5, name="w")
    v = g.constant(rng.standard_normal((24, 8)).astype(np.float32) / 5, name="v")
    h = g.einsum("bi,ij->bj", x, w)
    y = g.softmax(g.einsum("bj,jk->bk", g.tanh(h * 0.5 + 1.0), v), axis=-1)
    g.output(y, name="y")
    return g, rng.standard_normal((16, 24)).astype(np.float32)


# budgets large enough that only the injected times decide, whatever the machine's speed
BIG = {"autotune_budget": 1e9}


def _timer(times: dict[str, float], calls: list[str] | None = None, default: float = 1.0):
    def timer(label, run):
        run()  # the candidate really runs
        if calls is not None:
            calls.append(label)
        return times.get(label, default)

    return timer


def test_the_fastest_candidate_wins_and_print_says_so():
    g, xv = _graph()
    times = {"numpy O2 without fusion threads=pool": 0.2, "numpy O2 threads=pool": 0.5}
    calls: list[str] = []
    plan = tl.compile(
        g, backend="numpy", opt_level=3, cache=False, **BIG, autotune_timer=_timer(times, calls)
    )
    # coordinate search: O2, each pass left out, the thread modes on the best structure
    assert calls == [
        "numpy O2 threads=pool",
        "numpy O2 without merge threads=pool",
        "numpy O2 without fusion threads=pool",
        "numpy O2 without fusion threads=blas",
    ]
    assert plan.concrete.autotune.winner == "numpy O2 without fusion threads=pool"
    assert not any(s.kind == "fused" for s in plan.steps)  # the unfused plan is the one kept
    text = str(plan)
    assert "autotune: tried 4 candidate(s)" in text
    assert "numpy O2 without fusion threads=pool: 200.000 ms  <- won" in text
    ref = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    np.testing.assert_allclose(plan(x=xv)["y"], ref(x=xv)["y"], rtol=1e-5, atol=1e-7)


def test_thread_mode_and_backend_are_tuned_for_auto():
    g, xv = _graph()
    times = {"numba O2 threads=blas": 0.3, "numpy O2 threads=blas": 0.1}
    calls: list[str] = []
    plan = tl.compile(
        g, backend="auto", opt_level=3, cache=False, **BIG, autotune_timer=_timer(times, calls)
    )
    assert plan.concrete.autotune.winner == "numpy O2 threads=blas"
    assert calls[-1] == "numpy O2 threads=blas"  # the backend is tried with the best settings
    assert plan.concrete.backend.name == "numpy"
    assert "threads: pool" not in str(plan)
    np.testing.assert_allclose(
        plan(x=xv)["y"],
        tl.compile(g, backend="numpy", cache=False)(x=xv)["y"],
        rtol=1e-5,
        atol=1e-7,
    )


def test_explicit_choices_are_not_tuned():
    g, _ = _graph()
    calls: list[str] = []
    tl.compile(
        g,
        backend="numba",
        opt_level=3,
        cache=False,
        threads="blas",
        skip_passes=["merge"],
        **BIG,
        autotune_timer=_timer({}, calls),
    )
    assert calls == ["numba O2 without merge", "numba O2 without merge+fusion"]


def test_a_zero_budget_keeps_the_o2_plan():
    g, _ = _graph()
    calls: list[str] = []
    plan = tl.compile(
        g,
        backend="numpy",
        opt_level=3,
        cache=False,
        autotune_budget=0,
        autotune_timer=_timer({}, calls),
    )
    assert calls == ["numpy O2 threads=pool"]
    assert "left untried" in str(plan)


def test_the_decision_is_cached_on_disk_for_the_next_process(own_cache):
    g, xv = _graph()
    times = {"numpy O2 without merge threads=pool": 0.1}
    first = tl.compile(
        g, backend="numpy", opt_level=3, cache=False, **BIG, autotune_timer=_timer(times)
    )
    assert list((own_cache / "autotune").glob("*.json"))

    def never(label, run):
        raise AssertionError("a cached decision must not be timed again")

    tl.clear_cache()
    second = tl.compile(g, backend="numpy", opt_level=3, cache=False, autotune_timer=never, **BIG)
    rep = second.concrete.autotune
    assert rep.cached and rep.winner == "numpy O2 without merge threads=pool"
    assert "decision read from the disk cache" in str(second)
    np.testing.assert_array_equal(first(x=xv)["y"], second(x=xv)["y"])


def test_cache_off_searches_again():
    g, _ = _graph()
    tl.compile(g, backend="numpy", opt_level=3, cache=False, **BIG, autotune_timer=_timer({}))
    calls: list[str] = []
    tl.compile(
        g,
        backend="numpy",
        opt_level=3,
        cache=False,
        autotune_cache=False,
        **BIG,
        autotune_timer=_timer({}, calls),
    )
    assert calls  # timed again


def test_a_corrupt_cache_entry_is_ignored(own_cache):
    g, _ = _graph()
    tl.compile(g, backend="numpy", opt_level=3, cache=False, **BIG, autotune_timer=_timer({}))
    for f in (own_cache / "autotune").glob("*.json"):
        f.write_text("{not json")
    calls: list[str] = []
    tl.compile(
        g, backend="numpy", opt_level=3, cache=False, **BIG, autotune_timer=_timer({}, calls)
    )
    assert calls


def test_symbolic_graphs_are_tuned_per_binding():
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 8), "float32")
    w = g.constant(np.eye(8, dtype=np.float32), name="w")
    g.output(g.relu(g.einsum("bi,ij->bj", x, w) + 1.0), name="y")
    calls: list[str] = []
    plan = tl.compile(
        g, backend="numpy", opt_level=3, cache=False, **BIG, autotune_timer=_timer({}, calls)
    )
    assert calls == []  # nothing to tune before the sizes are known
    xv = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    np.testing.assert_allclose(plan(x=xv)["y"], np.maximum(xv + 1.0, 0), rtol=1e-6)
    assert calls and plan.concrete.autotune is not None


def test_the_real_timer_measures():
    assert autotune.measure(lambda: sum(range(100)), 0.01) > 0


@pytest.mark.parametrize(
    "opts,match",
    [
        ({"autotune_budget": -1}, "autotune_budget"),
        ({"autotune_budget": "10"}, "autotune_budget"),
        ({"autotune_timer": 3}, "autotune_timer"),
        ({"skip_passes": ["nope"]}, "skip_passes"),
        ({"skip_passes": 5}, "skip_passes"),
    ],
)
def test_bad_tuning_options(opts, match):
    g, _ = _graph()
    with pytest.raises(GraphError, match=match):
        tl.compile(g, backend="numpy", opt_level=3, cache=False, **opts)


def test_small_attention_is_tried_fused_and_written_out():
    # "auto" leaves attention with small scores written out at O2; O3 times both forms
    rng = np.random.default_rng(1)
    g = tl.EinsumGraph()
    q, k, v = (g.input(n, (2, 16, 8), "float32") for n in "qkv")
    p = g.softmax(g.einsum("bqd,bkd->bqk", q, k) * 0.3, axis=-1)
    g.output(g.einsum("bqk,bkd->bqd", p, v), name="y")
    o2 = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    assert not any(s.kind == "attention" for s in o2.steps)
    calls: list[str] = []
    times = {"numpy O2 threads=pool": 0.1}
    plan = tl.compile(
        g, backend="numpy", opt_level=3, cache=False, **BIG, autotune_timer=_timer(times, calls)
    )
    assert "numpy O2 threads=pool" in calls and "numpy O2 without attention threads=pool" in calls
    assert any(s.kind == "attention" for s in plan.steps)  # the fused candidate won here
    feed = {n: rng.standard_normal((2, 16, 8)).astype(np.float32) for n in "qkv"}
    np.testing.assert_allclose(plan(**feed)["y"], o2(**feed)["y"], rtol=1e-5, atol=1e-6)
