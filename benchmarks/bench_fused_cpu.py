"""Fused CPU kernels: the numba backend vs numpy, numexpr and torch CPU in the same run.

Cases: the chain relu(a*b+c)*d-e (1M, 16M; float32, float64), a 12-op chain with exp and tanh,
the sum of 16M float32, row softmax and layer norm on 4096x1024 float32. Also measured: the
2-thread stream bandwidth (a numba triad), cold and warm-cache first-call latency (fresh
processes), the cost of a parallel kernel right after a BLAS call (with and without threadpoolctl
limits), and serial vs parallel kernel time per size (the parallel threshold).

Usage: python benchmarks/bench_fused_cpu.py [--quick]
Writes benchmarks/results/fused_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import tensorlogic as tl
from tensorlogic.ir import ops
from tensorlogic.ir.fused import FusedBody, FusedOp

try:
    import numexpr as ne
except ImportError:  # the bench extra is optional
    ne = None
try:
    import torch
except ImportError:  # torch is optional: its columns are skipped
    torch = None

RESULTS = Path(__file__).parent / "results" / "fused_cpu.json"


def timeit(fn, reps: int, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` over ``reps`` runs."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def fused_plan(shapes, dtype, instrs, space, tail=None, axes=(), keepdims=False, **opts):
    """A plan with one FUSED node (the format the optimizer's fusion pass produces)."""
    g = tl.EinsumGraph()
    xs = [g.input(f"x{k}", s, dtype) for k, s in enumerate(shapes)]
    if not instrs:  # a lone reduction / row op is a plain node, rendered as one kernel too
        y = g._rowop(tail, xs[0], axes[0], None) if tail in ops.ROW_OPS else \
            g.reduce(tail, xs[0], list(axes), keepdims)
        g.output(y, "y")
        return tl.compile(g, backend="numba", opt_level=0, **opts)
    body = FusedBody(tuple(FusedOp(op, tuple(a)) for op, a in instrs), tuple(space), tail,
                     tuple(axes), keepdims)
    if tail is None or tail in ops.ROW_OPS:
        oshape = tuple(space)
    else:
        oshape = tuple(1 if d in axes else n for d, n in enumerate(space)) if keepdims else \
            tuple(n for d, n in enumerate(space) if d not in axes)
    nid = g.add_node(ops.FUSED, "fused", [x.id for x in xs],
                     {"body": body.to_args(), "flops": math.prod(space)}, shape=oshape,
                     dtype=dtype)
    g.output(g.tensor(nid), "y")
    return tl.compile(g, backend="numba", opt_level=0, **opts)


CHAIN = [("mul", [("in", 0), ("in", 1)]), ("add", [("tmp", 0), ("in", 2)]), ("relu", [("tmp", 1)]),
         ("mul", [("tmp", 2), ("in", 3)]), ("sub", [("tmp", 3), ("in", 4)])]
# 12 ops: exp(-(a*a)) * tanh(b) + c*0.5 - d/(1+|e|), scaled and shifted
CHAIN12 = [("mul", [("in", 0), ("in", 0)]), ("neg", [("tmp", 0)]), ("exp", [("tmp", 1)]),
           ("tanh", [("in", 1)]), ("mul", [("tmp", 2), ("tmp", 3)]),
           ("mul", [("in", 2), ("const", 0.5)]), ("add", [("tmp", 4), ("tmp", 5)]),
           ("abs", [("in", 4)]), ("add", [("tmp", 7), ("const", 1.0)]),
           ("div", [("in", 3), ("tmp", 8)]), ("sub", [("tmp", 6), ("tmp", 9)]),
           ("mul", [("tmp", 10), ("const", 1.5)])]


def _np_chain12(a, b, c, d, e):
    return (np.exp(-(a * a)) * np.tanh(b) + c * 0.5 - d / (1 + np.abs(e))) * 1.5


def run_case(name, ours, peers, nbytes, reps):
    """Time ours and each available peer; returns a result row."""
    row = {"case": name, "bytes": nbytes}
    t_ours = timeit(ours, reps)
    row["tensorlogic_numba_ms"] = t_ours * 1e3
    row["tensorlogic_GBps"] = nbytes / t_ours / 1e9
    for peer, fn in peers.items():
        if fn is None:
            continue
        t = timeit(fn, reps)
        row[f"{peer}_ms"] = t * 1e3
        row[f"speedup_vs_{peer}"] = t / t_ours
    return row


def chain_cases(quick, reps, rng):
    rows = []
    sizes = [1 << 20] if quick else [1 << 20, 1 << 24]
    for n in sizes:
        for dt in ("float32", "float64"):
            xs = [rng.uniform(-1, 1, n).astype(dt) for _ in range(5)]
            plan = fused_plan([(n,)] * 5, dt, CHAIN, (n,))
            out = np.empty(n, dt)
            kw = {f"x{k}": x for k, x in enumerate(xs)}
            a, b, c, d, e = xs
            peers = {"numpy": lambda: np.maximum(a * b + c, 0) * d - e,
                     "numexpr": (lambda: ne.evaluate("where(a*b+c > 0, a*b+c, 0)*d - e",
                                                     local_dict=dict(a=a, b=b, c=c, d=d, e=e),
                                                     out=out)) if ne else None}
            if torch is not None:
                ta, tb, tc, td, te = (torch.from_numpy(x) for x in xs)
                peers["torch"] = lambda: torch.relu(ta * tb + tc) * td - te
            nbytes = 6 * n * np.dtype(dt).itemsize
            rows.append(run_case(f"chain relu(a*b+c)*d-e n={n} {dt}",
                                 lambda: plan(out={"y": out}, **kw), peers, nbytes, reps))
            np.testing.assert_allclose(plan(**kw)["y"], np.maximum(a * b + c, 0) * d - e,
                                       rtol=1e-5, atol=1e-6)
    n = 1 << (20 if quick else 24)
    xs = [rng.uniform(-1, 1, n).astype(np.float32) for _ in range(5)]
    a, b, c, d, e = xs
    plan = fused_plan([(n,)] * 5, "float32", CHAIN12, (n,))
    kw = {f"x{k}": x for k, x in enumerate(xs)}
    out = np.empty(n, np.float32)
    peers = {"numpy": lambda: _np_chain12(*xs),
             "numexpr": (lambda: ne.evaluate("(exp(-(a*a))*tanh(b) + c*0.5 - d/(1+abs(e)))*1.5",
                                             local_dict=dict(a=a, b=b, c=c, d=d, e=e), out=out)) if ne else None}
    if torch is not None:
        ta, tb, tc, td, te = (torch.from_numpy(x) for x in xs)
        peers["torch"] = lambda: (torch.exp(-(ta * ta)) * torch.tanh(tb) + tc * 0.5
                                  - td / (1 + torch.abs(te))) * 1.5
    rows.append(run_case(f"12-op chain with exp, tanh n={n} float32",
                         lambda: plan(out={"y": out}, **kw), peers, 6 * n * 4, reps))
    np.testing.assert_allclose(plan(**kw)["y"], _np_chain12(*xs), rtol=1e-5, atol=1e-5)
    return rows


def reduction_cases(quick, reps, rng):
    rows = []
    n = 1 << (20 if quick else 24)
    x = rng.uniform(-1, 1, n).astype(np.float32)
    plan = fused_plan([(n,)], "float32", [], (n,), "sum", (0,))
    peers = {"numpy": lambda: x.sum(), "numexpr": (lambda: ne.evaluate("sum(x)", local_dict={"x": x})) if ne else None}
    if torch is not None:
        tx = torch.from_numpy(x)
        peers["torch"] = lambda: tx.sum()
    rows.append(run_case(f"sum n={n} float32", lambda: plan(x0=x), peers, n * 4, reps))
    m, k = (1024, 1024) if quick else (4096, 1024)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = np.empty_like(x)
    sm = fused_plan([(m, k)], "float32", [], (m, k), "softmax", (1,))

    def np_softmax():
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    peers = {"numpy": np_softmax, "numexpr": None}
    if torch is not None:
        tx = torch.from_numpy(x)
        peers["torch"] = lambda: torch.softmax(tx, dim=1)
    rows.append(run_case(f"row softmax {m}x{k} float32", lambda: sm(x0=x, out={"y": out}),
                         peers, 2 * x.nbytes, reps))
    np.testing.assert_allclose(sm(x0=x)["y"], np_softmax(), rtol=1e-5, atol=1e-7)
    # layer norm as the fusion pass would emit it: mean tail, centered-square mean tail, normalize
    mean = fused_plan([(m, k)], "float32", [], (m, k), "mean", (1,), True)
    var = fused_plan([(m, k), (m, 1)], "float32",
                     [("sub", [("in", 0), ("in", 1)]), ("square", [("tmp", 0)])], (m, k),
                     "mean", (1,), True)
    norm = fused_plan([(m, k), (m, 1), (m, 1)], "float32",
                      [("sub", [("in", 0), ("in", 1)]), ("add", [("in", 2), ("const", 1e-5)]),
                       ("sqrt", [("tmp", 1)]), ("div", [("tmp", 0), ("tmp", 2)])], (m, k))
    mu, va = np.empty((m, 1), np.float32), np.empty((m, 1), np.float32)

    def ours_ln():
        mean(x0=x, out={"y": mu})
        var(x0=x, x1=mu, out={"y": va})
        return norm(x0=x, x1=mu, x2=va, out={"y": out})

    def np_ln():
        mu_ = x.mean(axis=1, keepdims=True)
        d = x - mu_
        return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-5)

    peers = {"numpy": np_ln, "numexpr": None}
    if torch is not None:
        peers["torch"] = lambda: torch.nn.functional.layer_norm(tx, (k,), eps=1e-5)
    rows.append(run_case(f"layer norm {m}x{k} float32 (3 kernels)", ours_ln, peers,
                         2 * x.nbytes, reps))
    np.testing.assert_allclose(ours_ln()["y"], np_ln(), rtol=1e-4, atol=1e-4)
    return rows


