"""Elementwise fusion: maximal groups of elementwise ops over one iteration space become one
FUSED node (format: ``ir/fused.py``), optionally ending in a reduction over trailing axes or a
row op (softmax, log_softmax, layer_norm) over the last axis, and after a row op an elementwise
epilogue (its consumers: an affine scale and shift, a residual add, an activation).

Legality is the pure predicate ``is_legal_group``. Groups grow greedily from the last
elementwise node of a chain (its root) towards its producers: a producer joins when it is
elementwise, has the root's shape and dtype, is not a graph output and all its users are already
in the group; a one-FLOP producer with one full-size operand (a bias add) whose users are all
elementwise joins each user's group as a copy instead (``recomputable``), so it is never
written. Same-dtype members mean no rounding step of the unfused graph is skipped; scalar
constants whose dtype matches everything they meet are inlined as literals. A comparison of
operands of the root's dtype (bool) joins too when all its users do: the program holds it as 1/0
in that dtype, which is what its users read from a bool (``w * (a > b)`` is one kernel). Only
float nodes over float operands fuse: a fused program computes in one float dtype with float
literals, while integer, bool and complex ops keep numpy's own loops (wraparound, integer
results of mixed operands, complex arithmetic) one node at a time.

Epilogues grow from a row op towards its consumers: the earliest node that uses the group's
values from outside joins while it is elementwise over the row op's shape and dtype and no
member is a graph output; the group keeps the longest such chain whose values, but the last,
are used only inside it. Row ops are fused first, so their consumers join the
row op's node instead of forming an elementwise group of their own (which would cost a second
pass over the tensor).
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from .. import dtypes
from ..ir import ops
from ..ir.cost import fused_flops
from ..ir.fused import FusedBody, FusedOp
from ..ir.graph import EinsumGraph, Node
from .base import PassResult, function_pass

ELEMENTWISE_KINDS = ops.ELEMENTWISE_KINDS

# Most elementwise ops one fused node holds; a longer chain is split into several nodes. A
# generated kernel's compile time and memory grow faster than linearly with its length (numba on
# the 2-vCPU dev machine: 150 ops 8 s, 300 ops 39 s and 400 MB), so bounded nodes keep each
# kernel's compile within about 2 s (32 ops: 1.7-1.9 s of CPU per kernel on a quiet 2-vCPU
# machine; 48 ops took 2.6-3.2 s) and a whole graph's compile time linear in its size; one more
# pass over memory per 32 ops costs little at run time.
MAX_GROUP_OPS = 32


def _is_elementwise(node: Node) -> bool:
    return node.kind in ELEMENTWISE_KINDS


def _mask_of(g: EinsumGraph, node: Node) -> str | None:
    """The float dtype a comparison compares in (its operands' one dtype), or None.

    Inside a fused group of that dtype a comparison is held as 1/0 in the dtype, as the op
    table's expressions compute it: its bool value never leaves the group (only a member's
    users may read it), and its users (``w * (a > b)``, ``where``) get the same numbers from
    1/0 as numpy gets by promoting the bool.
    """
    if node.kind != ops.BINARY or node.op not in ops.COMPARISONS or node.dtype != "bool":
        return None
    dts = {g.node(i).dtype for i in node.inputs}
    return dts.pop() if len(dts) == 1 and dts <= set(dtypes.FLOATS) else None


def _computes_in(g: EinsumGraph, node: Node) -> str:
    """The dtype a node computes in as a fused member: its own, a comparison's operands'."""
    return _mask_of(g, node) or node.dtype


def _floats_only(g: EinsumGraph, nids) -> bool:
    """Every node of ``nids`` computes in a float dtype (comparisons of floats included), and
    every operand is a float or such a comparison of the group."""
    group = set(nids)
    for nid in nids:
        node = g.node(nid)
        if _computes_in(g, node) not in dtypes.FLOATS:
            return False
        for i in node.inputs:
            inode = g.node(i)
            if inode.dtype not in dtypes.FLOATS and not (i in group and _mask_of(g, inode)):
                return False
    return True


def legal_tail(root: Node, tail: Node) -> bool:
    """A reduction over trailing axes, or a row op over the last axis, of the root's value."""
    r = len(root.shape)
    if tail.inputs != (root.id,) or tail.dtype != root.dtype or r == 0:
        return False
    if tail.kind == ops.REDUCE:
        axes = tuple(tail.args["axes"])
        return len(axes) > 0 and axes == tuple(range(r - len(axes), r))
    if tail.kind == ops.ROWOP:
        return tail.args["axis"] == r - 1
    return False


