"""Moved to ``tensorlogic.runtime.fperrors`` (the compiler, backends and profiler share it); this
name stays until the branches that import it from here are merged."""

from ..runtime.fperrors import quiet, restore  # noqa: F401