def stream_bandwidth(quick, reps, rng):
    """2-thread triad y = a + 0.5*b through a generated parallel kernel (3 arrays of traffic)."""
    n = 1 << (22 if quick else 25)
    a, b = rng.random(n).astype(np.float32), rng.random(n).astype(np.float32)
    plan = fused_plan([(n,), (n,)], "float32",
                      [("mul", [("in", 1), ("const", 0.5)]), ("add", [("in", 0), ("tmp", 0)])], (n,))
    out = np.empty(n, np.float32)
    t = timeit(lambda: plan(x0=a, x1=b, out={"y": out}), reps)
    tc = timeit(lambda: np.copyto(out, a), reps)
    return {"triad_GBps": 3 * n * 4 / t / 1e9, "numpy_copy_GBps": 2 * n * 4 / tc / 1e9}


_FIRST_CALL = textwrap.dedent("""
    import time, numpy as np
    t0 = time.perf_counter()
    import tensorlogic as tl
    t1 = time.perf_counter()
    g = tl.EinsumGraph()
    xs = [g.input(f"x{k}", (100000,), "float32") for k in range(5)]
    a, b, c, d, e = xs
    g.output(g.relu(a * b + c) * d - e, "y")
    g.output(g.softmax(g.reshape(a, (100, 1000))), "s")
    plan = tl.compile(g, backend="numba", opt_level=0)
    plan(**{f"x{k}": np.ones(100000, np.float32) for k in range(5)})
    t2 = time.perf_counter()
    print(t1 - t0, t2 - t1)
""")


