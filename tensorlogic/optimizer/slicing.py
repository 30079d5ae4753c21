"""Slicing choices for contraction paths whose largest intermediate exceeds the memory limit.

cotengra picks the contracted indices to slice (inner indices only) along a given path, or
searches paths and slices together; ``ir.sliced.plan_sliced`` builds the program of the slices.
"""

from __future__ import annotations


def choose_slices(
    terms: list[str], output: str, sizes: dict[str, int], path, limit: int
) -> list[str] | None:
    """Contracted letters to slice so that every intermediate along ``path`` has at most
    ``limit`` elements (cotengra's slicing), or None when cotengra is missing or cannot."""
    try:
        import cotengra
    except ImportError:
        return None
    used = {c for t in terms for c in t}
    tree = cotengra.ContractionTree.from_path(
        [tuple(t) for t in terms],
        tuple(output),
        {c: int(sizes[c]) for c in used},
        path=[tuple(p) for p in path],
    )
    try:
        sliced = tree.slice(target_size=max(int(limit), 1), allow_outer=False, seed=0)
    except RuntimeError:  # the output alone, or an intermediate of output indices, is too large
        return None
    if sliced.max_size() > limit or not sliced.sliced_inds:
        return None
    return sorted(sliced.sliced_inds)


def search_sliced(terms: list[str], output: str, sizes: dict[str, int], limit: int, seconds: float):
    """(path, sliced letters, maybe none) from cotengra's hyper-optimizer searching paths and
    slices together for about ``seconds`` (a path chosen without the limit may slice badly), or
    None when cotengra is missing or finds nothing under the limit."""
    try:
        import cotengra
    except ImportError:
        return None
    used = {c for t in terms for c in t}
    opt = cotengra.HyperOptimizer(
        # few repeats: each trial slices its tree, which can take seconds under a tight limit,
        # and max_time is only checked between trials
        methods=["greedy"],
        max_repeats=8,
        max_time=seconds,
        minimize="flops",
        slicing_opts={"target_size": max(int(limit), 1), "allow_outer": False},
        parallel=False,
        progbar=False,
    )
    try:
        tree = opt.search(
            [tuple(t) for t in terms], tuple(output), {c: int(sizes[c]) for c in used}
        )
    except RuntimeError:
        return None
    if tree.max_size() > limit:
        return None
    # no sliced letters: the search found a path that fits the limit as it is
    return [tuple(int(i) for i in p) for p in tree.get_path()], sorted(tree.sliced_inds)
