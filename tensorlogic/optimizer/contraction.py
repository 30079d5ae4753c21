"""Contraction planning: choose the pairwise path of every multi-operand einsum at compile time.

The path lives in the einsum node's args, so every backend that runs einsums through
``ir.pairwise.plan_einsum`` executes exactly the planned order:

* ``path_strategy``: the explicit path (pairs of positions over the operand list, opt_einsum's
  format), which ``plan_einsum`` honours as given;
* ``path_info``: ``{"strategy", "flops", "largest_intermediate", "naive_flops"}`` for display
  (``print(plan)`` shows it beside the step) and for the optimizer report.

Strategy by network size and cost (``path_search``): opt_einsum's ``optimal`` for up to 5
operands, ``dp`` up to 16, ``greedy`` above; a network whose estimated call time repays a search
also gets cotengra's hyper-optimizer (the ``large`` extra) with a time budget proportional to its
cost, and paths of large networks are cached on disk. The compile option ``path_memory_limit``
(bytes; defaults to ``memory_limit``) caps the largest intermediate: the path search respects
it, and a network that cannot be contracted under it raises MemoryBudgetError.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from ..errors import MemoryBudgetError
from ..ir import ops, pairwise, sliced, spec as einspec
from ..ir.graph import EinsumGraph, Node
from . import constant_pairs, path_search, slicing
from .base import PassResult, function_pass
from .util import remove_if_unused


def choose_path(
    terms: list[str], output: str, sizes: dict[str, int], memory_limit: int | None = None
) -> tuple[list[tuple[int, ...]], str]:
    """(path, strategy name) for a network of letter terms; ``memory_limit`` in elements."""
    return path_search.find_path(terms, output, sizes, memory_limit)


# Networks of up to this many operands have every pairwise order compared (3 orders for three
# operands, 18 for four); larger ones keep opt_einsum's path.
TIEBREAK_MAX_OPERANDS = 4
TIEBREAK_FLOPS_SLACK = 1.02


def _all_paths(n: int) -> list[list[tuple[int, int]]]:
    """Every pairwise contraction order of n operands, in opt_einsum's path format."""
    if n <= 1:
        return [[]]
    return [
        [(i, j)] + rest for i in range(n) for j in range(i + 1, n) for rest in _all_paths(n - 1)
    ]


def _layout_tiebreak(es, shapes, sizes, plan, path, limit):
    """Among the orders within 2% of the planned FLOPs, the one that copies the fewest operand
    elements into BLAS layouts (``EinsumPlan.copied``); opt_einsum's order on a tie.

    opt_einsum picks one of several orders of equal FLOPs, and they differ in layout:
    ``abc,bcd,cde->ae`` (48 each) along opt_einsum's order hands matmul a batch-strided view
    and copies an intermediate (221K elements copied, 0.40 ms); the order that contracts
    ``bcd,cde`` first copies half of that (0.33 ms).
    """
    best, best_path = plan, path
    for cand in _all_paths(len(shapes)):
        if cand == path:
            continue
        other = pairwise.plan_einsum(es, shapes, sizes, cand)
        if other.flops > plan.flops * TIEBREAK_FLOPS_SLACK or other.copied >= best.copied:
            continue
        if limit is not None and other.largest_intermediate > limit:
            continue
        best, best_path = other, cand
    return best, best_path


# a path planned under the memory limit is kept over slicing the unlimited one while it costs at
# most this many times the unlimited path's FLOPs
LIMITED_PATH_SLACK = 2.0
# at most this many slices: each one runs the whole network again, so a limit that needs more
# is refused at compile time instead of running for hours
MAX_SLICES = 1 << 16


def _under_limit(es, shapes, sizes, terms, plan, path, strategy, limit, dtype, where: str):
    """(plan, path, strategy, sliced letters) whose intermediates fit ``limit`` elements: a path
    searched under the limit when it costs little more, else the unlimited path sliced
    (cotengra), else the limited path (the caller raises if it still does not fit)."""
    try:
        lpath, lstrategy = choose_path(terms, es.output, sizes, limit)
    except RuntimeError:  # opt_einsum's dp finds no path under the limit
        lpath, lstrategy = path, strategy
    lplan = pairwise.path_costs(es, shapes, sizes, lpath)
    fits = lplan.largest_intermediate <= limit
    if fits and lplan.flops <= LIMITED_PATH_SLACK * plan.flops:
        return lplan, lpath, lstrategy, []
    itemsize = np.dtype(dtype).itemsize
    too_many = 0  # the fewest slices of an option refused for needing more than MAX_SLICES
    options = []
    letters = slicing.choose_slices(terms, es.output, sizes, path, limit)
    if letters:
        options.append((path, strategy + "+sliced", letters))
    budget = path_search.budget_for(plan.flops, len(terms))
    if budget.search:  # worth a search: paths and slices together
        found = slicing.search_sliced(terms, es.output, sizes, limit, budget.seconds)
        if found:
            options.append((found[0], "cotengra+sliced" if found[1] else "cotengra", found[1]))
    best = None
    for spath, sname, sl in options:
        n_slices = math.prod(int(sizes[c]) for c in sl)
        if n_slices > MAX_SLICES:
            too_many = min(too_many or n_slices, n_slices)
            continue
        splan = (
            sliced.sliced_costs(es, shapes, sizes, spath, sl)
            if sl
            else pairwise.path_costs(es, shapes, sizes, spath)
        )
        if splan.largest_intermediate <= limit and (best is None or splan.flops < best[0].flops):
            best = (splan, spath, sname, sl)
    if best is not None and (not fits or best[0].flops < lplan.flops):
        return best
    if not fits and too_many:
        raise MemoryBudgetError(
            f"{where}: its intermediates fit path_memory_limit={limit * itemsize} bytes only "
            f"when sliced into {too_many} slices, more than the {MAX_SLICES} allowed (each "
            f"slice runs the whole network again); raise the limit or split the network"
        )
    return lplan, lpath, lstrategy, []


