"""Build the graph of a derivative formula from the op table's VJP column.

A formula is text such as ``"y * one_minus(y)"``: names of the operands and the result, numbers,
``+ - * /`` and calls of elementwise ops. It is read with ``ast.parse`` (never evaluated) and
turned into builder calls on the graph, so a derivative uses the same ops as everything else.
"""

from __future__ import annotations

import ast
import functools
from typing import Mapping

from ..dtypes import promote
from ..errors import GradError
from ..ir import ops
from ..ir.graph import EinsumGraph, Tensor
from .tools import inexact, scalar

_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow"}


@functools.lru_cache(maxsize=None)
def _parse(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


# A formula compiled once into straight-line code: each instruction is (op, args), an arg is
# ("name", n), ("num", v) or ("val", k) for the value of instruction k. Subexpressions written
# twice are one instruction.
Program = tuple[tuple[str, tuple[tuple[str, object], ...]], ...]


@functools.lru_cache(maxsize=None)
def _compile(text: str) -> tuple[Program, tuple[str, object]]:
    code: list[tuple[str, tuple]] = []
    seen: dict[tuple, int] = {}

    def emit(op: str, args: tuple) -> tuple[str, object]:
        key = (op, args)
        if key not in seen:
            seen[key] = len(code)
            code.append(key)
        return ("val", seen[key])

    def walk(node: ast.expr) -> tuple[str, object]:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool)
        ):
            return ("num", float(node.value))
        if isinstance(node, ast.Name):
            return ("name", node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = walk(node.operand)
            return ("num", -v[1]) if v[0] == "num" else emit("neg", (v,))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = walk(node.left), walk(node.right)
            if a[0] == "num" and b[0] == "num":
                raise GradError(
                    f"derivative formula {text!r}: a constant subexpression; write the number"
                )
            return emit(_BINOPS[type(node.op)], (a, b))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            fn, args = node.func.id, tuple(walk(a) for a in node.args)
            op = ops.ELEMENTWISE.get(fn)
            if (fn == "where" and len(args) == 3) or (op is not None and op.arity == len(args)):
                return emit(fn, args)
        raise GradError(
            f"derivative formula {text!r}: cannot read {ast.dump(node)}; expected "
            "numbers, names, + - * / and calls of elementwise ops"
        )

    result = walk(_parse(text))
    return tuple(code), result


def constant_value(text: str) -> float | None:
    """The number a formula is, when it is a plain number ("1", "-1", "0"), else None."""
    _, result = _compile(text)
    return result[1] if result[0] == "num" else None  # type: ignore[return-value]


def build(g: EinsumGraph, text: str, names: Mapping[str, Tensor]) -> Tensor | float:
    """The value of formula ``text`` with ``names`` bound to tensors of ``g``; numbers become
    constants of the operands' dtype, shared across the graph."""
    code, result = _compile(text)
    vals: list[Tensor | float] = []

    def get(ref: tuple[str, object]) -> Tensor | float:
        kind, v = ref
        if kind == "num":
            return v  # type: ignore[return-value]
        if kind == "val":
            return vals[v]  # type: ignore[index]
        if v not in names:
            raise GradError(
                f"derivative formula {text!r} names {v!r}; expected one of {sorted(names)}"
            )
        return names[v]  # type: ignore[index]

    for op, args in code:
        xs = [get(a) for a in args]
        if op == "where":
            vals.append(g.where(*xs))
        elif len(xs) == 1:
            vals.append(g.unary(op, xs[0]))
        else:
            a, b = xs
            r = g.binary(op, _operand(g, a, b), _operand(g, b, a))
            if op in ops.COMPARISONS:
                # a comparison is bool (numpy's); a derivative uses it as 1/0 in its operands'
                # dtype, so that 0.5 * eq(a, b) stays in that dtype
                dts = [t.dtype for t in (a, b) if isinstance(t, Tensor)]
                r = g.cast(r, promote(*dts))
            vals.append(r)
    return get(result)


def _operand(g: EinsumGraph, v: Tensor | float, like: Tensor | float) -> Tensor | float:
    """A number next to a float tensor becomes a shared constant of the tensor's dtype."""
    if isinstance(v, float) and isinstance(like, Tensor) and inexact(like.dtype):
        return scalar(g, v, like.dtype)
    return v  # a Python number stays weak (NEP 50) next to an integer tensor
