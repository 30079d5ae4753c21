"""Batched inference: stream batches through a compiled plan on threads or a Dask cluster."""

from __future__ import annotations

from .batches import run_batched, run_batches
from .dask import local_cluster
from .lanetrace import trace_lanes
from .results import BatchError, BatchFailure, BatchOutput

__all__ = [
    "BatchError",
    "BatchFailure",
    "BatchOutput",
    "local_cluster",
    "run_batched",
    "run_batches",
    "trace_lanes",
]
