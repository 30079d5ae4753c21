"""The format of fused nodes: an elementwise expression program with an optional tail.

A FUSED node computes, over one iteration space (the broadcast of its inputs' shapes), a short
program of elementwise ops from the op table (plus ``where``), and optionally ends in a tail:
a reduction over some axes (sum, mean, max, min, prod, logsumexp) or a row op over one axis
(softmax, log_softmax, layer_norm; layer_norm's epsilon is the body's ``eps``). Every backend renders this one format: numpy evaluates it with in-place
ufuncs over blocks, numba and CUDA render it to source text, PTX emits it instruction by
instruction.

Node args: ``{"body": FusedBody.to_args()}``; node inputs are the external operands in order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import GraphError
from . import ops

# A reference to a value inside the program:
#   ("in", k)      the k-th input of the fused node
#   ("tmp", j)     the result of instruction j (j < current index)
#   ("const", v)   a Python float literal
Ref = tuple[str, Any]

TAILS = ops.REDUCTIONS + ops.ROW_OPS


@dataclass(frozen=True)
class FusedOp:
    """One instruction: an op of the elementwise table (or "where") over refs."""

    op: str
    args: tuple[Ref, ...]


@dataclass(frozen=True)
class FusedBody:
    """The program of a fused node."""

    instrs: tuple[FusedOp, ...]  # the last instruction's value is the elementwise result
    space: tuple[int, ...]  # iteration space: broadcast shape of the inputs
    tail: str | None = None  # None, a reduction name, or a row op name
    axes: tuple[int, ...] = ()  # reduction axes, or (axis,) for a row op
    keepdims: bool = False
    eps: float = ops.LAYER_NORM_EPS  # read only by a layer_norm tail

    def to_args(self) -> dict:
        """Plain, JSON-able form for node args (``eps`` only with a layer_norm tail)."""
        args = {
            "instrs": [[i.op, [list(r) for r in i.args]] for i in self.instrs],
            "space": list(self.space), "tail": self.tail, "axes": list(self.axes),
            "keepdims": self.keepdims,
        }
        if self.tail == "layer_norm":
            args["eps"] = float(self.eps)
        return args

    @staticmethod
    def from_args(a: Mapping) -> "FusedBody":
        """Inverse of ``to_args`` (accepts the frozen tuples a Node stores)."""
        instrs = tuple(FusedOp(op, tuple((r[0], r[1]) for r in refs)) for op, refs in a["instrs"])
        return FusedBody(instrs, tuple(a["space"]), a["tail"], tuple(a["axes"]), bool(a["keepdims"]),
                         float(a.get("eps", ops.LAYER_NORM_EPS)))

    def flops_per_element(self) -> int:
        """Elementwise FLOPs per point of the iteration space."""
        return sum(1 if i.op == "where" else ops.ELEMENTWISE[i.op].flops for i in self.instrs)

    def validate(self, n_inputs: int, where: str = "fused node") -> None:
        """Check refs and op names; raise GraphError naming the bad instruction."""
        if not self.instrs:
            raise GraphError(f"{where}: empty program")
        for j, ins in enumerate(self.instrs):
            arity = 3 if ins.op == "where" else ops.ELEMENTWISE[ins.op].arity if ins.op in ops.ELEMENTWISE else None
            if arity is None:
                raise GraphError(f"{where}: instruction {j} has unknown op {ins.op!r}")
            if len(ins.args) != arity:
                raise GraphError(f"{where}: instruction {j} ({ins.op}) takes {arity} args, got {len(ins.args)}")
            for kind, v in ins.args:
                ok = (kind == "in" and 0 <= v < n_inputs) or (kind == "tmp" and 0 <= v < j) or (
                    kind == "const" and isinstance(v, (int, float)))
                if not ok:
                    raise GraphError(f"{where}: instruction {j} ({ins.op}) has a bad ref {(kind, v)!r}")
        if self.tail is not None and self.tail not in TAILS:
            raise GraphError(f"{where}: unknown tail {self.tail!r}; expected one of {TAILS}")
        if self.tail == "layer_norm" and not (math.isfinite(self.eps) and self.eps >= 0):
            raise GraphError(f"{where}: layer_norm eps must be finite and >= 0, got {self.eps!r}")
