"""Replay the einsum calls of numpy's and opt_einsum's own test suites through a one-einsum graph.

Runs numpy's ``test_einsum.py`` and opt_einsum's ``test_contract.py`` (installed with them) with
``np.einsum`` / ``opt_einsum.contract`` wrapped to record every call that succeeds, then gives
each unique call (spec or sublists, operand shapes, dtypes, scalar types) to
``g.einsum`` with the recorded operands, as a user would, on the numpy and numba backends at O0
and O2, and compares result and dtype with what numpy/opt_einsum returned (integers and bool bit
for bit). Calls with keyword arguments other than ``optimize`` (numpy-only: ``out``, ``dtype``,
``casting``, ``order``, ...) and object, longdouble and clongdouble operands are left out, as
the issue states. Prints the counts and writes ``results/peer_einsum_suites.json``.
Usage: python benchmarks/peer_einsum_suites.py [--limit N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
from collections import Counter

import numpy as np

from _common import write_results

EXCLUDED_KINDS = {"O"}
EXCLUDED_DTYPES = {np.dtype(np.longdouble), np.dtype(np.clongdouble)}


def _operand_key(x):
    if isinstance(x, np.ndarray):
        return ("a", x.shape, x.dtype.str)
    if isinstance(x, (list, tuple)):
        return ("l", repr(x)) if all(isinstance(i, int) for i in x) else ("la", repr(x))
    if isinstance(x, np.generic):
        return ("g", x.dtype.str)
    return ("s", type(x).__name__)


def _usable(args, kwargs) -> bool:
    if set(kwargs) - {"optimize"}:
        return False
    for x in args:
        if isinstance(x, (np.ndarray, np.generic)):
            if x.dtype.kind in EXCLUDED_KINDS or x.dtype in EXCLUDED_DTYPES:
                return False
    return True


def record(suite: str) -> list[tuple]:
    """Unique (args, result) of the suite's successful einsum calls."""
    import pytest

    calls: dict[tuple, tuple] = {}
    if suite == "numpy":
        import numpy._core.tests.test_einsum as mod

        target, name = np, "einsum"
    else:
        import opt_einsum
        import opt_einsum.tests.test_contract as mod

        target, name = opt_einsum, "contract"
    real = getattr(target, name)

    def spy(*args, **kwargs):
        res = real(*args, **kwargs)
        if _usable(args, kwargs) and not isinstance(res, tuple):
            key = tuple(a if isinstance(a, str) else _operand_key(a) for a in args)
            if key not in calls:
                copied = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
                calls[key] = (copied, np.array(res, copy=True))
        return res

    setattr(target, name, spy)
    if suite == "opt_einsum":
        mod.contract = spy  # the test module imported the name
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            pytest.main(
                [
                    mod.__file__,
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "-x",
                    "--no-header",
                    "-p",
                    "no:randomly",
                ]
            )
    finally:
        setattr(target, name, real)
        if suite == "opt_einsum":
            mod.contract = real
    return list(calls.values())


def replay(args, backend: str, level: int):
    import tensorlogic as tl

    g = tl.EinsumGraph()
    feeds = {}
    new = []
    string_form = isinstance(args[0], str)
    for k, a in enumerate(args):
        if isinstance(a, str):
            new.append(a)
        elif (
            not string_form
            and k % 2 == 1
            or (not string_form and k == len(args) - 1 and len(args) % 2 == 1)
        ):
            new.append(a)  # a sublist (or the output sublist)
        elif isinstance(a, (bool, int, float, complex)) and not isinstance(a, np.generic):
            new.append(a)  # a Python scalar stays one
        else:
            x = np.asarray(a)
            feeds[f"x{k}"] = x
            new.append(g.input(f"x{k}", x.shape, x.dtype.name))
    g.output(g.einsum(*new), "y")
    return np.asarray(tl.compile(g, backend=backend, opt_level=level, cache=False)(feeds)["y"])


def same(got: np.ndarray, want: np.ndarray) -> str | None:
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} vs {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape} vs {want.shape}"
    if want.dtype.kind in "biu":
        return None if np.array_equal(got, want) else "values"
    tol = {2: 4e-3, 4: 2e-5, 8: 1e-12, 16: 1e-12}[
        want.dtype.itemsize // (2 if want.dtype.kind == "c" else 1)
    ]
    scale = float(np.max(np.abs(want), initial=1.0))
    return None if np.allclose(got, want, rtol=tol * 8, atol=tol * scale * 8) else "values"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=0, help="replay at most N calls per suite")
    args = ap.parse_args()
    # a throwaway cache: thousands of small plans would otherwise fill the user's
    os.environ.setdefault("TL_CACHE_DIR", tempfile.mkdtemp(prefix="tl-peer-"))
    rows = []
    for suite in ("opt_einsum", "numpy"):
        calls = record(suite)
        if args.limit:
            calls = calls[: args.limit]
        for backend in ("numpy", "numba"):
            for level in (0, 2):
                outcome: Counter = Counter()
                examples: list[str] = []
                for call_args, want in calls:
                    try:
                        with np.errstate(all="ignore"):
                            why = same(replay(call_args, backend, level), want)
                    except Exception as exc:  # noqa: BLE001 - counted and shown by kind
                        why = f"{type(exc).__name__}: {str(exc)[:160]}"
                    outcome["pass" if why is None else "fail"] += 1
                    if why is not None and len(examples) < 10:
                        spec = call_args[0] if isinstance(call_args[0], str) else "sublists"
                        examples.append(f"{spec}: {why}")
                row = {
                    "suite": suite,
                    "backend": backend,
                    "opt_level": level,
                    "calls": len(calls),
                    "pass": outcome["pass"],
                    "fail": outcome["fail"],
                    "examples": examples,
                }
                rows.append(row)
                print(
                    f"{suite:10s} {backend:6s} O{level}: {row['pass']}/{row['calls']} match"
                    + (f"; e.g. {examples[:3]}" if examples else ""),
                    flush=True,
                )
    write_results("peer_einsum_suites", rows)


if __name__ == "__main__":
    main()
