"""``tl.train``: the training loop over the batch pipeline.

Each step runs the plan of a graph with gradients (``tl.grad``: outputs ``loss`` and
``grad_<parameter>``) on one batch and hands the gradients to the optimizer, which updates the
plan's parameters in place. Batches are prepared ahead by the pipeline's loader thread; the
steps themselves run in order on the calling thread.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ..errors import GraphError, InputError
from ..pipeline.engine import stream
from ..pipeline.layout import batch_layout
from ..pipeline.progress import Progress
from ..pipeline.results import batch_error
from .checkpoint import load_checkpoint, save_checkpoint
from .feed import FeedExecutor

_ON_ERROR = ("raise", "skip")


@dataclass
class History:
    """What ``tl.train`` did: the loss of every step, the mean loss of every epoch, the batches
    skipped under ``on_error="skip"`` as (epoch, batch index), and the plan it trained."""

    losses: list[float] = field(default_factory=list)
    epoch_losses: list[float] = field(default_factory=list)
    skipped: list[tuple[int, int]] = field(default_factory=list)
    plan: Any = None

    @property
    def steps(self) -> int:
        """Updates applied."""
        return len(self.losses)


def train(
    model: Any,
    batches: Iterable[Any] | Callable[[int], Iterable[Any]],
    *,
    optimizer: Any,
    epochs: int = 1,
    loss: str = "loss",
    backend: str = "auto",
    opt_level: int = 2,
    prefetch: int = 2,
    progress: bool = True,
    on_error: str = "raise",
    check_finite: bool = False,
    checkpoint: Any = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    **compile_options: Any,
) -> History:
    """Train ``model``'s parameters on ``batches`` for ``epochs`` epochs.

    Args:
        model: a ``CompiledPlan`` whose graph has a scalar output ``loss`` and outputs
            ``grad_<name>`` for the parameters to learn (what ``tl.grad`` makes), or such an
            ``EinsumGraph`` (compiled here with ``backend``, ``opt_level`` and
            ``compile_options``). A graph with no gradient outputs gets them from
            ``tl.grad(graph, of=loss, wrt=<every parameter>)``.
        batches: input dicts, iterated once per epoch (a list, or any iterable that can be
            iterated again), or a function ``epoch -> iterable of input dicts``.
        optimizer: a ``tl.optim`` optimizer (``SGD``, ``Adam``, ...).
        prefetch: batches read and prepared ahead of the step that runs.
        progress: a tqdm bar per epoch (batches/s, items/s and the latest loss) when stderr
            is a terminal.
        on_error: ``"raise"`` a BatchError naming the batch, or ``"skip"`` it (no update;
            listed in ``History.skipped``).
        check_finite: reject batches with NaN/inf inputs and steps whose loss is not finite
            (before the update, so the parameters stay as they were).
        checkpoint: a path: parameters, optimizer state, the loop's position and the history
            are saved there at the end of every epoch and every ``checkpoint_every`` steps.
        resume: continue from ``checkpoint`` if the file exists: the same batches give the same
            result as a run that was never interrupted.

    Returns:
        A ``History`` (``losses`` per step, ``epoch_losses``, ``skipped``, ``plan``).
    """
    from ..optim.base import Optimizer

    epochs = _check_int("epochs", epochs, 1)
    prefetch = _check_int("prefetch", prefetch, 0)
    if checkpoint_every is not None:
        checkpoint_every = _check_int("checkpoint_every", checkpoint_every, 1)
    if on_error not in _ON_ERROR:
        raise InputError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
    if not isinstance(optimizer, Optimizer):
        raise InputError(
            f"optimizer must be a tl.optim optimizer (SGD, Adam, ...), got "
            f"{type(optimizer).__name__}"
        )
    if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
        raise InputError(f"checkpoint must be a file path, got {type(checkpoint).__name__}")
    if (resume or checkpoint_every) and checkpoint is None:
        raise InputError("resume= and checkpoint_every= need checkpoint=<path>")
    plan = _training_plan(model, loss, backend, opt_level, compile_options)
    source = _epoch_source(batches, epochs)
    history = History(plan=plan)
    start_epoch, start_batch, sums = 0, 0, [0.0, 0]
    if resume and os.path.exists(checkpoint):
        pos = load_checkpoint(checkpoint, plan, optimizer)
        start_epoch, start_batch = int(pos.get("epoch", 0)), int(pos.get("batch", 0))
        history.losses = [float(x) for x in pos.get("losses", [])]
        history.epoch_losses = [float(x) for x in pos.get("epoch_losses", [])]
        history.skipped = [tuple(x) for x in pos.get("skipped", [])]
        sums = [float(pos.get("epoch_sum", 0.0)), int(pos.get("epoch_count", 0))]

    def save(epoch: int, batch: int) -> None:
        save_checkpoint(
            checkpoint,
            plan,
            optimizer,
            epoch=epoch,
            batch=batch,
            losses=history.losses,
            epoch_losses=history.epoch_losses,
            skipped=[list(s) for s in history.skipped],
            epoch_sum=sums[0],
            epoch_count=sums[1],
        )

    layout = batch_layout(plan)
    for epoch in range(start_epoch, epochs):
        skip = start_batch if epoch == start_epoch else 0
        src = source(epoch)
        total = len(src) - skip if hasattr(src, "__len__") else None
        if skip:
            src = itertools.islice(src, skip, None)
        bar = Progress(progress, total, desc=f"epoch {epoch + 1}/{epochs}")
        results = stream(
            FeedExecutor(plan, check_finite),
            src,
            layout,
            prefetch=prefetch,
            ordered=True,
            bar=bar,
            on_error=on_error,
        )
        for res in results:
            index = skip + res.index
            if not res.ok:
                history.skipped.append((epoch, index))
                continue
            try:
                value = _step(plan, optimizer, res.wait(), loss, check_finite)
            except Exception as exc:  # noqa: BLE001 - reported as this batch's failure
                err = batch_error(index, exc)
                if on_error == "raise":
                    results.close()
                    raise err from exc
                history.skipped.append((epoch, index))
                continue
            history.losses.append(value)
            sums[0] += value
            sums[1] += 1
            bar.note = f"loss {value:.4g}"
            if checkpoint_every and history.steps % checkpoint_every == 0:
                save(epoch, index + 1)
        history.epoch_losses.append(sums[0] / sums[1] if sums[1] else math.nan)
        sums = [0.0, 0]
        if checkpoint is not None:
            save(epoch + 1, 0)
    return history


def _step(
    plan: Any, optimizer: Any, inputs: dict[str, Any], loss: str, check_finite: bool
) -> float:
    out = plan(inputs)
    value = float(np.asarray(plan.backend.to_host(out[loss])))
    if check_finite and not math.isfinite(value):
        raise InputError(
            f"the loss {loss!r} is {value} (check_finite=True); the parameters were not updated"
        )
    optimizer.step(plan, out)
    return value


def _training_plan(
    model: Any, loss: str, backend: str, opt_level: int, options: dict[str, Any]
) -> Any:
    from ..compiler.compile import compile as compile_graph
    from ..compiler.plan import CompiledPlan
    from ..ir.graph import EinsumGraph

    if isinstance(model, EinsumGraph):
        graph = model
        if loss not in graph.outputs:
            raise GraphError(
                f"tl.train: the graph has no output {loss!r} to minimize; its "
                f"outputs are {list(graph.outputs)}"
            )
        if not any(f"grad_{p}" in graph.outputs for p in graph.parameters):
            graph = _with_gradients(graph, loss)
        plan = compile_graph(graph, backend=backend, opt_level=opt_level, **options)
    elif isinstance(model, CompiledPlan):
        plan = model
    else:
        raise GraphError(
            f"tl.train expects a CompiledPlan or an EinsumGraph, got {type(model).__name__}"
        )
    graph = plan.graph
    if loss not in graph.outputs:
        raise GraphError(
            f"tl.train: the plan has no output {loss!r} to minimize; its outputs "
            f"are {list(graph.outputs)}"
        )
    shape = graph.node(graph.outputs[loss]).shape
    if tuple(shape) != ():
        raise GraphError(f"tl.train: the loss {loss!r} must be a scalar, got shape {tuple(shape)}")
    if not any(f"grad_{p}" in graph.outputs for p in graph.parameters):
        raise GraphError(
            f"tl.train: the plan has no output grad_<parameter> for any of its "
            f"parameters {list(graph.parameters)}; make the graph with "
            f"tl.grad(graph, of={loss!r}, wrt=[...])"
        )
    return plan


def _with_gradients(graph: Any, loss: str) -> Any:
    from ..autodiff import grad

    if not graph.parameters:
        raise GraphError(
            f"tl.train: the graph has no grad_<parameter> outputs; add them with "
            f"tl.grad(graph, of={loss!r}, wrt=[...]) (parameters: "
            f"{list(graph.parameters)})"
        )
    return grad(graph, of=loss, wrt=list(graph.parameters))


def _epoch_source(batches: Any, epochs: int) -> Callable[[int], Iterable[Any]]:
    """``epoch -> iterable``; a one-shot iterator is refused for more than one epoch."""
    if callable(batches) and not hasattr(batches, "__iter__"):
        return batches
    if isinstance(batches, dict) or not hasattr(batches, "__iter__"):
        raise InputError(
            "batches must be an iterable of input dicts (name -> array) or a "
            f"function epoch -> iterable, got {type(batches).__name__}"
        )
    if epochs > 1 and iter(batches) is batches:
        raise InputError(
            "batches is a one-shot iterator but epochs > 1; pass a list, an "
            "iterable that can be iterated again, or a function epoch -> batches"
        )
    return lambda epoch: batches


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InputError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


__all__ = ["History", "train"]