def _legal_epilogue(
    g: EinsumGraph, tail: int, epilogue: Sequence[int], position: Mapping[int, int]
) -> bool:
    """The epilogue conditions of ``is_legal_group`` (the cycle test aside)."""
    t = g.node(tail)
    if t.kind != ops.ROWOP or len(set(epilogue)) != len(epilogue) or tail in epilogue:
        return False
    outputs = set(g.outputs.values())
    group = {tail, *epilogue}
    chain = [tail, *epilogue]
    for k, e in enumerate(epilogue):
        node = g.node(e)
        if (
            not _is_elementwise(node)
            or tuple(node.shape) != tuple(t.shape)
            or node.dtype != t.dtype
            or position[e] <= position[chain[k]]
        ):
            return False
        if not any(i in chain[: k + 1] for i in node.inputs):
            return False  # it must consume the row op's value (or a later epilogue value)
    for m in chain[:-1]:  # every value but the last stays inside the node
        if m in outputs or any(u not in group for u in g.users(m)):
            return False
    return True


def is_legal_group(
    g: EinsumGraph,
    members: frozenset[int],
    root: int | None,
    tail: int | None = None,
    position: Mapping[int, int] | None = None,
    epilogue: Sequence[int] = (),
    recomputed: frozenset[int] = frozenset(),
) -> bool:
    """Whether ``members`` (elementwise, ending in ``root``), ``tail`` and ``epilogue`` may
    become one node (``recomputed`` members stay in the graph for their other users).

    Pure: reads the graph, changes nothing. Conditions: at least two nodes; every member
    elementwise with the root's (concrete, non-empty) shape and dtype; no member but the root is
    a graph output or used outside the group (a recomputed member's node stays, so a member it
    reads counts as used outside); the tail, if any, is the root's only user and a
    legal tail; an epilogue (ordered as in ``position``) follows a row-op tail, each of its
    nodes elementwise over the row op's shape and dtype and consuming the row op's value or an
    earlier epilogue value, and only its last node is used outside the group or is an output;
    and no path leaves the group and comes back (no external operand depends on a member), so
    the fused node creates no cycle. ``members`` may be empty (``root`` None) when a row-op
    tail has an epilogue: the row op then reads its input directly. ``position`` (node id ->
    index in a topological order of ``g``) bounds the cycle search; computed when not given.
    """
    if len(members) + (tail is not None) + len(epilogue) < 2:
        return False
    if not _floats_only(g, [*members, *epilogue, *([tail] if tail is not None else [])]):
        return False
    if position is None:
        position = {n.id: k for k, n in enumerate(g.nodes)}
    if epilogue and (tail is None or not _legal_epilogue(g, tail, epilogue, position)):
        return False
    outputs = set(g.outputs.values())
    if members:
        if root not in members:
            return False
        rnode = g.node(root)
    elif not epilogue:
        return False
    else:
        rnode = g.node(g.node(tail).inputs[0])  # the row op's input is an external operand
    space = tuple(rnode.shape)
    if not all(isinstance(d, int) for d in space) or math.prod(space) == 0:
        return False
    for m in members:
        node = g.node(m)
        if (
            not _is_elementwise(node)
            or tuple(node.shape) != space
            or _computes_in(g, node) != rnode.dtype
            or (m == root and node.dtype != rnode.dtype)
        ):
            return False
        if m in recomputed:
            if m == root or not recomputable(g, m):
                return False
        elif m != root and (
            m in outputs or any(u not in members or u in recomputed for u in g.users(m))
        ):
            return False  # used outside, or by a recomputed member, whose node stays
    if tail is not None:
        if members and (root in outputs or g.users(root) != [tail]):
            return False
        if not legal_tail(rnode, g.node(tail)):
            return False
    # a recomputed member's node stays in the graph: paths through it make no cycle
    inside = (set(members) - recomputed) | set(epilogue) | ({tail} if tail is not None else set())
    first = min(position[m] for m in inside)
    external = {
        i for m in inside | set(recomputed) for i in g.node(m).inputs if i not in inside
    } - set(recomputed)
    members = frozenset(inside)  # the cycle search below: no external operand reaches a member
    # a cycle would need an external operand that depends on a member: search its ancestors,
    # which can reach a member only while they come after the first member in the order
    stack, seen = [e for e in external if position[e] > first], set()
    while stack:
        n = stack.pop()
        if n in members:
            return False
        if n in seen:
            continue
        seen.add(n)
        stack.extend(i for i in g.node(n).inputs if position[i] > first)
    return True


