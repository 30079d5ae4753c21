"""Choosing a batch size: the largest one whose planned memory fits the budget."""

from __future__ import annotations

from typing import Any

from ..errors import MemoryBudgetError

# Share of the backend's free memory a batch may plan for when no memory_limit is set: the rest
# is headroom for the caller's arrays, the concatenated results and everything else running.
FREE_MEMORY_SHARE = 0.5


def planned_bytes(plan: Any, symbol: str, size: int, sizes: dict[str, int]) -> int | None:
    """Intermediates peak plus outputs of the plan specialized at ``symbol=size``.

    None when the plan refuses that size (its own ``memory_limit`` is exceeded).
    """
    try:
        cp = plan.specialize(**{**sizes, symbol: size})
    except MemoryBudgetError:
        return None
    return cp.planned_bytes


def memory_budget(plan: Any) -> int | None:
    """The plan's ``memory_limit`` option, else a share of the backend's free memory."""
    limit = plan.options["memory_limit"]
    if limit is not None:
        return int(limit)
    free = plan.backend.free_memory()
    return None if free is None else int(free * FREE_MEMORY_SHARE)


def pick_batch_size(
    plan: Any, symbol: str, n_items: int, sizes: dict[str, int], budget: int, concurrent: int = 1
) -> int:
    """Largest batch size (at most ``n_items``) whose planned bytes, times the number of
    batches computed at once, fit ``budget``.

    Planned memory grows about linearly with the batch size: two small probes give the slope,
    the estimate is checked against the real plan, then bisection narrows it to within ~2%.
    Each probe specializes (and caches) the plan at that size; no memory is allocated.
    """
    cap = budget // max(1, concurrent)

    def need(b: int) -> float:
        got = planned_bytes(plan, symbol, b, sizes)
        return float("inf") if got is None else got

    if need(n_items) <= cap:
        return n_items
    one = need(1)
    if one > cap:
        raise MemoryBudgetError(
            f"even a batch of one item needs {one:.0f} bytes but the budget is {cap} bytes "
            f"per batch ({concurrent} at once); raise memory_limit or free memory"
        )
    slope = max(need(2) - one, 1.0)
    lo, hi = 1, n_items  # need(lo) fits, need(hi) does not
    guess = int((cap - (one - slope)) // slope)
    # a few probes: the affine estimate first, then bisection to within ~2%
    for _ in range(24):
        if hi - lo <= max(1, lo // 64):
            break
        b = guess if lo < guess < hi else (lo + hi) // 2
        step = max(1, b // 64)
        if need(b) <= cap:
            lo, guess = b, b + step  # the estimate fits: check just above it
        else:
            hi, guess = b, b - step
    return lo


__all__ = ["FREE_MEMORY_SHARE", "memory_budget", "pick_batch_size", "planned_bytes"]
