"""What ``EinsumGraph.add_node`` accepts: the arity and the typed arguments of each node kind.

The builder methods (``g.einsum``, ``g.sum``, ...) always pass well-formed records; ``add_node`` is
also reached directly (by users, by loaded graph files), so it checks the record itself, before
shape inference reads it: no argument is coerced, none is dropped silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import GraphError
from . import attention, ops

# number of inputs of each kind; None: one or more
# (elementwise kinds: the arity of their ops in the op table)
ARITY: dict[str, int | None] = {
    ops.EINSUM: None,
    **{k: a for a, k in ops.KIND_OF_ARITY.items()},
    ops.REDUCE: 1,
    ops.ROWOP: 1,
    ops.ROWGRAD: None,  # the row op's operands (ops.ROW_GRAD_OPERANDS), checked by infer
    ops.TRANSPOSE: 1,
    ops.RESHAPE: 1,
    ops.CAST: 1,
    ops.FUSED: None,
    ops.ATTENTION: None,
}
# kinds whose nodes name an op of the op table
OP_KINDS = (*ops.ELEMENTWISE_KINDS, ops.REDUCE, ops.ROWOP, ops.ROWGRAD)
# (required, optional) arguments of each kind
ARGS: dict[str, tuple[frozenset, frozenset]] = {
    ops.EINSUM: (frozenset({"spec"}), frozenset()),
    ops.REDUCE: (frozenset({"axes"}), frozenset({"keepdims"})),
    ops.ROWOP: (frozenset({"axis"}), frozenset({"eps"})),
    ops.ROWGRAD: (frozenset({"axis"}), frozenset({"eps"})),
    ops.TRANSPOSE: (frozenset({"perm"}), frozenset()),
    ops.RESHAPE: (frozenset({"shape"}), frozenset()),
    ops.CAST: (frozenset({"dtype"}), frozenset()),
    ops.FUSED: (frozenset({"body"}), frozenset({"flops"})),  # flops: the cost, for display
}


def is_int(v: Any) -> bool:
    """An integer that is not a bool (numpy integers included)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def int_list(values: Any, what: str, where: str) -> list[int]:
    """A sequence of integers as a list of ints; anything else (bools, floats) is refused."""
    if isinstance(values, np.ndarray) and values.ndim == 1:
        values = values.tolist()
    if not isinstance(values, (list, tuple)) or not all(is_int(v) for v in values):
        raise GraphError(f"{where}: {what} must be a sequence of integers, got {values!r}")
    return [int(v) for v in values]


def check(
    kind: str, op: str | None, inputs: Sequence[int], args: Mapping[str, Any], where: str
) -> None:
    """Raise GraphError unless (kind, op, inputs, args) is a well-formed record."""
    if kind not in ARITY:
        raise GraphError(f"{where}: unknown node kind {kind!r}; expected one of {sorted(ARITY)}")
    if kind == ops.ATTENTION:  # q, k, v and an optional additive mask
        if len(inputs) not in (3, 4):
            raise GraphError(
                f"{where}: an attention node takes q, k, v and an optional mask "
                f"(3 or 4 inputs), got {len(inputs)}"
            )
        if op is not None:
            raise GraphError(f"{where}: an attention node takes no op, got {op!r}")
        attention.check_args(args, where)
        return
    n = ARITY[kind]
    if n is None and not inputs:
        raise GraphError(f"{where}: a {kind} node needs at least one input, got none")
    if n is not None and len(inputs) != n:
        raise GraphError(f"{where}: a {kind} node takes {n} input(s), got {len(inputs)}")
    if kind in OP_KINDS:
        if not isinstance(op, str):
            raise GraphError(f"{where}: a {kind} node needs an op name, got {op!r}")
    elif op is not None and kind != ops.FUSED:
        raise GraphError(f"{where}: a {kind} node takes no op, got {op!r}")
    required, optional = ARGS.get(kind, (frozenset(), frozenset()))
    unknown = set(args) - required - optional
    if unknown:
        raise GraphError(
            f"{where}: unknown argument(s) {sorted(map(str, unknown))} for a {kind} "
            f"node; expected {sorted(required | optional)}"
        )
    missing = required - set(args)
    if missing:
        raise GraphError(f"{where}: missing argument(s) {sorted(missing)} for a {kind} node")
    _check_types(kind, args, where)


def _check_types(kind: str, args: Mapping[str, Any], where: str) -> None:
    # an einsum spec is checked by the spec parser (SpecError)
    if kind == ops.REDUCE:
        int_list(args["axes"], "axes", where)
        if not isinstance(args.get("keepdims", False), (bool, np.bool_)):
            raise GraphError(f"{where}: keepdims must be True or False, got {args['keepdims']!r}")
    if kind in (ops.ROWOP, ops.ROWGRAD) and not is_int(args["axis"]):
        raise GraphError(f"{where}: axis must be an integer, got {args['axis']!r}")
    if kind == ops.TRANSPOSE:
        int_list(args["perm"], "perm", where)
    if kind == ops.RESHAPE:
        shape = args["shape"]
        if not isinstance(shape, (list, tuple)) or not all(
            is_int(d) or (isinstance(d, str) and d.isidentifier()) for d in shape
        ):
            raise GraphError(
                f"{where}: reshape target must be a sequence of integers or symbol "
                f"names, got {shape!r}"
            )
    if kind == ops.CAST and not isinstance(args["dtype"], str):
        raise GraphError(f"{where}: cast dtype must be a dtype name, got {args['dtype']!r}")
