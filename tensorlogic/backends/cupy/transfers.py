"""Host <-> device traffic of one GPU's batch lane: pinned staging and three streams (needs CuPy).

A lane (pipeline/devices.py) moves a batch in three asynchronous phases, each on its own
stream, so batch k+1's upload and batch k-1's download overlap batch k's kernels:
``upload`` copies host inputs into pinned memory (on the lane's thread, off the GPU's path) and
starts the host-to-device copies; ``computing`` runs the plan on the compute stream once the
upload is in; ``download`` starts the device-to-host copies into pinned memory once the kernels
are done; ``finish`` waits for them and copies into the caller's arrays. Every method runs on
the lane's thread with the lane's device current.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import cupy
import numpy as np

from ...runtime.hostcopy import copy_in_pieces, copy_landed, copyto, row_pieces

_H2D, _D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost


@dataclass
class Ticket:
    """A batch in flight: its pinned buffers and device arrays stay alive until ``finish``."""

    event: Any = None
    host: dict[str, np.ndarray] = field(default_factory=dict)  # pinned views of the outputs
    pieces: dict[str, list] = field(default_factory=dict)  # (lo, hi, event) per output piece
    keep: list = field(default_factory=list)
    marks: dict[str, Any] = field(default_factory=dict)  # phase -> event, while tracing


class CupyTransfers:
    """Streams and pinned staging of one device; created and used on that device's lane."""

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self.h2d = cupy.cuda.Stream(non_blocking=True)
        self.compute = cupy.cuda.Stream(non_blocking=True)
        self.d2h = cupy.cuda.Stream(non_blocking=True)
        self._uploaded: Any = None
        self._clock: tuple[Any, float] | None = None  # (event, host seconds) while tracing

    def start_clock(self, t0: float | None) -> None:
        """Record device events per phase from now on, timed from the host clock's ``t0``
        (pipeline/lanetrace.py); None stops recording."""
        if t0 is None:
            self._clock = None
            return
        ev = self.compute.record()
        ev.synchronize()  # the lane is idle between runs: the event completes about now
        self._clock = (ev, time.perf_counter() - t0)

    def _mark(self, ticket: Ticket, name: str, stream: Any) -> None:
        if self._clock is not None:
            ticket.marks[name] = stream.record()

    def device_times(self, ticket: Ticket) -> dict[str, float]:
        """When each traced phase of a finished batch happened on the device (seconds on the
        trace's clock)."""
        if self._clock is None:
            return {}
        ev0, t0 = self._clock
        return {
            name: t0 + cupy.cuda.get_elapsed_time(ev0, ev) / 1e3
            for name, ev in ticket.marks.items()
        }

    @staticmethod
    def _pinned(shape: tuple, dtype: np.dtype) -> tuple[np.ndarray, Any]:
        # from CuPy's pinned pool: after the first batches, a size seen before is a lookup
        nbytes = max(int(np.prod(shape)) * dtype.itemsize, 1)
        mem = cupy.cuda.alloc_pinned_memory(nbytes)
        return np.frombuffer(mem, dtype, int(np.prod(shape))).reshape(shape), mem

    def new_ticket(self) -> Ticket:
        """An empty record for one batch in flight."""
        return Ticket()

    def is_device_array(self, x: Any) -> bool:
        """True for a CuPy array (on any device)."""
        return isinstance(x, cupy.ndarray)

    def on_this_device(self, x: Any) -> bool:
        """True for a CuPy array that lives on this lane's device."""
        return isinstance(x, cupy.ndarray) and x.device.id == self.device_id

    def upload(self, inputs: dict[str, np.ndarray], ticket: Ticket) -> dict[str, Any]:
        """Device copies of host arrays; the copies are started, not finished."""
        out: dict[str, Any] = {}
        sp = self.h2d.ptr
        self._mark(ticket, "h2d_start", self.h2d)
        for name, x in inputs.items():
            host, mem = self._pinned(x.shape, x.dtype)
            with self.h2d:
                dev = cupy.empty(x.shape, x.dtype)
            row = x.nbytes // x.shape[0] if x.ndim and x.shape[0] else 0
            # pageable -> pinned on the copy threads, piece by piece; each piece's
            # host-to-device copy starts as soon as it is staged
            for lo, hi in copy_in_pieces(host, x):
                if hi > lo and row:
                    cupy.cuda.runtime.memcpyAsync(
                        dev.data.ptr + lo * row,
                        host.ctypes.data + lo * row,
                        (hi - lo) * row,
                        _H2D,
                        sp,
                    )
                elif host.nbytes and not x.ndim:
                    cupy.cuda.runtime.memcpyAsync(
                        dev.data.ptr, host.ctypes.data, host.nbytes, _H2D, sp
                    )
            ticket.keep += [mem, dev]
            out[name] = dev
        self._uploaded = self.h2d.record()
        if self._clock is not None:
            ticket.marks["h2d_end"] = self._uploaded
        return out

    @contextlib.contextmanager
    def computing(self, ticket: Ticket | None = None) -> Iterator[None]:
        """Launches inside run on the compute stream, after the last upload."""
        if self._uploaded is not None:
            self.compute.wait_event(self._uploaded)
            self._uploaded = None
        if ticket is not None:
            self._mark(ticket, "compute_start", self.compute)
        with self.compute:
            yield
        if ticket is not None:
            self._mark(ticket, "compute_end", self.compute)

    def download(self, outputs: dict[str, Any], ticket: Ticket) -> None:
        """Start copying the batch's outputs into pinned memory once its kernels are done."""
        self.d2h.wait_event(self.compute.record())
        sp = self.d2h.ptr
        for name, arr in outputs.items():
            if not arr.flags.c_contiguous:
                with self.compute:
                    arr = cupy.ascontiguousarray(arr)
                self.d2h.wait_event(self.compute.record())
            host, mem = self._pinned(arr.shape, arr.dtype)
            pieces = []
            if host.nbytes:
                # piece by piece, each with its event, so ``finish`` copies a landed piece
                # out while the later ones are still crossing the bus
                row = host.nbytes // host.shape[0] if host.ndim else host.nbytes
                for lo, hi in row_pieces(host) if host.ndim else [(0, 1)]:
                    cupy.cuda.runtime.memcpyAsync(
                        host.ctypes.data + lo * row,
                        arr.data.ptr + lo * row,
                        (hi - lo) * row,
                        _D2H,
                        sp,
                    )
                    pieces.append((lo, hi, self.d2h.record()))
            ticket.keep += [mem, arr]
            ticket.host[name] = host
            ticket.pieces[name] = pieces
        ticket.event = self.d2h.record()
        if self._clock is not None:
            ticket.marks["d2h_end"] = ticket.event

    def abandon(self, ticket: Ticket) -> None:
        """Drop a batch that failed midway, once nothing queued can still touch its memory."""
        self.h2d.synchronize()
        self.compute.synchronize()
        self.d2h.synchronize()
        self._uploaded = None
        ticket.keep.clear()
        ticket.host.clear()
        ticket.pieces.clear()

    def finish(self, ticket: Ticket, dest: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """Wait for the batch's downloads; its outputs as numpy arrays (into ``dest`` where
        given, else new arrays)."""
        results = {}
        for name, host in ticket.host.items():
            target = dest.get(name) if dest else None
            if target is None:
                target = np.empty(host.shape, host.dtype)
            pieces = ticket.pieces.get(name) or []
            if len(pieces) < 2:
                for *_, event in pieces:
                    event.synchronize()
                copyto(target, host)
            else:
                copy_landed(target, host, pieces)
            results[name] = target
        if ticket.event is not None:
            ticket.event.synchronize()
        ticket.keep.clear()
        ticket.host.clear()
        ticket.pieces.clear()
        return results


__all__ = ["CupyTransfers", "Ticket"]
