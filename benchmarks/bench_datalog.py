"""Datalog benchmark: tensorlogic vs pyDatalog and clingo on the same programs, same run.

Transitive closure on random graphs (500 / 1000 / 2000 nodes, average out-degree 2 and 8) and
same-generation on a random tree. Each system computes the full least model and reports the
number of derived tuples, which must agree. Peers run in a child process with a time limit; a
peer that is not installed is skipped. Writes benchmarks/results/bench_datalog.json.

``tensorlogic s`` is ``evaluate`` end to end (relations decoded into Python sets of tuples, as
the peers hand back their answers); ``fixpoint s`` is the same evaluation up to the dense
relations, without building Python tuples; ``rounds`` shows each recursive round's kind
(s sparse, d dense, x a sparse attempt over budget then dense).

    python benchmarks/bench_datalog.py [--quick] [--backend auto] [--sizes 500,1000]
        [--rounds auto|dense|sparse] [--peers clingo,pyDatalog|none]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

TC = "path(X, Y) :- edge(X, Y).\npath(X, Z) :- path(X, Y), edge(Y, Z)."
SG = ("sg(X, X) :- node(X).\n"
      "sg(X, Y) :- par(X, XP), sg(XP, YP), par(Y, YP).")


def tc_case(n: int, degree: int, seed: int = 0) -> dict:
    r = random.Random(seed)
    edges = sorted({(r.randrange(n), r.randrange(n)) for _ in range(n * degree)})
    return {"name": f"tc n={n} deg={degree}", "kind": "tc", "facts": {"edge": edges},
            "out": "path"}


def sg_case(n: int, seed: int = 0) -> dict:
    r = random.Random(seed)
    # a random tree of bounded fan-out, so that generations are wide but not a star
    par = [(i, r.randrange(max(0, i // 4), i)) for i in range(1, n)]
    nodes = [(i,) for i in range(n)]
    return {"name": f"sg tree n={n}", "kind": "sg", "facts": {"par": par, "node": nodes},
            "out": "sg"}


# ---------------------------------------------------------------------- systems
def run_tensorlogic(case: dict, backend: str, rounds: str = "auto") -> int:
    from tensorlogic.datalog import evaluate

    rules = TC if case["kind"] == "tc" else SG
    return len(evaluate(rules, case["facts"], backend=backend, rounds=rounds)[case["out"]])


def run_fixpoint(case: dict, backend: str, rounds: str = "auto") -> tuple[float, str]:
    """Seconds to the dense relations (no Python tuples), and the kinds of the rounds."""
    from tensorlogic.lang.analysis import normalize_facts
    from tensorlogic.lang.fixpoint import Options, evaluate_rules
    from tensorlogic.lang.parser import parse_rules

    t0 = time.perf_counter()
    rules = parse_rules(TC if case["kind"] == "tc" else SG)
    _, _, ev = evaluate_rules(rules, normalize_facts(case["facts"]),
                              Options(backend=backend, rounds=rounds))
    return time.perf_counter() - t0, "".join(ev.round_kinds.values())


def run_clingo(case: dict) -> int:
    import clingo

    rules = TC if case["kind"] == "tc" else SG
    lines = [f"{p}({','.join(map(str, row))})." for p, rows in case["facts"].items()
             for row in rows]
    prog = "\n".join(lines) + "\n" + rules + f"\n#show {case['out']}/2.\n"
    ctl = clingo.Control(["--warn=none"])
    ctl.add("base", [], prog)
    ctl.ground([("base", [])])
    count = []
    ctl.solve(on_model=lambda m: count.append(len(m.symbols(shown=True))))
    return count[-1]


def run_pydatalog(case: dict) -> int:
    from pyDatalog import pyDatalog

    pyDatalog.clear()
    for p, rows in case["facts"].items():
        for row in rows:
            pyDatalog.assert_fact(p, *row)
    if case["kind"] == "tc":
        pyDatalog.load("path(X, Y) <= edge(X, Y)\npath(X, Z) <= path(X, Y) & edge(Y, Z)")
        ans = pyDatalog.ask("path(X, Y)")
    else:
        pyDatalog.load("sg(X, X) <= node(X)\nsg(X, Y) <= par(X, XP) & sg(XP, YP) & par(Y, YP)")
        ans = pyDatalog.ask("sg(X, Y)")
    return len(ans.answers) if ans else 0


PEERS = {"clingo": ("clingo", run_clingo), "pyDatalog": ("pyDatalog", run_pydatalog)}


def _child(fn, case, q):
    try:
        t0 = time.perf_counter()
        n = fn(case)
        q.put(("ok", time.perf_counter() - t0, n))
    except Exception as exc:  # noqa: BLE001 - report any peer failure as a skip
        q.put(("error", 0.0, f"{type(exc).__name__}: {exc}"))


def time_peer(fn, case: dict, timeout: float) -> tuple[str, float, object]:
    """One timed run in a child process (fresh interpreter state), killed after ``timeout``."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, case, q))
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        return "timeout", timeout, None
    return q.get() if not q.empty() else ("error", 0.0, "child died")


