"""An independent interpreter of EinsumGraphs on plain numpy.

It shares no code with the compiler or the backends: einsums go straight to ``numpy.einsum`` on
the spec as the user wrote it, every other op is the textbook numpy expression, computed in
float64 and rounded to the node's dtype. It checks the numpy backend itself, which every other
backend is compared with.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..ir import attention as attn_ir
from ..ir import ops
from ..ir.spec import np_einsum


def _gelu_grad(x: np.ndarray) -> np.ndarray:
    # d/dx of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), by the product rule
    c = np.sqrt(2.0 / np.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t**2) * c * (1.0 + 3 * 0.044715 * x**2)


_UNARY = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "square": np.square,
    "reciprocal": lambda x: 1.0 / x,
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "softplus": lambda x: np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3))),
    "gelu_grad": lambda x: _gelu_grad(x),
    "step": lambda x: (x > 0).astype(x.dtype),
    "one_minus": lambda x: 1.0 - x,
}
BINARY_UFUNCS = {  # numpy's function for each binary op (also the tests' oracle)
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "gt": np.greater,
    "ge": np.greater_equal,
    "lt": np.less,
    "le": np.less_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}
# every elementwise op of the table, written independently of it
_ELEMENTWISE = {**_UNARY, **BINARY_UFUNCS, "where": lambda c, a, b: np.where(c != 0, a, b)}


def _reduce(op: str, x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    if op == "logsumexp":
        m = x.max(axis=axes, keepdims=True)
        r = np.log(np.exp(x - m).sum(axis=axes, keepdims=True)) + m
        return r if keepdims else np.squeeze(r, axis=axes)
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[op]
    return fn(x, axis=axes, keepdims=keepdims)


def _rowop(op: str, x: np.ndarray, axis: int, eps: float = 0.0) -> np.ndarray:
    if op == "layer_norm":
        mu = x.mean(axis=axis, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=axis, keepdims=True) + eps)
    z = x - x.max(axis=axis, keepdims=True)
    if op == "softmax":
        ez = np.exp(z)
        return ez / ez.sum(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def _rowgrad(op: str, xs: list[np.ndarray], axis: int, eps: float) -> np.ndarray:
    """A row op's backward as the cotangent times the row op's explicit Jacobian (rows of n
    elements, an n x n matrix per row): written apart from the op table's row programs."""
    a, g = (np.moveaxis(x, axis, -1) for x in xs)
    n = a.shape[-1]
    eye = np.eye(n)
    if op == "layer_norm":  # a is the input: dy_i/dx_j = r (d_ij - 1/n) - c_i c_j r^3 / n
        c = a - a.mean(axis=-1, keepdims=True)
        r = 1.0 / np.sqrt((c**2).mean(axis=-1, keepdims=True) + eps)
        jac = r[..., None] * (eye - 1.0 / n) - (c[..., :, None] * c[..., None, :]) * (
            r[..., None] ** 3 / n
        )
    else:  # a is the result: softmax dy_i/dx_j = y_i (d_ij - y_j); log_softmax d_ij - e^y_j
        y = np.exp(a) if op == "log_softmax" else a
        jac = eye - y[..., None, :]
        if op == "softmax":
            jac = y[..., :, None] * jac
    return np.moveaxis(np.einsum("...i,...ij->...j", g, jac), -1, axis)


def _attention(xs: list[np.ndarray], scale: float, causal: bool) -> np.ndarray:
    q, k, v = xs[:3]
    s = np.einsum("...qd,...kd->...qk", q, k) * scale
    if len(xs) == 4:
        s = s + xs[3]
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None], -np.inf, s)
    return _rowop("softmax", s, -1) @ v


def evaluate(
    graph,
    inputs: Mapping[str, np.ndarray],
    binding: Mapping[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """Outputs of ``graph`` on ``inputs``, computed in float64 by plain numpy.

    ``binding`` gives sizes of symbolic dimensions used by reshape targets.
    """
    binding = dict(binding or {})
    env: dict[int, np.ndarray] = {}
    for node in graph.nodes:
        kind, op, a = node.kind, node.op, node.args
        xs = [env[i] for i in node.inputs]
        if kind == ops.INPUT:
            r = np.asarray(inputs[node.name], dtype=np.float64)
        elif kind == ops.CONSTANT:
            r = np.asarray(graph.constants[node.id], dtype=np.float64)
        elif kind == ops.PARAMETER:  # the given value, else the graph's
            r = np.asarray(inputs.get(node.name, graph.parameter_values[node.id]), dtype=np.float64)
        elif kind == ops.EINSUM:
            r = np_einsum(a["spec"], *xs)
        elif kind in ops.ELEMENTWISE_KINDS:
            r = _ELEMENTWISE[op](*xs)
        elif kind == ops.REDUCE:
            r = _reduce(op, xs[0], tuple(a["axes"]), bool(a.get("keepdims")))
        elif kind == ops.ROWOP:
            r = _rowop(op, xs[0], a["axis"], float(a.get("eps", 0.0)))
        elif kind == ops.ROWGRAD:
            r = _rowgrad(op, xs, int(a["axis"]), float(a.get("eps", 0.0)))
        elif kind == ops.TRANSPOSE:
            r = np.transpose(xs[0], tuple(a["perm"]))
        elif kind == ops.RESHAPE:
            r = np.reshape(
                xs[0], tuple(binding.get(d, d) if isinstance(d, str) else d for d in a["shape"])
            )
        elif kind == ops.CAST:
            r = xs[0]
        elif kind == ops.ATTENTION:
            r = _attention(attn_ir.canonical_views(xs, a), float(a["scale"]), bool(a["causal"]))
            r = attn_ir.laid_out(r, a)
        else:
            raise ValueError(f"the reference interpreter has no rule for node kind {kind!r}")
        # round to the node's dtype as the backends do, then carry on in float64
        env[node.id] = np.asarray(np.asarray(r).astype(node.dtype), dtype=np.float64)
    return {name: env[nid] for name, nid in graph.outputs.items()}
