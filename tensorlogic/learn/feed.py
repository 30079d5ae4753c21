"""Feeding a training loop through the batch pipeline: batches are read and prepared ahead
(checked; on a device backend copied in through pinned memory) while the current step runs,
but every step runs on the caller's thread, in order, because each one needs the parameters
the previous step wrote."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np

from ..pipeline.results import BatchFailure, BatchOutput, batch_error
from ..pipeline.staging import check_batch, make_stager


class Prepared(BatchOutput):
    """A prepared batch as the pipeline yields it: its (staged) inputs, ``wait()`` before use."""

    def __init__(self, staged: Any, index: int, n_items: int) -> None:
        super().__init__(staged.inputs, index, n_items)
        self.staged = staged

    def wait(self) -> dict[str, Any]:
        """The inputs, once their copy to the device (if any) is done."""
        self.staged.wait()
        return dict(self)


class FeedExecutor:
    """The pipeline ``Executor`` of a training loop: ``submit`` only prepares the batch."""

    def __init__(self, plan: Any, check_finite: bool) -> None:
        self.check_finite = check_finite
        self.stager = make_stager(plan.backend)
        self._read_ahead = True

    def window(self, prefetch: int) -> int:
        """The batch being trained on plus ``prefetch`` prepared ahead."""
        self._read_ahead = prefetch > 0
        return 1 + prefetch

    def submit(self, index: int, batch: Any, n_items: int) -> Future:
        """Check and stage the batch here (the loader thread)."""
        fut: Future = Future()
        try:
            inputs = check_batch(batch, self.check_finite)
            if self._read_ahead and not self.stager.device:
                # the source may refill one buffer for every batch while this one waits
                inputs = {
                    k: v.copy() if isinstance(v, np.ndarray) else v for k, v in inputs.items()
                }
            fut.set_result(Prepared(self.stager.stage(inputs, None), index, n_items))
        except Exception as exc:  # noqa: BLE001 - reported as this batch's failure
            fut.set_result(BatchFailure(index, batch_error(index, exc), n_items))
        return fut

    def close(self) -> None:
        """Nothing runs in the background."""


__all__ = ["FeedExecutor", "Prepared"]
