"""Moved to ``tensorlogic.runtime.hooks`` (the compiler, backends and profiler share it); this
name stays until the branches that import it from here are merged."""

from ..runtime.hooks import (  # noqa: F401
    Observer, StepHook, active, compile_event, counter, pop, push, timed, transfer,
)