def plan_node(g: EinsumGraph, node: Node, memory_limit_bytes: int | None) -> Node:
    """The einsum record with its planned path and path statistics in its args."""
    in_nodes = [g.node(i) for i in node.inputs]
    shapes = [tuple(int(d) for d in n.shape) for n in in_nodes]
    es = einspec.parse(node.args["spec"], [len(s) for s in shapes])
    sizes = einspec.letter_sizes(es, shapes)
    terms = pairwise.prepared_terms(es, shapes, sizes)
    itemsize = np.dtype(node.dtype).itemsize
    limit = None if memory_limit_bytes is None else max(1, int(memory_limit_bytes) // itemsize)
    path, strategy = choose_path(terms, es.output, sizes)
    # the path's costs, not its program: the backend plans that once, with its dtypes and
    # layouts (only the layout tiebreak of small networks compares programs here)
    plan: Any = pairwise.path_costs(es, shapes, sizes, path)
    slices: list[str] = []
    if limit is not None and plan.largest_intermediate > limit:
        plan, path, strategy, slices = _under_limit(
            es,
            shapes,
            sizes,
            terms,
            plan,
            path,
            strategy,
            limit,
            node.dtype,
            f"einsum {node.name!r} ({einspec._show(node.args['spec'])})",
        )
    if len(terms) <= TIEBREAK_MAX_OPERANDS and not slices:
        plan = pairwise.plan_einsum(es, shapes, sizes, path)
        if plan.copied:
            plan, path = _layout_tiebreak(es, shapes, sizes, plan, path, limit)
    if limit is not None and plan.largest_intermediate > limit:
        raise MemoryBudgetError(
            f"einsum {node.name!r} ({node.args['spec']}): "
            f"the best contraction path found builds an "
            f"intermediate of {plan.largest_intermediate * itemsize} bytes but path_memory_limit "
            f"is {limit * itemsize} bytes; raise the limit or split the network"
        )
    naive = math.prod(sizes.values()) * len(terms)
    info = {
        "strategy": strategy,
        "flops": int(plan.flops),
        "largest_intermediate": int(plan.largest_intermediate),
        "naive_flops": int(naive),
    }
    extra = {}
    if slices:
        n_slices = math.prod(int(sizes[c]) for c in slices)
        info.update(slices="".join(slices), n_slices=n_slices)
        extra["path_slices"] = slices
    base = {k: v for k, v in node.args.items() if k != "path_slices"}
    args = {**base, "path_strategy": [list(p) for p in path], "path_info": info, **extra}
    return replace(node, args=MappingProxyType(args))


def _planned(node: Node) -> bool:
    return "path_info" in node.args and not isinstance(
        node.args.get("path_strategy"), (str, type(None))
    )


def _contraction(graph: EinsumGraph, options: Mapping[str, Any]) -> PassResult:
    """Plan every einsum with three or more operands that has no planned path yet."""
    limit = options.get("path_memory_limit", options.get("memory_limit"))
    todo = [n for n in graph if n.kind == ops.EINSUM and len(n.inputs) >= 3 and not _planned(n)]
    if not todo:
        return PassResult(graph, False, {})
    g = graph.copy()
    flops = largest = hoisted = 0
    for node in todo:
        new = plan_node(g, node, limit)
        # pairs of constants on the path are contracted now, once (``constant_pairs``)
        while (fewer := constant_pairs.hoist(g, new, options)) is not None:
            old_inputs = new.inputs
            new = fewer if len(fewer.inputs) < 3 else plan_node(g, fewer, limit)
            g.replace_node(node.id, new)
            for gone in set(old_inputs) - set(new.inputs):
                remove_if_unused(g, gone)
            hoisted += 1
        g.replace_node(node.id, new)
        info = new.args.get("path_info")
        if info is not None:
            flops += info["flops"]
            largest = max(largest, info["largest_intermediate"])
    if hoisted:
        g.reorder()
    stats = {"planned": len(todo), "flops": flops, "largest_intermediate": largest}
    return PassResult(g, True, {**stats, **({"constant_pairs": hoisted} if hoisted else {})})


contraction = function_pass("contraction", _contraction)
