"""Preparing a batch before it runs: checks, and host-to-device staging on device backends.

Preparation runs on the loader thread, so it overlaps the computation of earlier batches. On a
device backend (CuPy) inputs are copied into pinned host memory and sent to the device with an
asynchronous copy on a second stream; the batch's run waits for that copy's event only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .. import dtypes
from ..errors import InputError


@dataclass
class Staged:
    """A prepared batch: its inputs (maybe on the device), output buffers, and a ready event."""

    inputs: dict[str, Any]
    out: dict[str, Any] | None = None
    event: Any = None
    keep: list = field(default_factory=list)  # pinned host buffers the copy still reads

    def wait(self) -> None:
        """Block until the inputs are usable (the host-to-device copy is done)."""
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        self.keep.clear()


def is_device_backend(backend: Any) -> bool:
    """True for a backend whose arrays live on an accelerator (``capabilities.device``)."""
    return backend.capabilities.device


def check_batch(batch: Any, check_finite: bool) -> dict[str, Any]:
    """The batch as a dict; with ``check_finite``, host arrays holding NaN/inf are rejected."""
    if not isinstance(batch, Mapping):
        raise InputError(f"expected a dict of input name -> array, got {type(batch).__name__}")
    inputs = dict(batch)
    if check_finite:
        for name, x in inputs.items():
            if isinstance(x, np.ndarray) and dtypes.is_float(x.dtype) and not np.isfinite(x).all():
                raise InputError(f"input {name!r} contains NaN or inf (check_finite=True)")
    return inputs


class HostStager:
    """Staging for host backends: nothing to move."""

    device = False

    def stage(self, inputs: dict[str, Any], out: dict[str, Any] | None) -> Staged:
        """Wrap the inputs; they are used where they are."""
        return Staged(inputs, out)

    def finish(self) -> None:
        """Nothing is in flight on a host backend."""


class DeviceStager:
    """Host-to-device copies through pinned memory on a dedicated stream (CuPy)."""

    device = True

    def __init__(self, backend: Any) -> None:
        import cupy

        self._cp = cupy
        self._backend = backend
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def _pinned(self, x: np.ndarray) -> tuple[np.ndarray, Any]:
        mem = self._cp.cuda.alloc_pinned_memory(max(x.nbytes, 1))
        buf = np.frombuffer(mem, dtype=x.dtype, count=x.size).reshape(x.shape)
        return buf, mem

    def stage(self, inputs: dict[str, Any], out: dict[str, Any] | None) -> Staged:
        """Start the copies of host inputs to the device; returns before they finish."""
        cp = self._cp
        dev: dict[str, Any] = {}
        keep: list = []
        with self.stream:
            for name, x in inputs.items():
                if not isinstance(x, np.ndarray):  # device arrays (or bad input) pass through
                    dev[name] = x
                    continue
                host, mem = self._pinned(x)
                np.copyto(host, x)  # pageable -> pinned on this thread, off the compute path
                d = cp.empty(x.shape, x.dtype)
                d.set(host, stream=self.stream)
                dev[name] = d
                keep.append(mem)
            event = self.stream.record()
        return Staged(dev, out, event, keep)

    def finish(self) -> None:
        """Wait for the device: a batch's inputs may be freed (and their memory reused by the
        copy stream) only after the kernels reading them are done."""
        self._backend.synchronize()


def make_stager(backend: Any) -> HostStager | DeviceStager:
    """The stager that fits ``backend``."""
    return DeviceStager(backend) if is_device_backend(backend) else HostStager()


__all__ = [
    "DeviceStager",
    "HostStager",
    "Staged",
    "check_batch",
    "is_device_backend",
    "make_stager",
]
