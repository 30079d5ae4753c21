"""Compiled einsum plans vs numpy (optimize="optimal"), opt_einsum and torch.einsum on the CPU.

Also measures executor overhead per node on a 200-node graph of tiny tensors and the compile
time of a 1000-node graph. Usage: python benchmarks/bench_einsum_cpu.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import opt_einsum

import tensorlogic as tl

from _common import cores_look_free, interleaved_times, machine, median_time, table, write_results

CASES = [
    ("matmul", "ij,jk->ik", [(1000, 1000), (1000, 1000)]),
    ("batched", "bij,bjk->bik", [(64, 128, 128), (64, 128, 128)]),
    ("attention", "bhqd,bhkd->bhqk", [(8, 8, 256, 64), (8, 8, 256, 64)]),
    ("ijk_jkl", "ijk,jkl->il", [(64, 64, 64), (64, 64, 64)]),
    ("three_op", "abc,bcd,cde->ae", [(48, 48, 48)] * 3),
    ("chain6", "ab,bc,cd,de,ef,fg->ag", [(256, 256)] * 6),
    ("dot", "i,i->", [(1_000_000,), (1_000_000,)]),
]
BATCHED = {"batched", "attention"}


def _torch_times(repeat: int) -> dict[str, float]:
    """torch.einsum medians, measured after all of ours: torch's OpenMP workers keep spinning
    after each op and would steal the cores from the BLAS calls timed right after them."""
    try:
        import torch
    except ImportError:
        return {}
    torch.set_num_threads(machine()["cores_usable"] or 1)
    rng = np.random.default_rng(0)
    out = {}
    for name, spec, shapes in CASES:
        tt = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        out[name] = median_time(lambda: torch.einsum(spec, *tt), repeat, min_time=0.02)
    return out


def bench_specs(repeat: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for name, spec, shapes in CASES:
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        g = tl.EinsumGraph()
        ins = [g.input(f"x{k}", s) for k, s in enumerate(shapes)]
        g.output(g.einsum(spec, *ins), name="y")
        plan = tl.compile(g, backend="numpy", opt_level=2)
        feed = {f"x{k}": a for k, a in enumerate(arrays)}
        ref = np.einsum(spec, *arrays, optimize="optimal")
        got = plan(feed)["y"]
        assert np.allclose(got, ref, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(ref).max()))), (
            name
        )
        expr = opt_einsum.contract_expression(spec, *shapes)
        t = interleaved_times(
            {
                "tensorlogic": lambda: plan(feed),
                "numpy_optimal": lambda: np.einsum(spec, *arrays, optimize="optimal"),
                "opt_einsum": lambda: expr(*arrays),
            },
            repeat,
            min_time=0.02,
        )
        best_peer = min(t["numpy_optimal"], t["opt_einsum"])
        row = {
            "case": name,
            "spec": spec,
            **{f"{k}_ms": v * 1e3 for k, v in t.items()},
            "speedup_vs_best_np_oe": best_peer / t["tensorlogic"],
            "speedup_vs_opt_einsum": t["opt_einsum"] / t["tensorlogic"],
        }
        rows.append(row)
        print(
            f"  {name:10s} ours {t['tensorlogic'] * 1e3:8.3f} ms   best(np,oe) "
            f"x{row['speedup_vs_best_np_oe']:.2f}"
            f"   vs opt_einsum x{row['speedup_vs_opt_einsum']:.2f}",
            flush=True,
        )
    tt = _torch_times(repeat)
    for row in rows:
        if row["case"] in tt:
            row["torch_ms"] = tt[row["case"]] * 1e3
            row["speedup_vs_torch"] = tt[row["case"]] / (row["tensorlogic_ms"] / 1e3)
    return rows


def chain_graph(n_nodes: int, size: int = 4):
    """A graph of n_nodes cheap elementwise ops on tiny tensors."""
    g = tl.EinsumGraph()
    x = g.input("x", (size,))
    y = g.input("y", (size,))
    cur = x
    kinds = ["add", "mul", "relu", "sub", "tanh"]
    while len(g) < n_nodes:
        k = kinds[len(g) % len(kinds)]
        cur = g.unary(k, cur) if k in ("relu", "tanh") else g.binary(k, cur, y)
    g.output(cur, name="out")
    return g


def bench_overhead(repeat: int) -> dict:
    """Plan call time minus the same numpy ufunc calls made directly, per node."""
    g = chain_graph(200)
    plan = tl.compile(g, backend="numpy", opt_level=0)
    x = np.full(4, 0.5, np.float32)
    y = np.full(4, 0.25, np.float32)
    steps = plan.steps
    ufuncs = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "relu": None, "tanh": np.tanh}
    bufs = [np.empty(4, np.float32) for _ in steps]

    def raw():
        cur = x
        for s, out in zip(steps, bufs):
            if s.op == "relu":
                np.maximum(cur, 0, out=out)
            elif s.op == "tanh":
                np.tanh(cur, out=out)
            else:
                ufuncs[s.op](cur, y, out=out)
            cur = out
        return cur

    t_plan = median_time(lambda: plan(x=x, y=y), repeat, min_time=0.05)
    t_raw = median_time(raw, repeat, min_time=0.05)
    per_node = (t_plan - t_raw) / len(steps)
    print(
        f"  executor: {len(steps)} steps, plan {t_plan * 1e6:.1f} us, raw numpy {t_raw * 1e6:.1f} "
        f"us, overhead {per_node * 1e6:.2f} us/node (target <= 2)",
        flush=True,
    )
    return {
        "steps": len(steps),
        "plan_us": t_plan * 1e6,
        "raw_numpy_us": t_raw * 1e6,
        "overhead_us_per_node": per_node * 1e6,
    }


def bench_compile(repeat: int) -> dict:
    g = chain_graph(1000, size=8)
    res = {}
    for level in (0, 2):
        samples = []
        for _ in range(max(3, repeat // 4)):
            t0 = time.perf_counter()
            tl.compile(g, backend="numpy", opt_level=level, cache=False)
            samples.append(time.perf_counter() - t0)
        res[f"compile_1000_nodes_O{level}_ms"] = statistics.median(samples) * 1e3
        print(
            f"  compile 1000-node graph at O{level}: {res[f'compile_1000_nodes_O{level}_ms']:.1f} "
            f"ms (target < 100)",
            flush=True,
        )
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    repeat = 5 if args.quick else 15
    if not cores_look_free():
        print(f"warning: load average {machine()['loadavg_1min']:.2f}: timings may be noisy")
    print("einsum specs (float32):")
    rows = bench_specs(repeat)
    overhead = bench_overhead(repeat)
    comp = bench_compile(repeat)
    cols = [
        "case",
        "tensorlogic_ms",
        "numpy_optimal_ms",
        "opt_einsum_ms",
        "torch_ms",
        "speedup_vs_best_np_oe",
        "speedup_vs_opt_einsum",
    ]
    print()
    print(table(rows, cols))
    path = write_results(
        "bench_einsum_cpu", rows, {"executor": overhead, "compile": comp}, peers=("torch",)
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
