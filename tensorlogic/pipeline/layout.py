"""Where the batch dimension is: the batch symbol, its axis in each input and output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InputError


@dataclass(frozen=True)
class BatchLayout:
    """The batch symbol of a plan and the axis it takes in each input and output.

    ``symbol`` is None for a graph without symbolic dimensions; its batches are counted along
    axis 0 of the first input. An input or output without the symbol has no entry.
    """

    symbol: str | None
    input_axes: Mapping[str, int]
    output_axes: Mapping[str, int]

    def count(self, batch: Mapping[str, Any]) -> int:
        """Number of items in a batch (0 when it cannot tell: a bad batch fails later)."""
        if not isinstance(batch, Mapping):
            return 0
        for name, axis in self.input_axes.items():
            try:
                shape = getattr(batch.get(name), "shape", None)
                if shape is not None and len(shape) > axis:
                    return int(shape[axis])
            except Exception:  # noqa: BLE001 - a broken array object: the batch fails when it runs
                return 0
        return 0


def batch_layout(plan: Any, symbol: str | None = None) -> BatchLayout:
    """The batch layout of ``plan``; ``symbol`` defaults to the graph's first symbolic dim."""
    graph = plan.graph
    symbols = tuple(plan.symbols)
    if symbol is None:
        symbol = symbols[0] if symbols else None
    elif symbol not in symbols:
        raise InputError(
            f"batch dimension {symbol!r} is not a symbol of the graph; its symbols "
            f"are {list(symbols)}"
        )
    if symbol is None:
        first = next(iter(graph.inputs), None)
        axes = {first: 0} if first is not None and graph.node(graph.inputs[first]).shape else {}
        return BatchLayout(None, axes, {})

    def axis_of(shape: tuple) -> int | None:
        return shape.index(symbol) if symbol in shape else None

    ins = {
        n: a
        for n, nid in graph.inputs.items()
        if (a := axis_of(tuple(graph.node(nid).shape))) is not None
    }
    outs = {
        n: a
        for n, nid in graph.outputs.items()
        if (a := axis_of(tuple(graph.node(nid).shape))) is not None
    }
    return BatchLayout(symbol, ins, outs)


def repeated_batch_axes(plan: Any, symbol: str) -> list[str]:
    """Inputs and outputs whose shape holds the batch symbol more than once (e.g. ("B", "B")):
    splitting or concatenating along one of those axes would be wrong."""
    graph = plan.graph
    found = []
    for what, table in (("input", graph.inputs), ("output", graph.outputs)):
        for name, nid in table.items():
            shape = tuple(graph.node(nid).shape)
            if shape.count(symbol) > 1:
                found.append(f"{what} {name!r} {shape}")
    return found


__all__ = ["BatchLayout", "batch_layout", "repeated_batch_axes"]
