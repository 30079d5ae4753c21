"""Memory planning: where every intermediate buffer lives in the arena.

Liveness is the first and last step that touches a buffer; views extend the life of the buffer
they look into (their root). An elementwise step may write its output over an input that dies at
that step (in place): the two then form one storage with the union of their lifetimes. Storages
whose lifetimes do not overlap may share bytes; each gets an aligned byte offset in one arena,
placed greedily by size with best fit among the gaps left by storages that live at the same time.

Graph inputs, constants and outputs never get arena memory, so they are never overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..runtime.units import format_bytes
from .schedule import Buffer

ALIGNMENT = 64  # bytes: a cache line, and what SIMD loads and BLAS like

# (input buffer ids, output buffer id) or (inputs, output, scratch buffer ids) per step
StepIO = tuple


@dataclass(frozen=True)
class MemoryPlan:
    """Arena layout of the intermediate and scratch buffers.

    ``offsets[buffer_id]`` is the byte offset of a buffer that owns arena memory; views, inputs,
    constants and outputs have none. ``naive_bytes`` is what all of them would take at once,
    each in its own memory; ``peak_bytes`` is the arena size the plan holds per concurrent call;
    ``live_bytes`` is the most bytes live at one step, a lower bound on any layout's peak.
    ``inplace[step]`` is the input buffer a step overwrites.
    """

    offsets: dict[int, int]
    naive_bytes: int
    peak_bytes: int
    live_bytes: int = 0
    lifetimes: dict[int, tuple[int, int]] = field(default_factory=dict)
    inplace: dict[int, int] = field(default_factory=dict)
    reuse: bool = True
    alignment: int = ALIGNMENT

    @property
    def arena_bytes(self) -> int:
        """Bytes of one arena (equal to ``peak_bytes``)."""
        return self.peak_bytes

    def __str__(self) -> str:
        saved = 1 - self.peak_bytes / self.naive_bytes if self.naive_bytes else 0.0
        how = "reuse" if self.reuse else "no reuse"
        return (
            f"memory: planned peak {format_bytes(self.peak_bytes)} vs naive "
            f"{format_bytes(self.naive_bytes)} "
            f"({saved:.0%} saved; {how}, {len(self.offsets)} buffer(s), "
            f"{len(self.inplace)} in place, live lower bound {format_bytes(self.live_bytes)})"
        )


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def roots(buffers: Sequence[Buffer]) -> dict[int, int]:
    """The buffer each buffer's memory belongs to (itself, or the base of a chain of views)."""
    root: dict[int, int] = {}
    for b in sorted(buffers, key=lambda b: b.id):
        root[b.id] = root[b.view_of] if b.view_of is not None else b.id
    return root


def _split(io: StepIO) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    return (io[0], io[1], tuple(io[2]) if len(io) > 2 else ())


def lifetimes(buffers: Sequence[Buffer], step_io: Sequence[StepIO]) -> dict[int, tuple[int, int]]:
    """(first, last) step index of each root buffer touched by some step.

    ``step_io`` lists (input ids, output id[, scratch ids]) per step; a view's uses count as uses
    of its root.
    """
    root = roots(buffers)
    life: dict[int, list[int]] = {}
    for k, io in enumerate(step_io):
        ins, out, scratch = _split(io)
        for bid in (*ins, out, *scratch):
            r = root[bid]
            if r in life:
                life[r][1] = k
            else:
                life[r] = [k, k]
    return {b: (a, z) for b, (a, z) in life.items()}


def _owns_memory(b: Buffer) -> bool:
    return b.view_of is None and b.role in ("intermediate", "scratch")


