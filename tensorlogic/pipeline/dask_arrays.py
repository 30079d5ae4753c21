"""run_batched on dask arrays: each batch is computed where its chunk of the input lives.

The inputs' chunks along the batch dimension are the batches (rechunked to ``batch_size`` when
it is given); one task per batch runs the plan and the outputs are dask arrays of the per-batch
results, so nothing passes through the client unless the caller computes it there. Inputs
without the batch dimension become one block that every batch task depends on.

With a distributed client the plan travels once per worker: its payload (pipeline/dask.py) is
a worker plugin registered under the plan's content key, which every worker (also one that
joins or restarts later) receives once; a worker compiles it on first use. The tasks name the
plan by its key only, so their one dependency is their input chunk and the scheduler runs each
on the worker that holds it (a plan held as task data would make every worker a candidate and
let load balancing move chunks). Without a client the tasks run this process's plan on dask's
local scheduler.
"""

from __future__ import annotations

import sys
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InputError
from .layout import BatchLayout

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def is_dask_array(x: Any) -> bool:
    """True for a ``dask.array.Array`` (checked without importing dask)."""
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(x, da.Array)


def _default_client() -> Any:
    try:
        from distributed import default_client
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:
        return None


def _check_inputs(plan: Any, layout: BatchLayout, inputs: Mapping[str, Any]) -> dict[str, int]:
    """Dtypes and fixed dimensions against the graph, before any task runs; the symbol sizes."""
    missing = [n for n in plan.graph.inputs if n not in inputs]
    extra = [n for n in inputs if n not in plan.graph.inputs]
    if missing or extra:
        raise InputError(
            f"missing input(s) {missing}, unknown input(s) {extra}; the plan "
            f"expects {list(plan.graph.inputs)}"
        )
    sizes: dict[str, int] = {}
    for name, nid in plan.graph.inputs.items():
        node, x = plan.graph.node(nid), inputs[name]
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is None or dtype is None:
            raise InputError(
                f"input {name!r}: expected a dask or numpy array, got {type(x).__name__}"
            )
        if any(isinstance(d, float) and np.isnan(d) for d in shape):
            raise InputError(
                f"input {name!r}: its shape {shape} has unknown sizes; call "
                ".compute_chunk_sizes() on it first"
            )
        if np.dtype(dtype) != np.dtype(node.dtype):
            raise InputError(
                f"input {name!r}: dtype {dtype} but the graph declares "
                f"{node.dtype}; convert it with .astype('{node.dtype}')"
            )
        if len(shape) != len(node.shape):
            raise InputError(
                f"input {name!r}: shape {tuple(shape)} has rank {len(shape)} but "
                f"the graph declares {tuple(node.shape)}"
            )
        for k, (want, got) in enumerate(zip(node.shape, shape)):
            if isinstance(want, str):
                if sizes.setdefault(want, int(got)) != int(got):
                    raise InputError(
                        f"input {name!r}: dimension {k} is {got} but symbol "
                        f"{want!r} is {sizes[want]} in another input"
                    )
            elif want != got:
                raise InputError(
                    f"input {name!r}: shape {tuple(shape)} but the graph declares "
                    f"{tuple(node.shape)} (dimension {k}: expected {want})"
                )
    return sizes


def _batch_chunks(
    layout: BatchLayout, inputs: Mapping[str, Any], n: int, batch_size: int | None
) -> tuple[int, ...]:
    """Items per batch: ``batch_size`` if given, else the first dask input's own chunks."""
    if batch_size is not None:
        return tuple(min(batch_size, n - lo) for lo in range(0, n, batch_size)) or (0,)
    for name, axis in layout.input_axes.items():
        if is_dask_array(inputs[name]):
            return tuple(int(c) for c in inputs[name].chunks[axis])
    return (n,)


_REGISTERED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_REGISTERED_LOCK = threading.Lock()


def _ship_plan(plan: Any, client: Any) -> str:
    """Register ``plan`` with ``client``'s cluster (once per client); its content key."""
    from .dask import plan_payload
    from .dask_plugin import PlanPlugin

    key, payload = plan_payload(plan)
    with _REGISTERED_LOCK:
        done = _REGISTERED.setdefault(client, set())
        if key not in done:
            plugin = PlanPlugin(key, payload)
            client.register_plugin(plugin, name=plugin.name)
            done.add(key)
    return key


