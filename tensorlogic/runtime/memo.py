"""Values built once per key and shared by every thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any


def build_once(
    cache: dict, key: Hashable, lock: threading.Lock | threading.RLock, make: Callable[[], Any]
):
    """``cache[key]``, made by ``make()`` the first time: the lock is taken only on a miss, and a
    thread that lost the race takes the winner's value (kernels compile once)."""
    value = cache.get(key)
    if value is None:
        with lock:
            value = cache.get(key)
            if value is None:
                value = cache[key] = make()
    return value
