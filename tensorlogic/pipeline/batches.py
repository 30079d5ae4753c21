"""Batched inference: ``run_batches`` streams batches through a plan, ``run_batched`` splits
arrays along the batch dimension, runs the pieces and puts the results back together.

The last, smaller batch runs its own cached plan (one specialization per batch size) rather than
being padded to the full size: benchmarks/bench_pipeline.py measures both, and padding costs a
full batch of compute for a partial one, while the extra plan is compiled once and cached.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from ..errors import GraphError, InputError
from .dask_arrays import is_dask_array, run_dask_arrays
from .devices import DEPTH, DevicesExecutor, multi_device, resolve_devices
from .engine import stream
from .layout import BatchLayout, batch_layout, repeated_batch_axes
from .progress import Progress
from .results import BatchFailure, BatchOutput
from .schedule import batch_bounds
from .sizing import memory_budget, pick_batch_size
from .staging import Staged, is_device_backend
from .threads import ThreadExecutor

_ON_ERROR = ("raise", "skip")


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InputError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def _check_plan(plan: Any) -> None:
    from ..compiler.plan import CompiledPlan

    if not isinstance(plan, CompiledPlan):
        raise GraphError(f"expected a CompiledPlan (from tl.compile), got {type(plan).__name__}")


def run_batches(
    plan: Any,
    batches: Iterable[Mapping[str, Any]],
    *,
    prefetch: int = 2,
    workers: int = 1,
    ordered: bool = True,
    progress: bool = True,
    on_error: str = "raise",
    client: Any = None,
    check_finite: bool = False,
    devices: Any = None,
) -> Iterator[BatchOutput | BatchFailure]:
    """Run ``plan`` on every batch of ``batches`` (an iterable of input dicts).

    Batch k+1 is taken from ``batches`` and prepared (checked; on a GPU backend copied to the
    device through pinned memory on a second stream) while batch k computes.

    Args:
        prefetch: batches prepared ahead of those being computed.
        workers: threads computing batches at once (ignored with ``client``).
        ordered: yield results in input order; else as they finish (each has ``.index``).
        progress: draw a tqdm bar (batches/s and items/s) when stderr is a terminal.
        on_error: ``"raise"`` a BatchError naming the bad batch's index, or ``"skip"`` it:
            it is yielded as a BatchFailure and the others go on.
        client: a ``dask.distributed.Client``: run the batches on its workers.
        check_finite: reject batches whose inputs hold NaN or inf.
        devices: run on several GPUs of this process: ``"all"`` or a list of device ids
            (None: the plan's one device). Each device gets its own feeder thread, streams
            and plan copy, and takes the next batch when it has room; outputs come back as
            numpy arrays. ``workers`` is ignored.

    Returns:
        An iterator of BatchOutput (a dict of output arrays with ``.index`` and ``.n_items``)
        and, with ``on_error="skip"``, BatchFailure records.
    """
    _check_plan(plan)
    prefetch = _check_int("prefetch", prefetch, 0)
    workers = _check_int("workers", workers, 1)
    if on_error not in _ON_ERROR:
        raise InputError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
    if isinstance(batches, Mapping) or not hasattr(batches, "__iter__"):
        raise InputError(
            "batches must be an iterable of input dicts (name -> array), got "
            f"{type(batches).__name__}; for one dict of arrays use run_batched"
        )
    layout = batch_layout(plan)
    total = len(batches) if hasattr(batches, "__len__") else None
    device_ids = resolve_devices(plan.backend, devices)
    if device_ids is not None and client is not None:
        raise InputError(
            "pass devices= (GPUs of this process) or client= (a Dask cluster), not both"
        )
    if device_ids is not None:
        executor: Any = DevicesExecutor(plan, device_ids, check_finite)
    elif client is not None:
        from .dask import DaskExecutor

        executor = DaskExecutor(client, plan, check_finite=check_finite)
    else:
        executor = ThreadExecutor(plan, workers, check_finite)
    bar = Progress(progress, total)
    return stream(
        executor, batches, layout, prefetch=prefetch, ordered=ordered, bar=bar, on_error=on_error
    )


def _batch_count(layout: BatchLayout, inputs: Mapping[str, Any]) -> int:
    counts: dict[str, int] = {}
    for name, axis in layout.input_axes.items():
        x = inputs.get(name)
        if x is None:
            raise InputError(f"missing input {name!r}; the plan expects {list(layout.input_axes)}")
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) <= axis:
            raise InputError(
                f"input {name!r}: expected an array with batch dimension "
                f"{layout.symbol!r} at axis {axis}, got shape {shape}"
            )
        counts[name] = int(shape[axis])
    if len(set(counts.values())) > 1:
        raise InputError(f"inputs disagree on the batch dimension {layout.symbol!r}: {counts}")
    return next(iter(counts.values()))


def _other_sizes(plan: Any, layout: BatchLayout, inputs: Mapping[str, Any]) -> dict[str, int]:
    """Sizes of the non-batch symbols, read off the inputs (for planning and output shapes)."""
    sizes: dict[str, int] = {}
    for name, nid in plan.graph.inputs.items():
        shape = getattr(inputs.get(name), "shape", None)
        dims = plan.graph.node(nid).shape
        if shape is None or len(shape) != len(dims):
            continue  # the plan names what is wrong when the batch runs
        for want, got in zip(dims, shape):
            if isinstance(want, str) and want != layout.symbol:
                sizes.setdefault(want, int(got))
    return sizes


def _output_specs(
    plan: Any, layout: BatchLayout, sizes: dict[str, int], n: int
) -> dict[str, tuple[tuple[int, ...], str]] | None:
    """Full output shapes and dtypes for ``n`` items, or None if the inputs do not bind."""
    missing = [s for s in plan.symbols if s != layout.symbol and s not in sizes]
    if missing:
        return None
    try:
        bound = plan.graph.bind({**sizes, layout.symbol: n})
    except Exception:  # noqa: BLE001 - bad inputs: the first batch's run reports them
        return None
    return {
        name: (tuple(bound.node(nid).shape), bound.node(nid).dtype)
        for name, nid in bound.outputs.items()
    }


def _bytes_per_item(
    layout: BatchLayout, inputs: Mapping[str, Any], outputs: Mapping[str, Any], n: int
) -> float:
    """Bytes a batch moves per item: its batched inputs and outputs (0 when n is 0)."""
    if n <= 0:
        return 0.0
    arrays = [inputs[name] for name in layout.input_axes] + list(outputs.values())
    return sum(float(getattr(a, "nbytes", 0)) for a in arrays) / n


def _check_client(client: Any) -> None:
    from distributed import Client

    if not isinstance(client, Client):
        raise InputError(f"client must be a dask.distributed.Client, got {type(client).__name__}")


def _slice(x: Any, axis: int, start: int, stop: int) -> Any:
    return x[(slice(None),) * axis + (slice(start, stop),)]


def run_batched(
    plan: Any,
    inputs: Mapping[str, Any],
    batch_size: int | None = None,
    *,
    prefetch: int = 2,
    workers: int = 1,
    progress: bool = True,
    check_finite: bool = False,
    client: Any = None,
    devices: Any = None,
    store: Any = None,
) -> dict[str, Any]:
    """Split ``inputs`` along the batch dimension, run the pieces, concatenate the outputs.

    The batch dimension is the graph's first symbolic input dimension (e.g. "B"); inputs
    without it are passed whole to every batch. Results are numpy arrays, except when an
    input is a dask array: then each batch is one task that runs where its chunk is (on
    ``client``'s workers, or the current distributed client's, else dask's local scheduler)
    and the results are dask arrays, computed when the caller computes or persists them.

    Args:
        batch_size: items per batch; None picks the largest size whose planned memory
            (intermediates peak plus outputs, per concurrent batch) fits the plan's
            ``memory_limit`` or half the backend's free memory.
        prefetch, workers, progress, check_finite, client, devices: as in ``run_batches``;
            with ``devices`` each device writes its batches' outputs straight into the
            preallocated result. On a GPU backend ``devices=None`` (with ``workers=1``) runs
            the same way on the plan's one device.
        store: with dask-array inputs, a zarr store (path, URL or store object) to write the
            outputs into, each as the array of its name (replacing one of that name), on the
            workers; the results are then dask arrays read from it.
    """
    _check_plan(plan)
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a dict of name -> array, got {type(inputs).__name__}")
    layout = batch_layout(plan)
    if layout.symbol is None:
        raise InputError(
            "run_batched needs a graph whose inputs have a symbolic batch "
            "dimension, e.g. g.input('x', shape=('B', 64)); use plan(...) instead"
        )
    twice = repeated_batch_axes(plan, layout.symbol)
    if twice:
        raise InputError(
            f"{', '.join(twice)} hold the batch dimension {layout.symbol!r} more "
            "than once, so they cannot be split or concatenated along one axis; "
            "call the plan on all items (or run_batches on your own batches)"
        )
    no_axis = [n for n in plan.graph.outputs if n not in layout.output_axes]
    if no_axis:
        raise InputError(
            f"output(s) {no_axis} have no batch dimension {layout.symbol!r}, so "
            "batch results cannot be concatenated; call the plan on all items"
        )
    if any(is_dask_array(x) for x in inputs.values()):
        if devices is not None:
            raise InputError(
                "devices= runs numpy inputs on this process's GPUs; for dask "
                "arrays use a cluster with one worker per GPU: "
                "tl.local_cluster(gpus=N) and client="
            )
        if client is not None:
            _check_client(client)
        size = None if batch_size is None else _check_int("batch_size", batch_size, 1)
        return run_dask_arrays(
            plan, layout, inputs, size, client=client, check_finite=check_finite, store=store
        )
    if store is not None:
        raise InputError(
            "store= writes the results of dask-array inputs on the workers; with "
            "numpy inputs the results are numpy arrays (save them yourself)"
        )
    n = _batch_count(layout, inputs)
    sizes = _other_sizes(plan, layout, inputs)
    resolve_devices(plan.backend, devices)  # bad devices fail before anything is allocated
    if devices is None and client is None and workers == 1 and multi_device(plan.backend):
        # one GPU runs as a lane too: uploads, kernels and downloads overlap and results are
        # copied straight into the preallocated outputs (about twice the plain batch loop)
        devices = [plan.backend.device_id]
    if devices is not None:
        concurrent = DEPTH  # per device: the budget is each device's own memory
    else:
        concurrent = 1 if client is not None else _check_int("workers", workers, 1)
    if batch_size is None:
        budget = memory_budget(plan)
        if budget is None:
            raise InputError(
                "the backend cannot report its free memory and the plan has no "
                "memory_limit; pass batch_size"
            )
        batch_size = pick_batch_size(plan, layout.symbol, max(n, 1), sizes, budget, concurrent)
    batch_size = _check_int("batch_size", batch_size, 1)
    specs = _output_specs(plan, layout, sizes, n)
    full: dict[str, np.ndarray] = {}
    if specs is not None:
        full = {name: np.empty(shape, dtype) for name, (shape, dtype) in specs.items()}
    # outputs along axis 0 on a host backend are written in place: no concatenation copy
    # (on a device backend too with devices=, whose lanes copy results out into them)
    direct = [
        name
        for name in full
        if layout.output_axes[name] == 0
        and client is None
        and (devices is not None or not is_device_backend(plan.backend))
    ]
    lanes = len(resolve_devices(plan.backend, devices) or ())
    bounds = batch_bounds(n, batch_size, lanes, _bytes_per_item(layout, inputs, full, n))
    n_batches = len(bounds)

    def pieces() -> Iterator[Staged]:
        for lo, hi in bounds:
            batch = {
                name: (
                    _slice(x, layout.input_axes[name], lo, hi) if name in layout.input_axes else x
                )
                for name, x in inputs.items()
            }
            out = {name: full[name][lo:hi] for name in direct} or None
            yield Staged(batch, out)

    class _Sized:  # a re-iterable with a length, so the bar knows the total
        def __len__(self) -> int:
            return n_batches

        def __iter__(self) -> Iterator[Staged]:
            return pieces()

    results = run_batches(
        plan,
        _Sized(),
        prefetch=prefetch,
        workers=workers,
        ordered=False,
        progress=progress,
        client=client,
        check_finite=check_finite,
        devices=devices,
    )
    for res in results:
        lo = bounds[res.index][0]
        for name, arr in res.items():
            if name in direct:
                continue
            arr = arr if isinstance(arr, np.ndarray) else plan.backend.to_host(arr)
            axis = layout.output_axes[name]
            if name not in full:
                shape = list(arr.shape)
                shape[axis] = n
                full[name] = np.empty(shape, arr.dtype)
            _slice(full[name], axis, lo, lo + arr.shape[axis])[...] = arr
    return full


__all__ = ["run_batched", "run_batches"]