def _inplace_groups(
    buffers: Sequence[Buffer],
    step_io: Sequence[StepIO],
    inplace_ok: Mapping[int, Sequence[int]],
    life: dict[int, tuple[int, int]],
    root: dict[int, int],
) -> tuple[dict[int, int], dict[int, int]]:
    """Merge step outputs into inputs that die there; returns (buffer -> group, step -> input)."""
    group = {b.id: b.id for b in buffers}
    span = dict(life)  # group id -> (first, last)
    chosen: dict[int, int] = {}
    for k, positions in sorted(inplace_ok.items()):
        ins, out, _ = _split(step_io[k])
        ob = buffers[out]
        if not _owns_memory(ob) or ob.role != "intermediate" or out not in life:
            continue
        for pos in positions:
            bid = ins[pos]
            b = buffers[bid]
            if not (_owns_memory(b) and b.role == "intermediate"):
                continue  # inputs, constants, outputs and views are never overwritten
            if b.shape != ob.shape or b.dtype != ob.dtype:
                continue  # a broadcast input or another dtype is not the same memory layout
            g = group[bid]
            if span[g][1] != k:
                continue  # still needed after this step (directly or through a view)
            # every other use of this memory in the step must be the same array at a position
            # the kernel declared alias-safe (a view of it, or an unsafe position, would be read
            # after the kernel started writing)
            if any(root[i] == bid and (i != bid or j not in positions) for j, i in enumerate(ins)):
                continue
            group[out] = g
            span[g] = (span[g][0], life[out][1])
            chosen[k] = bid
            break
    return group, chosen


def plan_memory(
    buffers: Sequence[Buffer],
    step_io: Sequence[StepIO],
    inplace_ok: Mapping[int, Sequence[int]] | None = None,
    *,
    reuse: bool = True,
    alignment: int = ALIGNMENT,
) -> MemoryPlan:
    """Assign arena offsets to the buffers that own memory (intermediates and scratch).

    Args:
        buffers: every buffer of the plan, indexed by id.
        step_io: per step, (input ids, output id) or (input ids, output id, scratch ids).
        inplace_ok: step index -> input positions the step's kernel may overwrite.
        reuse: share memory between buffers whose lifetimes do not overlap (False: naive layout).
        alignment: byte alignment of every offset.
    """
    buffers = list(buffers)
    life = lifetimes(buffers, step_io)
    root = roots(buffers)
    owners = [b for b in buffers if _owns_memory(b) and b.id in life]
    naive = sum(_align(b.nbytes, alignment) for b in owners)
    if not reuse:
        offsets, pos = {}, 0
        for b in owners:
            offsets[b.id] = pos
            pos += _align(b.nbytes, alignment)
        return MemoryPlan(offsets, naive, pos, pos, life, {}, False, alignment)

    group, chosen = _inplace_groups(buffers, step_io, inplace_ok or {}, life, root)
    members: dict[int, list[Buffer]] = {}
    for b in owners:
        members.setdefault(group[b.id], []).append(b)
    storages = []  # (size, first, last, group id)
    for g, bs in members.items():
        first = min(life[b.id][0] for b in bs)
        last = max(life[b.id][1] for b in bs)
        storages.append((_align(max(b.nbytes for b in bs), alignment), first, last, g))
    # big storages first (earlier first on ties): the classic greedy-by-size order
    storages.sort(key=lambda s: (-s[0], s[1], s[3]))
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    where: dict[int, int] = {}
    # the placed storages as arrays, so each new one scans them in C, not Python: a plan of a
    # few thousand buffers (a backward graph) would spend seconds in this loop otherwise
    n = len(storages)
    p_off, p_size, p_first, p_last = (np.zeros(n, np.int64) for _ in range(4))
    for k, (size, first, last, g) in enumerate(storages):
        hit = np.flatnonzero((p_first[:k] <= last) & (p_last[:k] >= first) & (p_size[:k] > 0))
        off = 0
        if hit.size:
            order = hit[np.lexsort((p_size[hit], p_off[hit]))]  # by offset, then size
            o, ends = p_off[order], p_off[order] + p_size[order]
            cursor = np.maximum(np.concatenate(([0], np.maximum.accumulate(ends)[:-1])), 0)
            gaps = o - cursor
            fits = np.flatnonzero(gaps >= size)
            if fits.size:  # the smallest gap that fits (the first of equal ones)
                off = int(cursor[fits[np.argmin(gaps[fits])]])
            else:
                off = max(int(ends.max()), 0)
        p_off[k], p_size[k], p_first[k], p_last[k] = off, size, first, last
        placed.append((off, size, first, last))
        where[g] = off
    peak = max((o + sz for o, sz, _, _ in placed), default=0)
    offsets = {b.id: where[group[b.id]] for b in owners}
    # the largest sum of sizes alive at one step: a sweep over lifetime starts and ends
    delta = [0] * (len(step_io) + 1)
    for _, sz, f, z in placed:
        delta[f] += sz
        delta[z + 1] -= sz
    live = running = 0
    for d in delta:
        running += d
        live = max(live, running)
    return MemoryPlan(offsets, naive, peak, live, life, chosen, True, alignment)
