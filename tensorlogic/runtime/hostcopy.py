"""Large host-memory copies split over a few threads.

A GPU lane copies each batch twice on the host: into pinned staging and out into the caller's
array. One thread copies about 5-10 GB/s (less while first touching the destination's pages),
slower than an H100 computes a large batch, so a copy of several MB is split along its first
axis over a shared pool; numpy releases the GIL while copying.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

PIECE_BYTES = 8 << 20  # below this a copy stays on the calling thread
# pieces of a copy streamed to or from a device: several per copy thread, so the first ones
# are on the bus while the later ones are still being copied
STREAM_PIECE_BYTES = 2 << 20
MAX_THREADS = 16

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
    futures = [
        pool.submit(np.copyto, dst[lo:hi], src[lo:hi]) for lo, hi in zip(bounds[1:-1], bounds[2:])
    ]
    np.copyto(dst[: bounds[1]], src[: bounds[1]])  # the caller copies the first piece itself
    for f in futures:
        f.result()


def row_pieces(a: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges that split ``a`` into pieces of about ``STREAM_PIECE_BYTES`` (one range for a
    small array, a 0-d one or one that is not C-contiguous)."""
    rows = a.shape[0] if a.ndim else 0
    pieces = min(rows, a.nbytes // STREAM_PIECE_BYTES) if a.flags.c_contiguous else 0
    if pieces < 2:
        return [(0, rows)] if a.ndim else [(0, 0)]
    return [(rows * k // pieces, rows * (k + 1) // pieces) for k in range(pieces)]


def copy_in_pieces(dst: np.ndarray, src: np.ndarray) -> Iterator[tuple[int, int]]:
    """``np.copyto(dst, src)`` with the pieces of ``row_pieces`` copied on the copy threads;
    yields each piece's row range, in order, as soon as it is copied, so a consumer (a
    host-to-device copy) can start on it while the later pieces are still being copied."""
    if dst.shape != src.shape:
        raise ValueError(f"copy_in_pieces: shapes {dst.shape} and {src.shape} differ")
    bounds = row_pieces(dst)
    if len(bounds) == 1 or dst.ndim == 0:
        np.copyto(dst, src)
        yield bounds[0]
        return
    pool = _threads()
    futures = [pool.submit(np.copyto, dst[lo:hi], src[lo:hi]) for lo, hi in bounds]
    try:
        for (lo, hi), f in zip(bounds, futures):
            f.result()
            yield lo, hi
    finally:
        for f in futures:  # a consumer that stops early still leaves no copy running
            f.cancel() or f.result()


def copy_landed(dst: np.ndarray, src: np.ndarray, pieces: list) -> None:
    """Copy row pieces ``(lo, hi, event)`` of ``src`` into ``dst`` on the copy threads, each
    once its ``event`` (anything with ``synchronize()``: a device-to-host copy) has completed."""
    pool = _threads()
    futures = []
    try:
        for lo, hi, event in pieces:
            event.synchronize()
            futures.append(pool.submit(np.copyto, dst[lo:hi], src[lo:hi]))
    finally:
        for f in futures:
            f.result()


__all__ = ["copy_in_pieces", "copy_landed", "copyto", "row_pieces"]
