"""Build the graph of a derivative formula from the op table's VJP column.

A formula is text such as ``"y * one_minus(y)"``: names of the operands and the result, numbers,
``+ - * /`` and calls of elementwise ops. It is read with ``ast.parse`` (never evaluated) and
turned into builder calls on the graph, so a derivative uses the same ops as everything else.
"""

from __future__ import annotations

import ast
import functools
from typing import Mapping

from ..errors import GradError
from ..ir import ops
from ..ir.graph import EinsumGraph, Tensor

_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow"}


@functools.lru_cache(maxsize=None)
def _parse(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


def constant_value(text: str) -> float | None:
    """The number a formula is, when it is a plain number ("1", "-1", "0"), else None."""
    node = _parse(text)
    sign = 1.0
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        sign, node = -1.0, node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return sign * float(node.value)
    return None


def build(g: EinsumGraph, text: str, names: Mapping[str, Tensor]) -> Tensor | float:
    """The value of formula ``text`` with ``names`` bound to tensors of ``g``."""

    def walk(node: ast.expr) -> Tensor | float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = walk(node.operand)
            return -v if isinstance(v, float) else g.unary("neg", v)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = walk(node.left), walk(node.right)
            if isinstance(a, float) and isinstance(b, float):
                raise GradError(f"derivative formula {text!r}: a constant subexpression; "
                                "write the number")
            return g.binary(_BINOPS[type(node.op)], a, b)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            fn, args = node.func.id, [walk(a) for a in node.args]
            if fn == "where" and len(args) == 3:
                return g.where(*args)
            op = ops.ELEMENTWISE.get(fn)
            if op is not None and op.arity == len(args):
                return g.unary(fn, args[0]) if op.arity == 1 else g.binary(fn, *args)
        raise GradError(f"derivative formula {text!r}: cannot read {ast.dump(node)}; expected "
                        f"numbers, {sorted(names)}, + - * / and calls of elementwise ops")

    return walk(_parse(text))
