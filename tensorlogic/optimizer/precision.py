"""Mixed-precision policy: a float32 graph turned into a plan that computes in a 16-bit dtype.

``tl.compile(g, precision="bf16")`` (or ``"fp16"``) rewrites the graph before optimization:

- graph inputs keep their float32 dtype at the boundary; a cast to the 16-bit dtype follows each;
- float32 constants (weights) are stored in the 16-bit dtype, converted once at compile time;
- every float32 node becomes a node of the 16-bit dtype (an explicit cast to float32 becomes one
  to the 16-bit dtype), so contractions run on tensor cores with float32 accumulation;
- float32 outputs are cast back to float32, so callers see the dtypes they declared;
- nodes of other dtypes (a cast to float64 and what follows it) read inputs and constants at
  their full float32 values.

Layer norms, softmax and reductions stay numerically float32: every backend reads their 16-bit
operands into float32, computes and accumulates there, and rounds the result once. float64
nodes are left as they are.
"""

from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..ir import ops
from ..ir.graph import EinsumGraph

# accepted spellings of the policy -> the storage dtype of the plan
POLICIES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


def policy_dtype(precision: object) -> str | None:
    """The 16-bit dtype of a ``precision=`` option (None: the graph's own dtypes)."""
    if precision is None or precision in ("float32", "fp32"):
        return None
    if precision not in POLICIES:
        raise GraphError(f"precision must be None, 'float32', 'bf16' or 'fp16', got {precision!r}")
    return POLICIES[precision]


def lower_precision(graph: EinsumGraph, dtype: str) -> EinsumGraph:
    """A copy of ``graph`` whose float32 interior computes in ``dtype`` (see the module doc)."""
    new = EinsumGraph()
    ids: dict[int, int] = {}
    full: dict[int, int] = {}  # float32 inputs and constants at full precision, made when read

    def full_value(i: int) -> int:
        node = graph.node(i)
        if node.dtype != "float32" or node.kind not in (ops.INPUT, ops.CONSTANT):
            return ids[i]
        if i not in full:
            full[i] = (
                new.inputs[node.name]
                if node.kind == ops.INPUT
                else new.constant(
                    graph.constants[i], name=f"{node.name}:float32", dtype="float32"
                ).id
            )
        return full[i]

    for node in graph.nodes:
        low = node.dtype == "float32"
        if node.kind == ops.INPUT:
            t = new.input(node.name, node.shape, node.dtype)
            ids[node.id] = new.cast(t, dtype, name=f"{node.name}:{dtype}").id if low else t.id
            continue
        if node.kind == ops.CONSTANT:
            value = graph.constants[node.id]
            t = new.constant(
                np.asarray(value).astype(dtype) if low else value,
                name=node.name,
                dtype=dtype if low else node.dtype,
            )
            ids[node.id] = t.id
            continue
        args = dict(node.args)
        if node.kind == ops.CAST and args.get("dtype") == "float32":
            args["dtype"] = dtype
        if low or (node.kind == ops.CAST and args.get("dtype") == dtype):
            inputs = [ids[i] for i in node.inputs]
        else:
            inputs = [full_value(i) for i in node.inputs]
        if node.kind == ops.FUSED:  # fused nodes carry their dtype (made by the optimizer)
            ids[node.id] = new.add_node(
                node.kind,
                node.op,
                inputs,
                args,
                name=node.name,
                shape=node.shape,
                dtype=dtype if low else node.dtype,
            )
        else:
            ids[node.id] = new.add_node(node.kind, node.op, inputs, args, name=node.name)
    for name, nid in graph.outputs.items():
        t = new.tensor(ids[nid])
        if graph.node(nid).dtype == "float32" and t.dtype != "float32":
            t = new.cast(t, "float32", name=f"{name}:float32")
        new.output(t, name)
    return new


def apply_policy(graph: EinsumGraph, precision: object) -> EinsumGraph:
    """``graph`` under the ``precision=`` compile option (itself when there is none)."""
    dtype = policy_dtype(precision)
    if dtype is None or not any(n.dtype == "float32" for n in graph.nodes):
        return graph
    return lower_precision(graph, dtype)


__all__ = ["POLICIES", "apply_policy", "lower_precision", "policy_dtype"]