def _inline_constant(g: EinsumGraph, nid: int, user: Node, members: set[int]) -> float | None:
    """A scalar constant operand that may be a literal: its dtype equals every other operand's."""
    node = g.node(nid)
    if node.kind != ops.CONSTANT or math.prod(node.shape) != 1 or len(node.shape) > len(user.shape):
        return None
    dtype = _computes_in(g, user)
    if node.dtype != dtype:
        return None
    for other in user.inputs:
        if other != nid and other not in members and g.node(other).dtype != dtype:
            return None  # a Python float is "weak": numpy would compute in the other dtype
    return float(g.constants[nid].reshape(()))


def _program(
    g: EinsumGraph,
    order: Sequence[int],
    members: set[int],
    external: list[int],
    special: Mapping[int, tuple],
) -> tuple[FusedOp, ...]:
    """Instructions of ``order``: refs to earlier entries, ``special`` refs, literals, inputs."""
    tmp = {nid: j for j, nid in enumerate(order)}
    instrs = []
    for nid in order:
        node = g.node(nid)
        refs = []
        for i in node.inputs:
            if i in tmp:
                refs.append(("tmp", tmp[i]))
                continue
            if i in special:
                refs.append(special[i])
                continue
            value = _inline_constant(g, i, node, members)
            if value is not None:
                refs.append(("const", value))
                continue
            if i not in external:
                external.append(i)
            refs.append(("in", external.index(i)))
        instrs.append(FusedOp(node.op, tuple(refs)))
    return tuple(instrs)


def build_body(
    g: EinsumGraph,
    members: frozenset[int],
    root: int | None,
    tail: int | None,
    epilogue: Sequence[int] = (),
) -> tuple[FusedBody, list[int]]:
    """The fused program of a legal group and its external operands in order."""
    external: list[int] = []
    if members:
        instrs = _program(g, _topological(g, members), set(members), external, {})
        space = tuple(g.node(root).shape)
    else:  # an empty prologue: the row op reads input 0
        external.append(g.node(tail).inputs[0])
        instrs = ()
        space = tuple(g.node(tail).shape)
    if tail is None:
        return FusedBody(instrs, space), external
    t = g.node(tail)
    if t.kind == ops.REDUCE:
        body = FusedBody(instrs, space, t.op, tuple(t.args["axes"]), bool(t.args.get("keepdims")))
    else:
        epi = _program(g, list(epilogue), {tail, *epilogue}, external, {tail: ("tail", 0)})
        body = FusedBody(
            instrs,
            space,
            t.op,
            (int(t.args["axis"]),),
            eps=float(t.args.get("eps", ops.LAYER_NORM_EPS)),
            epilogue=epi,
        )
    return body, external


