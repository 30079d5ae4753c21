"""The worker plugin that hands a plan to every worker of a Dask cluster (needs distributed)."""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

PAYLOADS: dict[str, Any] = {}  # on a worker: plan payloads by content key


class PlanPlugin(WorkerPlugin):
    """One plan payload (pipeline/dask.py ``plan_payload``), installed once per worker, also on
    workers that join or restart later; the worker compiles it when a task first needs it."""

    idempotent = True  # registering the same plan again sends nothing to the workers

    def __init__(self, key: str, payload: dict[str, Any]) -> None:
        self.key = key
        self.payload = payload
        self.name = f"tensorlogic-plan-{key}"

    def setup(self, worker: Any) -> None:
        """Keep the payload in the worker process."""
        PAYLOADS[self.key] = self.payload


__all__ = ["PAYLOADS", "PlanPlugin"]
