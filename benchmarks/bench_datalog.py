"""Datalog benchmark: tensorlogic against DuckDB (recursive CTE) and clingo, end to end.

Workloads (``datalog_workloads.py``, seeded): ancestors on a random tree and transitive closure
on a random graph (the two-rule closure), same-generation on a random tree, and Andersen's
points-to analysis (non-linear; DuckDB runs it as a semi-naive loop of SQL statements, since a
recursive CTE may read the recursive relation only once). Every engine runs in its own fresh
process, round-robin (one run of each engine per repeat, so a busy minute on a shared machine
slows all alike), from the facts as numpy arrays in memory to the result; imports are not
timed (numba's included; loading our kernels from their disk cache is timed). Two results are
timed separately: ``arrays`` (tensorlogic: ``evaluate(..., as_relations=True)`` and the
output's decoded ``columns``; DuckDB: ``fetchnumpy``) and ``sets`` (a Python set of tuples;
clingo: the shown atoms of its model). All engines must agree on the
tuple count. Peak memory is the child's maximum resident set size. Writes
benchmarks/results/bench_datalog.json.

    python benchmarks/bench_datalog.py [--cases ancestors:10000,closure:1000,...]
        [--engines tensorlogic,duckdb,clingo] [--modes arrays,sets] [--repeat 3]
        [--timeout 300] [--representation auto|dense|sparse] [--backend auto|cupy]
        [--name bench_datalog]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results
from datalog_workloads import WORKLOADS

DEFAULT_CASES = (
    "ancestors:10000,ancestors:100000,closure:1000,closure:2000,ancestors:1000000,"
    "closure:5000,samegen:20000,pointsto:100000"
)
#: engines that cannot return arrays run in the sets mode only
SETS_ONLY = {"clingo"}

# ---------------------------------------------------------------------- DuckDB programs
_DUCK = {
    "ancestors": "WITH RECURSIVE p(x, y) AS (SELECT c0, c1 FROM e UNION SELECT p.x, e.c1 FROM p "
    "JOIN e ON p.y = e.c0) SELECT x, y FROM p",
    "samegen": "WITH RECURSIVE sg(x, y) AS (SELECT c0, c0 FROM node UNION SELECT a.c0, b.c0 "
    "FROM sg JOIN par a ON a.c1 = sg.x JOIN par b ON b.c1 = sg.y) SELECT x, y FROM sg",
}
_DUCK["closure"] = _DUCK["ancestors"]

# Andersen, semi-naive: each rule once per pt atom read as the delta d, the others read pt
_PT_ROUND = """
CREATE OR REPLACE TEMP TABLE cand AS
  SELECT a.c0 AS p, d.o FROM assign a JOIN d ON a.c1 = d.p
  UNION SELECT l.c0, t.o FROM load l JOIN d ON l.c1 = d.p JOIN pt t ON d.o = t.p
  UNION SELECT l.c0, d.o FROM load l JOIN pt t ON l.c1 = t.p JOIN d ON t.o = d.p
  UNION SELECT d.o, t.o FROM store s JOIN d ON s.c0 = d.p JOIN pt t ON s.c1 = t.p
  UNION SELECT t.o, d.o FROM store s JOIN pt t ON s.c0 = t.p JOIN d ON s.c1 = d.p;
