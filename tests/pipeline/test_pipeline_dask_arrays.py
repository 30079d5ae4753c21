"""run_batched on dask arrays: chunk-wise on the workers, dask arrays (or a zarr store) out."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_models import mlp_graph

import tensorlogic as tl

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")
zarr = pytest.importorskip("zarr")


@pytest.fixture(scope="module")
def plan():
    return tl.compile(mlp_graph(), backend="numpy", opt_level=2)


@pytest.fixture(scope="module")
def process_client():
    """Two worker processes, one thread each (the layout of a GPU cluster). Work stealing is
    off so that where a task runs is the scheduler's placement, which the tests check."""
    import dask

    with (
        dask.config.set({"distributed.scheduler.work-stealing": False}),
        tl.local_cluster(n_workers=2) as cluster,
        distributed.Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=60)
        yield client


def _close(got, ref):
    for name in ref:
        np.testing.assert_allclose(np.asarray(got[name]), ref[name], rtol=1e-5, atol=1e-6)


def test_no_client_runs_on_the_local_scheduler(plan, rng):
    x = rng.standard_normal((230, 32)).astype(np.float32)
    out = tl.run_batched(plan, {"x": da.from_array(x, chunks=(40, 32))}, progress=False)
    assert all(isinstance(v, da.Array) for v in out.values())
    assert out["y"].chunks == ((40,) * 5 + (30,), (32,))  # the input's chunks are the batches
    assert out["s"].chunks == ((40,) * 5 + (30,),)
    _close(dict(zip(out, da.compute(*out.values()))), plan(x=x))
    out = tl.run_batched(plan, {"x": da.from_array(x, chunks=(40, 8))}, 64, progress=False)
    assert out["y"].chunks == ((64, 64, 64, 38), (32,))  # rechunked to batch_size
    _close({k: v.compute() for k, v in out.items()}, plan(x=x))


def test_chunks_computed_and_persisted_on_the_workers(plan, process_client, rng):
    client = process_client
    x = rng.standard_normal((8 * 8192, 32)).astype(np.float32)
    xd = client.persist(da.from_array(x, chunks=(8192, 32)))
    distributed.wait(xd)
    out = tl.run_batched(plan, {"x": xd}, client=client, progress=False)
    # a first run teaches the scheduler how long a batch takes (it guesses 0.5 s before, and
    # with that guess it spreads tasks to balance the load rather than staying with the data)
    distributed.wait(client.persist(out["s"]))
    y = client.persist(out["y"])
    distributed.wait(y)
    # the plan was shipped once to every worker
    from tensorlogic.pipeline.dask import plan_payload

    key = plan_payload(plan)[0]
    held = client.run(
        lambda: sorted(
            __import__("tensorlogic.pipeline.dask_plugin", fromlist=["PAYLOADS"]).PAYLOADS
        )
    )
    assert [key in keys for keys in held.values()] == [True, True]
    # every output chunk stays on the worker that holds its input chunk
    where_x = client.who_has(xd)
    where_y = client.who_has(y)
    xkeys = sorted(k for k in where_x if isinstance(k, tuple))
    ykeys = sorted(k for k in where_y if isinstance(k, tuple))
    assert len(xkeys) == len(ykeys) == 8
    assert len({w for k in xkeys for w in where_x[k]}) == 2  # the input is spread over both
    same = sum(set(where_x[kx]) == set(where_y[ky]) for kx, ky in zip(xkeys, ykeys))
    assert same == 8
    np.testing.assert_allclose(y.compute(), plan(x=x)["y"], rtol=1e-5, atol=1e-6)
    # a second call finds the plan already on the workers
    out2 = tl.run_batched(plan, {"x": xd}, client=client, progress=False)
    np.testing.assert_allclose(out2["s"].compute(), plan(x=x)["s"], rtol=1e-5, atol=1e-6)


def test_zarr_in_zarr_out(plan, process_client, rng, tmp_path):
    x = rng.standard_normal((300, 32)).astype(np.float32)
    src = str(tmp_path / "in.zarr")
    da.to_zarr(da.from_array(x, chunks=(64, 32)), src)
    xd = da.from_zarr(src)
    dest = str(tmp_path / "out.zarr")
    out = tl.run_batched(plan, {"x": xd}, client=process_client, store=dest, progress=False)
    assert set(out) == {"y", "s"}
    _close({k: v.compute() for k, v in out.items()}, plan(x=x))
    stored = zarr.open_group(dest, mode="r")
    np.testing.assert_allclose(stored["y"][:], plan(x=x)["y"], rtol=1e-5, atol=1e-6)