def _topological(g: EinsumGraph, members: frozenset[int]) -> list[int]:
    """Members ordered so every member comes after the members it uses."""
    order: list[int] = []
    done: set[int] = set()

    def visit(n: int) -> None:
        if n in done:
            return
        done.add(n)
        for i in g.node(n).inputs:
            if i in members:
                visit(i)
        order.append(n)

    for m in sorted(members):
        visit(m)
    return order


def recomputable(g: EinsumGraph, nid: int) -> bool:
    """Whether a group may recompute node ``nid`` instead of reading it: a one-FLOP op (a bias
    add, a scaling) with one full-size operand, the others broadcast (a row, a scalar), whose
    users are all elementwise over its shape. Each user's group then reads the full-size
    operand where it would have read the node: the same traffic, and the node's own pass
    (read, write) disappears once every user recomputes it (``h = x @ W + b`` feeding an
    activation and, in a training graph, the activation's derivative)."""
    node = g.node(nid)
    if node.kind not in (ops.UNARY, ops.BINARY) or ops.ELEMENTWISE[node.op].flops > 1:
        return False
    if nid in g.outputs.values() or node.dtype not in dtypes.FLOATS:
        return False
    shape = tuple(node.shape)
    full = [i for i in node.inputs if tuple(g.node(i).shape) == shape]
    if len(full) != 1 or any(
        math.prod(g.node(i).shape) >= math.prod(shape) for i in node.inputs if i not in full
    ):
        return False
    users = g.users(nid)
    return len(users) > 1 and all(
        _is_elementwise(g.node(u)) and tuple(g.node(u).shape) == shape for u in users
    )


def _grow(
    g: EinsumGraph,
    root: int,
    taken: set[int],
    limit: int | None = None,
    recomputed: set[int] | None = None,
) -> frozenset[int]:
    """The largest group around ``root`` that the greedy rule admits (a worklist walk), of at
    most ``limit`` nodes (default ``MAX_GROUP_OPS``): the nodes left out form groups of their
    own. With ``recomputed`` (a set filled here), a ``recomputable`` producer with users
    outside the group joins too, as a copy: it stays in the graph for them, and the walk
    does not go past it (its operands are read by the group)."""
    limit = MAX_GROUP_OPS if limit is None else limit
    rnode = g.node(root)
    outputs = set(g.outputs.values())
    members = {root}
    work = [root]
    recomputed_set = recomputed if recomputed is not None else set()
    while work:
        for p in g.node(work.pop()).inputs:
            if len(members) >= limit:
                return frozenset(members)
            if p in members or p in taken or p in outputs:
                continue
            pn = g.node(p)
            if not (
                _is_elementwise(pn)
                and tuple(pn.shape) == tuple(rnode.shape)
                and _computes_in(g, pn) == rnode.dtype
            ):
                continue
            # a recomputed copy's node stays in the graph, still reading its operands: a
            # producer joins outright only when all its users leave the graph with the group
            if all(u in members and u not in recomputed_set for u in g.users(p)):
                members.add(p)
                work.append(p)
            elif recomputed is not None and recomputable(g, p):
                members.add(p)
                recomputed.add(p)
    return frozenset(members)


def _grow_epilogue(
    g: EinsumGraph, tail: int, taken: set[int], position: Mapping[int, int]
) -> list[int]:
    """Consumers of a row op's value that join it, in order: the earliest user from outside
    joins while it is elementwise over the row op's shape and dtype (so none of its operands
    can depend on the group: such a path would leave through an earlier user); the longest
    prefix whose values all stay inside but the last is kept."""
    t = g.node(tail)
    outputs = set(g.outputs.values())
    chain, group, best = [tail], {tail}, []
    while not any(m in outputs for m in chain) and len(chain) <= MAX_GROUP_OPS // 2:
        outside = {u for m in chain for u in g.users(m) if u not in group}
        if not outside:
            break
        u = min(outside, key=position.__getitem__)
        un = g.node(u)
        if (
            u in taken
            or not _is_elementwise(un)
            or tuple(un.shape) != tuple(t.shape)
            or un.dtype != t.dtype
            or position[u] <= max(position[m] for m in chain)
        ):
            break
        chain.append(u)
        group.add(u)
        if all(set(g.users(m)) <= group for m in chain[:-1]):
            best = chain[1:]
    return best


