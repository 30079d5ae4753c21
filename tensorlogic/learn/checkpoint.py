"""Training checkpoints: parameters, optimizer state and the loop's position in one .npz.

Written atomically (a failed save leaves the previous checkpoint as it was) and read without
pickle, bounded like every file the library reads. The loop position and the loss history are a
JSON record inside the archive.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import SerializationError, TensorLogicError
from ..ir import safe_io

FORMAT = "tensorlogic-checkpoint"
VERSION = 1
_META = "__checkpoint__"


def save_checkpoint(path: Any, plan: Any, optimizer: Any, **position: Any) -> None:
    """Write the plan's parameters, the optimizer's state and ``position`` (plain data: the
    epoch, the next batch, the history) to ``path``."""
    opt = optimizer.state_dict()
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "position": position,
        "optimizer": {k: opt[k] for k in ("type", "hyperparameters", "steps")},
    }
    arrays = {f"param.{k}": _host(v) for k, v in plan.parameters.items()}
    arrays.update({"opt." + k.replace("/", "."): v for k, v in opt["tensors"].items()})
    arrays[_META] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    safe_io.write_npz(path, arrays, f"checkpoint {str(path)!r}")


def load_checkpoint(path: Any, plan: Any, optimizer: Any) -> dict[str, Any]:
    """Restore parameters and optimizer state from ``path`` onto ``plan`` and ``optimizer``;
    returns the saved position. Everything is checked before anything changes."""
    where = f"checkpoint {str(path)!r}"
    arrays = safe_io.read_npz(path, None, where)
    raw = arrays.pop(_META, None)
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
        raise SerializationError(
            f"{where}: no checkpoint record inside; expected a file "
            "written by tl.train(checkpoint=...)"
        )
    try:
        meta = json.loads(raw.tobytes())
    except ValueError as exc:
        raise SerializationError(f"{where}: the checkpoint record is not valid JSON") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise SerializationError(f"{where}: not a {FORMAT} version {VERSION} record")
    params = {k[len("param.") :]: v for k, v in arrays.items() if k.startswith("param.")}
    tensors = {
        k[len("opt.") :].replace(".", "/", 1): v for k, v in arrays.items() if k.startswith("opt.")
    }
    missing = sorted(set(plan.parameters) - set(params))
    extra = sorted(set(params) - set(plan.parameters))
    if missing or extra:
        raise SerializationError(
            f"{where}: parameters {sorted(params)} do not match the "
            f"plan's {sorted(plan.parameters)}"
        )
    opt_meta = meta.get("optimizer")
    if not isinstance(opt_meta, dict):
        raise SerializationError(f"{where}: no optimizer record")
    saved = {**opt_meta, "tensors": tensors}
    old = optimizer.state_dict()
    try:
        optimizer.load_state_dict(saved, plan)
        plan.set_parameters(params)
    except TensorLogicError as exc:
        optimizer.load_state_dict(old, plan)
        raise SerializationError(f"{where}: {exc}") from exc
    position = meta.get("position")
    return position if isinstance(position, dict) else {}


def _host(arr: Any) -> np.ndarray:
    return np.array(arr.get() if hasattr(arr, "get") else arr)


__all__ = ["load_checkpoint", "save_checkpoint"]
