"""Running batches on a Dask cluster.

The plan travels once, as data: the graph (``ir.serialize.dumps``) with the backend name, opt
level and options sits in one small task's result, which workers fetch when their first batch
needs it. Each worker process compiles the plan on first use and keeps it in ``_WORKER_PLANS``.
Batch inputs travel inside their task, so the scheduler can rerun a task on another worker when
its worker dies; a task that still fails because workers kept dying is resubmitted from the
client's copy up to ``retries`` times. The caller gets each batch's result once (the engine
keeps the order).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import uuid
import weakref
from concurrent.futures import CancelledError, Future
from typing import Any

import numpy as np

from ..errors import InputError
from .results import BatchFailure, BatchOutput, batch_error
from .staging import check_batch

_WORKER_PLANS: dict[str, Any] = {}
_WORKER_LOCK = threading.Lock()


_PAYLOADS: "weakref.WeakKeyDictionary[Any, tuple[str, dict[str, Any]]]" = (
    weakref.WeakKeyDictionary()
)


def plan_payload(plan: Any) -> tuple[str, dict[str, Any]]:
    """The plan as plain data (graph blob, backend, opt level, options) and its content key.

    Made once per plan (a plan's graph is its own copy and never changes): serializing and
    hashing the constants of a large model takes about a second. A plan with parameters is
    serialized with its current parameter values at every call (training changes them), so
    workers run the values the plan holds now.
    """
    if plan.parameters:
        return _make_payload(plan)
    with _WORKER_LOCK:
        hit = _PAYLOADS.get(plan)
    if hit is None:
        hit = _make_payload(plan)
        with _WORKER_LOCK:
            _PAYLOADS[plan] = hit
    return hit


def _make_payload(plan: Any) -> tuple[str, dict[str, Any]]:
    from ..ir.serialize import dumps

    options = dict(plan.options.given)  # what the caller passed; workers fill the defaults
    try:
        json.dumps(options)
    except TypeError as exc:
        raise InputError(
            f"plan options {sorted(options)} must be plain data to ship to Dask workers ({exc})"
        ) from exc
    blob = dumps(plan.graph_with_parameters() if plan.parameters else plan.graph)
    meta = json.dumps([plan.backend.name, plan.opt_level, options], sort_keys=True)
    key = hashlib.sha256(blob + meta.encode()).hexdigest()[:32]
    payload = {
        "graph": blob,
        "backend": plan.backend.name,
        "opt_level": plan.opt_level,
        "options": options,
    }
    return key, payload


def worker_plan(key: str, payload: dict[str, Any]) -> Any:
    """The compiled plan for ``key`` in this process: compiled on first use, then cached."""
    plan = _WORKER_PLANS.get(key)
    if plan is None:
        with _WORKER_LOCK:
            plan = _WORKER_PLANS.get(key)
            if plan is None:
                from ..compiler.compile import compile as compile_graph
                from ..ir.serialize import loads

                plan = compile_graph(
                    loads(payload["graph"]),
                    backend=payload["backend"],
                    opt_level=payload["opt_level"],
                    **payload["options"],
                )
                _WORKER_PLANS[key] = plan
    return plan


def _hold(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


def _run_remote(
    key: str, payload: dict[str, Any], inputs: dict[str, Any], check_finite: bool
) -> dict[str, Any]:
    plan = worker_plan(key, payload)
    return plan(inputs, check_finite=check_finite, to_host=True)


def _worker_lost(exc: BaseException) -> bool:
    """True for failures that come from a lost worker rather than from the batch itself."""
    from distributed.scheduler import KilledWorker

    try:
        from distributed.comm.core import CommClosedError
    except ImportError:  # pragma: no cover - older layouts
        CommClosedError = OSError
    return isinstance(exc, (KilledWorker, CommClosedError, CancelledError))


class DaskExecutor:
    """Submits batches to a ``dask.distributed.Client``; results come back as futures."""

    def __init__(
        self, client: Any, plan: Any, *, check_finite: bool = False, retries: int = 3
    ) -> None:
        import dask  # noqa: F401 - checked here so a missing extra fails at the call
        from distributed import Client

        if not isinstance(client, Client):
            raise InputError(
                f"client must be a dask.distributed.Client, got {type(client).__name__}"
            )
        self.client = client
        self.plan = plan
        self.check_finite = check_finite
        self.retries = retries
        self.key, self._payload = plan_payload(plan)
        self._payload_future: Any = None
        self._run_id = uuid.uuid4().hex[:12]
        self._pending: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._closed = False

    def window(self, prefetch: int) -> int:
        """Every worker thread busy plus ``prefetch`` batches queued per worker."""
        nthreads = self.client.nthreads()
        return max(1, sum(nthreads.values())) + prefetch * max(1, len(nthreads))

    def _payload_ref(self) -> Any:
        if self._payload_future is None:
            self._payload_future = self.client.submit(
                _hold, self._payload, key=f"tensorlogic-plan-{self.key}-{self._run_id}"
            )
        return self._payload_future

    def submit(self, index: int, batch: Any, n_items: int) -> Future:
        """Send batch ``index`` to the cluster."""
        fut: Future = Future()
        try:
            inputs = check_batch(getattr(batch, "inputs", batch), self.check_finite)
            if not hasattr(batch, "inputs"):
                # a rerun resends the inputs later: keep them safe from a source that refills
                # one buffer for every batch (run_batched's slices are ours and stay as they are)
                inputs = {
                    k: v.copy() if isinstance(v, np.ndarray) else v for k, v in inputs.items()
                }
        except Exception as exc:  # noqa: BLE001 - reported as this batch's failure
            fut.set_result(BatchFailure(index, batch_error(index, exc), n_items))
            return fut
        self._send(fut, index, inputs, n_items, attempt=0)
        return fut

    def _send(self, fut: Future, index: int, inputs: dict, n_items: int, attempt: int) -> None:
        import dask

        with self._lock:
            if self._closed:
                fut.cancel()
                return
            # the inputs ride inside the task, so the scheduler can rerun it on another worker
            # when its worker dies (scattered data would die with the worker); a batch is sent
            # once per attempt, so dask's warning about large graphs does not apply
            with dask.config.set({"distributed.admin.large-graph-warning-threshold": "1TB"}):
                dfut = self.client.submit(
                    _run_remote,
                    self.key,
                    self._payload_ref(),
                    inputs,
                    self.check_finite,
                    key=f"tensorlogic-batch-{self._run_id}-{index}-{attempt}",
                    pure=False,
                )
            self._pending[index] = dfut

        def done(d: Any) -> None:
            with self._lock:
                if self._pending.get(index) is d:
                    del self._pending[index]
                closed = self._closed
            if closed:
                return
            try:
                if d.status == "finished":
                    fut.set_result(BatchOutput(d.result(), index, n_items))
                    return
                exc = d.exception() if d.status == "error" else CancelledError()
            except Exception as e:  # noqa: BLE001 - fetching the result failed
                exc = e
            if _worker_lost(exc) and attempt < self.retries:
                self._send(fut, index, inputs, n_items, attempt + 1)
            else:
                fut.set_result(BatchFailure(index, batch_error(index, exc), n_items))

        dfut.add_done_callback(done)

    def close(self) -> None:
        """Cancel batches still on the cluster and let go of the plan's data."""
        with self._lock:
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
        if pending:
            with contextlib.suppress(Exception):  # the cluster may already be gone
                self.client.cancel(pending)
        self._payload_future = None


def local_cluster(
    gpus: int = 0, *, n_workers: int | None = None, threads_per_worker: int = 1
) -> Any:
    """A new Dask cluster of worker processes on this machine (use it as a context manager).

    With ``gpus=N`` it has one worker per GPU, ids 0 to N-1, each started with
    CUDA_VISIBLE_DEVICES set to its own card and one thread, so each worker's device backend
    runs on a different GPU. With ``gpus=0`` it has ``n_workers`` processes (default: one per
    core) of ``threads_per_worker`` threads. The workers are new processes that import the
    calling script, so start the cluster under ``if __name__ == "__main__":``.
    """
    for name, value, low in (("gpus", gpus, 0), ("threads_per_worker", threads_per_worker, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(f"local_cluster: {name} must be an int >= {low}, got {value!r}")
    if n_workers is not None and (
        isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1
    ):
        raise InputError(f"local_cluster: n_workers must be an int >= 1, got {n_workers!r}")
    if gpus and n_workers is not None and n_workers != gpus:
        raise InputError(
            f"local_cluster: with gpus={gpus} the cluster has one worker per GPU; "
            f"n_workers={n_workers} disagrees (leave it out)"
        )
    from distributed import LocalCluster, Nanny, Scheduler, SpecCluster

    if gpus == 0:
        return LocalCluster(
            n_workers=n_workers, threads_per_worker=threads_per_worker, dashboard_address=":0"
        )
    workers = {
        f"gpu-{i}": {
            "cls": Nanny,
            "options": {"nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": str(i)}},
        }
        for i in range(gpus)
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0"}}
    return SpecCluster(workers=workers, scheduler=scheduler)


def device_count(backend: Any) -> int:
    """Number of GPUs a device backend can see (0 for host backends)."""
    from .staging import is_device_backend

    if not is_device_backend(backend):
        return 0
    return int(backend.device_count()) if backend.capabilities.multi_device else 1


__all__ = ["DaskExecutor", "device_count", "local_cluster", "plan_payload", "worker_plan"]
