"""Memory benchmark: planned vs naive peak memory, allocations per call, time with/without the pool.

Graphs: an 8-layer MLP (batch 256, width 1024), a 4-block attention stack, and small versions of
both (where per-call allocation overhead matters most). Configurations of the same graph:

  pooled     memory plan + tensor pool (the default plan)
  no-pool    memory plan, but a fresh arena allocated on every call
  naive      every intermediate in its own memory, allocated on every call (no plan, no pool)
  numpy      the same model written directly in numpy (peer)

Per configuration: median time per call, the traced peak above the start of a call (tracemalloc),
the bytes a call allocates beyond its outputs, and (unless --no-rss) how much the resident set of
a fresh process grows over its first calls (sampled every millisecond). Writes
benchmarks/results/bench_memory.json.

Usage: python benchmarks/bench_memory.py [--quick] [--no-rss] [--threads N]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

import tensorlogic as tl

HERE = Path(__file__).resolve().parent
SQ2PI = 0.7978845608028654


# ---------------------------------------------------------------- models
def mlp(layers: int, batch: int, width: int, seed: int = 0):
    """Graph, inputs and a plain-numpy function of an MLP alternating gelu and relu."""
    rng = np.random.default_rng(seed)
    ws = [
        (rng.standard_normal((width, width)) * width**-0.5).astype(np.float32)
        for _ in range(layers)
    ]
    bs = [(rng.standard_normal(width) * 0.1).astype(np.float32) for _ in range(layers)]
    g = tl.EinsumGraph()
    h = g.input("x", (batch, width))
    for i in range(layers):
        h = g.einsum("bi,ij->bj", h, g.constant(ws[i])) + g.constant(bs[i])
        h = g.gelu(h) if i % 2 == 0 else g.relu(h)
    g.output(h, name="y")

    def numpy_fn(x):
        h = x
        for i in range(layers):
            h = h @ ws[i] + bs[i]
            h = (
                0.5 * h * (1 + np.tanh(SQ2PI * (h + 0.044715 * h**3)))
                if i % 2 == 0
                else np.maximum(h, 0)
            )
        return h

    x = rng.standard_normal((batch, width)).astype(np.float32)
    return g, {"x": x}, numpy_fn


def attention(blocks: int, batch: int, seq: int, width: int, heads: int, seed: int = 0):
    """Graph, inputs and a plain-numpy function of a stack of attention + MLP blocks."""
    rng = np.random.default_rng(seed)
    d = width // heads

    def w(*shape, fan_in):
        return (rng.standard_normal(shape) * fan_in**-0.5).astype(np.float32)

    params = [
        dict(
            q=w(width, heads, d, fan_in=width),
            k=w(width, heads, d, fan_in=width),
            v=w(width, heads, d, fan_in=width),
            o=w(heads, d, width, fan_in=width),
            m=w(width, width, fan_in=4 * width),
        )
        for _ in range(blocks)
    ]
    g = tl.EinsumGraph()
    h = g.input("x", (batch, seq, width))
    for p in params:
        q = g.einsum("bsi,ihd->bhsd", h, g.constant(p["q"]))
        k = g.einsum("bsi,ihd->bhsd", h, g.constant(p["k"]))
        v = g.einsum("bsi,ihd->bhsd", h, g.constant(p["v"]))
        att = g.softmax(g.einsum("bhqd,bhkd->bhqk", q, k) * d**-0.5, axis=-1)
        ctx = g.einsum("bhqk,bhkd->bqhd", att, v)
        h = g.einsum("bqhd,hdo->bqo", ctx, g.constant(p["o"])) + h
        h = g.gelu(g.einsum("bsi,ij->bsj", h, g.constant(p["m"]))) + h
    g.output(h, name="y")

    def numpy_fn(x):
        h = x
        for p in params:
            q, k, v = (np.einsum("bsi,ihd->bhsd", h, p[n]) for n in "qkv")
            s = (q @ k.transpose(0, 1, 3, 2)) * d**-0.5
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3)
            h = np.einsum("bqhd,hdo->bqo", ctx, p["o"]) + h
            m = h @ p["m"]
            h = 0.5 * m * (1 + np.tanh(SQ2PI * (m + 0.044715 * m**3))) + h
        return h

    x = rng.standard_normal((batch, seq, width)).astype(np.float32)
    return g, {"x": x}, numpy_fn


GRAPHS = {
    "mlp8": lambda: mlp(8, 256, 1024),
    "attention4": lambda: attention(4, 8, 128, 256, 4),
    "mlp8-small": lambda: mlp(8, 8, 64),
    "attention4-small": lambda: attention(4, 1, 16, 32, 2),
}
CONFIGS = ("pooled", "no-pool", "naive", "numpy")


def make_runner(graph_name: str, config: str):
    """(call, plan or None, inputs, numpy function) for one graph and configuration."""
    g, inputs, numpy_fn = GRAPHS[graph_name]()
    if config == "numpy":
        return (lambda: {"y": numpy_fn(inputs["x"])}), None, inputs, numpy_fn
    opts = {
        "pooled": {},
        "no-pool": {"pool": False},
        "naive": {"pool": False, "reuse_memory": False},
    }[config]
    plan = tl.compile(g, backend="numpy", opt_level=2, cache=False, **opts)
    return (lambda: plan(inputs)), plan, inputs, numpy_fn


# ---------------------------------------------------------------- measurements
def time_interleaved(calls: dict, repeat: int) -> dict[str, float]:
    """Median seconds per call of each configuration, timed round-robin after a warm-up so that
    load from other processes falls on every configuration alike."""
    for call in calls.values():
        for _ in range(3):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def traced(call) -> tuple[int, int]:
    """(traced peak above the start of a call, bytes of what the call returned)."""
    for _ in range(2):
        call()
    gc.collect()
    tracemalloc.start()
    try:
        worst, outs = 0, 0
        for _ in range(3):
            tracemalloc.reset_peak()
            start, _ = tracemalloc.get_traced_memory()
            res = call()
            _, peak = tracemalloc.get_traced_memory()
            outs = sum(a.nbytes for a in res.values())
            worst = max(worst, peak - start)
            del res
    finally:
        tracemalloc.stop()
    return worst, outs


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child_rss(graph_name: str, config: str) -> None:
    """Run in a fresh process: print the most the resident set grows over the first 5 calls
    (arena creation included), sampled every millisecond by a watcher thread."""
    import threading

    call, _, _, _ = make_runner(graph_name, config)
    gc.collect()
    try:  # hand freed heap pages (temporaries of graph building) back so they cannot hide growth
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    base = _rss_bytes()
    top = [base]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            top[0] = max(top[0], _rss_bytes())
            time.sleep(0.001)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    for _ in range(5):
        call()
        top[0] = max(top[0], _rss_bytes())
    stop.set()
    t.join()
    print(json.dumps({"rss_growth_bytes": top[0] - base}))


def rss_growth(graph_name: str, config: str) -> int | None:
    """Peak-RSS growth of a fresh process running this configuration (None on failure)."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", graph_name, config],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return None
    return int(json.loads(proc.stdout.strip().splitlines()[-1])["rss_growth_bytes"])


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def machine_info() -> dict:
    """Machine, library versions and date for the results file."""
    from threadpoolctl import threadpool_info

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "tensorlogic": tl.__version__,
        "blas": [
            {k: i.get(k) for k in ("internal_api", "version", "num_threads")}
            for i in threadpool_info()
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions, no RSS subprocesses")
    ap.add_argument("--no-rss", action="store_true", help="skip the per-process RSS measurement")
    ap.add_argument("--threads", type=int, default=None, help="BLAS threads (default: BLAS's)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_rss(*args.child)
        return 0
    if args.threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    do_rss = not (args.quick or args.no_rss)
    results: dict = {"machine": machine_info(), "args": vars(args), "graphs": {}}
    ok = True
    for gname in GRAPHS:
        small = gname.endswith("small")
        repeat = (30 if small else 5) if args.quick else (300 if small else 30)
        rows = {}
        ref = None
        runners = {config: make_runner(gname, config) for config in CONFIGS}
        for config, (call, _, _, _) in runners.items():
            out = call()["y"]
            if ref is None:
                ref = out
            else:
                err = float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-30))
                assert err < 1e-4, f"{gname} {config}: results differ ({err:.2e})"
        medians = time_interleaved({c: r[0] for c, r in runners.items()}, repeat)
        for config, (call, plan, _, _) in runners.items():
            t = medians[config]
            peak, outs = traced(call)
            row = {
                "median_s": t,
                "traced_peak_bytes": peak,
                "output_bytes": outs,
                "extra_alloc_bytes": peak - outs,
                "rss_growth_bytes": rss_growth(gname, config) if do_rss else None,
            }
            if plan is not None:
                row["naive_bytes"] = plan.memory.naive_bytes
                row["planned_peak_bytes"] = plan.memory.peak_bytes
                row["in_place_steps"] = len(plan.memory.inplace)
            rows[config] = row
        p = rows["pooled"]
        summary = {
            "planned_over_naive": p["planned_peak_bytes"] / p["naive_bytes"],
            "extra_alloc_bytes_pooled": p["extra_alloc_bytes"],
            "pool_speedup_vs_no_pool": rows["no-pool"]["median_s"] / p["median_s"],
            "pool_speedup_vs_naive": rows["naive"]["median_s"] / p["median_s"],
            "pool_speedup_vs_numpy": rows["numpy"]["median_s"] / p["median_s"],
        }
        results["graphs"][gname] = {"configs": rows, "summary": summary}
        print(
            f"\n== {gname}: planned peak {mib(p['planned_peak_bytes'])} MiB vs naive "
            f"{mib(p['naive_bytes'])} MiB (ratio {summary['planned_over_naive']:.3f}), "
            f"{p['in_place_steps']} steps in place"
        )
        print(
            f"{'config':<9} {'median ms':>10} {'traced peak MiB':>16} {'beyond outputs KiB':>19} "
            f"{'RSS growth MiB':>15} {'pooled speedup':>15}"
        )
        for config, r in rows.items():
            print(
                f"{config:<9} {r['median_s'] * 1e3:>10.3f} {mib(r['traced_peak_bytes']):>16} "
                f"{r['extra_alloc_bytes'] / 1024:>19.1f} {mib(r['rss_growth_bytes']):>15} "
                f"{r['median_s'] / p['median_s']:>15.2f}"
            )
        ok &= summary["planned_over_naive"] <= 0.5
        ok &= p["extra_alloc_bytes"] < 64 * 1024
    results["targets_met"] = {
        "planned_peak_at_most_half_naive": all(
            v["summary"]["planned_over_naive"] <= 0.5 for v in results["graphs"].values()
        ),
        "steady_state_allocations_outputs_only": all(
            v["summary"]["extra_alloc_bytes_pooled"] < 64 * 1024 for v in results["graphs"].values()
        ),
        "pool_not_slower": all(
            v["summary"]["pool_speedup_vs_no_pool"] >= 0.95 for v in results["graphs"].values()
        ),
        "pool_faster_on_small_graphs": all(
            v["summary"]["pool_speedup_vs_naive"] > 1.05
            for k, v in results["graphs"].items()
            if k.endswith("small")
        ),
    }
    print("\ntargets:", json.dumps(results["targets_met"]))
    out = HERE / "results" / "bench_memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
