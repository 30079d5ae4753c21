"""devices=: several devices in one process, on a host stand-in with three fake GPUs."""

from __future__ import annotations

import numpy as np
import pytest
from fake_devices import NAME, DevArray, FakeGpus, on_device, register
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_models import mlp_graph

import tensorlogic as tl
from tensorlogic.pipeline import devices as tl_devices
from tensorlogic.pipeline import schedule as tl_schedule
from tensorlogic.pipeline import trace_lanes

register()


@pytest.fixture(autouse=True)
def _reset():
    FakeGpus.delay = {}
    FakeGpus.runs.clear()
    yield
    FakeGpus.delay = {}


@pytest.fixture(scope="module")
def plan():
    return tl.compile(mlp_graph(), backend=NAME, opt_level=1)


@pytest.fixture(scope="module")
def ref_plan():
    return tl.compile(mlp_graph(), backend="numpy", opt_level=1)


def _close(got, ref):
    assert set(got) == set(ref)
    for name in ref:
        assert isinstance(got[name], np.ndarray) and not isinstance(got[name], DevArray)
        assert got[name].shape == ref[name].shape and got[name].dtype == ref[name].dtype
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 200),
    batch_size=st.integers(1, 64),
    devices=st.sampled_from(["all", [0], [2, 0], [1, 2], (0, 1, 2)]),
    seed=st.integers(0, 2**31),
)
def test_run_batched_on_devices_equals_big_call(plan, ref_plan, n, batch_size, devices, seed):
    x = np.random.default_rng(seed).standard_normal((n, 32)).astype(np.float32)
    got = tl.run_batched(plan, {"x": x}, batch_size, devices=devices, progress=False)
    _close(got, ref_plan(x=x))


def test_every_device_runs_its_own_plan_copy(plan, ref_plan, rng):
    x = rng.standard_normal((400, 32)).astype(np.float32)
    got = tl.run_batched(plan, {"x": x}, 10, devices="all", progress=False)
    _close(got, ref_plan(x=x))
    # the kernels check that their device is current; every device took batches
    assert set(FakeGpus.runs) == {0, 1, 2}
    copies = {d: tl_devices.device_plan(plan, d) for d in range(3)}
    assert copies[0] is plan  # the plan's own device runs the plan itself
    assert [copies[d].backend.device_id for d in range(3)] == [0, 1, 2]
    assert tl_devices.device_plan(plan, 1) is copies[1]  # made once, then kept


def test_a_slow_device_takes_fewer_batches(plan, ref_plan, rng):
    FakeGpus.delay = {0: 0.02}
    x = rng.standard_normal((240, 32)).astype(np.float32)
    got = tl.run_batched(plan, {"x": x}, 8, devices=[0, 1], progress=False)
    _close(got, ref_plan(x=x))
    # the slow device may take none at all when the fast one empties the queue first
    assert FakeGpus.runs[1] > 2 * FakeGpus.runs[0]


def test_batch_axis_not_first_and_shared_input(rng):
    g = tl.EinsumGraph()
    x = g.input("x", shape=(8, "B"))
    m = g.input("m", shape=(8, 4))
    g.output(g.einsum("ib,ij->jb", x, m), name="y")  # batch axis 1: placed by the caller
    g.output(g.relu(g.einsum("ib->b", x)), name="t")  # batch axis 0: written in place
    plan = tl.compile(g, backend=NAME, opt_level=1)
    ref = tl.compile(g, backend="numpy", opt_level=1)
    xs = rng.standard_normal((8, 77)).astype(np.float32)
    ms = rng.standard_normal((8, 4)).astype(np.float32)
    got = tl.run_batched(plan, {"x": xs, "m": ms}, 10, devices=[1, 2], progress=False)
    _close(got, ref(x=xs, m=ms))


@pytest.mark.parametrize("ordered", [True, False])
def test_run_batches_on_devices(plan, ref_plan, rng, ordered):
    x = rng.standard_normal((230, 32)).astype(np.float32)
    batches = [{"x": x[i : i + 20]} for i in range(0, 230, 20)]
    res = list(tl.run_batches(plan, batches, devices=[0, 1, 2], ordered=ordered, progress=False))
    if ordered:
        assert [r.index for r in res] == list(range(12))
    res = sorted(res, key=lambda r: r.index)
    ref = ref_plan(x=x)
    got = {name: np.concatenate([r[name] for r in res]) for name in ("y", "s")}
    _close(got, ref)


