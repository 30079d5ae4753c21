"""Contraction path search whose compile time pays for itself, and a disk cache of found paths.

A fast path comes first (opt_einsum: ``optimal`` up to 5 operands, ``dp`` up to 16, ``greedy``
above; milliseconds). Its FLOPs estimate the call time; only a network whose estimated call is
long enough to repay a search gets one (cotengra's hyper-optimizer, or opt_einsum's random
greedy without cotengra), with a time budget proportional to that cost: a network that runs in a
millisecond is never searched for seconds. The better of the two paths wins.

Paths of large networks are cached on disk under ``config.cache_dir() / "paths"``, keyed by the
network's structure (the alpha-canonical index pattern, the index sizes and the memory limit),
so a second process compiling the same network reads the path instead of searching again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import opt_einsum

from .. import config
from ..ir import pairwise, spec as einspec

# Cost model for the budget: a conservative rate for the pairwise GEMMs of small networks and a
# per-pair overhead (transpose/reshape bookkeeping); it only has to get the order of magnitude.
ASSUMED_FLOPS_PER_S = 2e9
PAIR_OVERHEAD_S = 5e-6
PAYBACK_CALLS = 10  # a search may cost this many estimated calls ...
MIN_SEARCH_S = 0.05  # ... and is skipped when that is below this (the fast path is kept)
MAX_SEARCH_S = 2.0
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


def _fast_path(terms, output, sizes, memory_limit):
    shapes = [tuple(sizes[c] for c in t) for t in terms]
    eq = ",".join(terms) + "->" + output
    strategy = pairwise.choose_path_strategy(len(terms))
    path, info = opt_einsum.contract_path(
        eq, *shapes, shapes=True, optimize=strategy, memory_limit=memory_limit
    )
    return [tuple(int(i) for i in p) for p in path], strategy, float(info.opt_cost)


def _path_flops(terms, output, sizes, path) -> float:
    shapes = [tuple(sizes[c] for c in t) for t in terms]
    eq = ",".join(terms) + "->" + output
    _, info = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=[tuple(p) for p in path])
    return float(info.opt_cost)


def _searched_path(terms, output, sizes, seconds: float):
    """(path, name) from a search of about ``seconds``: cotengra if installed, else
    opt_einsum's random greedy."""
    try:
        import cotengra
    except ImportError:
        shapes = [tuple(sizes[c] for c in t) for t in terms]
        eq = ",".join(terms) + "->" + output
        opt = opt_einsum.RandomGreedy(max_repeats=128, max_time=seconds, minimize="flops")
        path, _ = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=opt)
        return [tuple(int(i) for i in p) for p in path], "random-greedy"
    opt = cotengra.HyperOptimizer(
        methods=["greedy"],
        max_repeats=128,
        max_time=seconds,
        minimize="flops",
        parallel=False,
        progbar=False,
    )
    tree = opt.search([tuple(t) for t in terms], tuple(output), sizes)
    return [tuple(int(i) for i in p) for p in tree.get_path()], "cotengra"


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
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not _valid_path(doc.get("path"), n):
        return None
    strategy = doc.get("strategy")
    return [tuple(p) for p in doc["path"]], (strategy if isinstance(strategy, str) else "cached")


def _write(file: Path, path, strategy: str) -> None:
    """Write atomically; a cache that cannot be written only costs the next process a search."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"path": [list(p) for p in path], "strategy": strategy}, f)
        os.replace(tmp, file)
    except OSError:
        pass


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
