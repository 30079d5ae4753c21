"""Command line: ``tensorlogic demo | run | profile``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .errors import TensorLogicError


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(backend=args.backend, opt_level=args.opt_level, repeat=args.repeat)


def _load_inputs(path: str | None) -> dict[str, np.ndarray]:
    if not path:
        return {}
    from .ir.serialize import load_npz

    return load_npz(path)


def _cmd_run(args: argparse.Namespace) -> int:
    from .compiler.compile import compile as compile_graph
    from .ir.graph import EinsumGraph

    target = Path(args.target)
    if target.suffix == ".tl":
        return _run_program(args, target)
    if target.suffix != ".json":
        raise TensorLogicError(f"{target.name}: expected a graph .json file or a .tl program")
    g = EinsumGraph.load(target)
    plan = compile_graph(g, backend=args.backend, opt_level=args.opt_level)
    inputs = _load_inputs(args.inputs)
    if args.batch_size is not None or args.dask is not None:
        out = _run_batched(plan, inputs, args)
    else:
        out = plan(inputs, to_host=True)
    written = _write_outputs(args.out, out) if args.out else None
    for name, arr in out.items():
        print(f"{name}: shape={arr.shape} dtype={arr.dtype} sum={float(np.sum(arr)):.6g}")
    if written:
        print(f"wrote {written}")
    return 0


def _write_outputs(out: str, arrays: dict[str, np.ndarray]) -> Path:
    """Write arrays by name into OUT.npz (".npz" added when missing, as numpy does) atomically:
    a failing run leaves an existing file as it was, and no name can clash with a keyword."""
    from .ir.safe_io import write_npz

    path = Path(out)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    write_npz(path, {k: np.asarray(v) for k, v in arrays.items()}, f"--out {str(path)!r}")
    return path


# ---- batched runs (pipeline): --batch-size, --workers, --dask [ADDRESS]
def _run_batched(plan, inputs: dict[str, np.ndarray], args: argparse.Namespace) -> dict:
    from .pipeline import run_batched

    opts = {"batch_size": args.batch_size, "progress": not args.no_progress}
    if args.dask is None:
        return run_batched(plan, inputs, workers=args.workers or 1, **opts)
    try:
        from distributed import Client
    except ImportError as exc:
        raise TensorLogicError(
            "--dask needs dask.distributed: pip install 'tensorlogic[dask]'"
        ) from exc
    if args.dask:
        with Client(args.dask) as client:
            return run_batched(plan, inputs, client=client, **opts)
    from .pipeline.dask import device_count, local_cluster

    # a device backend gets one worker per GPU; a host backend args.workers processes
    gpus = device_count(plan.backend)
    workers = None if gpus else args.workers
    with local_cluster(gpus=gpus, n_workers=workers) as cl, Client(cl) as client:
        return run_batched(plan, inputs, client=client, **opts)


# ---------------------------------------------------------------- TensorLogic programs (.tl)
def _load_facts(path: str | None) -> dict[str, list[tuple]]:
    if not path:
        return {}
    import json

    from .ir.safe_io import read_bounded
    from .ir.serialize import MAX_FILE_BYTES

    try:
        raw = json.loads(read_bounded(path, MAX_FILE_BYTES, f"facts file {path!r}"))
    except (ValueError, RecursionError, MemoryError) as exc:  # UnicodeDecodeError is a ValueError
        raise TensorLogicError(
            f"{path}: cannot read facts JSON: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(raw, dict) or not all(isinstance(v, list) for v in raw.values()):
        raise TensorLogicError(
            f"{path}: expected an object mapping predicate names to lists of "
            'argument lists, e.g. {"edge": [[1, 2], [2, 3]]}'
        )
    return {k: [tuple(row) if isinstance(row, list) else row for row in v] for k, v in raw.items()}


def _fmt_row(row: tuple) -> str:
    import json

    return "(" + ", ".join(json.dumps(v) for v in row) + ")"


def _run_program(args: argparse.Namespace, target: Path) -> int:
    from .lang import load_program

    program = load_program(target)
    out = program.run(
        backend=args.backend,
        facts=_load_facts(args.facts),
        opt_level=args.opt_level,
        **_load_inputs(args.inputs),
    )
    if args.query:
        for row in sorted(program.query(args.query), key=repr):
            print(_fmt_row(row))
        return 0
    rels = program.relations_as_sets()
    for name in sorted(rels):
        rows = sorted(rels[name], key=repr)
        print(f"{name}: {len(rows)} tuple(s)")
        for row in rows:
            print("  " + _fmt_row(row))
    tensors = {k: v for k, v in out.items() if k in program.tensors}
    for name, arr in tensors.items():
        print(f"{name}: shape={arr.shape} dtype={arr.dtype}")
        print("  " + np.array2string(arr, precision=4, threshold=64).replace("\n", "\n  "))
    if args.out and tensors:
        print(f"wrote {_write_outputs(args.out, tensors)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (subcommands register here)."""
    p = argparse.ArgumentParser(prog="tensorlogic", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="build, compile, run and check a small model")
    d.add_argument("--backend", default="auto")
    d.add_argument("--opt-level", type=int, default=2)
    d.add_argument("--repeat", type=int, default=20)
    d.set_defaults(func=_cmd_demo)
    r = sub.add_parser("run", help="run a saved graph (.json) or a TensorLogic program (.tl)")
    r.add_argument("target", help="GRAPH.json or PROGRAM.tl")
    r.add_argument("--facts", help='FACTS.json for a program: {"pred": [[arg, ...], ...]}')
    r.add_argument("--query", help="print only this relation of a program, one tuple a line")
    r.add_argument("--inputs", help="IN.npz with one array per graph input (or program tensor)")
    r.add_argument("--out", help="OUT.npz to write the outputs to")
    r.add_argument("--backend", default="auto")
    r.add_argument("--opt-level", type=int, default=2)
    r.add_argument(
        "--batch-size",
        type=int,
        help="run in batches of this many items along the "
        "graph's symbolic batch dimension (default with --dask: fit free memory)",
    )
    r.add_argument(
        "--workers",
        type=int,
        help="threads computing batches (with --dask and no "
        "address: worker processes of the local cluster)",
    )
    r.add_argument(
        "--dask",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run the batches on a "
        "Dask scheduler at ADDRESS, or on a new LocalCluster when no address is given",
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=_cmd_run)
    # profile
    from .profiler.cli import add_parser as add_profile_parser

    add_profile_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tensorlogic`` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TensorLogicError as exc:
        print(f"tensorlogic: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
