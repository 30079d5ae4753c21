"""Tensor networks (many operands, past 52 indices, complex128) vs opt_einsum and cotengra.

Instances are built by the generators below, the families of einsum-benchmark's offline
generators (matrix chains, trees, lattices, random regular graphs, MPS overlaps, complex
circuit-like random networks). Per instance: our first compile (numpy backend, O2, cold path
cache) and call; ``opt_einsum.contract`` with its default path (path search included, as a user
calls it); ``opt_einsum.contract_expression`` and cotengra's executor along our path. Every
contender runs in its own process. Four random trees of bond 24 (64 MB to 1.5 GB operands)
take most of a full run's time; ``--only`` picks instances by name, ``--name`` the results
file of such a partial run. ``--slicing`` instead compiles a lattice without and with
``path_memory_limit`` (an eighth of its peak) and runs both.
``--slicing-8gb`` plans four tensors joined pairwise by bonds of 32 and sharing a batch index
of 1024 (268 MB each) whose path found without a limit peaks at an 8.6 GB intermediate, and
runs them under a 1 GiB ``path_memory_limit``, measuring peak memory. Usage:
python benchmarks/bench_networks.py [--quick | --only A,B --name NAME | --slicing | --slicing-8gb]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np
import opt_einsum
from opt_einsum import get_symbol
from opt_einsum.testing import rand_equation

from _common import cores_look_free, machine, median_time, table, write_results


def chain(n, rng):
    dims = rng.integers(2, 9, n + 1)
    terms = [get_symbol(i) + get_symbol(i + 1) for i in range(n)]
    sizes = {get_symbol(i): int(d) for i, d in enumerate(dims)}
    return ",".join(terms) + "->" + get_symbol(0) + get_symbol(n), sizes


def tree(n, rng, bond=16):
    """A random tree: node k > 0 hangs below a random earlier node; two leaves keep a free index."""
    edges = [(int(rng.integers(k)), k) for k in range(1, n)]
    terms = [""] * n
    for e, (a, b) in enumerate(edges):
        terms[a] += get_symbol(e)
        terms[b] += get_symbol(e)
    out = ""
    for k in (n - 1, n - 2):
        s = get_symbol(len(edges) + k)
        terms[k] += s
        out += s
    sizes = {c: bond for t in terms for c in t}
    return ",".join(terms) + "->" + out, sizes


def lattice(n, bond=3):
    idx = iter(range(100_000))
    h = {(r, c): get_symbol(next(idx)) for r in range(n) for c in range(n - 1)}
    v = {(r, c): get_symbol(next(idx)) for r in range(n - 1) for c in range(n)}
    terms = [
        "".join(
            x for x in (h.get((r, c - 1)), h.get((r, c)), v.get((r - 1, c)), v.get((r, c))) if x
        )
        for r in range(n)
        for c in range(n)
    ]
    return ",".join(terms) + "->", {c: bond for t in terms for c in t}


def mps_overlap(sites, bond=8, phys=2):
    """<psi|psi> of an open MPS: 2 x sites tensors, 3 x sites - 2 indices."""
    idx = iter(range(100_000))
    ket = [get_symbol(next(idx)) for _ in range(sites - 1)]
    bra = [get_symbol(next(idx)) for _ in range(sites - 1)]
    phy = [get_symbol(next(idx)) for _ in range(sites)]
    terms = []
    for bonds in (ket, bra):
        for k in range(sites):
            terms.append((bonds[k - 1] if k else "") + phy[k] + (bonds[k] if k < sites - 1 else ""))
    sizes = {c: bond for c in ket + bra}
    sizes.update({c: phys for c in phy})
    return ",".join(terms) + "->", sizes


def regular(n, reg, d_max, seed):
    eq, _, sizes = rand_equation(
        n, reg, n_out=2, d_min=2, d_max=d_max, seed=seed, return_size_dict=True
    )
    return eq, sizes


def instances(quick: bool):
    rng = np.random.default_rng(0)
    cases = [
        ("rrg24_d2-4", *regular(24, 3, 4, 7), "float64"),
        ("chain100", *chain(100, rng), "float64"),
        ("tree40_b16", *tree(40, rng), "float64"),
        ("lattice6x6_b3", *lattice(6), "float64"),
        ("rrg60_d2-3", *regular(60, 3, 3, 1), "float64"),
        ("mps100_overlap", *mps_overlap(100), "float64"),
        ("circuit_rrg40_c128", *regular(40, 3, 2, 5), "complex128"),
    ]
    # random trees of bond 24 (each from its own seed): nodes of degree 5 and 6 make 64 MB and
    # 1.5 GB operands, so most of a call is matrix-vector products bound by memory
    big = [
        (f"tree{n}_b24_s{seed}", *tree(n, np.random.default_rng(seed), 24), "float64")
        for n, seed in ((30, 2), (30, 6), (40, 3), (20, 0))
    ]
    return cases[:3] if quick else cases + big


def _arrays(eq, sizes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    terms = eq.split("->")[0].split(",")
    out = []
    for t in terms:
        shape = tuple(sizes[c] for c in t)
        a = rng.uniform(0.5, 1.0, shape)
        if dtype == "complex128":
            a = a + 1j * rng.uniform(-0.5, 0.5, shape)
        # scale so long chains neither overflow nor underflow
        out.append(a / math.sqrt(max(1, math.prod(shape)) ** (1 / max(len(shape), 1))))
    return out


def worker(contender: str, name: str, path_file: str | None, repeat: int) -> dict:
    """One contender on one instance, in this process."""
    case = {c[0]: c for c in instances(False)}[name]
    _, eq, sizes, dtype = case
    arrays = _arrays(eq, sizes, dtype)
    res: dict = {}
    if contender == "ours":
        import tensorlogic as tl

        g = tl.EinsumGraph()
        ts = [g.input(f"x{i}", a.shape, dtype) for i, a in enumerate(arrays)]
        g.output(g.einsum(eq, *ts), "y")
        t0, c0 = time.perf_counter(), time.process_time()
        plan = tl.compile(g, "numpy", 2, cache=False)
        res["compile_s"] = time.perf_counter() - t0
        # CPU seconds of the compile (every thread of this process): on a shared machine the
        # wall time above also counts the time other processes held the cores
        res["compile_cpu_s"] = time.process_time() - c0
        feed = {f"x{i}": a for i, a in enumerate(arrays)}
        node = plan.optimized_graph.node(plan.optimized_graph.outputs["y"])
        res["path"] = node.args["path_strategy"]
        res["strategy"] = node.args["path_info"]["strategy"]
        res["flops"] = node.args["path_info"]["flops"]
        fn = lambda: plan(feed)  # noqa: E731
        y = plan(feed)["y"]
    elif contender == "contract":
        fn = lambda: opt_einsum.contract(eq, *arrays)  # noqa: E731
        y = fn()
    else:
        with open(path_file) as f:
            path = [tuple(p) for p in json.load(f)]
        if contender == "expression":
            expr = opt_einsum.contract_expression(eq, *[a.shape for a in arrays], optimize=path)
            fn = lambda: expr(*arrays)  # noqa: E731
        else:
            import cotengra

            lhs, out = eq.split("->")
            tree = cotengra.ContractionTree.from_path(
                [tuple(t) for t in lhs.split(",")], tuple(out), sizes, path=path
            )
            fn = lambda: tree.contract(arrays)  # noqa: E731
        y = fn()
    res["call_s"] = median_time(fn, repeat, min_time=0.02)
    # the reference runs after the timing: BLAS's threads spin for a while after a call and
    # would take the cores from a contender timed right after it
    ref = opt_einsum.contract(eq, *arrays, optimize="greedy")
    res["rel_err"] = float(np.abs(np.asarray(y) - ref).max() / max(np.abs(ref).max(), 1e-300))
    return res


def slicing_demo(n: int = 7, bond: int = 8, divide: int = 8) -> dict:
    """A lattice compiled without and with ``path_memory_limit`` = its peak / ``divide``."""
    import tensorlogic as tl

    eq, sizes = lattice(n, bond)
    arrays = _arrays(eq, sizes, "float64")
    g = tl.EinsumGraph()
    ts = [g.input(f"x{i}", a.shape, "float64") for i, a in enumerate(arrays)]
    g.output(g.einsum(eq, *ts), "y")
    feed = {f"x{i}": a for i, a in enumerate(arrays)}
    row: dict = {"instance": f"lattice{n}x{n}_b{bond}"}
    limit = None
    ys = []
    for label in ("unlimited", "sliced"):
        t0 = time.perf_counter()
        plan = tl.compile(g, "numpy", 2, cache=False, path_memory_limit=limit)
        t1 = time.perf_counter()
        ys.append(plan(feed)["y"])
        t2 = time.perf_counter()
        info = plan.optimized_graph.node(plan.optimized_graph.outputs["y"]).args["path_info"]
        row[label] = {
            "compile_s": t1 - t0,
            "call_s": t2 - t1,
            "flops": info["flops"],
            "peak_bytes": info["largest_intermediate"] * 8,
            "n_slices": info.get("n_slices", 1),
            "strategy": info["strategy"],
        }
        limit = row["unlimited"]["peak_bytes"] // divide
    row["limit_bytes"] = limit
    row["rel_diff"] = float(abs(ys[1] - ys[0]) / abs(ys[0]))
    return row


def slicing_8gb(limit: int = 1 << 30, batch: int = 1024, bond: int = 32, seed: int = 3) -> dict:
    """Four tensors, every pair joined by a bond of ``bond`` (the complete graph K4) and all
    sharing an output index of ``batch`` (float64): every contraction order makes an
    intermediate of the batch and four bonds, 1024 * 32^4 * 8 bytes = 8.6 GB, from 268 MB
    operands, at 2 * bond FLOPs per element of it. Its path found without a memory limit is
    planned (not run: it needs more memory than this machine has); the network is then
    compiled and run sliced under ``limit`` bytes, with the peak memory measured.

    Each operand is a random batch weight times an outer product of random vectors (one per
    bond end), so the exact result is the weights' product times the bonds' dot products,
    independent of the contraction code.
    """
    import tensorlogic as tl
    from tensorlogic.optimizer.contraction import plan_node

    eq = "oabc,oade,obdf,ocef->o"  # o: batch; a=AB, b=AC, c=AD, d=BC, e=BD, f=CD
    terms = [t[1:] for t in eq.split("->")[0].split(",")]
    rng = np.random.default_rng(seed)
    # each bond: one random vector per end; each operand: a random weight per batch entry
    vec = {(c, k): rng.uniform(0.5, 1.5, bond) for k, t in enumerate(terms) for c in t}
    weights = rng.uniform(0.5, 1.5, (len(terms), batch))
    arrays = []
    for k, t in enumerate(terms):
        legs = vec[t[0], k][:, None, None] * vec[t[1], k][None, :, None] * vec[t[2], k]
        arrays.append(weights[k][:, None, None, None] * legs[None])
    exact = weights.prod(axis=0)
    for c in "abcdef":
        u, v = (vec[c, k] for k, t in enumerate(terms) if c in t)
        exact = exact * float(u @ v)
    g = tl.EinsumGraph()
    ts = [g.input(f"x{i}", a.shape, "float64") for i, a in enumerate(arrays)]
    g.output(g.einsum(eq, *ts), "y")
    row: dict = {
        "instance": f"K4_batch{batch}_bond{bond}",
        "operands": len(arrays),
        "operand_bytes": int(arrays[0].nbytes),
        "limit_bytes": limit,
    }
    t0 = time.perf_counter()
    free = plan_node(g, g.node(g.outputs["y"]), None).args["path_info"]
    row["unlimited"] = {
        "plan_s": time.perf_counter() - t0,
        "flops": free["flops"],
        "peak_bytes": free["largest_intermediate"] * 8,
        "strategy": free["strategy"],
    }
    print(json.dumps(row, indent=1), flush=True)
    feed = {f"x{i}": a for i, a in enumerate(arrays)}
    rss0 = _max_rss()
    tracemalloc.start()  # numpy reports its array buffers to tracemalloc
    t0 = time.perf_counter()
    plan = tl.compile(g, "numpy", 2, cache=False, path_memory_limit=limit)
    t1 = time.perf_counter()
    y = plan(feed)["y"]
    t2 = time.perf_counter()
    _cur, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t3 = time.perf_counter()
    plan(feed)  # a second call: the steady state, without tracemalloc's overhead
    t4 = time.perf_counter()
    info = plan.optimized_graph.node(plan.optimized_graph.outputs["y"]).args["path_info"]
    row["sliced"] = {
        "second_call_s": t4 - t3,
        # Python-heap and numpy-buffer peak over compile + first call (tracemalloc), and the
        # process's peak resident set before and after (inputs and interpreter included)
        "traced_peak_bytes": traced_peak,
        "max_rss_before_bytes": rss0,
        "max_rss_after_bytes": _max_rss(),
        "compile_s": t1 - t0,
        "call_s": t2 - t1,
        "flops": info["flops"],
        "peak_bytes": info["largest_intermediate"] * 8,
        "planned_memory_bytes": plan.memory.peak_bytes,
        "n_slices": info.get("n_slices", 1),
        "slices": info.get("slices", ""),
        "strategy": info["strategy"],
    }
    row["rel_err_vs_exact"] = float(np.max(np.abs(np.asarray(y) - exact) / np.abs(exact)))
    return row


def _max_rss() -> int:
    """Peak resident set size of this process so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _spawn(contender, name, path_file, repeat, cache_dir):
    env = {**os.environ, "TL_CACHE_DIR": cache_dir}
    cmd = [sys.executable, __file__, "--worker", contender, name, "--repeat", str(repeat)]
    if path_file:
        cmd += ["--path", path_file]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="processes of ours and of contract_expression per instance (medians)",
    )
    ap.add_argument("--only", default=None, help="comma-separated instance names")
    ap.add_argument("--name", default="bench_networks", help="results/<name>.json")
    ap.add_argument("--worker", nargs=2)
    ap.add_argument("--path")
    ap.add_argument(
        "--slicing",
        action="store_true",
        help="only the slicing run: a 7x7 lattice of bond 8 under 1/8 of its peak",
    )
    ap.add_argument(
        "--slicing-8gb",
        action="store_true",
        help="a network whose unlimited path peaks at 8 GiB, run under 1 GiB",
    )
    args = ap.parse_args()
    if args.slicing:
        row = slicing_demo()
        print(json.dumps(row, indent=1))
        write_results("bench_networks_slicing", [row])
        return
    if args.slicing_8gb:
        row = slicing_8gb()
        print(json.dumps(row, indent=1))
        write_results("bench_networks_slicing_8gb", [row])
        return
    if args.worker:
        print(json.dumps(worker(*args.worker, args.path, args.repeat)))
        return
    if not cores_look_free():
        print(f"warning: load {machine()['loadavg_1min']:.1f}; timings are noisy")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        picked = instances(args.quick)
        if args.only:
            wanted = args.only.split(",")
            unknown = set(wanted) - {c[0] for c in picked}
            if unknown:
                ap.error(f"--only: unknown instances {sorted(unknown)}")
            picked = [c for c in picked if c[0] in wanted]
        for name, eq, _sizes, dtype in picked:
            cold = os.path.join(tmp, name)  # a fresh path cache: the compile is a first one
            ours = _spawn("ours", name, None, args.repeat, cold)
            path_file = os.path.join(tmp, name + ".path.json")
            with open(path_file, "w") as f:
                json.dump(ours["path"], f)
            others = {
                c: _spawn(c, name, path_file, args.repeat, cold)
                for c in ("contract", "expression", "cotengra")
            }
            # ours and contract_expression again, alternating, each in a fresh process: on a
            # shared machine the load drifts between processes, and the per-call target
            # compares these two, so each keeps the median of its rounds
            ours_calls, expr_calls = [ours["call_s"]], [others["expression"]["call_s"]]
            for _ in range(args.rounds - 1):
                ours_calls.append(_spawn("ours", name, None, args.repeat, cold)["call_s"])
                expr_calls.append(
                    _spawn("expression", name, path_file, args.repeat, cold)["call_s"]
                )
            ours["call_s"] = statistics.median(ours_calls)
            others["expression"]["call_s"] = statistics.median(expr_calls)
            n_idx = len({c for c in eq if c not in ",->"})
            row = {
                "instance": name,
                "operands": eq.count(",") + 1,
                "indices": n_idx,
                "dtype": dtype,
                "strategy": ours["strategy"],
                "compile_ms": 1e3 * ours["compile_s"],
                "compile_cpu_ms": 1e3 * ours["compile_cpu_s"],
                "ours_ms": 1e3 * ours["call_s"],
                "contract_ms": 1e3 * others["contract"]["call_s"],
                "expression_ms": 1e3 * others["expression"]["call_s"],
                "cotengra_ms": 1e3 * others["cotengra"]["call_s"],
                "max_rel_err": max(ours["rel_err"], *(o["rel_err"] for o in others.values())),
            }
            row["vs_contract"] = row["contract_ms"] / row["ours_ms"]
            row["vs_expression"] = row["expression_ms"] / row["ours_ms"]
            row["compile_calls"] = row["compile_ms"] / row["ours_ms"]
            # the target: a first compile of at most 10 calls or 100 ms, whichever is larger,
            # for networks whose call takes under 10 ms
            row["compile_target_met"] = row["ours_ms"] >= 10 or row["compile_ms"] <= max(
                10 * row["ours_ms"], 100
            )
            rows.append(row)
            print(table([row], list(row)), flush=True)
    gm = statistics.geometric_mean(r["vs_contract"] for r in rows)
    print(
        table(
            rows,
            [
                "instance",
                "operands",
                "indices",
                "strategy",
                "compile_ms",
                "compile_cpu_ms",
                "compile_target_met",
                "ours_ms",
                "contract_ms",
                "expression_ms",
                "cotengra_ms",
                "vs_contract",
                "vs_expression",
                "max_rel_err",
            ],
        )
    )
    print(f"geometric mean speedup vs opt_einsum.contract: {gm:.2f}x")
    path = write_results(args.name, rows, {"geomean_vs_contract": gm}, peers=("cotengra",))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
