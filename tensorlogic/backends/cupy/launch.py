"""Launch geometry of a spec's compiled variants (no CuPy needed, so it is tested on CI).

A spec compiles to a scalar kernel and, where ``ptx.vector_width`` allows, a vector one (16-byte
accesses). Each gets a fixed (grid, block) here, and with programmatic dependent launch the
``griddepcontrol`` mode its code opens with (``ptx.PDL_MODES``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import ptx
from .spec import SPLIT_THREADS, KernelSpec, row_block, row_layout

EW_BLOCK = 256  # threads per block of elementwise and thread-per-point kernels


@dataclass(frozen=True)
class Variant:
    """One compiled form of a spec: its grid, block and PDL mode ("" without PDL)."""

    vector: bool
    grid: int
    block: int
    pdl: str


def geometry(spec: KernelSpec, vector: bool, sms: int) -> tuple[int, int]:
    """(grid, block) of a spec's scalar or vector variant (grid-stride loops cap the grid at 32
    blocks per multiprocessor)."""
    cap = sms * 32
    w = ptx.vector_width(spec) if vector else 1
    if vector and not w:
        raise ValueError("this spec has no vector variant")
    if spec.family == "ew":
        return max(1, min(math.ceil(spec.total / w / EW_BLOCK), cap)), EW_BLOCK
    if spec.family == "split":
        return spec.sizes[0] * spec.splits, SPLIT_THREADS
    if spec.family == "row":
        lay = row_layout(spec, w)
        if lay is None:
            return max(1, min(spec.sizes[0], cap)), row_block(spec.sizes[1])
        return max(1, min(math.ceil(spec.sizes[0] / lay.rows), cap)), lay.block
    return max(1, min(math.ceil(spec.sizes[0] * spec.sizes[2] / EW_BLOCK), cap)), EW_BLOCK


def variants(spec: KernelSpec, sms: int, pdl: bool, vector: bool = True) -> list[Variant]:
    """The scalar variant and, if the spec has one and ``vector``, the vector variant.

    With PDL, a grid of at most one block per multiprocessor lets the next grid be scheduled at
    once (its blocks wait in ``griddepcontrol.wait`` on otherwise idle multiprocessors); a larger
    grid only waits, so blocks of the next grid never hold back its own later blocks.
    """
    out = []
    for vec in (False, True) if vector and ptx.vector_width(spec) else (False,):
        grid, block = geometry(spec, vec, sms)
        mode = ("trigger" if grid <= sms else "wait") if pdl else ""
        out.append(Variant(vec, grid, block, mode))
    return out
