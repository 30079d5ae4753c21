"""The format of fused nodes: an elementwise expression program with an optional tail.

A FUSED node computes, over one iteration space (the broadcast of its inputs' shapes), a short
program of elementwise ops from the op table (plus ``where``), and optionally ends in a tail:
a reduction over some axes (sum, mean, max, min, prod, logsumexp) or a row op over one axis
(softmax, log_softmax, layer_norm; layer_norm's epsilon is the body's ``eps``). A row-op tail
may be followed by an elementwise *epilogue*: a second program applied to every element of the
row op's result before it is stored (an affine ``y * gamma + beta``, a residual add, an
activation). Every backend renders this one format: numpy evaluates it with in-place ufuncs over
blocks, numba and CUDA render it to source text, PTX emits it instruction by instruction.

With a row-op tail the prologue program may be empty: the row op then reads input 0 itself
(a row op over a graph input, followed by its epilogue).

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
#   ("tail", 0)    in an epilogue only: the row op's result at this point
Ref = tuple[str, Any]


@dataclass(frozen=True)
class FusedOp:
    """One instruction: an op of the elementwise table over refs."""

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
    # row-op tails only: instructions over ("tail", 0), inputs, constants and earlier epilogue
    # results ("tmp", j indexes the epilogue); the last one's value is stored
    epilogue: tuple[FusedOp, ...] = ()

    @property
    def result(self) -> Ref:
        """The ref the tail reads: the prologue's last value, or input 0 for an empty one."""
        return ("tmp", len(self.instrs) - 1) if self.instrs else ("in", 0)

    def epilogue_inputs(self) -> set[int]:
        """Input positions the epilogue reads."""
        return {v for ins in self.epilogue for kind, v in ins.args if kind == "in"}

    def prologue_inputs(self) -> set[int]:
        """Input positions the prologue (or, when it is empty, the tail) reads."""
        if not self.instrs:
            return {0}
        return {v for ins in self.instrs for kind, v in ins.args if kind == "in"}

    def to_args(self) -> dict:
        """Plain, JSON-able form for node args (``eps`` only with a layer_norm tail,
        ``epilogue`` only when there is one, so older bodies keep their exact form)."""
        args = {
            "instrs": [[i.op, [list(r) for r in i.args]] for i in self.instrs],
            "space": list(self.space),
            "tail": self.tail,
            "axes": list(self.axes),
            "keepdims": self.keepdims,
        }
        if ops.takes_eps(self.tail):
            args["eps"] = float(self.eps)
        if self.epilogue:
            args["epilogue"] = [[i.op, [list(r) for r in i.args]] for i in self.epilogue]
        return args

    @staticmethod
    def from_args(a: Mapping) -> "FusedBody":
        """Inverse of ``to_args`` (accepts the frozen tuples a Node stores)."""

        def prog(items) -> tuple[FusedOp, ...]:
            return tuple(FusedOp(op, tuple((r[0], r[1]) for r in refs)) for op, refs in items)

        return FusedBody(
            prog(a["instrs"]),
            tuple(a["space"]),
            a["tail"],
            tuple(a["axes"]),
            bool(a["keepdims"]),
            float(a.get("eps", ops.LAYER_NORM_EPS)),
            prog(a.get("epilogue", ())),
        )

    def flops_per_element(self) -> int:
        """Elementwise FLOPs per point of the iteration space (prologue and epilogue)."""
        return sum(ops.ELEMENTWISE[i.op].flops for i in self.instrs + self.epilogue)

    def validate(self, n_inputs: int, where: str = "fused node") -> None:
        """Check refs and op names; raise GraphError naming the bad instruction."""
        if not self.instrs and not (self.tail in ops.ROW_OPS and n_inputs >= 1):
            raise GraphError(
                f"{where}: empty program (allowed only before a row-op tail that reads input 0)"
            )
        if self.epilogue and self.tail not in ops.ROW_OPS:
            raise GraphError(
                f"{where}: an epilogue needs a row-op tail {ops.ROW_OPS}, got {self.tail!r}"
            )
        _check_program(self.instrs, n_inputs, False, where, "instruction")
        _check_program(self.epilogue, n_inputs, True, where, "epilogue instruction")
        tails = ops.REDUCTIONS + ops.ROW_OPS  # read at call time: the table is the source
        if self.tail is not None and self.tail not in tails:
            raise GraphError(f"{where}: unknown tail {self.tail!r}; expected one of {tails}")
        if ops.takes_eps(self.tail) and not (math.isfinite(self.eps) and self.eps >= 0):
            raise GraphError(f"{where}: {self.tail} eps must be finite and >= 0, got {self.eps!r}")


def _check_program(
    instrs: tuple[FusedOp, ...], n_inputs: int, epilogue: bool, where: str, what: str
) -> None:
    """Op names, arities and refs of one program; ("tail", 0) only in an epilogue."""
    for j, ins in enumerate(instrs):
        arity = ops.ELEMENTWISE[ins.op].arity if ins.op in ops.ELEMENTWISE else None
        if arity is None:
            raise GraphError(f"{where}: {what} {j} has unknown op {ins.op!r}")
        if len(ins.args) != arity:
            raise GraphError(
                f"{where}: {what} {j} ({ins.op}) takes {arity} args, got {len(ins.args)}"
            )
        for kind, v in ins.args:
            ok = (
                (kind == "in" and 0 <= v < n_inputs)
                or (kind == "tmp" and 0 <= v < j)
                or (kind == "const" and isinstance(v, (int, float)))
                or (epilogue and kind == "tail" and v == 0)
            )
            if not ok:
                raise GraphError(f"{where}: {what} {j} ({ins.op}) has a bad ref {(kind, v)!r}")
