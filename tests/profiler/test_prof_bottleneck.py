"""Roofline classes and advice rules on planted cases, with injected peaks (no timing luck)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensorlogic as tl
from tensorlogic.errors import TensorLogicError
from tensorlogic.ir import ops
from tensorlogic.profiler import advice as advice_mod
from tensorlogic.profiler.bottleneck import ThreadInfo, roofline

from _prof_planted import (
    Copying,
    FusedNumpy,
    PlainEinsum,
    Stalling,
    chain_graph,
    chain_reference,
    fused_chain_graph,
    registered,
)

PEAKS = tl.Peaks(bandwidth=20e9, flops={"float32": 200e9, "float64": 100e9}, step_overhead=2e-6)
CALM = ThreadInfo(blas=1, numba=0, cores=2)


def _profile(plan, inputs, repeat=1, **kw):
    with tl.profile() as prof:
        for _ in range(repeat):
            out = plan(**inputs, **kw)
    return prof, out


def _rules(report):
    return {a.rule for a in report.advice}


def test_matmul_2000_is_compute_bound(rng):
    g = tl.EinsumGraph()
    a = g.input("a", shape=(2000, 2000), dtype="float32")
    b = g.input("b", shape=(2000, 2000), dtype="float32")
    g.output(g.einsum("ij,jk->ik", a, b), name="c")
    plan = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    A = rng.standard_normal((2000, 2000)).astype(np.float32)
    B = rng.standard_normal((2000, 2000)).astype(np.float32)
    prof, out = _profile(plan, {"a": A, "b": B})
    np.testing.assert_allclose(out["c"][:3, :3], A[:3] @ B[:, :3], rtol=1e-3, atol=1e-3)
    rep = prof.bottlenecks(PEAKS, threads=CALM)
    (s,) = rep.steps
    assert s.bound == "compute" and s.flops == 2 * 2000**3
    assert s.intensity == pytest.approx(2 * 2000**3 / (3 * 2000 * 2000 * 4))
    assert s.attainable_gflops == pytest.approx(200.0)
    assert s.gflops == pytest.approx(s.flops / s.seconds / 1e9)
    assert s.share_of_time == pytest.approx(1.0)


def test_add_16m_is_memory_bound(rng):
    n = 1 << 24
    g = tl.EinsumGraph()
    x = g.input("x", shape=(n,), dtype="float32")
    y = g.input("y", shape=(n,), dtype="float32")
    g.output(x + y, name="z")
    plan = tl.compile(g, backend="numpy", opt_level=0, cache=False)
    X = rng.random(n, dtype=np.float32) - 0.5
    Y = rng.random(n, dtype=np.float32) - 0.5
    prof, out = _profile(plan, {"x": X, "y": Y})
    np.testing.assert_array_equal(out["z"], X + Y)
    (s,) = prof.bottlenecks(PEAKS, threads=CALM).steps
    assert s.bound == "memory" and s.bytes == 3 * 4 * n
    assert s.roofline_seconds == pytest.approx(3 * 4 * n / 20e9)
    assert s.gbps == pytest.approx(s.bytes / s.seconds / 1e9)


def test_tiny_chain_is_overhead_bound_and_advised(rng):
    plan = tl.compile(chain_graph(16, 12), backend="numpy", opt_level=0, cache=False)
    x = rng.standard_normal(16).astype(np.float32)
    prof, out = _profile(plan, {"x": x}, repeat=5)
    np.testing.assert_allclose(out["y"], chain_reference(x, 12), rtol=1e-6, atol=1e-6)
    rep = prof.bottlenecks(PEAKS, threads=CALM)
    assert len(rep.steps) == 12 and {s.bound for s in rep.steps} == {"overhead"}
    assert all(s.calls == 5 for s in rep.steps)
    adv = next(a for a in rep.advice if a.rule == "overhead-bound")
    assert set(adv.nodes) == {s.name for s in plan.steps}
    assert "batch" in adv.message and "CUDA graph" not in adv.message
    assert rep.by_bound == {"overhead": pytest.approx(1.0)}


def test_unfused_chain_fires_at_o0_naming_the_nodes(rng):
    plan = tl.compile(chain_graph(1 << 16, 8), backend="numpy", opt_level=0, cache=False)
    prof, _ = _profile(plan, {"x": rng.standard_normal(1 << 16).astype(np.float32)}, repeat=3)
    rep = prof.bottlenecks(PEAKS, threads=CALM)
    (adv,) = [a for a in rep.advice if a.rule == "unfused-chain"]
    assert adv.nodes == tuple(s.name for s in plan.steps)
    assert "opt_level=2" in adv.message and "opt_level=0" in adv.message
    assert adv.share == pytest.approx(1.0)
    assert "[unfused-chain]" in str(rep)


def test_unfused_chain_silent_on_a_fused_plan(rng):
    n = 1 << 16
    x = rng.standard_normal(n).astype(np.float32)
    with registered(FusedNumpy) as be:
        plan = tl.compile(fused_chain_graph(n, 8), backend=be.name, opt_level=2, cache=False)
        assert [s.kind for s in plan.steps] == [ops.FUSED]
        prof, out = _profile(plan, {"x": x}, repeat=3)
        np.testing.assert_allclose(out["y"], chain_reference(x, 8), rtol=1e-6, atol=1e-6)
        rep = prof.bottlenecks(PEAKS, threads=CALM)
    assert "unfused-chain" not in _rules(rep)
    assert rep.steps[0].kind == ops.FUSED


def test_unfused_chain_at_o2_with_the_fusion_pass(rng):
    plan = tl.compile(chain_graph(1 << 16, 8), backend="numpy", opt_level=2, cache=False)
    if not any(s.kind == ops.FUSED for s in plan.steps):
        pytest.skip("the optimizer's fusion pass is not in this build")
    x = rng.standard_normal(1 << 16).astype(np.float32)
    prof, out = _profile(plan, {"x": x}, repeat=3)
    np.testing.assert_allclose(out["y"], chain_reference(x, 8), rtol=1e-6, atol=1e-6)
    assert "unfused-chain" not in _rules(prof.bottlenecks(PEAKS, threads=CALM))


def test_unfused_chain_message_when_already_at_o2(rng, monkeypatch):
    from tensorlogic.optimizer import base as opt

    monkeypatch.setitem(opt.PIPELINES, 2, [])  # an O2 pipeline that fuses nothing
    plan = tl.compile(chain_graph(1 << 14, 4), backend="numpy", opt_level=2, cache=False)
    prof, _ = _profile(plan, {"x": rng.standard_normal(1 << 14).astype(np.float32)})
    (adv,) = [a for a in prof.bottlenecks(PEAKS, threads=CALM).advice if a.rule == "unfused-chain"]
    assert "stayed unfused" in adv.message


def _bmm_graph(b, m, k, n):
    g = tl.EinsumGraph()
    x = g.input("x", shape=(b, m, k), dtype="float32")
    y = g.input("y", shape=(b, k, n), dtype="float32")
    g.output(g.einsum("bij,bjk->bik", x, y, name="bmm"), name="z")
    return g


def test_batched_contraction_run_as_plain_einsum(rng):
    x = rng.standard_normal((16, 64, 64)).astype(np.float32)
    y = rng.standard_normal((16, 64, 64)).astype(np.float32)
    peaks = tl.Peaks(bandwidth=50e9, flops={"float32": 1e12}, step_overhead=1e-6)
    with registered(PlainEinsum) as be:
        plan = tl.compile(_bmm_graph(16, 64, 64, 64), backend=be.name, opt_level=0, cache=False)
        prof, out = _profile(plan, {"x": x, "y": y}, repeat=3)
    np.testing.assert_allclose(out["z"], x @ y, rtol=1e-4, atol=1e-4)
    rep = prof.bottlenecks(peaks, threads=CALM)
    (adv,) = [a for a in rep.advice if a.rule == "batched-einsum"]
    assert adv.nodes == ("bmm",) and "batch b" in adv.message and "batched matmul" in adv.message
    # the same step is not reported twice as merely "below roofline"
    assert "below-roofline" not in _rules(rep)


def test_plain_einsum_without_batch_index_is_below_roofline(rng):
    g = tl.EinsumGraph()
    a = g.input("a", shape=(128, 128), dtype="float32")
    b = g.input("b", shape=(128, 128), dtype="float32")
    g.output(g.einsum("ij,jk->ik", a, b, name="mm"), name="c")
    peaks = tl.Peaks(bandwidth=200e9, flops={"float32": 1e12}, step_overhead=1e-6)
    A = rng.standard_normal((128, 128)).astype(np.float32)
    B = rng.standard_normal((128, 128)).astype(np.float32)
    with registered(PlainEinsum) as be:
        plan = tl.compile(g, backend=be.name, opt_level=0, cache=False)
        prof, out = _profile(plan, {"a": A, "b": B}, repeat=3)
    np.testing.assert_allclose(out["c"], A @ B, rtol=1e-4, atol=1e-4)
    rep = prof.bottlenecks(peaks, threads=CALM)
    assert "batched-einsum" not in _rules(rep)
    (adv,) = [a for a in rep.advice if a.rule == "below-roofline"]
    assert adv.nodes == ("mm",) and "compute-bound" in adv.message


def test_host_device_copies_dominating(rng):
    n = 1 << 22
    g = tl.EinsumGraph()
    x = g.input("x", shape=(n,), dtype="float32")
    g.output(g.sum(x, axis=0), name="s")
    X = rng.standard_normal(n).astype(np.float32)
    with registered(Copying) as be:
        plan = tl.compile(g, backend=be.name, opt_level=0, cache=False)
        prof, out = _profile(plan, {"x": X}, repeat=3, to_host=True)
        assert be.syncs == 3  # once before each device->host copy, not per step
    np.testing.assert_allclose(out["s"], X.sum(dtype=np.float64), rtol=1e-4)
    moves = [h for h in prof.host_events if h.category == "transfer"]
    assert {h.name for h in moves} == {"h2d x", "d2h s"} and len(moves) == 6
    assert next(h for h in moves if h.name == "h2d x").info["bytes"] == 4 * n
    rep = prof.bottlenecks(PEAKS, threads=CALM)
    (adv,) = [a for a in rep.advice if a.rule == "host-device-copies"]
    assert adv.nodes[0] == "h2d x" and rep.transfer_seconds > 0


def test_numpy_backend_reports_no_transfers(rng):
    plan = tl.compile(chain_graph(1024, 2), backend="numpy", opt_level=0, cache=False)
    prof, _ = _profile(plan, {"x": rng.standard_normal(1024).astype(np.float32)}, to_host=True)
    assert not [h for h in prof.host_events if h.category == "transfer"]
    assert "host-device-copies" not in _rules(prof.bottlenecks(PEAKS, threads=CALM))


def _mlp(rng):
    g = tl.EinsumGraph()
    x = g.input("x", shape=(64, 64), dtype="float32")
    w = g.constant(rng.standard_normal((64, 64)).astype(np.float32), name="w")
    g.output(g.relu(g.einsum("bi,ij->bj", x, w), name="act"), name="y")
    return g


def test_thread_pools_fighting(rng, monkeypatch):
    monkeypatch.setattr(advice_mod, "NUMBA_BACKENDS", {"tltest_stall"})
    x = rng.standard_normal((64, 64)).astype(np.float32)
    with registered(Stalling) as be:
        plan = tl.compile(_mlp(rng), backend=be.name, opt_level=0, cache=False)
        prof, _ = _profile(plan, {"x": x}, repeat=3)
    fighting = prof.bottlenecks(PEAKS, threads=ThreadInfo(blas=2, numba=2, cores=2))
    (adv,) = [a for a in fighting.advice if a.rule == "thread-pools"]
    assert adv.nodes == ("act",) and "threadpool_limits" in adv.message
    calm = prof.bottlenecks(PEAKS, threads=ThreadInfo(blas=1, numba=2, cores=2))
    assert "thread-pools" not in _rules(calm)


def test_report_data_text_and_json(rng):
    plan = tl.compile(_mlp(rng), backend="numpy", opt_level=0, cache=False)
    prof, _ = _profile(plan, {"x": rng.standard_normal((64, 64)).astype(np.float32)}, repeat=2)
    rep = prof.bottlenecks({"numpy": PEAKS}, threads=CALM)
    for s in rep.steps:
        assert s.name and s.seconds > 0 and s.bound in ("compute", "memory", "overhead")
        assert s.flops == plan.steps[s.index].flops and s.bytes == plan.steps[s.index].bytes
    text = str(rep)
    assert "Bottleneck report" in text and "% of roof" in text and "act" in text
    d = json.loads(json.dumps(rep.to_dict()))
    assert len(d["steps"]) == 2 and d["peaks"]["numpy"]["bandwidth"] == 20e9
    assert sum(s.share_of_time for s in rep.steps) == pytest.approx(1.0)


def test_bad_peaks_and_options_raise(rng):
    plan = tl.compile(chain_graph(8, 2), backend="numpy", opt_level=0, cache=False)
    prof, _ = _profile(plan, {"x": np.ones(8, np.float32)})
    with pytest.raises(TensorLogicError, match="pass peaks for every backend"):
        prof.bottlenecks({"cupy": PEAKS})
    with pytest.raises(TensorLogicError, match="must be a Peaks"):
        prof.bottlenecks(3.5)
    with pytest.raises(TensorLogicError, match="unknown advice rule"):
        prof.bottlenecks(PEAKS, rules=("magic",))
    with pytest.raises(TensorLogicError, match="unknown threshold"):
        prof.bottlenecks(PEAKS, chain_min_length=3)
    with pytest.raises(TensorLogicError, match="bandwidth > 0"):
        tl.Peaks(bandwidth=0, flops={"float32": 1.0}, step_overhead=0)
    with pytest.raises(TensorLogicError, match="positive FLOP/s"):
        tl.Peaks(bandwidth=1.0, flops={}, step_overhead=0)


@settings(max_examples=200, deadline=None)
@given(
    flops=st.integers(0, 10**13),
    nbytes=st.integers(0, 10**11),
    bw=st.floats(1e8, 1e13),
    pf=st.floats(1e8, 1e15),
    ovh=st.floats(0, 1e-4),
)
def test_roofline_properties(flops, nbytes, bw, pf, ovh):
    pk = tl.Peaks(bandwidth=bw, flops={"float32": pf}, step_overhead=ovh)
    r = roofline(flops, nbytes, "float32", pk)
    assert r.attainable <= pf * (1 + 1e-12)
    assert (r.bound == "overhead") == (max(flops / pf, nbytes / bw) < ovh)
    if r.bound == "compute":
        assert flops / pf >= nbytes / bw
    if r.bound == "memory":
        assert nbytes / bw > flops / pf
    # float64 falls back to the float32 roof when only float32 was measured
    assert roofline(flops, nbytes, "float64", pk) == r


def _interleaved_branches(n: int):
    """Two elementwise chains built alternately (a1, b1, a2, b2, ...) after a large matmul: the
    schedule interleaves them, and the matmul takes almost all the time."""
    g = tl.EinsumGraph()
    x = g.input("x", (n, n), "float32")
    m = g.einsum("ij,jk->ik", x, x)
    a, b = m * 2.0, m + 1.0
    a2, b2 = g.tanh(a), g.exp(b * 0.01)
    g.output(a2 - 1.0, name="ya")
    g.output(b2 * 3.0, name="yb")
    return g


def test_o0_chains_are_named_however_the_schedule_interleaves_them(rng):
    plan = tl.compile(_interleaved_branches(256), backend="numpy", opt_level=0, cache=False)
    x = rng.standard_normal((256, 256)).astype(np.float32)
    for _ in range(3):  # the same advice every time, whatever the timings
        prof, _ = _profile(plan, {"x": x})
        chains = [
            a for a in prof.bottlenecks(PEAKS, threads=CALM).advice if a.rule == "unfused-chain"
        ]
        named = sorted(tuple(sorted(a.nodes)) for a in chains)
        kinds = {s.name: s.kind for s in plan.steps}
        assert len(chains) == 2
        assert all(kinds[n] in (ops.UNARY, ops.BINARY) for c in named for n in c)
        assert sorted(len(c) for c in named) == [3, 4]
        assert all("opt_level=2" in a.message for a in chains)


def test_one_thread_step_is_named_with_the_thread_count(rng, monkeypatch):
    from tensorlogic.backends.numpy import fused as fused_numpy

    monkeypatch.setattr(fused_numpy, "PARALLEL_MIN_ELEMENTS", 1 << 30)  # every step on 1 thread
    g = tl.EinsumGraph()
    x = g.input("x", (512, 512), "float32")
    g.output(g.tanh(g.exp(x * 0.5) + 1.0), name="y")
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    assert all(s.threads == 1 for s in plan.steps)
    prof, _ = _profile(plan, {"x": rng.standard_normal((512, 512)).astype(np.float32)})
    fast = tl.Peaks(bandwidth=1e13, flops={"float32": 1e15}, step_overhead=1e-9)
    rep = prof.bottlenecks(fast, threads=ThreadInfo(blas=1, numba=0, cores=16))
    (adv,) = [a for a in rep.advice if a.rule == "one-thread"]
    assert "runs on 1 of 16 threads" in adv.message and adv.nodes == (plan.steps[0].name,)
    assert "below-roofline" not in _rules(rep)  # named once, by the rule that explains it


def test_one_thread_silent_when_the_step_uses_every_thread(rng, monkeypatch):
    from tensorlogic.backends.numpy import fused as fused_numpy, host_pool

    monkeypatch.setattr(fused_numpy, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(host_pool, "helper_count", lambda: 1)
    g = tl.EinsumGraph()
    x = g.input("x", (512, 512), "float32")
    g.output(g.tanh(g.exp(x * 0.5) + 1.0), name="y")
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    assert plan.steps[0].threads == 2
    prof, _ = _profile(plan, {"x": rng.standard_normal((512, 512)).astype(np.float32)})
    fast = tl.Peaks(bandwidth=1e13, flops={"float32": 1e15}, step_overhead=1e-9)
    rep = prof.bottlenecks(fast, threads=ThreadInfo(blas=1, numba=0, cores=2))
    assert "one-thread" not in _rules(rep)
