"""Contraction path search whose compile time pays for itself, and a disk cache of found paths.

A fast path comes first (opt_einsum: ``optimal`` up to 5 operands, ``dp`` up to 16, ``greedy``
above; milliseconds). Its FLOPs estimate the call time; only a network whose estimated call is
long enough to repay a search gets one, with a time budget proportional to that cost: a
network that runs in a millisecond is never searched for seconds. The search stops early once it
has spent a few calls of the best path found so far, and uses cotengra's hyper-optimizer only
when its budget dwarfs cotengra's import (else opt_einsum's random greedy, loaded already). The
better of the two paths wins.

Paths of large networks are cached on disk under ``config.cache_dir() / "paths"``, keyed by the
network's structure (the alpha-canonical index pattern, the index sizes and the memory limit),
so a second process compiling the same network reads the path instead of searching again.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import opt_einsum

from .. import config
from ..ir import pair_layout, pairwise, spec as einspec
from ..runtime import json_cache

# Cost model for the budget: a conservative rate for the pairwise GEMMs of small networks and a
# per-pair overhead (transpose/reshape bookkeeping); it only has to get the order of magnitude.
ASSUMED_FLOPS_PER_S = 2e9
PAIR_OVERHEAD_S = 5e-6
# a search may cost this many estimated calls (of the best path found so far): the first
# compile's target is ten calls, planning and kernels included ...
PAYBACK_CALLS = 5
MIN_SEARCH_S = 0.05  # ... and is skipped when that is below this (the fast path is kept)
MAX_SEARCH_S = 2.0
SEARCH_ROUND = 4  # trials between checks of the time spent
SEARCH_MAX_TRIALS = 128
# cotengra is imported for a search of at least this budget (its import alone: 0.25-0.75 s);
# shorter searches use opt_einsum's random greedy, loaded already
COTENGRA_MIN_SEARCH_S = 1.0
SEARCH_MIN_OPERANDS = 17  # up to 16 operands the fast path is already dp (optimal in FLOPs)
CACHE_MIN_OPERANDS = 16  # smaller networks plan faster than a cache file is read
CACHE_VERSION = 1


@dataclass(frozen=True)
class Budget:
    """What the search of one network may cost: ``seconds`` 0 means the fast path only."""

    estimated_call_s: float
    seconds: float

    @property
    def search(self) -> bool:
        return self.seconds > 0


def budget_for(flops: float, n_operands: int) -> Budget:
    """The search budget for a network whose fast path costs ``flops``."""
    call = flops / ASSUMED_FLOPS_PER_S + PAIR_OVERHEAD_S * max(n_operands - 1, 0)
    seconds = min(PAYBACK_CALLS * call, MAX_SEARCH_S)
    if n_operands < SEARCH_MIN_OPERANDS or seconds < MIN_SEARCH_S:
        seconds = 0.0
    return Budget(call, seconds)


def likely_call_s(flops: float, n_operands: int) -> float:
    """The pair planner's estimate of a path's call (about 5x below ``budget_for``'s): the
    decision to search takes the conservative rate, so a network that may be slow is searched,
    and the search stops by this one, within a few real calls of the best path it found (a 6x6
    lattice of bond 5: 2.4e7 FLOPs, 1.5 ms a call, 11 ms by the conservative rate)."""
    return pair_layout.estimate_ns(0, max(n_operands - 1, 0), int(flops)) * 1e-9


def _fast_path(terms, output, sizes, memory_limit):
    strategy = pairwise.choose_path_strategy(len(terms))
    inputs = [frozenset(t) for t in terms]
    if len(terms) <= 2:
        path = [tuple(range(len(terms)))]
    else:
        # opt_einsum's path function itself: ``contract_path`` also builds a PathInfo (einsum
        # strings, shapes and BLAS checks of every step), which at 200 operands took as long
        # as the greedy search
        find = opt_einsum.paths.get_path_fn(strategy)
        limit = None if memory_limit is None else int(memory_limit)
        path = find(inputs, frozenset(output), sizes, limit)
    path = [tuple(int(i) for i in p) for p in path]
    return path, strategy, _path_flops(terms, output, sizes, path)


def _path_flops(terms, output, sizes, path) -> float:
    """opt_einsum's cost of ``path`` (its PathInfo's ``opt_cost``), without the PathInfo."""
    inputs = [frozenset(t) for t in terms]
    out = frozenset(output)
    cost = 0
    for step in path:
        step = tuple(sorted(step, reverse=True))
        _, inputs, removed, contracted = opt_einsum.helpers.find_contraction(step, inputs, out)
        cost += opt_einsum.helpers.flop_count(contracted, bool(removed), len(step), sizes)
    return float(cost)


def _searched_path(terms, output, sizes, seconds: float):
    """(path, name) from a search of at most ``seconds``: cotengra's hyper-optimizer where it
    is worth its import, else opt_einsum's random greedy.

    The search runs in rounds of a few trials and stops once it has spent ``PAYBACK_CALLS``
    estimated calls of the best path found so far: a search that finds a path four times
    cheaper than the fast path's also stops four times sooner, so the network's first compile
    stays within a few of its (new, shorter) calls.
    """
    inputs = [frozenset(t) for t in terms]
    out = frozenset(output)
    t0 = time.perf_counter()
    opt = _cotengra_optimizer(seconds)
    if opt is None:
        name = "random-greedy"
        opt = opt_einsum.RandomGreedy(max_repeats=SEARCH_ROUND, minimize="flops")

        def round_():
            return opt(inputs, out, sizes)
    else:
        name = "cotengra"
        tree_inputs = [tuple(t) for t in terms]

        def round_():
            return opt.search(tree_inputs, tuple(output), sizes).get_path()

    best, best_flops = None, float("inf")
    trials = 0
    while True:
        path = [tuple(int(i) for i in p) for p in round_()]
        trials += SEARCH_ROUND
        flops = _path_flops(terms, output, sizes, path)
        if flops < best_flops:
            best, best_flops = path, flops
        spent = time.perf_counter() - t0
        call = likely_call_s(best_flops, len(terms))
        if spent >= min(seconds, PAYBACK_CALLS * call) or trials >= SEARCH_MAX_TRIALS:
            return best, name


def _cotengra_optimizer(seconds: float):
    """cotengra's hyper-optimizer (greedy trials), or None when it is not installed or its
    first import in this process (0.25-0.75 s on a 2-vCPU machine) would eat the budget."""
    if "cotengra" not in sys.modules and seconds < COTENGRA_MIN_SEARCH_S:
        return None
    try:
        import cotengra
    except ImportError:
        return None
    return cotengra.HyperOptimizer(
        methods=["greedy"],
        max_repeats=SEARCH_ROUND,
        max_time=None,
        minimize="flops",
        parallel=False,
        progbar=False,
    )


def _cache_key(terms, output, sizes, memory_limit) -> str:
    es = einspec.canonical(einspec.EinsumSpec(tuple(terms), output))
    rename = dict(
        zip(
            einspec.EinsumSpec(tuple(terms), output).letters,
            einspec.EinsumSpec(es.inputs, es.output).letters,
        )
    )
    canon_sizes = sorted((rename[c], int(d)) for c, d in sizes.items() if c in rename)
    doc = json.dumps([CACHE_VERSION, str(es), canon_sizes, memory_limit], ensure_ascii=True)
    return hashlib.sha256(doc.encode()).hexdigest()


def cache_path(terms, output, sizes, memory_limit=None) -> Path:
    """The cache file of a network's path (whether or not it exists)."""
    key = _cache_key(terms, output, sizes, memory_limit)
    return config.cache_dir() / "paths" / f"{key}.json"


