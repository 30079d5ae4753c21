"""Chrome trace export: schema, units, metadata, counters, strict nesting per track."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.errors import TensorLogicError
from tensorlogic.profiler.trace import _nest

from _prof_planted import Events, chain_graph, registered


def _profile(rng, threads: int = 2):
    g = tl.EinsumGraph()
    x = g.input("x", shape=(16, 24), dtype="float32")
    w = g.constant(rng.standard_normal((24, 8)).astype(np.float32), name="w")
    g.output(g.tanh(g.einsum("bi,ij->bj", x, w)) * 0.5, name="y")
    tl.clear_cache()
    xs = rng.standard_normal((16, 24)).astype(np.float32)

    def work() -> None:
        for _ in range(5):
            plan(x=xs)

    with tl.profile() as prof:
        plan = tl.compile(g, backend="numpy", opt_level=1)
        ts = [threading.Thread(target=work) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    return prof


def check_trace(doc: dict) -> None:
    """Assert the Chrome Trace Event rules this exporter promises."""
    assert set(doc) >= {"traceEvents", "displayTimeUnit"}
    evs = doc["traceEvents"]
    named_procs = {e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    named_threads = {
        (e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"
    }
    spans: dict[tuple, list[tuple[int, int]]] = {}
    for e in evs:
        assert e["ph"] in ("X", "M", "C"), e
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert isinstance(
                e["args"]["name" if e["name"].endswith("_name") else "sort_index"], (str, int)
            )
        elif e["ph"] == "X":
            assert isinstance(e["tid"], int) and isinstance(e["cat"], str)
            assert isinstance(e["ts"], float | int) and isinstance(e["dur"], float | int)
            assert e["ts"] >= 0 and e["dur"] >= 0
            assert e["pid"] in named_procs and (e["pid"], e["tid"]) in named_threads
            # microseconds with nanosecond resolution: compare as integer nanoseconds
            start = round(e["ts"] * 1000)
            end = start + round(e["dur"] * 1000)
            spans.setdefault((e["pid"], e["tid"]), []).append((start, end))
        else:
            assert e["pid"] in named_procs and isinstance(e["ts"], float | int)
            assert e["args"] and all(isinstance(v, float | int) for v in e["args"].values())
    for track, items in spans.items():
        items.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        stack: list[int] = []
        for start, end in items:
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"overlap on track {track}: {start}-{end}"
            stack.append(end)


def test_trace_round_trip_and_schema(tmp_path, rng):
    prof = _profile(rng)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        doc = json.load(f)
    check_trace(doc)
    evs = doc["traceEvents"]
    steps = [
        e
        for e in evs
        if e["ph"] == "X"
        and e["cat"] not in ("call", "cache", "compile", "codegen", "optimizer", "transfer")
    ]
    assert len(steps) == len(prof.steps) == 2 * 5 * 3
    assert {e["name"] for e in steps} == {s.name for s in prof.plans[0].steps}
    # units: microseconds
    by_key = {(e["args"]["call"], e["args"]["step"]): e for e in steps}
    for s in prof.steps:
        e = by_key[(s.call, s.index)]
        assert abs(e["dur"] - s.dur_ns / 1000) < 1e-3
        assert abs(e["ts"] - s.start_ns / 1000) < 1e-3
        assert e["args"]["flops"] == s.flops and e["args"]["bytes"] == s.bytes
        assert e["args"]["op"] == s.label and e["args"]["shape"] == list(s.shape)
    calls = [e for e in evs if e["ph"] == "X" and e["cat"] == "call"]
    assert len(calls) == 10
    threads = {e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert len(threads) >= 2  # two worker threads (plus the main thread that compiled)
    assert any(e["ph"] == "C" and e["name"] == "pool bytes" for e in evs)
    assert any(e["ph"] == "X" and e["cat"] == "compile" and e["name"] == "build plan" for e in evs)
    assert doc["otherData"]["generator"].startswith("tensorlogic")
    assert prof.chrome_trace()["traceEvents"] == evs


def test_device_track_is_named_and_nested(rng):
    with registered(Events) as be:
        plan = tl.compile(chain_graph(64, 4), backend=be.name, opt_level=0, cache=False)
        with tl.profile() as prof:
            for _ in range(3):
                plan(x=rng.standard_normal(64).astype(np.float32))
    doc = json.loads(json.dumps(prof.chrome_trace()))
    check_trace(doc)
    procs = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert "tltest_events device" in procs and any(p.startswith("host") for p in procs)
    calls = [e for e in doc["traceEvents"] if e.get("cat") == "call"]
    assert all("device_us" in c["args"] for c in calls)


def test_nest_clips_crossing_spans():
    spans = [(0, 100, {"n": "parent"}), (50, 80, {"n": "crosses"}), (100, 10, {"n": "after"})]
    out = _nest(spans)
    got = {ev["n"]: (s, d) for s, d, ev in out}
    assert got["crosses"] == (50, 50) and got["after"] == (100, 10)


def test_export_to_bad_path_raises(tmp_path, rng):
    prof = _profile(rng, threads=1)
    with pytest.raises(TensorLogicError, match="cannot write the trace"):
        prof.export_chrome_trace(tmp_path / "missing-dir" / "t.json")


@pytest.mark.gpu
def test_cupy_steps_are_timed_with_cuda_events(rng):
    n = 1 << 20
    plan = tl.compile(chain_graph(n, 6), backend="cupy", opt_level=0, cache=False)
    x = rng.standard_normal(n).astype(np.float32)
    plan(x=x)  # warm-up: kernels loaded, pool filled
    with tl.profile() as prof:
        for _ in range(3):
            y = plan(x=x, to_host=True)["y"]
    from _prof_planted import chain_reference

    np.testing.assert_allclose(y, chain_reference(x, 6), rtol=1e-5, atol=1e-5)
    assert len(prof.steps) == 3 * len(plan.steps)
    assert {e.track.process for e in prof.steps} == {"cupy device"}
    assert all(c.device_ns is not None and c.device_ns > 0 for c in prof.calls)
    assert {h.name for h in prof.host_events if h.category == "transfer"} == {"h2d x", "d2h y"}
    check_trace(json.loads(json.dumps(prof.chrome_trace())))
