"""The device path: pinned-memory staging on a second stream (needs a CUDA GPU with CuPy).

Runs on the project's CuPy backend and on a minimal stand-in (the numpy backend's xp-generic
kernels over CuPy arrays) that exercises the staging path independently of the GPU kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_models import mlp_graph

import tensorlogic as tl
from tensorlogic.backends import kernels
from tensorlogic.backends.base import Capabilities
from tensorlogic.backends.numpy.backend import NumpyBackend
from tensorlogic.pipeline.staging import DeviceStager, is_device_backend, make_stager

pytestmark = pytest.mark.gpu


class _CupyArrays(NumpyBackend):
    name = "cupy_pipeline_test"
    capabilities = Capabilities(device=True)

    def __init__(self) -> None:
        import cupy

        self.xp = cupy

    def prepare(self, step, node, in_nodes, graph):
        from tensorlogic.ir import ops

        if node.kind == ops.EINSUM:
            return kernels.einsum_kernel(self.xp, node, in_nodes)
        return kernels.make_kernel(self.xp, node, in_nodes, step.args.get("_is_output", False))

    def empty(self, shape, dtype):
        return self.xp.empty(shape, dtype)

    def alloc_bytes(self, n):
        return self.xp.empty(max(n, 1), self.xp.uint8)

    def view_bytes(self, raw, shape, dtype):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return raw[:n].view(dtype).reshape(shape)

    def copy(self, x, out=None):
        if out is None:
            return x.copy()
        out[...] = x
        return out

    def is_array(self, x):
        return isinstance(x, self.xp.ndarray)

    def check_input(self, x, name):
        if isinstance(x, self.xp.ndarray):
            return x
        return super().check_input(x, name)

    def to_device(self, x):
        return self.xp.asarray(x)

    def to_host(self, x):
        return self.xp.asnumpy(x)

    def all_finite(self, x):
        return bool(self.xp.isfinite(x).all())

    def synchronize(self):
        self.xp.cuda.Device().synchronize()

    def free_memory(self):
        return int(self.xp.cuda.runtime.memGetInfo()[0])


@pytest.fixture(scope="module", params=["stand-in", "cupy"])
def device_plan(request):
    """The plan on the stand-in CuPy backend, and on the project's GPU backend."""
    if request.param == "cupy":
        if "cupy" not in tl.backends.registered_backends():
            pytest.skip("the cupy backend is not registered")
        return tl.compile(mlp_graph(width=256, depth=3), backend="cupy")
    tl.register_backend(_CupyArrays.name, _CupyArrays, replace=True)
    # O1: the stand-in runs the generic kernels, which have no fused-node kernel
    return tl.compile(mlp_graph(width=256, depth=3), backend=_CupyArrays.name, opt_level=1)


def test_device_backend_gets_the_pinned_stager(device_plan):
    assert is_device_backend(device_plan.backend)
    assert isinstance(make_stager(device_plan.backend), DeviceStager)
    assert not is_device_backend(tl.get_backend("numpy"))


@pytest.mark.parametrize("workers", [1, 2])
def test_device_run_equals_host_reference(device_plan, rng, workers):
    import cupy

    x = rng.standard_normal((1000, 256)).astype(np.float32)
    ref = tl.compile(mlp_graph(width=256, depth=3), backend="numpy")(x=x)
    batches = [{"x": x[i : i + 128]} for i in range(0, 1000, 128)]
    res = list(tl.run_batches(device_plan, batches, workers=workers, progress=False))
    assert all(isinstance(r["y"], cupy.ndarray) for r in res)
    got = np.concatenate([cupy.asnumpy(r["y"]) for r in res])
    np.testing.assert_allclose(got, ref["y"], rtol=1e-4, atol=1e-4)
    full = tl.run_batched(device_plan, {"x": x}, 300, workers=workers, progress=False)
    assert isinstance(full["y"], np.ndarray)
    np.testing.assert_allclose(full["y"], ref["y"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(full["s"], ref["s"], rtol=1e-4, atol=1e-3)


def test_staged_copy_is_asynchronous_and_waits(device_plan, rng):
    import cupy

    stager = DeviceStager(device_plan.backend)
    x = rng.standard_normal((4096, 256)).astype(np.float32)
    staged = stager.stage({"x": x}, None)
    assert staged.event is not None and staged.keep
    staged.wait()
    assert staged.event is None and not staged.keep
    np.testing.assert_array_equal(cupy.asnumpy(staged.inputs["x"]), x)
