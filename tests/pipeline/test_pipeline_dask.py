"""run_batches / run_batched on a Dask cluster: threads cluster, and a process cluster that
loses a worker mid-run."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from pipeline_models import mlp_graph

import tensorlogic as tl

distributed = pytest.importorskip("distributed")

from tensorlogic.pipeline import dask as tl_dask  # noqa: E402


@pytest.fixture(scope="module")
def plan():
    return tl.compile(mlp_graph(), backend="numpy", opt_level=2)


@pytest.fixture(scope="module")
def thread_client():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=2, processes=False, dashboard_address=":0"
    ) as cluster:
        with distributed.Client(cluster) as client:
            yield client


@pytest.mark.parametrize("ordered", [True, False])
def test_threads_cluster_equals_one_big_call(plan, thread_client, rng, ordered):
    x = rng.standard_normal((230, 32)).astype(np.float32)
    batches = [{"x": x[i : i + 20]} for i in range(0, 230, 20)]
    res = list(tl.run_batches(plan, batches, client=thread_client, ordered=ordered, progress=False))
    if ordered:
        assert [r.index for r in res] == list(range(12))
    res = sorted(res, key=lambda r: r.index)
    ref = plan(x=x)
    for name in ("y", "s"):
        np.testing.assert_allclose(
            np.concatenate([r[name] for r in res]), ref[name], rtol=1e-5, atol=1e-6
        )
    got = tl.run_batched(plan, {"x": x}, 32, client=thread_client, progress=False)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-6)


def test_remote_bad_batch_is_skipped_or_raised(plan, thread_client, rng):
    x = rng.standard_normal((30, 32)).astype(np.float32)
    nan = x[:5].copy()
    nan[0, 0] = np.inf
    batches = [{"x": x[:10]}, {"x": x[:10, :3]}, {"x": nan}, {"x": x[10:]}]
    res = list(
        tl.run_batches(
            plan, batches, client=thread_client, on_error="skip", check_finite=True, progress=False
        )
    )
    assert [r.ok for r in res] == [True, False, False, True]
    assert "batch 1" in str(res[1].error) and "expected 32" in str(res[1].error)
    assert "batch 2" in str(res[2].error) and "NaN or inf" in str(res[2].error)
    with pytest.raises(tl.BatchError, match="batch 1"):
        list(tl.run_batches(plan, batches, client=thread_client, progress=False))


def test_plan_travels_once_as_data_and_is_cached(plan):
    key, payload = tl_dask.plan_payload(plan)
    assert isinstance(payload["graph"], bytes) and payload["backend"] == "numpy"
    assert tl_dask.plan_payload(plan)[0] == key  # content key: same plan, same key
    tl_dask._WORKER_PLANS.pop(key, None)
    p1 = tl_dask.worker_plan(key, payload)
    assert tl_dask.worker_plan(key, payload) is p1
    x = np.random.default_rng(3).standard_normal((7, 32)).astype(np.float32)
    np.testing.assert_allclose(p1(x=x)["y"], plan(x=x)["y"], rtol=1e-6)


def test_client_must_be_a_dask_client(plan):
    with pytest.raises(tl.InputError, match="dask.distributed.Client"):
        tl.run_batches(plan, [], client=object())


def _killing_source(x, client, n_batches, state):
    """Batches of 8 items; after the first few, SIGKILL one worker process mid-run."""
    for k in range(n_batches):
        if k == 6 and not state.get("killed"):
            pids = client.run(os.getpid)
            busy = client.processing()  # kill the worker with the most batches in flight
            addr = max(sorted(pids), key=lambda a: len(busy.get(a, ())))
            pid = pids[addr]
            os.kill(pid, signal.SIGKILL)
            state["killed"] = (addr, pid)
        yield {"x": x[8 * k : 8 * (k + 1)]}


def test_process_cluster_survives_a_killed_worker(plan, rng):
    n_batches = 40
    x = rng.standard_normal((8 * n_batches, 32)).astype(np.float32)
    ref = plan(x=x)
    state: dict = {}
    t0 = time.monotonic()
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with distributed.Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            seen: dict[int, int] = {}
            results: list = []

            def consume() -> None:
                try:
                    for r in tl.run_batches(
                        plan,
                        _killing_source(x, client, n_batches, state),
                        client=client,
                        prefetch=3,
                        ordered=False,
                        progress=False,
                    ):
                        results.append(r)
                except BaseException as exc:  # noqa: BLE001 - checked below
                    results.append(exc)

            # bounded in time: the run happens on a thread the test waits for at most 120 s
            runner = threading.Thread(target=consume, daemon=True)
            runner.start()
            runner.join(timeout=120)
            assert not runner.is_alive(), f"run did not finish; {len(results)} results so far"
            for r in results:
                assert isinstance(r, tl.BatchOutput), r
                seen[r.index] = seen.get(r.index, 0) + 1
                np.testing.assert_allclose(
                    r["y"], ref["y"][8 * r.index : 8 * (r.index + 1)], rtol=1e-5, atol=1e-6
                )
            assert state.get("killed"), "the worker was never killed"
            _, pid = state["killed"]
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)  # really dead
    assert seen == {k: 1 for k in range(n_batches)}  # every batch exactly once
    assert time.monotonic() - t0 < 170


def test_local_cluster_gives_each_gpu_worker_its_own_device():
    """One worker per GPU, each seeing only its card (checked without GPUs: the environment)."""
    with tl.local_cluster(gpus=2) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
    assert sorted(seen.values()) == ["0", "1"]
    assert tl_dask.device_count(tl.get_backend("numpy")) == 0
