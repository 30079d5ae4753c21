"""Large host-memory copies split over a few threads.

A GPU lane copies each batch twice on the host: into pinned staging and out into the caller's
array. One thread copies about 5-10 GB/s (less while first touching the destination's pages),
slower than an H100 computes a large batch, so a copy of several MB is split along its first
axis over a shared pool; numpy releases the GIL while copying.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

PIECE_BYTES = 8 << 20  # below this a copy stays on the calling thread
MAX_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            n = max(1, min(MAX_THREADS, (os.cpu_count() or 2) // 2))
            _pool = ThreadPoolExecutor(n, thread_name_prefix="tensorlogic-copy")
        return _pool


def copyto(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)`` (same shapes), in pieces along axis 0 on the copy threads."""
    if dst.shape != src.shape:
        raise ValueError(f"copyto: shapes {dst.shape} and {src.shape} differ")
    rows = dst.shape[0] if dst.ndim else 0
    pieces = min(rows, dst.nbytes // PIECE_BYTES, MAX_THREADS)
    if pieces < 2:
        np.copyto(dst, src)
        return
    bounds = [rows * k // pieces for k in range(pieces + 1)]
    pool = _threads()
    futures = [pool.submit(np.copyto, dst[lo:hi], src[lo:hi])
               for lo, hi in zip(bounds[1:-1], bounds[2:])]
    np.copyto(dst[:bounds[1]], src[:bounds[1]])  # the caller copies the first piece itself
    for f in futures:
        f.result()


__all__ = ["copyto"]
