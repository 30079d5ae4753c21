"""Several GPUs: devices= in one process, and a Dask cluster with one worker per GPU
(needs at least two CUDA GPUs with CuPy; skipped otherwise)."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_models import mlp_graph

import tensorlogic as tl
from tensorlogic.pipeline import devices as tl_devices

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def two_gpus():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs at least two GPUs")


@pytest.fixture(scope="module")
def plans(two_gpus):
    g = mlp_graph(width=256, depth=3)
    return tl.compile(g, backend="cupy"), tl.compile(g, backend="numpy")


@pytest.mark.parametrize("devices", ["all", [1, 0], [1]])
def test_run_batched_on_devices_equals_host_reference(plans, rng, devices):
    plan, ref_plan = plans
    x = rng.standard_normal((3001, 256)).astype(np.float32)
    ref = ref_plan(x=x)
    got = tl.run_batched(plan, {"x": x}, 256, devices=devices, progress=False)
    for name in ("y", "s"):
        assert isinstance(got[name], np.ndarray)
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-3)


def test_each_device_runs_its_own_plan_copy(plans):
    plan, _ = plans
    import cupy

    copies = [tl_devices.device_plan(plan, d) for d in range(cupy.cuda.runtime.getDeviceCount())]
    assert copies[0] is plan or copies[0].backend.device_id == 0
    assert [c.backend.device_id for c in copies] == list(range(len(copies)))
    assert len({id(c.backend) for c in copies}) == len(copies)


def test_run_batches_keeps_order_and_takes_device_arrays(plans, rng):
    import cupy

    plan, ref_plan = plans
    x = rng.standard_normal((1200, 256)).astype(np.float32)
    batches = []
    for k, i in enumerate(range(0, 1200, 100)):
        piece = x[i : i + 100]
        if k % 3 == 1:
            with cupy.cuda.Device(k % 2):  # a CuPy array on either GPU
                piece = cupy.asarray(piece)
        batches.append({"x": piece})
    res = list(tl.run_batches(plan, batches, devices="all", progress=False))
    assert [r.index for r in res] == list(range(12))
    got = np.concatenate([r["y"] for r in res])
    np.testing.assert_allclose(got, ref_plan(x=x)["y"], rtol=1e-4, atol=1e-3)


def test_a_bad_batch_follows_on_error(plans, rng):
    plan, ref_plan = plans
    x = rng.standard_normal((300, 256)).astype(np.float32)
    nan = x[:10].copy()
    nan[3, 3] = np.inf
    batches = [{"x": x[:100]}, {"x": x[:10, :7]}, {"x": nan}, {"x": x[100:]}]
    res = list(
        tl.run_batches(
            plan, batches, devices="all", on_error="skip", check_finite=True, progress=False
        )
    )
    assert [r.ok for r in res] == [True, False, False, True]
    assert "batch 1" in str(res[1].error) and "batch 2" in str(res[2].error)
    np.testing.assert_allclose(res[3]["y"], ref_plan(x=x[100:])["y"], rtol=1e-4, atol=1e-3)
    with pytest.raises(tl.BatchError, match="batch 1"):
        list(tl.run_batches(plan, batches, devices="all", progress=False))


def test_dask_gpu_workers_compute_dask_array_chunks(plans, rng):
    distributed = pytest.importorskip("distributed")
    da = pytest.importorskip("dask.array")
    plan, ref_plan = plans
    x = rng.standard_normal((2048, 256)).astype(np.float32)
    with tl.local_cluster(gpus=2) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2, timeout=120)
        xd = client.persist(da.from_array(x, chunks=(256, 256)))
        out = tl.run_batched(plan, {"x": xd}, client=client, progress=False)
        y = client.persist(out["y"])
        distributed.wait(y)
        np.testing.assert_allclose(y.compute(), ref_plan(x=x)["y"], rtol=1e-4, atol=1e-3)
        cards = client.run(lambda: __import__("cupy").cuda.Device(0).pci_bus_id)
        assert len(set(cards.values())) == 2  # each worker computed on its own GPU
