"""Recording: step, call, host and counter events; threads; results unchanged; table."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.runtime import hooks
from tensorlogic.errors import TensorLogicError

from _prof_planted import Events, chain_graph, chain_reference, registered


def mlp_graph(b: int = 32, i: int = 48, j: int = 24) -> tuple[tl.EinsumGraph, np.ndarray]:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((i, j)).astype(np.float32)
    g = tl.EinsumGraph()
    x = g.input("x", shape=(b, i), dtype="float32")
    h = g.einsum("bi,ij->bj", x, g.constant(w, name="w"))
    g.output(g.relu(h * 2.0 + 1.0), name="y")
    return g, w


def test_records_every_step_and_matches_unprofiled(rng):
    g, w = mlp_graph()
    plan = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    x = rng.standard_normal((32, 48)).astype(np.float32)
    want = plan(x=x)["y"]
    with tl.profile() as prof:
        outs = [plan(x=x)["y"] for _ in range(3)]
    for got in outs:
        np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(want, np.maximum((x @ w) * 2 + 1, 0), rtol=1e-5, atol=1e-5)
    n = len(plan.steps)
    assert len(prof.steps) == 3 * n and len(prof.calls) == 3
    assert [e.name for e in prof.steps[:n]] == [s.name for s in plan.steps]
    for e in prof.steps:
        s = plan.steps[e.index]
        assert (e.kind, e.label, e.flops, e.bytes, e.dtype, e.backend) == (
            s.kind,
            s.label,
            s.flops,
            s.bytes,
            s.dtype,
            "numpy",
        )
        assert e.dur_ns >= 0
    for c in prof.calls:
        mine = [e for e in prof.steps if e.call == c.call]
        assert mine[0].start_ns >= c.start_ns
        assert mine[-1].start_ns + mine[-1].dur_ns <= c.start_ns + c.dur_ns
        # steps follow each other without gaps or overlaps
        for a, b in zip(mine, mine[1:]):
            assert a.start_ns + a.dur_ns == b.start_ns
    assert hooks.active() is None  # the profiler is gone after the with block


def test_compile_events_and_counters():
    g, _ = mlp_graph(8, 8, 8)
    tl.clear_cache()
    with tl.profile() as prof:
        plan = tl.compile(g, backend="numpy", opt_level=1)
        tl.compile(g, backend="numpy", opt_level=1)
        plan(x=np.ones((8, 8), np.float32))
    names = [(h.category, h.name) for h in prof.host_events]
    assert ("cache", "plan cache miss") in names and ("cache", "plan cache hit") in names
    assert ("compile", "build plan") in names
    assert any(cat == "codegen" for cat, _ in names)
    pool = [c for c in prof.counters if c.name == "pool bytes"]
    assert pool and pool[-1].values["plan 0"] == plan.concrete.pool.bytes_held


def test_threads_get_their_own_tracks(rng):
    g = chain_graph(64, 6)
    plan = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    xs = [rng.standard_normal(64).astype(np.float32) for _ in range(3)]
    results: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(3)

    def work(k: int) -> None:
        barrier.wait()
        for _ in range(20):
            results[k] = plan(x=xs[k])["y"]

    with tl.profile() as prof:
        threads = [threading.Thread(target=work, args=(k,), name=f"worker-{k}") for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for k in range(3):
        np.testing.assert_allclose(results[k], chain_reference(xs[k], 6), rtol=1e-6, atol=1e-6)
    names = {t.thread for t in prof.tracks}
    assert {"worker-0", "worker-1", "worker-2"} <= names
    assert len(prof.calls) == 60 and len(prof.steps) == 60 * 6
    for tr in prof.tracks:
        mine = sorted((e for e in prof.steps if e.track == tr), key=lambda e: e.start_ns)
        for a, b in zip(mine, mine[1:]):
            assert a.start_ns + a.dur_ns <= b.start_ns


def test_failed_call_keeps_completed_steps():
    g = tl.EinsumGraph()
    x = g.input("x", shape=(4,), dtype="float32")
    g.output(g.exp(x) + 1.0, name="y")
    plan = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    cp = plan.concrete

    def boom(args, out):
        raise RuntimeError("kernel failed")

    k0, ins, o = cp.program[1]
    cp.program[1] = (boom, ins, o)
    try:
        with tl.profile() as prof:
            with pytest.raises(RuntimeError, match="kernel failed"):
                plan(x=np.ones(4, np.float32))
    finally:
        cp.program[1] = (k0, ins, o)
    assert [e.index for e in prof.steps] == [0]
    assert len(prof.calls) == 1 and prof.calls[0].steps == 1


def test_device_events_time_steps_without_per_step_sync(rng):
    with registered(Events) as be:
        plan = tl.compile(chain_graph(256, 5), backend=be.name, opt_level=0, cache=False)
        x = rng.standard_normal(256).astype(np.float32)
        with tl.profile() as prof:
            for _ in range(4):
                y = plan(x=x)["y"]
            syncs_while_running = be.syncs
        np.testing.assert_allclose(y, chain_reference(x, 5), rtol=1e-6, atol=1e-6)
        assert syncs_while_running == 0  # no synchronization inside the calls
        assert be.syncs == 1  # one, when the profile resolves its events
        assert be.events == 4 * 6
        dev = {e.track for e in prof.steps}
        assert len(dev) == 1 and next(iter(dev)).process == "tltest_events device"
        assert all(c.device_ns is not None for c in prof.calls)
        mem = [c for c in prof.counters if c.name == "device memory"]
        assert mem and mem[0].values == {"tltest_events in use": 4096.0}


def test_profile_cannot_start_twice_and_nesting_records_innermost():
    g = chain_graph(8, 2)
    plan = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    outer = tl.profile()
    with outer:
        with pytest.raises(TensorLogicError, match="already recording"):
            outer.start()
        with tl.profile() as inner:
            plan(x=np.ones(8, np.float32))
        plan(x=np.ones(8, np.float32))
    assert len(inner.calls) == 1 and len(outer.calls) == 1


def test_table_groups_sorts_and_limits(rng):
    plan = tl.compile(chain_graph(128, 8), backend="numpy", opt_level=0, cache=False)
    with tl.profile() as prof:
        for _ in range(5):
            plan(x=rng.standard_normal(128).astype(np.float32))
    text = prof.table()
    for col in ("Name", "Calls", "Total", "Mean", "% total", "GFLOP/s", "GB/s"):
        assert col in text
    assert "relu_5" in text and "Self time total" in text
    rows = prof.key_averages()
    assert len(rows) == 8 and all(r.calls == 5 for r in rows)
    by_op = prof.key_averages(group_by="op")
    assert {r.key for r in by_op} == {"binary:mul", "binary:add", "unary:relu", "binary:sub"}
    assert sum(r.calls for r in by_op) == 40
    limited = prof.table(sort_by="name", row_limit=3)
    assert "5 more rows not shown" in limited
    body = [ln for ln in limited.splitlines() if ln.startswith(("add", "mul", "relu", "sub"))]
    assert body == sorted(body)
    with pytest.raises(TensorLogicError, match="sort_by"):
        prof.table(sort_by="speed")
    with pytest.raises(TensorLogicError, match="group_by"):
        prof.table(group_by="thread")
    with pytest.raises(TensorLogicError, match="row_limit"):
        prof.table(row_limit=0)


def test_empty_profile_is_usable(tmp_path):
    with tl.profile() as prof:
        pass
    assert prof.steps == [] and "no steps" in prof.table()
    prof.export_chrome_trace(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"] == []


def test_to_dict_is_json(rng):
    plan = tl.compile(chain_graph(32, 3), backend="numpy", opt_level=0, cache=False)
    with tl.profile() as prof:
        plan(x=rng.standard_normal(32).astype(np.float32))
    d = json.loads(json.dumps(prof.to_dict()))
    assert len(d["steps"]) == 3 and d["plans"][0]["backend"] == "numpy"
    assert {"name", "kind", "start_ns", "dur_ns", "flops", "bytes", "track"} <= set(d["steps"][0])
    assert d["calls"][0]["steps"] == 3


def test_optimizer_passes_are_recorded(monkeypatch):
    from tensorlogic.optimizer import base as opt

    class Identity:
        name = "tltest_identity"

        def __call__(self, graph):
            return opt.PassResult(graph, False, {})

    monkeypatch.setitem(opt.PASSES, "tltest_identity", lambda options: Identity())
    monkeypatch.setitem(opt.PIPELINES, 1, [*opt.PIPELINES[1], "tltest_identity"])
    g = chain_graph(8, 2)
    with tl.profile() as prof:
        tl.compile(g, backend="numpy", opt_level=1, cache=False)
    passes = [h for h in prof.host_events if h.category == "optimizer"]
    assert [h.name for h in passes][-1] == "tltest_identity"
    build = next(h for h in prof.host_events if h.name == "build plan")
    # the pass ran inside the plan build: its span nests in the build span
    assert build.start_ns <= passes[-1].start_ns
    assert passes[-1].start_ns + passes[-1].dur_ns <= build.start_ns + build.dur_ns


def test_counters_reported_through_hooks():
    hooks.counter("ignored", 1.0)  # no profiler: nothing to record, nothing fails
    with tl.profile() as prof:
        hooks.counter("kernel cache entries", 3)
    (c,) = [c for c in prof.counters if c.name == "kernel cache entries"]
    assert c.values == {"kernel cache entries": 3.0} and c.t_ns >= 0
