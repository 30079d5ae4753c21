"""A/B of two source trees of the library on the same CPU cases (``ab_cases.py``).

Each round runs the cases once per tree, each tree in a fresh process of its own (its own
kernel cache, the same thread settings and CPU set), the order alternating from round to round
(old, new; new, old; ...), so a slow phase of the machine hits both alike. Per case: the median
of the rounds per tree, the ratio new / old, and whether the two trees' rounds are separated
(every round of one slower than every round of the other: with 5 rounds each, a chance of
2/252 when nothing changed) with the medians more than ``--tolerance`` apart: "beyond noise".

Usage: python benchmarks/ab_trees.py OLD_TREE NEW_TREE [--rounds 5] [--threads 8]
       [--budget SECONDS] [--quick] [--only PARTS] [--clock wall|thread] [--label NAME]
Writes benchmarks/results/ab_<label>.json (machine, versions, date, every round's numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from _common import RESULTS, machine

CASES = Path(__file__).with_name("ab_cases.py")


def tree_commit(tree: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return ""


def run_tree(tree: Path, args, cache: Path, extra_env: list[str]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree), TL_CACHE_DIR=str(cache))
    env.update(kv.split("=", 1) for kv in extra_env)
    n = str(args.threads)
    for var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = n
    cmd = [sys.executable, str(CASES)] + (["--quick"] if args.quick else [])
    if args.only:
        cmd += ["--only", args.only]
    cmd += ["--clock", args.clock]
    if args.cpus:
        cmd = ["taskset", "-c", args.cpus] + cmd
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=cache)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: cases failed\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def versions() -> dict:
    v = {"python": platform.python_version()}
    for mod in ("numpy", "numba", "opt_einsum", "scipy"):
        try:
            v[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return v


def summarize(rounds: dict[str, list[dict]], tol: float) -> list[dict]:
    rows = []
    for case in rounds["old"][0]:
        old = [r[case] for r in rounds["old"] if case in r]
        new = [r[case] for r in rounds["new"] if case in r]
        mo, mn = statistics.median(old), statistics.median(new)
        ratio = mn / mo
        separated = min(new) > max(old) or max(new) < min(old)
        verdict = "same" if min(len(old), len(new)) >= 3 else "too few rounds"
        if verdict == "same" and separated and abs(ratio - 1) > tol:
            verdict = "slower" if ratio > 1 else "faster"
        spread = max((max(v) - min(v)) / statistics.median(v) for v in (old, new))
        rows.append(
            {
                "case": case,
                "old_ms": mo * 1e3,
                "new_ms": mn * 1e3,
                "ratio_new_over_old": ratio,
                "round_spread": spread,
                "separated": separated,
                "verdict": verdict,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.0, help="stop starting rounds after this")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--cpus", default="", help="taskset CPU list for every child")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="thread: one-thread cases in CPU time (ab_cases.ONE_THREAD; crowded machines)",
    )
    ap.add_argument("--label", default="trees")
    ap.add_argument("--old-commit", default="", help="recorded when the tree has no .git")
    for k in ("old", "new"):  # e.g. AB_COMPILE_OPTIONS={"threads": "blas"}: one tree, two settings
        ap.add_argument(f"--{k}-env", action="append", default=[], help="KEY=VALUE for its runs")
    ap.add_argument("--new-commit", default="")
    args = ap.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    caches = {}
    for k in trees:
        caches[k] = Path(os.environ.get("TMPDIR", "/tmp"), f"tl_ab_cache_{k}_{os.getpid()}")
        caches[k].mkdir(parents=True, exist_ok=True)
    rounds: dict[str, list[dict]] = {"old": [], "new": []}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        if r >= args.min_rounds and args.budget and time.perf_counter() - t0 > args.budget:
            break
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for k in order:
            rounds[k].append(run_tree(trees[k], args, caches[k], getattr(args, f"{k}_env")))
        print(f"round {r + 1} done at {time.perf_counter() - t0:.0f} s", flush=True)
        path = write(args, trees, rounds)  # after every round: a run cut short keeps its rounds
    rows = summarize(rounds, args.tolerance)
    width = max(len(r["case"]) for r in rows)
    print(f"{'case':<{width}}  {'old ms':>10} {'new ms':>10}  ratio  spread  verdict")
    for r in rows:
        print(
            f"{r['case']:<{width}}  {r['old_ms']:10.4f} {r['new_ms']:10.4f}  "
            f"{r['ratio_new_over_old']:.3f}  {r['round_spread']:.3f}  {r['verdict']}"
        )
    print(f"wrote {path}")


def write(args, trees: dict[str, Path], rounds: dict[str, list[dict]]) -> Path:
    doc = {
        "name": f"ab_{args.label}",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "trees": {
            k: {"path": str(v), "commit": getattr(args, f"{k}_commit") or tree_commit(v)}
            for k, v in trees.items()
        },
        "settings": {
            "threads": args.threads,
            "cpus": args.cpus,
            "rounds": len(rounds["old"]),
            "tolerance": args.tolerance,
            "quick": args.quick,
            "only": args.only,
            "clock": args.clock,
            "old_env": args.old_env,
            "new_env": args.new_env,
        },
        "rows": summarize(rounds, args.tolerance),
        "rounds": rounds,
    }
    path = Path(os.environ.get("AB_RESULTS", RESULTS)) / f"ab_{args.label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


if __name__ == "__main__":
    main()
