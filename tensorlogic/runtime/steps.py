"""The one step loop: every plan call, profiled or not, captured into a CUDA graph or not, runs
its steps here.

A program is a list of ``(fn, input_ids, output_id)``; ``env`` is the call's buffer table. An
observer passes ``after_step(k)``, called after step k with the step's result in ``env``.
"""

from __future__ import annotations

from collections.abc import Callable, MutableSequence, Sequence
from typing import Any

Program = Sequence[tuple[Callable[[list, Any], Any], tuple[int, ...], int]]


def run_program(
    program: Program, env: MutableSequence[Any], after_step: Callable[[int], None] | None = None
) -> None:
    """Run every step of ``program`` over ``env`` in order."""
    if after_step is None:
        for fn, ins, o in program:
            env[o] = fn([env[i] for i in ins], env[o])
        return
    for k, (fn, ins, o) in enumerate(program):
        env[o] = fn([env[i] for i in ins], env[o])
        after_step(k)


__all__ = ["Program", "run_program"]
