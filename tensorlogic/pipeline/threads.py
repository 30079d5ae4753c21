"""Running batches on a pool of threads in this process (plans are thread-safe)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .results import BatchFailure, BatchOutput, batch_error
from .staging import Staged, check_batch, make_stager


class ThreadExecutor:
    """Prepares batches on the loader thread and computes them on ``workers`` threads."""

    def __init__(self, plan: Any, workers: int, check_finite: bool) -> None:
        self.plan = plan
        self.workers = workers
        self.check_finite = check_finite
        self.stager = make_stager(plan.backend)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="tensorlogic-batch")
        self._read_ahead = True

    def window(self, prefetch: int) -> int:
        """Batches being computed plus ``prefetch`` prepared ahead."""
        self._read_ahead = self.workers + prefetch > 1
        return self.workers + prefetch

    def submit(self, index: int, batch: Any, n_items: int) -> Future:
        """Prepare here (the loader thread), compute on the pool."""
        try:
            if isinstance(batch, Staged):  # run_batched hands over slices with output buffers
                staged = self.stager.stage(check_batch(batch.inputs, self.check_finite), batch.out)
            else:
                inputs = check_batch(batch, self.check_finite)
                if self._read_ahead and not self.stager.device:
                    # the source runs on while this batch waits: a generator that refills one
                    # buffer for every batch would change it under us, so keep a private copy
                    # (a device stager copies into pinned memory here already)
                    inputs = {
                        k: v.copy() if isinstance(v, np.ndarray) else v for k, v in inputs.items()
                    }
                staged = self.stager.stage(inputs, None)
        except Exception as exc:  # noqa: BLE001 - reported as this batch's failure
            fut: Future = Future()
            fut.set_result(BatchFailure(index, batch_error(index, exc), n_items))
            return fut
        return self._pool.submit(self._run, index, staged, n_items)

    def _run(self, index: int, staged: Staged, n_items: int) -> BatchOutput | BatchFailure:
        try:
            staged.wait()
            # host arrays were checked on the loader thread; device arrays are checked here
            out = self.plan(
                staged.inputs, out=staged.out, check_finite=self.check_finite and self.stager.device
            )
            if self.stager.device:
                self.stager.finish()
            return BatchOutput(out, index, n_items)
        except Exception as exc:  # noqa: BLE001 - reported as this batch's failure
            return BatchFailure(index, batch_error(index, exc), n_items)

    def close(self) -> None:
        """Drop batches not started yet; running ones finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["ThreadExecutor"]
