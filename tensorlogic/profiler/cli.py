"""``tensorlogic profile GRAPH.json|PROGRAM.tl``: run under the profiler, print table and report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import InputError, TensorLogicError
from .summary import SORT_KEYS


def add_parser(sub: Any) -> None:
    """Register the ``profile`` subcommand."""
    p = sub.add_parser("profile", help="profile a saved graph (.json) or a program (.tl)")
    p.add_argument("target", help="GRAPH.json or PROGRAM.tl")
    p.add_argument("--inputs", help="IN.npz with one array per graph input (default: random)")
    p.add_argument("--backend", default="auto")
    p.add_argument("--opt-level", type=int, default=2)
    p.add_argument("--repeat", type=int, default=10, help="profiled calls (default 10)")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here")
    p.add_argument("--roofline", help="write a roofline chart PNG here")
    p.add_argument("--timeline", help="write a timeline chart PNG here")
    p.add_argument("--sort-by", default="total", choices=SORT_KEYS)
    p.add_argument("--row-limit", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.set_defaults(func=cmd_profile)


def _random_inputs(graph: Any, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, nid in graph.inputs.items():
        node = graph.node(nid)
        if any(isinstance(d, str) for d in node.shape):
            raise InputError(
                f"input {name!r} has symbolic shape {tuple(node.shape)}; give its "
                "arrays with --inputs IN.npz"
            )
        out[name] = rng.standard_normal(tuple(node.shape)).astype(node.dtype)
    return out


def _graph_runner(path: Path, args: argparse.Namespace) -> Callable[[], Any]:
    from ..compiler.compile import compile as compile_graph
    from ..ir.graph import EinsumGraph
    from ..ir.serialize import load_npz

    g = EinsumGraph.load(path)
    inputs = load_npz(args.inputs) if args.inputs else _random_inputs(g, args.seed)
    state: dict[str, Any] = {}

    def run() -> Any:
        if "plan" not in state:  # compiled inside the profile: its events are recorded
            state["plan"] = compile_graph(g, backend=args.backend, opt_level=args.opt_level)
        return state["plan"](inputs)

    return run


def _program_runner(path: Path, args: argparse.Namespace) -> Callable[[], Any]:
    import tensorlogic as tl

    load = getattr(tl, "load_program", None)
    if load is None:
        raise TensorLogicError(
            f"{path.name}: .tl programs need the language front end "
            "(tl.load_program), which this build does not include"
        )
    from ..ir.serialize import load_npz

    prog = load(path)
    data = load_npz(args.inputs) if args.inputs else {}
    return lambda: prog.run(backend=args.backend, **data)


def cmd_profile(args: argparse.Namespace) -> int:
    """Run the target ``--repeat`` times under the profiler; print the table and the report."""
    from .timeline import profile

    target = Path(args.target)
    if args.repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {args.repeat}")
    if args.row_limit < 1:
        raise InputError(f"--row-limit must be at least 1, got {args.row_limit}")
    if not target.exists():
        raise InputError(f"{target}: no such file")
    if target.suffix == ".json":
        run = _graph_runner(target, args)
    elif target.suffix == ".tl":
        run = _program_runner(target, args)
    else:
        raise InputError(f"{target.name}: expected a graph .json or a program .tl file")
    with profile() as prof:
        for _ in range(args.repeat):
            run()
    print(prof.table(sort_by=args.sort_by, row_limit=args.row_limit))
    print()
    report = prof.bottlenecks()
    print(report)
    if args.trace:
        prof.export_chrome_trace(args.trace)
        print(f"wrote trace {args.trace} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if args.timeline:
        prof.plot_timeline(args.timeline)
        print(f"wrote timeline {args.timeline}", file=sys.stderr)
    if args.roofline:
        from .plots import plot_roofline

        plot_roofline(report, args.roofline)
        print(f"wrote roofline {args.roofline}", file=sys.stderr)
    return 0
