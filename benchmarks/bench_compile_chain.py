"""Compile time and memory of long elementwise chains on the numba backend.

Each length runs in a fresh process with an empty kernel cache and reports the process's CPU
seconds and peak RSS for ``tl.compile`` plus the first call, once with fusion's bound on each
fused node (``MAX_GROUP_OPS``) and once with the bound lifted (one kernel for the whole chain,
as before the bound existed; lengths past 300 are skipped there, they took minutes and gigabytes).
The bound's target: each kernel compiles in about 2 s and 300 MB, the whole compile grows
linearly with the chain.

Usage: python benchmarks/bench_compile_chain.py [--quick]
Writes benchmarks/results/compile_chain.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

from _common import machine, table, write_results

CHILD = textwrap.dedent("""
    import importlib, json, resource, sys, time
    import numpy as np
    import tensorlogic as tl
    # the module (the package exports the pass itself under the same name)
    fusion = importlib.import_module("tensorlogic.optimizer.fusion")
    n, bounded = int(sys.argv[1]), sys.argv[2] == "1"
    x0 = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    g0 = tl.EinsumGraph(); a = g0.input("x", (4,)); g0.output(g0.exp(a) * 2.0, "y")
    tl.compile(g0, backend="numba")(x=np.ones(4, np.float32))  # numba's own start-up
    if not bounded:
        fusion.MAX_GROUP_OPS = 10**9
    g = tl.EinsumGraph(); x = g.input("x", (64, 64)); h = x
    for k in range(n):
        h = g.tanh(h) if k % 3 == 0 else h * (0.5 + 0.01 * (k % 7)) if k % 3 == 1 else h + x
    g.output(h, "y")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    c0, t0 = time.process_time(), time.perf_counter()
    plan = tl.compile(g, backend="numba", opt_level=2, cache=False)
    plan(x=x0)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    kernels = sum(1 for s in plan.steps if s.kind == "fused")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"ops": n, "bounded": bounded, "kernels": kernels, "cpu_s": round(cpu, 2),
                      "wall_s": round(wall, 2), "cpu_s_per_kernel": round(cpu / max(kernels, 1), 2),
                      "peak_rss_mb": round(peak, 1), "rss_before_mb": round(rss0 / 1024, 1)}))
""")


def run(n: int, bounded: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TL_CACHE_DIR=cache)
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(n), "1" if bounded else "0"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="short chains only")
    args = p.parse_args()
    lengths = [48, 150, 300] if args.quick else [48, 150, 300, 750, 1500]
    rows = []
    for n in lengths:
        rows.append(run(n, True))
        if n <= 300:
            rows.append(run(n, False))
        print(
            table(
                rows[-2:] if n <= 300 else rows[-1:],
                ["ops", "bounded", "kernels", "cpu_s", "cpu_s_per_kernel", "peak_rss_mb"],
            ),
            flush=True,
        )
    path = write_results("compile_chain", rows, {"load_at_end": machine()["loadavg_1min"]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