def test_npy_stack_and_mixed_inputs(rng, tmp_path):
    """An npy stack as the batched input (batch axis 1) and a numpy input without the batch
    dimension; outputs with the batch axis first and last."""
    g = tl.EinsumGraph()
    xn = g.input("x", shape=(8, "B"))
    mn = g.input("m", shape=(8, 4))
    g.output(g.einsum("ib,ij->jb", xn, mn), name="y")
    g.output(g.relu(g.einsum("ib->b", xn)), name="t")
    plan = tl.compile(g, backend="numpy")
    x = rng.standard_normal((8, 77)).astype(np.float32)
    m = rng.standard_normal((8, 4)).astype(np.float32)
    da.to_npy_stack(str(tmp_path / "stack"), da.from_array(x, chunks=(8, 20)), axis=1)
    xd = da.from_npy_stack(str(tmp_path / "stack"))
    out = tl.run_batched(plan, {"x": xd, "m": m}, progress=False)
    assert out["y"].chunks == ((4,), (20, 20, 20, 17))
    _close({k: v.compute() for k, v in out.items()}, plan(x=x, m=m))


def test_bad_inputs_fail_before_any_task(plan, rng):
    x = da.from_array(rng.standard_normal((20, 32)).astype(np.float32), chunks=10)
    with pytest.raises(tl.InputError, match="dtype float64"):
        tl.run_batched(plan, {"x": x.astype(np.float64)}, progress=False)
    with pytest.raises(tl.InputError, match="dimension 1: expected 32"):
        tl.run_batched(plan, {"x": x[:, :5]}, progress=False)
    with pytest.raises(tl.InputError, match="unknown sizes"):
        tl.run_batched(plan, {"x": x[x[:, 0] > 0]}, progress=False)
    with pytest.raises(tl.InputError, match="unknown input"):
        tl.run_batched(plan, {"x": x, "z": x}, progress=False)
    with pytest.raises(tl.InputError, match="devices="):
        tl.run_batched(plan, {"x": x}, devices="all", progress=False)
    with pytest.raises(tl.InputError, match="dask.distributed.Client"):
        tl.run_batched(plan, {"x": x}, client=object(), progress=False)
    with pytest.raises(tl.InputError, match="store="):
        tl.run_batched(plan, {"x": x.compute()}, 5, store="out.zarr", progress=False)
    with pytest.raises(tl.InputError, match="batch_size"):
        tl.run_batched(plan, {"x": x}, 0, progress=False)


def test_bad_values_fail_their_task(plan, rng):
    x = rng.standard_normal((20, 32)).astype(np.float32)
    x[13, 2] = np.nan
    out = tl.run_batched(
        plan, {"x": da.from_array(x, chunks=10)}, check_finite=True, progress=False
    )
    np.testing.assert_allclose(out["y"][:10].compute(), plan(x=x[:10])["y"], rtol=1e-5)
    with pytest.raises(tl.InputError, match="NaN or inf"):
        out["y"].compute()


def test_local_cluster_checks_its_arguments():
    with pytest.raises(tl.InputError, match="gpus must be an int"):
        tl.local_cluster(gpus=-1)
    with pytest.raises(tl.InputError, match="n_workers=3 disagrees"):
        tl.local_cluster(gpus=2, n_workers=3)
    with pytest.raises(tl.InputError, match="threads_per_worker"):
        tl.local_cluster(threads_per_worker=0)


def _slow(block):
    import time

    time.sleep(0.2)
    return block


def test_a_killed_worker_loses_no_batch(plan, rng):
    """SIGKILL one of two worker processes mid-run: its chunks and batches are recomputed
    (the restarted worker gets the plan from its plugin) and the result is complete."""
    import os
    import signal
    import time

    x = rng.standard_normal((16 * 64, 32)).astype(np.float32)
    with tl.local_cluster(n_workers=2) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        xd = da.from_array(x, chunks=(64, 32)).map_blocks(_slow)
        out = tl.run_batched(plan, {"x": xd}, client=client, progress=False)
        y = client.persist(out["y"])
        time.sleep(0.6)  # a few batches done on each worker
        pids = client.run(os.getpid)
        victim = pids[sorted(pids)[0]]
        os.kill(victim, signal.SIGKILL)
        distributed.wait(y, timeout=120)
        np.testing.assert_allclose(y.compute(), plan(x=x)["y"], rtol=1e-5, atol=1e-6)
        with pytest.raises(ProcessLookupError):
            os.kill(victim, 0)
