"""EinsumGraph: a DAG of tensor operations over a networkx.DiGraph.

Nodes are immutable ``Node`` records (``node.py``) kept in insertion order (a topological order,
since a node can only use nodes that already exist). Shapes and dtypes are inferred and checked
when a node is added, so a bad graph fails at the line that built it. The building methods
(``g.input``, ``g.einsum``, ``g.softmax``, ...) live in ``build.py``, the handles in ``tensor.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import replace
from typing import Any, Iterator, Mapping, Sequence

import networkx as nx
import numpy as np

from .. import dtypes
from ..errors import DTypeError, GraphError
from . import infer, node_check, ops
from .build import GraphBuilder, install_op_methods
from .node import Dim, Node, check_dim, freeze
from .tensor import Tensor

__all__ = ["Dim", "EinsumGraph", "Node", "Tensor"]


class EinsumGraph(GraphBuilder):
    """A graph of einsum, elementwise, reduction and layout operations."""

    def __init__(self) -> None:
        self._g = nx.DiGraph()
        self._nodes: dict[int, Node] = {}
        self._names: dict[str, int] = {}
        self.inputs: dict[str, int] = {}
        self.outputs: dict[str, int] = {}
        self.constants: dict[int, np.ndarray] = {}
        # learned leaves: name -> node id, and each one's initial value (read-only) by node id;
        # a compiled plan holds its own mutable copies (``CompiledPlan.parameters``)
        self.parameters: dict[str, int] = {}
        self.parameter_values: dict[int, np.ndarray] = {}
        self._next = 0
        self._in_transaction = False
        # True once a node was rewired (replace_node, redirect) since the last full validate():
        # add_node infers and checks every node it adds, so a graph built by it alone needs no
        # re-inference of every node when validated (compile validates every graph it gets)
        self._unchecked = False

    # ------------------------------------------------------------------ structure
    @property
    def nx_graph(self) -> nx.DiGraph:
        """The underlying networkx graph (edges input -> consumer); do not mutate it."""
        return self._g

    def node(self, ref: int | str | "Tensor") -> Node:
        """The node for an id, a name or a Tensor handle."""
        if type(ref) is int:  # the passes' common case, first
            node = self._nodes.get(ref)
            if node is not None:
                return node
        if isinstance(ref, Tensor):
            ref = ref.id
        if isinstance(ref, str):
            if ref not in self._names:
                raise GraphError(f"no node named {ref!r} in the graph")
            ref = self._names[ref]
        if ref not in self._nodes:
            raise GraphError(f"no node with id {ref!r} in the graph")
        return self._nodes[ref]

    @property
    def nodes(self) -> list[Node]:
        """Nodes in a topological order."""
        return list(self._nodes.values())

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(list(self._nodes.values()))

    def __contains__(self, node_id: int) -> bool:
        return node_id in self._nodes

    def users(self, node_id: int) -> list[int]:
        """Ids of the nodes that consume ``node_id``."""
        return [u for u in self._g.successors(node_id)]

    def live_nodes(self) -> set[int]:
        """Ids of every node some output depends on (the outputs included)."""
        live: set[int] = set()
        stack = list(self.outputs.values())
        while stack:
            n = stack.pop()
            if n in live:
                continue
            live.add(n)
            stack.extend(self._nodes[n].inputs)
        return live

    def tensor(self, ref: int | str) -> "Tensor":
        """A handle on an existing node."""
        return Tensor(self, self.node(ref).id)

    @property
    def symbols(self) -> tuple[str, ...]:
        """Symbolic dimension names used by the graph's inputs, in order of appearance."""
        seen: dict[str, None] = {}
        for nid in self.inputs.values():
            for d in self._nodes[nid].shape:
                if isinstance(d, str):
                    seen.setdefault(d)
        return tuple(seen)

    def copy(self) -> "EinsumGraph":
        """An independent copy (constants are shared read-only arrays)."""
        g = EinsumGraph()
        g._g = self._g.copy()
        g._nodes = dict(self._nodes)
        g._names = dict(self._names)
        g.inputs = dict(self.inputs)
        g.outputs = dict(self.outputs)
        g.constants = dict(self.constants)
        g.parameters = dict(self.parameters)
        g.parameter_values = dict(self.parameter_values)
        g._next = self._next
        g._unchecked = self._unchecked
        return g

    def constants_as_parameters(self, names: Sequence[str]) -> "EinsumGraph":
        """A copy in which the named float constants are parameters (same names and values):
        to train a model whose builder made its weights constants."""
        g = self.copy()
        for name in [names] if isinstance(names, str) else list(names):
            node = self.node(name) if isinstance(name, str) else None
            if node is None or node.kind != ops.CONSTANT:
                raise GraphError(
                    f"constants_as_parameters: {name!r} is not a constant of the "
                    f"graph" + (f" (it is a {node.kind} node)" if node else "")
                )
            if not name.isidentifier():
                raise GraphError(
                    f"constants_as_parameters: {name!r} is not an identifier; "
                    "parameters are named like inputs"
                )
            if not (dtypes.is_float(node.dtype) or dtypes.kind(node.dtype) == "c"):
                raise DTypeError(
                    f"constants_as_parameters: {name!r} has dtype {node.dtype}; "
                    "expected a floating-point or complex constant"
                )
            g._nodes[node.id] = replace(node, kind=ops.PARAMETER)
            g.parameters[name] = node.id
            g.parameter_values[node.id] = g.constants.pop(node.id)
        return g

    def with_parameters_as_inputs(self) -> "EinsumGraph":
        """A copy in which every parameter is a graph input of the same name, shape and dtype.

        The compiler works on this form: to the optimizer a parameter is as opaque as an input
        (never folded, merged or specialized on its value), and a plan binds it from its own
        parameter store at every call, so new values need no recompiling.
        """
        g = self.copy()
        for name, nid in self.parameters.items():
            g._nodes[nid] = replace(self._nodes[nid], kind=ops.INPUT)
            g.inputs[name] = nid
        g.parameters = {}
        g.parameter_values = {}
        return g

    # ------------------------------------------------------------------ low level
    def _unique_name(self, name: str | None, base: str) -> str:
        if name is not None:
            if not isinstance(name, str) or not name:
                raise GraphError(f"node name must be a non-empty string, got {name!r}")
            if name in self._names:
                raise GraphError(f"a node named {name!r} already exists in the graph")
            return name
        k = self._next
        while f"{base}_{k}" in self._names:
            k += 1
        return f"{base}_{k}"

    def add_node(
        self,
        kind: str,
        op: str | None,
        inputs: Sequence[int],
        args: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        shape: Sequence[Dim] | None = None,
        dtype: str | None = None,
    ) -> int:
        """Add a node, inferring its shape and dtype (given explicitly only for fused nodes).

        The record is checked first (arity, op, every argument's type), so nothing is coerced or
        dropped silently; nothing is changed if a check or inference fails.
        """
        if args is not None and not isinstance(args, Mapping):
            raise GraphError(f"add_node: args must be a mapping, got {type(args).__name__}")
        args = dict(args or {})
        if not isinstance(kind, str) or kind not in ops.NODE_KINDS:
            raise GraphError(f"unknown node kind {kind!r}; expected one of {ops.NODE_KINDS}")
        if kind in (ops.INPUT, ops.CONSTANT, ops.PARAMETER):
            raise GraphError(f"add_node cannot make a {kind} node; use g.{kind}(...)")
        if op is None:
            op = ops.DEFAULT_OP.get(kind)
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise GraphError(f"{kind} node: inputs must be a sequence of node ids, got {inputs!r}")
        inputs = [int(i) if node_check.is_int(i) else i for i in inputs]
        for i in inputs:
            if isinstance(i, bool) or not isinstance(i, int) or i not in self._nodes:
                raise GraphError(f"{kind} node refers to unknown input node id {i!r}")
        nm = self._unique_name(name, op if isinstance(op, str) else kind)
        where = f"node {nm!r} ({kind}{':' + op if isinstance(op, str) else ''})"
        node_check.check(kind, op, inputs, args, where)
        if kind == ops.FUSED:
            shape, dtype = self._fused_result(inputs, args, shape, dtype, where)
        else:
            inferred = infer.infer(kind, op, [self._nodes[i] for i in inputs], args, where)
            if (shape is not None and tuple(shape) != tuple(inferred[0])) or (
                dtype is not None and dtype != inferred[1]
            ):
                raise GraphError(
                    f"{where}: given shape/dtype {shape}/{dtype} but the inputs give "
                    f"{inferred[0]}/{inferred[1]}"
                )
            shape, dtype = inferred
        return self._insert(kind, op, inputs, args, nm, shape, dtype)

    def _fused_result(self, inputs, args, shape, dtype, where):
        from .fused import FusedBody

        try:
            body = FusedBody.from_args(args["body"])
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise GraphError(
                f"{where}: malformed fused body ({type(exc).__name__}: {exc})"
            ) from exc
        body.validate(len(inputs), where)
        if shape is None or dtype is None:
            raise GraphError(f"{where}: a fused node needs its shape and dtype given")
        dims = tuple(check_dim(d, where) for d in shape)
        return dims, dtypes.normalize(dtype, f"{where}: ")

    def _insert(self, kind, op, inputs, args, name, shape, dtype) -> int:
        nid = self._next
        self._next += 1
        node = Node(nid, kind, op, tuple(inputs), tuple(shape), dtype, name, freeze(args))
        self._nodes[nid] = node
        self._names[name] = nid
        self._g.add_node(nid)
        for i in inputs:
            self._g.add_edge(i, nid)
        return nid

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """Undo every node added inside the block if it raises (constants made for operands too)."""
        if self._in_transaction:
            yield
            return
        mark = self._next
        self._in_transaction = True
        try:
            yield
        except BaseException:
            for nid in [i for i in self._nodes if i >= mark]:
                node = self._nodes.pop(nid)
                self._names.pop(node.name, None)
                self._g.remove_node(nid)
                self.constants.pop(nid, None)
                self.parameter_values.pop(nid, None)
                if self.inputs.get(node.name) == nid:
                    del self.inputs[node.name]
                if self.parameters.get(node.name) == nid:
                    del self.parameters[node.name]
            self._next = mark
            raise
        finally:
            self._in_transaction = False

    def replace_node(self, node_id: int, new: Node) -> None:
        """Swap the record of ``node_id`` (same id), rewiring its input edges."""
        old = self._nodes[node_id]
        for i in old.inputs:
            if self._g.has_edge(i, node_id) and i not in new.inputs:
                self._g.remove_edge(i, node_id)
        for i in new.inputs:
            self._g.add_edge(i, node_id)
        del self._names[old.name]
        self._names[new.name] = node_id
        self._nodes[node_id] = new
        self._unchecked = True

    def redirect(self, old: int, new: int) -> None:
        """Make every user of ``old`` (and any output naming it) use ``new`` instead."""
        for u in list(self._g.successors(old)):
            node = self._nodes[u]
            self.replace_node(
                u, replace(node, inputs=tuple(new if i == old else i for i in node.inputs))
            )
        for k, v in self.outputs.items():
            if v == old:
                self.outputs[k] = new

    def remove_node(self, node_id: int) -> None:
        """Remove a node that nothing uses any more."""
        if list(self._g.successors(node_id)) or node_id in self.outputs.values():
            raise GraphError(f"cannot remove node {self._nodes[node_id].name!r}: it is still used")
        node = self._nodes.pop(node_id)
        del self._names[node.name]
        self._g.remove_node(node_id)
        self.constants.pop(node_id, None)
        self.parameter_values.pop(node_id, None)
        if self.inputs.get(node.name) == node_id:
            del self.inputs[node.name]
        if self.parameters.get(node.name) == node_id:
            del self.parameters[node.name]

    def reorder(self) -> None:
        """Restore a topological insertion order after rewiring."""
        order = list(nx.lexicographical_topological_sort(self._g))
        self._nodes = {i: self._nodes[i] for i in order}

    # ------------------------------------------------------------------ whole-graph
    def validate(self) -> None:
        """Check structure and re-infer every node; raise GraphError naming the first bad node.

        A graph whose nodes were all added by ``add_node`` (which infers each one) and never
        rewired since is acyclic and consistent by construction: only its outputs are checked.
        """
        if not self._unchecked:
            self._check_outputs()
            return
        if not nx.is_directed_acyclic_graph(self._g):
            cycle = nx.find_cycle(self._g)
            names = [self._nodes[a].name for a, _ in cycle]
            raise GraphError(f"graph has a cycle through nodes {names}")
        if not self.outputs:
            raise GraphError("graph has no outputs; mark at least one with g.output(t)")
        for node in self._nodes.values():
            for i in node.inputs:
                if i not in self._nodes:
                    raise GraphError(f"node {node.name!r} refers to missing input id {i}")
            if node.kind in (ops.INPUT, ops.CONSTANT, ops.PARAMETER, ops.FUSED):
                continue
            where = f"node {node.name!r} ({node.label})"
            shape, dtype = infer.infer(
                node.kind, node.op, [self._nodes[i] for i in node.inputs], node.args, where
            )
            if tuple(shape) != tuple(node.shape) or dtype != node.dtype:
                raise GraphError(
                    f"{where}: recorded shape/dtype {node.shape}/{node.dtype} but inputs give "
                    f"{shape}/{dtype}"
                )
        self._check_outputs()
        self._unchecked = False

    def _check_outputs(self) -> None:
        if not self.outputs:
            raise GraphError("graph has no outputs; mark at least one with g.output(t)")
        for name, nid in self.outputs.items():
            if nid not in self._nodes:
                raise GraphError(f"output {name!r} refers to a missing node")

    def bind(self, sizes: Mapping[str, int]) -> "EinsumGraph":
        """A copy with every symbolic dimension replaced by its size, re-inferred."""
        g = EinsumGraph()
        g._next = self._next
        for node in self._nodes.values():
            if node.kind == ops.INPUT:
                shape = tuple(sizes[d] if isinstance(d, str) else d for d in node.shape)
                new = replace(node, shape=shape)
            elif node.kind in (ops.CONSTANT, ops.PARAMETER, ops.FUSED):
                new = replace(
                    node,
                    shape=tuple(sizes.get(d, d) if isinstance(d, str) else d for d in node.shape),
                )
            else:
                args = node.args
                if node.kind == ops.RESHAPE:
                    args = freeze(
                        {
                            **args,
                            "shape": [
                                sizes.get(d, d) if isinstance(d, str) else d for d in args["shape"]
                            ],
                        }
                    )
                where = f"node {node.name!r} ({node.label})"
                shape, dtype = infer.infer(
                    node.kind, node.op, [g._nodes[i] for i in node.inputs], args, where
                )
                new = replace(node, shape=shape, dtype=dtype, args=args)
            g._nodes[node.id] = new
            g._names[node.name] = node.id
            g._g.add_node(node.id)
            for i in node.inputs:
                g._g.add_edge(i, node.id)
        g.inputs = dict(self.inputs)
        g.outputs = dict(self.outputs)
        g.constants = dict(self.constants)
        g.parameters = dict(self.parameters)
        g.parameter_values = dict(self.parameter_values)
        return g

    def fingerprint(self) -> str:
        """A content hash of the graph: structure, arguments and constant values (not the
        values of parameters: a plan takes those as data, so it serves any values)."""
        h = hashlib.sha256()
        for node in self._nodes.values():
            rec = [
                node.id,
                node.kind,
                node.op,
                list(node.inputs),
                list(node.shape),
                node.dtype,
                node.name,
                _jsonable(node.args),
            ]
            h.update(json.dumps(rec, sort_keys=True, default=str).encode())
            if node.id in self.constants:
                h.update(self.constants[node.id].tobytes())
        h.update(json.dumps(sorted(self.outputs.items())).encode())
        return h.hexdigest()

    def to_dot(self) -> str:
        """Graphviz DOT text of the graph."""
        lines = [
            "digraph tensorlogic {",
            "  rankdir=TB;",
            '  node [shape=box, fontname="monospace"];',
        ]
        outs = {v: k for k, v in self.outputs.items()}
        for node in self._nodes.values():
            shape = "x".join(map(str, node.shape)) or "scalar"
            label = f"{node.name}\\n{node.label}\\n{shape} {node.dtype}"
            style = ""
            if node.kind == ops.INPUT:
                style = ", style=filled, fillcolor=lightblue"
            elif node.kind == ops.CONSTANT:
                style = ", style=filled, fillcolor=lightgrey"
            elif node.kind == ops.PARAMETER:
                style = ", style=filled, fillcolor=khaki"
            elif node.id in outs:
                style = ", style=filled, fillcolor=palegreen"
            label = label.replace('"', '\\"')
            lines.append(f'  n{node.id} [label="{label}"{style}];')
        for node in self._nodes.values():
            for pos, i in enumerate(node.inputs):
                lines.append(f'  n{i} -> n{node.id} [label="{pos}"];')
        lines.append("}")
        return "\n".join(lines) + "\n"

    def save(self, path) -> None:
        """Write the graph as JSON (constants in an .npz beside it)."""
        from .serialize import save

        save(self, path)

    @staticmethod
    def load(path) -> "EinsumGraph":
        """Read a graph written by ``save``; never executes code."""
        from .serialize import load

        return load(path)

    def __repr__(self) -> str:
        params = f", parameters={list(self.parameters)}" if self.parameters else ""
        return (
            f"EinsumGraph({len(self._nodes)} nodes, inputs={list(self.inputs)}{params}, "
            f"outputs={list(self.outputs)})"
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


install_op_methods(EinsumGraph)
