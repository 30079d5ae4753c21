"""TensorPool: keeps each plan's intermediate buffers alive across calls.

A call borrows an arena (the plan's buffer table with every intermediate already allocated as a
view into one arena allocation) and gives it back; concurrent calls each get their own arena, and
arenas are reused, so a steady-state call allocates nothing for intermediates.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from . import hooks


class Arena(list):
    """A plan's buffer table (``env[buffer_id] -> array``) that remembers its pristine state.

    ``seal()`` records the entries that belong to the arena (constants, views into its memory);
    ``reset()`` restores them, dropping whatever a call stored (inputs, outputs, views of them).
    """

    base: list

    def seal(self) -> None:
        """Remember the current entries as the state to reset to."""
        self.base = list(self)

    def reset(self) -> None:
        """Restore the sealed entries."""
        self[:] = self.base


class TensorPool:
    """A pool of arenas built by ``make_arena`` (one per concurrent call, reused).

    With ``reuse=False`` every ``acquire`` builds a fresh arena and ``release`` drops it: the
    behaviour of running without a pool, for comparison.
    """

    def __init__(
        self, make_arena: Callable[[], list], arena_bytes: int = 0, *, reuse: bool = True
    ) -> None:
        self._make_arena = make_arena
        self._free: list[list] = []
        self._lock = threading.Lock()
        self.arena_bytes = arena_bytes
        self.reuse = reuse
        self.arenas_created = 0
        self._alive = 0

    def acquire(self) -> list:
        """Borrow an arena (a new one when none is idle)."""
        try:  # list.pop and list.append are atomic: the hot path takes no lock
            return self._free.pop()
        except IndexError:
            pass
        arena = self._make_arena()  # may fail (out of memory): count only arenas that exist
        with self._lock:
            self.arenas_created += 1
            self._alive += 1
            held = self._alive * self.arena_bytes
        obs = hooks.active()
        if obs is not None:
            obs.counter("pool_bytes", float(held))
        return arena

    def release(self, arena: list) -> None:
        """Give an arena back for reuse."""
        if self.reuse:
            self._free.append(arena)
            return
        with self._lock:
            self._alive -= 1

    def clear(self) -> None:
        """Drop the idle arenas (arenas borrowed right now come back and stay)."""
        with self._lock:
            self._alive -= len(self._free)
            self._free.clear()

    @property
    def idle(self) -> int:
        """Number of arenas waiting for a call."""
        return len(self._free)

    @property
    def bytes_held(self) -> int:
        """Bytes held by the arenas alive now (idle or borrowed)."""
        return self._alive * self.arena_bytes


def host_bytes(n: int) -> np.ndarray:
    """A 64-byte aligned host byte buffer of n bytes."""
    raw = np.empty(n + 64, dtype=np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off : off + n]
