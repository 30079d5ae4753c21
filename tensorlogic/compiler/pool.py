"""TensorPool: keeps each plan's intermediate buffers alive across calls.

A call borrows an arena (the plan's buffer table with every intermediate already allocated) and
gives it back; concurrent calls each get their own arena, and arenas are reused, so a
steady-state call allocates nothing for intermediates.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np


class TensorPool:
    """A pool of arenas built by ``make_arena`` (one per concurrent call, reused)."""

    def __init__(self, make_arena: Callable[[], list], arena_bytes: int = 0) -> None:
        self._make_arena = make_arena
        self._free: list[list] = []
        self._lock = threading.Lock()
        self.arena_bytes = arena_bytes
        self.arenas_created = 0

    def acquire(self) -> list:
        """Borrow an arena."""
        with self._lock:
            if self._free:
                return self._free.pop()
        arena = self._make_arena()  # may fail (out of memory): count only arenas that exist
        with self._lock:
            self.arenas_created += 1
        return arena

    def release(self, arena: list) -> None:
        """Give an arena back for reuse."""
        with self._lock:
            self._free.append(arena)

    @property
    def bytes_held(self) -> int:
        """Bytes held by all arenas created so far."""
        return self.arenas_created * self.arena_bytes


def host_bytes(n: int) -> np.ndarray:
    """A 64-byte aligned host byte buffer of n bytes."""
    raw = np.empty(n + 64, dtype=np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n]
