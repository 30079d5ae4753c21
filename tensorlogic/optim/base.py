"""The optimizer base: binds gradients to a plan's parameters, keeps per-parameter state on the
plan's backend, and saves and restores that state (checkpoints)."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ..errors import DTypeError, InputError, ShapeError


def check_number(
    name: str,
    value: Any,
    low: float = 0.0,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a float, or InputError naming the hyperparameter and its allowed range."""
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    v = float(value) if ok else math.nan
    if (
        not ok
        or not math.isfinite(v)
        or v < low
        or v > high
        or (low_open and v == low)
        or (high_open and v == high)
    ):
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise InputError(f"{name} must be a finite number in {lo}{low}, {high}{hi}, got {value!r}")
    return v


class Optimizer:
    """Updates a plan's parameters in place from their gradients, one fused kernel per update.

    ``step(plan, grads)``: ``grads`` maps a parameter name (or ``grad_<name>``, the output names
    ``tl.grad`` gives; other names such as the loss are ignored) to its gradient. A parameter
    without a gradient is left as it is. State (moments, momentum buffers) is created on the
    first step, on the plan's backend, with the parameter's shape and dtype.
    """

    #: names of the per-parameter state tensors, in the order ``_update`` takes them
    state_names: tuple[str, ...] = ()

    def __init__(self, lr: float, weight_decay: float = 0.0) -> None:
        self.lr = check_number("lr", lr, low_open=True)
        self.weight_decay = check_number("weight_decay", weight_decay)
        self.steps = 0  # updates applied so far
        self.state: dict[str, dict[str, Any]] = {}  # parameter -> state name -> array

    # ------------------------------------------------------------------ stepping
    def step(self, plan: Any, grads: Mapping[str, Any]) -> None:
        """Apply one update to ``plan.parameters`` in place."""
        from ..compiler.plan import CompiledPlan

        if not isinstance(plan, CompiledPlan):
            raise InputError(
                f"{type(self).__name__}.step: expected a CompiledPlan, got {type(plan).__name__}"
            )
        if not isinstance(grads, Mapping):
            raise InputError(
                f"{type(self).__name__}.step: grads must be a dict of name -> "
                f"array, got {type(grads).__name__}"
            )
        params = plan.parameters
        pairs = self._pairs(params, grads, plan.backend)
        self.steps += 1
        for name, (p, g) in pairs.items():
            st = self.state.get(name)
            fresh = st is None
            if fresh:
                st = self.state[name] = {
                    k: self._initial_state(k, p, plan.backend) for k in self.state_names
                }
            self._update(p, g, st, plan.backend, fresh)

    def _pairs(
        self, params: Mapping[str, Any], grads: Mapping[str, Any], backend: Any
    ) -> dict[str, tuple[Any, Any]]:
        """(parameter, gradient) by name, every gradient checked before anything changes."""
        pairs = {}
        for name, p in params.items():
            g = grads.get(name, grads.get(f"grad_{name}"))
            if g is None:
                continue
            where = f"gradient of parameter {name!r}"
            if not backend.is_array(g):
                if not isinstance(g, np.ndarray):
                    raise InputError(f"{where}: expected an array, got {type(g).__name__}")
                g = backend.to_device(g)
            if tuple(g.shape) != tuple(p.shape):
                raise ShapeError(
                    f"{where}: shape {tuple(g.shape)}; expected the parameter's {tuple(p.shape)}"
                )
            if g.dtype != p.dtype:
                raise DTypeError(f"{where}: dtype {g.dtype}; expected the parameter's {p.dtype}")
            pairs[name] = (p, g)
        if not pairs:
            raise InputError(
                f"{type(self).__name__}.step: no gradient for any parameter; "
                f"expected names among {list(params)} or grad_<name>, got "
                f"{list(grads)}"
            )
        return pairs

    def _initial_state(self, key: str, p: Any, backend: Any) -> Any:
        z = backend.empty(tuple(p.shape), np.dtype(p.dtype).name)
        z[...] = 0
        return z

    def _update(self, p: Any, g: Any, state: dict[str, Any], backend: Any, fresh: bool) -> None:
        """Update ``p`` (and ``state``) in place; ``fresh``: the state was just created."""
        raise NotImplementedError

    # ------------------------------------------------------------------ checkpoints
    def hyperparameters(self) -> dict[str, Any]:
        """The settings that define the update (saved with the state, for the record)."""
        return {"lr": self.lr, "weight_decay": self.weight_decay}

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state as plain data: hyperparameters, step count, and host copies
        of every state tensor (``"<state>/<parameter>"``)."""
        tensors = {}
        for pname, st in self.state.items():
            for key, arr in st.items():
                tensors[f"{key}/{pname}"] = _host(arr)
        return {
            "type": type(self).__name__,
            "hyperparameters": self.hyperparameters(),
            "steps": self.steps,
            "tensors": tensors,
        }

    def load_state_dict(self, state: Mapping[str, Any], plan: Any) -> None:
        """Restore ``state_dict()`` output onto ``plan``'s backend (checked before any change)."""
        where = f"{type(self).__name__} state"
        if not isinstance(state, Mapping) or state.get("type") != type(self).__name__:
            got = state.get("type") if isinstance(state, Mapping) else type(state).__name__
            raise InputError(f"{where}: expected the state of a {type(self).__name__}, got {got}")
        steps = state.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise InputError(f"{where}: 'steps' must be an int >= 0, got {steps!r}")
        tensors = state.get("tensors")
        if not isinstance(tensors, Mapping):
            raise InputError(f"{where}: 'tensors' must be a dict")
        params = plan.parameters
        new: dict[str, dict[str, Any]] = {}
        for full, arr in tensors.items():
            key, _, pname = str(full).partition("/")
            if key not in self.state_names or pname not in params:
                raise InputError(
                    f"{where}: unexpected tensor {full!r}; expected "
                    f"<{'|'.join(self.state_names)}>/<parameter of the plan>"
                )
            p = params[pname]
            arr = np.asarray(arr)
            if arr.shape != tuple(p.shape) or arr.dtype != np.dtype(p.dtype):
                raise ShapeError(
                    f"{where}: {full!r} is {arr.dtype}{list(arr.shape)}; expected "
                    f"{np.dtype(p.dtype)}{list(p.shape)} like parameter {pname!r}"
                )
            new.setdefault(pname, {})[key] = plan.backend.to_device(np.array(arr))
        for pname, st in new.items():
            if set(st) != set(self.state_names):
                raise InputError(
                    f"{where}: parameter {pname!r} has state {sorted(st)}; "
                    f"expected {sorted(self.state_names)}"
                )
        self.state = new
        self.steps = int(steps)


def _host(arr: Any) -> np.ndarray:
    return np.array(arr.get() if hasattr(arr, "get") else arr)


__all__ = ["Optimizer", "check_number"]