def _run_block(
    plan: Any, key: str, names: tuple[str, ...], check_finite: bool, *blocks: Any
) -> dict[str, Any]:
    if plan is None:  # on a worker: the plan its plugin installed, compiled once
        from .dask import worker_plan
        from .dask_plugin import PAYLOADS

        plan = worker_plan(key, PAYLOADS[key])
    named = dict(zip(names, blocks))
    batched = _batched(plan, named)
    pieces = _lane_pieces(plan, batched)
    if pieces > 1:
        from .batches import run_batched

        rows = max(int(x.shape[a]) for x, a in batched)
        size = -(-rows // pieces)
        return run_batched(plan, named, size, progress=False, check_finite=check_finite)
    return plan(named, check_finite=check_finite, to_host=True)


# a GPU worker runs a large chunk as a lane of this many sub-batches: uploads, kernels and
# downloads overlap through pinned staging, where one plain call copies in, computes and copies
# out one after the other through pageable memory
LANE_PIECES = 4


def _batched(plan: Any, named: Mapping[str, Any]) -> list[tuple[Any, int]]:
    """(array, batch axis) of the inputs that carry the batch dimension."""
    from .layout import batch_layout

    axes = batch_layout(plan).input_axes
    return [(x, axes[k]) for k, x in named.items() if k in axes]


def _lane_pieces(plan: Any, batched: list[tuple[Any, int]]) -> int:
    """Sub-batches for one chunk on a worker: LANE_PIECES on a GPU backend when each piece
    still moves enough bytes to be worth a copy overlap (schedule.SPLIT_MIN_BYTES), else 1."""
    from .devices import multi_device
    from .schedule import SPLIT_MIN_BYTES

    if not multi_device(plan.backend):
        return 1
    moved = sum(int(getattr(x, "nbytes", 0)) for x, _ in batched)
    return LANE_PIECES if moved >= LANE_PIECES * SPLIT_MIN_BYTES else 1


def _pick(results: dict[str, Any], name: str) -> Any:
    return results[name]


def run_dask_arrays(
    plan: Any,
    layout: BatchLayout,
    inputs: Mapping[str, Any],
    batch_size: int | None,
    *,
    client: Any,
    check_finite: bool,
    store: Any,
) -> dict[str, Any]:
    """run_batched for inputs of which at least one is a dask array (see the module doc)."""
    import dask
    import dask.array as da

    sizes = _check_inputs(plan, layout, inputs)
    n = sizes[layout.symbol]
    chunks = _batch_chunks(layout, inputs, n, batch_size)
    try:
        bound = plan.graph.bind(sizes)
    except Exception as exc:
        raise InputError(f"the inputs do not fit the graph: {exc}") from exc
    if client is None:
        client = _default_client()
    if client is None:
        src, key = plan, f"local-{uuid.uuid4().hex[:12]}"
    else:
        src, key = None, _ship_plan(plan, client)

    names = tuple(plan.graph.inputs)
    args: list[Any] = [src, None, key, None, names, None, bool(check_finite), None]
    spare = iter(_LETTERS[1:])  # "a" is the batch axis
    for name in names:
        x, axis = inputs[name], layout.input_axes.get(name)
        ind = "".join("a" if k == axis else next(spare) for k in range(len(x.shape)))
        want = tuple(chunks if k == axis else (int(d),) for k, d in enumerate(x.shape))
        x = x.rechunk(want) if is_dask_array(x) else da.from_array(x, chunks=want)
        args += [x, ind]
    token = dask.base.tokenize(key, [a.name for a in args[8::2]], chunks, check_finite)
    per_batch = da.blockwise(
        _run_block,
        "a",
        *args,
        dtype=object,
        concatenate=True,
        meta=np.empty((0,), object),
        name=f"tensorlogic-run-{token}",
    )

    outputs: dict[str, Any] = {}
    for name, nid in bound.outputs.items():
        node, axis = bound.node(nid), layout.output_axes[name]
        letters = iter(_LETTERS[1:])
        ind, new_axes = "", {}
        for k, d in enumerate(node.shape):
            if k == axis:
                ind += "a"
            else:
                c = next(letters)
                ind += c
                new_axes[c] = int(d)
        outputs[name] = da.blockwise(
            _pick,
            ind,
            per_batch,
            "a",
            name,
            None,
            new_axes=new_axes,
            dtype=node.dtype,
            meta=np.empty((0,) * len(node.shape), node.dtype),
            name=f"tensorlogic-{name}-{token}",
        )
    if store is None:
        return outputs
    return _write_zarr(outputs, store, client)


def _write_zarr(outputs: dict[str, Any], store: Any, client: Any) -> dict[str, Any]:
    """Write every output into ``store`` (computed on the workers) and read them back lazily."""
    import dask
    import dask.array as da

    try:
        writes = [
            da.to_zarr(arr, store, component=name, overwrite=True, compute=False)
            for name, arr in outputs.items()
        ]
    except (TypeError, ValueError, OSError) as exc:
        raise InputError(f"store: cannot write zarr arrays into {store!r}: {exc}") from exc
    if client is not None:
        client.gather(client.compute(writes))
    else:
        dask.compute(*writes)
    return {name: da.from_zarr(store, component=name) for name in outputs}


__all__ = ["is_dask_array", "run_dask_arrays"]