def _prologue(g: EinsumGraph, tail: int, taken: set[int]) -> tuple[frozenset[int], int | None]:
    """The elementwise group feeding a row op as its tail (empty when there is none)."""
    root = g.node(tail).inputs[0]
    rn = g.node(root)
    if (
        root in taken
        or not _is_elementwise(rn)
        or root in g.outputs.values()
        or g.users(root) != [tail]
    ):
        return frozenset(), None
    return _grow(g, root, taken, MAX_GROUP_OPS // 2), root


def _fusion(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Fuse every legal elementwise group (with its tail and epilogue) into one FUSED node."""
    state = {"g": None, "groups": 0, "nodes": 0}
    taken: set[int] = set()
    position = {n.id: k for k, n in enumerate(graph.nodes)}  # fused nodes keep their root's

    def fuse(
        cur: EinsumGraph,
        members: frozenset[int],
        root: int | None,
        tail: int | None,
        epilogue: list[int],
        recomputed: frozenset[int] = frozenset(),
    ) -> None:
        body, external = build_body(cur, members, root, tail, epilogue)
        last = epilogue[-1] if epilogue else tail if tail is not None else root
        visible = cur.node(last)
        g = state["g"] if state["g"] is not None else graph.copy()
        state["g"] = g
        fused = Node(
            visible.id,
            ops.FUSED,
            None,
            tuple(external),
            tuple(visible.shape),
            visible.dtype,
            visible.name,
            MappingProxyType({"body": body.to_args(), "flops": fused_flops(body)}),
        )
        g.replace_node(visible.id, fused)
        group = set(members) - recomputed | set(epilogue) | ({tail} if tail is not None else set())
        # users before producers: insertion order is topological, so remove from the back
        for m in sorted(group - {visible.id}, key=position.__getitem__, reverse=True):
            g.remove_node(m)
        taken.update(group)
        state["groups"] += 1
        state["nodes"] += len(group)

    # row ops first, with their prologue and epilogue: their consumers would otherwise be taken
    # by an elementwise group of their own
    for node in graph.nodes:
        cur = state["g"] if state["g"] is not None else graph
        if node.kind != ops.ROWOP or node.id in taken or node.id not in cur:
            continue
        epilogue = _grow_epilogue(cur, node.id, taken, position)
        if not epilogue:
            continue  # a row op with a prologue alone is fused below, as before
        members, root = _prologue(cur, node.id, taken)
        if members and not is_legal_group(cur, members, root, node.id, position, epilogue):
            members, root = frozenset(), None  # the prologue becomes a group of its own
        if is_legal_group(cur, members, root, node.id, position, epilogue):
            fuse(cur, members, root, node.id, epilogue)
    for node in reversed(graph.nodes):
        cur = state["g"] if state["g"] is not None else graph
        if node.id in taken or node.id not in cur or not _is_elementwise(cur.node(node.id)):
            continue
        users = cur.users(node.id)
        tail = users[0] if len(users) == 1 and node.id not in cur.outputs.values() else None
        if tail is not None and not legal_tail(cur.node(node.id), cur.node(tail)):
            tail = None
        rec: set[int] = set()
        members = _grow(cur, node.id, taken, recomputed=rec)
        if rec and not is_legal_group(cur, members, node.id, tail, position, (), frozenset(rec)):
            rec = set()
            members = _grow(cur, node.id, taken)
        if not is_legal_group(cur, members, node.id, tail, position, (), frozenset(rec)):
            continue
        fuse(cur, members, node.id, tail, [], frozenset(rec))
    if state["g"] is None:
        return PassResult(graph, False, {})
    return PassResult(state["g"], True, {"groups": state["groups"], "nodes_fused": state["nodes"]})


fusion = function_pass("fusion", _fusion)