def test_device_arrays_are_used_in_place_or_moved(plan, ref_plan, rng):
    """An input already on the lane's device is used as it is; one on another device goes
    through the host."""
    x = rng.standard_normal((60, 32)).astype(np.float32)
    batches = [{"x": on_device(x[i : i + 20], i // 20)} for i in range(0, 60, 20)]
    res = list(tl.run_batches(plan, batches, devices=[0, 1], progress=False))
    got = {name: np.concatenate([r[name] for r in res]) for name in ("y", "s")}
    _close(got, ref_plan(x=x))


def test_bad_batches_follow_on_error(plan, ref_plan, rng):
    x = rng.standard_normal((30, 32)).astype(np.float32)
    nan = x[:5].copy()
    nan[0, 0] = np.nan
    batches = [{"x": x[:10]}, {"x": x[:10, :3]}, {"x": nan}, [1, 2], {"x": x[10:]}]
    res = list(
        tl.run_batches(
            plan, batches, devices="all", on_error="skip", check_finite=True, progress=False
        )
    )
    assert [r.index for r in res] == [0, 1, 2, 3, 4]
    assert [r.ok for r in res] == [True, False, False, False, True]
    assert "batch 1" in str(res[1].error) and "expected 32" in str(res[1].error)
    assert "batch 2" in str(res[2].error) and "NaN or inf" in str(res[2].error)
    assert "batch 3" in str(res[3].error)
    np.testing.assert_allclose(res[4]["y"], ref_plan(x=x[10:])["y"], rtol=1e-5, atol=1e-6)
    with pytest.raises(tl.BatchError, match="batch 1"):
        list(tl.run_batches(plan, batches, devices="all", progress=False))
    # the lanes are free again afterwards
    got = tl.run_batched(plan, {"x": x}, 7, devices="all", progress=False)
    _close(got, ref_plan(x=x))


def test_stopping_early_leaves_the_lanes_usable(plan, ref_plan, rng):
    x = rng.standard_normal((400, 32)).astype(np.float32)
    batches = ({"x": x[i : i + 4]} for i in range(0, 400, 4))
    for k, _ in enumerate(tl.run_batches(plan, batches, devices=[0, 1], progress=False)):
        if k == 3:
            break
    got = tl.run_batched(plan, {"x": x}, 64, devices=[0, 1], progress=False)
    _close(got, ref_plan(x=x))


@pytest.mark.parametrize(
    "devices, match",
    [
        ("some", "None, 'all' or a list"),
        (1, "list of device ids"),
        ([], "names no device"),
        ([0, 0], "twice"),
        ([3], "3 is not a device id.*has 3"),
        ([True], "not a device id"),
        ([0, 1.0], "not a device id"),
    ],
)
def test_bad_devices_are_named(plan, devices, match):
    x = np.ones((4, 32), np.float32)
    with pytest.raises(tl.InputError, match=match):
        tl.run_batched(plan, {"x": x}, 2, devices=devices, progress=False)
    with pytest.raises(tl.InputError, match=match):
        tl.run_batches(plan, [{"x": x}], devices=devices, progress=False)


def test_devices_need_a_device_backend_and_no_client(plan, ref_plan):
    x = np.ones((4, 32), np.float32)
    with pytest.raises(tl.InputError, match="runs on the host.*workers="):
        tl.run_batched(ref_plan, {"x": x}, 2, devices="all", progress=False)
    with pytest.raises(tl.InputError, match="not both"):
        tl.run_batches(plan, [{"x": x}], devices="all", client=object(), progress=False)


def test_one_device_by_default_runs_as_a_lane(plan, ref_plan, rng, monkeypatch):
    x = rng.standard_normal((300, 32)).astype(np.float32)
    lanes = []
    real = tl_devices.DevicesExecutor.__init__

    def spy(self, plan_, device_ids, check_finite):
        lanes.append(tuple(device_ids))
        real(self, plan_, device_ids, check_finite)

    monkeypatch.setattr(tl_devices.DevicesExecutor, "__init__", spy)
    got = tl.run_batched(plan, {"x": x}, 64, progress=False)
    _close(got, ref_plan(x=x))
    assert lanes == [(plan.backend.device_id,)] and set(FakeGpus.runs) == {0}
    # several workers keep the thread executor
    lanes.clear()
    _close(tl.run_batched(plan, {"x": x}, 64, workers=2, progress=False), ref_plan(x=x))
    assert lanes == []


@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(1, 150),
    batch_size=st.integers(1, 40),
    devices=st.sampled_from([[0], [2, 0], "all"]),
    seed=st.integers(0, 2**31),
)
def test_split_first_and_last_batches_give_the_same_result(
    plan, ref_plan, n, batch_size, devices, seed
):
    x = np.random.default_rng(seed).standard_normal((n, 32)).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tl_schedule, "SPLIT_MIN_BYTES", 0)  # cut every lane's ends, however small
        got = tl.run_batched(plan, {"x": x}, batch_size, devices=devices, progress=False)
    _close(got, ref_plan(x=x))


def test_split_batches_with_the_batch_axis_not_first(rng, monkeypatch):
    monkeypatch.setattr(tl_schedule, "SPLIT_MIN_BYTES", 0)
    test_batch_axis_not_first_and_shared_input(rng)


def test_trace_lanes_records_every_batch(plan, ref_plan, rng):
    x = rng.standard_normal((300, 32)).astype(np.float32)
    with trace_lanes() as trace:
        got = tl.run_batched(plan, {"x": x}, 20, devices=[0, 1], progress=False)
    _close(got, ref_plan(x=x))
    assert sorted(b.index for b in trace.batches) == list(range(15))
    for b in trace.batches:
        marks = [b.host[k] for k in ("take", "staged", "queued", "landing", "landed")]
        assert marks == sorted(marks) and marks[0] >= 0
    lanes = trace.lanes()
    assert set(lanes) <= {0, 1} and sum(r["batches"] for r in lanes.values()) == 15
    assert sum(r["items"] for r in lanes.values()) == 300
    assert all(r["last_landed_s"] >= r["first_take_s"] for r in lanes.values())
    assert "device" in trace.report()
    # outside the block nothing is recorded
    tl.run_batched(plan, {"x": x}, 20, devices=[0, 1], progress=False)
    assert len(trace.batches) == 15


def test_a_lane_that_breaks_fails_its_batches_instead_of_hanging(plan, ref_plan, rng, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("lane broke")

    x = rng.standard_normal((200, 32)).astype(np.float32)
    monkeypatch.setattr(tl_devices.lanetrace, "BatchTimes", broken)
    with trace_lanes(), pytest.raises(tl.BatchError, match="lane broke"):
        tl.run_batched(plan, {"x": x}, 10, devices=[0, 1], progress=False)
    with trace_lanes():  # with on_error="skip" every batch is reported, none waited on forever
        batches = [{"x": x[i : i + 10]} for i in range(0, 200, 10)]
        res = list(tl.run_batches(plan, batches, devices=[0, 1], on_error="skip", progress=False))
    assert len(res) == 20 and not any(r.ok for r in res)
    monkeypatch.undo()
    _close(tl.run_batched(plan, {"x": x}, 10, devices=[0, 1], progress=False), ref_plan(x=x))


def _compute_together(outputs):
    """Every output of one dask run, computed in one pass (each batch runs once)."""
    import dask

    values = dask.compute(*outputs.values(), scheduler="sync")
    return {name: np.asarray(v) for name, v in zip(outputs, values)}


def test_a_large_dask_chunk_on_a_gpu_worker_runs_as_a_lane(plan, ref_plan, rng, monkeypatch):
    da = pytest.importorskip("dask.array")
    from tensorlogic.pipeline import dask_arrays

    monkeypatch.setattr(tl_schedule, "SPLIT_MIN_BYTES", 256)  # these small chunks count as large
    x = rng.standard_normal((300, 32)).astype(np.float32)
    with trace_lanes() as trace:
        got = tl.run_batched(plan, {"x": da.from_array(x, chunks=100)})
        host = _compute_together(got)
    _close(host, ref_plan(x=x))
    # three chunks, each cut into LANE_PIECES sub-batches (the first and last cut again)
    assert len(trace.batches) >= 3 * dask_arrays.LANE_PIECES
    assert sum(b.n_items for b in trace.batches) == 300
    # a small chunk (or a host backend) keeps the plain call
    monkeypatch.setattr(tl_schedule, "SPLIT_MIN_BYTES", 1 << 30)
    with trace_lanes() as trace:
        got = tl.run_batched(plan, {"x": da.from_array(x, chunks=100)})
        host = _compute_together(got)
    _close(host, ref_plan(x=x))
    assert trace.batches == []
