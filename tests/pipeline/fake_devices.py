"""A stand-in for a backend with several GPUs, on the host: the numpy backend's kernels, with
"devices" that are thread-local marks, so the multi-device lanes run without a GPU.

Every kernel checks that its own device is current on the thread that runs it (as a GPU's
loaded kernels only run in their device's context), "device arrays" carry the device they live
on, and a device can be made slower to check that the faster one takes more batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import Counter
from typing import ClassVar

import numpy as np

import tensorlogic as tl
from tensorlogic.backends.base import as_prepared
from tensorlogic.backends.numpy.backend import NumpyBackend

NAME = "fake_gpus"
_current = threading.local()


def current_device() -> int:
    """The device made current on this thread by ``use_device`` (0 outside one, as in CUDA)."""
    return getattr(_current, "device", 0)


class DevArray(np.ndarray):
    """A host array that stands for memory on device ``device``."""

    device: int = -1


def on_device(x: np.ndarray, device: int) -> DevArray:
    arr = np.array(x).view(DevArray)
    arr.device = device
    return arr


class FakeGpus(NumpyBackend):
    """``count`` fake devices; ``delay[d]`` seconds are added to each kernel run on device d."""

    name = NAME
    # the numpy backend's compile options (threads) are registered for "numpy" by name
    capabilities = dataclasses.replace(
        NumpyBackend.capabilities, multi_device=True, options=frozenset()
    )
    count = 3
    delay: ClassVar[dict[int, float]] = {}
    runs: ClassVar[Counter] = Counter()  # kernel runs per device
    instances: ClassVar[dict[int, FakeGpus]] = {}

    def __init__(self, device_id: int = 0) -> None:
        self.device_id = device_id

    def device_count(self) -> int:
        return FakeGpus.count

    def on_device(self, device_id: int) -> FakeGpus:
        return FakeGpus.instances.setdefault(device_id, FakeGpus(device_id))

    @contextlib.contextmanager
    def use_device(self):
        before = current_device()
        _current.device = self.device_id
        try:
            yield
        finally:
            _current.device = before

    def transfers(self) -> FakeTransfers:
        assert current_device() == self.device_id
        return FakeTransfers(self.device_id)

    def prepare(self, step, node, in_nodes, graph):
        kernel = as_prepared(super().prepare(step, node, in_nodes, graph), NAME)
        dev = self.device_id

        def run(inputs, out):
            assert current_device() == dev, f"kernel of device {dev} ran on {current_device()}"
            FakeGpus.runs[dev] += 1
            if FakeGpus.delay.get(dev):
                time.sleep(FakeGpus.delay[dev])
            return kernel(inputs, out)

        return dataclasses.replace(kernel, fn=run)


class FakeTransfers:
    """Copies made at once; the interface of backends/cupy/transfers.py."""

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id

    def new_ticket(self) -> dict:
        return {"host": {}}

    def is_device_array(self, x) -> bool:
        return isinstance(x, DevArray)

    def on_this_device(self, x) -> bool:
        return isinstance(x, DevArray) and x.device == self.device_id

    def upload(self, inputs, ticket):
        return {name: on_device(x, self.device_id) for name, x in inputs.items()}

    @contextlib.contextmanager
    def computing(self, ticket=None):
        assert current_device() == self.device_id
        yield

    def download(self, outputs, ticket):
        ticket["host"] = {name: np.asarray(a).copy() for name, a in outputs.items()}

    def abandon(self, ticket):
        ticket["host"] = {}

    def finish(self, ticket, dest):
        results = {}
        for name, host in ticket["host"].items():
            target = dest.get(name) if dest else None
            if target is None:
                target = np.empty(host.shape, host.dtype)
            np.copyto(target, host)
            results[name] = target
        return results


def register() -> None:
    """Register the stand-in (once per process; a fresh device-0 instance each time)."""
    FakeGpus.instances.clear()
    tl.register_backend(NAME, lambda: FakeGpus.instances.setdefault(0, FakeGpus(0)), replace=True)
