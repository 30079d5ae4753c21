"""Canonical loop layouts for generated kernels: drop unit dims, merge compatible neighbours.

A fused group iterates over a ``space`` (the broadcast of its inputs' shapes). Two neighbouring
dimensions can be walked as one when every input is either full in both or broadcast in both,
and both play the same role (kept or reduced by a reduction tail; before, on or after a row-op
axis). After merging, the common cases become rank 1 (all inputs full: one flat loop) or rank 2
(bias or row scaling: rows x columns), which is what the generated loops are best at.

The layout depends on shapes only through which dims are 1; the sizes themselves are passed to
the kernel at run time, so one compiled kernel serves every size with the same pattern.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import BackendError
from ...ir import ops

# Roles of a dimension: "e" elementwise, "k" kept / "r" reduced (reduction tail),
# "o" outer / "a" axis / "i" inner (row op).


@dataclass(frozen=True)
class Layout:
    """The collapsed iteration space and how each input and the output map onto it."""

    dims: tuple[int, ...]  # collapsed sizes, rank >= 1
    roles: tuple[str, ...]  # role per collapsed dim
    full: tuple[tuple[bool, ...], ...]  # per input, per collapsed dim: True = indexed, False = 1
    count: int  # number of reduced elements per output element (for mean)

    @property
    def rank(self) -> int:
        """Rank of the collapsed space."""
        return len(self.dims)

    def input_shape(self, k: int) -> tuple[int, ...]:
        """Shape input ``k`` is reshaped to (1 where it is broadcast)."""
        return tuple(d if f else 1 for d, f in zip(self.dims, self.full[k]))

    def output_shape(self) -> tuple[int, ...]:
        """Shape the output buffer is viewed as: the space, or the flat kept elements."""
        if any(r in ("k", "r") for r in self.roles):
            return (math.prod(d for d, r in zip(self.dims, self.roles) if r == "k"),)
        return self.dims

    def pattern(self) -> tuple:
        """What the generated source depends on: roles and broadcast flags, not sizes."""
        return (self.roles, self.full)


def _roles(rank: int, tail: str | None, axes: tuple[int, ...]) -> list[str]:
    if tail is None:
        return ["e"] * rank
    if tail in ops.ROW_OPS:
        (ax,) = axes
        return ["o" if d < ax else "a" if d == ax else "i" for d in range(rank)]
    return ["r" if d in axes else "k" for d in range(rank)]


def make_layout(
    space: tuple[int, ...],
    in_shapes: list[tuple[int, ...]],
    tail: str | None,
    axes: tuple[int, ...],
) -> Layout:
    """Collapse ``space`` for inputs of ``in_shapes`` (numpy-broadcastable to it)."""
    rank = len(space)
    roles = _roles(rank, tail, axes)
    padded = []
    for s in in_shapes:
        if len(s) > rank:
            raise BackendError(f"input of shape {s} has a higher rank than the space {space}")
        p = (1,) * (rank - len(s)) + tuple(s)
        for a, b in zip(p, space):
            if a != b and a != 1:
                raise BackendError(f"input of shape {s} does not broadcast to the space {space}")
        padded.append(p)
    count = math.prod(space[d] for d in range(rank) if roles[d] == "r")
    dims: list[int] = []
    rls: list[str] = []
    full: list[list[bool]] = [[] for _ in in_shapes]
    for d in range(rank):
        # unit dims carry nothing; a row-op axis stays even when it is 1 (it defines the rows)
        if space[d] == 1 and roles[d] != "a":
            continue
        flags = [p[d] != 1 or space[d] == 1 for p in padded]
        if (
            dims
            and rls[-1] == roles[d]
            and roles[d] != "a"
            and all(f[-1] == g for f, g in zip(full, flags))
        ):
            dims[-1] *= space[d]
            continue
        dims.append(space[d])
        rls.append(roles[d])
        for f, g in zip(full, flags):
            f.append(g)
    if not dims:  # a scalar space (or all unit dims): one element
        dims, rls = [1], ["k" if tail is not None and tail not in ops.ROW_OPS else "e"]
        full = [[True] for _ in in_shapes]
    return Layout(tuple(dims), tuple(rls), tuple(tuple(f) for f in full), count)
