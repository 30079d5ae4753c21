"""Memory planning: where every intermediate buffer lives.

Liveness is the first and last step that touches a buffer (views extend the life of the buffer
they look into). Buffers whose lifetimes do not overlap may share a slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .schedule import Buffer


@dataclass(frozen=True)
class MemoryPlan:
    """Slot assignment of the intermediate buffers.

    ``slots[buffer_id]`` is the slot index; ``slot_bytes[k]`` the size of slot k.
    ``naive_bytes`` is the memory all intermediates would take at once, ``peak_bytes`` what the
    plan holds (the sum of the slots).
    """

    slots: dict[int, int]
    slot_bytes: tuple[int, ...]
    naive_bytes: int
    peak_bytes: int
    lifetimes: dict[int, tuple[int, int]] = field(default_factory=dict)
    inplace: dict[int, int] = field(default_factory=dict)  # step index -> input buffer reused

    def __str__(self) -> str:
        return (f"memory: {len(self.slot_bytes)} slot(s), planned peak {_fmt(self.peak_bytes)} "
                f"vs naive {_fmt(self.naive_bytes)}")


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def lifetimes(buffers: list[Buffer], step_io: list[tuple[tuple[int, ...], int]]) -> dict[int, tuple[int, int]]:
    """(first, last) step index for each buffer; step_io lists (input ids, output id) per step."""
    root = {b.id: b.id for b in buffers}
    for b in buffers:
        if b.view_of is not None:
            root[b.id] = root[b.view_of]
    life: dict[int, list[int]] = {}
    for k, (ins, out) in enumerate(step_io):
        for bid in (*ins, out):
            r = root[bid]
            if r in life:
                life[r][1] = k
            else:
                life[r] = [k, k]
    return {b: (a, z) for b, (a, z) in life.items()}


def plan_memory(buffers: list[Buffer], step_io: list[tuple[tuple[int, ...], int]]) -> MemoryPlan:
    """One slot per intermediate buffer (no sharing); the reuse issue improves on this."""
    life = lifetimes(buffers, step_io)
    slots: dict[int, int] = {}
    sizes: list[int] = []
    for b in buffers:
        if b.role == "intermediate" and b.view_of is None:
            slots[b.id] = len(sizes)
            sizes.append(b.nbytes)
    total = sum(sizes)
    return MemoryPlan(slots, tuple(sizes), total, total, life)
