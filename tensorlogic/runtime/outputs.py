"""Fresh output arrays for a host plan's calls, in memory an earlier call already touched.

A call hands its outputs to the caller, so each call needs new ones. A new array of a few MB is
fresh memory from the OS: its first write faults in every page, and the plan's parallel step
that writes it faults from all threads at once, which the kernel serializes. On the 16-core
host that cost mlp.tl (a 2048x512 float32 output, 4 MB) 0.4-1.3 ms of its 6.6 ms per call
against the same plan writing into a caller's array; torch pays the same for its own outputs.

``OutputBuffers`` keeps the memory of a few earlier outputs and hands out a buffer again once
nothing outside it refers to it any more: every array viewing that memory, however derived,
keeps the buffer alive through its ``base``, so an output the caller still holds (or a slice of
it) is never reused. The usual loop ``y = plan(x)`` thus alternates between two buffers whose
pages are already mapped. A caller that keeps every output gets new memory each call, as before.
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np

# spare buffers kept per output shape: the one the caller still holds while the next call runs,
# and the one that call writes
KEEP = 2
# outputs smaller than this come from numpy's allocator as usual (its small-block cache and
# malloc's heap serve them without fresh pages)
MIN_BYTES = 1 << 18


def _references(raw: np.ndarray) -> int:
    return sys.getrefcount(raw)


def _baseline() -> int:
    """What ``_references`` reads for a buffer only the recycler's list holds (measured the
    same way, so the interpreter's own counting of arguments cancels out)."""
    held = [np.empty(1, np.uint8)]
    return _references(held[0])


_ALONE = _baseline()


class OutputBuffers:
    """Output arrays of a plan's calls, recycled once their previous holders let go."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype`` that aliases no live array."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dt)
        key = (nbytes,)
        with self._lock:
            bufs = self._free.setdefault(key, [])
            raw = None
            for k in range(len(bufs)):
                if _references(bufs[k]) <= _ALONE:
                    raw = bufs[k]
                    break
            if raw is None:
                raw = np.empty(nbytes, np.uint8)
                if len(bufs) < self.keep:
                    bufs.append(raw)
        return raw.view(dt).reshape(shape)

    def clear(self) -> None:
        """Drop the kept buffers (arrays still out keep their own memory)."""
        with self._lock:
            self._free.clear()
