"""Several GPUs in one process: one lane per device, fed from one queue of batches.

A lane is a thread that owns one device for the life of the process: its plan copy (kernels are
loaded per device), its streams and pinned staging (the backend's ``transfers()``). Batches wait
in one queue and the first lane that has room takes the next one, so a faster or less busy
device simply takes more. A lane keeps ``DEPTH`` batches in flight: while batch k computes, it
copies batch k-1's outputs out (into the caller's arrays where given) and stages batch k+1 or
k+2. ``pipeline/lanetrace.py`` records where a run's time goes, per lane.

A backend offers several devices by declaring ``capabilities.multi_device`` and implementing
``device_count()``, ``on_device(i)`` (its instance for device i), ``use_device()`` (a context
making that device current) and ``transfers()`` (backends/base.py).
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import InputError
from . import lanetrace
from .results import BatchFailure, BatchOutput, batch_error
from .staging import Staged, check_batch

# batches a lane has in flight: one computing, the others staged or being copied out. With 2,
# a lane stages batch k+1 only after batch k-1 has landed, so a hiccup in the host copies
# (page faults in the caller's fresh output arrays) leaves the device idle; a third batch of
# slack absorbs it (bench_pipeline.py on two H100s: same median, slowest of 7 runs 100 ms
# with 3 against 147 ms with 2; RESULTS.md)
DEPTH = 3
_STOP = object()


def multi_device(backend: Any) -> bool:
    """True for a backend that can run on several devices."""
    return bool(backend.capabilities.multi_device)


def resolve_devices(backend: Any, devices: Any) -> tuple[int, ...] | None:
    """The device ids ``devices`` names (None, "all" or a list of ids) on ``backend``."""
    if devices is None:
        return None
    if not multi_device(backend):
        raise InputError(
            f"devices={devices!r} picks GPUs, but the plan's backend "
            f"{backend.name!r} runs on the host; use workers= for threads, or "
            "compile for a device backend (cupy)"
        )
    count = int(backend.device_count())
    if isinstance(devices, str):
        if devices != "all":
            raise InputError(
                f"devices must be None, 'all' or a list of device ids, got {devices!r}"
            )
        ids = tuple(range(count))
    elif isinstance(devices, (list, tuple, range)):
        ids = tuple(devices)
    else:
        raise InputError(
            f"devices must be None, 'all' or a list of device ids such as [0, 1], got {devices!r}"
        )
    if not ids:
        raise InputError(f"devices names no device; this machine has {count}")
    for d in ids:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 <= d < count:
            raise InputError(
                f"devices: {d!r} is not a device id; this machine has {count} "
                f"device(s), ids 0 to {count - 1}"
            )
    if len(set(ids)) != len(ids):
        raise InputError(f"devices lists a device twice: {list(ids)}")
    return tuple(int(d) for d in ids)


_COPIES: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()
_COPIES_LOCK = threading.Lock()


def device_plan(plan: Any, device_id: int) -> Any:
    """``plan`` on device ``device_id``: the plan itself on its own device, else a copy made once
    (its kernels are built on the lane's thread, with the device current)."""
    backend = plan.backend.on_device(device_id)
    if backend is plan.backend:
        return plan
    with _COPIES_LOCK:
        copies = _COPIES.setdefault(plan, {})
        copy = copies.get(device_id)
        if copy is None:
            with backend.use_device():
                copy = copies[device_id] = plan.on_backend(backend)
    return copy


class _Job:
    __slots__ = ("future", "index", "inputs", "n_items", "out", "times")

    def __init__(self, index: int, inputs: Any, out: Any, n_items: int) -> None:
        self.index, self.inputs, self.out, self.n_items = index, inputs, out, n_items
        self.future: Future = Future()
        self.times: lanetrace.BatchTimes | None = None

    def fail(self, exc: BaseException) -> None:
        self.future.set_result(BatchFailure(self.index, batch_error(self.index, exc), self.n_items))


class _Run:
    """One run's shared queue of batches and its plan copies, read by every lane."""

    def __init__(self, plans: dict[int, Any], check_finite: bool) -> None:
        self.plans = plans
        self.check_finite = check_finite
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.trace = lanetrace.active()

    def take(self, block: bool) -> Any:
        try:
            return self.jobs.get(block=block)
        except queue.Empty:
            return None


class Lane:
    """The thread that feeds one device; it serves one run at a time."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._thread = ThreadPoolExecutor(
            1, thread_name_prefix=f"tensorlogic-device-{backend.device_id}"
        )
        self._tx: Any = None

    def serve(self, run: _Run) -> None:
        """Take batches of ``run`` until its stop mark (after any earlier run on this lane)."""
        self._thread.submit(self._serve, run)

    def _serve(self, run: _Run) -> None:
        try:
            with self.backend.use_device():
                if self._tx is None:
                    self._tx = self.backend.transfers()
                self._clock(self._tx, run.trace)
                self._loop(self._tx, run.plans[self.backend.device_id], run)
        except BaseException as exc:  # noqa: BLE001 - a broken device fails its batches, never hangs
            while (job := run.take(block=True)) is not _STOP:
                if not job.future.done():
                    job.fail(exc)

    @staticmethod
    def _clock(tx: Any, trace: lanetrace.LaneTrace | None) -> None:
        # device event times on the trace's clock, where the transfers can record them
        start = getattr(tx, "start_clock", None)
        if start is not None:
            start(None if trace is None else trace.t0)

    def _loop(self, tx: Any, plan: Any, run: _Run) -> None:
        inflight: deque = deque()
        job: Any = None
        try:
            while True:
                # with batches in flight, finish the oldest rather than wait for a new one
                job = run.take(block=not inflight)
                if job is None:
                    self._finish(tx, *inflight.popleft(), run.trace)
                    continue
                if job is _STOP:
                    break
                if job.future.cancelled():
                    continue
                if run.trace is not None:
                    job.times = lanetrace.BatchTimes(self.backend.device_id, job.index, job.n_items)
                    job.times.host["take"] = run.trace.now()
                ticket = self._start(tx, plan, job, run.check_finite, run.trace)
                if ticket is not None:
                    inflight.append((job, ticket))
                if len(inflight) >= DEPTH:
                    self._finish(tx, *inflight.popleft(), run.trace)
            while inflight:
                self._finish(tx, *inflight.popleft(), run.trace)
        except BaseException as exc:
            # batches taken but not finished fail too: nothing waits on them forever
            for taken in [job, *(j for j, _ in inflight)]:
                if isinstance(taken, _Job) and not taken.future.done():
                    taken.fail(exc)
            raise

    @staticmethod
    def _start(tx: Any, plan: Any, job: _Job, check_finite: bool, trace: Any) -> Any:
        ticket = None
        try:
            inputs = check_batch(job.inputs, check_finite)
            host = {n: x for n, x in inputs.items() if isinstance(x, np.ndarray)}
            on_device = False
            for name, x in inputs.items():
                if tx.is_device_array(x) and not tx.on_this_device(x):
                    host[name] = plan.backend.to_host(x)  # another GPU's array: via the host
                elif tx.is_device_array(x):
                    on_device = True
            ticket = tx.new_ticket()
            dev = dict(inputs)
            dev.update(tx.upload(host, ticket))
            if trace is not None:
                job.times.host["staged"] = trace.now()
            with tx.computing(ticket):
                # host inputs were checked above; arrays already on the device are checked here
                outputs = plan(dev, check_finite=check_finite and on_device)
            tx.download(outputs, ticket)
            if trace is not None:
                job.times.host["queued"] = trace.now()
            return ticket
        except Exception as exc:  # noqa: BLE001 - reported as this batch's failure
            if ticket is not None:
                tx.abandon(ticket)
            job.fail(exc)
            return None

    @staticmethod
    def _finish(tx: Any, job: _Job, ticket: Any, trace: Any) -> None:
        try:
            if trace is not None:
                job.times.host["landing"] = trace.now()
            results = tx.finish(ticket, job.out)
        except Exception as exc:  # noqa: BLE001 - reported as this batch's failure
            tx.abandon(ticket)
            job.fail(exc)
            return
        if trace is not None:
            job.times.host["landed"] = trace.now()
            device_times = getattr(tx, "device_times", None)
            if device_times is not None:
                job.times.device_times.update(device_times(ticket))
            trace.add(job.times)
        job.future.set_result(BatchOutput(results, job.index, job.n_items))


_LANES: dict[tuple[str, int], Lane] = {}
_LANES_LOCK = threading.Lock()


def lane(backend: Any) -> Lane:
    """The process's lane for ``backend``'s device (made on first use, then kept)."""
    key = (backend.name, int(backend.device_id))
    with _LANES_LOCK:
        ln = _LANES.get(key)
        if ln is None:
            ln = _LANES[key] = Lane(backend)
    return ln


class DevicesExecutor:
    """Runs batches on several devices of this process (see the module docstring)."""

    def __init__(self, plan: Any, device_ids: Sequence[int], check_finite: bool) -> None:
        plans = {d: device_plan(plan, d) for d in device_ids}
        self._run = _Run(plans, check_finite)
        self._lanes = [lane(p.backend) for p in plans.values()]
        self._jobs: list[_Job] = []
        self._closed = False
        for ln in self._lanes:
            ln.serve(self._run)

    def window(self, prefetch: int) -> int:
        """Every lane's batches in flight plus ``prefetch`` waiting in the queue."""
        return len(self._lanes) * DEPTH + prefetch

    def submit(self, index: int, batch: Any, n_items: int) -> Future:
        """Queue batch ``index``; the first lane with room takes it."""
        if isinstance(batch, Staged):  # run_batched hands over slices with host output arrays
            job = _Job(index, batch.inputs, batch.out, n_items)
        else:
            job = _Job(index, batch, None, n_items)
        self._run.jobs.put(job)
        return job.future

    def close(self) -> None:
        """Drop batches no lane has taken; batches in flight finish in the background."""
        if self._closed:
            return
        self._closed = True
        while True:
            job = self._run.take(block=False)
            if job is None:
                break
            if job is not _STOP:
                job.future.cancel()
        for _ in self._lanes:
            self._run.jobs.put(_STOP)


__all__ = ["DEPTH", "DevicesExecutor", "device_plan", "multi_device", "resolve_devices"]
