"""Observation hooks: how a profiler sees plan calls and compile-time work.

The executor asks ``active()`` once per call; with no observer installed it runs the step loop
without a hook, so an unprofiled call pays one list lookup. An observer gets a ``StepHook`` per
call: ``after_step(k)`` runs after each step inside the one step loop (``runtime.steps``), and
``done()`` once the call's steps ran (or failed).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Protocol


class StepHook(Protocol):
    """One observed plan call."""

    def after_step(self, k: int) -> None:
        """Step k just ran; its result is in the call's buffer table."""

    def done(self) -> None:
        """The call's steps ran (or one raised)."""


class Observer(Protocol):
    """What the executor and compiler report to (the profiler implements it)."""

    def step_hook(self, plan: Any, env: list) -> StepHook:
        """The hook of one call of the concrete ``plan`` over the buffer table ``env``."""

    def compile_event(
        self, category: str, name: str, start: float, seconds: float, info: dict
    ) -> None:
        """Record compile-time work (an optimizer pass, code generation, a cache hit or miss)."""

    def counter(self, name: str, value: float) -> None:
        """Record a counter sample (pool bytes, device memory)."""


_observers: list[Observer] = []
_lock = threading.Lock()


def active() -> Observer | None:
    """The innermost installed observer, or None."""
    return _observers[-1] if _observers else None


def push(obs: Observer) -> None:
    """Install an observer."""
    with _lock:
        _observers.append(obs)


def pop(obs: Observer) -> None:
    """Remove an observer installed with ``push``."""
    with _lock:
        if obs in _observers:
            _observers.remove(obs)


def compile_event(category: str, name: str, start: float, seconds: float, **info: Any) -> None:
    """Report compile-time work to the active observer, if any."""
    obs = active()
    if obs is not None:
        obs.compile_event(category, name, start, seconds, info)


def counter(name: str, value: float) -> None:
    """Report a counter sample (e.g. device memory in use) to the active observer, if any."""
    obs = active()
    if obs is not None:
        obs.counter(name, value)


@contextmanager
def timed(category: str, name: str, **info: Any) -> Iterator[dict]:
    """Time a block and report it as a compile event; yields a dict for extra info."""
    t0 = time.perf_counter()
    extra: dict = {}
    try:
        yield extra
    finally:
        if _observers:
            compile_event(category, name, t0, time.perf_counter() - t0, **info, **extra)


def transfer(obs: Observer, direction: str, name: str, move: Any, x: Any, sync: Any = None) -> Any:
    """Move one array with ``move(x)``; report it as a "transfer" event when it copied.

    ``sync`` (the backend's synchronize) runs first so a device->host copy is not charged with
    waiting for queued kernels. Backends whose ``move`` returns ``x`` itself report nothing.
    """
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    y = move(x)
    if y is not x:
        obs.compile_event(
            "transfer",
            f"{direction} {name}",
            t0,
            time.perf_counter() - t0,
            {"bytes": int(getattr(x, "nbytes", 0)), "direction": direction},
        )
    return y