def _valid_path(path, n: int) -> bool:
    """Whether ``path`` contracts n operands to one (a cache file is data, not trusted)."""
    if not isinstance(path, list):
        return False
    left = n
    for step in path:
        if (
            not isinstance(step, list)
            or not 1 <= len(step) <= left
            or any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < left for i in step)
            or len(set(step)) != len(step)
        ):
            return False
        left = left - len(step) + 1
    return left == 1


def _read(file: Path, n: int):
    doc = json_cache.read(file)
    if not isinstance(doc, dict) or not _valid_path(doc.get("path"), n):
        return None
    strategy = doc.get("strategy")
    return [tuple(p) for p in doc["path"]], (strategy if isinstance(strategy, str) else "cached")


def _write(file: Path, path, strategy: str) -> None:
    """Write atomically; a cache that cannot be written only costs the next process a search."""
    json_cache.write(file, {"path": [list(p) for p in path], "strategy": strategy})


def find_path(
    terms: list[str], output: str, sizes: dict[str, int], memory_limit: int | None = None
) -> tuple[list[tuple[int, ...]], str]:
    """(path, strategy name) for a network of letter terms; ``memory_limit`` in elements.

    The strategy name ends in ``+cache`` when the path came from the disk cache.
    """
    n = len(terms)
    cached = n >= CACHE_MIN_OPERANDS
    if cached:
        file = cache_path(terms, output, sizes, memory_limit)
        hit = _read(file, n)
        if hit is not None:
            return hit[0], hit[1] + "+cache"
    path, strategy, flops = _fast_path(terms, output, sizes, memory_limit)
    budget = budget_for(flops, n)
    if budget.search and memory_limit is None:
        other, name = _searched_path(terms, output, sizes, budget.seconds)
        if _path_flops(terms, output, sizes, other) < flops:
            path, strategy = other, name
    if cached:
        _write(file, path, strategy)
    return path, strategy