def first_call_latency():
    """Compile + first call in a fresh process: cold (empty cache dir) and warm (second run)."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TL_CACHE_DIR=d)
        res = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, text=True,
                                 capture_output=True, check=True)
            imp, first = map(float, out.stdout.split())
            res.append((imp, first))
    return {"import_s": res[1][0], "cold_first_call_s": res[0][1], "warm_first_call_s": res[1][1],
            "note": "first call = compile() + first plan call of a 5-kernel O0 plan"}


def blas_interplay(reps, rng):
    """Parallel numba kernel right after a BLAS matmul: plain, and with BLAS limited to 1 thread."""
    from threadpoolctl import threadpool_limits

    x = rng.standard_normal((512, 512)).astype(np.float32)
    n = 1 << 20
    a = rng.random(n).astype(np.float32)
    plan = fused_plan([(n,)], "float32", [("mul", [("in", 0), ("const", 2.0)])], (n,))
    out = np.empty(n, np.float32)
    res = {}

    def after_blas():
        x @ x
        t = time.perf_counter()
        plan(x0=a, out={"y": out})
        return time.perf_counter() - t

    def alone():
        t = time.perf_counter()
        plan(x0=a, out={"y": out})
        return time.perf_counter() - t

    for _ in range(3):
        after_blas()
    res["kernel_alone_ms"] = statistics.median(alone() for _ in range(reps)) * 1e3
    res["kernel_after_blas_ms"] = statistics.median(after_blas() for _ in range(reps)) * 1e3
    t = time.perf_counter()
    for _ in range(reps):
        x @ x
    res["matmul_ms"] = (time.perf_counter() - t) / reps * 1e3
    with threadpool_limits(1, user_api="blas"):
        res["kernel_after_blas1_ms"] = statistics.median(after_blas() for _ in range(reps)) * 1e3
        t = time.perf_counter()
        for _ in range(reps):
            x @ x
        res["matmul_blas1_ms"] = (time.perf_counter() - t) / reps * 1e3
    return res


def threshold_sweep(reps, rng):
    """Serial vs parallel kernel time for the 5-input chain per size (float32)."""
    rows = []
    for n in (1 << 10, 1 << 12, 1 << 14, 1 << 15, 1 << 16, 1 << 18):
        xs = {f"x{k}": rng.random(n).astype(np.float32) for k in range(5)}
        out = np.empty(n, np.float32)
        ser = fused_plan([(n,)] * 5, "float32", CHAIN, (n,), parallel_threshold=1 << 62)
        par = fused_plan([(n,)] * 5, "float32", CHAIN, (n,), parallel_threshold=0)
        rows.append({"n": n, "serial_us": timeit(lambda: ser(out={"y": out}, **xs), reps) * 1e6,
                     "parallel_us": timeit(lambda: par(out={"y": out}, **xs), reps) * 1e6})
    return rows


def versions():
    import numba

    v = {"python": platform.python_version(), "numpy": np.__version__, "numba": numba.__version__,
         "tensorlogic": getattr(tl, "__version__", "?")}
    if ne:
        v["numexpr"] = ne.__version__
    if torch is not None:
        v["torch"] = torch.__version__
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    args = ap.parse_args(argv)
    reps = 5 if args.quick else 15
    rng = np.random.default_rng(0)
    if torch is not None:
        torch.set_num_threads(os.cpu_count() or 1)
    result = {"date": datetime.now(timezone.utc).isoformat(), "quick": args.quick,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "processor": platform.processor()},
              "versions": versions()}
    from tensorlogic.backends import numba_threads

    result["stream"] = stream_bandwidth(args.quick, reps, rng)
    result["numba_threading_layer"] = numba_threads.active_layer()
    rows = chain_cases(args.quick, reps, rng) + reduction_cases(args.quick, reps, rng)
    result["cases"] = rows
    result["blas_interplay"] = blas_interplay(reps * 3, rng)
    result["threshold"] = threshold_sweep(reps * 3, rng)
    result["first_call"] = first_call_latency()
    print(f"threading layer: {result['numba_threading_layer']}; stream: {result['stream']}")
    for r in rows:
        peers = "  ".join(f"{p} {r[f'{p}_ms']:.2f} ms (x{r[f'speedup_vs_{p}']:.2f})"
                          for p in ("numpy", "numexpr", "torch") if f"{p}_ms" in r)
        print(f"{r['case']:<48} ours {r['tensorlogic_numba_ms']:.2f} ms "
              f"({r['tensorlogic_GBps']:.1f} GB/s)  {peers}")
    if torch is None:
        print("torch not installed: torch columns skipped")
    print("blas interplay:", {k: round(v, 3) for k, v in result["blas_interplay"].items()})
    print("threshold:", [(r["n"], round(r["serial_us"], 1), round(r["parallel_us"], 1))
                         for r in result["threshold"]])
    print("first call:", result["first_call"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