def available(module: str) -> str | None:
    try:
        mod = __import__(module)
        return str(getattr(mod, "__version__", "installed"))
    except ImportError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--sizes", help="comma-separated node counts for transitive closure")
    ap.add_argument("--timeout", type=float, help="seconds a peer may take per case")
    ap.add_argument("--repeat", type=int)
    ap.add_argument("--rounds", default="auto", choices=("auto", "dense", "sparse"),
                    help="kind of recursive rounds for tensorlogic")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help="comma-separated peers to run, or 'none'")
    args = ap.parse_args(argv)
    peers = {} if args.peers == "none" else {p: PEERS[p] for p in args.peers.split(",")}
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [300, 500] if args.quick else [500, 1000, 2000])
    repeat = args.repeat or (1 if args.quick else 3)
    timeout = args.timeout or (60.0 if args.quick else 300.0)
    cases = [tc_case(n, d) for n in sizes for d in (2, 8)]
    cases.append(sg_case(sizes[-1]))

    import numpy as np

    import tensorlogic as tl

    versions = {"tensorlogic": tl.__version__, "numpy": np.__version__,
                "python": platform.python_version()}
    for peer, (module, _) in peers.items():
        versions[peer] = available(module) or "not installed"
    rows = []
    print(f"{'case':<18} {'tuples':>8} {'tensorlogic s':>13} {'fixpoint s':>10} " +
          " ".join(f"{p + ' s':>13} {'x':>6}" for p in peers) + "  rounds")
    for case in cases:
        run_tensorlogic(case, args.backend, args.rounds)  # warm up: imports, first compile
        times, fix = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            count = run_tensorlogic(case, args.backend, args.rounds)
            times.append(time.perf_counter() - t0)
            secs, kinds = run_fixpoint(case, args.backend, args.rounds)
            fix.append(secs)
        ours = statistics.median(times)
        row = {"case": case["name"], "tuples": count, "tensorlogic_s": ours,
               "fixpoint_s": statistics.median(fix), "rounds": kinds, "peers": {}}
        for peer, (_module, fn) in peers.items():
            if versions[peer] == "not installed":
                row["peers"][peer] = {"status": "skipped (not installed)"}
                continue
            status, secs, n = time_peer(fn, case, timeout)
            entry: dict = {"status": status, "seconds": secs}
            if status == "ok":
                entry["tuples"] = n
                entry["speedup"] = secs / ours
                if n != count:
                    entry["status"] = f"mismatch: {n} tuples vs ours {count}"
            elif status == "error":
                entry["error"] = n
            row["peers"][peer] = entry
        rows.append(row)
        cells = []
        for peer in peers:
            e = row["peers"][peer]
            if e["status"] == "ok":
                cells.append(f"{e['seconds']:>13.3f} {e['speedup']:>6.1f}")
            else:
                cells.append(f"{e['status'][:20]:>20}")
        print(f"{case['name']:<18} {count:>8} {ours:>13.3f} {row['fixpoint_s']:>10.3f} " +
              " ".join(cells) + f"  {kinds}", flush=True)
    extra = {"backend": args.backend, "rounds": args.rounds, "repeat": repeat,
             "quick": args.quick,
             "peer_versions": versions,
             "note": "x = peer seconds / tensorlogic seconds (median of repeats for tensorlogic, "
                     "one run in a fresh process for each peer)"}
    out = write_results("bench_datalog", rows, extra, peers=tuple(peers))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
