"""What a batch run yields: outputs of one batch, or a failure record, and the batch error."""

from __future__ import annotations

from typing import Any

from ..errors import TensorLogicError


class BatchError(TensorLogicError):
    """A batch that could not be run; ``index`` is its position in the stream (from 0).

    The original error is ``error`` (and ``__cause__``).
    """

    code = "batch_error"

    def __init__(
        self,
        message: str,
        *,
        index: int = -1,
        error: BaseException | None = None,
        **context: object,
    ) -> None:
        super().__init__(message, **context)
        self.index = index
        self.error = error

    def __reduce__(self):  # keep index/error when the error crosses a process boundary
        return (_rebuild_batch_error, (str(self), self.index, self.error))


def _rebuild_batch_error(message: str, index: int, error: BaseException | None) -> BatchError:
    return BatchError(message, index=index, error=error)


def batch_error(index: int, exc: BaseException) -> BatchError:
    """Wrap ``exc`` raised by batch ``index`` in a BatchError naming the batch."""
    if isinstance(exc, BatchError):
        return exc
    what = "" if isinstance(exc, TensorLogicError) else f"{type(exc).__name__}: "
    err = BatchError(f"batch {index}: {what}{exc}", index=index, error=exc)
    err.__cause__ = exc
    return err


class BatchOutput(dict):
    """The outputs of one batch (a dict: output name -> array), with its position.

    Attributes:
        index: position of the batch in the input stream (from 0).
        n_items: number of items in the batch (its size along the batch dimension).
    """

    ok = True

    def __init__(self, outputs: dict[str, Any], index: int, n_items: int) -> None:
        super().__init__(outputs)
        self.index = index
        self.n_items = n_items

    def __repr__(self) -> str:
        shapes = {k: tuple(getattr(v, "shape", ())) for k, v in self.items()}
        return f"BatchOutput(index={self.index}, n_items={self.n_items}, shapes={shapes})"


class BatchFailure:
    """A batch skipped under ``on_error="skip"``: its position and the BatchError."""

    ok = False

    def __init__(self, index: int, error: BatchError, n_items: int = 0) -> None:
        self.index = index
        self.error = error
        self.n_items = n_items

    def __repr__(self) -> str:
        return f"BatchFailure(index={self.index}, error={str(self.error)!r})"


__all__ = ["BatchError", "BatchFailure", "BatchOutput", "batch_error"]
