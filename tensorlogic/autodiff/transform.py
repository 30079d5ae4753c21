"""tl.grad and tl.vjp: reverse-mode differentiation as a transformation of an EinsumGraph.

Like JAX's ``grad``/``vjp`` (not a tape): the result is a new graph holding the forward graph
unchanged plus the backward nodes, built with the same ops, so it is optimized, fused,
memory-planned and compiled like any graph on every backend. Forward values the backward reads
(activations, softmax results, ...) are kept: they are ordinary nodes with later users, and the
memory plan keeps each one alive until its last use in the backward part.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from ..errors import GradError
from ..ir import ops
from ..ir.graph import EinsumGraph, Tensor
from .rules import RULES
from .tools import cast_to, expand, inexact, is_complex

# node kinds a gradient may be taken with respect to: leaves that hold a value
DIFFERENTIABLE_LEAVES: tuple[str, ...] = (ops.INPUT, ops.CONSTANT, ops.PARAMETER)


def grad(graph: EinsumGraph, of: str = "loss", wrt: str | Sequence[str] = ()) -> EinsumGraph:
    """The graph extended with the gradient of a scalar output.

    Args:
        graph: the forward graph (left unchanged).
        of: name of a real scalar output (the loss).
        wrt: names of inputs or constants (float or complex) to differentiate with respect to.

    Returns a new EinsumGraph with the same inputs whose outputs are the original outputs plus
    ``grad_<name>`` for each entry of ``wrt`` (same shape and dtype as that tensor; zeros where
    the loss does not depend on it). Complex tensors get torch's gradient (dL/dRe + i dL/dIm).
    """
    node = _output_node(graph, of, "grad")
    if node.shape != ():
        raise GradError(
            f"grad: output {of!r} has shape {tuple(node.shape)}; expected a scalar "
            "(a loss). For a non-scalar output use tl.vjp with a cotangent input"
        )
    if not inexact(node.dtype) or is_complex(node.dtype):
        raise GradError(
            f"grad: output {of!r} has dtype {node.dtype}; expected a real float "
            "scalar (for a complex output use tl.vjp with a cotangent input)"
        )
    g = graph.copy()
    seed = g.constant(np.ones((), dtype=node.dtype), name=_fresh(g, f"grad_seed_{of}"))
    return _backward(g, node.id, seed, _wrt_nodes(graph, wrt, "grad"))


def vjp(graph: EinsumGraph, of: str, wrt: str | Sequence[str], cotangent: str) -> EinsumGraph:
    """The graph extended with a vector-Jacobian product of any output.

    Args:
        graph: the forward graph (left unchanged).
        of: name of a float or complex output.
        wrt: names of inputs or constants to differentiate with respect to.
        cotangent: name of a new input, of the output's shape and dtype, that the Jacobian of
            ``of`` is multiplied by (from the left).

    Returns a new EinsumGraph whose inputs are the graph's plus ``cotangent`` and whose outputs
    are the original outputs plus ``grad_<name>`` for each entry of ``wrt``: the gradient of
    ``sum(real(conj(cotangent) * of))``, torch's ``of.backward(cotangent)``.
    """
    node = _output_node(graph, of, "vjp")
    if not inexact(node.dtype):
        raise GradError(
            f"vjp: output {of!r} has dtype {node.dtype}; expected a float or complex "
            "output (integer and bool results have no gradient)"
        )
    if not isinstance(cotangent, str) or not cotangent.isidentifier():
        raise GradError(f"vjp: cotangent must name a new input (an identifier), got {cotangent!r}")
    if cotangent in graph.inputs or _has_name(graph, cotangent):
        raise GradError(f"vjp: cotangent {cotangent!r} names an existing node; pick a new name")
    wrt_nodes = _wrt_nodes(graph, wrt, "vjp")
    g = graph.copy()
    seed = g.input(cotangent, node.shape, node.dtype)
    return _backward(g, node.id, seed, wrt_nodes)


def _has_name(graph: EinsumGraph, name: str) -> bool:
    try:
        graph.node(name)
    except Exception:  # noqa: BLE001 - GraphError: no such node
        return False
    return True


def _fresh(g: EinsumGraph, base: str) -> str:
    name, k = base, 0
    while _has_name(g, name):
        k += 1
        name = f"{base}_{k}"
    return name


def _output_node(graph: EinsumGraph, of: str, fn: str):
    if not isinstance(graph, EinsumGraph):
        raise GradError(f"{fn}: expected an EinsumGraph, got {type(graph).__name__}")
    if not isinstance(of, str) or of not in graph.outputs:
        raise GradError(
            f"{fn}: of={of!r} is not an output of the graph; expected one of "
            f"{sorted(graph.outputs)}"
        )
    return graph.node(graph.outputs[of])


def _wrt_nodes(graph: EinsumGraph, wrt: str | Iterable[str], fn: str) -> list[tuple[str, int]]:
    names = [wrt] if isinstance(wrt, str) else list(wrt)
    if not names:
        raise GradError(
            f"{fn}: wrt is empty; name the inputs or constants to differentiate with respect to"
        )
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise GradError(f"{fn}: wrt entries must be node names, got {name!r}")
        if name in seen:
            raise GradError(f"{fn}: {name!r} appears twice in wrt")
        seen.add(name)
        if not _has_name(graph, name):
            raise GradError(
                f"{fn}: wrt names {name!r}, which is no node of the graph; expected "
                f"an input ({', '.join(graph.inputs) or 'none'}) or a constant"
            )
        node = graph.node(name)
        if node.kind not in DIFFERENTIABLE_LEAVES:
            raise GradError(
                f"{fn}: wrt names {name!r}, a {node.kind} node; expected an input "
                f"or a constant ({', '.join(DIFFERENTIABLE_LEAVES)})"
            )
        if not inexact(node.dtype):
            raise GradError(
                f"{fn}: {name!r} has dtype {node.dtype}, which has no gradient; "
                "expected a float or complex tensor (cast it to a float dtype "
                "in the graph and differentiate the cast's input)"
            )
        gname = f"grad_{name}"
        if gname in graph.outputs:
            raise GradError(f"{fn}: the graph already has an output {gname!r}")
        out.append((name, node.id))
    return out


def _active(g: EinsumGraph, of: int, wrt: set[int]) -> set[int]:
    """Nodes on a float path from a ``wrt`` leaf to ``of``: the ones the backward visits."""
    down: set[int] = set()
    for node in g.nodes:  # topological order
        if node.id in wrt or (inexact(node.dtype) and any(i in down for i in node.inputs)):
            down.add(node.id)
    up, stack = set(), [of]
    while stack:
        n = stack.pop()
        if n in up or n not in down:
            continue
        up.add(n)
        stack.extend(g.node(n).inputs)
    return up


def _backward(g: EinsumGraph, of: int, seed: Tensor, wrt: list[tuple[str, int]]) -> EinsumGraph:
    forward = [n.id for n in g.nodes]
    active = _active(g, of, {nid for _, nid in wrt})
    cts: dict[int, Tensor] = {of: seed}
    for nid in reversed(forward):
        node = g.node(nid)
        if nid not in active or node.kind in DIFFERENTIABLE_LEAVES or nid not in cts:
            continue
        ct = cts.pop(nid)
        need = [i in active for i in node.inputs]
        rule = RULES.get(node.kind)
        if rule is None:
            raise GradError(f"node {node.name!r}: no gradient rule for node kind {node.kind!r}")
        for i, r in zip(node.inputs, rule(g, node, ct, need)):
            if r is None:
                continue
            _check(g, node, i, r)
            cts[i] = r if i not in cts else g.binary("add", cts[i], r)
    for name, nid in wrt:
        leaf = g.tensor(nid)
        ct = cts.get(nid)
        if ct is None:  # the output does not depend on it
            ct = expand(g, cast_to(g, g.constant(np.zeros((), leaf.dtype)), leaf.dtype), leaf)
        g.output(ct, f"grad_{name}")
    return g


def _check(g: EinsumGraph, node, i: int, r: Tensor) -> None:
    """A rule's cotangent must have its operand's shape and dtype (a bug otherwise)."""
    x = g.node(i)
    if tuple(r.shape) != tuple(x.shape) or r.dtype != x.dtype:
        raise GradError(
            f"internal: the gradient rule of {node.name!r} ({node.label}) gave "
            f"{tuple(r.shape)} {r.dtype} for operand {x.name!r} of "
            f"{tuple(x.shape)} {x.dtype}"
        )