CREATE OR REPLACE TEMP TABLE d AS SELECT * FROM cand EXCEPT SELECT * FROM pt;
INSERT INTO pt SELECT * FROM d;
"""


def _duckdb(workload: str, facts: dict, mode: str) -> int:
    import duckdb
    import pandas as pd

    con = duckdb.connect()
    for name, cols in facts.items():
        con.register(name, pd.DataFrame({f"c{i}": c for i, c in enumerate(cols)}))
    if workload == "pointsto":
        con.execute("CREATE TEMP TABLE pt AS SELECT DISTINCT c0 AS p, c1 AS o FROM addr")
        con.execute("CREATE TEMP TABLE d AS SELECT * FROM pt")
        while con.execute("SELECT count(*) FROM d").fetchone()[0]:
            con.execute(_PT_ROUND)
        q = "SELECT p, o FROM pt"
    else:
        q = _DUCK[workload]
    if mode == "arrays":
        res = con.execute(q).fetchnumpy()
        return len(next(iter(res.values())))
    return len(set(con.execute(q).fetchall()))


def _clingo_text(program: str, facts: dict) -> str:
    lines = []
    for name, cols in facts.items():
        rows = np.stack(cols, axis=1) if len(cols) > 1 else cols[0][:, None]
        fmt = name + "(" + ",".join(["{}"] * rows.shape[1]) + ")."
        lines.extend(fmt.format(*r) for r in rows.tolist())
    return "\n".join(lines) + "\n" + program + "\n"


def _clingo(workload: str, facts: dict, mode: str) -> int:
    import clingo

    program, out, _ = WORKLOADS[workload]
    ctl = clingo.Control(["--warn=none"])
    ctl.add("base", [], _clingo_text(program, facts) + f"#show {out}/2.\n")
    ctl.ground([("base", [])])
    got: list = []
    ctl.solve(
        on_model=lambda m: got.append(
            {tuple(a.number for a in s.arguments) for s in m.symbols(shown=True)}
        )
    )
    return len(got[-1])


def _tensorlogic(workload: str, facts: dict, mode: str, representation: str, backend: str) -> int:
    from tensorlogic.datalog import evaluate

    program, out, _ = WORKLOADS[workload]
    rel = evaluate(
        program, facts, as_relations=True, representation=representation, backend=backend
    )[out]
    if mode == "arrays":
        return len(rel.columns[0])
    return len(rel.to_set())


def child(args: argparse.Namespace) -> None:
    """One timed run in this (fresh) process; prints a JSON line."""
    data = np.load(args.data)
    facts: dict[str, tuple] = {}
    for key in sorted(data.files):
        name, _, _ = key.rpartition("__")
        facts.setdefault(name, [])
        facts[name].append(data[key])  # type: ignore[attr-defined]
    facts = {k: tuple(v) for k, v in facts.items()}
    # imports before the clock starts, for every engine alike
    if args.child == "tensorlogic":
        import numba  # noqa: F401  (a library import, like duckdb's: its kernels load timed)

        import tensorlogic.datalog  # noqa: F401

        fn = functools.partial(
            _tensorlogic, args.workload, facts, args.mode, args.representation, args.backend
        )
    elif args.child == "duckdb":
        import duckdb  # noqa: F401
        import pandas  # noqa: F401

        fn = functools.partial(_duckdb, args.workload, facts, args.mode)
    else:
        import clingo  # noqa: F401

        fn = functools.partial(_clingo, args.workload, facts, args.mode)
    t0 = time.perf_counter()
    n = fn()
    secs = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": secs, "tuples": n, "peak_bytes": peak}))


def run_child(
    engine: str,
    workload: str,
    data: str,
    mode: str,
    timeout: float,
    representation: str,
    backend: str,
) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        engine,
        "--workload",
        workload,
        "--data",
        data,
        "--mode",
        mode,
        "--representation",
        representation,
        "--backend",
        backend,
    ]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    if p.returncode != 0:
        return {"status": "error", "error": p.stderr.strip().splitlines()[-1:]}
    return {"status": "ok", **json.loads(p.stdout.strip().splitlines()[-1])}


def versions() -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("tensorlogic", "duckdb", "clingo", "pandas"):
        try:
            m = __import__(mod)
            out[mod] = str(getattr(m, "__version__", "installed"))
        except ImportError:
            out[mod] = "not installed"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--cases",
        default=DEFAULT_CASES,
        help="comma-separated workload:size (workloads: " + ", ".join(WORKLOADS) + ")",
    )
    ap.add_argument("--engines", default="tensorlogic,duckdb,clingo")
    ap.add_argument("--modes", default="arrays,sets")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument(
        "--clingo-max",
        type=int,
        default=3_000_000,
        help="skip clingo where DuckDB's tuple count exceeds this",
    )
    ap.add_argument("--representation", default="auto", choices=("auto", "dense", "sparse"))
    ap.add_argument("--name", default="bench_datalog", help="results/<name>.json")
    ap.add_argument(
        "--backend",
        default="auto",
        help="tensorlogic backend (cupy: dense strata on the GPU while they fit)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="arrays", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    engines = args.engines.split(",")
    modes = args.modes.split(",")
    rows = []
    tmp = tempfile.mkdtemp(prefix="bench_datalog_")
    print(f"load average at start: {os.getloadavg()}")
    for case in args.cases.split(","):
        workload, size = case.split(":")
        _, _, gen = WORKLOADS[workload]
        facts = gen(int(size))
        path = os.path.join(tmp, f"{workload}_{size}.npz")
        np.savez(
            path, **{f"{name}__{i}": c for name, cols in facts.items() for i, c in enumerate(cols)}
        )
        for mode in modes:
            runs: dict[str, list[dict]] = {
                e: [] for e in engines if mode == "sets" or e not in SETS_ONLY
            }
            load0 = os.getloadavg()[0]
            for _ in range(args.repeat):
                for e, done in runs.items():
                    if e == "clingo" and rows and _too_big(rows, case, args.clingo_max):
                        done.append({"status": f"skipped (over {args.clingo_max} tuples)"})
                        continue
                    if done and done[-1]["status"] != "ok":
                        done.append(done[-1])  # timed out or failed once: do not retry
                        continue
                    done.append(
                        run_child(
                            e, workload, path, mode, args.timeout, args.representation, args.backend
                        )
                    )
            row = {
                "case": f"{workload} n={size}",
                "workload": workload,
                "size": int(size),
                "mode": mode,
                "load_avg": [load0, os.getloadavg()[0]],
                "engines": {},
            }
            for e, rs in runs.items():
                ok = [r for r in rs if r["status"] == "ok"]
                if len(ok) == len(rs):
                    row["engines"][e] = {
                        "status": "ok",
                        "seconds": statistics.median(r["seconds"] for r in ok),
                        "all_seconds": [r["seconds"] for r in ok],
                        "tuples": ok[0]["tuples"],
                        "peak_bytes": max(r["peak_bytes"] for r in ok),
                    }
                else:
                    row["engines"][e] = next(r for r in rs if r["status"] != "ok")
            ours = row["engines"].get("tensorlogic", {})
            counts = {e: v["tuples"] for e, v in row["engines"].items() if v["status"] == "ok"}
            row["agree"] = len(set(counts.values())) <= 1
            for e, v in row["engines"].items():
                if e != "tensorlogic" and v["status"] == "ok" and ours.get("status") == "ok":
                    v["ratio"] = v["seconds"] / ours["seconds"]  # >1: tensorlogic faster
            rows.append(row)
            _print(row)
    extra = {
        "engines": engines,
        "modes": modes,
        "repeat": args.repeat,
        "backend": args.backend,
        "representation": args.representation,
        "peer_versions": versions(),
        "note": "ratio = peer seconds / tensorlogic seconds (medians; each run a fresh "
        "process, engines round-robin); load_avg = 1-minute load before/after",
    }
    out = write_results(
        args.name, rows, extra, peers=tuple(e for e in engines if e != "tensorlogic")
    )
    print(f"wrote {out}")
    return 0


def _too_big(rows: list[dict], case: str, limit: int) -> bool:
    """Whether an earlier mode of this case found more than ``limit`` tuples."""
    name = case.replace(":", " n=")
    return any(
        r["case"] == name and r["engines"].get(e, {}).get("tuples", 0) > limit
        for r in rows
        for e in ("duckdb", "tensorlogic")
    )


def _print(row: dict) -> None:
    cells = []
    for e, v in row["engines"].items():
        if v["status"] == "ok":
            extra = f" x{v['ratio']:.2f}" if "ratio" in v else ""
            cells.append(f"{e} {v['seconds']:.3f}s {v['peak_bytes'] / 2**20:.0f}MB{extra}")
        else:
            cells.append(f"{e} {v['status']}")
    tuples = next((v["tuples"] for v in row["engines"].values() if v["status"] == "ok"), "?")
    flag = "" if row["agree"] else "  COUNTS DISAGREE"
    print(
        f"{row['case']:<22} {row['mode']:<6} {tuples:>10}  "
        + " | ".join(cells)
        + f"  load {row['load_avg'][0]:.1f}-{row['load_avg'][1]:.1f}{flag}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
