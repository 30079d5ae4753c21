"""Moved to ``tensorlogic.runtime.pool`` (the compiler, backends and profiler share it); this
name stays until the branches that import it from here are merged."""

from ..runtime.pool import Arena, TensorPool, host_bytes  # noqa: F401
