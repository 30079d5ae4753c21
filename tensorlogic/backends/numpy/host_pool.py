"""Independent blocks of host work spread over the calling thread and a shared helper pool.

numpy releases the GIL inside a ufunc's loop over a large array, so the blocks of a fused
numpy kernel, each a short series of in-cache ufuncs, run in parallel on several cores while the
unfused plan streams each op through main memory on one. The calling thread always works too
and takes blocks from the same counter as the helpers, so a call never waits for a helper that
is busy elsewhere (several plans called from several threads share the pool without deadlock),
and a helper that starts after the blocks ran out leaves without touching anything.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ... import config
from ...runtime import fperrors

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def helper_count() -> int:
    """Helper threads a call may use besides its own (``config.host_threads() - 1``)."""
    return max(0, config.host_threads() - 1)


def _pool() -> ThreadPoolExecutor:
    """The shared helper pool, one thread per helper (a call asking for more queues its tasks,
    which is harmless: the caller takes whatever blocks no helper took)."""
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(
                    max(1, helper_count()), thread_name_prefix="tensorlogic-block"
                )
    return _executor


def _forget_pool_in_child() -> None:
    # a forked child has none of the parent's threads; it builds its own pool when needed
    global _executor, _lock
    _executor = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


class _Job:
    """The blocks of one call: a shared counter of blocks handed out and one of blocks done."""

    def __init__(self, work: Callable[[int, int], None], n_blocks: int) -> None:
        self.work = work
        self.n_blocks = n_blocks
        self.issued = 0
        self.done = 0
        self.error: BaseException | None = None
        self.cond = threading.Condition()

    def help(self, participant: int) -> None:
        """Run blocks until none are left; ``participant`` picks the worker's scratch."""
        token = fperrors.quiet()  # the caller's quiet FP state does not reach pool threads
        try:
            while True:
                with self.cond:
                    block = self.issued
                    self.issued += 1
                if block >= self.n_blocks:
                    return
                try:
                    if self.error is None:
                        self.work(block, participant)
                except BaseException as exc:  # handed to the caller, which re-raises it
                    self.error = self.error or exc
                with self.cond:
                    self.done += 1
                    if self.done == self.n_blocks:
                        self.cond.notify_all()
        finally:
            fperrors.restore(token)

    def wait(self) -> None:
        with self.cond:
            while self.done < self.n_blocks:
                self.cond.wait()
        if self.error is not None:
            raise self.error


def run_blocks(work: Callable[[int, int], None], n_blocks: int, n_helpers: int) -> None:
    """Call ``work(block, participant)`` once for every block in ``range(n_blocks)``.

    Participant 0 is the calling thread, 1..n_helpers are pool threads; a participant runs one
    block at a time, so it may own scratch memory. With ``n_helpers == 0`` everything runs here.
    """
    n_helpers = min(n_helpers, n_blocks - 1)
    if n_helpers <= 0:
        for block in range(n_blocks):
            work(block, 0)
        return
    job = _Job(work, n_blocks)
    pool = _pool()
    for participant in range(1, n_helpers + 1):
        pool.submit(job.help, participant)
    job.help(0)
    job.wait()
