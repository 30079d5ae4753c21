"""The streaming engine: a loader thread feeds an executor; results come back in a window.

The loader pulls batch k+1 from the source and prepares it while batch k computes. At most
``window`` batches are between "taken from the source" and "handed to the caller", so a slow
consumer bounds memory instead of piling up results.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Iterable, Iterator, Protocol

from .layout import BatchLayout
from .progress import Progress
from .results import BatchError, BatchFailure, BatchOutput, batch_error


class Executor(Protocol):
    """Runs prepared batches: threads in this process or a Dask cluster."""

    def window(self, prefetch: int) -> int:
        """How many batches may be in flight."""

    def submit(self, index: int, batch: Any, n_items: int) -> Future:
        """Start batch ``index``; the future gives a BatchOutput or a BatchFailure, never raises."""

    def close(self) -> None:
        """Cancel what is still pending and release resources."""


_END = "end"


def stream(
    executor: Executor,
    source: Iterable[Any],
    layout: BatchLayout,
    *,
    prefetch: int,
    ordered: bool,
    bar: Progress,
    on_error: str,
) -> Iterator[BatchOutput | BatchFailure]:
    """Run every batch of ``source`` through ``executor``; yield results (see run_batches)."""
    window = max(1, executor.window(prefetch))
    slots = threading.Semaphore(window)
    stop = threading.Event()
    results: queue.SimpleQueue = queue.SimpleQueue()

    def load() -> None:
        n = 0
        error: BaseException | None = None
        try:
            it = iter(source)
            while True:
                while not slots.acquire(timeout=0.1):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                try:
                    batch = next(it)
                except StopIteration:
                    break
                try:
                    n_items = layout.count(getattr(batch, "inputs", batch))
                except Exception:  # noqa: BLE001 - a broken batch object fails as that batch
                    n_items = 0
                try:
                    fut = executor.submit(n, batch, n_items)
                except Exception as exc:  # noqa: BLE001 - e.g. the cluster went away
                    fut = Future()
                    fut.set_result(BatchFailure(n, batch_error(n, exc), n_items))
                if ordered:
                    results.put(fut)
                else:
                    fut.add_done_callback(results.put)
                n += 1
        except BaseException as exc:  # noqa: BLE001 - the source's own error, re-raised below
            error = exc
        results.put((_END, n, error))

    loader = threading.Thread(target=load, name="tensorlogic-batch-loader", daemon=True)
    loader.start()
    done = 0
    total: int | None = None
    source_error: BaseException | None = None
    try:
        while total is None or done < total:
            item = results.get()
            if isinstance(item, tuple):
                _, total, source_error = item
                continue
            res = item.result()
            slots.release()
            done += 1
            bar.update(res.n_items, res.ok)
            if not res.ok and on_error == "raise":
                raise res.error
            yield res
        if source_error is not None:
            err = BatchError(
                f"batch {total}: the batch source raised "
                f"{type(source_error).__name__}: {source_error}",
                index=total if total is not None else -1,
                error=source_error,
            )
            raise err from source_error
    finally:
        stop.set()
        executor.close()
        bar.close()


__all__ = ["Executor", "stream"]
