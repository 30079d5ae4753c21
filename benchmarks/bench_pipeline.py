"""Batched inference: one big call vs run_batched on threads vs a 2-worker Dask LocalCluster.

Models: a 4-layer MLP (width 1024) and an attention block (per item: 16 tokens of width 64, 4
heads), 100,000 items, batches of 256 and 4096. Also measures how the last, smaller batch is best
run: its own (cached) plan vs padding it to the full batch size.
Target: run_batched reaches >= 90% of the one-big-call throughput at batch 4096.
Usage: python benchmarks/bench_pipeline.py [--quick] [--no-dask]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tensorlogic as tl

from _common import cores_look_free, machine, table, write_results

WIDTH, DEPTH = 1024, 4
SEQ, DIM, HEADS = 16, 64, 4


def mlp_graph(seed: int = 0, depth: int = DEPTH) -> tl.EinsumGraph:
    """x[B, 1024] -> depth x (relu(x W + b)) -> y[B, 1024] (4 layers by default)."""
    rng = np.random.default_rng(seed)
    g = tl.EinsumGraph()
    h = g.input("x", shape=("B", WIDTH))
    for k in range(depth):
        w = g.constant((rng.standard_normal((WIDTH, WIDTH)) * WIDTH**-0.5).astype(np.float32),
                       name=f"w{k}")
        b = g.constant((rng.standard_normal(WIDTH) * 0.1).astype(np.float32), name=f"b{k}")
        h = g.relu(g.einsum("bi,ij->bj", h, w) + b)
    g.output(h, name="y")
    return g


def attention_graph(seed: int = 0) -> tl.EinsumGraph:
    """x[B, 16, 64] -> multi-head self-attention + residual -> y[B, 16, 64]."""
    rng = np.random.default_rng(seed)
    d = DIM // HEADS
    g = tl.EinsumGraph()
    x = g.input("x", shape=("B", SEQ, DIM))

    def w(name):
        return g.constant((rng.standard_normal((DIM, HEADS, d)) * DIM**-0.5).astype(np.float32),
                          name=name)

    q, k, v = (g.einsum("bsi,ihd->bhsd", x, w(n)) for n in ("wq", "wk", "wv"))
    attn = g.softmax(g.einsum("bhqd,bhkd->bhqk", q, k) * d**-0.5, axis=-1)
    ctx = g.einsum("bhqk,bhkd->bqhd", attn, v)
    g.output(g.reshape(ctx, ("B", SEQ, DIM)) + x, name="y")
    return g


def make_inputs(model: str, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    shape = (n, WIDTH) if model == "mlp" else (n, SEQ, DIM)
    return {"x": rng.standard_normal(shape, dtype=np.float32)}


def timed(fn, repeat: int) -> float:
    """Median seconds over ``repeat`` runs after one warm-up (compiles every batch size)."""
    fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def check(got, ref, what):
    err = float(np.max(np.abs(got["y"] - ref["y"])) / (np.max(np.abs(ref["y"])) + 1e-30))
    assert err < 1e-4, f"{what}: relative error {err:.2e}"


def bench_model(model: str, n: int, batches: list[int], repeat: int, client) -> list[dict]:
    g = mlp_graph() if model == "mlp" else attention_graph()
    plan = tl.compile(g, backend="numpy", opt_level=2)
    inputs = make_inputs(model, n)
    ref = plan(inputs)
    rows = []
    t_big = timed(lambda: plan(inputs), repeat)
    rows.append({"model": model, "mode": "one big call", "batch": n, "items_per_s": n / t_big,
                 "vs_big": 1.0})
    for bs in batches:
        for workers in (1, 2):
            check(tl.run_batched(plan, inputs, bs, workers=workers, progress=False), ref, "threads")
            t = timed(lambda bs=bs, w=workers: tl.run_batched(plan, inputs, bs, workers=w,
                                                              progress=False), repeat)
            rows.append({"model": model, "mode": f"run_batched threads={workers}", "batch": bs,
                         "items_per_s": n / t, "vs_big": t_big / t})
        if client is not None:
            check(tl.run_batched(plan, inputs, bs, client=client, progress=False), ref, "dask")
            t = timed(lambda bs=bs: tl.run_batched(plan, inputs, bs, client=client,
                                                   progress=False), max(1, repeat // 2))
            rows.append({"model": model, "mode": "run_batched dask 2 workers", "batch": bs,
                         "items_per_s": n / t, "vs_big": t_big / t})
    for r in rows:
        print(f"  {model:9s} {r['mode']:28s} batch={r['batch']:<7d} "
              f"{r['items_per_s']:12.0f} items/s  {r['vs_big']:.2f}x big call", flush=True)
    return rows


def bench_last_batch(model: str, full: int, last: int, repeat: int) -> dict:
    """The last, smaller batch: its own plan (first call compiles; later calls cached) vs
    padding it to the full batch size and slicing the result."""
    g = mlp_graph() if model == "mlp" else attention_graph()
    plan = tl.compile(g, backend="numpy", opt_level=2)
    x = make_inputs(model, full)["x"]
    plan(x=x)  # the full-size plan exists, as it does after the other batches
    part = x[:last]
    t0 = time.perf_counter()
    plan(x=part)
    first_own = time.perf_counter() - t0

    def pad():
        buf = np.empty_like(x)
        buf[:last] = part
        buf[last:] = part[-1]  # edge padding: finite values, independent items
        return plan(x=buf)["y"][:last]

    np.testing.assert_allclose(pad(), plan(x=part)["y"], rtol=1e-5, atol=1e-5)
    own = timed(lambda: plan(x=part), repeat)
    padded = timed(pad, repeat)
    row = {"model": model, "full": full, "last": last, "own_plan_first_call_s": first_own,
           "own_plan_cached_s": own, "padded_s": padded}
    print(f"  last batch {model:9s} {last}/{full}: own plan first call {first_own * 1e3:.1f} ms, "
          f"cached {own * 1e3:.1f} ms; padded {padded * 1e3:.1f} ms", flush=True)
    return row


def bench_device_overlap(backend: str, n_batches: int = 40, batch: int = 4096,
                         max_depth: int = 64) -> dict:
    """How much of the host-to-device copy time the pipeline hides behind compute.

    Overlap can hide at most the shorter of the two, so the workload is an MLP deep enough that
    computing a batch takes at least as long as staging it (the depth is calibrated on this
    card and reported). The serial copy time runs exactly the pipeline's loader path: the batch
    check, the pageable-to-pinned copy and the asynchronous host-to-device copy on the copy
    stream, waited for batch by batch.

    hidden = (copies alone + compute alone - pipelined run) / min(copies alone, compute alone).
    """
    from tensorlogic.pipeline.staging import check_batch, make_stager

    host = [make_inputs("mlp", batch) for _ in range(4)]
    batches = [host[k % 4] for k in range(n_batches)]

    def measure(depth: int) -> tuple:
        plan = tl.compile(mlp_graph(depth=depth), backend=backend, opt_level=2)
        be = plan.backend
        dev = [{"x": be.to_device(h["x"])} for h in host]
        stager = make_stager(be)

        def compute():
            for k in range(n_batches):
                plan(dev[k % 4])
            be.synchronize()

        def copies():
            for b in batches:
                stager.stage(check_batch(b, False), None).wait()

        def pipelined():
            for _ in tl.run_batches(plan, batches, progress=False):
                pass
            be.synchronize()

        return tuple(timed(f, 3) for f in (compute, copies, pipelined))

    depth = DEPTH
    t_compute, t_copy, t_pipe = measure(depth)
    # compute per layer is about linear in depth: deepen until compute >= 1.25 x copies
    while t_compute < 1.25 * t_copy and depth < max_depth:
        depth = min(max_depth, max(2 * depth, int(depth * 1.25 * t_copy / t_compute) + 1))
        t_compute, t_copy, t_pipe = measure(depth)
    hidden = (t_compute + t_copy - t_pipe) / min(t_copy, t_compute)
    row = {"backend": backend, "batches": n_batches, "batch": batch, "depth": depth,
           "compute_s": t_compute, "copy_s": t_copy, "pipelined_s": t_pipe,
           "copy_hidden": hidden, "target_met": hidden >= 0.8}
    print(f"  device overlap ({backend}, MLP depth {depth}, {n_batches} batches of {batch}): "
          f"compute {t_compute * 1e3:.1f} ms, copies {t_copy * 1e3:.1f} ms (pinned staging "
          f"path), pipelined {t_pipe * 1e3:.1f} ms, serial sum {(t_compute + t_copy) * 1e3:.1f} "
          f"ms -> {hidden:.0%} of min(copy, compute) hidden (target >= 80%: "
          f"{'met' if hidden >= 0.8 else 'NOT met'})", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="10,000 items, fewer repeats")
    ap.add_argument("--no-dask", action="store_true", help="skip the Dask LocalCluster runs")
    ap.add_argument("--device-backend", help="measure copy/compute overlap on this GPU backend "
                    "(default: cupy when it is usable)")
    args = ap.parse_args()
    n = 10_000 if args.quick else 100_000
    repeat = 1 if args.quick else 3
    batches = [256, 4096]
    if not cores_look_free():
        print(
            f"note: the machine is busy (load {machine()['loadavg_1min']:.1f}); timings are noisy"
        )
    client = cluster = None
    if not args.no_dask:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=":0")
        client = Client(cluster)
    rows = []
    try:
        for model in ("mlp", "attention"):
            rows += bench_model(model, n, batches, repeat, client)
    finally:
        if client is not None:
            client.close()
            cluster.close()
    last = [bench_last_batch(m, 4096, 100_000 % 4096, max(3, repeat)) for m in ("mlp", "attention")]
    device = args.device_backend or ("cupy" if "cupy" in tl.available_backends() else None)
    overlap = bench_device_overlap(device) if device else None
    print()
    print(table(rows, ["model", "mode", "batch", "items_per_s", "vs_big"]))
    target = [r for r in rows if r["mode"] == "run_batched threads=1" and r["batch"] == 4096]
    met = all(r["vs_big"] >= 0.9 for r in target)
    ratios = ", ".join(f"{r['model']} {r['vs_big']:.2f}" for r in target)
    print(f"\ntarget run_batched (threads=1) >= 90% of one big call at batch 4096: "
          f"{'met' if met else 'NOT met'} ({ratios})")
    path = write_results("bench_pipeline", rows, {"items": n, "last_batch": last,
                                                  "device_overlap": overlap, "target_met": met},
                         peers=("dask", "distributed", "cupy"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
